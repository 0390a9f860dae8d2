#include "providers/loader/device_match.h"

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <string_view>

namespace ibvx::loader::detail {
namespace {

// The layout view is only as good as these two facts about rdma-core's struct verbs_device.
static_assert(offsetof(VerbsDeviceView, device) == 0, "struct verbs_device starts with struct ibv_device");
static_assert(offsetof(VerbsDeviceView, ops) == sizeof(ibv_device), "the ops pointer follows ibv_device");
static_assert(offsetof(VerbsDeviceOpsView, name) == 0, "name is the first member of verbs_device_ops");

// Provider names are short identifiers (rdma-core's VERBS_NAME_MAX is far below this).
constexpr size_t kProviderNameMax = 64;

bool insideLoadedObject(const void *p) {
    Dl_info info;
    return p != nullptr && dladdr(p, &info) != 0;
}

bool looksLikeProviderName(const char *name) {
    size_t n = strnlen(name, kProviderNameMax);
    if (n == 0 || n == kProviderNameMax) {
        return false;
    }
    for (size_t i = 0; i < n; ++i) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                  c == '-';
        if (!ok) {
            return false;
        }
    }
    return true;
}

std::string driverLinkName(const std::string &device_dir) {
    char target[PATH_MAX];
    std::string link = device_dir + "/device/driver";
    ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) {
        return {};
    }
    std::string_view t(target, static_cast<size_t>(n));
    size_t slash = t.rfind('/');
    return std::string(slash == std::string_view::npos ? t : t.substr(slash + 1));
}

// Both names are fixed-size arrays filled by libibverbs; never trust them to be terminated or to
// be a single path component.
std::string sysfsComponent(const char *field, size_t size) {
    std::string s(field, strnlen(field, size));
    if (s.empty() || s.find('/') != std::string::npos || s == "." || s == "..") {
        return {};
    }
    return s;
}

}  // namespace

std::string layoutProviderName(const ibv_device *dev) {
    if (dev == nullptr) {
        return {};
    }
    const auto *view = reinterpret_cast<const VerbsDeviceView *>(dev);
    // A device that did not come from a provider (or a libibverbs whose private layout moved)
    // would make these pointers garbage; dladdr() tells us without dereferencing them whether
    // they point into a loaded library's image, where provider ops tables and their names live.
    const VerbsDeviceOpsView *ops = view->ops;
    if (!insideLoadedObject(ops) || !insideLoadedObject(ops->name) || !looksLikeProviderName(ops->name)) {
        return {};
    }
    return ops->name;
}

std::string providerFromKernelDriver(const std::string &kernel_driver) {
    struct Known {
        const char *kernel;
        const char *provider;
    };
    // Kernel drivers whose name is not simply the provider name (rdma-core's provider names).
    static constexpr Known kKnown[] = {
        {"mlx5_core", "mlx5"},  {"mlx4_core", "mlx4"}, {"hns_roce_hw_v2", "hns"}, {"hns3", "hns"},
        {"bnxt_en", "bnxt_re"}, {"rdma_rxe", "rxe"},   {"qede", "qedr"},          {"iw_cxgb4", "cxgb4"},
    };
    for (const Known &k : kKnown) {
        if (kernel_driver == k.kernel) {
            return k.provider;
        }
    }
    constexpr std::string_view kCore = "_core";
    if (kernel_driver.size() > kCore.size() && kernel_driver.ends_with(kCore)) {
        return kernel_driver.substr(0, kernel_driver.size() - kCore.size());
    }
    return kernel_driver;
}

std::string sysfsProviderName(const ibv_device *dev, const std::string &sysfs_root) {
    if (dev == nullptr) {
        return {};
    }
    std::string driver;
    std::string uverbs = sysfsComponent(dev->dev_name, sizeof(dev->dev_name));
    if (!uverbs.empty()) {
        driver = driverLinkName(sysfs_root + "/class/infiniband_verbs/" + uverbs);
    }
    std::string ibdev = sysfsComponent(dev->name, sizeof(dev->name));
    if (driver.empty() && !ibdev.empty()) {
        driver = driverLinkName(sysfs_root + "/class/infiniband/" + ibdev);
    }
    return driver.empty() ? std::string{} : providerFromKernelDriver(driver);
}

}  // namespace ibvx::loader::detail
