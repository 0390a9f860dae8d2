#include "daemon/core/objects.h"

#include <iterator>

#include "daemon/core/device.h"

namespace ibvx::daemon {
namespace {

std::string deviceName(const Device *dev) {
    return dev != nullptr ? dev->info.name : std::string();
}

}  // namespace

const char *kindName(ObjectKind kind) {
    switch (kind) {
        case ObjectKind::kContext:
            return "context";
        case ObjectKind::kPd:
            return "pd";
        case ObjectKind::kMr:
            return "mr";
        case ObjectKind::kCq:
            return "cq";
        case ObjectKind::kQp:
            return "qp";
        case ObjectKind::kSrq:
            return "srq";
        case ObjectKind::kAh:
            return "ah";
        case ObjectKind::kXrcd:
            return "xrcd";
        case ObjectKind::kMw:
            return "mw";
        case ObjectKind::kDm:
            return "dm";
    }
    return "object";
}

size_t kindRank(ObjectKind kind) {
    size_t rank = 0;
    while (rank < std::size(kParentsFirst) && kParentsFirst[rank] != kind) {
        ++rank;
    }
    return rank;
}

loader::ExtendOpen ContextObject::openExtension() {
    loader::ExtendOpen open = loader::openExtendContext(dev->driver, verbs);
    if (open.refusal == loader::ExtendRefusal::kNone) {
        ext = open.ext;
    } else {
        (void)dev->verbs.closeDevice(verbs);
        verbs = nullptr;
    }
    return open;
}

int ContextObject::destroyDriverObject() {
    // Nothing to refuse here: the extension context goes, then the device context under it.
    if (dev->driver->free_context != nullptr) {
        dev->driver->free_context(ext);
    }
    (void)dev->verbs.closeDevice(verbs);
    return 0;
}

void ContextObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(dev);
}

int PdObject::destroyDriverObject() {
    return device()->verbs.deallocPd(pd);
}

void PdObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
}

int MrObject::destroyDriverObject() {
    return device()->verbs.deregMr(mr);
}

void MrObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(pd != nullptr && pd->context != nullptr ? pd->context->dev : nullptr);
    out.mr_length = length;
    if (mr != nullptr) {
        out.lkey = mr->lkey;
        out.rkey = mr->rkey;
    }
}

int MwObject::destroyDriverObject() {
    return device()->verbs.deallocMw(mw);
}

// Its kind, device and PD only: the rkey and binding are the data path's (see MwObject).
void MwObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(pd != nullptr && pd->context != nullptr ? pd->context->dev : nullptr);
}

int DmObject::destroyDriverObject() {
    return device()->verbs.freeDm(dm);
}

void DmObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
    out.mr_length = length;
}

int XrcdObject::destroyDriverObject() {
    Device *dev = device();
    if (domain == nullptr) {
        return dev->verbs.closeXrcd(xrcd);  // not adopted into a domain yet (a failed restore)
    }
    return dev->xrcds.leave(domain, [dev](ibv_xrcd *x) { return dev->verbs.closeXrcd(x); });
}

void XrcdObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
}

int CqObject::destroyDriverObject() {
    auto *ops = context->ext->ops;
    return ops->destroy_cq != nullptr ? ops->destroy_cq(cq) : -EOPNOTSUPP;
}

void CqObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
    if (cq != nullptr && cq->cq != nullptr) {
        out.cqe = static_cast<uint32_t>(cq->cq->cqe);
    } else if (cq != nullptr) {
        out.cqe = cq->cq_info.qbuf.entry_cnt;
    }
}

int SrqObject::destroyDriverObject() {
    auto *ops = context->ext->ops;
    return ops->destroy_srq != nullptr ? ops->destroy_srq(srq) : -EOPNOTSUPP;
}

void SrqObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
    if (srq != nullptr) {
        out.srq_entries = srq->srq_info.qbuf.entry_cnt;
        out.srq_entry_size = srq->srq_info.qbuf.entry_size;
    }
    out.srq_num = srq_num;
}

int QpObject::destroyDriverObject() {
    if (opened) {
        return 0;
    }
    auto *ops = context->ext->ops;
    return ops->destroy_qp != nullptr ? ops->destroy_qp(qp) : -EOPNOTSUPP;
}

void QpObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(context != nullptr ? context->dev : nullptr);
    out.qp_type = qp_type;
    out.qp_cap = cap;
    out.qp_has_srq = has_srq;
    if (target != nullptr) {
        out.qp_target_handles = context->dev->xrc_targets.handles(*target);
        out.qp_opened = opened;
        out.qp_released = released;
    }
    if (qp != nullptr && qp->qp != nullptr) {
        out.qp_num = qp->qp->qp_num;
        out.qp_state = qp->qp->state;
    }
}

const char *QpObject::restartDropReason() const {
    if (target == nullptr) {
        return nullptr;
    }
    // The driver's target is one object with one blob, its creator's, and each opener's record
    // names it by number (opened again after every session's restore, docs/restart.md). Once the
    // creator let go of it while others held it, its QpObject is hidden (in a session maybe
    // parked, which no restart carries): then neither it nor the handles can come back.
    if (released || (opened && target->creator_released)) {
        return "XRC target QPs their creator let go of";
    }
    return nullptr;
}

void AhObject::snapshot(ObjectSnapshot &out) const {
    out.device = deviceName(pd != nullptr && pd->context != nullptr ? pd->context->dev : nullptr);
    out.ah = attr;
}

}  // namespace ibvx::daemon
