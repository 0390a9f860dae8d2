// The face's devices and contexts: ibv_get_device_list() lists the broker's devices, and
// ibv_open_device() opens a broker context that is a complete verbs_context, so the inline
// wrappers of <infiniband/verbs.h> reach the face on it.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "client/broker/session.h"
#include "client/broker_seam.h"
#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

// One ibv_device per broker device name, for the process lifetime (libibverbs keeps devices
// alive as long as contexts on them may exist; ours never go, which costs one struct per name).
struct FaceDevice {
    ibv_device dev{};
    std::string name;
    int index = 0;
    bool guid_known = false;  // guarded by Devices::mu
    uint64_t guid = 0;        // host order; guarded by Devices::mu
};

struct Devices {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<FaceDevice>> by_name;  // guarded by mu
    std::set<const ibv_device *> known;                          // guarded by mu
    std::set<ibv_device **> lists;                               // guarded by mu: handed out
};

Devices &devices() {
    static auto *d = new Devices;  // outlives static destructors and atexit handlers
    return *d;
}

FaceDevice *faceDevice(const ibv_device *dev) {
    Devices &d = devices();
    std::lock_guard lock(d.mu);
    if (dev == nullptr || d.known.count(dev) == 0) {
        return nullptr;
    }
    return d.by_name.at(dev->name).get();
}

FaceDevice *deviceNamed(Devices &d, const std::string &name) {
    auto &slot = d.by_name[name];
    if (!slot) {
        slot = std::make_unique<FaceDevice>();
        FaceDevice &f = *slot;
        f.name = name;
        f.index = static_cast<int>(d.by_name.size()) - 1;
        // As libibverbs fills it from sysfs; the paths do not exist for a brokered device.
        snprintf(f.dev.name, sizeof(f.dev.name), "%s", name.c_str());
        snprintf(f.dev.dev_name, sizeof(f.dev.dev_name), "uverbs%d", f.index);
        snprintf(f.dev.dev_path, sizeof(f.dev.dev_path), "/sys/class/infiniband_verbs/uverbs%d", f.index);
        snprintf(f.dev.ibdev_path, sizeof(f.dev.ibdev_path), "/sys/class/infiniband/%s", name.c_str());
        f.dev.node_type = IBV_NODE_CA;
        f.dev.transport_type = IBV_TRANSPORT_IB;
        d.known.insert(&f.dev);
    }
    return slot.get();
}

// Turns a broker context into a face context: its device is the listed one, its async_fd the
// eventfd its events arrive on, and its verbs_context entries and ops are the face's.
void makeFaceContext(ShadowContext *c, FaceDevice *dev, int async_fd) {
    ibv_context &ctx = c->ctx;
    ctx.device = &dev->dev;
    ctx.async_fd = async_fd;
    ctx.num_comp_vectors = 1;
    ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
    c->vctx.sz = sizeof(c->vctx);
    c->vctx.query_port = faceQueryPort;
    c->vctx.query_device_ex = faceQueryDeviceEx;
    c->vctx.query_rt_values = faceQueryRtValues;
    c->vctx.create_cq_ex = faceCreateCqEx;
    c->vctx.create_qp_ex = faceCreateQpEx;
    c->vctx.open_xrcd = faceOpenXrcd;
    c->vctx.close_xrcd = faceCloseXrcd;
    c->vctx.create_srq_ex = faceCreateSrqEx;
    c->vctx.get_srq_num = faceGetSrqNum;
    c->vctx.open_qp = faceOpenQp;
    c->vctx.alloc_td = faceAllocTd;
    c->vctx.dealloc_td = faceDeallocTd;
    c->vctx.alloc_parent_domain = faceAllocParentDomain;
    serveMemoryWindows(c);
    c->vctx.alloc_dm = faceAllocDm;
    c->vctx.free_dm = faceFreeDm;
    c->vctx.reg_dm_mr = faceRegDmMr;
    serveDatapath(c);
    refuseUnserved(c);
    giveCmdFd(c);
}

// The device signals async events on the context's async_fd; a broker or driver without events
// leaves it silent (ibv_get_async_event then waits, as on a device with nothing to report).
void askForAsyncEvents(ShadowContext *c, const FaceDevice &dev) {
    pb::SetAsyncEventFdRequest req;
    req.set_context(c->handle);
    pb::SetAsyncEventFdResponse resp;
    if (int rc = c->session->callWithFd(
            "SetAsyncEventFd", &pb::Broker::Stub::SetAsyncEventFd, c->ctx.async_fd, req,
            [](pb::SetAsyncEventFdRequest *r, uint64_t x) { r->set_xfer_id(x); }, &resp);
        rc != 0) {
        warn("ibv_open_device: the broker raises no async events for %s (%s)", dev.name.c_str(),
             strerror(-rc));
    }
}

// What the program left on a context is destroyed before it closes, as the kernel frees it
// behind libibverbs' ibv_close_device (perftest, for one, closes with a CQ still open). In the
// order of ShadowKind. How many objects were left.
size_t destroyLeftovers(ShadowContext *c) {
    using broker::ShadowKind;
    size_t left = 0;
    dropDomains(c);  // no broker object behind them; their PDs can then go
    for (ShadowKind kind :
         {ShadowKind::kAh, ShadowKind::kQp, ShadowKind::kSrq, ShadowKind::kCq, ShadowKind::kMw,
          ShadowKind::kMr, ShadowKind::kDm, ShadowKind::kXrcd, ShadowKind::kPd}) {
        for (void *o : broker::shadowsOf(c, kind)) {
            ++left;
            switch (kind) {
                case ShadowKind::kAh:
                    (void)ibvx_verbs_destroy_ah(&static_cast<ShadowAh *>(o)->dp.ah);
                    break;
                case ShadowKind::kQp:
                    (void)ibvx_verbs_destroy_qp(&static_cast<ShadowQp *>(o)->qp);
                    break;
                case ShadowKind::kSrq:
                    (void)ibvx_verbs_destroy_srq(&static_cast<ShadowSrq *>(o)->srq);
                    break;
                case ShadowKind::kCq:
                    (void)ibvx_verbs_destroy_cq(&static_cast<ShadowCq *>(o)->cq);
                    break;
                case ShadowKind::kMw:
                    (void)broker::deallocMw(static_cast<broker::ShadowMw *>(o));
                    break;
                case ShadowKind::kMr:
                    (void)ibvx_verbs_dereg_mr(&static_cast<ShadowMr *>(o)->mr);
                    break;
                case ShadowKind::kDm:
                    (void)faceFreeDm(&static_cast<broker::ShadowDm *>(o)->dm);
                    break;
                case ShadowKind::kXrcd:
                    (void)faceCloseXrcd(&static_cast<ShadowXrcd *>(o)->xrcd);
                    break;
                case ShadowKind::kPd:
                    (void)ibvx_verbs_dealloc_pd(&static_cast<ShadowPd *>(o)->pd);
                    break;
            }
        }
    }
    return left;
}

}  // namespace
}  // namespace ibvx::client::verbs

using namespace ibvx::client;         // NOLINT: the broker seam's functions
using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

extern "C" {

ibv_device **ibvx_verbs_get_device_list(int *num_devices) {
    broker::Session *s = nullptr;
    if (int rc = broker::currentSession(&s); rc != 0) {
        warn("ibv_get_device_list: no broker session (%s)", strerror(-rc));
        return failNull<ibv_device *>(-rc);
    }
    pb::ListDevicesResponse resp;
    if (int rc = s->call("ListDevices", &pb::Broker::Stub::ListDevices, pb::ListDevicesRequest{}, &resp);
        rc != 0) {
        return failNull<ibv_device *>(-rc);
    }
    const int n = resp.devices_size();
    auto **list = static_cast<ibv_device **>(calloc(static_cast<size_t>(n) + 1, sizeof(ibv_device *)));
    if (list == nullptr) {
        return failNull<ibv_device *>(ENOMEM);
    }
    Devices &d = devices();
    std::lock_guard lock(d.mu);
    for (int i = 0; i < n; ++i) {
        list[i] = &deviceNamed(d, resp.devices(i).name())->dev;
    }
    d.lists.insert(list);
    if (num_devices != nullptr) {
        *num_devices = n;
    }
    return list;
}

void ibvx_verbs_free_device_list(ibv_device **list) {
    Devices &d = devices();
    {
        std::lock_guard lock(d.mu);
        if (list == nullptr || d.lists.erase(list) == 0) {
            warn("ibv_free_device_list: %p is not a list ibv_get_device_list() returned; ignored",
                 static_cast<void *>(list));
            return;
        }
    }
    free(list);
}

const char *ibvx_verbs_get_device_name(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    return f != nullptr ? f->dev.name : failNull<const char>(EINVAL);
}

__be64 ibvx_verbs_get_device_guid(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        errno = EINVAL;
        return 0;
    }
    {
        std::lock_guard lock(devices().mu);
        if (f->guid_known) {
            return htobe64(f->guid);
        }
    }
    // The GUID is a device attribute: asked once, on a context opened for the purpose.
    ibv_context_extend *ext = brokerOpenByName(f->name.c_str());
    if (ext == nullptr) {
        return 0;
    }
    ibv_device_attr attr{};
    int rc = queryDeviceAttr(faceContext(ext->context), &attr);
    (void)brokerCloseDevice(ext);
    if (rc != 0) {
        errno = -rc;
        return 0;
    }
    std::lock_guard lock(devices().mu);
    f->guid = be64toh(attr.node_guid);
    f->guid_known = true;
    return attr.node_guid;
}

int ibvx_verbs_get_device_index(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        errno = EINVAL;
        return -1;
    }
    return f->index;
}

ibv_context *ibvx_verbs_open_device(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        warn("ibv_open_device: %p is not a device of ibv_get_device_list()", static_cast<void *>(device));
        return failNull<ibv_context>(EINVAL);
    }
    // async_fd: blocking, as libibverbs' (programs set O_NONBLOCK themselves).
    int async_fd = eventfd(0, EFD_CLOEXEC);
    if (async_fd < 0) {
        return nullptr;
    }
    ibv_context_extend *ext = brokerOpenByName(f->name.c_str());
    if (ext == nullptr) {
        int err = errno;
        close(async_fd);
        return failNull<ibv_context>(err);
    }
    ShadowContext *c = faceContext(ext->context);
    makeFaceContext(c, f, async_fd);
    followSessionEnd(c);
    askForAsyncEvents(c, *f);
    return &c->ctx;
}

int ibvx_verbs_close_device(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr) {
        errno = EINVAL;
        return -1;
    }
    if (releaseImport(c)) {
        return 0;  // an ibv_import_device() result: the context stays for its other holders
    }
    unfollowSessionEnd(c);
    if (size_t left = destroyLeftovers(c); left != 0) {
        warn("ibv_close_device: destroyed %zu object(s) the program left on the context", left);
    }
    int async_fd = c->ctx.async_fd;
    int cmd_fd = c->ctx.cmd_fd;
    forgetCmdFd(c);
    int rc = brokerCloseDevice(&c->ext);
    if (rc != 0 && faceContext(context) == c) {  // refused: the context lives on
        followSessionEnd(c);
        giveBackCmdFd(c);
    } else if (rc != 0 && cmd_fd >= 0) {
        close(cmd_fd);  // the context went all the same (its session had ended): c is freed
    }
    if (rc != 0) {
        errno = -rc;
        return -1;
    }
    if (async_fd >= 0) {
        close(async_fd);
    }
    if (cmd_fd >= 0) {
        close(cmd_fd);
    }
    return 0;
}

}  // extern "C"
