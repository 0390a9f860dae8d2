// Memory windows on softnda (SPEC.md §16): type 1 and type 2 binds as WQEs, access through a
// window (range, access, PD, the QP of a type 2 window), local invalidation, SEND_WITH_INV seen
// in the receiver's completion, and the errors of binds and invalidations IB names.
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr int kBindable = kAllAccess | IBV_ACCESS_MW_BIND;

class Mw : public QpPairTest {
  protected:
    void SetUp() override {
        QpPairTest::SetUp();
        makeBuffers(4096, 0x5a);
        connect(a_, b_);
        win_ = reg(dst_.data(), dst_.size(), kBindable);
    }
    void TearDown() override {
        for (ibv_mw *mw : mws_) {
            EXPECT_EQ(softnda_vdev_ops.dealloc_mw(mw), 0);
        }
        QpPairTest::TearDown();
    }

    ibv_mw *alloc(ibv_mw_type type) {
        ibv_mw *mw = softnda_vdev_ops.alloc_mw(pd_, type);
        EXPECT_NE(mw, nullptr) << "errno " << errno;
        if (mw != nullptr) {
            mws_.push_back(mw);
        }
        return mw;
    }
    void dealloc(ibv_mw *mw) {
        ASSERT_EQ(softnda_vdev_ops.dealloc_mw(mw), 0);
        mws_.erase(std::find(mws_.begin(), mws_.end(), mw));
    }

    // Binds mw through q to [at, at+len) of mr with access, as the new key byte of its rkey; the
    // completion. On success mw->rkey follows, as ibv_bind_mw keeps it.
    softnda_cqe bind(QpH &q, ibv_mw *mw, const ibv_mr *mr, const void *at, uint64_t len, int access) {
        softnda_send_wr w = wr(0, 70, nullptr, 0);
        const uint32_t key = incKey(mw->rkey);
        softnda_send_wr_set_bind(&w, mw->rkey, key, mr != nullptr ? mr->lkey : 0,
                                 reinterpret_cast<uintptr_t>(at), len, static_cast<uint32_t>(access));
        EXPECT_EQ(postOne(q, w), 0);
        softnda_cqe c = waitOne(scq_.cq);
        EXPECT_EQ(c.opcode, IBV_WC_BIND_MW);
        if (c.status == IBV_WC_SUCCESS) {
            mw->rkey = key;
        }
        return c;
    }
    softnda_cqe bindDst(QpH &q, ibv_mw *mw, int access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ) {
        return bind(q, mw, win_, dst_.data() + 1024, 1024, access);
    }

    softnda_cqe run(QpH &q, const softnda_send_wr &w) {
        EXPECT_EQ(postOne(q, w), 0);
        return waitOne(scq_.cq);
    }
    // A signalled WRITE (or READ) of 8 bytes at dst_ + off through rkey, from a_.
    softnda_cqe rdma(uint8_t op, size_t off, uint32_t rkey) {
        softnda_send_wr w = write(1, 8, rkey);
        w.opcode = op;
        w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data() + off);
        return run(a_, w);
    }
    softnda_cqe localInv(QpH &q, uint32_t rkey) {
        softnda_send_wr w = wr(SOFTNDA_OP_LOCAL_INV, 71, nullptr, 0);
        w.rkey = rkey;
        softnda_cqe c = run(q, w);
        EXPECT_EQ(c.opcode, IBV_WC_LOCAL_INV);
        return c;
    }
    // A SEND_WITH_INV of 8 bytes of src_ from a_, invalidating rkey at b_.
    softnda_cqe sendInv(uint32_t rkey) {
        s_ = sge(src_.data(), 8, smr_);
        softnda_send_wr w = wr(SOFTNDA_OP_SEND_WITH_INV, 72, &s_, 1);
        w.imm_data = rkey;
        return run(a_, w);
    }

    ibv_mr *win_ = nullptr;  // dst_, bindable
    std::vector<ibv_mw *> mws_;
};

TEST_F(Mw, AllocatedUnboundWithAWindowKey) {
    ibv_mw *t1 = alloc(IBV_MW_TYPE_1);
    ibv_mw *t2 = alloc(IBV_MW_TYPE_2);
    EXPECT_EQ(t1->type, IBV_MW_TYPE_1);
    EXPECT_EQ(t2->type, IBV_MW_TYPE_2);
    EXPECT_EQ(t1->pd, pd_);
    EXPECT_NE(t1->rkey >> 8, t2->rkey >> 8);
    EXPECT_NE(t1->rkey, win_->rkey);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.alloc_mw(pd_, static_cast<ibv_mw_type>(3)), nullptr);
    EXPECT_EQ(errno, EINVAL);
    // An unbound window lets nothing through.
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, t2->rkey).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, Type2WriteAndReadThroughTheWindow) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    const uint32_t unbound = mw->rkey;
    softnda_cqe c = bindDst(b_, mw);
    ASSERT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_NE(mw->rkey, unbound);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst_[1024], 0x5a);
    dst_[2040] = 0x77;
    softnda_cqe r = rdma(SOFTNDA_OP_RDMA_READ, 2040, mw->rkey);  // the window's last 8 bytes
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(src_[0], 0x77);
    // One byte past the window, inside the MR: refused.
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 2041, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst_[2048], 0);
}

TEST_F(Mw, WindowAccessIsItsOwn) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, mw, IBV_ACCESS_REMOTE_READ).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_READ, 1024, mw->rkey).status, IBV_WC_SUCCESS);
    // The MR allows writes; the window does not.
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst_[1024], 0);
}

TEST_F(Mw, Type2WindowServesOnlyTheQpThatBoundIt) {
    QpH c = makeQp(scq_, rcq_);
    connect(c, c);  // a loopback QP of the same PD
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(c, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst_[1024], 0);
}

TEST_F(Mw, DestroyingTheQpFreesItsType2Windows) {
    QpH c = makeQp(scq_, rcq_);
    connect(c, c);
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(c, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(win_), -EBUSY);
    destroyQp(c);
    // Free again: the MR is no longer busy, and the window binds through another QP.
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_SUCCESS);
}

TEST_F(Mw, Type1BindsMovesAndLetsAnyQpOfItsPdThrough) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_1);
    QpH c = makeQp(scq_, rcq_);
    connect(c, c);
    ASSERT_EQ(bindDst(c, mw).status, IBV_WC_SUCCESS);  // bound through c, used through b_
    const uint32_t first = mw->rkey;
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, first).status, IBV_WC_SUCCESS);
    // A type 1 window rebinds while bound: the old rkey no longer works.
    ASSERT_EQ(bind(c, mw, win_, dst_.data(), 512, IBV_ACCESS_REMOTE_WRITE).status, IBV_WC_SUCCESS);
    EXPECT_NE(mw->rkey, first);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 0, mw->rkey).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst_[0], 0x5a);
    // Unbound by a bind of no MR and no length.
    ASSERT_EQ(bind(c, mw, nullptr, nullptr, 0, 0).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 0, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, StaleType1KeyMisses) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_1);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    const uint32_t first = mw->rkey;
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, first).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, LocalInvalidateThenUseFailsAndRebindWorks) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    const uint32_t first = mw->rkey;
    EXPECT_EQ(localInv(b_, first).status, IBV_WC_SUCCESS);
    // Free again: it binds anew, under a new key byte.
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_SUCCESS);
    EXPECT_EQ(localInv(b_, mw->rkey).status, IBV_WC_SUCCESS);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1032, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst_[1032], 0);
}

TEST_F(Mw, SendWithInvalidateReportsTheKeyAndInvalidates) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    std::vector<uint8_t> rbuf(64, 0);
    softnda_sge rs = sge(rbuf.data(), 64, reg(rbuf.data(), rbuf.size()));
    ASSERT_EQ(postRecv(b_, 9, &rs, 1), 0);
    softnda_cqe s = sendInv(mw->rkey);
    EXPECT_EQ(s.status, IBV_WC_SUCCESS);
    EXPECT_EQ(s.opcode, IBV_WC_SEND);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.opcode, IBV_WC_RECV);
    EXPECT_EQ(r.flags & SOFTNDA_CQE_WITH_INV, SOFTNDA_CQE_WITH_INV);
    EXPECT_EQ(r.flags & SOFTNDA_CQE_WITH_IMM, 0);
    EXPECT_EQ(r.imm_data, mw->rkey);
    EXPECT_EQ(r.byte_len, 8u);
    EXPECT_EQ(rbuf[0], 0x5a);
    EXPECT_EQ(rdma(SOFTNDA_OP_RDMA_WRITE, 1024, mw->rkey).status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(Mw, SendWithInvalidateOfAnMrKeyIsAnInvalidRequest) {
    std::vector<uint8_t> rbuf(64, 0);
    softnda_sge rs = sge(rbuf.data(), 64, reg(rbuf.data(), rbuf.size()));
    ASSERT_EQ(postRecv(b_, 9, &rs, 1), 0);
    EXPECT_EQ(sendInv(win_->rkey).status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_EQ(rbuf[0], 0);  // nothing consumed: the receive is flushed, not filled
    EXPECT_EQ(waitOne(rcq_.cq).status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(Mw, SendWithInvalidateOfAType1WindowIsAnInvalidRequest) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_1);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(sendInv(mw->rkey).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(Mw, LocalInvalidateOfAType1WindowFails) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_1);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(localInv(b_, mw->rkey).status, IBV_WC_LOC_QP_OP_ERR);
    EXPECT_EQ(qpState(b_), IBV_QPS_ERR);
}

TEST_F(Mw, LocalInvalidateThroughAnotherQpFails) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(localInv(a_, mw->rkey).status, IBV_WC_LOC_QP_OP_ERR);
}

// Each bad bind completes MW_BIND_ERR and moves its QP to ERR: one fresh loopback QP each.
TEST_F(Mw, BadBindsAreBindErrors) {
    std::vector<uint8_t> plain(256, 0);
    ibv_mr *no_bind = reg(plain.data(), plain.size());  // without IBV_ACCESS_MW_BIND
    std::vector<uint8_t> ro(256, 0);
    ibv_mr *read_only = reg(ro.data(), ro.size(), IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
    ibv_pd *other_pd = softnda_vdev_ops.alloc_pd(ctx_);
    ASSERT_NE(other_pd, nullptr);
    ibv_mw *foreign = softnda_vdev_ops.alloc_mw(other_pd, IBV_MW_TYPE_2);
    ASSERT_NE(foreign, nullptr);
    ibv_mw *bound = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, bound).status, IBV_WC_SUCCESS);
    ibv_mw *t2 = alloc(IBV_MW_TYPE_2);
    struct Case {
        const char *what;
        ibv_mw *mw;
        const ibv_mr *mr;
        const void *at;
        uint64_t len;
        int access;
    } cases[] = {
        {"MR without MW_BIND", t2, no_bind, plain.data(), 64, IBV_ACCESS_REMOTE_READ},
        {"writable window on an MR without local write", t2, read_only, ro.data(), 64,
         IBV_ACCESS_REMOTE_WRITE},
        {"range past the MR", t2, win_, dst_.data() + 4000, 200, IBV_ACCESS_REMOTE_READ},
        {"zero-length type 2", t2, win_, dst_.data(), 0, IBV_ACCESS_REMOTE_READ},
        {"unknown access bit", t2, win_, dst_.data(), 8, IBV_ACCESS_ZERO_BASED},
        {"window of another PD", foreign, win_, dst_.data(), 8, IBV_ACCESS_REMOTE_READ},
        {"bound type 2 window", bound, win_, dst_.data(), 8, IBV_ACCESS_REMOTE_READ},
    };
    for (const Case &k : cases) {
        QpH q = makeQp(scq_, rcq_);
        connect(q, q);
        const uint32_t before = k.mw->rkey;
        EXPECT_EQ(bind(q, k.mw, k.mr, k.at, k.len, k.access).status, IBV_WC_MW_BIND_ERR) << k.what;
        EXPECT_EQ(k.mw->rkey, before) << k.what;
        EXPECT_EQ(qpState(q), IBV_QPS_ERR) << k.what;
        destroyQp(q);
    }
    EXPECT_EQ(softnda_vdev_ops.dealloc_mw(foreign), 0);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(other_pd), 0);
}

TEST_F(Mw, BoundMrAndWindowedPdAreBusy) {
    ibv_mw *mw = alloc(IBV_MW_TYPE_2);
    ASSERT_EQ(bindDst(b_, mw).status, IBV_WC_SUCCESS);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(win_), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.rereg_mr(win_, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0, kAllAccess),
              -EBUSY);
    ibv_pd *pd = softnda_vdev_ops.alloc_pd(ctx_);
    ibv_mw *other = softnda_vdev_ops.alloc_mw(pd, IBV_MW_TYPE_1);
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.dealloc_mw(other), 0);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd), 0);
    // Deallocating a bound window releases its MR.
    dealloc(mw);
    EXPECT_EQ(softnda_vdev_ops.rereg_mr(win_, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0, kBindable),
              0);
}

TEST_F(Mw, QueryDeviceAnnouncesWindows) {
    ibv_device_attr attr{};
    ASSERT_EQ(softnda_vdev_ops.query_device(ctx_, &attr), 0);
    EXPECT_NE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW, 0u);
    EXPECT_NE(attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B, 0u);
    EXPECT_NE(attr.device_cap_flags & IBV_DEVICE_MEM_MGT_EXTENSIONS, 0u);
    EXPECT_GT(attr.max_mw, 0);
}

}  // namespace
}  // namespace softnda_test
