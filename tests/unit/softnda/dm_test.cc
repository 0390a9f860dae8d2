// Device memory on softnda (SPEC.md §17): the region's size, allocation, alignment and ENOMEM,
// copies in the caller, zero-based regions on it as local and remote buffers, EBUSY, restart blobs.
#include <numeric>

#include "providers/softnda/src/softnda_internal.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr uint64_t kRegion = 8192;  // small, so a test fills it in a few allocations

class Dm : public QpPairTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"dm_size", std::to_string(kRegion)}};
    }

    void TearDown() override {
        for (ibv_mr *mr : dm_mrs_) {
            EXPECT_EQ(softnda_vdev_ops.dereg_mr(mr), 0);
        }
        for (auto it = dms_.rbegin(); it != dms_.rend(); ++it) {
            EXPECT_EQ(softnda_vdev_ops.free_dm(*it), 0);
        }
        QpPairTest::TearDown();
    }

    ibv_dm *alloc(uint64_t length, uint32_t log_align = 0, uint32_t comp_mask = 0) {
        ibv_alloc_dm_attr a{};
        a.length = length;
        a.log_align_req = log_align;
        a.comp_mask = comp_mask;
        ibv_dm *dm = softnda_vdev_ops.alloc_dm(ctx_, &a, arena().ops());
        if (dm != nullptr) {
            dms_.push_back(dm);
        }
        return dm;
    }

    void release(ibv_dm *dm) {
        ASSERT_EQ(softnda_vdev_ops.free_dm(dm), 0);
        dms_.erase(std::find(dms_.begin(), dms_.end(), dm));
    }

    static uint64_t offsetOf(ibv_dm *dm) { return softnda::asDm(dm)->offset; }

    // A region on dm, deregistered before the DMs are freed (the order free_dm needs).
    ibv_mr *regDm(ibv_dm *dm, uint64_t offset, size_t length, unsigned access) {
        ibv_mr *mr = softnda_vdev_ops.reg_dm_mr(pd_, dm, offset, length, access);
        if (mr != nullptr) {
            dm_mrs_.push_back(mr);
        }
        return mr;
    }

    softnda_cqe runOnA(const softnda_send_wr &w) {
        EXPECT_EQ(postOne(a_, w), 0);
        return waitOne(scq_.cq);
    }

    std::vector<ibv_dm *> dms_;
    std::vector<ibv_mr *> dm_mrs_;
};

constexpr unsigned kDmAccess = IBV_ACCESS_ZERO_BASED | kAllAccess;

TEST_F(Dm, TheRegionIsAnnouncedAndFillsUpWithEnomem) {
    ibv_extend_vdev_attr attr{};
    ASSERT_GE(softnda_vdev_ops.query_devices(&attr, 1), 1);
    EXPECT_EQ(attr.max_dm_size, kRegion);
    // 64-byte units, first fit: 100 bytes take 128 and the next starts after them.
    ibv_dm *a = alloc(100);
    ASSERT_NE(a, nullptr);
    ibv_dm *b = alloc(64);
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(offsetOf(a), 0u);
    EXPECT_EQ(offsetOf(b), 128u);
    // log_align_req is honoured on the offset.
    ibv_dm *c = alloc(64, 12);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(offsetOf(c), 4096u);
    // What is left: [192, 4096) and nothing after c's 64 bytes up to 8192 but [4160, 8192).
    ibv_dm *d = alloc(kRegion - 4160);
    ASSERT_NE(d, nullptr);
    EXPECT_EQ(offsetOf(d), 4160u);
    errno = 0;
    EXPECT_EQ(alloc(4096), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    ibv_dm *e = alloc(4096 - 192);
    ASSERT_NE(e, nullptr);
    errno = 0;
    EXPECT_EQ(alloc(64), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    // Freeing gives the range back.
    release(b);
    ibv_dm *f = alloc(64);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(offsetOf(f), 128u);
}

TEST_F(Dm, BadAllocationsAreRefused) {
    for (auto [len, align, mask] :
         {std::tuple<uint64_t, uint32_t, uint32_t>{0, 0, 0}, {kRegion + 1, 0, 0}, {64, 13, 0}, {64, 0, 1}}) {
        errno = 0;
        EXPECT_EQ(alloc(len, align, mask), nullptr) << len << " " << align << " " << mask;
        EXPECT_EQ(errno, EINVAL);
    }
    ibv_alloc_dm_attr a{};
    a.length = 64;
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.alloc_dm(ctx_, &a, nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    // The whole region in one allocation is fine.
    EXPECT_NE(alloc(kRegion), nullptr);
}

TEST_F(Dm, CopiesStayInsideTheAllocation) {
    ibv_dm *dm = alloc(1000);
    ASSERT_NE(dm, nullptr);
    std::vector<uint8_t> zeros(1000, 0xee), pattern(1000);
    std::iota(pattern.begin(), pattern.end(), uint8_t{1});
    ASSERT_EQ(ibv_memcpy_from_dm(zeros.data(), dm, 0, zeros.size()), 0);
    EXPECT_EQ(zeros, std::vector<uint8_t>(1000, 0));  // zeroed when made
    ASSERT_EQ(ibv_memcpy_to_dm(dm, 4, pattern.data(), 996), 0);
    std::vector<uint8_t> back(996);
    ASSERT_EQ(ibv_memcpy_from_dm(back.data(), dm, 4, back.size()), 0);
    EXPECT_TRUE(std::equal(back.begin(), back.end(), pattern.begin()));
    EXPECT_EQ(ibv_memcpy_to_dm(dm, 4, pattern.data(), 1000), EINVAL);  // past the end
    EXPECT_EQ(ibv_memcpy_from_dm(back.data(), dm, 1004, 0), EINVAL);
    // Whole 32-bit words only, as mlx5 copies them.
    EXPECT_EQ(ibv_memcpy_to_dm(dm, 3, pattern.data(), 4), EINVAL);
    EXPECT_EQ(ibv_memcpy_to_dm(dm, 4, pattern.data(), 3), EINVAL);
    EXPECT_EQ(ibv_memcpy_from_dm(back.data(), dm, 2, 8), EINVAL);
    void *mem = nullptr;
    uint64_t len = 0;
    ASSERT_EQ(softnda_vdev_ops.dm_memory(dm, &mem, &len), 0);
    EXPECT_EQ(len, 1024u);  // rounded to 64-byte units
    EXPECT_EQ(static_cast<uint8_t *>(mem)[4], 1);
}

TEST_F(Dm, AZeroBasedRegionIsAWriteTargetAReadSourceAndAnAtomicTarget) {
    connect(a_, b_);
    makeBuffers(512, 0);
    std::iota(src_.begin(), src_.end(), uint8_t{7});
    ibv_dm *dm = alloc(1024);
    ASSERT_NE(dm, nullptr);
    // Registered from DM offset 256: iova 0 is the allocation's byte 256.
    ibv_mr *mr = regDm(dm, 256, 512, kDmAccess);
    ASSERT_NE(mr, nullptr) << errno;
    EXPECT_EQ(mr->addr, nullptr);
    EXPECT_EQ(mr->length, 512u);
    // WRITE 300 bytes of src_ to iova 100 of the region.
    softnda_send_wr w = write(1, 300, mr->rkey);
    w.remote_addr = 100;
    ASSERT_EQ(runOnA(w).status, IBV_WC_SUCCESS);
    std::vector<uint8_t> dm_bytes(1024);
    ASSERT_EQ(ibv_memcpy_from_dm(dm_bytes.data(), dm, 0, dm_bytes.size()), 0);
    for (size_t i = 0; i < dm_bytes.size(); ++i) {
        const bool written = i >= 356 && i < 656;
        ASSERT_EQ(dm_bytes[i], written ? src_[i - 356] : 0) << i;
    }
    // READ the region's first 512 bytes into dst_.
    ASSERT_EQ(ibv_memcpy_to_dm(dm, 256, std::vector<uint8_t>(100, 0xab).data(), 100), 0);
    softnda_sge s = sge(dst_.data(), 512, dmr_);
    auto r = wr(SOFTNDA_OP_RDMA_READ, 2, &s, 1);
    r.remote_addr = 0;
    r.rkey = mr->rkey;
    ASSERT_EQ(runOnA(r).status, IBV_WC_SUCCESS);
    for (size_t i = 0; i < 512; ++i) {
        const uint8_t want = i < 100 ? 0xab : dm_bytes[256 + i];
        ASSERT_EQ(dst_[i], want) << i;
    }
    // FETCH_AND_ADD on iova 8.
    uint64_t v = 40;
    ASSERT_EQ(ibv_memcpy_to_dm(dm, 256 + 8, &v, 8), 0);
    alignas(8) uint64_t old = 0;
    ibv_mr *om = reg(&old, 8);
    softnda_sge os = sge(&old, 8, om);
    auto faa = wr(SOFTNDA_OP_ATOMIC_FETCH_AND_ADD, 3, &os, 1);
    faa.remote_addr = 8;
    faa.rkey = mr->rkey;
    faa.compare_add = 2;
    ASSERT_EQ(runOnA(faa).status, IBV_WC_SUCCESS);
    EXPECT_EQ(old, 40u);
    ASSERT_EQ(ibv_memcpy_from_dm(&v, dm, 256 + 8, 8), 0);
    EXPECT_EQ(v, 42u);
    // Beyond the region's 512 bytes: a remote access error, nothing written.
    w = write(4, 8, mr->rkey);
    w.remote_addr = 508;
    EXPECT_EQ(runOnA(w).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Dm, AZeroBasedRegionIsALocalBuffer) {
    connect(a_, b_);
    makeBuffers(256, 0);
    ibv_dm *dm = alloc(256);
    ASSERT_NE(dm, nullptr);
    std::vector<uint8_t> pattern(256);
    std::iota(pattern.begin(), pattern.end(), uint8_t{3});
    ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, pattern.data(), pattern.size()), 0);
    ibv_mr *mr = regDm(dm, 0, 256, kDmAccess);
    ASSERT_NE(mr, nullptr);
    // A WRITE whose source SGE is the DM region (zero-based address 16).
    softnda_sge s{16, 200, mr->lkey};
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s, 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data());
    w.rkey = dmr_->rkey;
    ASSERT_EQ(runOnA(w).status, IBV_WC_SUCCESS);
    EXPECT_TRUE(std::equal(dst_.begin(), dst_.begin() + 200, pattern.begin() + 16));
    EXPECT_EQ(dst_[200], 0);
}

TEST_F(Dm, RegionRulesAndFreeWithARegionIsBusy) {
    ibv_dm *dm = alloc(256);
    ASSERT_NE(dm, nullptr);
    struct Bad {
        uint64_t offset;
        size_t length;
        unsigned access;
    };
    for (const Bad &b : {Bad{0, 64, kAllAccess},                                       // not zero-based
                         Bad{0, 64, kDmAccess | IBV_ACCESS_RELAXED_ORDERING},          // not for DM
                         Bad{0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_WRITE},  // no local write
                         Bad{200, 64, kDmAccess}, Bad{257, 0, kDmAccess}}) {
        errno = 0;
        EXPECT_EQ(softnda_vdev_ops.reg_dm_mr(pd_, dm, b.offset, b.length, b.access), nullptr)
            << b.offset << " " << b.length << " " << b.access;
        EXPECT_EQ(errno, EINVAL);
    }
    // A region of no bytes is allowed, as the kernel allows it (rdma-core's tests register one).
    ibv_mr *empty = softnda_vdev_ops.reg_dm_mr(pd_, dm, 0, 0, kDmAccess);
    ASSERT_NE(empty, nullptr);
    ASSERT_EQ(softnda_vdev_ops.dereg_mr(empty), 0);
    ibv_mr *mr = softnda_vdev_ops.reg_dm_mr(pd_, dm, 0, 256, kDmAccess);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(softnda_vdev_ops.free_dm(dm), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0,
                                        IBV_ACCESS_LOCAL_WRITE),
              -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd_), -EBUSY);
    ASSERT_EQ(softnda_vdev_ops.dereg_mr(mr), 0);
    release(dm);
}

TEST_F(Dm, ABlobBringsTheAllocationAndItsRegionBack) {
    ibv_dm *dm = alloc(128);
    ASSERT_NE(dm, nullptr);
    ibv_mr *mr = softnda_vdev_ops.reg_dm_mr(pd_, dm, 64, 64, kDmAccess);
    ASSERT_NE(mr, nullptr);
    ibv_extend_vdev_state dm_blob{}, mr_blob{};
    ASSERT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_DM, dm, &dm_blob), 0);
    ASSERT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_MR, mr, &mr_blob), 0);
    void *mem = nullptr;
    uint64_t len = 0;
    ASSERT_EQ(softnda_vdev_ops.dm_memory(dm, &mem, &len), 0);
    const uint64_t key = mr->rkey;
    // Import while the originals live: the same range of the region is taken.
    ibv_extend_vdev_import env{};
    env.context = ctx_;
    env.pd = pd_;
    env.ops = arena().ops();
    env.relocate = [](void *, uint64_t old, uint64_t) -> void * { return reinterpret_cast<void *>(old); };
    ASSERT_EQ(softnda_vdev_ops.set_paused("softnda0", 1), 0);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_DM, &dm_blob, &env), nullptr);
    EXPECT_EQ(errno, EEXIST);
    // Take the originals away without freeing the memory (as a dead process leaves it), then import.
    ASSERT_EQ(softnda_vdev_ops.dereg_mr(mr), 0);
    {
        softnda::Dm *raw = softnda::asDm(dm);
        std::lock_guard<std::mutex> ctl(raw->ctx->dev->ctl);
        raw->ctx->dev->dm_used.erase(raw->offset);
        raw->ctx->objects--;
        raw->magic = 0;
        delete raw;
    }
    dms_.clear();
    auto *again =
        static_cast<ibv_dm *>(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_DM, &dm_blob, &env));
    ASSERT_NE(again, nullptr) << errno;
    dms_.push_back(again);
    EXPECT_EQ(offsetOf(again), 0u);
    void *mem2 = nullptr;
    ASSERT_EQ(softnda_vdev_ops.dm_memory(again, &mem2, &len), 0);
    EXPECT_EQ(mem2, mem);
    // The region's blob needs its DM.
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_MR, &mr_blob, &env), nullptr);
    EXPECT_EQ(errno, EINVAL);
    env.dm = again;
    auto *mr2 = static_cast<ibv_mr *>(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_MR, &mr_blob, &env));
    ASSERT_NE(mr2, nullptr) << errno;
    dm_mrs_.push_back(mr2);
    EXPECT_EQ(mr2->rkey, key);
    EXPECT_EQ(softnda_vdev_ops.free_dm(again), -EBUSY);  // the imported region counts
    ASSERT_EQ(softnda_vdev_ops.set_paused("softnda0", 0), 0);
}

}  // namespace
}  // namespace softnda_test
