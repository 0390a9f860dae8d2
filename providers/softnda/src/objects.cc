// The construction of softnda's objects: one function per kind, which create (driver.cc, vdev.cc)
// and import (restart.cc) both call, so that an imported object is made exactly as a created one.
// They differ only in where the object's state comes from (softnda_internal.h, "construction").
#include <algorithm>
#include <cstring>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {

void fillQueueInfo(queue_info *qi, const Ring &r, const DbSlot &db) {
    std::memset(qi, 0, sizeof(*qi));
    qi->qbuf.base = reinterpret_cast<uintptr_t>(r.buf);
    qi->qbuf.entry_cnt = r.cnt;
    qi->qbuf.entry_size = r.stride;
    qi->dbr_pi_va = iov_addr_desc{r.pi, 8};
    qi->dbr_ci_va = iov_addr_desc{r.ci, 8};
    qi->db_hw_va = iov_addr_desc{db.mapped, SOFTNDA_DB_REG_STRIDE};
}

void Srq::publishCi() {
    uint32_t ci = ring.ci_local;
    for (uint32_t h : held) {
        if (ring.ci_local - h > ring.ci_local - ci) {
            ci = h;  // older
        }
    }
    __atomic_store_n(ring.pi + kSrqTakenWord, ring.ci_local, __ATOMIC_RELEASE);
    __atomic_store_n(ring.ci, ci, __ATOMIC_RELEASE);
}

namespace {

// The engine's consumer index of an SQ, RQ or SRQ: the one in its record.
void resumeConsumer(Ring *r) {
    r->ci_local = __atomic_load_n(r->ci, __ATOMIC_ACQUIRE);
}

// An SRQ's consumer: the record's CI, or, ahead of it, the receives the engine took (a CI held
// back at a receive a message in progress held, SPEC.md §10). A taken count outside the ring
// (zero in the record of a process that did not keep it) is not one.
void resumeSrqConsumer(Ring *r) {
    resumeConsumer(r);
    const uint32_t taken = __atomic_load_n(r->pi + kSrqTakenWord, __ATOMIC_ACQUIRE);
    if (taken - r->ci_local <= r->cnt) {
        r->ci_local = taken;
    }
}

// The engine's producer index of a CQ: the published PI, then every CQE already written in the
// current phase (a CQE whose owner store happened and whose PI store did not is visible to a
// consumer polling the phase bit: it must not be overwritten).
void resumeProducer(Ring *r) {
    uint32_t pi = __atomic_load_n(r->pi, __ATOMIC_ACQUIRE);
    uint32_t ci = __atomic_load_n(r->ci, __ATOMIC_ACQUIRE);
    uint32_t log = static_cast<uint32_t>(__builtin_ctz(r->cnt));
    while (pi - ci < r->cnt) {
        const auto *e = reinterpret_cast<const softnda_cqe *>(
            r->buf + static_cast<size_t>(pi & (r->cnt - 1)) * r->stride);
        if ((__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) & 1u) != (((pi >> log) & 1u) ^ 1u)) {
            break;
        }
        pi++;
    }
    r->ci_local = pi;
    __atomic_store_n(r->pi, pi, __ATOMIC_RELEASE);
}

// What the engine keeps of a QP in queue memory: its cursors and, in the SQ record, its state,
// PSNs and the WQE it last started (SPEC.md §10), which says whether the process that ran the
// engine died inside that WQE or just after one.
void resumeQp(Qp *qp) {
    resumeConsumer(&qp->sq);
    if (qp->hasRq()) {
        resumeConsumer(&qp->rq);
    }
    auto state = static_cast<ibv_qp_state>(recordedQpState(qp->sq));
    qp->state.store(state, std::memory_order_relaxed);
    qp->ib.state = state;
    qp->sq_psn = __atomic_load_n(qp->recWord(kSqPsnWord), __ATOMIC_ACQUIRE) & 0xffffff;
    qp->rq_psn = __atomic_load_n(qp->recWord(kRqPsnWord), __ATOMIC_ACQUIRE) & 0xffffff;
    qp->attrs.qkey = __atomic_load_n(qp->recWord(kSqQkeyWord), __ATOMIC_ACQUIRE) & ~SOFTNDA_QKEY_PRIVILEGED;
    uint32_t exec = __atomic_load_n(qp->recWord(kSqExecWord), __ATOMIC_ACQUIRE);
    qp->recover_head = exec == qp->sq.ci_local + 1;
    qp->recover_psn = exec == qp->sq.ci_local && exec != 0;
}

// Makes a built QP reachable (the device's QPN table) and takes its references on its PD, CQs
// and SRQ. An imported QP's peers must look their peer up again: it may have come back after
// them.
void linkQp(Qp *qp, Origin origin) {
    Device *dev = qp->ctx->dev;
    dev->gate.lock();
    dev->qps[qp->qpn] = qp;
    if (origin == Origin::Imported) {
        dev->qp_epoch++;
    }
    dev->gate.unlock();
    for (uint32_t *refs :
         {qp->pd != nullptr ? &qp->pd->refs : nullptr, qp->scq != nullptr ? &qp->scq->refs : nullptr,
          qp->rcq != nullptr ? &qp->rcq->refs : nullptr, qp->srq != nullptr ? &qp->srq->refs : nullptr,
          qp->xrcd != nullptr ? &qp->xrcd->refs : nullptr}) {
        if (refs != nullptr) {
            ++*refs;
        }
    }
    dev->n_qp++;
    qp->ctx->objects++;
}

}  // namespace

bool opsComplete(const ibv_extend_ops *o) {
    return o != nullptr && o->alloc != nullptr && o->free != nullptr && o->memset_s != nullptr &&
           o->memcpy_s != nullptr && o->db_mmap != nullptr && o->db_unmap != nullptr;
}

bool qpParents(Context *ctx, ibv_qp_type type, ibv_pd *pd, ibv_cq *scq, ibv_cq *rcq, ibv_srq *srq,
               QpParents *out) {
    out->pd = asPd(pd);
    out->scq = asCq(scq);
    out->rcq = asCq(rcq);
    out->srq = srq != nullptr ? asSrq(srq) : nullptr;
    const bool base =
        out->pd != nullptr && out->pd->ctx == ctx && out->scq != nullptr && out->scq->ctx == ctx;
    if (type == IBV_QPT_XRC_SEND) {  // a send queue only: no receive side to hang on anything
        out->rcq = nullptr;
        return base && srq == nullptr;
    }
    return base && out->rcq != nullptr && out->rcq->ctx == ctx &&
           (srq == nullptr || (out->srq != nullptr && out->srq->ctx == ctx && out->srq->xrcd == nullptr));
}

ibv_xrcd *buildXrcd(Context *ctx) {
    auto *x = new Xrcd;
    x->magic = kMagicXrcd;
    x->dev = ctx->dev;
    x->ib.context = &ctx->ib;
    registerXrcd(x);
    return &x->ib;
}

uint32_t recordedQpState(const Ring &sq) {
    return __atomic_load_n(sq.pi + kQpStateWord, __ATOMIC_ACQUIRE);
}

ibv_pd *buildPd(Context *ctx, uint32_t handle) {
    auto *pd = new Pd;
    pd->magic = kMagicPd;
    pd->ctx = ctx;
    pd->ib.context = &ctx->ib;
    pd->ib.handle = handle;
    ctx->dev->n_pd++;
    ctx->objects++;
    return &pd->ib;
}

ibv_mr *buildMr(std::unique_ptr<Mr> mr, Pd *pd, uint32_t handle) {
    Device *dev = pd->ctx->dev;
    mr->magic = kMagicMr;
    mr->pd = pd;
    mr->ib.context = pd->ib.context;
    mr->ib.pd = &pd->ib;
    mr->ib.addr = reinterpret_cast<void *>(static_cast<uintptr_t>(mr->iova));
    mr->ib.length = mr->len;
    mr->ib.handle = handle;
    mr->ib.lkey = mr->key;
    mr->ib.rkey = mr->key;
    dev->gate.lock();
    dev->mrs[mr->key >> 8] = mr.get();
    dev->gate.unlock();
    pd->refs++;
    dev->n_mr++;
    pd->ctx->objects++;
    return &mr.release()->ib;
}

ibv_cq_extend *buildCq(std::unique_ptr<Cq> cq, Context *ctx, ibv_extend_ops *ops, void *cq_context,
                       uint32_t handle, Origin origin) {
    Device *dev = ctx->dev;
    cq->magic = kMagicCq;
    cq->ctx = ctx;
    cq->ops = ops;
    Ring &r = cq->ring;
    cq->state = r.pi + kCqStateWord;
    cq->arm = r.pi + kCqArmWord;
    cq->events = r.pi + kCqEventsWord;
    resumeProducer(&r);
    cq->error = __atomic_load_n(cq->state, __ATOMIC_ACQUIRE) != 0;
    cq->ib.context = &ctx->ib;
    cq->ib.cq_context = cq_context;
    cq->ib.cqe = static_cast<int>(r.cnt);
    cq->ib.handle = handle;
    cq->ext.cq = &cq->ib;
    fillQueueInfo(&cq->ext.cq_info, r, cq->db);
    publishDbSlot(dev, &cq->db, SlotKind::Cq, cq.get(), origin);
    dev->n_cq++;
    ctx->objects++;
    return &cq.release()->ext;
}

ibv_srq_extend *buildSrq(std::unique_ptr<Srq> srq, Context *ctx, Pd *pd, ibv_extend_ops *ops,
                         void *srq_context, uint32_t handle, Origin origin) {
    Device *dev = ctx->dev;
    srq->magic = kMagicSrq;
    srq->ctx = ctx;
    srq->pd = pd;
    srq->ops = ops;
    srq->limit = srq->ring.pi + kSrqLimitWord;
    srq->limit_events = srq->ring.pi + kSrqLimitEventsWord;
    resumeSrqConsumer(&srq->ring);
    srq->ib.context = &ctx->ib;
    srq->ib.srq_context = srq_context;
    srq->ib.pd = &pd->ib;
    srq->ib.handle = handle;
    srq->ext.srq = &srq->ib;
    fillQueueInfo(&srq->ext.srq_info, srq->ring, srq->db);
    publishDbSlot(dev, &srq->db, SlotKind::Srq, srq.get(), origin);
    if (srq->xrcd != nullptr) {
        dev->gate.lock();
        dev->xrc_srqs[srq->srqn] = srq.get();
        dev->gate.unlock();
        srq->xrcd->refs++;
        srq->cq->refs++;
    }
    pd->refs++;
    dev->n_srq++;
    ctx->objects++;
    return &srq.release()->ext;
}

ibv_qp_extend *buildQp(std::unique_ptr<Qp> qp, Context *ctx, const QpParents &parents, ibv_extend_ops *ops,
                       const ibv_qp_init_attr &init, uint32_t handle, Origin origin) {
    qp->magic = kMagicQp;
    qp->ctx = ctx;
    qp->pd = parents.pd;
    qp->scq = parents.scq;
    qp->rcq = parents.rcq;
    qp->srq = parents.srq;
    qp->xrcd = parents.xrcd;
    qp->ops = ops;
    qp->init = QpInit{init.cap, init.qp_type, init.sq_sig_all};
    qp->wqe_data = wqeDataOffset(init.qp_type);
    switch (init.qp_type) {
        case IBV_QPT_UD:
            qp->max_opcode = SOFTNDA_OP_SEND_WITH_IMM;
            qp->max_msg = std::min(kUdMtu, ctx->dev->cfg.max_msg_sz);
            break;
        case IBV_QPT_UC:
            qp->max_opcode = SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
            qp->max_msg = ctx->dev->cfg.max_msg_sz;
            break;
        default:
            qp->max_opcode = SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
            qp->max_msg = ctx->dev->cfg.max_msg_sz;
            break;
    }
    qp->fatal_events = qp->sq.pi + kSqFatalEventsWord;
    resumeQp(qp.get());
    // Where its responder's atomic results are kept for a successor (SPEC.md §18 "Restart").
    if (origin == Origin::Created) {
        takeAtomicRecords(qp.get());
    } else {
        adoptAtomicRecords(qp.get());
    }
    qp->ib.context = &ctx->ib;
    qp->ib.qp_context = init.qp_context;
    qp->ib.pd = parents.pd != nullptr ? &parents.pd->ib : nullptr;
    qp->ib.send_cq = init.send_cq;
    qp->ib.recv_cq = init.recv_cq;
    qp->ib.srq = init.srq;
    qp->ib.handle = handle;
    qp->ib.qp_num = qp->qpn;
    qp->ib.qp_type = init.qp_type;
    qp->ext.qp = &qp->ib;
    fillQueueInfo(&qp->ext.sq_info, qp->sq, qp->sq_db);
    publishDbSlot(ctx->dev, &qp->sq_db, SlotKind::Sq, qp.get(), origin);
    if (qp->hasRq()) {
        fillQueueInfo(&qp->ext.rq_info, qp->rq, qp->rq_db);
        publishDbSlot(ctx->dev, &qp->rq_db, SlotKind::Rq, qp.get(), origin);
    }
    linkQp(qp.get(), origin);
    return &qp.release()->ext;
}

}  // namespace softnda
