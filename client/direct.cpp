// The ibv_extend_broker.h functions: devices, PDs, MRs and QP state. Each one sends a
// broker-owned object to the broker seam; otherwise (direct mode, in-process) to the device's
// verbs table (providers/loader/device_verbs.h): a virtual device's provider or libibverbs,
// decided once per device.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "client/broker_seam.h"
#include "common/c_abi.h"
#include "common/device_limits.h"
#include "providers/loader/device_verbs.h"
#include "providers/loader/loader.h"

using ibvx::failNull;
using ibvx::loader::deviceVerbsFor;

namespace ibvx::client {
namespace {

// ibvx_reg_mr_fd() in direct mode maps the fd; the mapping goes away with the MR.
struct FdMapping {
    void *base = nullptr;
    size_t size = 0;
};

struct DirectState {
    std::mutex mu;  // guards opened and fd_mrs
    // Extension contexts ibvx_open_device() made, with the device context it opened for them.
    std::map<const ibv_context_extend *, ibv_context *> opened;
    std::map<const ibv_mr *, FdMapping> fd_mrs;
};

DirectState &state() {
    static DirectState *s = new DirectState;  // never destroyed: may be used from atexit handlers
    return *s;
}

void copyName(char (&dst)[IBVX_DEVICE_NAME_MAX], const char *src) {
    snprintf(dst, sizeof(dst), "%s", src != nullptr ? src : "");
}

// Opens ctx's extension context long enough to learn what the driver announces. Listing is not
// a hot path; a device that cannot be opened right now keeps zeros.
void fillExtendCaps(ibv_context *ctx, ibvx_device_info *info) {
    ibv_context_extend *ext = ibv_open_extend(ctx);
    if (ext == nullptr) {
        return;
    }
    info->driver_version = static_cast<uint32_t>(ext->ops->version);
    ibv_device_attr_extend attr{};
    if (ibv_query_device_extend(ext, &attr) == 0) {
        info->ext_cap = attr.ext_cap;
    }
    ibv_close_extend(ext);
}

ibvx_device_info vdevInfo(const loader::VdevDevice &d) {
    ibvx_device_info info{};
    copyName(info.name, d.attr.name);
    copyName(info.provider, d.provider->provider);
    copyDeviceLimits(d.attr, info);
    loader::DeviceVerbs verbs = loader::DeviceVerbs::forVirtual(d.provider, d.attr.name);
    if (ibv_context *ctx = verbs.openDevice()) {
        fillExtendCaps(ctx, &info);
        (void)verbs.closeDevice(ctx);
    }
    return info;
}

ibvx_device_info verbsInfo(ibv_device *dev) {
    ibvx_device_info info{};
    copyName(info.name, ibv_get_device_name(dev));
    if (const verbs_device_extend_ops *drv = loader::findDriver(dev)) {
        copyName(info.provider, drv->name);
    }
    loader::DeviceVerbs verbs = loader::DeviceVerbs::forVerbs(dev);
    if (ibv_context *ctx = verbs.openDevice()) {
        ibv_device_attr attr{};
        if (ibv_query_device(ctx, &attr) == 0) {
            copyDeviceLimits(attr, info);
        }
        if (info.provider[0] != '\0') {
            fillExtendCaps(ctx, &info);
        }
        (void)verbs.closeDevice(ctx);
    }
    return info;
}

// ibv_get_device_list() answers NULL (ENOSYS) on a kernel without RDMA, and
// ibv_free_device_list(NULL) would crash: this wrapper makes "no devices" an empty list.
class VerbsDeviceList {
  public:
    VerbsDeviceList() { list_ = ibv_get_device_list(&count_); }
    VerbsDeviceList(const VerbsDeviceList &) = delete;
    VerbsDeviceList &operator=(const VerbsDeviceList &) = delete;
    ~VerbsDeviceList() {
        if (list_ != nullptr) {
            ibv_free_device_list(list_);
        }
    }
    ibv_device *const *begin() const { return list_; }
    ibv_device *const *end() const { return list_ != nullptr ? list_ + count_ : nullptr; }

  private:
    ibv_device **list_ = nullptr;
    int count_ = 0;
};

// The extension context on a device context ibvx_open_device() opened through verbs; on
// failure the device context is closed the same way.
ibv_context_extend *openExtendOn(const loader::DeviceVerbs &verbs, ibv_context *ctx) {
    ibv_context_extend *ext = ibv_open_extend(ctx);
    if (ext == nullptr) {
        int err = errno;
        (void)verbs.closeDevice(ctx);
        return failNull<ibv_context_extend>(err != 0 ? err : EOPNOTSUPP);
    }
    std::lock_guard lock(state().mu);
    state().opened[ext] = ctx;
    return ext;
}

ibv_context_extend *openDirect(const char *name) {
    loader::OpenedVdev vdev;
    int rc = loader::openVdev(name, &vdev);
    if (rc == 0) {
        return openExtendOn(loader::DeviceVerbs::forVirtual(vdev.provider, name), vdev.context);
    }
    if (rc != -ENODEV) {
        return failNull<ibv_context_extend>(-rc);
    }
    for (ibv_device *dev : VerbsDeviceList()) {
        if (strcmp(ibv_get_device_name(dev), name) != 0) {
            continue;
        }
        loader::DeviceVerbs verbs = loader::DeviceVerbs::forVerbs(dev);
        ibv_context *ctx = verbs.openDevice();
        if (ctx == nullptr) {
            return nullptr;
        }
        return openExtendOn(verbs, ctx);
    }
    loader::warn("no device named '%s' (neither a virtual device nor an rdma-core device)", name);
    return failNull<ibv_context_extend>(ENODEV);
}

}  // namespace
}  // namespace ibvx::client

using namespace ibvx::client;
namespace loader = ibvx::loader;

extern "C" {

const char *ibvx_mode(void) {
    return brokerModeActive() ? "broker" : "direct";
}

int ibvx_list_devices(struct ibvx_device_info *devices, int max) {
    if (max < 0 || (devices == nullptr && max > 0)) {
        return -EINVAL;
    }
    if (brokerModeActive()) {
        return brokerListDevices(devices, max);
    }
    std::vector<ibvx_device_info> all;
    for (const loader::VdevDevice &d : loader::queryDevices()) {
        all.push_back(vdevInfo(d));
    }
    for (ibv_device *dev : VerbsDeviceList()) {
        all.push_back(verbsInfo(dev));
    }
    std::copy_n(all.begin(), std::min(all.size(), static_cast<size_t>(max)), devices);
    return static_cast<int>(all.size());
}

struct ibv_context_extend *ibvx_open_device(const char *name) {
    if (name == nullptr || name[0] == '\0') {
        return failNull<ibv_context_extend>(EINVAL);
    }
    if (brokerModeActive()) {
        return brokerOpenByName(name);
    }
    return openDirect(name);
}

int ibvx_close_device(struct ibv_context_extend *context) {
    if (context == nullptr) {
        return -EINVAL;
    }
    // Our own registry first: it needs no dereference of what the caller passed.
    ibv_context *device_context = nullptr;
    {
        std::lock_guard lock(state().mu);
        auto it = state().opened.find(context);
        if (it != state().opened.end()) {
            device_context = it->second;
            state().opened.erase(it);
        }
    }
    if (device_context == nullptr) {
        if (context->context != nullptr && brokerOwns(context->context)) {
            return brokerCloseDevice(context);
        }
        return -EINVAL;  // not from ibvx_open_device(): the caller owns its ibv_context
    }
    int rc = ibv_close_extend(context);
    int close_rc = deviceVerbsFor(device_context->device).closeDevice(device_context);
    return rc != 0 ? rc : close_rc;
}

struct ibv_pd *ibvx_alloc_pd(struct ibv_context_extend *context) {
    if (context == nullptr || context->context == nullptr) {
        return failNull<ibv_pd>(EINVAL);
    }
    if (brokerOwns(context->context)) {
        return brokerAllocPd(context);
    }
    return deviceVerbsFor(context->context->device).allocPd(context->context);
}

int ibvx_dealloc_pd(struct ibv_pd *pd) {
    if (pd == nullptr || pd->context == nullptr) {
        return -EINVAL;
    }
    if (brokerOwns(pd->context)) {
        return brokerDeallocPd(pd);
    }
    return deviceVerbsFor(pd->context->device).deallocPd(pd);
}

struct ibv_mr *ibvx_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
    if (pd == nullptr || pd->context == nullptr || addr == nullptr || length == 0) {
        return failNull<ibv_mr>(EINVAL);
    }
    if (brokerOwns(pd->context)) {
        return brokerRegMr(pd, addr, length, access);
    }
    // In-process, the memory is addressed where this process sees it.
    return deviceVerbsFor(pd->context->device)
        .regMr(pd, addr, length, reinterpret_cast<uintptr_t>(addr), access);
}

struct ibv_mr *ibvx_reg_mr_fd(struct ibv_pd *pd, int fd, uint64_t offset, size_t length, int access) {
    if (pd == nullptr || pd->context == nullptr || fd < 0 || length == 0) {
        return failNull<ibv_mr>(EINVAL);
    }
    if (brokerOwns(pd->context)) {
        return brokerRegMrFd(pd, fd, offset, length, access);
    }
    // Direct mode: the memory is registered where this process sees it.
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t delta = offset % page;
    if (length > SIZE_MAX - delta) {
        return failNull<ibv_mr>(EINVAL);
    }
    const size_t map_size = length + delta;
    void *base =
        mmap(nullptr, map_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset - delta));
    if (base == MAP_FAILED) {
        return nullptr;
    }
    ibv_mr *mr = ibvx_reg_mr(pd, static_cast<char *>(base) + delta, length, access);
    if (mr == nullptr) {
        int err = errno;
        munmap(base, map_size);
        return failNull<ibv_mr>(err);
    }
    std::lock_guard lock(state().mu);
    state().fd_mrs[mr] = {base, map_size};
    return mr;
}

int ibvx_dereg_mr(struct ibv_mr *mr) {
    if (mr == nullptr || mr->context == nullptr) {
        return -EINVAL;
    }
    if (brokerOwns(mr->context)) {
        return brokerDeregMr(mr);
    }
    FdMapping mapping;
    {
        std::lock_guard lock(state().mu);
        auto it = state().fd_mrs.find(mr);
        if (it != state().fd_mrs.end()) {
            mapping = it->second;
        }
    }
    int rc = deviceVerbsFor(mr->context->device).deregMr(mr);
    if (rc == 0 && mapping.base != nullptr) {
        {
            std::lock_guard lock(state().mu);
            state().fd_mrs.erase(mr);
        }
        munmap(mapping.base, mapping.size);
    }
    return rc;
}

int ibvx_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
    if (qp == nullptr || qp->context == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    if (brokerOwns(qp->context)) {
        return brokerModifyQp(qp, attr, attr_mask);
    }
    return deviceVerbsFor(qp->context->device).modifyQp(qp, attr, attr_mask);
}

int ibvx_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                  struct ibv_qp_init_attr *init_attr) {
    if (qp == nullptr || qp->context == nullptr || attr == nullptr || init_attr == nullptr) {
        return -EINVAL;
    }
    if (brokerOwns(qp->context)) {
        return brokerQueryQp(qp, attr, attr_mask, init_attr);
    }
    return deviceVerbsFor(qp->context->device).queryQp(qp, attr, attr_mask, init_attr);
}

}  // extern "C"
