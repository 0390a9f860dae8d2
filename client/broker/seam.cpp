// client/broker_seam.h implemented over the broker: mode selection, contexts, devices and the
// ibv_extend_broker.h objects. Everything after open goes through the forwarding ops table.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "client/broker/convert.h"
#include "client/broker/held_init.h"
#include "client/broker/shadow_calls.h"
#include "client/broker/shared_pages.h"
#include "client/broker_seam.h"
#include "client/buffers.h"
#include "common/c_abi.h"
#include "common/unix_socket.h"

namespace ibvx::client {
namespace {

using namespace broker;  // NOLINT: this file is the broker side of the seam

// Does anything accept connections on the socket? A refused or missing socket costs one failed
// connect(), once per process.
bool socketAnswers(const std::string &path) {
    return ibvx::connectUnix(path).isOk();
}

bool resolveMode() {
    // secure_getenv: a set-uid program must not be pointed at another broker by its caller.
    const char *mode = secure_getenv("IBV_EXTEND_MODE");
    if (mode != nullptr && strcmp(mode, "direct") == 0) {
        return false;
    }
    if (mode != nullptr && strcmp(mode, "broker") == 0) {
        return true;
    }
    if (mode != nullptr && mode[0] != '\0' && strcmp(mode, "auto") != 0) {
        warn("IBV_EXTEND_MODE='%s' is not one of auto, broker, direct; using auto", mode);
    }
    return socketAnswers(settings().socket_path);
}

ShadowContext *contextOfExtend(const ibv_context_extend *ext) {
    return ext != nullptr ? contextOf(ext->context) : nullptr;
}

ibv_context_extend *openByName(const char *name, bool from_open_device) {
    Session *s = nullptr;
    int rc = currentSession(&s);
    if (rc != 0) {
        return failNull<ibv_context_extend>(-rc);
    }
    pb::OpenContextRequest req;
    req.set_device_name(name);
    pb::OpenContextResponse resp;
    rc = s->call("OpenContext", &pb::Broker::Stub::OpenContext, req, &resp);
    if (rc != 0) {
        return failNull<ibv_context_extend>(-rc);
    }
    int version = static_cast<int>(resp.driver_version());
    if (version <= IBV_EXTEND_DRIVER_VERSION_UNUSED || version > IBV_EXTEND_DRIVER_VERSION_MAX) {
        warn("the broker's driver for '%s' has ops version %d, supported 1..%d; context refused", name,
             version, IBV_EXTEND_DRIVER_VERSION_MAX);
        pb::CloseContextRequest creq;
        creq.set_context(resp.context());
        pb::CloseContextResponse cresp;
        (void)s->call("CloseContext", &pb::Broker::Stub::CloseContext, creq, &cresp);
        return failNull<ibv_context_extend>(EOPNOTSUPP);
    }
    ShadowContext *c = makeContext(s, resp);
    c->from_open_device = from_open_device;
    registerContext(c);
    return &c->ext;
}

int closeContext(ShadowContext *c) {
    pb::CloseContextRequest req;
    req.set_context(c->handle);
    pb::CloseContextResponse resp;
    int rc = c->session->call("CloseContext", &pb::Broker::Stub::CloseContext, req, &resp);
    if (rc != 0 && !c->session->gone()) {
        return rc;
    }
    if (rc == 0) {
        c->session->releaseRegions(resp.released_regions());
    }
    unregisterContext(c);
    {
        std::lock_guard lock(c->mu);
        for (ibv_context_extend *alias : c->aliases) {
            delete alias;
        }
    }
    pthread_mutex_destroy(&c->ctx.mutex);
    delete c;
    return rc;
}

// The shadow of an MR the broker registered (resp); hold: the shared pages it keeps, if any.
ibv_mr *trackMr(ShadowPd *pd, const pb::RegMrResponse &resp, void *addr, size_t length, SharedHold *hold) {
    auto *m = new ShadowMr{};
    if (hold != nullptr) {
        std::swap(m->shared.addr, hold->addr);
        std::swap(m->shared.length, hold->length);
    }
    m->owner = pd->owner;
    m->handle = resp.mr();
    m->mr.context = &pd->owner->ctx;
    m->mr.pd = &pd->pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.handle = static_cast<uint32_t>(resp.mr());
    m->mr.lkey = resp.lkey();
    m->mr.rkey = resp.rkey();
    track(m, pd->owner);
    return &m->mr;
}

pb::RegMrRequest regMrRequest(const ShadowPd *pd, uint64_t offset, size_t length, int access, uint64_t iova) {
    pb::RegMrRequest req;
    req.set_pd(pd->handle);
    req.set_offset(offset);
    req.set_length(length);
    req.set_access(static_cast<uint32_t>(access));
    req.set_iova(iova);
    return req;
}

ibv_mr *registerMr(ShadowPd *pd, int fd, uint64_t offset, size_t length, int access, void *addr,
                   uint64_t iova, SharedHold *hold) {
    pb::RegMrRequest req = regMrRequest(pd, offset, length, access, iova);
    pb::RegMrResponse resp;
    int rc = pd->owner->session->callWithFd(
        "RegMr", &pb::Broker::Stub::RegMr, fd, req,
        [](pb::RegMrRequest *r, uint64_t x) { r->set_xfer_id(x); }, &resp);
    if (rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    return trackMr(pd, resp, addr, length, hold);
}

// Shared memory the program mapped (SysV, POSIX shm, shared anonymous): the broker opens it from
// this process's own mapping and registers it in place; nothing moves and no fd is sent.
ibv_mr *registerInPlace(ShadowPd *pd, void *addr, size_t length, int access, uint64_t iova) {
    pb::RegMrRequest req = regMrRequest(pd, 0, length, access, iova);
    req.set_tenant_address(reinterpret_cast<uintptr_t>(addr));
    pb::RegMrResponse resp;
    if (int rc = pd->owner->session->call("RegMr", &pb::Broker::Stub::RegMr, req, &resp); rc != 0) {
        warn("reg_mr: the broker cannot register the shared memory at [%p, +%zu) in place (%s)", addr, length,
             std::strerror(-rc));
        return failNull<ibv_mr>(-rc);
    }
    return trackMr(pd, resp, addr, length, nullptr);
}

// How the broker is given [addr, addr + length) of this process: a window (fd, offset) of a
// buffer the library made or of ordinary memory moved onto shared pages (hold keeps them), or,
// fd -1, the program's own shared mapping, which the broker opens in place (tenant_address).
struct MrSource {
    int fd = -1;
    uint64_t offset = 0;
    SharedHold hold;  // the moved pages, given back when dropped (unless an MR takes them over)
};

// 0, or a negative errno with a warning saying why the memory cannot reach the broker.
int sourceOf(void *addr, size_t length, const char *verb, MrSource *out) {
    BufferInfo buf;
    if (findBuffer(addr, length, &buf)) {
        out->fd = buf.fd;
        out->offset = reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(buf.base);
        return 0;
    }
    // Ordinary memory: its pages move onto shared memory the broker can be given
    // (client/broker/shared_pages.h); the MR gives them back when it goes.
    SharedWindow window;
    std::string why;
    if (int rc = acquireShared(addr, length, &window, &why); rc != 0) {
        if (rc == -EINVAL && inSharedMapping(addr, length)) {
            return 0;  // in place: fd -1
        }
        warn("%s: [%p, +%zu) cannot be registered through the broker: %s", verb, addr, length, why.c_str());
        return rc;
    }
    out->fd = window.fd;
    out->offset = window.offset;
    out->hold.addr = addr;
    out->hold.length = length;
    return 0;
}

std::atomic<bool> g_broker_mode{false};

}  // namespace

bool brokerModeActive() {
    static std::once_flag once;
    std::call_once(once, [] { g_broker_mode.store(resolveMode(), std::memory_order_release); });
    return g_broker_mode.load(std::memory_order_acquire);
}

bool brokerOwns(const ibv_context *context) {
    return anyContext() && contextOf(context) != nullptr;
}

ibv_context_extend *brokerOpen(ibv_context *context) {
    if (ShadowContext *c = contextOf(context)) {
        // A second extension context on a broker context: the same broker context, its own
        // ibv_context_extend (closing it leaves the first one alone).
        auto *alias = new ibv_context_extend{&c->ctx, &c->ops};
        std::lock_guard lock(c->mu);
        c->aliases.insert(alias);
        return alias;
    }
    if (context->device == nullptr) {
        return failNull<ibv_context_extend>(EINVAL);
    }
    return openByName(context->device->name, false);
}

int brokerClose(ibv_context_extend *context) {
    ShadowContext *c = contextOfExtend(context);
    if (c == nullptr) {
        return -EINVAL;
    }
    if (context != &c->ext) {
        std::lock_guard lock(c->mu);
        if (c->aliases.erase(context) == 0) {
            return -EINVAL;
        }
        delete context;
        return 0;
    }
    return closeContext(c);
}

int brokerListDevices(ibvx_device_info *devices, int max) {
    Session *s = nullptr;
    int rc = currentSession(&s);
    if (rc != 0) {
        return rc;
    }
    pb::ListDevicesResponse resp;
    rc = s->call("ListDevices", &pb::Broker::Stub::ListDevices, pb::ListDevicesRequest{}, &resp);
    if (rc != 0) {
        return rc;
    }
    int n = resp.devices_size();
    for (int i = 0; i < std::min(n, max); ++i) {
        fromProto(resp.devices(i), &devices[i]);
    }
    return n;
}

ibv_context_extend *brokerOpenByName(const char *name) {
    return openByName(name, true);
}

int brokerCloseDevice(ibv_context_extend *context) {
    ShadowContext *c = contextOfExtend(context);
    if (c == nullptr || context != &c->ext) {
        return -EINVAL;  // only what ibvx_open_device() returned
    }
    return closeContext(c);
}

ibv_pd *brokerAllocPd(ibv_context_extend *context) {
    ShadowContext *c = contextOfExtend(context);
    if (c == nullptr) {
        return failNull<ibv_pd>(EINVAL);
    }
    pb::AllocPdRequest req;
    req.set_context(c->handle);
    pb::AllocPdResponse resp;
    int rc = c->session->call("AllocPd", &pb::Broker::Stub::AllocPd, req, &resp);
    if (rc != 0) {
        return failNull<ibv_pd>(-rc);
    }
    auto *p = new ShadowPd{};
    p->owner = c;
    p->handle = resp.pd();
    p->pd.context = &c->ctx;
    p->pd.handle = static_cast<uint32_t>(resp.pd());
    track(p, c);
    return &p->pd;
}

int brokerDeallocPd(ibv_pd *pd) {
    return destroyTracked(livePd(pd), "DeallocPd", &pb::Broker::Stub::DeallocPd,
                          &pb::DeallocPdRequest::set_pd);
}

ibv_mr *brokerRegMr(ibv_pd *pd, void *addr, size_t length, int access) {
    return brokerRegMrIova(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access);
}

ibv_mr *brokerRegMrIova(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || addr == nullptr || length == 0) {
        return failNull<ibv_mr>(EINVAL);
    }
    MrSource src;
    if (int rc = sourceOf(addr, length, "reg_mr", &src); rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    if (src.fd < 0) {
        return registerInPlace(p, addr, length, access, iova);
    }
    return registerMr(p, src.fd, src.offset, length, access, addr, iova, &src.hold);
}

ibv_mr *brokerRegMrFd(ibv_pd *pd, int fd, uint64_t offset, size_t length, int access) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr) {
        return failNull<ibv_mr>(EINVAL);
    }
    return registerMr(p, fd, offset, length, access, nullptr, 0, nullptr);
}

int brokerReregMr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, int access) {
    ShadowMr *m = liveMr(mr);
    if (m == nullptr) {
        return -EINVAL;
    }
    pb::ReregMrRequest req;
    req.set_mr(m->handle);
    req.set_flags(static_cast<uint32_t>(flags));
    ShadowPd *p = nullptr;
    if ((flags & IBV_REREG_MR_CHANGE_PD) != 0) {
        p = livePd(pd);
        if (p == nullptr || p->owner != m->owner) {
            return -EINVAL;  // not a PD of the MR's context (SPEC.md §13)
        }
        req.set_pd(p->handle);
    }
    if ((flags & IBV_REREG_MR_CHANGE_ACCESS) != 0) {
        req.set_access(static_cast<uint32_t>(access));
    }
    const bool translate = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
    Session *session = m->owner->session;
    pb::ReregMrResponse resp;
    MrSource src;  // the new memory; dropped on failure, its moved pages given back
    int rc = 0;
    if (!translate) {
        rc = session->call("ReregMr", &pb::Broker::Stub::ReregMr, req, &resp);
    } else if (addr == nullptr || length == 0) {
        return -EINVAL;
    } else if (rc = sourceOf(addr, length, "rereg_mr", &src); rc != 0) {
        return rc;
    } else {
        req.set_length(length);
        req.set_iova(reinterpret_cast<uintptr_t>(addr));  // ibv_rereg_mr has no iova: the address
        if (src.fd < 0) {
            req.set_tenant_address(reinterpret_cast<uintptr_t>(addr));
            rc = session->call("ReregMr", &pb::Broker::Stub::ReregMr, req, &resp);
        } else {
            req.set_offset(src.offset);
            rc = session->callWithFd(
                "ReregMr", &pb::Broker::Stub::ReregMr, src.fd, req,
                [](pb::ReregMrRequest *r, uint64_t x) { r->set_xfer_id(x); }, &resp);
        }
    }
    if (rc != 0) {
        return rc;  // the MR is unchanged (SPEC.md §13)
    }
    m->mr.lkey = resp.lkey();
    m->mr.rkey = resp.rkey();
    if (p != nullptr) {
        m->mr.pd = &p->pd;
    }
    if (translate) {
        m->mr.addr = addr;
        m->mr.length = length;
        // The MR keeps the new range's moved pages; src takes the old range's and gives them
        // back as a deregistration would.
        std::swap(m->shared.addr, src.hold.addr);
        std::swap(m->shared.length, src.hold.length);
    }
    return 0;
}

int brokerDeregMr(ibv_mr *mr) {
    return destroyTracked(liveMr(mr), "DeregMr", &pb::Broker::Stub::DeregMr, &pb::DeregMrRequest::set_mr);
}

ibv_ah *brokerCreateAh(ibv_pd *pd, const ibv_ah_attr *attr) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || attr == nullptr) {
        return failNull<ibv_ah>(EINVAL);
    }
    pb::CreateAhRequest req;
    req.set_pd(p->handle);
    wire::toProto(*attr, req.mutable_attr());
    pb::CreateAhResponse resp;
    if (int rc = p->owner->session->call("CreateAh", &pb::Broker::Stub::CreateAh, req, &resp); rc != 0) {
        return failNull<ibv_ah>(-rc);
    }
    auto *a = new ShadowAh{};
    a->owner = p->owner;
    a->handle = resp.ah();
    a->dp.attr = *attr;
    a->dp.ah.context = pd->context;
    a->dp.ah.pd = pd;
    a->dp.ah.handle = static_cast<uint32_t>(resp.ah());
    track(a, p->owner);
    return &a->dp.ah;
}

int brokerDestroyAh(ibv_ah *ah) {
    ShadowAh *a = ah != nullptr ? shadowOf<ShadowAh>(ah, offsetof(ShadowAh, dp.ah)) : nullptr;
    return destroyTracked(a, "DestroyAh", &pb::Broker::Stub::DestroyAh, &pb::DestroyAhRequest::set_ah);
}

namespace broker {
namespace {

// ModifyQp with the held-back INIT, if any, before attr (s->modify_mu held).
int modifyHeld(ShadowQp *s, const ibv_qp_attr &attr, int attr_mask) {
    pb::ModifyQpRequest req;
    req.set_qp(s->handle);
    toProto(attr, attr_mask, req.mutable_attr());
    req.set_attr_mask(static_cast<uint32_t>(attr_mask));
    const bool held = s->held_init_mask != 0;
    if (held) {
        toProto(s->held_init, s->held_init_mask, req.mutable_held_init_attr());
        req.set_held_init_mask(static_cast<uint32_t>(s->held_init_mask));
    }
    pb::ModifyQpResponse resp;
    int rc = s->owner->session->call("ModifyQp", &pb::Broker::Stub::ModifyQp, req, &resp);
    if (rc == 0) {
        s->held_init_mask = 0;
        s->qp.state = fromProtoState(resp.state());
        return 0;
    }
    if (held) {
        // Refused: the held INIT went in first unless the call never reached the QP (an ended
        // session, say). The broker's state of the QP tells which.
        pb::QueryQpRequest q;
        q.set_qp(s->handle);
        q.set_attr_mask(IBV_QP_STATE);
        pb::QueryQpResponse qr;
        if (s->owner->session->call("QueryQp", &pb::Broker::Stub::QueryQp, q, &qr) == 0 &&
            qr.attr().qp_state() != pb::QP_STATE_UNSPECIFIED &&
            fromProtoState(qr.attr().qp_state()) != IBV_QPS_RESET) {
            s->held_init_mask = 0;
            s->qp.state = fromProtoState(qr.attr().qp_state());
        }
    }
    return rc;
}

}  // namespace

int flushHeldInit(ShadowQp *s) {
    std::lock_guard lock(s->modify_mu);
    if (s->held_init_mask == 0) {
        return 0;
    }
    const int mask = std::exchange(s->held_init_mask, 0);
    int rc = modifyHeld(s, s->held_init, mask);  // the INIT alone
    if (rc != 0) {
        s->held_init_mask = mask;  // refused, nothing went in: still held
    }
    return rc;
}

}  // namespace broker

int brokerModifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) {
    ShadowQp *s = liveQp(qp);
    if (s == nullptr) {
        return -EINVAL;
    }
    std::lock_guard lock(s->modify_mu);
    if (s->owner->plain_init && s->held_init_mask == 0 && qp->state == IBV_QPS_RESET &&
        qp->qp_type != IBV_QPT_XRC_RECV && (attr_mask & IBV_QP_STATE) != 0 &&
        attr->qp_state == IBV_QPS_INIT && sessionAlive(s->owner->session)) {
        // Answered here, as the driver would (held_init.h); sent with the QP's next call.
        if (int refused = plainInitRefusal(qp->qp_type, *attr, attr_mask, s->owner->info.phys_port_cnt);
            refused != 0) {
            return -refused;
        }
        s->held_init = *attr;
        s->held_init_mask = attr_mask;
        qp->state = IBV_QPS_INIT;
        return 0;
    }
    return modifyHeld(s, *attr, attr_mask);
}

int brokerQueryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) {
    ShadowQp *s = liveQp(qp);
    if (s == nullptr) {
        return -EINVAL;
    }
    if ((attr_mask & ~IBV_QP_CAP) == 0) {
        // The capabilities are what the broker granted at create: answered here, no call.
        attr->cap = s->cap;
        *init_attr = grantedInitAttr(*s);
        return 0;
    }
    if (int rc = flushHeldInit(s); rc != 0) {
        return rc;  // the broker answers for the QP as it is: the INIT it holds goes in first
    }
    pb::QueryQpRequest req;
    req.set_qp(s->handle);
    req.set_attr_mask(static_cast<uint32_t>(attr_mask));
    pb::QueryQpResponse resp;
    int rc = s->owner->session->call("QueryQp", &pb::Broker::Stub::QueryQp, req, &resp);
    if (rc != 0) {
        return rc;
    }
    fromProto(resp.attr(), attr);
    if (resp.attr().qp_state() != pb::QP_STATE_UNSPECIFIED) {
        qp->state = attr->qp_state;
    }
    *init_attr = ibv_qp_init_attr{};
    init_attr->qp_context = qp->qp_context;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    init_attr->srq = qp->srq;
    fromProto(resp.init_cap(), &init_attr->cap);
    init_attr->qp_type = fromProtoQpType(resp.qp_type());
    init_attr->sq_sig_all = resp.sq_sig_all() ? 1 : 0;
    return 0;
}

}  // namespace ibvx::client
