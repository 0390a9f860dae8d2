#include "tools/ibv-extend-run/sandbox.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <set>

namespace ibvx::run {
namespace {

// The host's entries that would show its own HCAs (or an absence the tree fills).
const std::set<std::string> kHiddenDev = {"infiniband"};
const std::set<std::string> kHiddenClasses = {"infiniband", "infiniband_verbs", "infiniband_mad",
                                              "infiniband_cm"};

// Binds every entry of the host's dir back over a tmpfs made there, except the hidden ones;
// symlinks are made again (a bind would follow them, /dev/fd -> /proc/self/fd to bwrap's own).
void rebuild(const std::string &dir, const std::set<std::string> &hidden, const char *bind_kind,
             std::vector<std::string> *args) {
    args->insert(args->end(), {"--tmpfs", dir});
    DIR *d = ::opendir(dir.c_str());
    if (d == nullptr) {
        return;
    }
    while (const dirent *e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == "." || name == ".." || hidden.count(name) != 0) {
            continue;
        }
        const std::string path = dir + "/" + name;
        struct stat st {};
        if (::lstat(path.c_str(), &st) < 0) {
            continue;
        }
        if (S_ISLNK(st.st_mode)) {
            char target[PATH_MAX];
            ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
            if (n > 0) {
                args->insert(args->end(), {"--symlink", std::string(target, static_cast<size_t>(n)), path});
            }
        } else {
            args->insert(args->end(), {bind_kind, path, path});
        }
    }
    ::closedir(d);
}

}  // namespace

bool parseSandboxMode(const std::string &text, SandboxMode *mode) {
    if (text == "auto") {
        *mode = SandboxMode::kAuto;
    } else if (text == "on") {
        *mode = SandboxMode::kOn;
    } else if (text == "off") {
        *mode = SandboxMode::kOff;
    } else {
        return false;
    }
    return true;
}

std::vector<std::string> sandboxArgs(const std::string &bwrap, const std::string &tree, int userns_fd) {
    // The whole host first (devices usable, as outside), then /dev and /sys/class rebuilt on
    // tmpfs mounts of the sandbox's own: sysfs and devtmpfs cannot take a new mount point, and
    // the host may have no /dev/infiniband or /sys/class/infiniband to mount over.
    // --die-with-parent: the program goes when bwrap (the pid the caller knows) is killed.
    std::vector<std::string> args = {bwrap};
    if (userns_fd >= 0) {
        args.insert(args.end(), {"--userns", std::to_string(userns_fd)});
    }
    args.insert(args.end(), {"--die-with-parent", "--dev-bind", "/", "/"});
    rebuild("/dev", kHiddenDev, "--dev-bind", &args);
    args.insert(args.end(), {"--ro-bind", tree + "/dev/infiniband", "/dev/infiniband"});
    rebuild("/sys/class", kHiddenClasses, "--bind", &args);
    args.insert(args.end(),
                {"--ro-bind", tree + "/sys/class/infiniband", "/sys/class/infiniband", "--ro-bind",
                 tree + "/sys/class/infiniband_verbs", "/sys/class/infiniband_verbs"});
    return args;
}

std::string findBwrap() {
    const char *path = std::getenv("PATH");
    std::string dirs = path != nullptr && *path != '\0' ? path : "/usr/bin:/bin";
    size_t start = 0;
    while (start <= dirs.size()) {
        size_t colon = dirs.find(':', start);
        std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
        std::string candidate = (dir.empty() ? "." : dir) + "/bwrap";
        if (::access(candidate.c_str(), X_OK) == 0) {
            return candidate;
        }
        if (colon == std::string::npos) {
            break;
        }
        start = colon + 1;
    }
    return "";
}

}  // namespace ibvx::run
