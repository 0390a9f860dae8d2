// The mapping manager on its own: arena carving, free by pointer, the thread-local binding and
// doorbell refcounting, with a fake exporter standing in for a device's export_mmio.
#include "daemon/core/mapping.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <thread>

namespace ibvx::daemon {
namespace {

// A fake "BAR": two 4 KiB doorbell pages in a memfd, exported like a vdev's MMIO.
struct FakeBar {
    int fd = -1;
    uint8_t *va = nullptr;
    int exports = 0;
};
FakeBar g_bar;

int fakeExport(const void *addr, int *fd, uint64_t *offset) {
    auto a = reinterpret_cast<uintptr_t>(addr);
    auto base = reinterpret_cast<uintptr_t>(g_bar.va);
    if (a < base || a >= base + 8192) {
        return -ENOENT;
    }
    ++g_bar.exports;
    *fd = dup(g_bar.fd);
    *offset = (a - base) & ~uintptr_t{4095};
    return 0;
}

ibv_extend_vdev_ops fakeVdev() {
    ibv_extend_vdev_ops v{};
    v.abi = IBV_EXTEND_VDEV_ABI_V1;
    v.provider = "fake";
    v.export_mmio = fakeExport;
    return v;
}

class MappingTest : public ::testing::Test {
  protected:
    void SetUp() override {
        g_bar.fd = memfd_create("fakebar", MFD_CLOEXEC);
        ASSERT_GE(g_bar.fd, 0);
        ASSERT_EQ(ftruncate(g_bar.fd, 8192), 0);
        g_bar.va =
            static_cast<uint8_t *>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, g_bar.fd, 0));
        ASSERT_NE(g_bar.va, MAP_FAILED);
        g_bar.exports = 0;
    }
    void TearDown() override {
        munmap(g_bar.va, 8192);
        close(g_bar.fd);
    }
    MappingManager &mm = MappingManager::instance();
    ibv_extend_ops *ops = MappingManager::ops();
    ibv_extend_vdev_ops vdev = fakeVdev();
};

TEST_F(MappingTest, AllocNeedsABinding) {
    errno = 0;
    EXPECT_EQ(ops->alloc(128), nullptr);
    EXPECT_EQ(errno, EPERM);
}

TEST_F(MappingTest, CarvesOneChunkAndFreesBackToZero) {
    auto mem = mm.createSession(1);
    std::vector<void *> ptrs;
    {
        ScopedBinding bind(mem.get(), &vdev);
        for (int i = 0; i < 10; ++i) {
            void *p = ops->alloc(1000);
            ASSERT_NE(p, nullptr);
            EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % MappingManager::kAlign, 0u);
            ops->memset_s(p, 0xab, 1000);
            ptrs.push_back(p);
        }
    }
    // Distinct, non-overlapping, all in one chunk.
    std::set<uintptr_t> starts;
    for (void *p : ptrs) {
        starts.insert(reinterpret_cast<uintptr_t>(p));
    }
    EXPECT_EQ(starts.size(), ptrs.size());
    for (auto it = starts.begin(); std::next(it) != starts.end(); ++it) {
        EXPECT_GE(*std::next(it) - *it, 1000u);
    }
    MemoryStats s = mm.stats(*mem);
    EXPECT_EQ(s.arena_chunks, 1u);
    EXPECT_EQ(s.allocated_bytes, 10u * 1024);
    // Free without a binding: the owner is found from the pointer.
    for (void *p : ptrs) {
        ops->free(p);
    }
    s = mm.stats(*mem);
    EXPECT_EQ(s.allocated_bytes, 0u);
    EXPECT_EQ(s.arena_chunks, 0u);
    EXPECT_EQ(mm.totals().arena_chunks, 0u);
}

// Freed blocks merge with free neighbours on either side, so the space of a chunk comes back
// whole: after freeing a pattern of blocks, one allocation of their joint size fits where they
// were, and a stray or interior pointer frees nothing.
TEST_F(MappingTest, FreedNeighboursCoalesceAndTheirSpaceIsReused) {
    auto mem = mm.createSession(7);
    ScopedBinding bind(mem.get(), &vdev);
    constexpr size_t kBlock = 4096;
    const size_t n = MappingManager::kChunkSize / kBlock;
    std::vector<uint8_t *> p;
    for (size_t i = 0; i < n; ++i) {
        p.push_back(static_cast<uint8_t *>(ops->alloc(kBlock)));
        ASSERT_NE(p.back(), nullptr);
    }
    ASSERT_EQ(mm.stats(*mem).arena_chunks, 1u);  // exactly full
    ops->free(p[3] + 64);                        // inside an allocation: ignored
    EXPECT_EQ(mm.stats(*mem).allocated_bytes, n * kBlock);
    // Free 2, 4, 3 (joins both sides), then 6 and 5 (joins the left run and the right block).
    for (size_t i : {2, 4, 3, 6, 5}) {
        ops->free(p[i]);
    }
    EXPECT_EQ(mm.stats(*mem).allocated_bytes, (n - 5) * kBlock);
    void *run = ops->alloc(5 * kBlock);
    EXPECT_EQ(run, p[2]);  // the five blocks are one free run again
    EXPECT_EQ(mm.stats(*mem).arena_chunks, 1u);
    ops->free(p[n - 1]);
    ops->free(p[n - 2]);
    void *tail = ops->alloc(2 * kBlock);
    EXPECT_EQ(tail, p[n - 2]);
    ops->free(run);
    ops->free(tail);
    for (size_t i = 0; i < n; ++i) {
        if ((i < 2 || i > 6) && i < n - 2) {
            ops->free(p[i]);
        }
    }
    EXPECT_EQ(mm.stats(*mem).arena_chunks, 0u);
}

TEST_F(MappingTest, ResolveGivesRegionAndOffsetAndUnsentOnce) {
    auto mem = mm.createSession(2);
    void *a;
    void *b;
    {
        ScopedBinding bind(mem.get(), &vdev);
        a = ops->alloc(4096);
        b = ops->alloc(64);
    }
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    auto ra = mm.resolve(*mem, reinterpret_cast<uint64_t>(a), 4096);
    auto rb = mm.resolve(*mem, reinterpret_cast<uint64_t>(b), 64);
    ASSERT_TRUE(ra.isOk());
    ASSERT_TRUE(rb.isOk());
    EXPECT_NE(ra->region, 0u);
    EXPECT_EQ(ra->region, rb->region);
    EXPECT_EQ(rb->offset - ra->offset, reinterpret_cast<uintptr_t>(b) - reinterpret_cast<uintptr_t>(a));
    EXPECT_FALSE(mm.resolve(*mem, 0x1000, 8).isOk());
    EXPECT_EQ(mm.resolve(*mem, 0, 0)->region, 0u);

    auto unsent = mm.takeUnsent(*mem);
    ASSERT_EQ(unsent.size(), 1u);
    EXPECT_EQ(unsent[0].id, ra->region);
    // The fd maps the same memory the driver wrote.
    static_cast<uint8_t *>(a)[5] = 0x5a;
    void *view = mmap(nullptr, unsent[0].size, PROT_READ, MAP_SHARED, unsent[0].fd.get(), 0);
    ASSERT_NE(view, MAP_FAILED);
    EXPECT_EQ(static_cast<uint8_t *>(view)[ra->offset + 5], 0x5a);
    munmap(view, unsent[0].size);
    EXPECT_TRUE(mm.takeUnsent(*mem).empty());

    ops->free(a);
    EXPECT_TRUE(mm.takeReleased(*mem).empty());  // chunk still holds b
    ops->free(b);
    auto released = mm.takeReleased(*mem);
    ASSERT_EQ(released.size(), 1u);
    EXPECT_EQ(released[0], ra->region);
}

TEST_F(MappingTest, ArenasAreNeverSharedBetweenSessions) {
    auto m1 = mm.createSession(3);
    auto m2 = mm.createSession(4);
    void *p1;
    void *p2;
    {
        ScopedBinding bind(m1.get(), &vdev);
        p1 = ops->alloc(64);
    }
    {
        ScopedBinding bind(m2.get(), &vdev);
        p2 = ops->alloc(64);
    }
    auto r1 = mm.resolve(*m1, reinterpret_cast<uint64_t>(p1), 64);
    ASSERT_TRUE(r1.isOk());
    EXPECT_FALSE(mm.resolve(*m2, reinterpret_cast<uint64_t>(p1), 64).isOk());
    EXPECT_FALSE(mm.resolve(*m1, reinterpret_cast<uint64_t>(p2), 64).isOk());
    mm.dropSession(m1.get());
    mm.dropSession(m2.get());
    EXPECT_EQ(mm.totals().arena_chunks, 0u);
}

TEST_F(MappingTest, BindingIsPerThreadAndNests) {
    auto m1 = mm.createSession(5);
    auto m2 = mm.createSession(6);
    {
        ScopedBinding outer(m1.get(), &vdev);
        EXPECT_EQ(ScopedBinding::currentSession(), m1.get());
        std::thread t([&] {
            EXPECT_EQ(ScopedBinding::currentSession(), nullptr);
            ScopedBinding inner(m2.get(), &vdev);
            void *p = ops->alloc(64);
            EXPECT_TRUE(mm.resolve(*m2, reinterpret_cast<uint64_t>(p), 64).isOk());
        });
        t.join();
        {
            ScopedBinding inner(m2.get(), &vdev);
            EXPECT_EQ(ScopedBinding::currentSession(), m2.get());
        }
        EXPECT_EQ(ScopedBinding::currentSession(), m1.get());
    }
    EXPECT_EQ(ScopedBinding::currentSession(), nullptr);
    EXPECT_EQ(mm.stats(*m2).arena_chunks, 1u);
    mm.dropSession(m1.get());
    mm.dropSession(m2.get());
}

TEST_F(MappingTest, DoorbellSameDescSameAddressRefcountedPerPage) {
    auto mem = mm.createSession(7);
    ScopedBinding bind(mem.get(), &vdev);
    doorbell_map_desc d{};
    d.type = DB_MAP_MODE_HOST_VA;
    d.hva = reinterpret_cast<uint64_t>(g_bar.va + 4096 + 512);
    d.size = 8;
    void *a = ops->db_mmap(&d);
    void *b = ops->db_mmap(&d);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a, b);
    EXPECT_EQ(g_bar.exports, 1);  // one page, exported once
    doorbell_map_desc d2 = d;
    d2.hva += 8;  // another register of the same page
    EXPECT_NE(ops->db_mmap(&d2), nullptr);
    EXPECT_EQ(mm.stats(*mem).doorbell_pages, 1u);

    auto ref = mm.resolve(*mem, d.hva, 8);
    ASSERT_TRUE(ref.isOk());
    EXPECT_EQ(ref->offset, 4096u + 512u);  // page offset in the exported fd + offset in page
    auto unsent = mm.takeUnsent(*mem);
    ASSERT_EQ(unsent.size(), 1u);
    EXPECT_EQ(unsent[0].size, 8192u);

    EXPECT_EQ(ops->db_unmap(a, &d), 0);
    std::thread([&] {
        // Without a binding the owner is found from the page.
        EXPECT_EQ(ops->db_unmap(a, &d), 0);
    }).join();
    EXPECT_TRUE(mm.takeReleased(*mem).empty());
    EXPECT_EQ(ops->db_unmap(a, &d2), 0);
    EXPECT_EQ(mm.takeReleased(*mem).size(), 1u);
    EXPECT_EQ(ops->db_unmap(a, &d), -ENODEV);
    EXPECT_EQ(ops->db_unmap(nullptr, &d), -EINVAL);
    EXPECT_EQ(ops->db_unmap(a, nullptr), -EINVAL);
    EXPECT_EQ(mm.stats(*mem).doorbell_pages, 0u);
}

TEST_F(MappingTest, DoorbellErrors) {
    auto mem = mm.createSession(8);
    ScopedBinding bind(mem.get(), &vdev);
    errno = 0;
    EXPECT_EQ(ops->db_mmap(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    doorbell_map_desc d{};
    d.type = 7;
    EXPECT_EQ(ops->db_mmap(&d), nullptr);
    EXPECT_EQ(errno, EINVAL);
    d.type = DB_MAP_MODE_HOST_VA;
    d.hva = 0x1000;  // not device MMIO
    d.size = 8;
    EXPECT_EQ(ops->db_mmap(&d), nullptr);
    EXPECT_EQ(errno, ENOENT);
    d.hva = reinterpret_cast<uint64_t>(g_bar.va + 4090);  // straddles a page
    EXPECT_EQ(ops->db_mmap(&d), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

TEST_F(MappingTest, MemcpyHonoursDirectionsAndBounds) {
    char src[16] = "hello";
    char dst[16] = {};
    for (uint32_t dir = MEMCPY_DIR_HOST_TO_HOST; dir <= MEMCPY_DIR_DEVICE_TO_DEVICE; ++dir) {
        std::memset(dst, 0, sizeof(dst));
        EXPECT_EQ(ops->memcpy_s(dst, sizeof(dst), src, 6, dir), 0);
        EXPECT_STREQ(dst, "hello");
    }
    EXPECT_EQ(ops->memcpy_s(dst, sizeof(dst), src, 6, 4), -1);
    EXPECT_EQ(ops->memcpy_s(dst, 4, src, 6, MEMCPY_DIR_HOST_TO_HOST), -1);
}

}  // namespace
}  // namespace ibvx::daemon
