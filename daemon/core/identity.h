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
    // Kubernetes: the device ID of the device plugin's marker mount in the peer's mount
    // namespace (readDeviceMarker), and the pod the kubelet says holds that device (filled by
    // the edge's PodResolver when [kubernetes] pod_resources_socket is set). "" when unknown.
    std::string k8s_device;
    std::string pod_namespace;
    std::string pod_name;
    std::string pod_container;
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

// Where ibv-extend-device-plugin mounts a container's device marker (a file named by its device
// ID, tools/ibv-extend-device-plugin/edits.h).
inline constexpr const char *kDeviceMarkerPath = "/run/ibv-extend-device";

// The device ID of pid's marker mount, from /proc/<pid>/mountinfo (the kernel's account, which
// an unprivileged process cannot rewrite): the last component of the mount's root when exactly
// one mount sits on kDeviceMarkerPath. "" when there is none, or more than one (a process that
// stacked another marker over its own names no device).
std::string readDeviceMarker(pid_t pid);
// The same from mountinfo text (tests).
std::string deviceMarkerFromMountinfo(const std::string &mountinfo);

// classifyCgroup(cgroup).id for a container runtime, else empty.
std::string containerIdFromCgroup(const std::string &cgroup);

// True when the process is root or a member (primary or supplementary, from /proc/<pid>/status)
// of gid.
bool processInGroup(const Credentials &creds, gid_t gid);

}  // namespace ibvx::daemon
