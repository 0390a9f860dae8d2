// ibvx-k8s-runtime: applies a device plugin's container edits the way a container runtime does,
// then runs a program inside. Single-threaded, so everything between unshare() and exec is safe.
//
//   ibvx-k8s-runtime [--mount HOST:CONTAINER:ro|rw]... [--env NAME=VALUE]... [--uid UID] -- PROG ARGS...
//
// The container: a new mount namespace (made private also in a chroot whose "/" is not a mount
// point, private_mounts.h); a fresh tmpfs root holding the host's /usr and /etc
// read-only (the "image": Debian's own programs and libraries, nothing of the build tree), /proc,
// /sys and a /dev tmpfs with the usual nodes; the edits' bind mounts on top; chroot into it; an
// environment holding only the edits' variables; the uid (and gid) given, with no supplementary
// groups. PROG is a path inside.
// "@connect PATH" instead of a program connects to the Unix socket PATH and prints "connected"
// and whether PATH's directory accepts writes.
#include <fcntl.h>
#include <grp.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/private_mounts.h"

namespace fs = std::filesystem;

namespace {

[[noreturn]] void die(const std::string &what) {
    std::fprintf(stderr, "ibvx-k8s-runtime: %s: %s\n", what.c_str(), std::strerror(errno));
    std::exit(125);
}

struct BindMount {
    std::string host, container;
    bool read_only = true;
};

void bindInto(const std::string &root, const BindMount &m) {
    std::string target = root + m.container;
    std::error_code ec;
    if (fs::is_directory(m.host)) {
        fs::create_directories(target, ec);
    } else {
        fs::create_directories(fs::path(target).parent_path(), ec);
        int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd >= 0) {
            ::close(fd);
        }
    }
    if (::mount(m.host.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) < 0) {
        die("bind " + m.host + " on " + m.container);
    }
    if (m.read_only && ::mount(nullptr, target.c_str(), nullptr,
                               MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, nullptr) < 0) {
        die("remount " + m.container + " read-only");
    }
}

int connectCheck(const std::string &path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0) {
        std::printf("connect=%d\n", errno);
        return 1;
    }
    std::printf("connected\n");
    std::string probe = fs::path(path).parent_path().string() + "/write-probe";
    int w = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    std::printf("write=%d\n", w >= 0 ? 0 : errno);
    return 0;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<BindMount> mounts;
    std::vector<std::string> env;
    long uid = -1;
    int i = 1;
    for (; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--") {
            ++i;
            break;
        }
        if (i + 1 >= argc) {
            std::fprintf(stderr, "ibvx-k8s-runtime: %s needs a value\n", a.c_str());
            return 125;
        }
        std::string v = argv[++i];
        if (a == "--mount") {
            size_t a1 = v.find(':');
            size_t a2 = v.rfind(':');
            if (a1 == std::string::npos || a2 == a1) {
                std::fprintf(stderr, "ibvx-k8s-runtime: --mount HOST:CONTAINER:ro|rw, not %s\n", v.c_str());
                return 125;
            }
            mounts.push_back({v.substr(0, a1), v.substr(a1 + 1, a2 - a1 - 1), v.substr(a2 + 1) != "rw"});
        } else if (a == "--env") {
            env.push_back(v);
        } else if (a == "--uid") {
            uid = std::strtol(v.c_str(), nullptr, 10);
        } else {
            std::fprintf(stderr, "ibvx-k8s-runtime: unknown option %s\n", a.c_str());
            return 125;
        }
    }
    if (i >= argc) {
        std::fprintf(stderr, "ibvx-k8s-runtime: no program\n");
        return 125;
    }

    // The root's mount point is an empty host directory; the parent removes it once the
    // container is gone (its mounts die with the child's namespace).
    char tmpl[] = "/tmp/ibvx-ctr.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
        die("mkdtemp");
    }
    std::string root = tmpl;
    std::fflush(nullptr);
    pid_t child = ::fork();
    if (child < 0) {
        die("fork");
    }
    if (child > 0) {
        int st = 0;
        while (::waitpid(child, &st, 0) < 0 && errno == EINTR) {
        }
        // The root tmpfs's copy on this side, where "/" was not a mount point (EINVAL: none).
        ::umount2(tmpl, MNT_DETACH);
        ::rmdir(tmpl);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    if (::unshare(CLONE_NEWNS) < 0) {
        die("unshare(CLONE_NEWNS)");
    }
    // Nothing mounted here may leak back to the host, also where "/" is not a mount point (a
    // chroot): then only the empty root tmpfs can reach the host's side, and the parent unmounts
    // it there (private_mounts.h).
    bool root_is_mount = false;
    if (int err = ibvx::test::makeMountsPrivate(&root_is_mount); err != 0) {
        errno = err;
        die("make the mounts private");
    }
    if (int err = ibvx::test::privateTmpfs(root.c_str(), "mode=0755"); err != 0) {
        errno = err;
        die("tmpfs root");
    }
    // Debian 12 is merged-/usr: /bin, /lib, /lib64, /sbin are symlinks into /usr.
    for (const char *d : {"/bin", "/lib", "/lib64", "/sbin"}) {
        std::error_code ec;
        if (fs::is_symlink(d, ec)) {
            fs::create_symlink(fs::read_symlink(d), root + d, ec);
        }
    }
    bindInto(root, {"/usr", "/usr", true});
    bindInto(root, {"/etc", "/etc", true});
    bindInto(root, {"/proc", "/proc", false});
    bindInto(root, {"/sys", "/sys", true});
    // /dev as runtimes make it: a tmpfs of the container's own with the usual nodes bound in, so
    // an edit that mounts at a new /dev path (the discovery tree's /dev/infiniband) creates its
    // mount point there, never in the host's devtmpfs.
    fs::create_directories(root + "/dev");
    if (::mount("tmpfs", (root + "/dev").c_str(), "tmpfs", MS_NOSUID, "mode=0755") < 0) {
        die("tmpfs /dev");
    }
    for (const char *node : {"null", "zero", "full", "random", "urandom", "tty", "shm", "pts"}) {
        std::error_code exists_ec;
        if (fs::exists(std::string("/dev/") + node, exists_ec)) {
            bindInto(root, {std::string("/dev/") + node, std::string("/dev/") + node, false});
        }
    }
    const std::pair<const char *, const char *> links[] = {{"fd", "/proc/self/fd"},
                                                           {"stdin", "/proc/self/fd/0"},
                                                           {"stdout", "/proc/self/fd/1"},
                                                           {"stderr", "/proc/self/fd/2"}};
    for (const auto &[name, target] : links) {
        std::error_code link_ec;
        fs::create_symlink(target, root + "/dev/" + name, link_ec);
    }
    std::error_code ec;
    fs::create_directories(root + "/tmp", ec);
    for (const BindMount &m : mounts) {
        bindInto(root, m);
    }
    if (::chroot(root.c_str()) < 0 || ::chdir("/") < 0) {
        die("chroot");
    }
    if (uid >= 0) {
        auto id = static_cast<uid_t>(uid);
        if (::setgroups(0, nullptr) < 0 || ::setresgid(id, id, id) < 0 || ::setresuid(id, id, id) < 0) {
            die("drop to uid " + std::to_string(uid));
        }
    }
    if (std::string(argv[i]) == "@connect") {
        return i + 1 < argc ? connectCheck(argv[i + 1]) : 125;
    }
    std::vector<char *> envp;
    for (std::string &e : env) {
        envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    ::execve(argv[i], argv + i, envp.data());
    die(std::string("exec ") + argv[i]);
}
