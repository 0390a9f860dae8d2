#include "daemon/core/identity.h"

#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "common/unique_fd.h"

namespace ibvx::daemon {

StatusOr<Credentials> peerCredentials(int sock) {
    ucred uc{};
    socklen_t len = sizeof(uc);
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &uc, &len) < 0) {
        return Status::fromErrno(errno, "SO_PEERCRED failed");
    }
    return Credentials{uc.pid, uc.uid, uc.gid};
}

StatusOr<PeerIdentity> peerIdentity(int sock) {
    PeerIdentity id;
    ASSIGN_OR_RETURN(id.creds, peerCredentials(sock));
    if (id.creds.pid <= 0) {
        // The peer's pid is not visible in our pid namespace: no /proc to read.
        return id;
    }
    // Pin the process before reading /proc: if the pid is recycled after this, the pidfd still
    // names the original (dead) process and the liveness check below fails.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, id.creds.pid, 0)));
    if (!pidfd && errno == ESRCH) {
        return Status(Code::kUnavailable, ESRCH, "the peer exited before it could be identified");
    }
    id.cgroup = readCgroup(id.creds.pid);
    id.groups = readGroups(id.creds.pid);
    id.k8s_device = readDeviceMarker(id.creds.pid);
    // Signal 0 checks existence only, but the permission check still applies: without CAP_KILL
    // (the unit grants none) another uid's live process answers EPERM. Only ESRCH means gone.
    if (pidfd && ::syscall(SYS_pidfd_send_signal, pidfd.get(), 0, nullptr, 0) < 0 && errno == ESRCH) {
        return Status(Code::kUnavailable, ESRCH, "the peer exited while it was being identified");
    }
    CgroupOwner owner = classifyCgroup(id.cgroup);
    id.runtime = owner.runtime;
    if (owner.container()) {
        id.container_id = owner.id;
    }
    return id;
}

std::string readCgroup(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
    std::string line;
    std::string first;
    while (std::getline(in, line)) {
        // "hierarchy-id:controllers:path"; the v2 line is "0::/path".
        size_t a = line.find(':');
        size_t b = a == std::string::npos ? std::string::npos : line.find(':', a + 1);
        if (b == std::string::npos) {
            continue;
        }
        std::string path = line.substr(b + 1);
        if (line.compare(0, b + 1, "0::") == 0) {
            return path;
        }
        if (first.empty()) {
            first = path;
        }
    }
    return first;
}

std::string deviceMarkerFromMountinfo(const std::string &mountinfo) {
    std::istringstream in(mountinfo);
    std::string line;
    std::string found;
    int count = 0;
    while (std::getline(in, line)) {
        // "id parent major:minor root mount-point options ...": fields 4 and 5.
        std::istringstream fields(line);
        std::string mount_id, parent, devno, root, point;
        if (!(fields >> mount_id >> parent >> devno >> root >> point) || point != kDeviceMarkerPath) {
            continue;
        }
        ++count;
        found = root.substr(root.rfind('/') + 1);
    }
    if (count != 1 || found.empty() || found.size() > 64) {
        return "";
    }
    for (char c : found) {
        if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '-' && c != '_' && c != '.') {
            return "";  // mountinfo escapes odd bytes as \ooo: no device ID of ours has them
        }
    }
    return found;
}

std::string readDeviceMarker(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/mountinfo");
    std::stringstream text;
    text << in.rdbuf();
    return deviceMarkerFromMountinfo(text.str());
}

std::vector<gid_t> readGroups(pid_t pid) {
    std::vector<gid_t> out;
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Groups:", 0) != 0) {
            continue;
        }
        std::istringstream groups(line.substr(7));
        unsigned long g;
        while (groups >> g) {
            out.push_back(static_cast<gid_t>(g));
        }
        break;
    }
    return out;
}

namespace {

bool isHex(const std::string &s) {
    if (s.empty()) {
        return false;
    }
    for (char c : s) {
        if (std::isxdigit(static_cast<unsigned char>(c)) == 0) {
            return false;
        }
    }
    return true;
}

// A container id: at least 12 hex digits (docker's short form) and at most 64.
bool isContainerId(const std::string &s) {
    return s.size() >= 12 && s.size() <= 64 && isHex(s);
}

bool endsWith(const std::string &s, const std::string &suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "<prefix><id>.scope" (systemd cgroup driver) or "<prefix><id>" (cgroupfs driver).
bool scopedId(const std::string &component, const std::string &prefix, std::string *id) {
    if (component.rfind(prefix, 0) != 0) {
        return false;
    }
    std::string rest = component.substr(prefix.size());
    if (endsWith(rest, ".scope")) {
        rest.resize(rest.size() - 6);
    }
    if (!isContainerId(rest)) {
        return false;
    }
    *id = rest;
    return true;
}

std::vector<std::string> components(const std::string &path) {
    std::vector<std::string> out;
    std::string cur;
    for (char c : path) {
        if (c == '/') {
            if (!cur.empty()) {
                out.push_back(cur);
            }
            cur.clear();
        } else {
            cur += c;
        }
    }
    if (!cur.empty()) {
        out.push_back(cur);
    }
    return out;
}

}  // namespace

bool CgroupOwner::container() const {
    return runtime == "docker" || runtime == "containerd" || runtime == "cri-o" || runtime == "podman" ||
           runtime == "kubernetes";
}

CgroupOwner classifyCgroup(const std::string &cgroup) {
    std::vector<std::string> parts = components(cgroup);
    bool kubepods = false;
    for (const std::string &p : parts) {
        if (p == "kubepods" || p.rfind("kubepods.slice", 0) == 0 || p.rfind("kubepods-", 0) == 0) {
            kubepods = true;
        }
    }
    // The deepest component that names a container wins: runtimes nest helper cgroups (podman's
    // ".../libpod-<id>.scope/container") below the container's own.
    for (size_t i = parts.size(); i-- > 0;) {
        const std::string &c = parts[i];
        const std::string parent = i > 0 ? parts[i - 1] : std::string();
        std::string id;
        // Runtime monitors (conmon) sit next to the container but are not it.
        if (c.rfind("libpod-conmon-", 0) == 0 || c.rfind("crio-conmon-", 0) == 0) {
            continue;
        }
        if (scopedId(c, "docker-", &id)) {
            return {"docker", id};
        }
        if (scopedId(c, "cri-containerd-", &id)) {
            return {"containerd", id};
        }
        if (scopedId(c, "crio-", &id)) {
            return {"cri-o", id};
        }
        if (scopedId(c, "libpod-", &id)) {
            return {"podman", id};
        }
        if (isContainerId(c)) {
            if (parent == "docker") {
                return {"docker", c};
            }
            if (parent == "libpod_parent" || parent == "machine.slice") {
                return {"podman", c};
            }
            if (parent == "containerd" || parent == "k8s.io") {
                return {"containerd", c};
            }
            if (kubepods) {
                return {"kubernetes", c};
            }
        }
    }
    if (!parts.empty()) {
        const std::string &last = parts.back();
        if (endsWith(last, ".scope")) {
            return {"systemd-scope", last};
        }
        if (endsWith(last, ".service")) {
            return {"systemd-service", last};
        }
        if (endsWith(last, ".slice")) {
            return {"systemd-slice", last};
        }
    }
    return {"", cgroup};
}

std::string containerIdFromCgroup(const std::string &cgroup) {
    CgroupOwner owner = classifyCgroup(cgroup);
    return owner.container() ? owner.id : std::string();
}

bool processInGroup(const Credentials &creds, gid_t gid) {
    if (creds.uid == 0 || creds.gid == gid) {
        return true;
    }
    for (gid_t g : readGroups(creds.pid)) {
        if (g == gid) {
            return true;
        }
    }
    return false;
}

}  // namespace ibvx::daemon
