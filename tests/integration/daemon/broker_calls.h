// The control calls a test makes to set up softnda queues over the raw Broker stub (TestClient):
// a context and PD, a CQ, an RC QP connected to a peer, and the client's view of a queue, as the
// client library makes them. Shared by the integration tests that drive the data path themselves.
#pragma once

#include <gtest/gtest.h>

#include "softnda_device.h"
#include "test_client.h"

namespace ibvx::test {

inline constexpr int kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct Handles {
    uint64_t ctx = 0, pd = 0;
};

inline Handles openDevice(TestClient &c) {
    Handles h;
    pb::OpenContextRequest oreq;
    oreq.set_device_name("softnda0");
    pb::OpenContextResponse oresp;
    EXPECT_TRUE(c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok());
    h.ctx = oresp.context();
    pb::AllocPdRequest preq;
    preq.set_context(h.ctx);
    pb::AllocPdResponse presp;
    EXPECT_TRUE(c.call(&pb::Broker::Stub::AllocPd, preq, &presp).ok());
    h.pd = presp.pd();
    return h;
}

inline grpc::Status createCq(TestClient &c, uint64_t ctx, uint32_t cqe, pb::CreateCqResponse *resp) {
    pb::CreateCqRequest req;
    req.set_context(ctx);
    req.set_cqe(cqe);
    req.set_dma_mode(pb::DMA_MODE_DEFAULT);
    return c.call(&pb::Broker::Stub::CreateCq, req, resp);
}

inline grpc::Status createQp(TestClient &c, const Handles &h, uint64_t cq, uint64_t srq,
                             pb::CreateQpResponse *resp) {
    pb::CreateQpRequest req;
    req.set_context(h.ctx);
    req.set_pd(h.pd);
    req.set_send_cq(cq);
    req.set_recv_cq(cq);
    req.set_srq(srq);
    req.set_qp_type(pb::QP_TYPE_RC);
    req.mutable_cap()->set_max_send_wr(16);
    req.mutable_cap()->set_max_recv_wr(srq != 0 ? 0 : 16);
    req.mutable_cap()->set_max_send_sge(1);
    req.mutable_cap()->set_max_recv_sge(1);
    req.set_dma_mode(pb::DMA_MODE_DEFAULT);
    return c.call(&pb::Broker::Stub::CreateQp, req, resp);
}

// queue_info with the client's own addresses, as the client library fills it.
inline queue_info localQueue(const TestClient &c, const pb::QueueInfo &q) {
    queue_info qi{};
    qi.qbuf.base = reinterpret_cast<uint64_t>(c.address(q.base()));
    qi.qbuf.entry_cnt = q.entry_cnt();
    qi.qbuf.entry_size = q.entry_size();
    qi.dbr_pi_va = {c.address(q.dbr_pi()), q.dbr_pi().length()};
    qi.dbr_ci_va = {c.address(q.dbr_ci()), q.dbr_ci().length()};
    qi.db_hw_va = {c.address(q.db_hw()), q.db_hw().length()};
    return qi;
}

inline grpc::Status modifyQp(TestClient &c, uint64_t qp, const pb::QpAttr &attr, int mask,
                             pb::ModifyQpResponse *resp) {
    pb::ModifyQpRequest req;
    req.set_qp(qp);
    *req.mutable_attr() = attr;
    req.set_attr_mask(static_cast<uint32_t>(mask));
    return c.call(&pb::Broker::Stub::ModifyQp, req, resp);
}

inline void connectQp(TestClient &c, uint64_t qp, uint32_t dest) {
    pb::ModifyQpResponse r;
    pb::QpAttr init;
    init.set_qp_state(pb::QP_STATE_INIT);
    init.set_port_num(1);
    init.set_qp_access_flags(kAllAccess);
    ASSERT_TRUE(
        modifyQp(c, qp, init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &r).ok());
    EXPECT_EQ(r.state(), pb::QP_STATE_INIT);
    pb::QpAttr rtr;
    rtr.set_qp_state(pb::QP_STATE_RTR);
    rtr.set_path_mtu(IBV_MTU_4096);
    rtr.set_dest_qp_num(dest);
    rtr.set_max_dest_rd_atomic(16);
    rtr.set_min_rnr_timer(1);
    rtr.mutable_ah_attr()->set_port_num(1);
    ASSERT_TRUE(modifyQp(c, qp, rtr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
                         &r)
                    .ok());
    pb::QpAttr rts;
    rts.set_qp_state(pb::QP_STATE_RTS);
    rts.set_timeout(14);
    rts.set_retry_cnt(7);
    rts.set_rnr_retry(7);
    rts.set_max_rd_atomic(16);
    ASSERT_TRUE(modifyQp(c, qp, rts,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_MAX_QP_RD_ATOMIC,
                         &r)
                    .ok());
    EXPECT_EQ(r.state(), pb::QP_STATE_RTS);
}

}  // namespace ibvx::test
