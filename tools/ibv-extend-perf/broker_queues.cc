#include "tools/ibv-extend-perf/broker_queues.h"

#include <cerrno>
#include <stdexcept>
#include <string>

#include <ibv_extend_broker.h>

#include "tools/ibv-extend-perf/scenarios.h"

namespace ibvx::perf {

void queueError(const char *what) {
    throw std::runtime_error(std::string("broker: ") + what + " failed (errno " + std::to_string(errno) +
                             ")");
}

BrokerBase::BrokerBase() {
    ctx = ibvx_open_device("softnda0");
    if (ctx == nullptr) {
        queueError("ibvx_open_device(softnda0)");
    }
    pd = ibvx_alloc_pd(ctx);
    if (pd == nullptr) {
        queueError("ibvx_alloc_pd");
    }
    cq = createCq(512);
}

BrokerBase::~BrokerBase() {
    ibv_destroy_cq_extend(ctx, cq);
    ibvx_dealloc_pd(pd);
    ibvx_close_device(ctx);
}

ibv_cq_extend *BrokerBase::createCq(uint32_t cqe) {
    ibv_cq_init_attr_extend ca{};
    ca.attr.cqe = static_cast<int>(cqe);
    ca.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *c = ibv_create_cq_extend(ctx, &ca);
    if (c == nullptr) {
        queueError("ibv_create_cq_extend");
    }
    return c;
}

ibv_qp_extend *BrokerBase::createQp(ibv_cq_extend *on, uint32_t sq_depth) {
    ibv_qp_init_attr_extend qa = rcQpAttr(pd, on->cq, sq_depth);
    qa.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_qp_extend *q = ibv_create_qp_extend(ctx, &qa);
    if (q == nullptr) {
        queueError("ibv_create_qp_extend");
    }
    return q;
}

void toRts(ibv_qp *qp, uint32_t dest) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (ibvx_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        queueError("modify INIT");
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    a.dest_qp_num = dest;
    a.path_mtu = IBV_MTU_4096;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = 1;
    if (ibvx_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
        queueError("modify RTR");
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibvx_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        queueError("modify RTS");
    }
}

}  // namespace ibvx::perf
