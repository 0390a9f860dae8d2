// XRC through the face (softnda SPEC.md §14): domains, XRC SRQs and their numbers, and the
// attributes of ibv_create_qp_ex() for initiator and target QPs. The broker keeps each as a
// session object (OpenXrcd, CreateSrq with a domain, CreateQp of an XRC type); the data path posts
// to an XRC SRQ as to any SRQ and an initiator's sends carry wr.qp_type.xrc.remote_srqn.
//
// ibv_open_xrcd's file sharing is the broker's: the file goes to it on the fd channel and every
// process opening a domain with the same file gets the same domain (docs/verbs.md). So is
// ibv_open_qp's: the broker finds the target by number in the domain and keeps it until its last
// handle, in any process, goes.
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

#include "client/verbs/face.h"

namespace ibvx::client::verbs {
namespace {

// What ibv_open_xrcd's fd and oflags ask, checked as the kernel does: fd -1 creates a new domain
// and needs O_CREAT; a file must be open; only O_CREAT and O_EXCL are known. 0 or an errno.
int checkXrcdInit(const ibv_xrcd_init_attr &attr) {
    constexpr uint32_t kKnown = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    if ((attr.comp_mask & ~kKnown) != 0 || (attr.comp_mask & kKnown) != kKnown) {
        return EINVAL;
    }
    if ((attr.oflags & ~(O_CREAT | O_EXCL)) != 0) {
        return EINVAL;
    }
    if (attr.fd < 0) {
        return attr.fd == -1 && (attr.oflags & O_CREAT) != 0 ? 0 : EINVAL;
    }
    struct stat st {};
    return ::fstat(attr.fd, &st) == 0 ? 0 : EBADF;
}

}  // namespace

ibv_xrcd *faceOpenXrcd(ibv_context *context, ibv_xrcd_init_attr *attr) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return failNull<ibv_xrcd>(EINVAL);
    }
    if (int err = checkXrcdInit(*attr); err != 0) {
        return failNull<ibv_xrcd>(err);
    }
    ShadowXrcd *x = broker::openXrcd(c, attr->fd, attr->oflags);
    return x != nullptr ? &x->xrcd : nullptr;
}

int faceCloseXrcd(ibv_xrcd *xrcd) {
    ShadowXrcd *x = broker::liveXrcd(xrcd);
    return x != nullptr ? -broker::closeXrcd(x) : EINVAL;
}

ibv_srq *faceCreateSrqEx(ibv_context *context, ibv_srq_init_attr_ex *attr) {
    constexpr uint32_t kServed =
        IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr || (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) == 0) {
        return failNull<ibv_srq>(EINVAL);
    }
    const bool xrc = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) != 0 && attr->srq_type == IBV_SRQT_XRC;
    if ((attr->comp_mask & ~kServed) != 0 ||
        ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) != 0 && attr->srq_type != IBV_SRQT_BASIC && !xrc)) {
        warn("ibv_create_srq_ex: only basic and XRC SRQs are served (comp_mask 0x%x)", attr->comp_mask);
        return failNull<ibv_srq>(EOPNOTSUPP);
    }
    ShadowPd *p = livePd(underlyingPd(attr->pd), c);
    ShadowXrcd *x = nullptr;
    ShadowCq *cq = nullptr;
    if (xrc) {
        // An XRC SRQ needs its domain and the CQ its receives complete on, of this context.
        x = (attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) != 0 ? broker::liveXrcd(attr->xrcd, c) : nullptr;
        cq = (attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) != 0 ? liveCq(attr->cq, c) : nullptr;
        if (x == nullptr || cq == nullptr) {
            return failNull<ibv_srq>(EINVAL);
        }
    }
    if (p == nullptr) {
        return failNull<ibv_srq>(EINVAL);
    }
    ibv_srq_init_attr basic{};
    basic.srq_context = attr->srq_context;
    basic.attr = attr->attr;
    ibv_srq *srq = createSrq(p, &basic, x, cq);
    if (srq != nullptr) {
        attr->attr = basic.attr;
    }
    return keepPd(srq, attr->pd);
}

int faceGetSrqNum(ibv_srq *srq, uint32_t *srq_num) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr || srq_num == nullptr || s->srq_num == 0) {
        return EINVAL;  // not an SRQ of ours, or not an XRC SRQ (as the kernel answers)
    }
    *srq_num = s->srq_num;
    return 0;
}

ibv_qp *createXrcQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr) {
        return failNull<ibv_qp>(EINVAL);
    }
    const bool target = attr->qp_type == IBV_QPT_XRC_RECV;
    constexpr uint32_t kServed = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD |
                                 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                                 IBV_QP_INIT_ATTR_CREATE_FLAGS;  // with no flag set, as for other types
    if ((attr->comp_mask & ~kServed) != 0 ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0 && attr->create_flags != 0)) {
        warn(
            "ibv_create_qp_ex: an XRC QP takes a PD (initiator) or an XRC domain (target) only "
            "(comp_mask 0x%x)",
            attr->comp_mask);
        return failNull<ibv_qp>(EOPNOTSUPP);
    }
    ShadowXrcd *x = nullptr;
    ibv_pd *pd = nullptr;
    if (target) {
        x = (attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) != 0 ? broker::liveXrcd(attr->xrcd, c) : nullptr;
        if (x == nullptr) {
            warn(
                "ibv_create_qp_ex: an XRC target QP needs an XRC domain of its context "
                "(IBV_QP_INIT_ATTR_XRCD)");
            return failNull<ibv_qp>(EINVAL);
        }
    } else {
        pd = (attr->comp_mask & IBV_QP_INIT_ATTR_PD) != 0 ? underlyingPd(attr->pd) : nullptr;
        if (livePd(pd, c) == nullptr) {
            return failNull<ibv_qp>(EINVAL);
        }
    }
    ibv_qp_init_attr a{};
    a.qp_context = attr->qp_context;
    a.send_cq = target ? nullptr : attr->send_cq;
    a.cap = attr->cap;
    a.qp_type = attr->qp_type;
    a.sq_sig_all = attr->sq_sig_all;
    ibv_qp *qp = createQp(c, pd, &a, x);
    if (qp != nullptr) {
        attr->cap = a.cap;
        qp->pd = target ? nullptr : attr->pd;  // a parent domain stays what the QP names
    }
    return qp;
}

// As rdma-core's ibv_cmd_open_qp checks: the number, domain and type are needed; the context is
// optional; nothing else is known. The handle has no queue of its own (posting to a target is
// refused as for the one its creator holds); modify, query and destroy go to the broker.
ibv_qp *faceOpenQp(ibv_context *context, ibv_qp_open_attr *attr) {
    constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    constexpr uint32_t kKnown = kNeeded | IBV_QP_OPEN_ATTR_CONTEXT;
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr || (attr->comp_mask & kNeeded) != kNeeded ||
        (attr->comp_mask & ~kKnown) != 0 || attr->qp_type != IBV_QPT_XRC_RECV) {
        return failNull<ibv_qp>(EINVAL);
    }
    ShadowXrcd *x = broker::liveXrcd(attr->xrcd, c);
    if (x == nullptr) {
        return failNull<ibv_qp>(EINVAL);
    }
    void *qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) != 0 ? attr->qp_context : nullptr;
    ibv_qp_extend *ext = broker::openQpIn(c, x, attr->qp_num, attr->qp_type, qp_context);
    return ext != nullptr ? ext->qp : nullptr;
}

}  // namespace ibvx::client::verbs
