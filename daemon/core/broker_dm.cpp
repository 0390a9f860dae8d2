// Device memory through the broker (softnda SPEC.md §17, vdev ABI V10): an allocation is a session
// object on its context whose bytes the driver takes from the session's own memory (the broker's
// ops, bound by DriverCall), so the tenant maps exactly what its own session holds: the region
// goes out on the fd channel as queue memory does, and a restart carries it with the session's
// arena. MRs on it are MrObjects that use it, with no memory of their own.
#include <cerrno>

#include "daemon/core/broker.h"
#include "daemon/core/driver_call.h"

namespace ibvx::daemon {

StatusOr<uint64_t> Broker::maxDmSize(Session &s, uint64_t context) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    return ctx->dev->info.max_dm_size;
}

StatusOr<DmResult> Broker::allocDm(Session &s, const AllocDmArgs &args) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    Device *dev = ctx->dev;
    if (dev->info.max_dm_size == 0) {
        return unimplemented("device " + dev->info.name + " has no device memory a broker can hand out");
    }
    if (args.length == 0 || args.length > dev->info.max_dm_size) {
        return invalidArgument("DM length must be 1.." + std::to_string(dev->info.max_dm_size) +
                               " bytes (the device's max_dm_size)");
    }
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kDmBytes, args.length}}));
    auto obj = std::make_unique<DmObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    obj->length = args.length;
    ibv_alloc_dm_attr attr{};
    attr.length = args.length;
    attr.log_align_req = args.log_align_req;
    attr.comp_mask = args.comp_mask;
    ASSIGN_OR_RETURN(obj->dm, createOnDriver(s.memory(), dev, ENOMEM, "alloc_dm failed", [&] {
                         return dev->verbs.allocDm(ctx->verbs, attr, MappingManager::ops());
                     }));
    // Where the driver put the bytes: in the session's memory, or the DM cannot be handed out.
    void *addr = nullptr;
    uint64_t length = 0;
    Status st = callDriver(s.memory(), dev, "the driver cannot say where the DM's memory is",
                           [&] { return dev->verbs.dmMemory(obj->dm, &addr, &length); });
    DmResult r;
    if (st.isOk()) {
        auto ref = MappingManager::instance().resolve(*s.memory_, reinterpret_cast<uint64_t>(addr), length);
        st = ref.status();
        if (st.isOk()) {
            r.memory = *ref;
        }
    }
    if (!st.isOk()) {
        (void)callDriver(s.memory(), dev, "free_dm failed", [&] { return obj->destroyDriverObject(); });
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    obj->uses = {ctx};
    Object *raw = obj.get();
    ASSIGN_OR_RETURN(r.dm, publish(s, std::move(obj), {}));
    // The region holding the bytes goes out before the reply (publish sends only queues').
    if (st = sendRegions(s); !st.isOk()) {
        (void)destroyLocked(s, raw);
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    return r;
}

StatusOr<Released> Broker::freeDm(Session &s, uint64_t dm) {
    return destroyByHandle(s, dm, ObjectKind::kDm);
}

StatusOr<RegMrResult> Broker::regDmMr(Session &s, const RegDmMrArgs &args) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(PdObject * pd, lookup<PdObject>(s, args.pd));
    // lookup<> is instantiated in broker.cpp only: find() and the kind's cast.
    ASSIGN_OR_RETURN(Object * found, find(s, args.dm, ObjectKind::kDm));
    auto *dm = static_cast<DmObject *>(found);
    Device *dev = pd->device();
    if (dm->device() != dev) {
        return invalidArgument("the DM and the PD are on different devices");
    }
    // Its bytes are the DM's, charged there: an MR on DM holds only an MR.
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kMrs, 1}}));
    auto obj = std::make_unique<MrObject>();
    obj->quota = std::move(quota);
    obj->pd = pd;
    obj->length = args.length;
    ASSIGN_OR_RETURN(obj->mr, createOnDriver(s.memory(), dev, EOPNOTSUPP, "DM MR registration failed", [&] {
                         return dev->verbs.regDmMr(pd->pd, dm->dm, args.offset, args.length, args.access);
                     }));
    RegMrResult r;
    r.lkey = obj->mr->lkey;
    r.rkey = obj->mr->rkey;
    r.iova = 0;  // zero-based
    obj->uses = {pd, dm};
    ASSIGN_OR_RETURN(r.mr, publish(s, std::move(obj), {}));
    return r;
}

}  // namespace ibvx::daemon
