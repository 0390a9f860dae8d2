#include "daemon/core/device.h"

#include <cerrno>
#include <cstring>

#include "common/device_limits.h"
#include "providers/loader/loader.h"

namespace ibvx::daemon {
namespace {

// What the driver announces about a device, learned by opening one extension context.
void fillExtendCaps(Device &dev, ibv_context *ctx) {
    if (dev.driver == nullptr || dev.driver->alloc_context == nullptr) {
        return;
    }
    ibv_context_extend *ext = dev.driver->alloc_context(ctx);
    if (ext == nullptr) {
        return;
    }
    if (ext->ops != nullptr) {
        dev.info.driver_version = static_cast<uint32_t>(ext->ops->version);
        if (ext->ops->query_device != nullptr) {
            ibv_device_attr_extend attr{};
            if (ext->ops->query_device(ctx, &attr) == 0) {
                dev.info.ext_cap = attr.ext_cap;
            }
        }
    }
    if (dev.driver->free_context != nullptr) {
        dev.driver->free_context(ext);
    }
}

}  // namespace

bool threadSafeAcrossContexts(const verbs_device_extend_ops *driver) {
    return (loader::driverGuarantees(driver) & IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS) != 0;
}

bool plainInit(const verbs_device_extend_ops *driver) {
    return (loader::driverGuarantees(driver) & IBV_EXTEND_GUARANTEE_PLAIN_INIT) != 0;
}

DeviceRegistry::~DeviceRegistry() {
    for (ibv_device **list : verbs_lists_) {
        ibv_free_device_list(list);
    }
}

int DeviceRegistry::scan() {
    std::lock_guard lock(mu_);
    size_t before = devices_.size();
    addVirtual();
    addVerbs();
    return static_cast<int>(devices_.size() - before);
}

void DeviceRegistry::addVirtual() {
    for (const loader::VdevDevice &d : loader::queryDevices()) {
        std::string name = d.attr.name;
        bool known = false;
        for (auto &dev : devices_) {
            known = known || dev->info.name == name;
        }
        if (known) {
            continue;
        }
        auto dev = std::make_unique<Device>();
        dev->verbs = loader::DeviceVerbs::forVirtual(d.provider, name);
        dev->driver = loader::findDriverByName(d.provider->provider);
        dev->serialize_calls = !threadSafeAcrossContexts(dev->driver);
        DeviceInfo &i = dev->info;
        i.name = name;
        i.provider = d.provider->provider;
        i.virtual_device = true;
        i.plain_init = plainInit(dev->driver);
        copyDeviceLimits(d.attr, i);
        if (d.provider->abi >= IBV_EXTEND_VDEV_ABI_V10) {
            i.max_dm_size = d.attr.max_dm_size;
        }
        if (dev->driver == nullptr || d.provider->open_device == nullptr) {
            continue;  // a device nobody can open is not worth listing
        }
        if (ibv_context *ctx = dev->verbs.openDevice()) {
            fillExtendCaps(*dev, ctx);
            (void)dev->verbs.closeDevice(ctx);
        }
        devices_.push_back(std::move(dev));
    }
}

void DeviceRegistry::addVerbs() {
    int count = 0;
    // NULL (errno ENOSYS) on a kernel without RDMA; ibv_free_device_list(NULL) would crash.
    ibv_device **list = ibv_get_device_list(&count);
    if (list == nullptr) {
        return;
    }
    bool used = false;
    for (int i = 0; i < count; ++i) {
        ibv_device *vd = list[i];
        std::string name = ibv_get_device_name(vd);
        bool known = false;
        for (auto &dev : devices_) {
            known = known || dev->info.name == name;
        }
        const verbs_device_extend_ops *drv = known ? nullptr : loader::findDriver(vd);
        if (drv == nullptr) {
            continue;
        }
        auto dev = std::make_unique<Device>();
        dev->verbs = loader::DeviceVerbs::forVerbs(vd);
        dev->driver = drv;
        dev->serialize_calls = !threadSafeAcrossContexts(drv);
        dev->info.name = name;
        dev->info.provider = drv->name;
        if (ibv_context *ctx = dev->verbs.openDevice()) {
            ibv_device_attr attr{};
            if (ibv_query_device(ctx, &attr) == 0) {
                copyDeviceLimits(attr, dev->info);
            }
            fillExtendCaps(*dev, ctx);
            (void)dev->verbs.closeDevice(ctx);
        }
        devices_.push_back(std::move(dev));
        used = true;
    }
    if (used) {
        verbs_lists_.push_back(list);
    } else {
        ibv_free_device_list(list);
    }
}

Device *DeviceRegistry::find(const std::string &name) {
    std::lock_guard lock(mu_);
    for (auto &dev : devices_) {
        if (dev->info.name == name) {
            return dev.get();
        }
    }
    return nullptr;
}

std::vector<DeviceInfo> DeviceRegistry::list() {
    std::lock_guard lock(mu_);
    std::vector<DeviceInfo> out;
    for (auto &dev : devices_) {
        out.push_back(dev->info);
    }
    return out;
}

size_t DeviceRegistry::size() {
    std::lock_guard lock(mu_);
    return devices_.size();
}

}  // namespace ibvx::daemon
