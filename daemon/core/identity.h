// Who is on the other end of a Unix socket, as the kernel says (never as the peer says).
#pragma once

#include <sys/types.h>

#include <string>

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
    std::string cgroup;        // the unified-hierarchy path from /proc/<pid>/cgroup ("" when unknown)
    std::string container_id;  // derived from cgroup; "" when the path names no container
};

// SO_PEERCRED of a connected Unix socket.
StatusOr<Credentials> peerCredentials(int sock);

// SO_PEERCRED plus the cgroup of the peer process (read now: a later read could see a reused pid).
StatusOr<PeerIdentity> peerIdentity(int sock);

// The cgroup v2 path ("0::/...") or, on a v1 host, the first controller's path.
std::string readCgroup(pid_t pid);

// Container id from common runtimes' cgroup naming (docker-<64hex>.scope, cri-containerd-<id>,
// crio-<id>, libpod-<id>, /docker/<id>); empty when none matches.
std::string containerIdFromCgroup(const std::string &cgroup);

// True when the process is root or a member (primary or supplementary, from /proc/<pid>/status)
// of gid.
bool processInGroup(const Credentials &creds, gid_t gid);

}  // namespace ibvx::daemon
