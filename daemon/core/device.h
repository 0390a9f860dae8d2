// The devices the broker serves: virtual devices of loaded vdev providers and rdma-core devices
// an extension driver matched.
//
// Threading: the registry's mutex guards the device list; Device objects are never destroyed
// while the registry lives (a rescan only adds), so Device pointers stay valid.
// Calls on one context are already one at a time: a context belongs to one session, and every
// call holds its Session::mu_. Calls on different contexts of a device run in parallel when its
// driver declares them safe (IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS, ibv_extend_vdev.h: softnda
// in its vdev ops, mlx5 with PROVIDER_EXTEND_GUARANTEES). For a driver that declares nothing the
// reference promises nothing, so Device::driver_mu serialises every call into it.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include "daemon/core/xrc_targets.h"
#include "daemon/core/xrcd_domains.h"
#include "providers/loader/device_verbs.h"

namespace ibvx::daemon {

// What ListDevices reports (mirrors ibv_extend.v1.DeviceInfo).
struct DeviceInfo {
    std::string name;
    std::string provider;
    uint32_t ext_cap = 0;
    uint32_t driver_version = 0;
    uint32_t phys_port_cnt = 0;
    uint32_t max_qp = 0;
    uint32_t max_cq = 0;
    uint32_t max_srq = 0;
    uint32_t max_mr = 0;
    uint32_t max_qp_wr = 0;
    uint32_t max_cqe = 0;
    uint32_t max_srq_wr = 0;
    uint32_t max_sge = 0;
    uint32_t max_inline_data = 0;
    uint32_t max_msg_sz = 0;
    uint64_t max_mr_size = 0;
    uint64_t max_dm_size = 0;  // device memory (vdev ABI V10); 0: none
    bool virtual_device = false;
    // Its driver guarantees a RESET -> INIT only stores attributes, refused as a table says
    // (IBV_EXTEND_GUARANTEE_PLAIN_INIT): the face may answer one itself.
    bool plain_init = false;
};

struct Device {
    DeviceInfo info;
    // The standard verbs (open/close, PD, MR, QP state), from the vdev provider of a virtual
    // device or libibverbs for an rdma-core one, decided when the device was found.
    loader::DeviceVerbs verbs;
    const verbs_device_extend_ops *driver = nullptr;  // the extension driver serving it
    bool serialize_calls = true;                      // see the file comment
    std::mutex driver_mu;                             // taken only when serialize_calls
    XrcdDomains xrcds;       // its XRC domains shared by file (ibv_open_xrcd), across sessions
    XrcTargets xrc_targets;  // its XRC target QPs by (domain, number), for ibv_open_qp
};

// Whether the extension driver declared its calls on different contexts safe to run
// concurrently (see the file comment). false for nullptr.
bool threadSafeAcrossContexts(const verbs_device_extend_ops *driver);

class DeviceRegistry {
  public:
    DeviceRegistry() = default;
    ~DeviceRegistry();
    DeviceRegistry(const DeviceRegistry &) = delete;
    DeviceRegistry &operator=(const DeviceRegistry &) = delete;

    // Adds devices not known yet (from the loader's vdev providers and libibverbs). Returns how
    // many were added. Safe to call again after more drivers were loaded.
    int scan();

    Device *find(const std::string &name);
    std::vector<DeviceInfo> list();
    size_t size();

  private:
    void addVirtual();
    void addVerbs();

    std::mutex mu_;
    std::vector<std::unique_ptr<Device>> devices_;
    // libibverbs device lists we took devices from: kept until the end, the ibv_device
    // pointers live in them.
    std::vector<ibv_device **> verbs_lists_;
};

}  // namespace ibvx::daemon
