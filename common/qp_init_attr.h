// The ibv_qp_init_attr_extend that tests, tools and the demo build again and again (a PD, one or
// two CQs, an RC QP, a few WRs and SGEs, a queue-memory mode and an ops table), from one set of
// named fields: callers spell only what differs, with designated initializers:
//
//     ibv_qp_init_attr_extend a = ibvx::qpInitAttr({.pd = pd, .send_cq = cq->cq, .ops = &ops});
//
// Header-only and C++ only; the C example (tools/examples) spells the fill out on purpose, since
// it teaches the reference API.
#pragma once

#include <ibv_extend.h>

#include <cstdint>

namespace ibvx {

struct QpInit {
    ibv_pd *pd = nullptr;
    ibv_cq *send_cq = nullptr;
    ibv_cq *recv_cq = nullptr;  // nullptr: the send CQ, as most callers share one
    ibv_srq *srq = nullptr;
    ibv_qp_type qp_type = IBV_QPT_RC;
    uint32_t send_wr = 16;
    uint32_t recv_wr = 16;
    uint32_t send_sge = 1;
    uint32_t recv_sge = 1;
    uint32_t inline_data = 0;
    int sq_sig_all = 0;
    uint32_t qp_cap_flag = 0;  // enum ibv_qp_init_cap bits
    queue_buf_dma_mode type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_extend_ops *ops = nullptr;  // the driver keeps it for the QP's lifetime
};

inline ibv_qp_init_attr_extend qpInitAttr(const QpInit &q) {
    ibv_qp_init_attr_extend a{};
    a.pd = q.pd;
    a.attr.send_cq = q.send_cq;
    a.attr.recv_cq = q.recv_cq != nullptr ? q.recv_cq : q.send_cq;
    a.attr.srq = q.srq;
    a.attr.qp_type = q.qp_type;
    a.attr.sq_sig_all = q.sq_sig_all;
    a.attr.cap.max_send_wr = q.send_wr;
    a.attr.cap.max_recv_wr = q.recv_wr;
    a.attr.cap.max_send_sge = q.send_sge;
    a.attr.cap.max_recv_sge = q.recv_sge;
    a.attr.cap.max_inline_data = q.inline_data;
    a.qp_cap_flag = q.qp_cap_flag;
    a.type = q.type;
    a.ops = q.ops;
    return a;
}

}  // namespace ibvx
