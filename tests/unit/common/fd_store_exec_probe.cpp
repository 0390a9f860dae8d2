// Started by fd_store_test through prepareExecFds + exec: reads its fds back the way the broker
// does (listenFdsWithNames) and prints what it found, one line each, for the test to compare:
//   fd <n> <name> cloexec=<0|1> content=<the fd's first bytes>   (per listened fd, before reading)
//   env LISTEN_FDS=<value or -> LISTEN_FDNAMES=<...> LISTEN_PID=<...>   (after reading)
//   open <every fd number open in this process, space separated>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/fd_store.h"

namespace {

const char *env(const char *name) {
    const char *v = std::getenv(name);
    return v != nullptr ? v : "-";
}

std::string openFds() {
    std::string out;
    DIR *d = ::opendir("/proc/self/fd");
    if (d == nullptr) {
        return "?";
    }
    int self = ::dirfd(d);
    while (dirent *e = ::readdir(d)) {
        if (e->d_name[0] != '.' && std::atoi(e->d_name) != self) {
            out += (out.empty() ? "" : " ") + std::string(e->d_name);
        }
    }
    ::closedir(d);
    return out;
}

}  // namespace

int main() {
    // The flags as the exec left them, before libsystemd marks the fds close-on-exec.
    std::string cloexec;
    for (int fd = 3; fd < 3 + std::atoi(env("LISTEN_FDS")); ++fd) {
        cloexec += (::fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0 ? '1' : '0';
    }
    auto fds = ibvx::listenFdsWithNames();
    if (!fds.isOk()) {
        std::printf("error %s\n", fds.status().toString().c_str());
        return 1;
    }
    size_t i = 0;
    for (const auto &[name, fd] : *fds) {
        char buf[64] = {};
        ssize_t n = ::pread(fd.get(), buf, sizeof(buf) - 1, 0);
        std::printf("fd %d %s cloexec=%c content=%s\n", fd.get(), name.c_str(),
                    i < cloexec.size() ? cloexec[i] : '?', n > 0 ? buf : "");
        ++i;
    }
    std::printf("env LISTEN_FDS=%s LISTEN_FDNAMES=%s LISTEN_PID=%s\n", env("LISTEN_FDS"),
                env("LISTEN_FDNAMES"), env("LISTEN_PID"));
    std::printf("open %s\n", openFds().c_str());
    return 0;
}
