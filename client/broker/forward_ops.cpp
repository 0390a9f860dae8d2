// The forwarding pseudo-driver: an ibv_context_extend_ops table whose entries turn each
// ibv_extend.h call into one broker RPC and fill the caller's structs from the reply. The public
// functions in client/north.cpp already checked NULL arguments and the ops version, exactly as
// for an in-process driver.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "client/broker/convert.h"
#include "client/broker/forward_ops.h"
#include "client/broker/held_init.h"
#include "client/broker/shadow_calls.h"
#include "common/c_abi.h"
#include "common/driver_ops.h"

namespace ibvx::client::broker {
namespace {

int fillQueue(Session *s, const pb::QueueInfo &q, queue_info *out) {
    *out = queue_info{};
    void *base = nullptr;
    int rc = s->resolve(q.base(), q.has_base(), &base);
    if (rc == 0) {
        rc = s->resolve(q.dbr_pi(), q.has_dbr_pi(), &out->dbr_pi_va.iov_base);
    }
    if (rc == 0) {
        rc = s->resolve(q.dbr_ci(), q.has_dbr_ci(), &out->dbr_ci_va.iov_base);
    }
    if (rc == 0) {
        rc = s->resolve(q.db_hw(), q.has_db_hw(), &out->db_hw_va.iov_base);
    }
    if (rc != 0) {
        return rc;
    }
    out->qbuf.base = reinterpret_cast<uintptr_t>(base);
    out->qbuf.entry_cnt = q.entry_cnt();
    out->qbuf.entry_size = q.entry_size();
    copyBytes(q.qbuf_resv(), out->qbuf.resv, sizeof(out->qbuf.resv));
    out->dbr_pi_va.iov_len = q.dbr_pi().length();
    out->dbr_ci_va.iov_len = q.dbr_ci().length();
    out->db_hw_va.iov_len = q.db_hw().length();
    copyBytes(q.info_resv(), out->resv, sizeof(out->resv));
    return 0;
}

// A queue's destroy at the broker, by its shadow.
int destroyShadow(ShadowCq *s) {
    return destroyTracked(s, "DestroyCq", &pb::Broker::Stub::DestroyCq, &pb::DestroyCqRequest::set_cq);
}
int destroyShadow(ShadowSrq *s) {
    return destroyTracked(s, "DestroySrq", &pb::Broker::Stub::DestroySrq, &pb::DestroySrqRequest::set_srq);
}
int destroyShadow(ShadowQp *s) {
    return destroyTracked(s, "DestroyQp", &pb::Broker::Stub::DestroyQp, &pb::DestroyQpRequest::set_qp);
}

// The last step of a queue's create: its shadow is tracked and its extend struct handed out, or,
// when its memory could not be mapped (rc, a negative errno), the broker's queue is destroyed
// again and the create fails.
template <typename Shadow>
decltype(Shadow::ext) *handOut(Shadow *s, int rc) {
    track(s, s->owner);
    if (rc != 0) {
        destroyShadow(s);
        return failNull<decltype(Shadow::ext)>(-rc);
    }
    return &s->ext;
}

// ---- V1 ------------------------------------------------------------------------------------

ibv_cq_extend *createCq(ibv_context *context, ibv_cq_init_attr_extend *a) {
    ShadowContext *c = contextOf(context);
    if (c == nullptr) {
        return failNull<ibv_cq_extend>(EINVAL);
    }
    return createCqWithEvents(c, a, -1);
}

}  // namespace

ibv_cq_extend *createCqWithEvents(ShadowContext *c, ibv_cq_init_attr_extend *a, int event_fd) {
    pb::CreateCqRequest req;
    req.set_context(c->handle);
    req.set_cqe(a->attr.cqe);
    req.set_comp_vector(a->attr.comp_vector);
    req.set_wc_flags(a->attr.wc_flags);
    req.set_cq_cap_flag(a->cq_cap_flag);
    req.set_dma_mode(toProtoDmaMode(a->type));
    pb::CreateCqResponse resp;
    int rc = event_fd < 0 ? c->session->call("CreateCq", &pb::Broker::Stub::CreateCq, req, &resp)
                          : c->session->callWithFd(
                                "CreateCq", &pb::Broker::Stub::CreateCq, event_fd, req,
                                [](pb::CreateCqRequest *r, uint64_t x) { r->set_event_xfer_id(x); }, &resp);
    if (rc != 0) {
        return failNull<ibv_cq_extend>(-rc);
    }
    auto *s = new ShadowCq{};
    s->owner = c;
    s->handle = resp.cq();
    s->cq.context = &c->ctx;
    s->cq.cq_context = a->attr.cq_context;
    s->cq.cqe = static_cast<int>(resp.cqe());
    s->ext.cq = &s->cq;
    copyBytes(resp.resv(), s->ext.resv, sizeof(s->ext.resv));
    rc = fillQueue(c->session, resp.cq_info(), &s->ext.cq_info);
    if (rc == 0) {
        rc = mapDoorbell(a->ops, &s->ext.cq_info, &s->db);
    }
    return handOut(s, rc);
}

int resizeCq(ShadowCq *s, uint32_t cqe) {
    ShadowContext *c = s->owner;
    pb::ResizeCqRequest req;
    req.set_cq(s->handle);
    req.set_cqe(cqe);
    pb::ResizeCqResponse resp;
    int rc = c->session->call("ResizeCq", &pb::Broker::Stub::ResizeCq, req, &resp);
    if (rc != 0) {
        return rc;
    }
    queue_info info;
    rc = fillQueue(c->session, resp.cq_info(), &info);
    if (rc != 0) {
        return rc;  // the broker resized, but the new memory is not reachable here
    }
    info.db_hw_va = s->ext.cq_info.db_hw_va;  // the register stays, as mapped at create
    s->ext.cq_info = info;
    s->cq.cqe = static_cast<int>(resp.cqe());
    c->session->releaseRegions(resp.released_regions());
    return 0;
}

namespace {

int destroyCq(ibv_cq_extend *e) {
    return destroyShadow(IBVX_SHADOW_OF(ShadowCq, ext, e));
}

ibv_srq_extend *createSrq(ibv_context *context, ibv_srq_init_attr_extend *a) {
    ShadowContext *c = contextOf(context);
    if (c == nullptr) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    return createSrqIn(c, a, nullptr, nullptr);
}

int destroySrq(ibv_srq_extend *e) {
    return destroyShadow(IBVX_SHADOW_OF(ShadowSrq, ext, e));
}

ibv_qp_extend *createQp(ibv_context *context, ibv_qp_init_attr_extend *a) {
    ShadowContext *c = contextOf(context);
    if (c == nullptr) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    return createQpIn(c, a, nullptr);
}

int destroyQp(ibv_qp_extend *e) {
    return destroyShadow(IBVX_SHADOW_OF(ShadowQp, ext, e));
}

}  // namespace

ibv_srq_extend *createSrqIn(ShadowContext *c, ibv_srq_init_attr_extend *a, ShadowXrcd *xrcd, ShadowCq *cq) {
    auto *pd = livePd(a->pd, c);
    if (pd == nullptr) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    pb::CreateSrqRequest req;
    req.set_context(c->handle);
    req.set_pd(pd->handle);
    req.set_max_wr(a->attr.attr.max_wr);
    req.set_max_sge(a->attr.attr.max_sge);
    req.set_srq_limit(a->attr.attr.srq_limit);
    req.set_srq_cap_flag(a->srq_cap_flag);
    req.set_dma_mode(toProtoDmaMode(a->type));
    req.set_xrcd(xrcd != nullptr ? xrcd->handle : 0);
    req.set_cq(cq != nullptr ? cq->handle : 0);
    pb::CreateSrqResponse resp;
    int rc = c->session->call("CreateSrq", &pb::Broker::Stub::CreateSrq, req, &resp);
    if (rc != 0) {
        return failNull<ibv_srq_extend>(-rc);
    }
    a->attr.attr.max_wr = resp.max_wr();
    a->attr.attr.max_sge = resp.max_sge();
    auto *s = new ShadowSrq{};
    s->owner = c;
    s->handle = resp.srq();
    s->srq_num = resp.srq_num();
    s->srq.context = &c->ctx;
    s->srq.srq_context = a->attr.srq_context;
    s->srq.pd = &pd->pd;
    s->ext.srq = &s->srq;
    copyBytes(resp.resv(), s->ext.resv, sizeof(s->ext.resv));
    rc = fillQueue(c->session, resp.srq_info(), &s->ext.srq_info);
    if (rc == 0) {
        rc = mapDoorbell(a->ops, &s->ext.srq_info, &s->db);
    }
    return handOut(s, rc);
}

namespace {

// The shadow of a QP the broker made (CreateQp) or gave a handle on (OpenQp, no queue memory).
ibv_qp_extend *shadowQpOf(ShadowContext *c, const pb::CreateQpResponse &resp, ibv_qp_init_attr_extend *a,
                          ShadowPd *pd, ShadowCq *scq, ShadowCq *rcq, ShadowSrq *srq) {
    const ibv_qp_type type = a->attr.qp_type;
    auto *s = new ShadowQp{};
    s->owner = c;
    s->handle = resp.qp();
    fromProto(resp.cap(), &s->cap);
    a->attr.cap = s->cap;  // like ibv_create_qp(): the caller learns what it got
    s->sq_sig_all = a->attr.sq_sig_all;
    ibv_qp &qp = s->qp;
    qp.context = &c->ctx;
    qp.qp_context = a->attr.qp_context;
    qp.pd = pd != nullptr ? &pd->pd : nullptr;
    qp.send_cq = scq != nullptr ? &scq->cq : nullptr;
    qp.recv_cq = rcq != nullptr ? &rcq->cq : nullptr;
    qp.srq = srq != nullptr ? &srq->srq : nullptr;
    qp.handle = resp.qp_num();
    qp.qp_num = resp.qp_num();
    qp.state = fromProtoState(resp.state());
    qp.qp_type = type;
    s->ext.qp = &s->qp;
    copyBytes(resp.resv(), s->ext.resv, sizeof(s->ext.resv));
    s->ext.vendor_priv_info.value = resp.vendor_priv_info();
    int rc = fillQueue(c->session, resp.sq_info(), &s->ext.sq_info);
    if (rc == 0) {
        rc = fillQueue(c->session, resp.rq_info(), &s->ext.rq_info);
    }
    if (rc == 0) {
        rc = mapDoorbell(a->ops, &s->ext.sq_info, &s->sq_db);
    }
    if (rc == 0) {
        rc = mapDoorbell(a->ops, &s->ext.rq_info, &s->rq_db);
    }
    return handOut(s, rc);
}

}  // namespace

ibv_qp_extend *createQpIn(ShadowContext *c, ibv_qp_init_attr_extend *a, ShadowXrcd *xrcd) {
    const ibv_qp_type type = a->attr.qp_type;
    // An XRC target has its domain only; an initiator a PD and a send CQ (SPEC.md §14).
    const bool target = type == IBV_QPT_XRC_RECV, initiator = type == IBV_QPT_XRC_SEND;
    auto *pd = target ? nullptr : livePd(a->pd, c);
    auto *scq = target ? nullptr : liveCq(a->attr.send_cq, c);
    auto *rcq = target || initiator ? nullptr : liveCq(a->attr.recv_cq, c);
    auto *srq = target || initiator ? nullptr : liveSrq(a->attr.srq, c);
    if (target ? xrcd == nullptr
               : pd == nullptr || scq == nullptr || (rcq == nullptr && !initiator) ||
                     (a->attr.srq != nullptr && srq == nullptr && !initiator)) {
        warn(target ? "create_qp: an XRC target QP needs an XRC domain of this broker context"
                    : "create_qp: the PD, CQs and SRQ must come from this broker context");
        return failNull<ibv_qp_extend>(EINVAL);
    }
    if (toProtoQpType(type) == pb::QP_TYPE_UNSPECIFIED) {
        // No broker driver can be asked for a type the wire does not carry.
        warn("create_qp: QP type %d cannot be created through the broker (RC, UC, UD, XRC only)", type);
        return failNull<ibv_qp_extend>(EOPNOTSUPP);
    }
    pb::CreateQpRequest req;
    req.set_context(c->handle);
    req.set_pd(pd != nullptr ? pd->handle : 0);
    req.set_send_cq(scq != nullptr ? scq->handle : 0);
    req.set_recv_cq(rcq != nullptr ? rcq->handle : 0);
    req.set_srq(srq != nullptr ? srq->handle : 0);
    req.set_xrcd(target ? xrcd->handle : 0);
    req.set_qp_type(toProtoQpType(type));
    toProto(a->attr.cap, req.mutable_cap());
    req.set_sq_sig_all(a->attr.sq_sig_all != 0);
    req.set_qp_cap_flag(a->qp_cap_flag);
    req.set_dma_mode(toProtoDmaMode(a->type));
    pb::CreateQpResponse resp;
    int rc = c->session->call("CreateQp", &pb::Broker::Stub::CreateQp, req, &resp);
    if (rc != 0) {
        return failNull<ibv_qp_extend>(-rc);
    }
    return shadowQpOf(c, resp, a, pd, scq, rcq, srq);
}

ibv_qp_extend *openQpIn(ShadowContext *c, ShadowXrcd *xrcd, uint32_t qp_num, ibv_qp_type type,
                        void *qp_context) {
    pb::OpenQpRequest req;
    req.set_context(c->handle);
    req.set_xrcd(xrcd->handle);
    req.set_qp_num(qp_num);
    req.set_qp_type(toProtoQpType(type));  // the broker refuses any but an XRC target (EINVAL)
    pb::CreateQpResponse resp;
    int rc = c->session->call("OpenQp", &pb::Broker::Stub::OpenQp, req, &resp);
    if (rc != 0) {
        return failNull<ibv_qp_extend>(-rc);
    }
    ibv_qp_init_attr_extend a{};
    a.attr.qp_type = type;
    a.attr.qp_context = qp_context;
    return shadowQpOf(c, resp, &a, nullptr, nullptr, nullptr, nullptr);  // no queue memory
}

ShadowXrcd *openXrcd(ShadowContext *c, int fd, int oflags) {
    pb::OpenXrcdRequest req;
    req.set_context(c->handle);
    req.set_oflags(static_cast<uint32_t>(oflags));
    pb::OpenXrcdResponse resp;
    // The file travels as RegMr's memory does: the broker keys the shared domain by its inode.
    int rc = fd < 0 ? c->session->call("OpenXrcd", &pb::Broker::Stub::OpenXrcd, req, &resp)
                    : c->session->callWithFd(
                          "OpenXrcd", &pb::Broker::Stub::OpenXrcd, fd, req,
                          [](pb::OpenXrcdRequest *r, uint64_t x) { r->set_file_xfer_id(x); }, &resp);
    if (rc != 0) {
        return failNull<ShadowXrcd>(-rc);
    }
    auto *x = new ShadowXrcd{};
    x->owner = c;
    x->handle = resp.xrcd();
    x->xrcd.context = &c->ctx;
    track(x, c);
    return x;
}

int mcast(ShadowQp *s, const ibv_gid &gid, uint16_t lid, bool attach) {
    pb::McastRequest req;
    req.set_qp(s->handle);
    req.set_gid(gid.raw, sizeof(gid.raw));
    req.set_lid(lid);
    pb::McastResponse resp;
    Session *session = s->owner->session;
    return attach ? session->call("AttachMcast", &pb::Broker::Stub::AttachMcast, req, &resp)
                  : session->call("DetachMcast", &pb::Broker::Stub::DetachMcast, req, &resp);
}

ShadowMw *allocMw(ShadowPd *p, ibv_mw_type type) {
    pb::AllocMwRequest req;
    req.set_pd(p->handle);
    req.set_type(static_cast<uint32_t>(type));
    pb::AllocMwResponse resp;
    ShadowContext *c = p->owner;
    if (int rc = c->session->call("AllocMw", &pb::Broker::Stub::AllocMw, req, &resp); rc != 0) {
        return failNull<ShadowMw>(-rc);
    }
    auto *m = new ShadowMw{};
    m->owner = c;
    m->handle = resp.mw();
    m->mw.context = &c->ctx;
    m->mw.pd = &p->pd;
    m->mw.rkey = resp.rkey();
    m->mw.type = type;
    track(m, c);
    return m;
}

int deallocMw(ShadowMw *m) {
    return destroyTracked(m, "DeallocMw", &pb::Broker::Stub::DeallocMw, &pb::DeallocMwRequest::set_mw);
}

int closeXrcd(ShadowXrcd *x) {
    return destroyTracked(x, "CloseXrcd", &pb::Broker::Stub::CloseXrcd, &pb::CloseXrcdRequest::set_xrcd);
}

namespace {

int queryDevice(ibv_context *context, ibv_device_attr_extend *attr) {
    ShadowContext *c = contextOf(context);
    if (c == nullptr) {
        return -EINVAL;
    }
    pb::QueryDeviceRequest req;
    req.set_context(c->handle);
    pb::QueryDeviceResponse resp;
    int rc = c->session->call("QueryDevice", &pb::Broker::Stub::QueryDevice, req, &resp);
    if (rc != 0) {
        return rc;
    }
    attr->ext_cap = resp.ext_cap();
    copyBytes(resp.resv(), attr->resv, sizeof(attr->resv));
    return 0;
}

// ---- V2 / V3 -------------------------------------------------------------------------------

// The QP an extended call names, checked against the context it came with.
ShadowQp *qpOf(ibv_context *context, ibv_qp *qp, ShadowContext **c) {
    *c = contextOf(context);
    if (*c == nullptr) {
        return nullptr;
    }
    return liveQp(qp, *c);
}

int modifyQpExtend(ibv_context *context, ibv_qp_attr_extend *attr, int attr_mask) {
    ShadowContext *c;
    ShadowQp *s = qpOf(context, attr->qp, &c);
    if (s == nullptr) {
        return -EINVAL;
    }
    if (int rc = flushHeldInit(s); rc != 0) {
        return rc;  // the extension attributes may depend on the QP's state: INIT goes first
    }
    pb::ModifyQpExtendRequest req;
    req.set_qp(s->handle);
    toProto(*attr, req.mutable_attr());
    req.set_attr_mask(static_cast<uint32_t>(attr_mask));
    pb::ModifyQpExtendResponse resp;
    int rc = c->session->call("ModifyQpExtend", &pb::Broker::Stub::ModifyQpExtend, req, &resp);
    if (rc == 0) {
        s->ext.vendor_priv_info.value = resp.vendor_priv_info();
    }
    return rc;
}

int queryQpExtend(ibv_context *context, ibv_qp_attr_extend *attr, int attr_mask) {
    ShadowContext *c;
    ShadowQp *s = qpOf(context, attr->qp, &c);
    if (s == nullptr) {
        return -EINVAL;
    }
    if (int rc = flushHeldInit(s); rc != 0) {
        return rc;
    }
    pb::QueryQpExtendRequest req;
    req.set_qp(s->handle);
    req.set_attr_mask(static_cast<uint32_t>(attr_mask));
    pb::QueryQpExtendResponse resp;
    int rc = c->session->call("QueryQpExtend", &pb::Broker::Stub::QueryQpExtend, req, &resp);
    if (rc == 0) {
        fromProto(resp.attr(), attr);
    }
    return rc;
}

int queryHyroce(ibv_context *context, ibv_qp *qp, uint32_t sl, uint32_t tc, ibv_hyroce_feature *feature) {
    ShadowContext *c;
    ShadowQp *s = qpOf(context, qp, &c);
    if (s == nullptr) {
        return -EINVAL;
    }
    pb::QueryQpSupportedHyroceFeatureRequest req;
    req.set_qp(s->handle);
    req.set_sl(sl);
    req.set_tc(tc);
    pb::QueryQpSupportedHyroceFeatureResponse resp;
    int rc = c->session->call("QueryQpSupportedHyroceFeature",
                              &pb::Broker::Stub::QueryQpSupportedHyroceFeature, req, &resp);
    if (rc == 0) {
        fromProto(resp.feature(), feature);
    }
    return rc;
}

int negoHyroce(ibv_context *context, ibv_qp *qp, const ibv_hyroce_feature *input, ibv_hyroce_feature *output,
               uint32_t *need_more_nego) {
    ShadowContext *c;
    ShadowQp *s = qpOf(context, qp, &c);
    if (s == nullptr) {
        return -EINVAL;
    }
    pb::NegoQpHyroceFeatureRequest req;
    req.set_qp(s->handle);
    toProto(*input, req.mutable_input());
    pb::NegoQpHyroceFeatureResponse resp;
    int rc = c->session->call("NegoQpHyroceFeature", &pb::Broker::Stub::NegoQpHyroceFeature, req, &resp);
    if (rc == 0) {
        fromProto(resp.output(), output);
        *need_more_nego = resp.need_more_nego();
    }
    return rc;
}

// A bit the driver lacks (common/driver_ops.h) leaves the entry NULL, so the caller answers
// EOPNOTSUPP without a round trip.
template <typename Fn>
Fn pick(uint32_t present, ibvx::DriverOp op, Fn fn) {
    return ibvx::hasDriverOp(present, op) ? fn : nullptr;
}

}  // namespace

void fillForwardOps(int driver_version, uint32_t present, ibv_context_extend_ops *ops) {
    *ops = ibv_context_extend_ops{};
    ops->version = driver_version;
    ops->create_qp = pick(present, ibvx::DriverOp::kCreateQp, &createQp);
    ops->create_cq = pick(present, ibvx::DriverOp::kCreateCq, &createCq);
    ops->create_srq = pick(present, ibvx::DriverOp::kCreateSrq, &createSrq);
    ops->destroy_qp = pick(present, ibvx::DriverOp::kDestroyQp, &destroyQp);
    ops->destroy_cq = pick(present, ibvx::DriverOp::kDestroyCq, &destroyCq);
    ops->destroy_srq = pick(present, ibvx::DriverOp::kDestroySrq, &destroySrq);
    ops->query_device = pick(present, ibvx::DriverOp::kQueryDevice, &queryDevice);
    if (driver_version >= IBV_EXTEND_DRIVER_VERSION_V2) {
        ops->modify_qp = pick(present, ibvx::DriverOp::kModifyQp, &modifyQpExtend);
        ops->query_qp = pick(present, ibvx::DriverOp::kQueryQp, &queryQpExtend);
    }
    if (driver_version >= IBV_EXTEND_DRIVER_VERSION_V3) {
        ops->query_qp_supported_hyroce_feature =
            pick(present, ibvx::DriverOp::kQueryHyroceFeature, &queryHyroce);
        ops->nego_qp_hyroce_feature = pick(present, ibvx::DriverOp::kNegoHyroceFeature, &negoHyroce);
    }
}

ShadowContext *makeContext(Session *session, const pb::OpenContextResponse &resp) {
    auto *c = new ShadowContext;
    c->session = session;
    c->handle = resp.context();
    fromProto(resp.device(), &c->info);
    // IBV_EXTEND_HOLD_INIT=0 sends every RESET -> INIT at once, as before held_init.h (what the
    // benchmark compares with; a way back should a driver's plain-INIT guarantee be wrong).
    const char *hold = getenv("IBV_EXTEND_HOLD_INIT");
    c->plain_init = resp.device().plain_init() && !(hold != nullptr && strcmp(hold, "0") == 0);
    const std::string &name = resp.device().name();
    snprintf(c->dev.name, sizeof(c->dev.name), "%s", name.c_str());
    snprintf(c->dev.dev_name, sizeof(c->dev.dev_name), "%s", name.c_str());
    c->dev.node_type = IBV_NODE_UNKNOWN;
    c->dev.transport_type = IBV_TRANSPORT_UNKNOWN;
    c->ctx.device = &c->dev;
    c->ctx.cmd_fd = -1;
    c->ctx.async_fd = -1;
    pthread_mutex_init(&c->ctx.mutex, nullptr);
    fillForwardOps(static_cast<int>(resp.driver_version()), resp.driver_ops_present(), &c->ops);
    c->ext.context = &c->ctx;
    c->ext.ops = &c->ops;
    return c;
}

}  // namespace ibvx::client::broker
