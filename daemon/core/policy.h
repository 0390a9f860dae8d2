// Who may use the broker and which devices, from the daemon config's [policy] section. The socket's
// mode and group are the first fence; this is the second, applied to the kernel identity of the
// caller (PeerIdentity), never to anything the client says.
//
// Without a [policy] section everything is allowed (the socket's permissions decide). With one,
// everything not allowed is denied:
//  - connect (Hello): the uid is in allow_uids, or the primary or a supplementary gid is in
//    allow_gids, or the tenant belongs to a class;
//  - open a device: the tenant's class (the first class listing its uid, one of its gids or its
//    pod's namespace) lists the device or "*"; a tenant in no class gets default_devices.
// Refusals are PERMISSION_DENIED with a message naming the rule (the config key) that applied.
//
// Threading: immutable after construction; share it with a shared_ptr<const Policy>.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"
#include "daemon/core/identity.h"

namespace ibvx::daemon {

struct TenantClass {
    std::string name;
    std::vector<uid_t> uids;
    std::vector<gid_t> gids;
    std::vector<std::string> devices;  // "*" = every device
    // Kubernetes namespaces whose pods belong to the class (PeerIdentity::pod_namespace, known
    // only with [kubernetes] pod_resources_socket). Last, with an initializer: aggregate
    // initializations that predate it stay valid.
    std::vector<std::string> namespaces{};
};

struct PolicyConfig {
    bool enabled = false;  // a [policy] section exists: deny by default
    std::vector<uid_t> allow_uids;
    std::vector<gid_t> allow_gids;
    std::vector<std::string> default_devices;  // devices of an admitted tenant in no class
    std::vector<TenantClass> classes;
};

class Policy {
  public:
    Policy() = default;
    explicit Policy(PolicyConfig config) : config_(std::move(config)) {}

    bool enabled() const { return config_.enabled; }
    const PolicyConfig &config() const { return config_; }

    Status admitConnect(const PeerIdentity &peer) const;
    Status admitDevice(const PeerIdentity &peer, const std::string &device) const;
    // The tenant's class, nullptr when none matches.
    const TenantClass *classOf(const PeerIdentity &peer) const;

  private:
    PolicyConfig config_;
};

}  // namespace ibvx::daemon
