// Which rdma-core provider ("mlx5", "rxe", ...) an ibv_device belongs to.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace ibvx::loader::detail {

// The reference reads verbs_get_device(dev)->ops->name, but Debian does not install rdma-core's
// infiniband/driver.h, which defines those structs. rdma-core's private ABI has kept this
// leading layout since 2017 (rdma-core 15): struct verbs_device starts with the public
// struct ibv_device followed by `const struct verbs_device_ops *ops`, and `name` is the first
// member of verbs_device_ops. We view exactly those members and nothing more.
struct VerbsDeviceOpsView {
    const char *name;
};
struct VerbsDeviceView {
    ibv_device device;
    const VerbsDeviceOpsView *ops;
};

// The provider name through the layout view, or "" when the view cannot be trusted: the ops
// pointer and the name must both lie inside a loaded object (a provider's static ops table),
// and the name must look like a provider name. Only call this for devices that came from
// libibverbs (or a fake with the same leading layout): it reads past struct ibv_device.
std::string layoutProviderName(const ibv_device *dev);

// The provider name from sysfs under sysfs_root ("/sys" in production): the kernel driver of
// infiniband_verbs/<dev_name>/device (else infiniband/<name>/device), mapped to the rdma-core
// provider name ("mlx5_core" -> "mlx5"). "" when sysfs has no answer.
std::string sysfsProviderName(const ibv_device *dev, const std::string &sysfs_root);

// Kernel driver name -> rdma-core provider name (identity for names it does not know, minus a
// trailing "_core").
std::string providerFromKernelDriver(const std::string &kernel_driver);

}  // namespace ibvx::loader::detail
