#include "tools/ibvx-demo/tenant.h"

#include "common/qp_init_attr.h"

#include <time.h>

#include <cerrno>
#include <cstring>

namespace ibvx::demo {
namespace {

uint64_t nowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

}  // namespace

void fillPattern(uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff);
    }
}

size_t checkPattern(const uint8_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) {
        if (p[i] != static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xff)) {
            return i;
        }
    }
    return n;
}

int Tenant::fail(int rc, const char *step) {
    error_ = std::string(step) + ": " + strerror(rc < 0 ? -rc : rc);
    return rc < 0 ? rc : -rc;
}

int Tenant::setUp(const char *device, size_t buf_size) {
    ctx_ = ibvx_open_device(device);
    if (ctx_ == nullptr) {
        return fail(-errno, "ibvx_open_device");
    }
    pd_ = ibvx_alloc_pd(ctx_);
    if (pd_ == nullptr) {
        return fail(-errno, "ibvx_alloc_pd");
    }
    ibv_cq_init_attr_extend cqa{};
    cqa.attr.cqe = 256;
    cqa.type = QU_BUF_DMA_MODE_DEFAULT;
    cq_ = ibv_create_cq_extend(ctx_, &cqa);
    if (cq_ == nullptr) {
        return fail(-errno, "ibv_create_cq_extend");
    }
    ibv_qp_init_attr_extend qpa = qpInitAttr({.pd = pd_, .send_cq = cq_->cq, .send_wr = 64, .recv_wr = 64});
    qp_ = ibv_create_qp_extend(ctx_, &qpa);
    if (qp_ == nullptr) {
        return fail(-errno, "ibv_create_qp_extend");
    }
    buf_ = static_cast<uint8_t *>(ibvx_alloc_buf(buf_size));
    if (buf_ == nullptr) {
        return fail(-errno, "ibvx_alloc_buf");
    }
    buf_size_ = buf_size;
    mr_ = ibvx_reg_mr(
        pd_, buf_, buf_size,
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    if (mr_ == nullptr) {
        return fail(-errno, "ibvx_reg_mr");
    }
    int rc = softnda_sq_init(&sq_, &qp_->sq_info);
    if (rc == 0) {
        rc = softnda_rq_init(&rq_, &qp_->rq_info);
    }
    if (rc == 0) {
        rc = softnda_cq_init(&cqh_, &cq_->cq_info);
    }
    return rc == 0 ? 0 : fail(rc, "softnda queue init from queue_info");
}

PeerInfo Tenant::local() const {
    return PeerInfo{qp_->qp->qp_num, mr_->rkey, reinterpret_cast<uintptr_t>(buf_), buf_size_};
}

int Tenant::connect(const PeerInfo &peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags =
        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    int rc =
        ibvx_modify_qp(qp_->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) {
        return fail(rc, "modify to INIT");
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer.qp_num;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    rc = ibvx_modify_qp(qp_->qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) {
        return fail(rc, "modify to RTR");
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    rc = ibvx_modify_qp(qp_->qp, &a,
                        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                            IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) {
        return fail(rc, "modify to RTS");
    }
    return qp_->qp->state == IBV_QPS_RTS ? 0 : fail(-EPROTO, "qp->state after RTS");
}

int Tenant::tearDown() {
    int first = 0;
    auto note = [&first](int rc) {
        if (first == 0 && rc != 0) {
            first = rc;
        }
    };
    if (mr_ != nullptr) {
        note(ibvx_dereg_mr(mr_));
        mr_ = nullptr;
    }
    if (buf_ != nullptr) {
        ibvx_free_buf(buf_);
        buf_ = nullptr;
    }
    if (qp_ != nullptr) {
        note(ibv_destroy_qp_extend(ctx_, qp_));
        qp_ = nullptr;
    }
    if (cq_ != nullptr) {
        note(ibv_destroy_cq_extend(ctx_, cq_));
        cq_ = nullptr;
    }
    if (pd_ != nullptr) {
        note(ibvx_dealloc_pd(pd_));
        pd_ = nullptr;
    }
    if (ctx_ != nullptr) {
        note(ibvx_close_device(ctx_));
        ctx_ = nullptr;
    }
    return first;
}

int Tenant::waitCompletion(softnda_cqe *cqe, int timeout_ms) {
    if (!stash_.empty()) {
        *cqe = stash_.front();
        stash_.pop_front();
        return 0;
    }
    return pollOne(cqe, timeout_ms);
}

int Tenant::pollOne(softnda_cqe *cqe, int timeout_ms) {
    uint64_t deadline = nowNs() + static_cast<uint64_t>(timeout_ms) * 1000000ULL;
    for (uint32_t spins = 0;; ++spins) {
        int n = softnda_cq_poll(&cqh_, cqe, 1);
        if (n != 0) {
            return n < 0 ? n : 0;
        }
        if ((spins & 1023) == 0 && nowNs() > deadline) {
            return -ETIMEDOUT;
        }
        cpuRelax();
    }
}

int Tenant::postAndWait(uint8_t opcode, const PeerInfo *peer, size_t local_off, size_t remote_off,
                        uint32_t len, int timeout_ms) {
    softnda_sge sge{reinterpret_cast<uintptr_t>(buf_ + local_off), len, mr_->lkey};
    softnda_send_wr wr{};
    wr.wr_id = next_wr_id_++;
    wr.opcode = opcode;
    wr.flags = SOFTNDA_WQE_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (peer != nullptr) {
        wr.remote_addr = peer->addr + remote_off;
        wr.rkey = peer->rkey;
    }
    int rc = softnda_sq_post(&sq_, &wr);
    if (rc != 0) {
        return rc;
    }
    softnda_sq_doorbell(&sq_);
    for (;;) {
        softnda_cqe cqe{};
        rc = pollOne(&cqe, timeout_ms);
        if (rc != 0) {
            return rc;
        }
        if (cqe.wr_id == wr.wr_id) {
            return cqe.status;
        }
        stash_.push_back(cqe);  // someone else's (a receive): waitCompletion() hands it out
    }
}

int Tenant::write(const PeerInfo &peer, size_t local_off, size_t remote_off, uint32_t len, int timeout_ms) {
    return postAndWait(SOFTNDA_OP_RDMA_WRITE, &peer, local_off, remote_off, len, timeout_ms);
}

int Tenant::read(const PeerInfo &peer, size_t local_off, size_t remote_off, uint32_t len, int timeout_ms) {
    return postAndWait(SOFTNDA_OP_RDMA_READ, &peer, local_off, remote_off, len, timeout_ms);
}

int Tenant::send(size_t local_off, uint32_t len, int timeout_ms) {
    return postAndWait(SOFTNDA_OP_SEND, nullptr, local_off, 0, len, timeout_ms);
}

int Tenant::postRecv(size_t off, uint32_t len, uint64_t wr_id) {
    softnda_sge sge{reinterpret_cast<uintptr_t>(buf_ + off), len, mr_->lkey};
    int rc = softnda_rq_post(&rq_, wr_id, &sge, 1);
    if (rc == 0) {
        softnda_rq_doorbell(&rq_);
    }
    return rc;
}

}  // namespace ibvx::demo
