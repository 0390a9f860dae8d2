#include "common/unix_socket.h"

#include <cstring>

namespace ibvx {

StatusOr<UnixAddress> unixAddress(const std::string &path) {
    UnixAddress a;
    if (path.empty() || path.size() >= sizeof(a.addr.sun_path)) {
        return Status(Code::kInvalidArgument, ENAMETOOLONG,
                      "socket path must be 1.." + std::to_string(sizeof(a.addr.sun_path) - 1) +
                          " bytes, got " + std::to_string(path.size()) + ": " + path);
    }
    a.addr.sun_family = AF_UNIX;
    std::memcpy(a.addr.sun_path, path.data(), path.size());
    a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
    return a;
}

StatusOr<UniqueFd> connectUnix(const std::string &path, int flags) {
    auto addr = unixAddress(path);
    if (!addr.isOk()) {
        return addr.status();
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | flags, 0));
    if (!fd) {
        return Status::fromErrno(errno, std::string("socket: ") + std::strerror(errno));
    }
    int rc;
    do {  // a signal during connect() (a tenant's timer, say) is not a failure
        rc = ::connect(fd.get(), addr->get(), addr->len);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        int err = errno;
        return Status::fromErrno(err, "cannot connect to " + path + ": " + std::strerror(err));
    }
    return fd;
}

}  // namespace ibvx
