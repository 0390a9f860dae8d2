// common/cpu.h, the spin hint and barriers softnda and the tools use, on the CPU the test runs
// on: the orders they promise, checked with the two litmus tests they exist for. Relaxed atomics
// stand in for the plain accesses of device memory, so only the barrier orders them.
#include <atomic>
#include <barrier>
#include <cstdint>
#include <thread>

#include <gtest/gtest.h>

#include "common/cpu.h"

namespace {

TEST(Cpu, RelaxSpinsUntilTheStoreArrives) {
    std::atomic<int> flag{0};
    std::thread t([&] { flag.store(1, std::memory_order_relaxed); });
    uint64_t spins = 0;
    while (flag.load(std::memory_order_relaxed) == 0) {
        ibvx_cpu_relax();
        ++spins;
    }
    t.join();
    EXPECT_EQ(flag.load(), 1);
    (void)spins;
}

// Message passing: payload, to_device barrier, flag; flag, from_device barrier, payload. The
// reader must never see a flag without the payload written before it.
TEST(Cpu, DeviceBarriersOrderPayloadAndFlag) {
    constexpr uint32_t kRounds = 20000;
    constexpr int kWords = 8;
    uint32_t payload[kWords] = {};
    uint32_t flag = 0;
    std::thread writer([&] {
        for (uint32_t r = 1; r <= kRounds; ++r) {
            for (auto &w : payload) {
                __atomic_store_n(&w, r, __ATOMIC_RELAXED);
            }
            ibvx_to_device_barrier();
            __atomic_store_n(&flag, r, __ATOMIC_RELAXED);
            // Wait until the reader took this round, so the payload is not rewritten under it.
            while (__atomic_load_n(&flag, __ATOMIC_RELAXED) != 0) {
                ibvx_cpu_relax();
            }
        }
    });
    uint32_t torn = 0;
    for (uint32_t r = 1; r <= kRounds; ++r) {
        while (__atomic_load_n(&flag, __ATOMIC_RELAXED) != r) {
            ibvx_cpu_relax();
        }
        ibvx_from_device_barrier();
        for (auto &w : payload) {
            if (__atomic_load_n(&w, __ATOMIC_RELAXED) != r) {
                ++torn;
            }
        }
        ibvx_full_barrier();  // the payload reads complete before the writer may go on
        __atomic_store_n(&flag, 0u, __ATOMIC_RELAXED);
    }
    writer.join();
    EXPECT_EQ(torn, 0u);
}

// Store buffering (Dekker), the sleep/wake handshake of SPEC.md §4.1 order 4: each side stores
// its flag, full barrier, loads the other's. Both reading 0 is what x86 allows without the
// barrier (its store buffer), and aarch64 too.
TEST(Cpu, FullBarrierOrdersAStoreBeforeALoad) {
    constexpr int kRounds = 4000;
    uint32_t x = 0, y = 0;
    uint32_t seen_x = 0, seen_y = 0;
    int both_zero = 0;
    std::barrier sync(2);
    std::thread other([&] {
        for (int r = 0; r < kRounds; ++r) {
            sync.arrive_and_wait();
            __atomic_store_n(&y, 1u, __ATOMIC_RELAXED);
            ibvx_full_barrier();
            seen_x = __atomic_load_n(&x, __ATOMIC_RELAXED);
            sync.arrive_and_wait();
        }
    });
    for (int r = 0; r < kRounds; ++r) {
        __atomic_store_n(&x, 0u, __ATOMIC_RELAXED);
        __atomic_store_n(&y, 0u, __ATOMIC_RELAXED);
        sync.arrive_and_wait();
        __atomic_store_n(&x, 1u, __ATOMIC_RELAXED);
        ibvx_full_barrier();
        seen_y = __atomic_load_n(&y, __ATOMIC_RELAXED);
        sync.arrive_and_wait();
        if (seen_x == 0 && seen_y == 0) {
            ++both_zero;
        }
    }
    other.join();
    EXPECT_EQ(both_zero, 0);
}

}  // namespace
