// ibv_resize_cq on softnda (SPEC.md §12): a new ring, the completions not yet polled moved into
// it under the same absolute indices, and the CQ switched to it while no engine pass runs.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

softnda_cqe *cqeAt(const Ring &r, uint32_t n) {
    return reinterpret_cast<softnda_cqe *>(r.buf + static_cast<size_t>(n & (r.cnt - 1)) * r.stride);
}

uint32_t lapPhase(const Ring &r, uint32_t n) {
    return (n >> __builtin_ctz(r.cnt)) & 1u;
}

// Fills `to` (zeroed, at least pi - ci entries) from `from`: CQE n in [ci, pi) keeps its number
// n, so the consumer's and the engine's indices carry over unchanged, and gets the phase of its
// lap in the new ring (SPEC.md §3). Every other slot gets the phase that reads as "not written"
// for the next CQE number landing there: zeroed memory alone would read as valid in every odd lap.
// The doorbell record moves whole (PI, overflow state, arming, event count, CI).
void moveCqes(const Ring &from, const Ring &to, uint32_t ci, uint32_t pi) {
    for (uint32_t n = ci; n != pi; ++n) {
        softnda_cqe *e = cqeAt(to, n);
        std::memcpy(e, cqeAt(from, n), from.stride);  // with its times (SPEC.md §15)
        e->owner = (e->owner & ~1u) | (lapPhase(to, n) ^ 1u);
    }
    for (uint32_t n = pi; n != ci + to.cnt; ++n) {
        cqeAt(to, n)->owner = lapPhase(to, n);
    }
    std::memcpy(to.pi, from.pi, kRecordSize);
}

}  // namespace

int resizeCq(ibv_cq_extend *ext, uint32_t cqe) {
    Cq *cq = ext != nullptr ? asCq(ext->cq) : nullptr;
    if (cq == nullptr || &cq->ext != ext) {
        return -EINVAL;
    }
    Device *dev = cq->ctx->dev;
    if (cqe == 0 || cqe > dev->cfg.max_cqe) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    Ring fresh;
    int rc = allocRing(cq->ops, pow2Ceil(std::max(cqe, 2u)), cq->ring.stride, &fresh);
    if (rc != 0) {
        return rc;
    }
    Ring old;
    {
        // No engine pass runs (the gate), so no CQE is being written; the CQ's lock as well, for
        // the producers the lock list names.
        std::lock_guard<Gate> gate(dev->gate);
        std::lock_guard<SpinLock> lk(cq->lock);
        const uint32_t pi = cq->ring.ci_local;
        const uint32_t ci = __atomic_load_n(cq->ring.ci, __ATOMIC_ACQUIRE);
        if (pi - ci > cqe) {
            rc = -EINVAL;  // fewer entries than completions waiting: none may be lost
        } else {
            moveCqes(cq->ring, fresh, ci, pi);
            fresh.ci_local = pi;
            old = cq->ring;
            cq->ring = fresh;
            cq->state = fresh.pi + kCqStateWord;
            cq->arm = fresh.pi + kCqArmWord;
            cq->events = fresh.pi + kCqEventsWord;
        }
    }
    if (rc != 0) {
        freeRing(cq->ops, &fresh);
        return rc;
    }
    freeRing(cq->ops, &old);
    cq->ib.cqe = static_cast<int>(cq->ring.cnt);
    fillQueueInfo(&cq->ext.cq_info, cq->ring, cq->db);
    return 0;
}

}  // namespace softnda
