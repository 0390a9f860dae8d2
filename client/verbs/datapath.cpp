// The data path belongs to the driver (include/ibv_extend_datapath.h): a queue made through the
// standard verbs is attached to its driver's data path here, once for CQs, QPs and SRQs alike,
// and the data verbs, inline in <infiniband/verbs.h> and reached through the context's ops, go
// to it. So does the fatal flush when the session ends. Queues without a data path state (made
// through the extend API, or on a driver that ships no data path) fail the libibverbs way.
#include <dlfcn.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <set>

#include "client/verbs/face.h"
#include "providers/loader/datapath_loader.h"

namespace ibvx::client::verbs {
namespace {

ShadowQp *qpShadow(ibv_qp *qp) {
    return shadowOf<ShadowQp>(qp, offsetof(ShadowQp, qp));
}
ShadowCq *cqShadow(ibv_cq *cq) {
    return shadowOf<ShadowCq>(cq, offsetof(ShadowCq, cq));
}
ShadowSrq *srqShadow(ibv_srq *srq) {
    return shadowOf<ShadowSrq>(srq, offsetof(ShadowSrq, srq));
}

int postRecv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    ShadowQp *s = qpShadow(qp);
    if (s->dp.state == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    // A QP in RESET takes no receive, as rdma-core's providers answer (qp->state is what the
    // last modify or query said; the device's own moves to ERR only ever go past RTS).
    if (qp->state == IBV_QPS_RESET) {
        *bad_wr = wr;
        return EINVAL;
    }
    return s->owner->datapath->post_recv(s->dp.state, wr, bad_wr);
}
int postSrqRecv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    ShadowSrq *s = srqShadow(srq);
    if (s->dp.state == nullptr || s->owner->datapath->post_srq_recv == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    return s->owner->datapath->post_srq_recv(s->dp.state, wr, bad_wr);
}
int reqNotifyCq(ibv_cq *cq, int solicited_only) {
    ShadowCq *s = cqShadow(cq);
    if (s->dp.state == nullptr || s->owner->datapath->req_notify_cq == nullptr) {
        return EOPNOTSUPP;
    }
    return s->owner->datapath->req_notify_cq(s->dp.state, solicited_only);
}

// The size of the data path's table, from IBV_EXTEND_DATAPATH_SIZE_SYMBOL of the object that
// holds it (the loader keeps that object loaded; RTLD_NOLOAD only takes one more reference, given
// back at once). A library without the symbol has the table up to query_srq.
uint32_t datapathSize(const ibv_extend_datapath_ops *dp) {
    constexpr auto kV1 = static_cast<uint32_t>(offsetof(ibv_extend_datapath_ops, query_srq) + sizeof(void *));
    Dl_info info{};
    if (dladdr(dp, &info) == 0 || info.dli_fname == nullptr) {
        return kV1;
    }
    void *handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) {
        return kV1;
    }
    const auto *size = static_cast<const uint32_t *>(dlsym(handle, IBV_EXTEND_DATAPATH_SIZE_SYMBOL));
    uint32_t n = size != nullptr && *size >= kV1 ? *size : kV1;
    dlclose(handle);
    return n;
}

// Whether the data path's table reaches its fatal entries (include/ibv_extend_datapath.h: the
// size it was built with is exported beside it, by the same object).
bool hasFatalEntries(const ShadowContext *c) {
    constexpr size_t kEnd = offsetof(ibv_extend_datapath_ops, srq_fatal) + sizeof(void *);
    return c->datapath != nullptr && c->datapath_size >= kEnd;
}

// The data path state of a CQ of context c, nullptr unless it is one of c's attached CQs.
void *cqStateLocked(ShadowContext *c, ibv_cq *cq) {
    if (cq == nullptr) {
        return nullptr;
    }
    ShadowCq *s = cqShadow(cq);
    return c->dp_cqs.count(s) != 0 ? s->dp.state : nullptr;
}

// Each attached queue of an ended context, as the device's fatal error leaves it (the broker
// destroyed the queues before it closed the fd channel, so nothing else writes them): outstanding
// work flushed, later posts refused. The caller holds c->mu.
void flushLocked(ShadowContext *c, ShadowQp *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->qp_fatal != nullptr) {
        (void)dp->qp_fatal(q->dp.state, cqStateLocked(c, q->qp.send_cq), cqStateLocked(c, q->qp.recv_cq),
                           kEndedErrno);
    }
}
void flushLocked(ShadowContext *c, ShadowSrq *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->srq_fatal != nullptr) {
        dp->srq_fatal(q->dp.state, kEndedErrno);
    }
}
void flushLocked(ShadowContext *c, ShadowCq *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->cq_fatal != nullptr) {
        (void)dp->cq_fatal(q->dp.state, kEndedErrno);
    }
}

// A context's attached queues of one kind (guarded by the context's mu).
std::set<ShadowCq *> &attachedSet(ShadowContext *c, ShadowCq *) {
    return c->dp_cqs;
}
std::set<ShadowQp *> &attachedSet(ShadowContext *c, ShadowQp *) {
    return c->dp_qps;
}
std::set<ShadowSrq *> &attachedSet(ShadowContext *c, ShadowSrq *) {
    return c->dp_srqs;
}

// A queue's attachment once its data path's open entry answered `state` (nullptr: it refused,
// errno says why): the state is the queue's, freed with it by `close`, and the queue is one the
// session's end flushes (at once, when it ended already).
template <typename Shadow>
int attach(Shadow *s, void *state, void (*close)(void *), const char *verb, const char *what) {
    ShadowContext *c = s->owner;
    if (state == nullptr) {
        int err = errno != 0 ? errno : EINVAL;
        warn("%s: the %s data path refused the %s (%s)", verb, c->info.provider, what, strerror(err));
        return err;
    }
    s->dp.close = close;
    s->dp.state = state;
    std::lock_guard lock(c->mu);
    attachedSet(c, s).insert(s);
    if (endedLocked(c)) {
        flushLocked(c, s);
    }
    return 0;
}

int destroyThroughExtend(ShadowCq *s) {
    return ibv_destroy_cq_extend(&s->owner->ext, &s->ext);
}
int destroyThroughExtend(ShadowQp *s) {
    return ibv_destroy_qp_extend(&s->owner->ext, &s->ext);
}
int destroyThroughExtend(ShadowSrq *s) {
    return ibv_destroy_srq_extend(&s->owner->ext, &s->ext);
}

template <typename Shadow>
int destroyDetached(Shadow *s, bool *gone) {
    ShadowContext *c = s->owner;
    const bool attached = s->dp.state != nullptr;
    {
        std::lock_guard lock(c->mu);
        attachedSet(c, s).erase(s);
    }
    int rc = destroyThroughExtend(s);
    // Gone either way when the broker destroyed it or the session ended (the shadow is freed).
    *gone = rc == 0 || broker::ownerOf(s) == nullptr;
    if (!*gone && attached) {
        std::lock_guard lock(c->mu);
        attachedSet(c, s).insert(s);
    }
    return rc;
}

}  // namespace

void serveDatapath(ShadowContext *c) {
    ibv_context &ctx = c->ctx;
    ctx.ops.post_send = postSend;
    ctx.ops.post_recv = postRecv;
    ctx.ops.post_srq_recv = postSrqRecv;
    ctx.ops.poll_cq = pollCq;
    ctx.ops.req_notify_cq = reqNotifyCq;
    c->datapath = loader::datapathFor(c->info.provider);
    c->datapath_size = c->datapath != nullptr ? datapathSize(c->datapath) : 0;
}

int postSend(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    ShadowQp *s = qpShadow(qp);
    if (s->dp.state == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    // Sends before RTS (RESET, INIT, RTR) are refused, as rdma-core's providers refuse them,
    // instead of waiting in the SQ (one compare of a word of this shadow: no shared memory).
    if (qp->state < IBV_QPS_RTS) {
        *bad_wr = wr;
        return EINVAL;
    }
    return s->owner->datapath->post_send(s->dp.state, wr, bad_wr);
}

int pollCq(ibv_cq *cq, int n, ibv_wc *wc) {
    ShadowCq *s = cqShadow(cq);
    if (s->dp.state == nullptr) {
        return -EOPNOTSUPP;
    }
    return s->owner->datapath->poll_cq(s->dp.state, n, wc);
}

int attachDatapath(ShadowCq *s) {
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (dp == nullptr) {
        return 0;
    }
    return attach(s, dp->cq_open(&s->ext, s->cq.cqe), dp->cq_close, "ibv_create_cq", "CQ");
}

int attachDatapath(ShadowQp *s, const ibv_qp_init_attr &attr) {
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (dp == nullptr) {
        return 0;
    }
    ibv_extend_datapath_qp_attr dattr{};
    dattr.qp = &s->ext;
    dattr.qp_type = attr.qp_type;
    dattr.cap = s->cap;
    dattr.sq_sig_all = attr.sq_sig_all;
    dattr.has_srq = attr.srq != nullptr;
    return attach(s, dp->qp_open(&dattr), dp->qp_close, "ibv_create_qp", "QP");
}

int attachDatapath(ShadowSrq *s, ibv_srq_attr *attr) {
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (dp == nullptr || dp->srq_open == nullptr) {
        return 0;
    }
    return attach(s, dp->srq_open(&s->ext, attr), dp->srq_close, "ibv_create_srq", "SRQ");
}

int destroyAttached(ShadowCq *s, bool *gone) {
    return destroyDetached(s, gone);
}
int destroyAttached(ShadowQp *s) {
    bool gone = false;
    return destroyDetached(s, &gone);
}
int destroyAttached(ShadowSrq *s) {
    bool gone = false;
    return destroyDetached(s, &gone);
}

int resizeAttached(ShadowCq *s, uint32_t cqe) {
    const ShadowContext *c = s->owner;
    auto cq_resize = IBVX_DATAPATH_ENTRY(c, cq_resize);
    if (s->dp.state == nullptr || cq_resize == nullptr) {
        return EOPNOTSUPP;
    }
    struct Call {
        ShadowCq *s;
        uint32_t cqe;
    } call{s, cqe};
    // The broker moves the CQ while the data path holds its lock: no poll reads the old memory.
    return cq_resize(
        s->dp.state, &s->ext,
        [](void *arg) {
            auto *k = static_cast<Call *>(arg);
            return -broker::resizeCq(k->s, k->cqe);
        },
        &call);
}

void resetAttached(ShadowQp *s) {
    ShadowContext *c = s->owner;
    auto qp_reset = IBVX_DATAPATH_ENTRY(c, qp_reset);
    if (s->dp.state == nullptr || qp_reset == nullptr) {
        return;
    }
    std::lock_guard lock(c->mu);
    qp_reset(s->dp.state, cqStateLocked(c, s->qp.send_cq), cqStateLocked(c, s->qp.recv_cq));
}

void flushAttachedLocked(ShadowContext *c) {
    for (ShadowQp *q : c->dp_qps) {
        flushLocked(c, q);
    }
    for (ShadowSrq *q : c->dp_srqs) {
        flushLocked(c, q);
    }
    for (ShadowCq *q : c->dp_cqs) {
        flushLocked(c, q);
    }
}

}  // namespace ibvx::client::verbs
