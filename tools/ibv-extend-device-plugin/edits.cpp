#include "tools/ibv-extend-device-plugin/edits.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/unique_fd.h"

namespace ibvx::device_plugin {
namespace {

namespace fs = std::filesystem;

constexpr const char *kHostClassDir = "/sys/class";

StatusOr<std::string> resolve(const fs::path &p, const char *what) {
    std::error_code ec;
    fs::path real = fs::canonical(p, ec);
    if (ec) {
        return Status::fromErrno(
            ec.value(), std::string("cannot resolve ") + what + " " + p.string() + ": " + ec.message());
    }
    return real.string();
}

// The broker's discovery tree (daemon/app/discovery_tree.h, docs/kubernetes.md) as the
// container's /dev/infiniband and /sys/class/infiniband{,_verbs}. The placeholders are sockets,
// not device nodes, so they travel as mounts, not device specs. A container's sysfs is the host's
// (read-only): where the host has the class directories the tree is mounted on them (hiding the
// host's HCAs); where it has none, sysfs cannot take a new mount point, so the tree's sys/class
// (holding those two classes only) replaces /sys/class. No tree yet (a broker that has not
// started): no mounts; the plugin's periodic resolution adds them when it appears.
void addDiscoveryMounts(const std::string &socket_dir, ContainerEdits *e) {
    std::error_code ec;
    fs::path tree = fs::canonical(fs::path(socket_dir) / "discovery", ec);
    if (ec) {
        return;
    }
    e->mounts.push_back({(tree / "dev/infiniband").string(), "/dev/infiniband", true});
    if (fs::is_directory(kHostClassDir + std::string("/infiniband")) &&
        fs::is_directory(kHostClassDir + std::string("/infiniband_verbs"))) {
        e->mounts.push_back({(tree / "sys/class/infiniband").string(), "/sys/class/infiniband", true});
        e->mounts.push_back(
            {(tree / "sys/class/infiniband_verbs").string(), "/sys/class/infiniband_verbs", true});
    } else {
        e->mounts.push_back({(tree / "sys/class").string(), "/sys/class", true});
    }
}

}  // namespace

StatusOr<ContainerEdits> computeEdits(const HostPaths &paths) {
    fs::path socket(paths.broker_socket);
    if (!socket.is_absolute() || socket.filename().empty()) {
        return invalidArgument("the broker socket must be an absolute path to a file, not '" +
                               paths.broker_socket + "'");
    }
    ASSIGN_OR_RETURN(std::string socket_dir, resolve(socket.parent_path(), "the broker socket's directory"));
    fs::path libs(paths.client_lib_dir);
    ASSIGN_OR_RETURN(std::string client_lib, resolve(libs / "libibv_extend.so.4", "the client library"));
    ASSIGN_OR_RETURN(std::string face_dir,
                     resolve(libs / "ibv_extend" / "verbs", "the libibverbs face directory"));
    if (!fs::exists(fs::path(face_dir) / "libibverbs.so.1")) {
        return notFound("the libibverbs face directory " + face_dir + " has no libibverbs.so.1");
    }

    const std::string lib = kContainerLibDir;
    const std::string face = lib + "/ibv_extend/verbs";
    ContainerEdits e;
    // Read-only: connecting to a Unix socket needs no write access to its mount (checked by the
    // plugin's tests), and the container can then neither remove nor replace the broker's socket.
    e.mounts.push_back({socket_dir, kContainerSocketDir, true});
    // The face finds libibv_extend.so.4 two directories up ($ORIGIN/../..), as when installed.
    e.mounts.push_back({client_lib, lib + "/libibv_extend.so.4", true});
    e.mounts.push_back({face_dir, face, true});
    // The drivers' tenant-side data paths (lib<provider>-verbs.so, docs/verbs.md) beside the face,
    // so ibv_post_send and ibv_poll_cq work inside; the face finds them in the provider directory.
    std::error_code ec;
    bool any_datapath = false;
    for (const fs::directory_entry &d : fs::directory_iterator(libs / "ibv_extend", ec)) {
        const std::string name = d.path().filename().string();
        if (name.size() > 12 && name.rfind("lib", 0) == 0 && name.ends_with("-verbs.so")) {
            ASSIGN_OR_RETURN(std::string real, resolve(d.path(), "a driver's data path"));
            e.mounts.push_back({real, lib + "/ibv_extend/" + name, true});
            any_datapath = true;
        }
    }
    if (any_datapath) {
        e.envs["IBV_EXTEND_PROVIDER_DIR"] = lib + "/ibv_extend";
    }
    addDiscoveryMounts(socket_dir, &e);
    e.envs["IBV_EXTEND_SOCKET"] = std::string(kContainerSocketDir) + "/" + socket.filename().string();
    e.envs["IBV_EXTEND_MODE"] = "broker";
    // The face first: programs that resolve libibverbs.so.1 by name get the broker's devices.
    e.envs["LD_LIBRARY_PATH"] = face + ":" + lib;
    return e;
}

std::string cdiSpec(const ContainerEdits &edits) {
    nlohmann::json env = nlohmann::json::array();
    for (const auto &[name, value] : edits.envs) {
        env.push_back(name + "=" + value);
    }
    nlohmann::json mounts = nlohmann::json::array();
    for (const Mount &m : edits.mounts) {
        nlohmann::json options = {"rbind", "nosuid", "nodev"};
        if (m.read_only) {
            options.push_back("ro");
        }
        mounts.push_back({{"hostPath", m.host_path},
                          {"containerPath", m.container_path},
                          {"type", "bind"},
                          {"options", options}});
    }
    nlohmann::json spec = {
        {"cdiVersion", "0.5.0"},
        {"kind", kCdiKind},
        {"devices", {{{"name", kCdiDevice}, {"containerEdits", {{"env", env}, {"mounts", mounts}}}}}},
    };
    return spec.dump(2) + "\n";
}

Status writeFileAtomically(const std::string &path, const std::string &content) {
    fs::path target(path);
    std::string tmp = (target.parent_path() / ("." + target.filename().string() + ".XXXXXX")).string();
    UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
    if (!fd) {
        return Status::fromErrno(
            errno, "cannot create a temporary file next to " + path + ": " + std::strerror(errno));
    }
    auto fail = [&](const std::string &what) {
        int err = errno;
        ::unlink(tmp.c_str());
        return Status::fromErrno(err, what + " " + path + ": " + std::strerror(err));
    };
    size_t done = 0;
    while (done < content.size()) {
        ssize_t n = ::write(fd.get(), content.data() + done, content.size() - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return fail("cannot write");
        }
        done += static_cast<size_t>(n);
    }
    // Readable by the runtime whatever our umask; mkostemp creates 0600.
    if (::fchmod(fd.get(), 0644) < 0 || ::fsync(fd.get()) < 0) {
        return fail("cannot finish");
    }
    fd.reset();
    if (::rename(tmp.c_str(), path.c_str()) < 0) {
        return fail("cannot rename into");
    }
    return Status::ok();
}

}  // namespace ibvx::device_plugin
