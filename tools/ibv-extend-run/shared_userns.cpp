#include "tools/ibv-extend-run/shared_userns.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/unique_fd.h"

namespace ibvx::run {
namespace {

constexpr char kHolderName[] = "ibvx-userns";

std::string errnoText(const std::string &what) {
    return what + ": " + std::strerror(errno);
}

// flags: O_CREAT | O_TRUNC for a file of ours, 0 for a /proc file.
bool writeFile(const std::string &path, const std::string &text, int flags = 0) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | flags, 0600));
    return fd.valid() && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

std::string readFile(const std::string &path) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    char buf[64];
    ssize_t n = fd.valid() ? ::read(fd.get(), buf, sizeof(buf) - 1) : -1;
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

void lockOrWait(int fd, int how) {
    while (::flock(fd, how) < 0 && errno == EINTR) {
    }
}

// The user's registry directory, made 0700 if missing; "" (and *why) unless it is the user's own
// and nobody else's: another user who made it first must not choose the namespace we join.
std::string registryDir(std::string *why) {
    const char *xdg = std::getenv("XDG_RUNTIME_DIR");
    std::string dir = xdg != nullptr && xdg[0] == '/' ? std::string(xdg) + "/ibv-extend-run"
                                                      : "/tmp/ibv-extend-run-" + std::to_string(::geteuid());
    if (::mkdir(dir.c_str(), 0700) < 0 && errno != EEXIST) {
        *why = errnoText("cannot make " + dir);
        return "";
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() ||
        (st.st_mode & 077) != 0) {
        *why = dir + " is not a directory of this user's with mode 0700";
        return "";
    }
    return dir;
}

// An open descriptor (inherited by bwrap) of pid's user namespace if pid is this user's live
// holder; -1 otherwise. A recycled pid fails the name, owner or namespace check.
int openHolderNs(pid_t pid) {
    if (pid <= 0) {
        return -1;
    }
    const std::string proc = "/proc/" + std::to_string(pid);
    struct stat owner {};
    if (readFile(proc + "/comm") != std::string(kHolderName) + "\n" || ::stat(proc.c_str(), &owner) < 0 ||
        owner.st_uid != ::geteuid()) {
        return -1;
    }
    int ns = ::open((proc + "/ns/user").c_str(), O_RDONLY);
    struct stat theirs {
    }, ours{};
    if (ns >= 0 && (::fstat(ns, &theirs) < 0 || ::stat("/proc/self/ns/user", &ours) < 0 ||
                    (theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino))) {
        ::close(ns);
        return -1;
    }
    return ns;
}

// The holder: makes the namespace, says its pid on ready, then waits until no ibv-extend-run
// holds users.lock and goes, unregistering itself.
[[noreturn]] void holderMain(int ready, const std::string &dir) {
    // Nothing of the caller's stays open here: above all not its users.lock descriptor, whose
    // shared lock would then be ours too and never let the exclusive one below succeed.
    if (::dup2(ready, 3) < 0 || ::syscall(SYS_close_range, 4U, ~0U, 0U) < 0) {
        ::_exit(1);
    }
    ready = 3;
    int null = ::open("/dev/null", O_RDWR);
    for (int fd = 0; fd <= 2 && null >= 0; ++fd) {
        ::dup2(null, fd);
    }
    if (null > 2) {
        ::close(null);
    }
    ::prctl(PR_SET_NAME, kHolderName);
    ::setsid();
    (void)!::chdir("/");
    const uid_t uid = ::getuid();
    const gid_t gid = ::getgid();
    if (::unshare(CLONE_NEWUSER) < 0 || !writeFile("/proc/self/setgroups", "deny") ||
        !writeFile("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1") ||
        !writeFile("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1")) {
        int err = -errno;
        (void)!::write(ready, &err, sizeof(err));
        ::_exit(1);
    }
    const std::string holder_file = dir + "/holder";
    UniqueFd users(::open((dir + "/users.lock").c_str(), O_RDWR | O_CLOEXEC));
    int me = ::getpid();
    if (!users.valid() || ::write(ready, &me, sizeof(me)) != sizeof(me)) {
        ::_exit(1);
    }
    ::close(ready);
    for (;;) {
        ::sleep(1);
        if (::flock(users.get(), LOCK_EX | LOCK_NB) == 0) {
            if (std::atoi(readFile(holder_file).c_str()) == me) {
                ::unlink(holder_file.c_str());
            }
            ::_exit(0);
        }
    }
}

// Starts a holder, detached (double fork: it is nobody's child to reap); its pid, or -1 and *why.
pid_t spawnHolder(const std::string &dir, std::string *why) {
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC) < 0) {
        *why = errnoText("cannot make a pipe");
        return -1;
    }
    UniqueFd rd(pipefd[0]);
    UniqueFd wr(pipefd[1]);
    pid_t child = ::fork();
    if (child < 0) {
        *why = errnoText("cannot fork");
        return -1;
    }
    if (child == 0) {
        if (::fork() == 0) {
            holderMain(wr.get(), dir);
        }
        ::_exit(0);
    }
    wr.reset();
    while (::waitpid(child, nullptr, 0) < 0 && errno == EINTR) {
    }
    int said = 0;
    ssize_t n;
    while ((n = ::read(rd.get(), &said, sizeof(said))) < 0 && errno == EINTR) {
    }
    if (n != sizeof(said) || said <= 0) {
        *why = said < 0 ? std::string("cannot make a user namespace: ") + std::strerror(-said)
                        : "the namespace holder did not start";
        return -1;
    }
    return said;
}

}  // namespace

int sharedUserns(std::string *why) {
    std::string dir = registryDir(why);
    if (dir.empty()) {
        return -1;
    }
    // Not close-on-exec: bwrap and the program inherit it, and with it the shared lock.
    UniqueFd users(::open((dir + "/users.lock").c_str(), O_RDWR | O_CREAT, 0600));
    UniqueFd start(::open((dir + "/start.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!users.valid() || !start.valid()) {
        *why = errnoText("cannot open the locks in " + dir);
        return -1;
    }
    lockOrWait(users.get(), LOCK_SH);
    lockOrWait(start.get(), LOCK_EX);  // one holder at a time; released when start closes
    const std::string holder_file = dir + "/holder";
    int ns = openHolderNs(std::atoi(readFile(holder_file).c_str()));
    if (ns < 0) {
        pid_t pid = spawnHolder(dir, why);
        if (pid < 0) {
            return -1;
        }
        const std::string tmp = holder_file + ".new";
        if (!writeFile(tmp, std::to_string(pid), O_CREAT | O_TRUNC) ||
            ::rename(tmp.c_str(), holder_file.c_str()) < 0) {
            *why = errnoText("cannot write " + holder_file);
            return -1;
        }
        ns = openHolderNs(pid);
        if (ns < 0) {
            *why = "the namespace holder " + std::to_string(pid) + " went away at once";
            return -1;
        }
    }
    (void)users.release();  // held for the program's lifetime
    return ns;
}

}  // namespace ibvx::run
