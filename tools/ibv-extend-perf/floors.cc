// The floors every fast-path figure is compared against, measured in the same run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "common/cpu.h"
#include "tools/ibv-extend-perf/scenarios.h"

namespace ibvx::perf {

double percentile(std::vector<uint64_t> &samples, double pct) {
    if (samples.empty()) {
        return 0;
    }
    std::sort(samples.begin(), samples.end());
    size_t idx = static_cast<size_t>(pct / 100.0 * static_cast<double>(samples.size() - 1) + 0.5);
    return static_cast<double>(samples[std::min(idx, samples.size() - 1)]);
}

namespace {

// Two cache lines: ping written by the initiator, pong by the responder.
struct alignas(64) Line {
    std::atomic<uint64_t> v{0};
    char pad[56];
};

void shmPingPong(const Options &opt, Results &out) {
    const int iters = opt.quick ? 200 : 200000;
    const int warmup = opt.quick ? 20 : 1000;
    Line ping, pong;
    std::thread responder([&] {
        for (uint64_t i = 1; i <= static_cast<uint64_t>(iters + warmup); ++i) {
            while (ping.v.load(std::memory_order_acquire) != i) {
                ibvx_cpu_relax();
            }
            pong.v.store(i, std::memory_order_release);
        }
    });
    std::vector<uint64_t> ns;
    ns.reserve(static_cast<size_t>(iters));
    for (uint64_t i = 1; i <= static_cast<uint64_t>(iters + warmup); ++i) {
        auto t0 = Clock::now();
        ping.v.store(i, std::memory_order_release);
        while (pong.v.load(std::memory_order_acquire) != i) {
            ibvx_cpu_relax();
        }
        if (i > static_cast<uint64_t>(warmup)) {
            ns.push_back(nsSince(t0));
        }
    }
    responder.join();
    double p50 = percentile(ns, 50), p99 = percentile(ns, 99);
    out.add("floors", "shm_pingpong_p50_ns", p50, "ns", "cache-line round trip, two threads");
    out.add("floors", "shm_pingpong_p99_ns", p99, "ns");
}

void memcpyBandwidth(const Options &opt, Results &out) {
    constexpr size_t kSize = 1 << 20;
    const int reps = opt.quick ? 8 : 4000;
    std::vector<uint8_t> src(kSize, 1), dst(kSize, 0);
    for (int i = 0; i < 10; ++i) {
        std::memcpy(dst.data(), src.data(), kSize);
    }
    auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) {
        src[static_cast<size_t>(i) % kSize] = static_cast<uint8_t>(i);  // keep the copy observable
        std::memcpy(dst.data(), src.data(), kSize);
        asm volatile("" : : "r"(dst.data()) : "memory");
    }
    double sec = static_cast<double>(nsSince(t0)) / 1e9;
    out.add("floors", "memcpy_gbps", static_cast<double>(kSize) * reps / sec / 1e9, "GB/s",
            "single-thread memcpy, 1 MiB buffers");
}

}  // namespace

void runFloors(const Options &opt, Results &out) {
    if (opt.wants("pingpong")) {
        shmPingPong(opt, out);
    }
    if (opt.wants("memcpy")) {
        memcpyBandwidth(opt, out);
    }
}

}  // namespace ibvx::perf
