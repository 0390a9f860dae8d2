// The face's CQs, QPs and SRQs: broker queues made through the extend API (default DMA mode, no
// caller ops), each attached to its driver's data path (datapath.cpp) so the data verbs work on
// it. A CQ may signal a completion channel (events.cpp).
#include <pthread.h>

#include <cerrno>

#include "client/broker/session_end.h"
#include "client/broker_seam.h"
#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

using namespace ibvx::client;         // NOLINT: the broker seam's functions
using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

namespace ibvx::client::verbs {

ibv_cq *createCq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel, int comp_vector,
                 uint64_t wc_flags) {
    ShadowContext *c = faceContext(context);
    FaceChannel *f = channel != nullptr ? faceChannel(channel) : nullptr;
    if (c == nullptr || cqe <= 0 || comp_vector < 0 || comp_vector >= context->num_comp_vectors ||
        (channel != nullptr && (f == nullptr || channel->context != context))) {
        return failNull<ibv_cq>(EINVAL);
    }
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = static_cast<uint32_t>(cqe);
    a.attr.cq_context = cq_context;
    a.attr.channel = channel;
    a.attr.comp_vector = static_cast<uint32_t>(comp_vector);
    a.attr.wc_flags = wc_flags;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *ext = broker::createCqWithEvents(c, &a, f != nullptr ? channelEventFd(f) : -1);
    if (ext == nullptr) {
        return nullptr;
    }
    ShadowCq *s = IBVX_SHADOW_OF(ShadowCq, ext, ext);
    ibv_cq *cq = ext->cq;
    cq->channel = channel;
    cq->cq_context = cq_context;
    pthread_mutex_init(&cq->mutex, nullptr);
    pthread_cond_init(&cq->cond, nullptr);
    if (int err = attachDatapath(s); err != 0) {
        (void)ibv_destroy_cq_extend(&c->ext, ext);
        return failNull<ibv_cq>(err);
    }
    if (f != nullptr) {
        channelAddCq(f, s);
    }
    return cq;
}

}  // namespace ibvx::client::verbs

extern "C" {

ibv_cq *ibvx_verbs_create_cq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel,
                             int comp_vector) {
    return createCq(context, cqe, cq_context, channel, comp_vector, 0);
}

int ibvx_verbs_destroy_cq(ibv_cq *cq) {
    ShadowCq *s = liveCq(cq);
    if (s == nullptr) {
        return EINVAL;
    }
    FaceChannel *f = cq->channel != nullptr ? faceChannel(cq->channel) : nullptr;
    channelSetAsideCq(f, s);
    bool gone = false;
    int rc = destroyAttached(s, &gone);
    channelSettleCq(f, s, gone);
    return -rc;
}

int ibvx_verbs_resize_cq(ibv_cq *cq, int cqe) {
    ShadowCq *s = liveCq(cq);
    int rc = s == nullptr || cqe <= 0 ? EINVAL : resizeAttached(s, static_cast<uint32_t>(cqe));
    if (rc != 0) {
        errno = rc;
    }
    return rc;
}

}  // extern "C"

namespace ibvx::client::verbs {

ibv_qp *createQp(ShadowContext *c, ibv_pd *pd, ibv_qp_init_attr *attr, ShadowXrcd *xrcd) {
    ibv_qp_init_attr_extend a{};
    a.pd = pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    // XRC QPs go to the broker directly: the extend API has no domain to name.
    const bool xrc = attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV;
    ibv_qp_extend *ext = xrc ? broker::createQpIn(c, &a, xrcd) : ibv_create_qp_extend(&c->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->cap = a.attr.cap;  // what the broker granted, as ibv_create_qp() reports
    if (int err = attachDatapath(IBVX_SHADOW_OF(ShadowQp, ext, ext), *attr); err != 0) {
        (void)ibv_destroy_qp_extend(&c->ext, ext);
        return failNull<ibv_qp>(err);
    }
    return ext->qp;
}

ibv_srq *createSrq(ShadowPd *p, ibv_srq_init_attr *attr, ShadowXrcd *xrcd, ShadowCq *cq) {
    ShadowContext *c = p->owner;
    ibv_srq_init_attr_extend a{};
    a.pd = &p->pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_srq_extend *ext = broker::createSrqIn(c, &a, xrcd, cq);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->attr = a.attr.attr;  // granted max_wr / max_sge
    if (int err = attachDatapath(IBVX_SHADOW_OF(ShadowSrq, ext, ext), &attr->attr); err != 0) {
        (void)ibv_destroy_srq_extend(&c->ext, ext);
        return failNull<ibv_srq>(err);
    }
    return ext->srq;
}

}  // namespace ibvx::client::verbs

extern "C" {

ibv_qp *ibvx_verbs_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr) {
    ibv_pd *base = underlyingPd(pd);
    ShadowPd *p = livePd(base);
    if (p == nullptr || attr == nullptr) {
        return failNull<ibv_qp>(EINVAL);
    }
    return keepPd(createQp(p->owner, base, attr, nullptr), pd);
}

int ibvx_verbs_destroy_qp(ibv_qp *qp) {
    ShadowQp *s = liveQp(qp);
    return s != nullptr ? -destroyAttached(s) : EINVAL;
}

// The broker and its driver check the group (softnda SPEC.md §11.3); a positive errno, as
// libibverbs answers.
int ibvx_verbs_mcast(ibv_qp *qp, const ibv_gid *gid, uint16_t lid, int attach) {
    ShadowQp *s = liveQp(qp);
    int rc = s == nullptr || gid == nullptr ? EINVAL : -broker::mcast(s, *gid, lid, attach != 0);
    if (rc != 0) {
        errno = rc;
    }
    return rc;
}

int ibvx_verbs_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) {
    if (attr == nullptr) {
        return EINVAL;
    }
    int rc = -brokerModifyQp(qp, attr, attr_mask);  // EINVAL for a QP the seam does not know
    if (rc == 0 && (attr_mask & IBV_QP_STATE) != 0 && attr->qp_state == IBV_QPS_RESET) {
        if (ShadowQp *s = liveQp(qp); s != nullptr) {
            resetAttached(s);
        }
    }
    return rc;
}

int ibvx_verbs_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) {
    if (attr == nullptr || init_attr == nullptr) {
        return EINVAL;
    }
    ShadowQp *s = liveQp(qp);
    if (s != nullptr && !broker::sessionAlive(s->owner->session)) {
        // The session ended: the QP is in ERR, as after a device's fatal error, and what else the
        // tenant can still be told is what it was granted.
        *attr = ibv_qp_attr{};
        attr->qp_state = IBV_QPS_ERR;
        attr->cur_qp_state = IBV_QPS_ERR;
        attr->cap = s->cap;
        *init_attr = broker::grantedInitAttr(*s);
        qp->state = IBV_QPS_ERR;
        return 0;
    }
    return -brokerQueryQp(qp, attr, attr_mask, init_attr);
}

ibv_srq *ibvx_verbs_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr) {
    ShadowPd *p = livePd(underlyingPd(pd));
    if (p == nullptr || attr == nullptr) {
        return failNull<ibv_srq>(EINVAL);
    }
    return keepPd(createSrq(p, attr, nullptr, nullptr), pd);
}

int ibvx_verbs_destroy_srq(ibv_srq *srq) {
    ShadowSrq *s = liveSrq(srq);
    return s != nullptr ? -destroyAttached(s) : EINVAL;
}

// Answered by the driver's data path where it can (an SRQ limit is a store to the queue's memory
// on softnda); the broker has no SRQ modify/query call.
int ibvx_verbs_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr || attr == nullptr) {
        return EINVAL;
    }
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (s->dp.state == nullptr || dp->modify_srq == nullptr) {
        return EOPNOTSUPP;
    }
    return dp->modify_srq(s->dp.state, attr, attr_mask);
}

int ibvx_verbs_query_srq(ibv_srq *srq, ibv_srq_attr *attr) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr || attr == nullptr) {
        return EINVAL;
    }
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (s->dp.state == nullptr || dp->query_srq == nullptr) {
        return EOPNOTSUPP;
    }
    return dp->query_srq(s->dp.state, attr);
}

}  // extern "C"
