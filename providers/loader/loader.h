// Extension-driver loader and registry: the reference's discovery rules (config dir, then
// IBV_EXTEND_DRIVERS, then the config names), the driver registry behind
// verbs_register_driver_extend(), and the virtual-device providers behind
// verbs_register_vdev_extend(). Shared by libibv_extend.so (direct mode) and the broker daemon.
//
// Threading: every function here may be called from any thread.
//  - The registry lock guards the lists of registered drivers, vdev providers, declared
//    guarantees and load records.
//    It is held only for short list operations, never while calling into a driver.
//  - The discovery lock serialises discovery (reading the config dir, dlopen of drivers). It is
//    held across dlopen(), and a driver's constructor calls verbs_register_*() from inside that
//    dlopen(), which takes the registry lock: order is always discovery -> registry.
// Drivers are never unloaded, so ops pointers handed out stay valid for the process lifetime.
//
// Anything that dlopens drivers must export verbs_register_driver_extend,
// verbs_register_vdev_extend and verbs_declare_guarantees_extend from the process (drivers do
// not link libibv_extend): linking the ibvx_loader target arranges that for executables
// automatically.
#pragma once

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include <string>
#include <string_view>
#include <vector>

namespace ibvx::loader {

// One library discovery tried to load (from the config dir or IBV_EXTEND_DRIVERS).
struct LoadRecord {
    std::string name;    // as written in the config file or the environment
    std::string source;  // "env" or the config file path
    std::string path;    // what was passed to dlopen() last (empty when the name was rejected)
    bool loaded = false;
    std::string error;  // dlerror() or the validation failure; empty when loaded
};

// A registered verbs_device_extend_ops.
struct DriverInfo {
    std::string name;
    const verbs_device_extend_ops *ops = nullptr;
    std::string library;  // the shared object the ops table lives in (dladdr), may be empty
};

// One device of a registered virtual-device provider.
struct VdevDevice {
    const ibv_extend_vdev_ops *provider = nullptr;
    ibv_extend_vdev_attr attr{};
};

// A virtual device opened through its provider.
struct OpenedVdev {
    const ibv_extend_vdev_ops *provider = nullptr;
    ibv_context *context = nullptr;
};

// The driver serving dev (a virtual device of a registered provider, else the rdma-core
// provider name). Runs discovery once when no registered driver matches. nullptr when none.
const verbs_device_extend_ops *findDriver(const ibv_device *dev);

// The registered driver with this exact name; never runs discovery.
const verbs_device_extend_ops *findDriverByName(std::string_view name);

// What the driver declared it guarantees (IBV_EXTEND_GUARANTEE_* of ibv_extend_vdev.h): with
// PROVIDER_EXTEND_GUARANTEES, or in the vdev ops (ABI V5) registered under its name. 0 (the
// reference's promise: nothing) when it declared nothing or driver is nullptr.
uint32_t driverGuarantees(const verbs_device_extend_ops *driver);

// The vdev provider owning dev (asked through is_own_device), nullptr when none. Never runs
// discovery: a provider that is not loaded cannot have handed out the device.
const ibv_extend_vdev_ops *findVdevProvider(const ibv_device *dev);

// The provider name used to match dev: its vdev provider's name, else rdma-core's provider name
// (layout view or sysfs). Empty when unknown.
std::string providerName(const ibv_device *dev);

// Runs discovery now if it has not run yet (the daemon loads everything at start-up).
void loadAll();

// True once discovery has run in this process.
bool discovered();

std::vector<LoadRecord> loadRecords();
std::vector<DriverInfo> drivers();
std::vector<const ibv_extend_vdev_ops *> vdevProviders();

// Every device of every registered vdev provider, in registration order. Runs discovery first.
std::vector<VdevDevice> queryDevices();

// Opens a virtual device by name (runs discovery first). Returns 0 or a negative errno
// (-ENODEV when no provider has a device of that name).
int openVdev(std::string_view name, OpenedVdev *out);

// Loads one driver library now, by the same rules as discovery: a name is looked up as
// lib<name>.so in the provider dir, then on the normal search path; an absolute path is used as
// is. origin says who asked (a config file, "default") in the record and in warnings. Not added
// to loadRecords(): that list is what discovery itself found.
LoadRecord loadDriver(const std::string &name, const std::string &origin);

// Writes "ibv_extend: Warning: <msg>" to stderr when IBV_EXTEND_SHOW_WARNINGS is set.
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ibvx::loader
