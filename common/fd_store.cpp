#include "common/fd_store.h"

#include <fcntl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace ibvx {
namespace {

constexpr int kFirstListenFd = SD_LISTEN_FDS_START;  // 3

Status notify(const std::string &state, const int *fds, size_t n) {
    int rc = n == 0 ? ::sd_pid_notify(0, 0, state.c_str())
                    : ::sd_pid_notify_with_fds(0, 0, state.c_str(), fds, static_cast<unsigned>(n));
    if (rc < 0) {
        return Status::fromErrno(
            -rc, "sending to the service manager (NOTIFY_SOCKET) failed: " + std::string(std::strerror(-rc)));
    }
    if (rc == 0) {
        return failedPrecondition("the fd store needs a service manager: NOTIFY_SOCKET is not set");
    }
    return Status::ok();
}

Status checkFd(int fd) {
    if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
        return invalidArgument("fd " + std::to_string(fd) + " is not an open file descriptor");
    }
    return Status::ok();
}

}  // namespace

Status checkFdName(const std::string &name) {
    if (name.empty()) {
        return invalidArgument("an fd store name must not be empty");
    }
    if (name.size() > kFdNameMax) {
        return invalidArgument("fd store name '" + name.substr(0, 32) + "...' has " +
                               std::to_string(name.size()) + " characters (at most 255)");
    }
    for (char c : name) {
        auto u = static_cast<unsigned char>(c);
        if (u < ' ' || u >= 127 || c == ':') {
            return invalidArgument(
                "fd store name '" + name +
                "' may hold printable ASCII only, and no ':' (the LISTEN_FDNAMES separator)");
        }
    }
    return Status::ok();
}

Status FdStore::add(const std::string &name, int fd) {
    return addBatch({{name, fd}});
}

Status FdStore::addBatch(const std::vector<std::pair<std::string, int>> &fds) {
    for (const auto &[name, fd] : fds) {
        RETURN_IF_ERROR(checkFdName(name));
        RETURN_IF_ERROR(checkFd(fd));
    }
    if (!enabled_) {
        return Status::ok();
    }
    std::vector<int> run;
    for (size_t i = 0; i < fds.size();) {
        const std::string &name = fds[i].first;
        run.clear();
        for (; i < fds.size() && fds[i].first == name && run.size() < kFdsPerNotify; ++i) {
            run.push_back(fds[i].second);
        }
        RETURN_IF_ERROR(notify("FDSTORE=1\nFDNAME=" + name, run.data(), run.size()));
    }
    return Status::ok();
}

Status FdStore::remove(const std::string &name) {
    RETURN_IF_ERROR(checkFdName(name));
    if (!enabled_) {
        return Status::ok();
    }
    return notify("FDSTOREREMOVE=1\nFDNAME=" + name, nullptr, 0);
}

StatusOr<std::vector<std::pair<std::string, UniqueFd>>> listenFdsWithNames() {
    char **names = nullptr;
    int n = ::sd_listen_fds_with_names(1, &names);
    if (n < 0) {
        return Status::fromErrno(
            -n, "reading LISTEN_FDS/LISTEN_FDNAMES failed: " + std::string(std::strerror(-n)));
    }
    std::vector<std::pair<std::string, UniqueFd>> out;
    out.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        out.emplace_back(names != nullptr && names[i] != nullptr ? names[i] : "unknown",
                         UniqueFd(kFirstListenFd + i));
    }
    if (names != nullptr) {
        for (int i = 0; names[i] != nullptr; ++i) {
            std::free(names[i]);
        }
        std::free(names);
    }
    return out;
}

Status prepareExecFds(const std::vector<std::pair<std::string, int>> &fds) {
    std::string joined;
    int highest = kFirstListenFd + static_cast<int>(fds.size()) - 1;
    for (const auto &[name, fd] : fds) {
        RETURN_IF_ERROR(checkFdName(name));
        RETURN_IF_ERROR(checkFd(fd));
        joined += (joined.empty() ? "" : ":") + name;
        highest = std::max(highest, fd);
    }
    if (fds.empty()) {
        ::unsetenv("LISTEN_FDS");
        ::unsetenv("LISTEN_FDNAMES");
        ::unsetenv("LISTEN_PID");
        return Status::ok();
    }
    // Copies above every source and every target first, so that moving one into place can
    // never overwrite another that is still to be moved.
    std::vector<UniqueFd> copies;
    copies.reserve(fds.size());
    for (const auto &entry : fds) {
        int copy = ::fcntl(entry.second, F_DUPFD_CLOEXEC, highest + 1);
        if (copy < 0) {
            int err = errno;
            return Status::fromErrno(err, "copying fd " + std::to_string(entry.second) + " (" + entry.first +
                                              ") for exec failed: " + std::strerror(err));
        }
        copies.emplace_back(copy);
    }
    const int last_target = kFirstListenFd + static_cast<int>(fds.size()) - 1;
    for (const auto &entry : fds) {
        // The original stays behind this exec unless it is one of the numbered copies' slots.
        if (entry.second > last_target && ::fcntl(entry.second, F_SETFD, FD_CLOEXEC) < 0) {
            int err = errno;
            return Status::fromErrno(err,
                                     "marking fd " + std::to_string(entry.second) + " close-on-exec failed");
        }
    }
    for (size_t i = 0; i < copies.size(); ++i) {
        int target = kFirstListenFd + static_cast<int>(i);
        // dup2 leaves FD_CLOEXEC clear on the new descriptor: exactly these cross the exec.
        if (::dup2(copies[i].get(), target) < 0) {
            int err = errno;
            return Status::fromErrno(err, "moving " + fds[i].first + " to fd " + std::to_string(target) +
                                              " failed: " + std::strerror(err));
        }
    }
    copies.clear();
    if (::setenv("LISTEN_FDS", std::to_string(fds.size()).c_str(), 1) < 0 ||
        ::setenv("LISTEN_FDNAMES", joined.c_str(), 1) < 0 ||
        ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1) < 0) {
        int err = errno;
        return Status::fromErrno(err, "setting LISTEN_FDS/LISTEN_FDNAMES/LISTEN_PID failed");
    }
    return Status::ok();
}

}  // namespace ibvx
