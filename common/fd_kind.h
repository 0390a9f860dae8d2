// What kind of file an fd is, by the name the kernel gives it in /proc/self/fd (the only way to
// tell an eventfd from a pipe or a socket). Header-only: the drivers use it too.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace ibvx {

// True when fd is an eventfd ("anon_inode:[eventfd]"). Event delivery writes 8 bytes to it from
// a device's engine thread: anything else (a full pipe) could block the engine or be misread.
inline bool isEventFd(int fd) {
    if (fd < 0) {
        return false;
    }
    char link[64];
    char target[64];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    if (n < 0) {
        return false;
    }
    target[n] = '\0';
    return std::strcmp(target, "anon_inode:[eventfd]") == 0;
}

}  // namespace ibvx
