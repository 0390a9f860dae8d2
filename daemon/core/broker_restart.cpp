// The core's side of a broker restart (docs/restart.md): the driver state a commit exports, the
// objects a restore adopts, and the sessions it makes live again. The state files, fds and the
// order of the restore are the restart layer's (daemon/restart).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "daemon/core/broker.h"
#include "daemon/core/driver_call.h"

namespace ibvx::daemon {
namespace {

Status importError(const std::string &what) {
    return Status(Code::kFailedPrecondition, EINVAL, what);
}

std::string hex(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016" PRIx64, v);
    return buf;
}

std::unique_ptr<Object> newObjectOf(ObjectKind kind) {
    switch (kind) {
        case ObjectKind::kContext:
            return std::make_unique<ContextObject>();
        case ObjectKind::kPd:
            return std::make_unique<PdObject>();
        case ObjectKind::kMr:
            return std::make_unique<MrObject>();
        case ObjectKind::kCq:
            return std::make_unique<CqObject>();
        case ObjectKind::kSrq:
            return std::make_unique<SrqObject>();
        case ObjectKind::kQp:
            return std::make_unique<QpObject>();
        case ObjectKind::kAh:
            return std::make_unique<AhObject>();
        case ObjectKind::kXrcd:
            return std::make_unique<XrcdObject>();
        case ObjectKind::kMw:
            return std::make_unique<MwObject>();
        case ObjectKind::kDm:
            return std::make_unique<DmObject>();
    }
    return nullptr;
}

// The nth object of kind T that o uses (a QP's send CQ is its first CQ, its receive CQ its second).
template <typename T>
T *usedBy(const Object &o, size_t nth = 0) {
    for (Object *u : o.uses) {
        if (u->kind == T::kKind && nth-- == 0) {
            return static_cast<T *>(u);
        }
    }
    return nullptr;
}

// What an adopted object hangs from: its context (a PD's for an MR) and PD, and the device.
struct Parents {
    ContextObject *ctx = nullptr;
    PdObject *pd = nullptr;
    Device *dev = nullptr;
};

Parents parentsOf(const Object &obj, DeviceRegistry &devices, const std::string &context_device) {
    Parents p;
    p.pd = usedBy<PdObject>(obj);
    if (obj.kind == ObjectKind::kContext) {
        p.dev = devices.find(context_device);
        return p;
    }
    p.ctx = usedBy<ContextObject>(obj);
    if (p.ctx == nullptr && p.pd != nullptr) {
        p.ctx = p.pd->context;
    }
    p.dev = p.ctx != nullptr ? p.ctx->dev : nullptr;
    return p;
}

// An MR's memory mapped again from the tenant's memfd where the old process mapped it; the
// driver's import finds the new address through relocations.
Status mapMrAgain(MrObject &mr, ObjectImport::Mr &in, uint64_t handle, Relocations &relocations) {
    struct stat st {};
    if (in.map_length == 0 || ::fstat(in.fd.get(), &st) < 0 ||
        in.fd_offset > static_cast<uint64_t>(st.st_size)) {
        return importError("MR " + hex(handle) + ": its memory fd does not match");
    }
    void *base = ::mmap(nullptr, in.map_length, PROT_READ | PROT_WRITE, MAP_SHARED, in.fd.get(),
                        static_cast<off_t>(in.fd_offset));
    if (base == MAP_FAILED) {
        return Status::fromErrno(errno, "MR " + hex(handle) + ": cannot map its memory");
    }
    mr.mapping = UniqueMapping(base, in.map_length);
    mr.fd = std::move(in.fd);
    mr.fd_offset = in.fd_offset;
    mr.length = in.length;
    relocations.add(in.old_address, reinterpret_cast<uint64_t>(base), in.map_length);
    return Status::ok();
}

// What the record keeps of the kind besides its driver state: the parents it points at, an
// MR's memory, a QP's creation attributes.
Status adoptKindFields(Object &obj, const Parents &p, ObjectImport &in, Relocations &relocations) {
    switch (obj.kind) {
        case ObjectKind::kContext:
            static_cast<ContextObject &>(obj).dev = p.dev;
            break;
        case ObjectKind::kPd:
            static_cast<PdObject &>(obj).context = p.ctx;
            break;
        case ObjectKind::kMr:
            static_cast<MrObject &>(obj).pd = p.pd;
            if (usedBy<DmObject>(obj) != nullptr) {
                static_cast<MrObject &>(obj).length = in.mr.length;
                return Status::ok();  // on device memory: its bytes came back with the DM's
            }
            return mapMrAgain(static_cast<MrObject &>(obj), in.mr, in.handle, relocations);
        case ObjectKind::kCq:
            static_cast<CqObject &>(obj).context = p.ctx;
            break;
        case ObjectKind::kSrq:
            static_cast<SrqObject &>(obj).context = p.ctx;
            break;
        case ObjectKind::kXrcd:
            static_cast<XrcdObject &>(obj).context = p.ctx;
            break;
        case ObjectKind::kMw:
            static_cast<MwObject &>(obj).pd = p.pd;
            break;
        case ObjectKind::kDm:
            static_cast<DmObject &>(obj).context = p.ctx;
            static_cast<DmObject &>(obj).length = in.quota[static_cast<size_t>(Quota::kDmBytes)];
            break;
        case ObjectKind::kQp: {
            auto &qp = static_cast<QpObject &>(obj);
            qp.context = p.ctx;
            qp.qp_type = in.qp.type;
            qp.sq_sig_all = in.qp.sq_sig_all;
            qp.has_srq = in.qp.has_srq;
            qp.cap = in.qp.cap;
            break;
        }
        case ObjectKind::kAh: {
            auto &ah = static_cast<AhObject &>(obj);
            ah.pd = p.pd;
            ah.attr = in.ah;
            break;
        }
    }
    return Status::ok();
}

void *relocate(void *arg, uint64_t old_addr, uint64_t length) {
    uint64_t a = static_cast<const Relocations *>(arg)->find(old_addr, length);
    return a != 0 ? reinterpret_cast<void *>(a) : nullptr;
}

// Where import_object finds the object's parents, already imported, and its memory.
StatusOr<ibv_extend_vdev_import> importEnvironment(const Object &obj, const Parents &p,
                                                   Relocations &relocations) {
    ibv_extend_vdev_import env{};
    env.device = p.dev->info.name.c_str();
    env.context = p.ctx != nullptr ? p.ctx->verbs : nullptr;
    env.pd = p.pd != nullptr ? p.pd->pd : nullptr;
    // An XRC SRQ and target name their domain; an XRC SRQ its CQ (SPEC.md §14).
    XrcdObject *xrcd = usedBy<XrcdObject>(obj);
    env.xrcd = xrcd != nullptr ? xrcd->xrcd : nullptr;
    // An MR on device memory names its DM (SPEC.md §17).
    DmObject *dm = usedBy<DmObject>(obj);
    env.dm = dm != nullptr ? dm->dm : nullptr;
    if (obj.kind == ObjectKind::kSrq && xrcd != nullptr) {
        CqObject *cq = usedBy<CqObject>(obj);
        if (cq == nullptr) {
            return importError("XRC SRQ " + hex(obj.handle) + " has no CQ");
        }
        env.srq_cq = cq->cq->cq;
    }
    if (obj.kind == ObjectKind::kQp) {
        const ibv_qp_type type = static_cast<const QpObject &>(obj).qp_type;
        CqObject *scq = usedBy<CqObject>(obj, 0);
        CqObject *rcq = usedBy<CqObject>(obj, 1);
        SrqObject *srq = usedBy<SrqObject>(obj);
        // An XRC target has no CQs, an initiator no receive CQ.
        const bool cqs_ok = type == IBV_QPT_XRC_RECV
                                ? xrcd != nullptr
                                : scq != nullptr && (rcq != nullptr || type == IBV_QPT_XRC_SEND);
        if (!cqs_ok) {
            return importError("QP " + hex(obj.handle) + " has not the CQs or domain of its type");
        }
        env.send_cq = scq != nullptr ? scq->cq->cq : nullptr;
        env.recv_cq = rcq != nullptr ? rcq->cq->cq : nullptr;
        env.srq = srq != nullptr ? srq->srq->srq : nullptr;
    }
    env.ops = MappingManager::ops();
    env.relocate = relocate;
    env.arg = &relocations;
    return env;
}

// The driver's object made again from its state (import_object), the session bound as at its
// create; an imported context gets its extension context again.
Status importDriverObject(SessionMemory &mem, Object &obj, const Parents &p, ObjectImport &in,
                          Relocations &relocations) {
    ibv_extend_vdev_state st{};
    st.len = static_cast<uint32_t>(in.driver_state.size());
    std::memcpy(st.data, in.driver_state.data(), st.len);
    for (const UniqueFd &fd : in.driver_fds) {
        st.fds[st.fd_cnt++] = fd.get();
    }
    ASSIGN_OR_RETURN(ibv_extend_vdev_import env, importEnvironment(obj, p, relocations));
    ASSIGN_OR_RETURN(void *made,
                     createOnDriver(mem, p.dev, EIO,
                                    std::string("the driver could not import ") + kindName(obj.kind) + " " +
                                        hex(obj.handle),
                                    [&] { return p.dev->verbs.importObject(obj.vdevKind(), &st, &env); }));
    for (UniqueFd &fd : in.driver_fds) {
        (void)fd.release();  // the imported object owns them now
    }
    obj.adoptDriverObject(made);
    if (obj.kind == ObjectKind::kContext) {
        DriverCall call(mem, p.dev);
        if (static_cast<ContextObject &>(obj).openExtension().refusal != loader::ExtendRefusal::kNone) {
            return importError("the driver did not open an extension context on the restored device");
        }
    }
    return Status::ok();
}

// A domain handle again: the first of a shared domain's handles to come back (in whichever
// session) imports the driver's domain, the others join it, keyed by the file the handle holds.
Status adoptXrcd(SessionMemory &mem, XrcdObject &x, const Parents &p, ObjectImport &in,
                 Relocations &relocations) {
    XrcdOpen how;
    how.create = true;
    if (in.xrcd_file) {
        struct stat st {};
        if (::fstat(in.xrcd_file.get(), &st) != 0) {
            return importError("XRC domain " + hex(in.handle) + "'s file came back unusable");
        }
        how.file = XrcdFile{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    }
    ASSIGN_OR_RETURN(x.domain, p.dev->xrcds.open(
                                   how,
                                   [&]() -> StatusOr<ibv_xrcd *> {
                                       RETURN_IF_ERROR(importDriverObject(mem, x, p, in, relocations));
                                       return x.xrcd;
                                   },
                                   [&](ibv_xrcd *made) {
                                       DriverCall call(mem, p.dev);
                                       return p.dev->verbs.closeXrcd(made);
                                   }));
    x.xrcd = x.domain->xrcd;
    x.file = std::move(in.xrcd_file);
    return Status::ok();
}

}  // namespace

Status Broker::exportObject(Session &s, uint64_t handle, bool keep_same, bool *changed) {
    if (changed != nullptr) {
        *changed = false;
    }
    auto it = s.objects_.find(handle);
    if (it == s.objects_.end() || !it->second->state_dirty) {
        return Status::ok();  // destroyed since, or already exported (a handle touched twice)
    }
    Object *obj = it->second.get();
    obj->state_dirty = false;
    obj->state_released = false;  // what follows keeps a new state, or none
    Device *dev = obj->device();
    if (!obj->hasDriverObject()) {
        return Status::ok();  // its record carries all there is of it
    }
    if (dev == nullptr || !dev->verbs.keepsAcrossRestart() || obj->restartDropReason() != nullptr) {
        obj->driver_state.clear();
        obj->driver_fds.clear();
        return Status::ok();  // restart: drops (the restart plan ends such sessions)
    }
    ibv_extend_vdev_state st{};
    int rc = 0;
    {
        DriverCall call(s.memory(), dev);
        rc = dev->verbs.exportObject(obj->vdevKind(), obj->driverObject(), &st);
    }
    if (rc == 0 && (st.len > IBV_EXTEND_VDEV_STATE_MAX || st.fd_cnt > IBV_EXTEND_VDEV_STATE_FDS)) {
        for (uint32_t i = 0; i < std::min<uint32_t>(st.fd_cnt, IBV_EXTEND_VDEV_STATE_FDS); ++i) {
            ::close(st.fds[i]);
        }
        rc = -EOVERFLOW;
    }
    if (rc != 0) {
        obj->driver_state.clear();
        obj->driver_fds.clear();
        return Status::fromErrno(-rc, std::string("cannot export the state of ") + kindName(obj->kind) + " " +
                                          hex(handle) + " for restart: " + std::strerror(-rc));
    }
    std::string_view now(reinterpret_cast<const char *>(st.data), st.len);
    if (keep_same && now == obj->driver_state && st.fd_cnt == obj->driver_fds.size()) {
        for (uint32_t i = 0; i < st.fd_cnt; ++i) {
            ::close(st.fds[i]);  // the same files as the kept ones: a parent's fds do not change
        }
        return Status::ok();
    }
    obj->driver_state.assign(now);
    obj->driver_fds.clear();
    for (uint32_t i = 0; i < st.fd_cnt; ++i) {
        obj->driver_fds.emplace_back(st.fds[i]);
    }
    if (changed != nullptr) {
        *changed = true;
    }
    return Status::ok();
}

void Broker::releaseLoggedState(Session &s, uint64_t handle) {
    auto it = s.objects_.find(handle);
    if (it == s.objects_.end() || !isLeafKind(it->second->kind) || it->second->driver_state.empty()) {
        return;
    }
    std::string().swap(it->second->driver_state);  // clear() would keep the capacity
    it->second->state_released = true;
}

Status Broker::keptState(Session &s, uint64_t handle) {
    auto it = s.objects_.find(handle);
    if (it == s.objects_.end() || !it->second->state_released) {
        return Status::ok();
    }
    it->second->state_dirty = true;
    return exportObject(s, handle);
}

Status Broker::adopt(Session &s, ObjectImport in, Relocations &relocations) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    std::unique_ptr<Object> obj = newObjectOf(in.kind);
    if (obj == nullptr || in.handle == 0 || s.objects_.count(in.handle) != 0 ||
        in.uses.size() > ObjectUses::kMax) {
        return importError("its state holds a malformed object");
    }
    obj->handle = in.handle;
    for (uint64_t h : in.uses) {
        auto it = s.objects_.find(h);
        if (it == s.objects_.end()) {
            return importError("object " + hex(in.handle) + " uses an unknown handle");
        }
        obj->uses.push_back(it->second.get());
    }
    // The parents the kind needs, checked before anything reaches the driver.
    const Parents p = parentsOf(*obj, *devices_, in.device);
    if (p.dev == nullptr || (in.kind != ObjectKind::kContext && p.ctx == nullptr) ||
        ((in.kind == ObjectKind::kMr || (in.kind == ObjectKind::kQp && in.qp.type != IBV_QPT_XRC_RECV) ||
          in.kind == ObjectKind::kAh) &&
         p.pd == nullptr)) {
        return importError("object " + hex(in.handle) + " has no device or parent");
    }
    if (!p.dev->verbs.keepsAcrossRestart()) {
        return importError("device " + p.dev->info.name + "'s driver cannot hand over (restart: drops)");
    }
    auto *qp = obj->kind == ObjectKind::kQp ? static_cast<QpObject *>(obj.get()) : nullptr;
    if (qp != nullptr && in.qp.opened_num != 0) {
        qp->opened = true;  // an OpenQp handle: its target is its creator's record, adopted before
    }
    // A kind the broker keeps by itself (an AH), or an opened target's handle, is made from its
    // record alone.
    const bool driver = obj->hasDriverObject();
    if (driver && (in.driver_state.empty() || in.driver_state.size() > IBV_EXTEND_VDEV_STATE_MAX ||
                   in.driver_fds.size() > IBV_EXTEND_VDEV_STATE_FDS)) {
        return importError("object " + hex(in.handle) + " has no usable driver state");
    }
    RETURN_IF_ERROR(adoptKindFields(*obj, p, in, relocations));
    if (obj->kind == ObjectKind::kXrcd) {
        RETURN_IF_ERROR(adoptXrcd(s.memory(), static_cast<XrcdObject &>(*obj), p, in, relocations));
    } else if (driver) {
        RETURN_IF_ERROR(importDriverObject(s.memory(), *obj, p, in, relocations));
    }
    if (obj->kind == ObjectKind::kSrq && usedBy<XrcdObject>(*obj) != nullptr) {
        // The import kept the XRC SRQ's number (SPEC.md §14); the broker reports it again.
        auto &srq = static_cast<SrqObject &>(*obj);
        DriverCall call(s.memory(), p.dev);
        if (p.dev->verbs.getSrqNum(srq.srq->srq, &srq.srq_num) < 0 || srq.srq_num == 0) {
            (void)srq.destroyDriverObject();
            return importError("XRC SRQ " + hex(in.handle) + " came back without its number");
        }
    }
    if (qp != nullptr && qp->opened) {
        // The restore adopts these after every session's own objects (restore.cpp), so the
        // target is back by now unless its creator's session did not come back.
        const XrcdObject *xrcd = usedBy<XrcdObject>(*qp);
        qp->target = xrcd != nullptr && xrcd->domain != nullptr
                         ? p.dev->xrc_targets.open(xrcd->domain.get(), in.qp.opened_num)
                         : nullptr;
        if (qp->target == nullptr) {
            return importError("the XRC target QP " + std::to_string(in.qp.opened_num) + " that handle " +
                               hex(in.handle) + " opened did not come back with its creator's session");
        }
        qp->qp = qp->target->qp;
    }
    obj->quota = quotas_.restore(tenantOf(s.identity()), in.quota);
    obj->queue_bytes = in.queue_bytes;
    link(s, std::move(obj));  // the next commit exports it from this process
    if (qp != nullptr && in.qp.type == IBV_QPT_XRC_RECV && !qp->opened) {
        enterTarget(s, *qp, *usedBy<XrcdObject>(*qp));  // openable again
    }
    return Status::ok();
}

Status Broker::adoptSession(std::shared_ptr<Session> s) {
    QuotaValues one{};
    one[static_cast<size_t>(Quota::kSessions)] = 1;
    QuotaCharge quota = quotas_.restore(tenantOf(s->identity()), one);
    std::lock_guard lock(sessions_mu_);
    if (by_token_.count(s->tokenHex()) != 0) {
        return Status(Code::kAlreadyExists, EEXIST, "a session with this token exists");
    }
    s->quota_ = std::move(quota);
    // Its stored replies were admitted once: charged again without a check, like its objects.
    QuotaValues reply{};
    reply[static_cast<size_t>(Quota::kReplies)] = 1;
    s->chargeReplies([&] { return quotas_.restore(tenantOf(s->identity()), reply); });
    next_session_id_ = std::max(next_session_id_, s->id() + 1);
    by_token_[s->tokenHex()] = std::move(s);
    return Status::ok();
}

uint64_t Broker::nextSessionId() {
    std::lock_guard lock(sessions_mu_);
    return next_session_id_;
}

void Broker::raiseNextSessionId(uint64_t next) {
    std::lock_guard lock(sessions_mu_);
    next_session_id_ = std::max(next_session_id_, next);
}

}  // namespace ibvx::daemon
