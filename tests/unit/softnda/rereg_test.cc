// ibv_rereg_mr on softnda (SPEC.md §13): each flag changes what it names and the keys stay, as on
// a kernel provider; work requests naming them meet the region as it now is; bad input leaves the
// MR as it was.
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class Rereg : public QpPairTest {
  protected:
    void SetUp() override {
        QpPairTest::SetUp();
        makeBuffers(4096, 0x5a);
        connect(a_, b_);
    }

    softnda_cqe runOnA(const softnda_send_wr &w) {
        EXPECT_EQ(postOne(a_, w), 0);
        return waitOne(scq_.cq);
    }

    // A signalled WRITE of 8 bytes of src_ to iova `to` under rkey.
    softnda_send_wr writeTo(uint64_t id, uint64_t to, uint32_t rkey) {
        softnda_send_wr w = write(id, 8, rkey);
        w.remote_addr = to;
        return w;
    }

    static int rereg(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t len, int access) {
        return softnda_vdev_ops.rereg_mr(mr, flags, pd, addr, len, reinterpret_cast<uintptr_t>(addr), access);
    }
};

TEST_F(Rereg, AccessChangesUnderTheSameKeys) {
    std::vector<uint8_t> buf(64, 0);
    ibv_mr *mr = reg(buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    const uint32_t old_lkey = mr->lkey, old_rkey = mr->rkey;
    ASSERT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
              0);
    EXPECT_EQ(mr->lkey, old_lkey);
    EXPECT_EQ(mr->rkey, old_rkey);
    EXPECT_EQ(mr->addr, buf.data());
    EXPECT_EQ(mr->length, buf.size());
    // The key a peer already holds now writes.
    softnda_cqe c = runOnA(writeTo(2, reinterpret_cast<uintptr_t>(buf.data()), old_rkey));
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(buf[0], 0x5a);
}

TEST_F(Rereg, AccessTakenAwayIsEnforced) {
    std::vector<uint8_t> buf(64, 0);
    ibv_mr *mr = reg(buf.data(), buf.size());
    ASSERT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE), 0);
    softnda_cqe c = runOnA(writeTo(1, reinterpret_cast<uintptr_t>(buf.data()), mr->rkey));
    EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(buf[0], 0);
}

TEST_F(Rereg, TranslationMovesTheRegionToNewMemory) {
    std::vector<uint8_t> first(64, 0), second(256, 0);
    ibv_mr *mr = reg(first.data(), first.size());
    const uint32_t old_key = mr->rkey;
    ASSERT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, second.data(), second.size(), 0), 0);
    EXPECT_EQ(mr->addr, second.data());
    EXPECT_EQ(mr->length, second.size());
    EXPECT_EQ(mr->rkey, old_key);
    softnda_cqe c = runOnA(writeTo(1, reinterpret_cast<uintptr_t>(second.data()) + 128, mr->rkey));
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(second[128], 0x5a);
    // The old range is no longer the region's.
    c = runOnA(writeTo(2, reinterpret_cast<uintptr_t>(first.data()), mr->rkey));
    EXPECT_EQ(c.status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(first[0], 0);
}

TEST_F(Rereg, PdChangesAndTheOldPdsQpsLoseTheRegion) {
    ibv_pd *other = softnda_vdev_ops.alloc_pd(ctx_);
    ASSERT_NE(other, nullptr);
    ibv_mr *mr =
        softnda_vdev_ops.reg_mr(pd_, src_.data(), 64, reinterpret_cast<uintptr_t>(src_.data()), kAllAccess);
    ASSERT_NE(mr, nullptr);
    ASSERT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
    EXPECT_EQ(mr->pd, other);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(other), -EBUSY);  // the MR is other's now
    s_ = sge(src_.data(), 8, mr);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s_, 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data());
    w.rkey = dmr_->rkey;
    EXPECT_EQ(runOnA(w).status, IBV_WC_LOC_PROT_ERR);  // a_ is on pd_
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(mr), 0);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(other), 0);
}

TEST_F(Rereg, BadInputLeavesTheRegionAsItWas) {
    ibv_mr *mr = reg(dst_.data(), 64);
    const ibv_mr before = *mr;
    EXPECT_EQ(rereg(mr, 0, nullptr, nullptr, 0, 0), -EINVAL);
    EXPECT_EQ(rereg(mr, 1 << 5, nullptr, nullptr, 0, 0), -EINVAL);
    EXPECT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0), -EINVAL);
    EXPECT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE), -EINVAL);
    EXPECT_EQ(rereg(mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 64, 0), -EINVAL);
    EXPECT_EQ(
        rereg(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD, nullptr, src_.data(), 64, 0),
        -EINVAL);
    EXPECT_EQ(mr->lkey, before.lkey);
    EXPECT_EQ(mr->rkey, before.rkey);
    EXPECT_EQ(mr->pd, before.pd);
    EXPECT_EQ(mr->addr, before.addr);
    EXPECT_EQ(runOnA(writeTo(1, reinterpret_cast<uintptr_t>(dst_.data()), mr->rkey)).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst_[0], 0x5a);
}

}  // namespace
}  // namespace softnda_test
