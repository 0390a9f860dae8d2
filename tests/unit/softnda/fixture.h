// Shared test fixture: one open softnda0 context with the memfd-backed ops, plus small builders
// for CQs, SRQs, connected QPs and MRs (the helpers without a fixture are in testkit.h).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/qp_init_attr.h"
#include "tests/unit/softnda/memfd_ops.h"
#include "tests/unit/softnda/testkit.h"

namespace softnda_test {

struct CqH {
    ibv_cq_extend *ext = nullptr;
    softnda_cq cq{};
};

struct SrqH {
    ibv_srq_extend *ext = nullptr;
    softnda_rq rq{};
};

struct QpH {
    ibv_qp_extend *ext = nullptr;
    softnda_sq sq{};
    softnda_rq rq{};
    uint32_t qpn() const { return ext->qp->qp_num; }
};

struct QpCaps {
    uint32_t send_wr = 64;
    uint32_t recv_wr = 64;
    uint32_t send_sge = 4;
    uint32_t recv_sge = 4;
    uint32_t inline_data = 64;
    int sq_sig_all = 0;
    ibv_qp_type type = IBV_QPT_RC;
};

class SoftndaTest : public ::testing::Test {
  protected:
    // Options applied before the device opens (key, value).
    virtual std::vector<std::pair<std::string, std::string>> options() { return {}; }

    void SetUp() override {
        resetConfig();
        for (auto &kv : options()) {
            ASSERT_EQ(softnda_vdev_ops.configure(kv.first.c_str(), kv.second.c_str()), 0) << kv.first;
        }
        arena().resetCounters();
        base_allocs_ = arena().liveAllocs();
        ctx_ = softnda_vdev_ops.open_device("softnda0");
        ASSERT_NE(ctx_, nullptr);
        ext_ = softnda_driver_ops.alloc_context(ctx_);
        ASSERT_NE(ext_, nullptr);
        pd_ = softnda_vdev_ops.alloc_pd(ctx_);
        ASSERT_NE(pd_, nullptr);
    }

    void TearDown() override {
        for (auto it = qps_.rbegin(); it != qps_.rend(); ++it) {
            EXPECT_EQ(ext_->ops->destroy_qp(*it), 0);
        }
        for (auto *s : srqs_) {
            EXPECT_EQ(ext_->ops->destroy_srq(s), 0);
        }
        for (auto *c : cqs_) {
            EXPECT_EQ(ext_->ops->destroy_cq(c), 0);
        }
        for (auto *m : mrs_) {
            EXPECT_EQ(softnda_vdev_ops.dereg_mr(m), 0);
        }
        if (pd_ != nullptr) {
            EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd_), 0);
        }
        if (ext_ != nullptr) {
            softnda_driver_ops.free_context(ext_);
        }
        if (ctx_ != nullptr) {
            EXPECT_EQ(softnda_vdev_ops.close_device(ctx_), 0);
        }
        EXPECT_EQ(arena().liveAllocs(), base_allocs_);
        EXPECT_EQ(arena().liveDbMappings(), 0u);
    }

    static MemfdArena &arena() { return MemfdArena::instance(); }

    ibv_cq_init_attr_extend cqAttr(uint32_t cqe, queue_buf_dma_mode type = QU_BUF_DMA_MODE_DEFAULT) {
        ibv_cq_init_attr_extend a{};
        a.attr.cqe = cqe;
        a.type = type;
        a.ops = arena().ops();
        return a;
    }

    // wc_flags: what ibv_create_cq_ex asks of its completions (timestamps: SPEC.md §15).
    CqH makeCq(uint32_t cqe = 256, uint64_t wc_flags = 0) {
        CqH h;
        auto a = cqAttr(cqe);
        a.attr.wc_flags = wc_flags;
        h.ext = ext_->ops->create_cq(ctx_, &a);
        EXPECT_NE(h.ext, nullptr);
        if (h.ext != nullptr) {
            cqs_.push_back(h.ext);
            EXPECT_EQ(softnda_cq_init(&h.cq, &h.ext->cq_info), 0);
        }
        return h;
    }

    SrqH makeSrq(uint32_t max_wr, uint32_t max_sge = 2, uint32_t limit = 0) {
        SrqH h;
        ibv_srq_init_attr_extend a{};
        a.pd = pd_;
        a.attr.attr.max_wr = max_wr;
        a.attr.attr.max_sge = max_sge;
        a.attr.attr.srq_limit = limit;
        a.ops = arena().ops();
        h.ext = ext_->ops->create_srq(ctx_, &a);
        EXPECT_NE(h.ext, nullptr);
        if (h.ext != nullptr) {
            srqs_.push_back(h.ext);
            EXPECT_EQ(softnda_rq_init(&h.rq, &h.ext->srq_info), 0);
        }
        return h;
    }

    ibv_qp_init_attr_extend qpAttr(const CqH &scq, const CqH &rcq, const QpCaps &c = QpCaps{},
                                   ibv_srq_extend *srq = nullptr) {
        return ibvx::qpInitAttr({.pd = pd_,
                                 .send_cq = scq.ext->cq,
                                 .recv_cq = rcq.ext->cq,
                                 .srq = srq != nullptr ? srq->srq : nullptr,
                                 .qp_type = c.type,
                                 .send_wr = c.send_wr,
                                 .recv_wr = c.recv_wr,
                                 .send_sge = c.send_sge,
                                 .recv_sge = c.recv_sge,
                                 .inline_data = c.inline_data,
                                 .sq_sig_all = c.sq_sig_all,
                                 .ops = arena().ops()});
    }

    QpH makeQp(const CqH &scq, const CqH &rcq, const QpCaps &c = QpCaps{}, ibv_srq_extend *srq = nullptr) {
        QpH h;
        auto a = qpAttr(scq, rcq, c, srq);
        h.ext = ext_->ops->create_qp(ctx_, &a);
        EXPECT_NE(h.ext, nullptr) << "errno " << errno;
        if (h.ext != nullptr) {
            qps_.push_back(h.ext);
            EXPECT_EQ(softnda_sq_init(&h.sq, &h.ext->sq_info), 0);
            if (srq == nullptr) {
                EXPECT_EQ(softnda_rq_init(&h.rq, &h.ext->rq_info), 0);
            }
        }
        return h;
    }

    void destroyQp(QpH &h) {
        ASSERT_EQ(ext_->ops->destroy_qp(h.ext), 0);
        qps_.erase(std::find(qps_.begin(), qps_.end(), h.ext));
        h.ext = nullptr;
    }

    // Brings a and b to RTS connected to each other.
    void connect(QpH &a, QpH &b, int access = kAllAccess, uint8_t rnr_retry = 7) {
        ASSERT_EQ(toInit(a.ext->qp, access), 0);
        if (a.ext != b.ext) {
            ASSERT_EQ(toInit(b.ext->qp, access), 0);
        }
        ASSERT_EQ(toRtr(a.ext->qp, b.qpn()), 0);
        if (a.ext != b.ext) {
            ASSERT_EQ(toRtr(b.ext->qp, a.qpn()), 0);
        }
        ASSERT_EQ(toRts(a.ext->qp, 0, rnr_retry), 0);
        if (a.ext != b.ext) {
            ASSERT_EQ(toRts(b.ext->qp, 0, rnr_retry), 0);
        }
    }

    ibv_mr *reg(void *addr, size_t len, int access = kAllAccess, ibv_pd *pd = nullptr) {
        ibv_mr *mr = softnda_vdev_ops.reg_mr(pd != nullptr ? pd : pd_, addr, len,
                                             reinterpret_cast<uintptr_t>(addr), access);
        EXPECT_NE(mr, nullptr) << "errno " << errno;
        if (mr != nullptr) {
            mrs_.push_back(mr);
        }
        return mr;
    }

    // A signalled RDMA WRITE (wr_id 1) of the 8 bytes at *src into *dst, both registered here.
    // *s receives its SGE, which must outlive the post.
    softnda_send_wr write8(uint64_t *src, uint64_t *dst, softnda_sge *s) {
        *s = sge(src, 8, reg(src, 8));
        softnda_send_wr w = wr(SOFTNDA_OP_RDMA_WRITE, 1, s, 1);
        w.remote_addr = reinterpret_cast<uintptr_t>(dst);
        w.rkey = reg(dst, 8)->rkey;
        return w;
    }

    static int postOne(QpH &q, const softnda_send_wr &w) { return postAndRing(&q.sq, w); }

    static int postRecv(QpH &q, uint64_t wr_id, const softnda_sge *s, uint32_t n) {
        int rc = softnda_rq_post(&q.rq, wr_id, s, n);
        if (rc == 0) {
            softnda_rq_doorbell(&q.rq);
        }
        return rc;
    }

    static int qpState(const QpH &q) {
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        EXPECT_EQ(softnda_vdev_ops.query_qp(q.ext->qp, &a, IBV_QP_STATE, &ia), 0);
        return a.qp_state;
    }

    ibv_context *ctx_ = nullptr;
    ibv_context_extend *ext_ = nullptr;
    ibv_pd *pd_ = nullptr;
    std::vector<ibv_qp_extend *> qps_;
    std::vector<ibv_srq_extend *> srqs_;
    std::vector<ibv_cq_extend *> cqs_;
    std::vector<ibv_mr *> mrs_;
    size_t base_allocs_ = 0;
};

// Two QPs, a_ and b_, on one send CQ and one receive CQ, not connected yet; and, once a test
// asks for them, a source and a destination buffer registered for the WRITEs between them.
class QpPairTest : public SoftndaTest {
  protected:
    void SetUp() override {
        SoftndaTest::SetUp();
        scq_ = makeCq();
        rcq_ = makeCq();
        a_ = makeQp(scq_, rcq_);
        b_ = makeQp(scq_, rcq_);
    }

    void makeBuffers(size_t bytes, uint8_t src_fill) {
        src_.assign(bytes, src_fill);
        dst_.assign(bytes, 0);
        smr_ = reg(src_.data(), src_.size());
        dmr_ = reg(dst_.data(), dst_.size());
    }

    // A signalled WRITE of the first len bytes of src_ to dst_ under rkey (a test may name a
    // wrong one); s_ holds its SGE.
    softnda_send_wr write(uint64_t id, uint32_t len, uint32_t rkey) {
        s_ = sge(src_.data(), len, smr_);
        auto w = wr(SOFTNDA_OP_RDMA_WRITE, id, &s_, 1);
        w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data());
        w.rkey = rkey;
        return w;
    }

    CqH scq_, rcq_;
    QpH a_, b_;
    std::vector<uint8_t> src_, dst_;
    ibv_mr *smr_ = nullptr, *dmr_ = nullptr;
    softnda_sge s_{};
};

}  // namespace softnda_test
