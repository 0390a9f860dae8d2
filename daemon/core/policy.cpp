#include "daemon/core/policy.h"

#include <algorithm>

namespace ibvx::daemon {
namespace {

template <typename T>
bool contains(const std::vector<T> &v, const T &x) {
    return std::find(v.begin(), v.end(), x) != v.end();
}

bool inAnyGroup(const PeerIdentity &peer, const std::vector<gid_t> &gids) {
    if (contains(gids, peer.creds.gid)) {
        return true;
    }
    for (gid_t g : peer.groups) {
        if (contains(gids, g)) {
            return true;
        }
    }
    return false;
}

std::string who(const PeerIdentity &peer) {
    return "uid " + std::to_string(peer.creds.uid) + " gid " + std::to_string(peer.creds.gid) + " (pid " +
           std::to_string(peer.creds.pid) + ")";
}

}  // namespace

const TenantClass *Policy::classOf(const PeerIdentity &peer) const {
    for (const TenantClass &c : config_.classes) {
        if (contains(c.uids, peer.creds.uid) || inAnyGroup(peer, c.gids) ||
            (!peer.pod_namespace.empty() && contains(c.namespaces, peer.pod_namespace))) {
            return &c;
        }
    }
    return nullptr;
}

Status Policy::admitConnect(const PeerIdentity &peer) const {
    if (!config_.enabled) {
        return Status::ok();
    }
    if (contains(config_.allow_uids, peer.creds.uid) || inAnyGroup(peer, config_.allow_gids) ||
        classOf(peer) != nullptr) {
        return Status::ok();
    }
    return Status(Code::kPermissionDenied, EACCES,
                  "policy: " + who(peer) +
                      " may not connect: not in policy.allow_uids, policy.allow_gids or any policy.class "
                      "(deny by default)");
}

Status Policy::admitDevice(const PeerIdentity &peer, const std::string &device) const {
    if (!config_.enabled) {
        return Status::ok();
    }
    const TenantClass *c = classOf(peer);
    const std::vector<std::string> &allowed = c != nullptr ? c->devices : config_.default_devices;
    if (contains(allowed, std::string("*")) || contains(allowed, device)) {
        return Status::ok();
    }
    std::string rule = c != nullptr ? "policy.class." + c->name + ".devices" : "policy.default_devices";
    return Status(Code::kPermissionDenied, EACCES,
                  "policy: " + who(peer) + " may not open device '" + device + "': not in " + rule);
}

}  // namespace ibvx::daemon
