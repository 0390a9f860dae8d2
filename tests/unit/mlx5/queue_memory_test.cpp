// Allocator routing: the parent-domain callbacks, called the way mlx5 calls them, with fake
// ibv_extend_ops whose alloc/free record what reaches them.
#include "providers/mlx5/queue_memory.h"

#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace ibvx::mlx5 {
namespace {

// One fake allocator per ops table (the callbacks carry no context, as in the reference).
struct FakeHeap {
    int allocs = 0;
    int frees = 0;
    int memsets = 0;
    std::vector<size_t> sizes;
    std::vector<void *> returned;
    std::vector<void *> freed;
    size_t misalign = 0;  // bytes added to every pointer handed out
    bool fail = false;
    bool fake_huge = false;  // hand out a static misaligned pointer without allocating

    void reset() { *this = FakeHeap{}; }
};

template <int N>
struct Fake {
    static FakeHeap heap;
    alignas(64) static char huge_block[128];

    static void *alloc(size_t size) {
        heap.allocs++;
        heap.sizes.push_back(size);
        if (heap.fail) {
            return nullptr;
        }
        if (heap.fake_huge) {
            heap.returned.push_back(huge_block + 1);
            return huge_block + 1;
        }
        // Over-allocate so the deliberately misaligned pointer stays inside the block.
        void *base = nullptr;
        if (posix_memalign(&base, 4096, size + heap.misalign) != 0) {
            return nullptr;
        }
        std::memset(base, 0xab, size + heap.misalign);  // garbage the driver must clear
        char *p = static_cast<char *>(base) + heap.misalign;
        heap.returned.push_back(p);
        return p;
    }
    static void free(void *p) {
        heap.frees++;
        heap.freed.push_back(p);
        if (p != huge_block + 1) {
            std::free(static_cast<char *>(p) - heap.misalign);
        }
    }
    static void memset_s(void *dst, int value, size_t count) {
        heap.memsets++;
        std::memset(dst, value, count);
    }
    static void *db_mmap(doorbell_map_desc *) { return nullptr; }
    static int db_unmap(void *, doorbell_map_desc *) { return 0; }

    static ibv_extend_ops ops(bool with_memset) {
        ibv_extend_ops o{};
        o.alloc = alloc;
        o.free = free;
        o.memset_s = with_memset ? memset_s : nullptr;
        o.db_mmap = db_mmap;
        o.db_unmap = db_unmap;
        return o;
    }
};
template <int N>
FakeHeap Fake<N>::heap;
template <int N>
alignas(64) char Fake<N>::huge_block[128];

using A = Fake<0>;
using B = Fake<1>;

class Mlx5QueueMemory : public ::testing::Test {
  protected:
    void SetUp() override {
        A::heap.reset();
        B::heap.reset();
    }
    // A stand-in for the parent domain mlx5 passes back; the callbacks never look at it.
    ibv_pd fake_pd_{};
};

bool allZero(const void *p, size_t n) {
    const auto *b = static_cast<const unsigned char *>(p);
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != 0) {
            return false;
        }
    }
    return true;
}

TEST_F(Mlx5QueueMemory, QueueBuffersAndRecordsReachTheCreatingOps) {
    ibv_extend_ops ops_a = A::ops(false);
    ibv_extend_ops ops_b = B::ops(false);
    QueueMemory mem_a(&ops_a);
    QueueMemory mem_b(&ops_b);

    void *qp_buf = QueueMemory::allocCallback(&fake_pd_, &mem_a, 8192, 4096, MLX5DV_RES_TYPE_QP);
    void *dbr = QueueMemory::allocCallback(&fake_pd_, &mem_a, 8, 8, MLX5DV_RES_TYPE_DBR);
    void *cq_buf = QueueMemory::allocCallback(&fake_pd_, &mem_b, 16384, 4096, MLX5DV_RES_TYPE_CQ);
    void *srq_buf = QueueMemory::allocCallback(&fake_pd_, &mem_b, 4096, 4096, MLX5DV_RES_TYPE_SRQ);
    ASSERT_NE(qp_buf, nullptr);
    ASSERT_NE(dbr, nullptr);
    ASSERT_NE(cq_buf, nullptr);
    ASSERT_NE(srq_buf, nullptr);
    EXPECT_EQ(A::heap.allocs, 2);
    EXPECT_EQ(B::heap.allocs, 2);
    EXPECT_EQ(A::heap.sizes, (std::vector<size_t>{8192, 8}));
    EXPECT_EQ(mem_a.outstanding(), 2u);
    EXPECT_EQ(mem_b.outstanding(), 2u);

    QueueMemory::freeCallback(&fake_pd_, &mem_a, dbr, MLX5DV_RES_TYPE_DBR);
    QueueMemory::freeCallback(&fake_pd_, &mem_b, cq_buf, MLX5DV_RES_TYPE_CQ);
    EXPECT_EQ(A::heap.freed, std::vector<void *>{dbr});
    EXPECT_EQ(B::heap.freed, std::vector<void *>{cq_buf});

    QueueMemory::freeCallback(&fake_pd_, &mem_a, qp_buf, MLX5DV_RES_TYPE_QP);
    QueueMemory::freeCallback(&fake_pd_, &mem_b, srq_buf, MLX5DV_RES_TYPE_SRQ);
    EXPECT_EQ(A::heap.frees, 2);
    EXPECT_EQ(B::heap.frees, 2);
    EXPECT_EQ(mem_a.outstanding(), 0u);
    EXPECT_EQ(mem_b.outstanding(), 0u);
}

TEST_F(Mlx5QueueMemory, OtherResourceTypesUseTheDefaultAllocator) {
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    EXPECT_EQ(QueueMemory::allocCallback(&fake_pd_, &mem, 4096, 4096, MLX5DV_RES_TYPE_RWQ),
              IBV_ALLOCATOR_USE_DEFAULT);
    EXPECT_EQ(QueueMemory::allocCallback(&fake_pd_, &mem, 4096, 4096, 0), IBV_ALLOCATOR_USE_DEFAULT);
    uint64_t future_type = (uint64_t{RDMA_DRIVER_MLX5} << 32) | 99;
    EXPECT_EQ(QueueMemory::allocCallback(&fake_pd_, &mem, 4096, 4096, future_type),
              IBV_ALLOCATOR_USE_DEFAULT);
    EXPECT_EQ(A::heap.allocs, 0);
    EXPECT_FALSE(QueueMemory::routes(MLX5DV_RES_TYPE_RWQ));
    EXPECT_TRUE(QueueMemory::routes(MLX5DV_RES_TYPE_DBR));
}

TEST_F(Mlx5QueueMemory, MisalignedAllocatorIsOverAllocatedAndTheOriginalFreed) {
    A::heap.misalign = 8;  // every block 8 bytes past a page boundary
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);

    void *p = mem.allocate(10000, 4096, MLX5DV_RES_TYPE_QP);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u);
    // The exact-size try was misaligned and given back; the retry carries the slack.
    ASSERT_EQ(A::heap.sizes, (std::vector<size_t>{10000, 10000 + 4095}));
    ASSERT_EQ(A::heap.frees, 1);
    EXPECT_EQ(A::heap.freed[0], A::heap.returned[0]);
    char *original = static_cast<char *>(A::heap.returned[1]);
    EXPECT_GE(static_cast<char *>(p), original);
    EXPECT_LE(static_cast<char *>(p) + 10000, original + 10000 + 4095);
    EXPECT_EQ(mem.bytesHeld(), 10000u + 4095u);
    EXPECT_TRUE(allZero(p, 10000));

    mem.release(p);
    ASSERT_EQ(A::heap.frees, 2);
    EXPECT_EQ(A::heap.freed[1], original);  // ops->free gets what ops->alloc returned
}

TEST_F(Mlx5QueueMemory, AlignedAllocatorCostsOneExactAllocation) {
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    // mlx5's custom QP alignment can be below a page (buffer page / 64 quanta).
    void *p = mem.allocate(4096, 64, MLX5DV_RES_TYPE_QP);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(A::heap.sizes, std::vector<size_t>{4096});
    EXPECT_EQ(A::heap.frees, 0);
    EXPECT_EQ(p, A::heap.returned[0]);
    mem.release(p);
}

TEST_F(Mlx5QueueMemory, BlocksAreZeroedThroughTheCallersMemsetWhenGiven) {
    ibv_extend_ops with = A::ops(true);
    QueueMemory mem(&with);
    void *p = mem.allocate(256, 8, MLX5DV_RES_TYPE_DBR);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(A::heap.memsets, 1);
    EXPECT_TRUE(allZero(p, 256));
    mem.release(p);

    ibv_extend_ops without = B::ops(false);
    QueueMemory mem_b(&without);
    void *q = mem_b.allocate(256, 8, MLX5DV_RES_TYPE_DBR);
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(B::heap.memsets, 0);
    EXPECT_TRUE(allZero(q, 256));  // 0xab garbage cleared with plain memset
    mem_b.release(q);
}

TEST_F(Mlx5QueueMemory, FreeOnAnotherThreadReachesTheCreatingOps) {
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    void *p = QueueMemory::allocCallback(&fake_pd_, &mem, 4096, 4096, MLX5DV_RES_TYPE_CQ);
    ASSERT_NE(p, nullptr);
    std::thread destroyer([&] { QueueMemory::freeCallback(&fake_pd_, &mem, p, MLX5DV_RES_TYPE_CQ); });
    destroyer.join();
    EXPECT_EQ(A::heap.frees, 1);
    EXPECT_EQ(mem.outstanding(), 0u);
}

TEST_F(Mlx5QueueMemory, ConcurrentAllocAndFreeKeepTheBookkeepingExact) {
    ibv_extend_ops ops = A::ops(false);
    // The fake heap itself is not thread-safe: serialise only it, not QueueMemory.
    static std::mutex heap_mu;
    static ibv_extend_ops locked{};
    locked = ops;
    locked.alloc = [](size_t n) {
        std::lock_guard l(heap_mu);
        return A::alloc(n);
    };
    locked.free = [](void *p) {
        std::lock_guard l(heap_mu);
        A::free(p);
    };
    QueueMemory shared(&locked);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 50; ++i) {
                void *p = shared.allocate(64, 64, MLX5DV_RES_TYPE_DBR);
                ASSERT_NE(p, nullptr);
                shared.release(p);
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(shared.outstanding(), 0u);
    EXPECT_EQ(A::heap.allocs, 200);
    EXPECT_EQ(A::heap.frees, 200);
}

TEST_F(Mlx5QueueMemory, UnknownPointersAreIgnored) {
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    int not_ours = 0;
    mem.release(&not_ours);
    mem.release(nullptr);
    EXPECT_EQ(A::heap.frees, 0);
}

TEST_F(Mlx5QueueMemory, LeftoversGoBackToOpsFreeOnDestruction) {
    ibv_extend_ops ops = A::ops(false);
    {
        QueueMemory mem(&ops);
        ASSERT_NE(mem.allocate(4096, 4096, MLX5DV_RES_TYPE_QP), nullptr);
        ASSERT_NE(mem.allocate(8, 8, MLX5DV_RES_TYPE_DBR), nullptr);
    }
    EXPECT_EQ(A::heap.frees, 2);
}

TEST_F(Mlx5QueueMemory, FailuresAndBadRequestsReturnNull) {
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    EXPECT_EQ(mem.allocate(4096, 3000, MLX5DV_RES_TYPE_QP), nullptr);  // not a power of two
    EXPECT_EQ(mem.allocate(0, 64, MLX5DV_RES_TYPE_QP), nullptr);
    EXPECT_EQ(A::heap.allocs, 0);

    A::heap.fail = true;
    EXPECT_EQ(mem.allocate(4096, 4096, MLX5DV_RES_TYPE_QP), nullptr);
    EXPECT_EQ(mem.outstanding(), 0u);

    // Alignment 0 means "any": accepted as 1.
    A::heap.fail = false;
    void *p = mem.allocate(100, 0, MLX5DV_RES_TYPE_CQ);
    EXPECT_NE(p, nullptr);
    mem.release(p);
}

TEST_F(Mlx5QueueMemory, SlackThatWouldOverflowIsRefused) {
    A::heap.fake_huge = true;  // misaligned answer for any size, nothing really allocated
    ibv_extend_ops ops = A::ops(false);
    QueueMemory mem(&ops);
    EXPECT_EQ(mem.allocate(SIZE_MAX - 10, 4096, MLX5DV_RES_TYPE_QP), nullptr);
    EXPECT_EQ(A::heap.allocs, 1);  // no padded retry
    EXPECT_EQ(A::heap.frees, 1);   // the misaligned block went back
}

}  // namespace
}  // namespace ibvx::mlx5
