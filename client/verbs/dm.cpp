// Device memory (softnda SPEC.md §17): the verbs_context entries rdma-core 44's inline
// ibv_alloc_dm(), ibv_free_dm() and ibv_reg_dm_mr() reach; ibv_memcpy_to_dm() and
// ibv_memcpy_from_dm() call the ibv_dm's own copy functions (client/broker/dm.cpp), which copy in
// this process with no broker call.
#include "client/verbs/face.h"

namespace ibvx::client::verbs {

ibv_dm *faceAllocDm(ibv_context *context, ibv_alloc_dm_attr *attr) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return failNull<ibv_dm>(EINVAL);
    }
    broker::ShadowDm *d = broker::allocDm(c, *attr);
    return d != nullptr ? &d->dm : nullptr;
}

// rdma-core's providers answer ibv_free_dm with 0 or a positive errno.
int faceFreeDm(ibv_dm *dm) {
    broker::ShadowDm *d = broker::liveDm(dm);
    return d != nullptr ? -broker::freeDm(d) : EINVAL;
}

// rdma-core leaves the checks to the kernel, which refuses a registration without
// IBV_ACCESS_ZERO_BASED (EINVAL); the broker's driver does the same.
ibv_mr *faceRegDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access) {
    ibv_pd *base = underlyingPd(pd);
    ShadowPd *p = livePd(base);
    broker::ShadowDm *d = broker::liveDm(dm);
    if (p == nullptr || d == nullptr || d->owner != p->owner) {
        return failNull<ibv_mr>(EINVAL);
    }
    return keepPd(broker::regDmMr(p, d, offset, length, access), pd);
}

}  // namespace ibvx::client::verbs
