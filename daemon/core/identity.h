// Who is on the other end of a Unix socket, as the kernel says (never as the peer says).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace ibvx::daemon {

struct Credentials {
    pid_t pid = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    bool operator==(const Credentials &) const = default;
};

struct PeerIdentity {
    Credentials creds;
    std::string cgroup;         // the unified-hierarchy path from /proc/<pid>/cgroup ("" when unknown)
    std::string container_id;   // derived from cgroup; "" when the path names no container
    std::string runtime;        // CgroupOwner::runtime of cgroup
    std::vector<gid_t> groups;  // supplementary groups (from /proc/<pid>/status at connect time)
};

// What a cgroup path says about who runs the process. runtime is "docker", "containerd",
// "cri-o", "podman" or "kubernetes" for a container (id is then its container id), "systemd-scope",
// "systemd-service" or "systemd-slice" (id is the last path component), or "" for a path we do
// not recognise (id is the path verbatim, so two tenants with different unknown paths never
// collapse into one).
struct CgroupOwner {
    std::string runtime;
    std::string id;
    bool container() const;
};
CgroupOwner classifyCgroup(const std::string &cgroup);

// SO_PEERCRED of a connected Unix socket.
StatusOr<Credentials> peerCredentials(int sock);

// SO_PEERCRED plus the cgroup and groups of the peer process, read at connect time and race-free
// against pid reuse: a pidfd is opened on the SO_PEERCRED pid first, /proc is read, and then the
// pidfd must still name a live process. A pid that died (and may have been reused) between
// SO_PEERCRED and the /proc reads fails with UNAVAILABLE instead of yielding a stranger's cgroup.
// The peer still holds its end of the socket, so while it is alive its pid cannot be reused.
StatusOr<PeerIdentity> peerIdentity(int sock);

// Supplementary groups of pid from /proc/<pid>/status (empty when unreadable).
std::vector<gid_t> readGroups(pid_t pid);

// The cgroup v2 path ("0::/...") or, on a v1 host, the first controller's path.
std::string readCgroup(pid_t pid);

// classifyCgroup(cgroup).id for a container runtime, else empty.
std::string containerIdFromCgroup(const std::string &cgroup);

// True when the process is root or a member (primary or supplementary, from /proc/<pid>/status)
// of gid.
bool processInGroup(const Credentials &creds, gid_t gid);

}  // namespace ibvx::daemon
