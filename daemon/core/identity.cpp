#include "daemon/core/identity.h"

#include <sys/socket.h>

#include <cctype>
#include <fstream>
#include <sstream>

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
    auto creds = peerCredentials(sock);
    if (!creds.isOk()) {
        return creds.status();
    }
    PeerIdentity id;
    id.creds = *creds;
    id.cgroup = readCgroup(id.creds.pid);
    id.container_id = containerIdFromCgroup(id.cgroup);
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

namespace {

bool isIdChar(char c) {
    return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}

// The run of hex digits starting at pos if it is at least 12 long (short docker ids).
std::string hexRun(const std::string &s, size_t pos) {
    size_t end = pos;
    while (end < s.size() && isIdChar(s[end])) {
        ++end;
    }
    return end - pos >= 12 ? s.substr(pos, end - pos) : std::string();
}

}  // namespace

std::string containerIdFromCgroup(const std::string &cgroup) {
    static const char *const kPrefixes[] = {"docker-",  "cri-containerd-", "crio-",     "libpod-",
                                            "/docker/", "/containerd/",    "/kubepods/"};
    for (const char *prefix : kPrefixes) {
        size_t at = cgroup.rfind(prefix);
        if (at == std::string::npos) {
            continue;
        }
        std::string id = hexRun(cgroup, at + std::char_traits<char>::length(prefix));
        if (!id.empty()) {
            return id;
        }
    }
    return {};
}

bool processInGroup(const Credentials &creds, gid_t gid) {
    if (creds.uid == 0 || creds.gid == gid) {
        return true;
    }
    std::ifstream in("/proc/" + std::to_string(creds.pid) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("Groups:", 0) != 0) {
            continue;
        }
        std::istringstream groups(line.substr(7));
        unsigned long g;
        while (groups >> g) {
            if (g == gid) {
                return true;
            }
        }
    }
    return false;
}

}  // namespace ibvx::daemon
