// The extension driver: NDA queue creation through the caller's ibv_extend_ops, the V2
// extended QP attributes and the V3 hyroce feature negotiation.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {

uint32_t pow2Ceil(uint32_t v) {
    uint32_t p = 1;
    while (p < v) {
        p <<= 1;
    }
    return p;
}

// One allocation: the ring then its 128 B doorbell record (SPEC.md §1).
int allocRing(ibv_extend_ops *ops, uint32_t cnt, uint32_t stride, Ring *r) {
    size_t ring_bytes = static_cast<size_t>(cnt) * stride;
    size_t size = ring_bytes + kRecordSize;
    void *mem = ops->alloc(size);
    if (mem == nullptr) {
        return -ENOMEM;
    }
    if (reinterpret_cast<uintptr_t>(mem) % 64 != 0) {
        ops->free(mem);  // the record words must not straddle cache lines
        return -EINVAL;
    }
    ops->memset_s(mem, 0, size);
    r->place(static_cast<uint8_t *>(mem), cnt, stride);
    return 0;
}

void freeRing(ibv_extend_ops *ops, Ring *r) {
    if (r->buf != nullptr) {
        ops->free(r->buf);
        r->buf = nullptr;
    }
}

namespace {

// A CQ asked to time its completions carries the times in each entry (SPEC.md §15).
uint32_t cqeSize(uint64_t wc_flags) {
    constexpr uint64_t kTimed =
        IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
    return (wc_flags & kTimed) != 0 ? SOFTNDA_CQE_TS_SIZE : SOFTNDA_CQE_SIZE;
}

ibv_cq_extend *createCq(ibv_context *context, ibv_cq_init_attr_extend *a) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops)) {
        return failNull<ibv_cq_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    if (a->attr.cqe == 0 || a->attr.cqe > dev->cfg.max_cqe) {
        return failNull<ibv_cq_extend>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_cq >= dev->cfg.max_cq) {
        return failNull<ibv_cq_extend>(ENOMEM);
    }
    auto cq = std::make_unique<Cq>();
    int rc =
        allocRing(a->ops, pow2Ceil(a->attr.cqe < 2 ? 2 : a->attr.cqe), cqeSize(a->attr.wc_flags), &cq->ring);
    if (rc == 0) {
        rc = reserveDbSlot(ctx, a->ops, a->type, &cq->db);
    }
    if (rc != 0) {
        freeRing(a->ops, &cq->ring);
        return failNull<ibv_cq_extend>(-rc);
    }
    return buildCq(std::move(cq), ctx, a->ops, a->attr.cq_context, dev->n_cq, Origin::Created);
}

int destroyCq(ibv_cq_extend *ext) {
    Cq *cq = ext != nullptr ? asCq(ext->cq) : nullptr;
    if (cq == nullptr || &cq->ext != ext) {
        return -EINVAL;
    }
    Device *dev = cq->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (cq->refs != 0) {
        return -EBUSY;
    }
    releaseDbSlot(cq->ctx, cq->ops, &cq->db);
    freeRing(cq->ops, &cq->ring);
    if (cq->event_fd >= 0) {
        ::close(cq->event_fd);  // no QP uses the CQ (refs == 0): the engine cannot reach it
    }
    dev->n_cq--;
    cq->ctx->objects--;
    cq->magic = 0;
    delete cq;
    return 0;
}

// Bytes of a receive WQE with room for max_sge SGEs (SPEC.md §2.2).
uint32_t recvStride(uint32_t max_sge) {
    return std::max(pow2Ceil(SOFTNDA_RECV_HEADER_SIZE * (1 + max_sge)), 32u);
}

// The next XRC SRQ number no SRQ of the device has (24 bits, never 0).
uint32_t newSrqn(Device *dev) {
    uint32_t srqn;
    do {
        srqn = dev->next_srqn;
        dev->next_srqn = (dev->next_srqn + 1) & 0xffffff;
        if (dev->next_srqn == 0) {
            dev->next_srqn = 1;
        }
    } while (dev->xrc_srqs.count(srqn) != 0);
    return srqn;
}

// An SRQ, basic or (xrcd set) XRC: the same queue, an XRC one also numbered and completing on
// its own CQ (SPEC.md §14).
ibv_srq_extend *makeSrq(ibv_context *context, ibv_srq_init_attr_extend *a, Xrcd *xrcd, Cq *cq) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops)) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    Pd *pd = asPd(a->pd);
    ibv_srq_attr &sa = a->attr.attr;
    if (pd == nullptr || pd->ctx != ctx || sa.max_wr == 0 || sa.max_wr > dev->cfg.max_srq_wr ||
        sa.max_sge == 0 || sa.max_sge > dev->cfg.max_sge || sa.srq_limit > sa.max_wr) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_srq >= dev->cfg.max_srq) {
        return failNull<ibv_srq_extend>(ENOMEM);
    }
    auto srq = std::make_unique<Srq>();
    if (xrcd != nullptr) {
        srq->xrcd = xrcd;
        srq->cq = cq;
        srq->srqn = newSrqn(dev);
    }
    uint32_t stride = recvStride(sa.max_sge);
    srq->max_sge = recvSgeCap(stride);
    int rc = allocRing(a->ops, pow2Ceil(sa.max_wr), stride, &srq->ring);
    uint32_t limit = sa.srq_limit;
    if (rc == 0 && limit != 0 &&
        a->ops->memcpy_s(srq->ring.pi + kSrqLimitWord, sizeof(uint32_t), &limit, sizeof(limit),
                         MEMCPY_DIR_HOST_TO_DEVICE) != 0) {
        rc = -EIO;
    }
    if (rc == 0) {
        rc = reserveDbSlot(ctx, a->ops, a->type, &srq->db);
    }
    if (rc != 0) {
        freeRing(a->ops, &srq->ring);
        return failNull<ibv_srq_extend>(-rc);
    }
    sa.max_wr = srq->ring.cnt;
    sa.max_sge = srq->max_sge;
    return buildSrq(std::move(srq), ctx, pd, a->ops, a->attr.srq_context, dev->n_srq, Origin::Created);
}

ibv_srq_extend *createSrq(ibv_context *context, ibv_srq_init_attr_extend *a) {
    return makeSrq(context, a, nullptr, nullptr);
}

int destroySrq(ibv_srq_extend *ext) {
    Srq *srq = ext != nullptr ? asSrq(ext->srq) : nullptr;
    if (srq == nullptr || &srq->ext != ext) {
        return -EINVAL;
    }
    Device *dev = srq->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (srq->refs != 0) {
        return -EBUSY;
    }
    if (srq->xrcd != nullptr) {
        dev->gate.lock();
        dev->xrc_srqs.erase(srq->srqn);
        dev->gate.unlock();
        srq->xrcd->refs--;
        srq->cq->refs--;
    }
    releaseDbSlot(srq->ctx, srq->ops, &srq->db);
    freeRing(srq->ops, &srq->ring);
    srq->pd->refs--;
    dev->n_srq--;
    srq->ctx->objects--;
    srq->magic = 0;
    delete srq;
    return 0;
}

void undoQp(Qp *qp) {
    releaseDbSlot(qp->ctx, qp->ops, &qp->rq_db);
    releaseDbSlot(qp->ctx, qp->ops, &qp->sq_db);
    if (Device *dev = qp->ctx->dev; dev->engine) {
        // Until its doorbell slots went an engine pass could still reach a QP being destroyed
        // through them, and one that found its head WQE waiting (RNR, or for its peer) put it
        // back on a waiting list after destroyQp's forget: a later pass then read the freed QP
        // and rings (found by fuzz_softnda_wire). Nothing reaches it now; this forget is the last.
        std::lock_guard<Gate> gate(dev->gate);
        dev->engine->forgetQp(qp);
    }
    freeRing(qp->ops, &qp->rq);
    freeRing(qp->ops, &qp->sq);
}

// Whether a create's capabilities are within the device's (the RQ's only without an SRQ). A depth
// of 0 is a queue the QP never posts to (a receive-only or send-only QP), as IB allows.
bool validQpCaps(const ibv_qp_cap &cap, const Config &cfg, bool has_srq) {
    return cap.max_send_wr <= cfg.max_qp_wr && cap.max_send_sge <= cfg.max_sge &&
           cap.max_inline_data <= cfg.max_inline_data &&
           (has_srq || (cap.max_recv_wr <= cfg.max_qp_wr && cap.max_recv_sge <= cfg.max_sge));
}

// Bytes of a send WQE with room for the requested SGEs or inline data (SPEC.md §2.1).
uint32_t sendStride(const ibv_qp_cap &cap, ibv_qp_type type) {
    uint32_t sge = cap.max_send_sge < 1 ? 1 : cap.max_send_sge;
    uint32_t need = wqeDataOffset(type) + std::max(sge * SOFTNDA_SGE_SIZE, cap.max_inline_data);
    return std::max(pow2Ceil(need), 64u);
}

// A new QP's SQ and, without an SRQ, its RQ: rings for cap, then their doorbell registers
// (caller holds dev->ctl). -errno, leaving nothing. A queue of depth 0 still gets a one-entry ring,
// so the engine and queue_info see the same shape for every QP (SPEC.md §1).
int allocQpQueues(Context *ctx, ibv_extend_ops *ops, int dma_type, const ibv_qp_cap &cap, ibv_qp_type type,
                  Qp *qp) {
    const bool has_rq = qp->srq == nullptr && type != IBV_QPT_XRC_SEND && type != IBV_QPT_XRC_RECV;
    int rc =
        allocRing(ops, pow2Ceil(cap.max_send_wr < 1 ? 1 : cap.max_send_wr), sendStride(cap, type), &qp->sq);
    if (rc == 0 && has_rq) {
        uint32_t rq_stride = recvStride(cap.max_recv_sge < 1 ? 1 : cap.max_recv_sge);
        qp->rq_max_sge = recvSgeCap(rq_stride);
        rc = allocRing(ops, pow2Ceil(cap.max_recv_wr < 1 ? 1 : cap.max_recv_wr), rq_stride, &qp->rq);
    }
    if (rc == 0) {
        rc = reserveDbSlot(ctx, ops, dma_type, &qp->sq_db);
    }
    if (rc == 0 && has_rq) {
        rc = reserveDbSlot(ctx, ops, dma_type, &qp->rq_db);
    }
    if (rc != 0) {
        undoQp(qp);
    }
    return rc;
}

// What a QP's queues really hold, as rdma-core providers report it back; cap holds the request.
// A queue asked with depth 0 is granted depth 0, so every post to it fails (ENOMEM, as a full
// queue) however many ring entries back it.
void grantQpCaps(const Qp &qp, const Config &cfg, ibv_qp_type type, ibv_qp_cap *cap) {
    const uint32_t data = wqeDataOffset(type);
    cap->max_send_wr = cap->max_send_wr == 0 ? 0 : qp.sq.cnt;
    cap->max_send_sge = std::min(sendSgeCap(qp.sq.stride, data), cfg.max_sge);
    cap->max_inline_data = std::min(qp.sq.stride - data, cfg.max_inline_data);
    if (qp.hasRq()) {
        cap->max_recv_wr = cap->max_recv_wr == 0 ? 0 : qp.rq.cnt;
        cap->max_recv_sge = std::min(qp.rq_max_sge, cfg.max_sge);
    } else {
        cap->max_recv_wr = 0;
        cap->max_recv_sge = 0;
    }
}

// The next QPN no QP of the device has (24 bits, never 0).
uint32_t newQpn(Device *dev) {
    uint32_t qpn;
    do {
        qpn = dev->next_qpn;
        dev->next_qpn = (dev->next_qpn + 1) & 0xffffff;
        if (dev->next_qpn == 0) {
            dev->next_qpn = 1;
        }
    } while (dev->qps.count(qpn) != 0);
    return qpn;
}

ibv_qp_extend *createQp(ibv_context *context, ibv_qp_init_attr_extend *a) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops)) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    ibv_qp_init_attr &ia = a->attr;
    QpParents parents;
    // The transports softnda executes (SPEC.md §5, §11, §14); raw packet QPs are not served,
    // and an XRC target is made by create_xrc_tgt_qp (it needs its domain).
    if (ia.qp_type != IBV_QPT_RC && ia.qp_type != IBV_QPT_UC && ia.qp_type != IBV_QPT_UD &&
        ia.qp_type != IBV_QPT_XRC_SEND) {
        return failNull<ibv_qp_extend>(ia.qp_type == IBV_QPT_XRC_RECV ? EINVAL : EOPNOTSUPP);
    }
    bool parents_ok = qpParents(ctx, ia.qp_type, a->pd, ia.send_cq, ia.recv_cq, ia.srq, &parents);
    if (!parents_ok ||
        !validQpCaps(ia.cap, dev->cfg, parents.srq != nullptr || ia.qp_type == IBV_QPT_XRC_SEND)) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_qp >= dev->cfg.max_qp) {
        return failNull<ibv_qp_extend>(ENOMEM);
    }
    auto qp = std::make_unique<Qp>();
    qp->ctx = ctx;
    qp->srq = parents.srq;
    qp->ops = a->ops;
    if (int rc = allocQpQueues(ctx, a->ops, a->type, ia.cap, ia.qp_type, qp.get()); rc != 0) {
        return failNull<ibv_qp_extend>(-rc);
    }
    grantQpCaps(*qp, dev->cfg, ia.qp_type, &ia.cap);
    if (ia.qp_type == IBV_QPT_XRC_SEND) {
        ia.recv_cq = nullptr;
    }
    qp->qpn = newQpn(dev);
    uint32_t handle = qp->qpn;
    return buildQp(std::move(qp), ctx, parents, a->ops, ia, handle, Origin::Created);
}

int destroyQp(ibv_qp_extend *ext) {
    Qp *qp = ext != nullptr ? asQp(ext->qp) : nullptr;
    if (qp == nullptr || &qp->ext != ext) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    dev->gate.lock();
    dev->qps.erase(qp->qpn);
    releaseSrqRecv(qp);  // a receive its SRQ held for a message it was still taking
    leaveAllGroups(qp);  // a destroyed QP leaves its groups, as the kernel detaches them
    invalidateWindowsOf(dev, qp->qpn);
    dev->qp_epoch++;
    if (dev->engine) {
        dev->engine->forgetQp(qp);
    }
    dev->gate.unlock();
    releaseAtomicRecords(qp);
    undoQp(qp);
    for (uint32_t *refs :
         {qp->pd != nullptr ? &qp->pd->refs : nullptr, qp->scq != nullptr ? &qp->scq->refs : nullptr,
          qp->rcq != nullptr ? &qp->rcq->refs : nullptr, qp->srq != nullptr ? &qp->srq->refs : nullptr,
          qp->xrcd != nullptr ? &qp->xrcd->refs : nullptr}) {
        if (refs != nullptr) {
            --*refs;
        }
    }
    dev->n_qp--;
    qp->ctx->objects--;
    qp->magic = 0;
    delete qp;
    return 0;
}

int queryDevice(ibv_context *context, ibv_device_attr_extend *attr) {
    if (asContext(context) == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    attr->ext_cap = IBV_EXTEND_DEV_NDR | IBV_EXTEND_DEV_NDA;
    return 0;
}

constexpr int kExtMaskAll = IBV_QP_ATTR_EXTEND_MAX - 1;
// The attributes a QP keeps in QpAttrs::ext.
constexpr int kExtMaskApart = IBV_QP_ATTR_EXTEND_HYROCE_FEATURE | IBV_QP_ATTR_EXTEND_MPATH_CONFIG |
                              IBV_QP_ATTR_EXTEND_AR_CONFIG | IBV_QP_ATTR_EXTEND_SACK_CONFIG;
const QpExtAttrs kNoExtAttrs{};

int modifyQpExt(ibv_context *context, ibv_qp_attr_extend *attr, int mask) {
    Context *ctx = asContext(context);
    Qp *qp = attr != nullptr ? asQp(attr->qp) : nullptr;
    if (ctx == nullptr || qp == nullptr || qp->ctx != ctx || (mask & ~kExtMaskAll) != 0) {
        return -EINVAL;
    }
    if (((mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) && attr->udp_src_port > 0xffff) ||
        ((mask & IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) &&
         (attr->feature.type > IBV_HYPER_FEAT_HYPER_ROCE || attr->feature.version > IBV_HYPER_FEAT_V3 ||
          attr->feature.sack_enable > 1)) ||
        ((mask & IBV_QP_ATTR_EXTEND_LB_MODE) && attr->lb_mode > IBV_LB_MODE_AR) ||
        ((mask & IBV_QP_ATTR_EXTEND_LAG_PORT) && attr->lag_port > ctx->dev->cfg.phys_port_cnt)) {
        return -EINVAL;
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    QpAttrs &q = qp->attrs;
    if ((mask & kExtMaskApart) != 0 && !q.ext) {
        q.ext = std::make_unique<QpExtAttrs>();  // before any change: all or nothing on ENOMEM
    }
    if (mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) {
        q.udp_src_port = attr->udp_src_port;
    }
    if (mask & IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) {
        q.ext->feature = attr->feature;
        q.ext->feature_set = true;
    }
    if (mask & IBV_QP_ATTR_EXTEND_LB_MODE) {
        q.lb_mode = attr->lb_mode;
    }
    if (mask & IBV_QP_ATTR_EXTEND_MPATH_CONFIG) {
        q.ext->mpath = attr->mpath;
    }
    if (mask & IBV_QP_ATTR_EXTEND_AR_CONFIG) {
        q.ext->ar = attr->ar;
    }
    if (mask & IBV_QP_ATTR_EXTEND_SACK_CONFIG) {
        q.ext->sack = attr->sack;
    }
    if (mask & IBV_QP_ATTR_EXTEND_LAG_PORT) {
        q.lag_port = attr->lag_port;
    }
    // softnda has one doorbell class of service.
    qp->ext.vendor_priv_info.value = 0;
    return 0;
}

int queryQpExt(ibv_context *context, ibv_qp_attr_extend *attr, int mask) {
    Context *ctx = asContext(context);
    Qp *qp = attr != nullptr ? asQp(attr->qp) : nullptr;
    if (ctx == nullptr || qp == nullptr || qp->ctx != ctx || (mask & ~kExtMaskAll) != 0) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    const QpAttrs &q = qp->attrs;
    const QpExtAttrs &x = q.ext ? *q.ext : kNoExtAttrs;
    if (mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) {
        attr->udp_src_port = q.udp_src_port;
    }
    if (mask & IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) {
        attr->feature = x.feature;
    }
    if (mask & IBV_QP_ATTR_EXTEND_LB_MODE) {
        attr->lb_mode = q.lb_mode;
    }
    if (mask & IBV_QP_ATTR_EXTEND_MPATH_CONFIG) {
        attr->mpath = x.mpath;
    }
    if (mask & IBV_QP_ATTR_EXTEND_AR_CONFIG) {
        attr->ar = x.ar;
    }
    if (mask & IBV_QP_ATTR_EXTEND_SACK_CONFIG) {
        attr->sack = x.sack;
    }
    if (mask & IBV_QP_ATTR_EXTEND_LAG_PORT) {
        attr->lag_port = q.lag_port;
    }
    return 0;
}

// What softnda implements: Hyper RoCE V2 with SACK, on every SL and traffic class.
ibv_hyroce_feature supportedFeature() {
    ibv_hyroce_feature f{};
    f.type = IBV_HYPER_FEAT_HYPER_ROCE;
    f.version = IBV_HYPER_FEAT_V2;
    f.sack_enable = 1;
    return f;
}

int querySupportedFeature(ibv_context *context, ibv_qp *ibqp, uint32_t sl, uint32_t tc,
                          ibv_hyroce_feature *out) {
    Context *ctx = asContext(context);
    Qp *qp = asQp(ibqp);
    if (ctx == nullptr || qp == nullptr || qp->ctx != ctx || out == nullptr || sl > 7 || tc > 255) {
        return -EINVAL;
    }
    *out = supportedFeature();
    return 0;
}

// Deterministic negotiation (README): the lower type and version of both sides, SACK only when
// both enable it and the result is above V0, and another round when the versions differed.
int negoFeature(ibv_context *context, ibv_qp *ibqp, const ibv_hyroce_feature *in, ibv_hyroce_feature *out,
                uint32_t *need_more) {
    Context *ctx = asContext(context);
    Qp *qp = asQp(ibqp);
    if (ctx == nullptr || qp == nullptr || qp->ctx != ctx || in == nullptr || out == nullptr ||
        need_more == nullptr) {
        return -EINVAL;
    }
    if (in->type > IBV_HYPER_FEAT_HYPER_ROCE || in->version > IBV_HYPER_FEAT_V3 || in->sack_enable > 1) {
        return -EINVAL;
    }
    ibv_hyroce_feature local;
    {
        std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
        const QpExtAttrs *x = qp->attrs.ext.get();
        local = x != nullptr && x->feature_set ? x->feature : supportedFeature();
    }
    ibv_hyroce_feature r{};
    r.version = std::min(local.version, in->version);
    r.type = r.version == IBV_HYPER_FEAT_V0 ? static_cast<uint8_t>(IBV_HYPER_FEAT_RoCEv2)
                                            : std::min(local.type, in->type);
    r.sack_enable =
        (local.sack_enable != 0 && in->sack_enable != 0 && r.version != IBV_HYPER_FEAT_V0) ? 1 : 0;
    *out = r;
    *need_more = local.version != in->version ? 1 : 0;
    return 0;
}

ibv_context_extend_ops g_ext_ops = {
    IBV_EXTEND_DRIVER_VERSION_V3,
    CEntry<createQp>::call,
    CEntry<createCq>::call,
    CEntry<createSrq>::call,
    CEntry<destroyQp>::call,
    CEntry<destroyCq>::call,
    CEntry<destroySrq>::call,
    CEntry<queryDevice>::call,
    CEntry<modifyQpExt>::call,
    CEntry<queryQpExt>::call,
    CEntry<querySupportedFeature>::call,
    CEntry<negoFeature>::call,
};

ibv_context_extend *allocContext(ibv_context *context) {
    if (asContext(context) == nullptr) {
        return nullptr;  // not one of ours: softnda serves only its own virtual devices
    }
    auto *ext = new ibv_context_extend;
    ext->context = context;
    ext->ops = &g_ext_ops;
    return ext;
}

void freeContext(ibv_context_extend *ext) {
    delete ext;
}

}  // namespace

// ---- XRC (SPEC.md §14; vdev ABI V6) ----------------------------------------------------------

ibv_xrcd *openXrcd(ibv_context *context) {
    Context *ctx = asContext(context);
    if (ctx == nullptr) {
        return failNull<ibv_xrcd>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    return buildXrcd(ctx);
}

int closeXrcd(ibv_xrcd *ib) {
    Xrcd *x = asXrcd(ib);
    if (x == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(x->dev->ctl);
    if (x->refs != 0) {
        return -EBUSY;
    }
    unregisterXrcd(x);
    x->magic = 0;
    delete x;
    return 0;
}

// The domain may be another context's of the same device (that is how processes share one); the
// CQ is the SRQ's own context's.
ibv_srq_extend *createXrcSrq(ibv_context *context, ibv_srq_init_attr_extend *a, ibv_xrcd *xrcd, ibv_cq *cq) {
    Context *ctx = asContext(context);
    Xrcd *x = asXrcd(xrcd);
    Cq *c = asCq(cq);
    if (ctx == nullptr || x == nullptr || x->dev != ctx->dev || c == nullptr || c->ctx != ctx) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    return makeSrq(context, a, x, c);
}

// A target has no send or receive queue of its own: it gets the zero-depth SQ ring every QP has
// (its record keeps the QP's state and PSNs, SPEC.md §10) and nothing else.
ibv_qp_extend *createXrcTgtQp(ibv_context *context, ibv_qp_init_attr_extend *a, ibv_xrcd *xrcd) {
    Context *ctx = asContext(context);
    Xrcd *x = asXrcd(xrcd);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops) || x == nullptr || x->dev != ctx->dev) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    ibv_qp_init_attr &ia = a->attr;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_qp >= dev->cfg.max_qp) {
        return failNull<ibv_qp_extend>(ENOMEM);
    }
    ia.qp_type = IBV_QPT_XRC_RECV;
    ia.send_cq = nullptr;
    ia.recv_cq = nullptr;
    ia.srq = nullptr;
    ia.cap = ibv_qp_cap{};
    ia.sq_sig_all = 0;
    auto qp = std::make_unique<Qp>();
    qp->ctx = ctx;
    qp->ops = a->ops;
    if (int rc = allocQpQueues(ctx, a->ops, a->type, ia.cap, ia.qp_type, qp.get()); rc != 0) {
        return failNull<ibv_qp_extend>(-rc);
    }
    qp->qpn = newQpn(dev);
    QpParents parents;
    parents.xrcd = x;
    uint32_t handle = qp->qpn;
    return buildQp(std::move(qp), ctx, parents, a->ops, ia, handle, Origin::Created);
}

int getSrqNum(ibv_srq *ib, uint32_t *srq_num) {
    Srq *srq = asSrq(ib);
    if (srq == nullptr || srq->xrcd == nullptr || srq_num == nullptr) {
        return -EINVAL;
    }
    *srq_num = srq->srqn;
    return 0;
}

}  // namespace softnda

extern "C" const struct verbs_device_extend_ops softnda_driver_ops = {
    SOFTNDA_PROVIDER_NAME,
    softnda::CEntry<softnda::allocContext>::call,
    softnda::CEntry<softnda::freeContext>::call,
};
