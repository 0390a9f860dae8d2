// Memory windows through the face (softnda SPEC.md §16): ibv_alloc_mw and ibv_dealloc_mw are the
// broker's (AllocMw / DeallocMw: a session object of the PD); binding and invalidation are work
// requests, so they are the data path's alone: ibv_bind_mw (type 1) posts an IBV_WR_BIND_MW on
// the given QP and then gives the window its new rkey, as rdma-core's providers do (rxe_bind_mw),
// and IBV_WR_BIND_MW (type 2), IBV_WR_LOCAL_INV and IBV_WR_SEND_WITH_INV go through
// ibv_post_send and the ibv_wr_* API as any other work request.
#include <cerrno>

#include "client/verbs/face.h"

namespace ibvx::client::verbs {

ibv_mw *faceAllocMw(ibv_pd *pd, ibv_mw_type type) {
    ShadowPd *p = livePd(underlyingPd(pd));
    if (p == nullptr) {
        return failNull<ibv_mw>(EINVAL);
    }
    broker::ShadowMw *m = broker::allocMw(p, type);
    return m != nullptr ? keepPd(&m->mw, pd) : nullptr;
}

int faceDeallocMw(ibv_mw *mw) {
    broker::ShadowMw *m = broker::liveMw(mw);
    return m != nullptr ? -broker::deallocMw(m) : EINVAL;
}

// libibverbs' inline ibv_bind_mw checked the window's type, that an MR comes with a length and
// that it shares the window's PD before it called this.
int faceBindMw(ibv_qp *qp, ibv_mw *mw, ibv_mw_bind *bind) {
    if (broker::liveMw(mw) == nullptr || liveQp(qp) == nullptr || bind == nullptr) {
        return EINVAL;
    }
    ibv_send_wr wr{};
    wr.wr_id = bind->wr_id;
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = bind->send_flags;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
    wr.bind_mw.bind_info = bind->bind_info;
    ibv_send_wr *bad = nullptr;
    int rc = qp->context->ops.post_send(qp, &wr, &bad);
    if (rc == 0) {
        // The next bind names the window by this key; a failed bind completes MW_BIND_ERR and
        // moves the QP to ERR, after which the window is not bound again through it.
        mw->rkey = wr.bind_mw.rkey;
    }
    return rc;
}

void serveMemoryWindows(ShadowContext *c) {
    c->ctx.ops.alloc_mw = faceAllocMw;
    c->ctx.ops.dealloc_mw = faceDeallocMw;
    c->ctx.ops.bind_mw = faceBindMw;
}

}  // namespace ibvx::client::verbs
