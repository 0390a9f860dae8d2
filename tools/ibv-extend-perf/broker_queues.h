// Queues the brokered scenarios make through libibv_extend.so in broker mode: one session's
// device context, PD and CQ; QPs of the direct scenarios' shape (rcQpAttr); the modify sequence
// that connects two of them. Shared by the fast-path, control-path and middleware scenarios.
#pragma once

#include <cstdint>

#include <ibv_extend.h>

namespace ibvx::perf {

// Throws std::runtime_error naming the call and errno.
[[noreturn]] void queueError(const char *what);

struct BrokerBase {
    ibv_context_extend *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq_extend *cq = nullptr;
    BrokerBase();
    ~BrokerBase();
    BrokerBase(const BrokerBase &) = delete;
    BrokerBase &operator=(const BrokerBase &) = delete;
    ibv_cq_extend *createCq(uint32_t cqe);
    // Same attributes as the direct scenarios' QPs.
    ibv_qp_extend *createQp(ibv_cq_extend *on, uint32_t sq_depth);
};

// INIT, RTR towards dest, RTS: the sequence every scenario's RC QP goes through.
void toRts(ibv_qp *qp, uint32_t dest);

}  // namespace ibvx::perf
