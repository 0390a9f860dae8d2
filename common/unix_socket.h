// Unix-socket addresses and connections, in one place: a path that does not fit sun_path
// (107 bytes and a NUL) is refused with a message naming it, never silently truncated into the
// address of some other socket.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx {

struct UnixAddress {
    sockaddr_un addr{};
    socklen_t len = 0;  // what bind() and connect() take

    const sockaddr *get() const { return reinterpret_cast<const sockaddr *>(&addr); }
};

// INVALID_ARGUMENT (ENAMETOOLONG) for an empty path or one of 108 bytes or more.
StatusOr<UnixAddress> unixAddress(const std::string &path);

// A connected SOCK_STREAM socket (SOCK_CLOEXEC, plus `flags` such as SOCK_NONBLOCK). Failure
// carries connect()'s errno: ENOENT (no socket there), ECONNREFUSED (nobody listening), ...
StatusOr<UniqueFd> connectUnix(const std::string &path, int flags = 0);

}  // namespace ibvx
