// Memory windows (SPEC.md §16): allocation on the control path; bind, local and remote
// invalidation and access through a window in the engine (a pass holds the gate shared, so the
// window table and the MRs are stable; a window's binding is guarded by its own lock, since
// engine threads of different QPs bind, invalidate and read it).
#include <cerrno>
#include <memory>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

constexpr uint32_t kMwSlotMask = 0x7fffffu;  // rkey bits 8-30

Mw *lookupMw(const Device *dev, uint32_t rkey) {
    if (!isMwKey(rkey)) {
        return nullptr;
    }
    uint32_t slot = (rkey >> 8) & kMwSlotMask;
    return slot < dev->mws.size() ? dev->mws[slot] : nullptr;
}

// Drops the window's binding (caller holds mw->lock).
void unbindLocked(Mw *mw) {
    if (mw->mr != nullptr) {
        __atomic_fetch_sub(&mw->mr->windows, 1u, __ATOMIC_RELAXED);
        mw->mr = nullptr;
    }
    mw->addr = 0;
    mw->len = 0;
    mw->access = 0;
    mw->qpn = 0;
}

// The checks of a bind the window's state does not enter (IBA C10-72..75, rdma_rxe's
// rxe_check_bind_mw): the MR, its PD, its MW_BIND access, the window's access and range.
bool bindable(const Mw *mw, const Qp *qp, const Mr *mr, uint64_t addr, uint64_t len, int access) {
    if (qp->pd != mw->pd || (access & ~kMwAccess) != 0) {
        return false;
    }
    if (mr == nullptr) {
        // Only a type 1 window is unbound by a bind, one of no MR and no length (o10-37.2.40).
        return mw->type == IBV_MW_TYPE_1 && len == 0 && addr == 0;
    }
    if (mr->pd != mw->pd || (mr->access & IBV_ACCESS_MW_BIND) == 0) {
        return false;
    }
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
        (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0) {
        return false;
    }
    if (mw->type == IBV_MW_TYPE_2 && len == 0) {
        return false;
    }
    return addr >= mr->iova && len <= mr->len && addr - mr->iova <= mr->len - len;
}

// A window of pd in slot (taken by the caller) with rkey key, its record in mw: counted and
// made visible to the engine. Caller holds Device::ctl.
ibv_mw *installMw(std::unique_ptr<Mw> mw, Pd *pd, ibv_mw_type type, uint32_t slot, uint32_t key) {
    Device *dev = pd->ctx->dev;
    mw->magic = kMagicMw;
    mw->ctx = pd->ctx;
    mw->pd = pd;
    mw->type = type;
    mw->slot = slot;
    mw->key = key;
    mw->ib.context = &pd->ctx->ib;
    mw->ib.pd = &pd->ib;
    mw->ib.rkey = key;
    mw->ib.handle = slot;
    mw->ib.type = type;
    pd->refs++;
    pd->ctx->objects++;
    dev->n_mw++;
    Mw *raw = mw.release();
    std::lock_guard<Gate> gate(dev->gate);
    dev->mws[slot] = raw;
    return &raw->ib;
}

}  // namespace

ibv_mw *allocMw(ibv_pd *ib, ibv_mw_type type) {
    Pd *pd = asPd(ib);
    if (pd == nullptr || (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)) {
        return failNull<ibv_mw>(EINVAL);
    }
    Device *dev = pd->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_mw >= dev->cfg.max_mr) {
        return failNull<ibv_mw>(ENOMEM);
    }
    auto mw = std::make_unique<Mw>();
    if (!takeWindowRecord(pd->ctx, mw.get())) {
        return failNull<ibv_mw>(errno);
    }
    uint32_t slot;
    if (!dev->free_mw_slots.empty()) {
        slot = dev->free_mw_slots.back();
        dev->free_mw_slots.pop_back();
    } else {
        slot = static_cast<uint32_t>(dev->mws.size());
        if (slot > kMwSlotMask) {
            releaseWindowRecord(pd->ctx, mw.get());
            return failNull<ibv_mw>(ENOMEM);
        }
        std::lock_guard<Gate> gate(dev->gate);
        dev->mws.push_back(nullptr);
    }
    // The key byte starts where the slot's last window left it, so an rkey of that one misses.
    const uint32_t key = kMwKeyBit | (slot << 8) | (++dev->mr_generation & 0xff);
    mw->key = key;
    persistBinding(mw.get(), 0, 0);
    return installMw(std::move(mw), pd, type, slot, key);
}

ibv_mw *restoreMw(Pd *pd, ibv_mw_type type, uint32_t rkey, uint32_t rec_index) {
    Context *ctx = pd->ctx;
    Device *dev = ctx->dev;
    const uint32_t slot = (rkey >> 8) & kMwSlotMask;
    if (!isMwKey(rkey) || dev->n_mw >= dev->cfg.max_mr || rec_index >= ctx->windows.owners.size() ||
        ctx->windows.owners[rec_index] != nullptr) {
        return failNull<ibv_mw>(EINVAL);
    }
    if (!claimSlot(dev->mws, dev->free_mw_slots, slot, dev->gate)) {
        return failNull<ibv_mw>(EINVAL);  // a window of this process has the slot
    }
    auto mw = std::make_unique<Mw>();
    ctx->windows.owners[rec_index] = mw.get();
    mw->rec_index = rec_index;
    mw->rec = ctx->windows.record(rec_index);
    mw->restored = true;  // its binding is taken up at set_paused(0), once every MR is back
    return installMw(std::move(mw), pd, type, slot, rkey);
}

int deallocMw(ibv_mw *ib) {
    Mw *mw = asMw(ib);
    if (mw == nullptr) {
        return -EINVAL;
    }
    Device *dev = mw->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    {
        std::lock_guard<Gate> gate(dev->gate);
        dev->mws[mw->slot] = nullptr;
        unbindLocked(mw);  // no pass runs: the lock is not needed
    }
    dev->free_mw_slots.push_back(mw->slot);
    releaseWindowRecord(mw->ctx, mw);
    mw->pd->refs--;
    mw->ctx->objects--;
    dev->n_mw--;
    mw->magic = 0;
    delete mw;
    return 0;
}

uint8_t executeBindMw(Device *dev, Qp *qp, const softnda_wqe &h) {
    const auto mw_rkey = static_cast<uint32_t>(h.swap);
    const auto lkey = static_cast<uint32_t>(h.swap >> 32);
    const uint32_t new_rkey = h.rkey;
    const uint64_t len = h.compare_add;
    const auto access = static_cast<int>(h.imm_data);
    Mw *mw = lookupMw(dev, mw_rkey);
    // The new rkey keeps the window's index; only the key byte is the binder's.
    if (mw == nullptr || (new_rkey & ~0xffu) != (mw_rkey & ~0xffu)) {
        return IBV_WC_MW_BIND_ERR;
    }
    Mr *mr = lkey == 0 && len == 0 ? nullptr : dev->lookupMr(lkey);
    if ((lkey != 0 || len != 0) && mr == nullptr) {
        return IBV_WC_MW_BIND_ERR;
    }
    if (!bindable(mw, qp, mr, h.remote_addr, len, access)) {
        return IBV_WC_MW_BIND_ERR;
    }
    std::lock_guard<SpinLock> lk(mw->lock);
    // The WQE names the window by its index alone (a consumer's ibv_mw keeps the rkey it was
    // allocated with across type 2 binds); a type 2 window binds only when free (o10-37.2.30):
    // it is invalidated first.
    if (mw->type == IBV_MW_TYPE_2 && mw->mr != nullptr) {
        return IBV_WC_MW_BIND_ERR;
    }
    unbindLocked(mw);
    mw->key = new_rkey;
    if (mr != nullptr) {
        __atomic_fetch_add(&mr->windows, 1u, __ATOMIC_RELAXED);
        mw->mr = mr;
        mw->addr = h.remote_addr;
        mw->len = len;
        mw->access = access;
        mw->qpn = mw->type == IBV_MW_TYPE_2 ? qp->qpn : 0;
    }
    persistBinding(mw, qp->qpn, qp->sq.ci_local + 1);
    return IBV_WC_SUCCESS;
}

namespace {

// An invalidation through qp (local, or a SEND_WITH_INV at the responder): only a type 2
// window, named by its current rkey, bound through qp (o10-37.2.26). MRs are not invalidated:
// softnda has no fast-registration MRs.
bool invalidate(Device *dev, const Qp *qp, uint32_t rkey, bool apply, bool local) {
    Mw *mw = lookupMw(dev, rkey);
    if (mw == nullptr || mw->type != IBV_MW_TYPE_2) {
        return false;
    }
    std::lock_guard<SpinLock> lk(mw->lock);
    if (mw->key != rkey || mw->mr == nullptr || mw->qpn != qp->qpn) {
        return false;
    }
    if (apply) {
        unbindLocked(mw);
        // A local invalidation is a WQE of qp (its exec word, SPEC.md §10); a remote one is not.
        persistBinding(mw, local ? qp->qpn : 0, local ? qp->sq.ci_local + 1 : 0);
    }
    return true;
}

}  // namespace

void invalidateWindowsOf(Device *dev, uint32_t qpn) {
    if (dev->n_mw == 0) {
        return;  // the common case: no walk
    }
    for (Mw *mw : dev->mws) {
        if (mw != nullptr && mw->type == IBV_MW_TYPE_2 && mw->mr != nullptr && mw->qpn == qpn) {
            unbindLocked(mw);  // no pass runs: the window's lock is not needed
            persistBinding(mw, 0, 0);
        }
    }
}

uint8_t executeLocalInv(Device *dev, Qp *qp, uint32_t rkey) {
    return invalidate(dev, qp, rkey, true, true) ? IBV_WC_SUCCESS : IBV_WC_LOC_QP_OP_ERR;
}

bool invalidateRemote(Device *dev, const Qp *responder, uint32_t rkey, bool apply) {
    return invalidate(dev, responder, rkey, apply, false);
}

uint8_t *translateMw(const Device *dev, const Pd *pd, const Qp *responder, uint32_t rkey, uint64_t va,
                     uint64_t n, int need) {
    Mw *mw = lookupMw(dev, rkey);
    if (mw == nullptr || mw->pd != pd) {
        return nullptr;
    }
    std::lock_guard<SpinLock> lk(mw->lock);
    if (mw->key != rkey || mw->mr == nullptr || (mw->access & need) == 0 ||
        (mw->type == IBV_MW_TYPE_2 && mw->qpn != responder->qpn)) {
        return nullptr;
    }
    if (va < mw->addr || n > mw->len || va - mw->addr > mw->len - n) {
        return nullptr;
    }
    return mw->mr->translate(va, n);
}

bool windowWqeApplied(const Device *dev, const Qp *qp, const softnda_wqe &h) {
    const bool bind = h.opcode == SOFTNDA_OP_BIND_MW;
    if (!bind && h.opcode != SOFTNDA_OP_LOCAL_INV) {
        return false;
    }
    const Mw *mw = lookupMw(dev, bind ? static_cast<uint32_t>(h.swap) : h.rkey);
    if (mw == nullptr || mw->rec == nullptr) {
        return false;
    }
    const MwBinding b = currentBinding(mw->rec);
    if (b.by_qpn != qp->qpn || b.by_exec != qp->sq.ci_local + 1) {
        return false;
    }
    // The record is this WQE's own only when it also says what the WQE asked: a QP reset
    // starts its indexes again, and an older WQE of the same index may have written it.
    if (!bind) {
        return b.lkey == 0 && b.key == h.rkey;
    }
    const auto lkey = static_cast<uint32_t>(h.swap >> 32);
    return b.key == h.rkey && b.lkey == lkey &&
           (lkey == 0 || (b.addr == h.remote_addr && b.len == h.compare_add && b.access == h.imm_data));
}

}  // namespace softnda
