// The extension driver: NDA queue creation through the caller's ibv_extend_ops, the V2
// extended QP attributes and the V3 hyroce feature negotiation.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

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
    r->buf = static_cast<uint8_t *>(mem);
    r->cnt = cnt;
    r->stride = stride;
    r->pi = reinterpret_cast<uint32_t *>(r->buf + ring_bytes);
    r->ci = reinterpret_cast<uint32_t *>(r->buf + ring_bytes + SOFTNDA_DBR_CI_OFFSET);
    r->ci_local = 0;
    return 0;
}

void freeRing(ibv_extend_ops *ops, Ring *r) {
    if (r->buf != nullptr) {
        ops->free(r->buf);
        r->buf = nullptr;
    }
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
    auto *cq = new Cq;
    cq->magic = kMagicCq;
    cq->ctx = ctx;
    cq->ops = a->ops;
    int rc = allocRing(a->ops, pow2Ceil(a->attr.cqe < 2 ? 2 : a->attr.cqe), SOFTNDA_CQE_SIZE, &cq->ring);
    if (rc == 0) {
        cq->state = cq->ring.pi + 1;
        cq->arm = cq->ring.pi + kCqArmWord;
        cq->events = cq->ring.pi + kCqEventsWord;
        rc = allocDbSlot(ctx, a->ops, a->type, SlotKind::Cq, cq, &cq->db);
    }
    if (rc != 0) {
        freeRing(a->ops, &cq->ring);
        delete cq;
        return failNull<ibv_cq_extend>(-rc);
    }
    cq->ib.context = context;
    cq->ib.cq_context = a->attr.cq_context;
    cq->ib.cqe = static_cast<int>(cq->ring.cnt);
    cq->ib.handle = static_cast<uint32_t>(dev->n_cq);
    cq->ext.cq = &cq->ib;
    fillQueueInfo(&cq->ext.cq_info, cq->ring, cq->db);
    dev->n_cq++;
    ctx->objects++;
    return &cq->ext;
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

ibv_srq_extend *createSrq(ibv_context *context, ibv_srq_init_attr_extend *a) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops)) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    Pd *pd = asPd(a->pd);
    const ibv_srq_attr &sa = a->attr.attr;
    if (pd == nullptr || pd->ctx != ctx || sa.max_wr == 0 || sa.max_wr > dev->cfg.max_srq_wr ||
        sa.max_sge == 0 || sa.max_sge > dev->cfg.max_sge || sa.srq_limit > sa.max_wr) {
        return failNull<ibv_srq_extend>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_srq >= dev->cfg.max_srq) {
        return failNull<ibv_srq_extend>(ENOMEM);
    }
    auto *srq = new Srq;
    srq->magic = kMagicSrq;
    srq->ctx = ctx;
    srq->pd = pd;
    srq->ops = a->ops;
    uint32_t stride = pow2Ceil(SOFTNDA_RECV_HEADER_SIZE * (1 + sa.max_sge));
    stride = stride < 32 ? 32 : stride;
    srq->max_sge = (stride - SOFTNDA_RECV_HEADER_SIZE) / SOFTNDA_SGE_SIZE;
    int rc = allocRing(a->ops, pow2Ceil(sa.max_wr), stride, &srq->ring);
    if (rc == 0) {
        srq->limit = srq->ring.pi + 1;
        srq->limit_events = srq->ring.ci + 1;
        uint32_t limit = sa.srq_limit;
        if (limit != 0 && a->ops->memcpy_s(srq->limit, sizeof(uint32_t), &limit, sizeof(limit),
                                           MEMCPY_DIR_HOST_TO_DEVICE) != 0) {
            rc = -EIO;
        }
    }
    if (rc == 0) {
        rc = allocDbSlot(ctx, a->ops, a->type, SlotKind::Srq, srq, &srq->db);
    }
    if (rc != 0) {
        freeRing(a->ops, &srq->ring);
        delete srq;
        return failNull<ibv_srq_extend>(-rc);
    }
    srq->ib.context = context;
    srq->ib.srq_context = a->attr.srq_context;
    srq->ib.pd = a->pd;
    srq->ib.handle = dev->n_srq;
    srq->ext.srq = &srq->ib;
    fillQueueInfo(&srq->ext.srq_info, srq->ring, srq->db);
    a->attr.attr.max_wr = srq->ring.cnt;
    a->attr.attr.max_sge = srq->max_sge;
    pd->refs++;
    dev->n_srq++;
    ctx->objects++;
    return &srq->ext;
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
    freeRing(qp->ops, &qp->rq);
    freeRing(qp->ops, &qp->sq);
}

ibv_qp_extend *createQp(ibv_context *context, ibv_qp_init_attr_extend *a) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || a == nullptr || !opsComplete(a->ops)) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    Device *dev = ctx->dev;
    const Config &cfg = dev->cfg;
    ibv_qp_init_attr &ia = a->attr;
    Pd *pd = asPd(a->pd);
    Cq *scq = asCq(ia.send_cq);
    Cq *rcq = asCq(ia.recv_cq);
    Srq *srq = ia.srq != nullptr ? asSrq(ia.srq) : nullptr;
    if (ia.qp_type != IBV_QPT_RC) {
        return failNull<ibv_qp_extend>(EOPNOTSUPP);
    }
    if (pd == nullptr || pd->ctx != ctx || scq == nullptr || scq->ctx != ctx || rcq == nullptr ||
        rcq->ctx != ctx || (ia.srq != nullptr && (srq == nullptr || srq->ctx != ctx))) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    ibv_qp_cap &cap = ia.cap;
    if (cap.max_send_wr == 0 || cap.max_send_wr > cfg.max_qp_wr || cap.max_send_sge > cfg.max_sge ||
        cap.max_inline_data > cfg.max_inline_data ||
        (srq == nullptr && (cap.max_recv_wr > cfg.max_qp_wr || cap.max_recv_sge > cfg.max_sge))) {
        return failNull<ibv_qp_extend>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_qp >= cfg.max_qp) {
        return failNull<ibv_qp_extend>(ENOMEM);
    }
    auto *qp = new Qp;
    qp->magic = kMagicQp;
    qp->ctx = ctx;
    qp->pd = pd;
    qp->scq = scq;
    qp->rcq = rcq;
    qp->srq = srq;
    qp->ops = a->ops;
    uint32_t sge = cap.max_send_sge < 1 ? 1 : cap.max_send_sge;
    uint32_t need = SOFTNDA_WQE_HEADER_SIZE + std::max(sge * SOFTNDA_SGE_SIZE, cap.max_inline_data);
    uint32_t sq_stride = std::max(pow2Ceil(need), 64u);
    int rc = allocRing(a->ops, pow2Ceil(cap.max_send_wr), sq_stride, &qp->sq);
    if (rc == 0 && srq == nullptr) {
        uint32_t rsge = cap.max_recv_sge < 1 ? 1 : cap.max_recv_sge;
        uint32_t rq_stride = std::max(pow2Ceil(SOFTNDA_RECV_HEADER_SIZE * (1 + rsge)), 32u);
        qp->rq_max_sge = (rq_stride - SOFTNDA_RECV_HEADER_SIZE) / SOFTNDA_SGE_SIZE;
        rc = allocRing(a->ops, pow2Ceil(cap.max_recv_wr < 1 ? 1 : cap.max_recv_wr), rq_stride, &qp->rq);
    }
    if (rc == 0) {
        qp->fatal_events = qp->sq.pi + kSqFatalEventsWord;
        rc = allocDbSlot(ctx, a->ops, a->type, SlotKind::Sq, qp, &qp->sq_db);
    }
    if (rc == 0 && srq == nullptr) {
        rc = allocDbSlot(ctx, a->ops, a->type, SlotKind::Rq, qp, &qp->rq_db);
    }
    if (rc != 0) {
        undoQp(qp);
        delete qp;
        return failNull<ibv_qp_extend>(-rc);
    }
    // What the QP really got, as rdma-core providers report it back.
    cap.max_send_wr = qp->sq.cnt;
    cap.max_send_sge = std::min((sq_stride - SOFTNDA_WQE_HEADER_SIZE) / SOFTNDA_SGE_SIZE, cfg.max_sge);
    cap.max_inline_data = std::min(sq_stride - SOFTNDA_WQE_HEADER_SIZE, cfg.max_inline_data);
    if (srq == nullptr) {
        cap.max_recv_wr = qp->rq.cnt;
        cap.max_recv_sge = std::min(qp->rq_max_sge, cfg.max_sge);
    } else {
        cap.max_recv_wr = 0;
        cap.max_recv_sge = 0;
    }
    qp->init = ia;
    do {
        qp->qpn = dev->next_qpn;
        dev->next_qpn = (dev->next_qpn + 1) & 0xffffff;
        if (dev->next_qpn == 0) {
            dev->next_qpn = 1;
        }
    } while (dev->qps.count(qp->qpn) != 0);
    qp->ib.context = context;
    qp->ib.qp_context = ia.qp_context;
    qp->ib.pd = a->pd;
    qp->ib.send_cq = ia.send_cq;
    qp->ib.recv_cq = ia.recv_cq;
    qp->ib.srq = ia.srq;
    qp->ib.handle = qp->qpn;
    qp->ib.qp_num = qp->qpn;
    qp->ib.state = IBV_QPS_RESET;
    qp->ib.qp_type = IBV_QPT_RC;
    qp->ext.qp = &qp->ib;
    fillQueueInfo(&qp->ext.sq_info, qp->sq, qp->sq_db);
    if (srq == nullptr) {
        fillQueueInfo(&qp->ext.rq_info, qp->rq, qp->rq_db);
    }
    linkQp(qp, /*new_epoch=*/false);
    return &qp->ext;
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
    dev->qp_epoch++;
    if (dev->engine) {
        dev->engine->forgetQp(qp);
    }
    dev->gate.unlock();
    undoQp(qp);
    qp->pd->refs--;
    qp->scq->refs--;
    qp->rcq->refs--;
    if (qp->srq != nullptr) {
        qp->srq->refs--;
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

bool opsComplete(const ibv_extend_ops *o) {
    return o != nullptr && o->alloc != nullptr && o->free != nullptr && o->memset_s != nullptr &&
           o->memcpy_s != nullptr && o->db_mmap != nullptr && o->db_unmap != nullptr;
}

void fillQueueInfo(queue_info *qi, const Ring &r, const DbSlot &db) {
    std::memset(qi, 0, sizeof(*qi));
    qi->qbuf.base = reinterpret_cast<uintptr_t>(r.buf);
    qi->qbuf.entry_cnt = r.cnt;
    qi->qbuf.entry_size = r.stride;
    qi->dbr_pi_va = iov_addr_desc{r.pi, 8};
    qi->dbr_ci_va = iov_addr_desc{r.ci, 8};
    qi->db_hw_va = iov_addr_desc{db.mapped, SOFTNDA_DB_REG_STRIDE};
}

void linkQp(Qp *qp, bool new_epoch) {
    Device *dev = qp->ctx->dev;
    dev->gate.lock();
    dev->qps[qp->qpn] = qp;
    if (new_epoch) {
        dev->qp_epoch++;
    }
    dev->gate.unlock();
    qp->pd->refs++;
    qp->scq->refs++;
    qp->rcq->refs++;
    if (qp->srq != nullptr) {
        qp->srq->refs++;
    }
    dev->n_qp++;
    qp->ctx->objects++;
}
}  // namespace softnda

extern "C" const struct verbs_device_extend_ops softnda_driver_ops = {
    SOFTNDA_PROVIDER_NAME,
    softnda::CEntry<softnda::allocContext>::call,
    softnda::CEntry<softnda::freeContext>::call,
};
