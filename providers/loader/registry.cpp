// The registry behind verbs_register_driver_extend() / verbs_register_vdev_extend() and the
// lazy discovery that fills it. Locking is described in loader.h.
#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/warn.h"
#include "providers/loader/device_match.h"
#include "providers/loader/discovery.h"
#include "providers/loader/loader.h"

namespace ibvx::loader {
namespace {

struct Registry {
    std::mutex mu;  // guards drivers, vdevs, guarantees and records
    std::vector<const verbs_device_extend_ops *> drivers;
    std::vector<const ibv_extend_vdev_ops *> vdevs;
    // PROVIDER_EXTEND_GUARANTEES declarations, by driver table (a vdev provider's are in its table).
    std::vector<std::pair<const verbs_device_extend_ops *, uint32_t>> guarantees;
    std::vector<LoadRecord> records;

    std::mutex discovery_mu;              // serialises discovery; taken before mu, never after
    std::atomic<bool> discovered{false};  // written under discovery_mu
};

// Never destroyed: drivers may register from constructors before us and call in from
// destructors after us; a leaked singleton has no order to get wrong.
Registry &registry() {
    static Registry *r = new Registry;
    return *r;
}

// Drivers do not link libibv_extend; their verbs_register_* references resolve from the global
// scope. When this code lives in a shared object that was dlopen()ed RTLD_LOCAL, promote it to
// RTLD_GLOBAL before loading drivers so those references can bind here.
void exportRegistrationSymbols() {
    Dl_info self;
    if (dladdr(reinterpret_cast<void *>(&verbs_register_driver_extend), &self) == 0 ||
        self.dli_fname == nullptr || self.dli_fname[0] != '/') {
        return;
    }
    if (void *h = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL)) {
        dlclose(h);
    }
}

void discover() {
    std::vector<detail::ConfigName> config = detail::readConfigDir(detail::configDir());
    std::vector<std::pair<std::string, std::string>> wanted;  // name, source
    if (detail::environmentTrusted()) {
        if (const char *env = getenv("IBV_EXTEND_DRIVERS")) {
            for (std::string &name : detail::splitDriverList(env)) {
                wanted.emplace_back(std::move(name), "env");
            }
        }
    }
    for (detail::ConfigName &c : config) {
        wanted.emplace_back(std::move(c.name), std::move(c.source));
    }
    if (!wanted.empty()) {
        exportRegistrationSymbols();
    }
    for (const auto &[name, source] : wanted) {
        LoadRecord rec = detail::loadDriverLibrary(name, source);
        std::lock_guard lock(registry().mu);
        registry().records.push_back(std::move(rec));
    }
}

void ensureDiscovered() {
    Registry &r = registry();
    if (r.discovered.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard lock(r.discovery_mu);
    if (!r.discovered.load(std::memory_order_relaxed)) {
        discover();
        r.discovered.store(true, std::memory_order_release);
    }
}

std::string libraryOf(const void *p) {
    Dl_info info;
    if (dladdr(p, &info) != 0 && info.dli_fname != nullptr) {
        return info.dli_fname;
    }
    return {};
}

}  // namespace

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vwarn("", fmt, ap);
    va_end(ap);
}

const verbs_device_extend_ops *findDriverByName(std::string_view name) {
    Registry &r = registry();
    std::lock_guard lock(r.mu);
    for (const verbs_device_extend_ops *d : r.drivers) {
        if (name == d->name) {
            return d;
        }
    }
    return nullptr;
}

uint32_t driverGuarantees(const verbs_device_extend_ops *driver) {
    if (driver == nullptr || driver->name == nullptr) {
        return 0;
    }
    Registry &r = registry();
    std::lock_guard lock(r.mu);
    uint32_t bits = 0;
    for (const auto &[d, declared] : r.guarantees) {
        if (d == driver) {
            bits |= declared;
            break;
        }
    }
    for (const ibv_extend_vdev_ops *v : r.vdevs) {
        if (v->abi >= IBV_EXTEND_VDEV_ABI_V5 && strcmp(v->provider, driver->name) == 0) {
            bits |= v->guarantees;
        }
    }
    return bits;
}

const ibv_extend_vdev_ops *findVdevProvider(const ibv_device *dev) {
    if (dev == nullptr) {
        return nullptr;
    }
    // Asked outside the lock: is_own_device is driver code.
    for (const ibv_extend_vdev_ops *v : vdevProviders()) {
        if (v->is_own_device != nullptr && v->is_own_device(dev) != 0) {
            return v;
        }
    }
    return nullptr;
}

std::string providerName(const ibv_device *dev) {
    if (dev == nullptr) {
        return {};
    }
    // Virtual devices first: they are not rdma-core devices and the layout view would read
    // memory that is not there.
    if (const ibv_extend_vdev_ops *v = findVdevProvider(dev)) {
        return v->provider;
    }
    std::string name = detail::layoutProviderName(dev);
    if (name.empty()) {
        name = detail::sysfsProviderName(dev, "/sys");
    }
    return name;
}

const verbs_device_extend_ops *findDriver(const ibv_device *dev) {
    if (dev == nullptr) {
        return nullptr;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
        std::string name = providerName(dev);
        if (!name.empty()) {
            if (const verbs_device_extend_ops *d = findDriverByName(name)) {
                return d;
            }
        }
        if (registry().discovered.load(std::memory_order_acquire)) {
            return nullptr;
        }
        ensureDiscovered();
    }
    return nullptr;
}

void loadAll() {
    ensureDiscovered();
}

bool discovered() {
    return registry().discovered.load(std::memory_order_acquire);
}

std::vector<LoadRecord> loadRecords() {
    std::lock_guard lock(registry().mu);
    return registry().records;
}

std::vector<DriverInfo> drivers() {
    std::vector<const verbs_device_extend_ops *> ops;
    {
        std::lock_guard lock(registry().mu);
        ops = registry().drivers;
    }
    std::vector<DriverInfo> out;
    for (const verbs_device_extend_ops *d : ops) {
        out.push_back({d->name, d, libraryOf(d)});
    }
    return out;
}

std::vector<const ibv_extend_vdev_ops *> vdevProviders() {
    std::lock_guard lock(registry().mu);
    return registry().vdevs;
}

std::vector<VdevDevice> queryDevices() {
    ensureDiscovered();
    std::vector<VdevDevice> out;
    for (const ibv_extend_vdev_ops *v : vdevProviders()) {
        if (v->query_devices == nullptr) {
            continue;
        }
        std::vector<ibv_extend_vdev_attr> attrs(8);
        int n = v->query_devices(attrs.data(), static_cast<int>(attrs.size()));
        if (n > static_cast<int>(attrs.size())) {
            attrs.resize(static_cast<size_t>(n));
            n = v->query_devices(attrs.data(), static_cast<int>(attrs.size()));
        }
        if (n < 0) {
            warn("provider %s: query_devices failed: %s", v->provider, strerror(-n));
            continue;
        }
        for (int i = 0; i < n && i < static_cast<int>(attrs.size()); ++i) {
            attrs[i].name[IBV_EXTEND_VDEV_NAME_MAX - 1] = '\0';
            out.push_back({v, attrs[i]});
        }
    }
    return out;
}

int openVdev(std::string_view name, OpenedVdev *out) {
    if (out == nullptr || name.empty() || name.size() >= IBV_EXTEND_VDEV_NAME_MAX) {
        return -EINVAL;
    }
    std::string wanted(name);
    for (const VdevDevice &d : queryDevices()) {
        if (wanted != d.attr.name) {
            continue;
        }
        if (d.provider->open_device == nullptr) {
            return -EOPNOTSUPP;
        }
        errno = 0;
        ibv_context *ctx = d.provider->open_device(wanted.c_str());
        if (ctx == nullptr) {
            return errno != 0 ? -errno : -EIO;
        }
        *out = {d.provider, ctx};
        return 0;
    }
    return -ENODEV;
}

}  // namespace ibvx::loader

extern "C" {

void verbs_register_driver_extend(const struct verbs_device_extend_ops *ops) {
    using ibvx::loader::warn;
    if (ops == nullptr) {
        warn("verbs_register_driver_extend: NULL ops; registration ignored");
        return;
    }
    if (ops->name == nullptr) {
        warn("verbs_register_driver_extend: ops without a name; registration ignored");
        return;
    }
    auto &r = ibvx::loader::registry();
    std::lock_guard lock(r.mu);
    for (const verbs_device_extend_ops *d : r.drivers) {
        if (d == ops || strcmp(d->name, ops->name) == 0) {
            warn("driver '%s' is already registered; second registration ignored", ops->name);
            return;
        }
    }
    r.drivers.push_back(ops);
}

void verbs_declare_guarantees_extend(const struct verbs_device_extend_ops *drv, uint32_t guarantees) {
    using ibvx::loader::warn;
    if (drv == nullptr) {
        warn("verbs_declare_guarantees_extend: NULL driver; declaration ignored");
        return;
    }
    auto &r = ibvx::loader::registry();
    std::lock_guard lock(r.mu);
    for (const auto &[d, declared] : r.guarantees) {
        if (d == drv) {
            warn("driver '%s' declared its guarantees already; second declaration ignored",
                 drv->name != nullptr ? drv->name : "(unnamed)");
            return;
        }
    }
    r.guarantees.emplace_back(drv, guarantees);
}

void verbs_register_vdev_extend(const struct ibv_extend_vdev_ops *ops) {
    using ibvx::loader::warn;
    if (ops == nullptr) {
        warn("verbs_register_vdev_extend: NULL ops; registration ignored");
        return;
    }
    if (ops->provider == nullptr) {
        warn("verbs_register_vdev_extend: ops without a provider name; registration ignored");
        return;
    }
    if (ops->abi < IBV_EXTEND_VDEV_ABI_V1 || ops->abi > IBV_EXTEND_VDEV_ABI_MAX) {
        warn("virtual-device provider '%s' has ABI %u, expected %d..%d; registration ignored", ops->provider,
             ops->abi, IBV_EXTEND_VDEV_ABI_V1, IBV_EXTEND_VDEV_ABI_MAX);
        return;
    }
    auto &r = ibvx::loader::registry();
    std::lock_guard lock(r.mu);
    for (const ibv_extend_vdev_ops *v : r.vdevs) {
        if (v == ops || strcmp(v->provider, ops->provider) == 0) {
            warn("virtual-device provider '%s' is already registered; second registration ignored",
                 ops->provider);
            return;
        }
    }
    r.vdevs.push_back(ops);
}

}  // extern "C"
