// Shared test fixture: one open softnda0 context with the memfd-backed ops, plus small builders
// for CQs, SRQs, connected QPs and MRs. Device-side work goes through softnda_device.h only.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/qp_init_attr.h"
#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"
#include "tests/unit/softnda/memfd_ops.h"

namespace softnda_test {

// Restores every option to its documented default (the registry outlives a test).
inline void resetConfig() {
    const char *kv[][2] = {
        {"devices", "1"},       {"max_pd", "65536"},        {"max_mr", "1048576"},
        {"max_qp", "131072"},   {"max_cq", "131072"},       {"max_srq", "65536"},
        {"max_qp_wr", "32768"}, {"max_cqe", "4194304"},     {"max_srq_wr", "32768"},
        {"max_sge", "29"},      {"max_inline_data", "464"}, {"max_msg_sz", "2147483648"},
        {"phys_port_cnt", "1"}, {"engine_threads", "1"},    {"spin_us", "50"},
        {"sleep_us", "1000"},   {"futex_waitv", "1"},       {"max_mr_size", "1099511627776"},
    };
    for (auto &p : kv) {
        ASSERT_EQ(softnda_vdev_ops.configure(p[0], p[1]), 0) << p[0];
    }
}

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

    CqH makeCq(uint32_t cqe = 256) {
        CqH h;
        auto a = cqAttr(cqe);
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

    static int toInit(ibv_qp *qp, int access) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = 1;
        a.qp_access_flags = static_cast<unsigned>(access);
        return softnda_vdev_ops.modify_qp(
            qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    }
    static int toRtr(ibv_qp *qp, uint32_t dest, uint32_t rq_psn = 0) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_4096;
        a.dest_qp_num = dest;
        a.rq_psn = rq_psn;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 1;
        a.ah_attr.port_num = 1;
        return softnda_vdev_ops.modify_qp(qp, &a,
                                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                              IBV_QP_MIN_RNR_TIMER);
    }
    static int toRts(ibv_qp *qp, uint32_t sq_psn = 0, uint8_t rnr_retry = 7) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = rnr_retry;
        a.max_rd_atomic = 16;
        return softnda_vdev_ops.modify_qp(qp, &a,
                                          IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                              IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    }

    static constexpr int kAllAccess =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

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

    // Polls until n CQEs arrived (or 20 s passed, which only a broken engine takes).
    static std::vector<softnda_cqe> waitCqes(softnda_cq &cq, size_t n) {
        std::vector<softnda_cqe> out;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        softnda_cqe buf[64];
        while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
            int got = softnda_cq_poll(&cq, buf, static_cast<int>(std::min<size_t>(64, n - out.size())));
            if (got > 0) {
                out.insert(out.end(), buf, buf + got);
            } else if (got < 0) {
                break;
            } else {
                std::this_thread::yield();
            }
        }
        return out;
    }

    static softnda_cqe waitOne(softnda_cq &cq) {
        auto v = waitCqes(cq, 1);
        EXPECT_EQ(v.size(), 1u);
        return v.empty() ? softnda_cqe{} : v[0];
    }

    // Nothing more arrives within a short settle time (used after an expected completion).
    static bool staysEmpty(softnda_cq &cq) {
        softnda_cqe c;
        for (int i = 0; i < 50; ++i) {
            if (softnda_cq_poll(&cq, &c, 1) != 0) {
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return true;
    }

    static softnda_send_wr wr(uint8_t opcode, uint64_t wr_id, const softnda_sge *sge, uint32_t nsge,
                              uint8_t flags = SOFTNDA_WQE_SIGNALED) {
        softnda_send_wr w{};
        w.wr_id = wr_id;
        w.opcode = opcode;
        w.flags = flags;
        w.sg_list = sge;
        w.num_sge = nsge;
        return w;
    }

    static softnda_sge sge(const void *addr, uint32_t len, const ibv_mr *mr) {
        return softnda_sge{reinterpret_cast<uintptr_t>(addr), len, mr->lkey};
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

    static int postOne(QpH &q, const softnda_send_wr &w) {
        int rc = softnda_sq_post(&q.sq, &w);
        if (rc == 0) {
            softnda_sq_doorbell(&q.sq);
        }
        return rc;
    }

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

}  // namespace softnda_test
