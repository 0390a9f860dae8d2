// ibv-extend-run [--socket PATH] [--sandbox MODE] [--] COMMAND [ARGS...]: runs COMMAND with the
// libibverbs face first on LD_LIBRARY_PATH and broker mode selected, as torsocks does for its
// library, and (where bubblewrap can) with the broker's discovery tree as its /dev/infiniband and
// /sys/class/infiniband{,_verbs} (sandbox.h). Checks first that a broker answers, so a missing
// daemon is one clear line here rather than a failing ibv_get_device_list() deep inside the program.
#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/build_config.h"
#include "common/unix_socket.h"
#include "tools/ibv-extend-run/launch.h"
#include "tools/ibv-extend-run/sandbox.h"
#include "tools/ibv-extend-run/shared_userns.h"

namespace {

constexpr const char *kUsage =
    "usage: ibv-extend-run [--socket PATH] [--sandbox MODE] [--] COMMAND [ARGS...]\n"
    "Runs COMMAND against the ibv-extend broker: the libibverbs face first on LD_LIBRARY_PATH,\n"
    "IBV_EXTEND_MODE=broker, IBV_EXTEND_SOCKET set to the broker's socket.\n"
    "  --socket PATH  the broker's socket (default: $IBV_EXTEND_SOCKET, else " IBVX_DEFAULT_SOCKET
    ")\n"
    "  --sandbox MODE whether COMMAND sees the broker's devices as /dev/infiniband and\n"
    "                 /sys/class/infiniband (a bubblewrap sandbox, no privilege needed):\n"
    "                 off (default: exec in place, the program keeps this pid), on (or fail),\n"
    "                 auto (if bwrap can, else say why and run without). The program then runs\n"
    "                 as bwrap's child, this process waits for it and exits with its status,\n"
    "                 and signals sent to this pid go to it. Default from $IBV_EXTEND_RUN_SANDBOX.\n"
    "  --help         this text\n"
    "  --version      the version\n";

bool hasFace(const std::string &dir) {
    return ::access((dir + "/libibverbs.so.1").c_str(), R_OK) == 0;
}

// Installed: <prefix>/bin/ibv-extend-run beside <prefix>/lib/ibv_extend/verbs. From the build
// tree: the directory the build put the face in. Empty when neither holds it.
std::string faceDir() {
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        std::string exe(self, static_cast<size_t>(n));
        std::string installed = exe.substr(0, exe.rfind('/')) + "/../lib/ibv_extend/verbs";
        char real[PATH_MAX];
        if (hasFace(installed) && ::realpath(installed.c_str(), real) != nullptr)
            return real;
    }
    if (hasFace(IBVX_BUILD_VERBS_DIR))
        return IBVX_BUILD_VERBS_DIR;
    return {};
}

int usageError(const char *what, const char *arg) {
    std::fprintf(stderr, "ibv-extend-run: %s%s\n%s", what, arg, kUsage);
    return 2;
}

std::string groupName(gid_t gid) {
    const group *g = ::getgrgid(gid);
    return g != nullptr ? g->gr_name : std::to_string(gid);
}

std::string userName(uid_t uid) {
    const passwd *pw = ::getpwuid(uid);
    return pw != nullptr ? pw->pw_name : std::to_string(uid);
}

// Whether this process has gid among its groups now, and whether the group database lists the
// user in it (after a usermod, until the next login, only the second is true).
struct Membership {
    bool now = false;
    bool listed = false;
};

Membership membership(gid_t gid) {
    Membership m;
    std::vector<gid_t> groups(static_cast<size_t>(std::max(::getgroups(0, nullptr), 0)));
    groups.resize(
        static_cast<size_t>(std::max(::getgroups(static_cast<int>(groups.size()), groups.data()), 0)));
    m.now = ::getegid() == gid || std::find(groups.begin(), groups.end(), gid) != groups.end();
    if (const passwd *pw = ::getpwuid(::geteuid()); pw != nullptr) {
        int count = 64;
        std::vector<gid_t> listed(static_cast<size_t>(count));
        if (::getgrouplist(pw->pw_name, pw->pw_gid, listed.data(), &count) < 0) {
            listed.resize(static_cast<size_t>(count));  // count is now the number needed
            (void)::getgrouplist(pw->pw_name, pw->pw_gid, listed.data(), &count);
        }
        listed.resize(static_cast<size_t>(std::max(count, 0)));
        m.listed = std::find(listed.begin(), listed.end(), gid) != listed.end();
    }
    return m;
}

// connect() was refused (EACCES): the socket, or a directory on its path, does not let this
// user in. "Permission denied" alone sends an operator looking at the broker; what they must
// change is the group membership (or the unit's modes), so say whose group and mode it is.
void explainDenied(const std::string &socket) {
    // The first directory this user cannot search, else the socket itself (connect needs write).
    std::string blocker = socket;
    std::string what = "it";
    int need = W_OK;
    for (size_t slash = socket.find('/', 1); slash != std::string::npos;
         slash = socket.find('/', slash + 1)) {
        std::string dir = socket.substr(0, slash);
        if (::access(dir.c_str(), X_OK) < 0 && errno == EACCES) {
            blocker = dir;
            what = "its directory " + dir;
            need = X_OK;
            break;
        }
    }
    struct stat st {};
    if (::stat(blocker.c_str(), &st) < 0) {
        std::fprintf(stderr, "ibv-extend-run: permission denied on the broker socket %s\n", socket.c_str());
        return;
    }
    std::string group = groupName(st.st_gid);
    std::string user = userName(::geteuid());
    std::fprintf(stderr,
                 "ibv-extend-run: permission denied on the broker socket %s: %s is owned by %s:%s "
                 "with mode %04o,\n",
                 socket.c_str(), what.c_str(), userName(st.st_uid).c_str(), group.c_str(),
                 static_cast<unsigned>(st.st_mode & 07777));
    Membership m = membership(st.st_gid);
    bool group_may = (st.st_mode & (need == X_OK ? S_IXGRP : S_IWGRP)) != 0;
    if (!m.now && !m.listed) {
        std::fprintf(stderr,
                     "  and user '%s' (uid %u) is not in group '%s'.\n"
                     "  Add the user to it (as root): usermod -aG %s %s\n"
                     "  then log in again: a running login keeps the groups it started with.\n",
                     user.c_str(), static_cast<unsigned>(::geteuid()), group.c_str(), group.c_str(),
                     user.c_str());
    } else if (!m.now) {
        std::fprintf(stderr,
                     "  and user '%s' is in group '%s', but this login started before that.\n"
                     "  Log in again (or run 'newgrp %s') to get the group.\n",
                     user.c_str(), group.c_str(), group.c_str());
    } else if (!group_may) {
        std::fprintf(stderr,
                     "  which gives group '%s' (yours) no %s permission.\n"
                     "  The socket unit sets it: SocketMode=0660 and DirectoryMode=0755 in "
                     "ibv-extendd.socket (or [broker] socket_mode without socket activation).\n",
                     group.c_str(), need == X_OK ? "search" : "write");
    } else {
        std::fprintf(stderr,
                     "  and group '%s' (yours) may open it: something else refused (a security module "
                     "such as AppArmor or SELinux?).\n",
                     group.c_str());
    }
}

// Whether command would run, as execvp(3) looks for it: 0, ENOENT (nowhere on PATH) or EACCES
// (found, not executable). bwrap answers both with its own status 1, so the sandbox path asks
// first, and the wrapper keeps env(1)'s 127 and 126.
int commandError(const char *command) {
    auto check = [](const std::string &path) {
        if (::access(path.c_str(), F_OK) < 0) {
            return ENOENT;
        }
        struct stat st {};
        return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0
                   ? 0
                   : EACCES;
    };
    if (std::strchr(command, '/') != nullptr) {
        return check(command);
    }
    const char *env_path = std::getenv("PATH");
    std::string dirs = env_path != nullptr ? env_path : "/usr/local/bin:/usr/bin:/bin";
    int found = ENOENT;
    for (size_t start = 0; start <= dirs.size();) {
        size_t colon = std::min(dirs.find(':', start), dirs.size());
        std::string dir = dirs.substr(start, colon - start);
        int err = check((dir.empty() ? "." : dir) + "/" + command);
        if (err == 0) {
            return 0;
        }
        if (err == EACCES) {
            found = EACCES;  // execvp goes on looking, and answers EACCES if nothing better turns up
        }
        start = colon + 1;
    }
    return found;
}

// How many times a sandbox bwrap failed to make for a mount that changed under it is tried.
constexpr int kSandboxAttempts = 5;

// The bwrap command line for the broker behind socket, or empty with *why set. The broker
// publishes its tree beside its socket (daemon/app/discovery_tree.h).
std::vector<std::string> prepareSandbox(const std::string &socket, std::string *why) {
    std::string dir = socket.find('/') == std::string::npos ? "." : socket.substr(0, socket.rfind('/'));
    std::string tree = (dir.empty() ? "" : dir) + "/discovery";
    char real[PATH_MAX];
    if (::realpath(tree.c_str(), real) == nullptr) {
        *why = "the broker publishes no discovery tree at " + tree + " (" + std::strerror(errno) + ")";
        return {};
    }
    std::string bwrap = ibvx::run::findBwrap();
    if (bwrap.empty()) {
        *why = "bwrap is not on PATH (install the bubblewrap package)";
        return {};
    }
    // Root may read any process's memory anyway (CAP_SYS_PTRACE); another user's sandboxes share
    // one user namespace so that they may read each other's as outside (shared_userns.h).
    int userns = -1;
    if (::geteuid() != 0) {
        std::string unshared;
        userns = ibvx::run::sharedUserns(&unshared);
        if (userns < 0) {
            std::fprintf(stderr,
                         "ibv-extend-run: this sandbox gets a user namespace of its own (%s), so programs "
                         "in other sandboxes cannot read its memory with process_vm_readv (UCX's cma)\n",
                         unshared.c_str());
        }
    }
    // Whether bwrap can make the sandbox here is learnt by making it (runSandboxed): a trial run
    // first would cost a second sandbox per program and could still lose the race with the
    // host's mounts that the real one then meets.
    return ibvx::run::sandboxArgs(bwrap, real, userns);
}

}  // namespace

int main(int argc, char **argv) {
    const char *env_socket = std::getenv("IBV_EXTEND_SOCKET");
    std::string socket = env_socket != nullptr && *env_socket != '\0' ? env_socket : IBVX_DEFAULT_SOCKET;
    // Off unless asked: bwrap always forks, and the program would no longer have this process's
    // pid, which the broker's per-pid view of sessions shows (signals sent to it still reach the
    // program: launch.h).
    ibvx::run::SandboxMode sandbox_mode = ibvx::run::SandboxMode::kOff;
    if (const char *m = std::getenv("IBV_EXTEND_RUN_SANDBOX");
        m != nullptr && *m != '\0' && !ibvx::run::parseSandboxMode(m, &sandbox_mode)) {
        return usageError("IBV_EXTEND_RUN_SANDBOX must be auto, on or off, not ", m);
    }
    int i = 1;
    for (; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        if (arg == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (arg == "--version") {
            std::printf("ibv-extend-run %s\n", IBVX_PROJECT_VERSION);
            return 0;
        }
        if (arg == "--socket") {
            if (i + 1 >= argc)
                return usageError("--socket needs a PATH", "");
            socket = argv[++i];
        } else if (arg.starts_with("--socket=")) {
            socket = std::string(arg.substr(std::strlen("--socket=")));
        } else if (arg == "--sandbox" || arg.starts_with("--sandbox=")) {
            std::string value;
            if (arg == "--sandbox") {
                if (i + 1 >= argc)
                    return usageError("--sandbox needs a MODE", "");
                value = argv[++i];
            } else {
                value = std::string(arg.substr(std::strlen("--sandbox=")));
            }
            if (!ibvx::run::parseSandboxMode(value, &sandbox_mode))
                return usageError("--sandbox must be auto, on or off, not ", value.c_str());
        } else if (arg.size() > 1 && arg[0] == '-') {
            return usageError("unknown option ", argv[i]);
        } else {
            break;
        }
    }
    if (i >= argc)
        return usageError("no COMMAND given", "");

    std::string dir = faceDir();
    if (dir.empty()) {
        std::fprintf(stderr,
                     "ibv-extend-run: the libibverbs face (libibverbs.so.1) is neither in "
                     "../lib/ibv_extend/verbs beside this program nor in %s\n",
                     IBVX_BUILD_VERBS_DIR);
        return 1;
    }
    // A connection is what the program's first verb would make; refusing here names the socket.
    auto connected = ibvx::connectUnix(socket);
    if (!connected.isOk()) {
        int err = connected.status().errnoValue();
        if (err == EACCES || err == EPERM) {
            explainDenied(socket);
        } else {
            std::fprintf(stderr, "ibv-extend-run: no broker answers on %s: %s\n", socket.c_str(),
                         std::strerror(err));
        }
        return 1;
    }
    connected.value().reset();

    const char *old_path = std::getenv("LD_LIBRARY_PATH");
    std::string path = old_path != nullptr && *old_path != '\0' ? dir + ":" + old_path : dir;
    if (::setenv("LD_LIBRARY_PATH", path.c_str(), 1) < 0 || ::setenv("IBV_EXTEND_MODE", "broker", 1) < 0 ||
        ::setenv("IBV_EXTEND_SOCKET", socket.c_str(), 1) < 0) {
        std::fprintf(stderr, "ibv-extend-run: cannot set the environment: %s\n", std::strerror(errno));
        return 1;
    }
    if (sandbox_mode != ibvx::run::SandboxMode::kOff) {
        std::string why;
        std::vector<std::string> args = prepareSandbox(socket, &why);
        if (args.empty() && sandbox_mode == ibvx::run::SandboxMode::kOn) {
            std::fprintf(stderr, "ibv-extend-run: --sandbox=on, but %s\n", why.c_str());
            return 1;
        }
        if (args.empty()) {
            std::fprintf(stderr,
                         "ibv-extend-run: running without the sandbox: %s. %s sees this host's own "
                         "/dev/infiniband and /sys/class/infiniband (--sandbox=off: this is intended).\n",
                         why.c_str(), argv[i]);
        } else if (int err = commandError(argv[i]); err != 0) {
            std::fprintf(stderr, "ibv-extend-run: %s: %s\n", argv[i], std::strerror(err));
            return err == ENOENT ? 127 : 126;
        } else {
            std::string refused;
            const int rc = ibvx::run::runSandboxed(args, argv + i, kSandboxAttempts, &refused);
            if (rc >= 0) {
                return rc;
            }
            if (sandbox_mode == ibvx::run::SandboxMode::kOn) {
                std::fprintf(stderr, "ibv-extend-run: --sandbox=on, but bwrap cannot make the sandbox: %s\n",
                             refused.c_str());
                return 1;
            }
            std::fprintf(
                stderr,
                "ibv-extend-run: running without the sandbox: bwrap cannot make it: %s. %s sees this "
                "host's own /dev/infiniband and /sys/class/infiniband.\n",
                refused.c_str(), argv[i]);
        }
    }
    ::execvp(argv[i], argv + i);
    int err = errno;
    std::fprintf(stderr, "ibv-extend-run: %s: %s\n", argv[i], std::strerror(err));
    // As env(1): 127 when the command is not there, 126 when it is but cannot run.
    return err == ENOENT || err == ENOTDIR ? 127 : 126;
}
