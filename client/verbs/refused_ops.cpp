// The verbs_context and context-op slots the face does not serve, each set to an answer: the
// libibverbs inline wrappers test a slot for NULL before calling it, but consumers and other
// libraries call through the tables directly (rdma-core fills every slot with a dummy op for the
// same reason), and a NULL slot is then a crash at address 0 in the tenant. Each answer is what
// rdma-core's dummy ops give: EOPNOTSUPP, as the return value or as errno with NULL.
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

template <typename R>
R *refusedNull() {
    errno = EOPNOTSUPP;
    return nullptr;
}

int advise(ibv_pd *, ibv_advise_mr_advice, uint32_t, ibv_sge *, uint32_t) {
    return EOPNOTSUPP;
}
ibv_mr *allocNullMr(ibv_pd *) {
    return refusedNull<ibv_mr>();
}
int readCounters(ibv_counters *, uint64_t *, uint32_t, uint32_t) {
    return EOPNOTSUPP;
}
int attachCounters(ibv_counters *, ibv_counter_attach_attr *, ibv_flow *) {
    return EOPNOTSUPP;
}
ibv_counters *createCounters(ibv_context *, ibv_counters_init_attr *) {
    return refusedNull<ibv_counters>();
}
int destroyCounters(ibv_counters *) {
    return EOPNOTSUPP;
}
int modifyFlowActionEsp(ibv_flow_action *, ibv_flow_action_esp_attr *) {
    return EOPNOTSUPP;
}
int destroyFlowAction(ibv_flow_action *) {
    return EOPNOTSUPP;
}
ibv_flow_action *createFlowActionEsp(ibv_context *, ibv_flow_action_esp_attr *) {
    return refusedNull<ibv_flow_action>();
}
int modifyQpRateLimit(ibv_qp *, ibv_qp_rate_limit_attr *) {
    return EOPNOTSUPP;
}
int modifyCq(ibv_cq *, ibv_modify_cq_attr *) {
    return EOPNOTSUPP;
}
int postSrqOps(ibv_srq *, ibv_ops_wr *op, ibv_ops_wr **bad_op) {
    if (bad_op != nullptr) {
        *bad_op = op;
    }
    return EOPNOTSUPP;
}
int destroyRwqIndTable(ibv_rwq_ind_table *) {
    return EOPNOTSUPP;
}
ibv_rwq_ind_table *createRwqIndTable(ibv_context *, ibv_rwq_ind_table_init_attr *) {
    return refusedNull<ibv_rwq_ind_table>();
}
int destroyWq(ibv_wq *) {
    return EOPNOTSUPP;
}
int modifyWq(ibv_wq *, ibv_wq_attr *) {
    return EOPNOTSUPP;
}
ibv_wq *createWq(ibv_context *, ibv_wq_init_attr *) {
    return refusedNull<ibv_wq>();
}
int destroyFlow(ibv_flow *) {
    return EOPNOTSUPP;
}
ibv_flow *createFlow(ibv_qp *, ibv_flow_attr *) {
    return refusedNull<ibv_flow>();
}
// The context ops libibverbs 1.0 called through (typed void *(*)(void) so that nothing new does).
void *compatRefused() {
    return refusedNull<void>();
}
// The two of them that answer (libibverbs points them at ibv_query_device and ibv_query_port).
// The old port struct (opaque in <infiniband/verbs.h>) is today's up to `flags`: what came after
// (port_cap_flags2, active_speed_ex) is not written, as the caller's struct may end there.
int compatQueryPort(ibv_context *context, uint8_t port_num, _compat_ibv_port_attr *attr) {
    ibv_port_attr full{};
    int rc = ibvx_verbs_query_port(context, port_num, &full);
    if (rc == 0) {
        std::memcpy(attr, &full, offsetof(ibv_port_attr, port_cap_flags2));
    }
    return rc;
}

// Sets *slot to answer when nothing serves it.
template <typename F>
void orRefuse(F *&slot, F *answer) {
    if (slot == nullptr) {
        slot = answer;
    }
}

}  // namespace

void refuseUnserved(ShadowContext *c) {
    verbs_context &v = c->vctx;
    orRefuse(v.advise_mr, advise);
    orRefuse(v.alloc_null_mr, allocNullMr);
    orRefuse(v.read_counters, readCounters);
    orRefuse(v.attach_counters_point_flow, attachCounters);
    orRefuse(v.create_counters, createCounters);
    orRefuse(v.destroy_counters, destroyCounters);
    orRefuse(v.modify_flow_action_esp, modifyFlowActionEsp);
    orRefuse(v.destroy_flow_action, destroyFlowAction);
    orRefuse(v.create_flow_action_esp, createFlowActionEsp);
    orRefuse(v.modify_qp_rate_limit, modifyQpRateLimit);
    orRefuse(v.modify_cq, modifyCq);
    orRefuse(v.post_srq_ops, postSrqOps);
    orRefuse(v.destroy_rwq_ind_table, destroyRwqIndTable);
    orRefuse(v.create_rwq_ind_table, createRwqIndTable);
    orRefuse(v.destroy_wq, destroyWq);
    orRefuse(v.modify_wq, modifyWq);
    orRefuse(v.create_wq, createWq);
    orRefuse(v.ibv_destroy_flow, destroyFlow);
    orRefuse(v.ibv_create_flow, createFlow);
    // Programs built against libibverbs 1.1.8 call flow steering through these, and libibverbs
    // points them at the flow entries.
    v.ABI_placeholder1 = reinterpret_cast<void (*)()>(v.ibv_create_flow);
    v.ABI_placeholder2 = reinterpret_cast<void (*)()>(v.ibv_destroy_flow);

    ibv_context_ops &o = c->ctx.ops;
    orRefuse(o._compat_query_device, ibvx_verbs_query_device);
    orRefuse(o._compat_query_port, compatQueryPort);
    for (void *(**slot)() :
         {&o._compat_alloc_pd,     &o._compat_dealloc_pd, &o._compat_reg_mr,     &o._compat_rereg_mr,
          &o._compat_dereg_mr,     &o._compat_create_cq,  &o._compat_cq_event,   &o._compat_resize_cq,
          &o._compat_destroy_cq,   &o._compat_create_srq, &o._compat_modify_srq, &o._compat_query_srq,
          &o._compat_destroy_srq,  &o._compat_create_qp,  &o._compat_query_qp,   &o._compat_modify_qp,
          &o._compat_destroy_qp,   &o._compat_create_ah,  &o._compat_destroy_ah, &o._compat_attach_mcast,
          &o._compat_detach_mcast, &o._compat_async_event}) {
        orRefuse(*slot, compatRefused);
    }
}

}  // namespace ibvx::client::verbs
