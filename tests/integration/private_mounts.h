// Private mounts for the tests' container launchers (ibvx-k8s-runtime, the face tests' Contained),
// also where "/" is not a mount point: a chroot, as sbuild and pbuilder build packages in.
//
// After unshare(CLONE_NEWNS) every mount is still a peer of the host's copy, so what a test mounts
// would propagate back to the host. The usual cure, mount(MS_REC | MS_PRIVATE) on "/", needs "/" to
// be a mount's root; in a chroot it is a directory of a mount that lies outside the chroot, out of
// reach, and the call fails with EINVAL (util-linux's `unshare --propagation private` fails the same
// way). So the fallback makes every mount the process can see private one by one, and a launcher
// puts its own mounts under a tmpfs it makes private first (privateTmpfs()).
//
// Header-only and allocation-light: the launchers call it between fork() or unshare() and exec.
#pragma once

#include <sys/mount.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace ibvx::test {

// "\040" and friends: how /proc/self/mountinfo escapes blanks and backslashes in a path.
inline std::string unescapeMountPath(const char *p) {
    std::string out;
    for (; *p != '\0'; ++p) {
        if (p[0] == '\\' && p[1] >= '0' && p[1] <= '7' && p[2] >= '0' && p[2] <= '7' && p[3] >= '0' &&
            p[3] <= '7') {
            out += static_cast<char>((p[1] - '0') * 64 + (p[2] - '0') * 8 + (p[3] - '0'));
            p += 3;
        } else {
            out += *p;
        }
    }
    return out;
}

// Makes every mount of this mount namespace that the process can reach private. Returns 0, or
// the errno of the first mount that refused (the caller reports it). *root_is_mount tells
// whether "/" itself could be made private: when it could not, a mount made directly on a
// directory of "/" still propagates to the host's copy of the mount holding it.
inline int makeMountsPrivate(bool *root_is_mount) {
    *root_is_mount = ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    if (*root_is_mount) {
        return 0;
    }
    if (errno != EINVAL) {
        return errno;
    }
    std::FILE *f = std::fopen("/proc/self/mountinfo", "re");
    if (f == nullptr) {
        return errno;
    }
    // Fields: id parent major:minor root mount-point options ... (proc(5)); in a chroot the
    // mounts outside it are not listed and the points are relative to its root.
    char line[4096];
    int err = 0;
    while (err == 0 && std::fgets(line, sizeof(line), f) != nullptr) {
        char point[4096];
        if (std::sscanf(line, "%*s %*s %*s %*s %4095s", point) != 1) {
            continue;
        }
        std::string path = unescapeMountPath(point);
        // EINVAL: a point covered by a later mount on the same path (that one is made private
        // in its turn), or one that is no longer a mount root from here.
        if (::mount(nullptr, path.c_str(), nullptr, MS_REC | MS_PRIVATE, nullptr) < 0 && errno != EINVAL &&
            errno != ENOENT) {
            err = errno;
        }
    }
    std::fclose(f);
    return err;
}

// Mounts a tmpfs on dir and makes it private, so everything mounted below it stays in this
// namespace. Where "/" is not a mount point and the mount holding dir is shared with the host,
// the tmpfs itself (empty) reaches the host's copy too: whoever made dir removes it there with
// umount2(dir, MNT_DETACH) before rmdir(dir), as ibvx-k8s-runtime's parent does. Returns 0 or
// an errno.
inline int privateTmpfs(const char *dir, const char *options) {
    if (::mount("tmpfs", dir, "tmpfs", 0, options) < 0) {
        return errno;
    }
    if (::mount(nullptr, dir, nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) {
        return errno;
    }
    return 0;
}

}  // namespace ibvx::test
