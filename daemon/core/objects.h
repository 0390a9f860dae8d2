// The objects a session owns. Each holds the driver's object and pointers to the objects it
// uses; `users` counts the objects using it, so a destroy of something still in use fails
// with EBUSY, as libibverbs does. Guarded by the owning Session's mutex.
//
// What differs by kind lives on the kind (objects.cpp): how its driver object is destroyed,
// which device's driver serves it, what the Admin service sees of it. The broker and the
// inspector never switch on the kind.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include "common/unique_fd.h"
#include "daemon/core/mapping.h"
#include "daemon/core/object_snapshot.h"
#include "daemon/core/quota.h"
#include "daemon/core/xrc_targets.h"
#include "daemon/core/xrcd_domains.h"
#include "providers/loader/extend_open.h"

namespace ibvx::daemon {

struct Device;

const char *kindName(ObjectKind kind);

// Parents first: an object uses only objects of kinds that come before its own here. A restore
// makes a session's objects in this order; a teardown destroys them in the reverse one.
// Windows come after MRs: a window bound to an MR keeps it busy, so windows go first.
inline constexpr ObjectKind kParentsFirst[] = {
    ObjectKind::kContext, ObjectKind::kPd, ObjectKind::kXrcd, ObjectKind::kAh,  ObjectKind::kDm,
    ObjectKind::kMr,      ObjectKind::kMw, ObjectKind::kCq,   ObjectKind::kSrq, ObjectKind::kQp};
// The kind's place in kParentsFirst; past its end for a value that names no kind.
size_t kindRank(ObjectKind kind);

// items in kParentsFirst order, those of one kind (and of no kind) in the order given: a
// counting sort, one kindRank() per item. A comparison sort called kindRank's search twice per
// comparison, ~280,000 times for a 10,000-object session, and a handover sorts every session
// more than once.
template <typename T, typename KindOf>
std::vector<T> inParentsFirstOrder(const std::vector<T> &items, KindOf kind_of) {
    constexpr size_t kRanks = std::size(kParentsFirst) + 1;  // the last: no kind
    std::vector<uint8_t> ranks(items.size());
    size_t start[kRanks + 1] = {};
    for (size_t i = 0; i < items.size(); ++i) {
        ranks[i] = static_cast<uint8_t>(std::min(kindRank(kind_of(items[i])), kRanks - 1));
        ++start[ranks[i] + 1];
    }
    for (size_t r = 1; r <= kRanks; ++r) {
        start[r] += start[r - 1];
    }
    std::vector<T> out(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
        out[start[ranks[i]]++] = items[i];
    }
    return out;
}
// Kinds no object has among its uses: a create or destroy never touches one as a parent, so no
// later export is compared with its kept driver state, and a commit gives that back once it is
// logged (Broker::releaseLoggedState). Were one ever a parent, its next export would only be
// logged once more, never lost.
constexpr bool isLeafKind(ObjectKind kind) {
    return kind == ObjectKind::kQp || kind == ObjectKind::kMr;
}

struct Object;

// The objects one object uses. There are at most five (a QP's context, PD, two CQs and SRQ), so
// they are held inline: a heap vector would cost every QP a 48-byte allocation.
class ObjectUses {
  public:
    static constexpr size_t kMax = 5;

    ObjectUses &operator=(std::initializer_list<Object *> list) {
        size_ = 0;
        for (Object *o : list) {
            push_back(o);
        }
        return *this;
    }
    void push_back(Object *o) {
        if (size_ == kMax) {
            std::abort();  // cannot happen: no kind of object uses more
        }
        items_[size_++] = o;
    }
    size_t size() const { return size_; }
    Object *const *begin() const { return items_; }
    Object *const *end() const { return items_ + size_; }

  private:
    Object *items_[kMax] = {};
    uint8_t size_ = 0;
};

struct Object {
    explicit Object(ObjectKind k) : kind(k) {}
    virtual ~Object() = default;
    const ObjectKind kind;
    uint32_t users = 0;  // next to kind: one word for both (a broker holds 100,000s of objects)
    uint64_t handle = 0;
    ObjectUses uses;           // every object here has users incremented for us
    QuotaCharge quota;         // what the object holds against its tenant's quotas
    uint64_t queue_bytes = 0;  // a queue's rings, as charged to Quota::kQueueBytes

    // The device whose driver serves the object.
    virtual Device *device() const = 0;
    // Destroys the driver's object: 0, or the driver's error (a negative errno, or libibverbs'
    // conventions for a context). Called with the device's driver lock held and the session bound.
    virtual int destroyDriverObject() = 0;
    // Fills what is particular to the kind (the common fields are the inspector's).
    virtual void snapshot(ObjectSnapshot &out) const = 0;
    // An object the tenant destroyed that the broker still keeps for others (an XRC target its
    // creator let go while other sessions hold it): no call of the tenant finds it.
    virtual bool hidden() const { return false; }

    // ---- restart (docs/restart.md) ----
    // False for a kind the broker keeps by itself (an AH): no driver object to export or import;
    // its record carries what the broker knows of it.
    virtual bool hasDriverObject() const { return true; }
    // Why a restart cannot carry the object (its session is then ended: the restart plan counts
    // it as dropped, and its record carries no driver state); nullptr when it can.
    virtual const char *restartDropReason() const { return nullptr; }
    // The kind as the vdev ABI names it, and the driver object export_object takes.
    virtual ibv_extend_vdev_obj vdevKind() const = 0;
    virtual const void *driverObject() const = 0;
    // Takes the object import_object returned (of vdevKind()).
    virtual void adoptDriverObject(void *made) = 0;
    // The driver's state as of the object's last control operation (export_object), refreshed
    // by the next commit while state_dirty. Creates and control calls set state_dirty. A leaf's
    // (isLeafKind) is given back once logged (state_released), and exported again only when a
    // compaction writes its record anew.
    std::string driver_state;
    std::vector<UniqueFd> driver_fds;
    bool state_dirty = true;
    bool state_released = false;
    // Where the restart layer last logged the object's record in its session's state file
    // (StateFile::Placement; 0: nowhere known), so a compaction can copy that record instead
    // of exporting and encoding it again. The restart layer's bookkeeping, set under the
    // session's lock by a commit: mutable, as the commit sees the objects read-only.
    mutable uint64_t logged_at = 0;
};

struct ContextObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kContext;
    ContextObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_CONTEXT; }
    const void *driverObject() const override { return verbs; }
    void adoptDriverObject(void *made) override { verbs = static_cast<ibv_context *>(made); }
    Device *device() const override { return dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    bool hidden() const override { return released; }
    // Opens the driver's extension context on `verbs` (just opened, or imported by a restore);
    // a refusal closes `verbs` again. Called with the device's driver lock held (a driver call).
    loader::ExtendOpen openExtension();
    Device *dev = nullptr;
    ibv_context *verbs = nullptr;  // the device context (vdev or libibverbs)
    ibv_context_extend *ext = nullptr;
    // The tenant closed it while XRC targets others hold still use it (Broker::closeContext).
    bool released = false;
};

struct PdObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kPd;
    PdObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_PD; }
    const void *driverObject() const override { return pd; }
    void adoptDriverObject(void *made) override { pd = static_cast<ibv_pd *>(made); }
    Device *device() const override { return context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    ContextObject *context = nullptr;
    ibv_pd *pd = nullptr;
};

struct MrObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kMr;
    MrObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_MR; }
    const void *driverObject() const override { return mr; }
    void adoptDriverObject(void *made) override { mr = static_cast<ibv_mr *>(made); }
    Device *device() const override { return pd->context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    PdObject *pd = nullptr;
    ibv_mr *mr = nullptr;
    UniqueMapping mapping;  // the tenant's memory mapped in the broker
    uint64_t length = 0;
    // The tenant's memfd and the offset the mapping starts at (mapping + delta = the MR's
    // address): kept so a restarted broker can map it again.
    UniqueFd fd;
    uint64_t fd_offset = 0;
};

// A memory window of a PD (softnda SPEC.md §16). The broker only allocates and frees it: binds
// and invalidations are work requests of the tenant's data path, so the broker does not know a
// window's binding (nor its current rkey). While a window is bound to an MR, the MR's dereg is
// refused by the driver (EBUSY); the session's teardown frees windows before MRs.
struct MwObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kMw;
    MwObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_MW; }
    const void *driverObject() const override { return mw; }
    void adoptDriverObject(void *made) override { mw = static_cast<ibv_mw *>(made); }
    Device *device() const override { return pd->context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    PdObject *pd = nullptr;
    ibv_mw *mw = nullptr;
};

// An allocation of device memory (softnda SPEC.md §17) on a context of the session. Its bytes
// are in the session's own memory (the driver's alloc through the broker's ops), which the
// tenant maps; MRs registered on it (ibv_reg_dm_mr: MrObjects that use it) come before its free.
struct DmObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kDm;
    DmObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_DM; }
    const void *driverObject() const override { return dm; }
    void adoptDriverObject(void *made) override { dm = static_cast<ibv_dm *>(made); }
    Device *device() const override { return context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    ContextObject *context = nullptr;
    ibv_dm *dm = nullptr;
    uint64_t length = 0;  // what the tenant asked for
};

// A session's handle on an XRC domain (softnda SPEC.md §14), opened on a context of the session.
// Its XRC SRQs and target QPs use it, so it is closed after them. The domain itself may be
// shared: every session that opened it with the same file holds a handle on the same driver
// domain (xrcd_domains.h), which is closed when the last handle goes.
struct XrcdObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kXrcd;
    XrcdObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_XRCD; }
    const void *driverObject() const override { return xrcd; }
    void adoptDriverObject(void *made) override { xrcd = static_cast<ibv_xrcd *>(made); }
    Device *device() const override { return context->dev; }
    // Lets go of the domain: the driver's domain is closed only by its last holder.
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    ContextObject *context = nullptr;
    ibv_xrcd *xrcd = nullptr;  // domain->xrcd
    std::shared_ptr<XrcdDomain> domain;
    // The file that names a shared domain, as the tenant sent it (invalid for a private domain):
    // it holds the inode, so its number names no other file while the domain lives (the kernel
    // holds the inode the same way), and a restart finds the domain's key again from it. Not an
    // O_PATH reopen: systemd's fd store refuses fds it cannot poll, and O_PATH ones are such.
    UniqueFd file;
};

struct CqObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kCq;
    CqObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_CQ; }
    const void *driverObject() const override { return cq; }
    void adoptDriverObject(void *made) override { cq = static_cast<ibv_cq_extend *>(made); }
    Device *device() const override { return context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    ContextObject *context = nullptr;
    ibv_cq_extend *cq = nullptr;
};

struct SrqObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kSrq;
    SrqObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_SRQ; }
    const void *driverObject() const override { return srq; }
    void adoptDriverObject(void *made) override { srq = static_cast<ibv_srq_extend *>(made); }
    Device *device() const override { return context->dev; }
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    ContextObject *context = nullptr;
    ibv_srq_extend *srq = nullptr;
    // An XRC SRQ's number (initiators name it in their requests); 0 for a basic SRQ. An XRC SRQ
    // uses its domain and the CQ its receives complete on besides its context and PD.
    uint32_t srq_num = 0;
};

struct QpObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kQp;
    QpObject() : Object(kKind) {}
    ibv_extend_vdev_obj vdevKind() const override { return IBV_EXTEND_VDEV_OBJ_QP; }
    const void *driverObject() const override { return qp; }
    void adoptDriverObject(void *made) override { qp = static_cast<ibv_qp_extend *>(made); }
    // An opened handle's driver object is its creator's: its record names the target instead.
    bool hasDriverObject() const override { return !opened; }
    Device *device() const override { return context->dev; }
    // An opened handle destroys nothing in the driver (the target is its creator's QpObject's).
    int destroyDriverObject() override;
    void snapshot(ObjectSnapshot &out) const override;
    bool hidden() const override { return released; }
    const char *restartDropReason() const override;
    ContextObject *context = nullptr;
    ibv_qp_extend *qp = nullptr;
    // An XRC target's entry in its device's table (xrc_targets.h), for the creator's QP and for
    // each handle OpenQp gave (opened: qp is then the creator's driver target). released: the
    // creator let go while other handles remained; kept, hidden, until the last one goes.
    std::shared_ptr<SharedTarget> target;
    bool opened = false;
    bool released = false;
    // What the QP was created with (the rest of ibv_qp_init_attr is in `uses` or the driver).
    ibv_qp_cap cap{};  // as the driver granted it
    ibv_qp_type qp_type = IBV_QPT_RC;
    bool sq_sig_all = false;
    bool has_srq = false;
};

// An address handle: the broker keeps its attributes, checked at create, and no driver holds
// an object for it (softnda and the face read a UD destination from the tenant's own copy,
// ibv_extend_datapath_ah). It exists so that the AH belongs to the session, counts in the
// tenant's "ahs" quota, is reclaimed with the session and is destroyed before its PD.
struct AhObject : Object {
    static constexpr ObjectKind kKind = ObjectKind::kAh;
    AhObject() : Object(kKind) {}
    bool hasDriverObject() const override { return false; }
    // Never asked (hasDriverObject): an AH has no vdev kind.
    ibv_extend_vdev_obj vdevKind() const override { return static_cast<ibv_extend_vdev_obj>(0); }
    const void *driverObject() const override { return nullptr; }
    void adoptDriverObject(void *) override {}
    Device *device() const override { return pd->context->dev; }
    int destroyDriverObject() override { return 0; }
    void snapshot(ObjectSnapshot &out) const override;
    PdObject *pd = nullptr;
    ibv_ah_attr attr{};
};

}  // namespace ibvx::daemon
