// ibv_rereg_mr on softnda (SPEC.md §13): the region keeps its slot and its keys and takes what the
// flags change (translation, PD, access), in one step between two engine passes.
#include <cerrno>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {

int reregMr(ibv_mr *ib, int flags, ibv_pd *new_pd, void *addr, size_t length, uint64_t iova, int access) {
    Mr *mr = asMr(ib);
    // A region on device memory is not re-registered (the kernel refuses it too; SPEC.md §17).
    if (mr == nullptr || mr->dm != nullptr || flags == 0 || (flags & ~kReregFlags) != 0) {
        return -EINVAL;
    }
    Device *dev = mr->pd->ctx->dev;
    Pd *pd = mr->pd;
    if ((flags & IBV_REREG_MR_CHANGE_PD) != 0) {
        pd = asPd(new_pd);
        if (pd == nullptr || pd->ctx != mr->pd->ctx) {
            return -EINVAL;
        }
    }
    if ((flags & IBV_REREG_MR_CHANGE_ACCESS) == 0) {
        access = mr->access;
    } else if (int rc = checkMrAccess(access); rc != 0) {
        return rc;
    }
    if ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) == 0) {
        addr = mr->addr;
        length = mr->len;
        iova = mr->iova;
    } else if (int rc = checkMrRange(dev, addr, length, iova); rc != 0) {
        return rc;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    // The keys stay, as kernel providers keep them (rxe; mlx5 when it changes the region in place)
    // and as consumers expect, who go on using the keys they handed their peers: a work request
    // naming them is checked against the region as it now is (SPEC.md §13).
    {
        std::lock_guard<Gate> gate(dev->gate);
        // A window bound to the MR names its old range and key (SPEC.md §16).
        if (__atomic_load_n(&mr->windows, __ATOMIC_RELAXED) != 0) {
            return -EBUSY;
        }
        mr->addr = static_cast<uint8_t *>(addr);
        mr->len = length;
        mr->iova = iova;
        mr->access = access;
        if (pd != mr->pd) {
            mr->pd->refs--;
            pd->refs++;
            mr->pd = pd;
        }
    }
    mr->ib.pd = &pd->ib;
    mr->ib.addr = reinterpret_cast<void *>(static_cast<uintptr_t>(iova));
    mr->ib.length = length;
    return 0;
}

}  // namespace softnda
