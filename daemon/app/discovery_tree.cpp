#include "daemon/app/discovery_tree.h"

#include <fcntl.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <vector>

#include "common/unique_fd.h"

namespace ibvx::daemon {
namespace {

namespace fs = std::filesystem;

constexpr const char *kTreeName = "discovery";
// What the kernel's uverbs class reports: the ABI of its command interface (class-wide) and of
// each device's. The face replaces that interface, so these only have to be what readers expect.
constexpr const char *kClassAbiVersion = "6";
constexpr const char *kDeviceAbiVersion = "1";
// Linux's char majors 60-63 are for local and experimental use (Documentation/admin-guide/devices.txt).
constexpr unsigned kPlaceholderMajor = 63;

// What the tree says about one device, gathered first so no driver call runs while writing.
struct DeviceFacts {
    std::string name;
    std::optional<ibv_device_attr> attr;
    struct Port {
        ibv_port_attr attr{};
        std::vector<std::optional<ibv_gid_entry>> gids;  // gid_tbl_len slots, empty ones nullopt
    };
    std::vector<Port> ports;  // index p-1 for port p; empty when the device could not be queried
};

// One query session on a device outside any tenant: open, ask, close, under the driver lock when
// the driver needs its calls serialised (device.h).
DeviceFacts gather(Device &dev) {
    DeviceFacts f;
    f.name = dev.info.name;
    std::unique_lock lock(dev.driver_mu, std::defer_lock);
    if (dev.serialize_calls) {
        lock.lock();
    }
    ibv_context *ctx = dev.verbs.openDevice();
    if (ctx == nullptr) {
        spdlog::warn("discovery tree: cannot open {} to query it: {}", f.name, std::strerror(errno));
        return f;
    }
    ibv_device_attr attr{};
    if (int rc = dev.verbs.queryDevice(ctx, &attr); rc == 0) {
        f.attr = attr;
        for (uint8_t p = 1; p <= attr.phys_port_cnt; ++p) {
            DeviceFacts::Port port;
            if (dev.verbs.queryPort(ctx, p, &port.attr) != 0) {
                spdlog::warn("discovery tree: {} port {} cannot be queried", f.name, p);
                break;
            }
            for (int i = 0; i < std::clamp(port.attr.gid_tbl_len, 0, 256); ++i) {
                ibv_gid_entry g{};
                port.gids.push_back(dev.verbs.queryGid(ctx, p, static_cast<uint32_t>(i), &g) == 0
                                        ? std::optional<ibv_gid_entry>(g)
                                        : std::nullopt);
            }
            f.ports.push_back(std::move(port));
        }
    } else {
        spdlog::warn("discovery tree: {} answers no device attributes ({})", f.name,
                     std::strerror(rc < 0 ? -rc : rc));
    }
    (void)dev.verbs.closeDevice(ctx);
    return f;
}

// A GUID or GID half as sysfs prints it: four groups of four hex digits.
std::string guidText(uint64_t host_order) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>(host_order >> 48) & 0xffff,
                  static_cast<unsigned>(host_order >> 32) & 0xffff,
                  static_cast<unsigned>(host_order >> 16) & 0xffff,
                  static_cast<unsigned>(host_order) & 0xffff);
    return buf;
}

std::string gidText(const ibv_gid &gid) {
    return guidText(be64toh(gid.global.subnet_prefix)) + ":" + guidText(be64toh(gid.global.interface_id));
}

// The port's rate line as the kernel prints it ("100 Gb/sec (4X EDR)"): lanes times the lane rate.
std::string rateText(const ibv_port_attr &a) {
    struct Speed {
        uint8_t code;
        int tenths;  // Gb/s per lane, in tenths
        const char *name;
    };
    static constexpr Speed kSpeeds[] = {{1, 25, "SDR"},    {2, 50, "DDR"},    {4, 100, "QDR"},
                                        {8, 100, "FDR10"}, {16, 140, "FDR"},  {32, 250, "EDR"},
                                        {64, 500, "HDR"},  {128, 1000, "NDR"}};
    int lanes = a.active_width == 1    ? 1
                : a.active_width == 2  ? 4
                : a.active_width == 4  ? 8
                : a.active_width == 8  ? 12
                : a.active_width == 16 ? 2
                                       : 0;
    const Speed *s = std::find_if(std::begin(kSpeeds), std::end(kSpeeds),
                                  [&](const Speed &x) { return x.code == a.active_speed; });
    if (lanes == 0 || s == std::end(kSpeeds)) {
        return "0 GB/sec\n";
    }
    int tenths = lanes * s->tenths;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%d%s Gb/sec (%dX %s)\n", tenths / 10, tenths % 10 != 0 ? ".5" : "",
                  lanes, s->name);
    return buf;
}

const char *portStateName(ibv_port_state s) {
    switch (s) {
        case IBV_PORT_DOWN:
            return "DOWN";
        case IBV_PORT_INIT:
            return "INIT";
        case IBV_PORT_ARMED:
            return "ARMED";
        case IBV_PORT_ACTIVE:
            return "ACTIVE";
        case IBV_PORT_ACTIVE_DEFER:
            return "ACTIVE_DEFER";
        default:
            return "NOP";
    }
}

const char *physStateName(uint8_t s) {
    static constexpr const char *kNames[] = {
        "<unknown>",         "Sleep",   "Polling", "Disabled", "PortConfigurationTraining", "LinkUp",
        "LinkErrorRecovery", "Phy Test"};
    return s < std::size(kNames) ? kNames[s] : "<unknown>";
}

// Writes files and directories of one generation; the first error is kept and reported.
// With replace, a file is written beside its place and renamed over it, so a reader of a tree
// already published (a running sandbox binds its directories) sees the old text or the new.
class Writer {
  public:
    explicit Writer(fs::path root, bool replace = false) : root_(std::move(root)), replace_(replace) {}

    void dir(const fs::path &rel) {
        std::error_code ec;
        fs::create_directories(root_ / rel, ec);
        fail(ec.value(), rel);
        (void)::chmod((root_ / rel).c_str(), 0755);
    }
    void file(const fs::path &rel, const std::string &text) {
        dir(rel.parent_path());
        const fs::path target = root_ / rel;
        const fs::path written = replace_ ? fs::path(target.string() + ".new") : target;
        std::ofstream out(written, std::ios::trunc);
        out << text;
        out.close();
        fail(out ? 0 : EIO, rel);
        (void)::chmod(written.c_str(), 0444);
        if (replace_ && ::rename(written.c_str(), target.c_str()) < 0) {
            fail(errno, rel);
        }
    }
    // The placeholder node (see the header): a character device of major 63, which Linux keeps
    // for local and experimental use and no driver registers, so open() fails at once (ENXIO;
    // EACCES where the tree is mounted nodev, as the sandbox and the CDI mounts do). UCX wants
    // exactly this: stat() says S_ISCHR and access(R_OK|W_OK) succeeds. A broker without
    // CAP_MKNOD gets a Unix socket nobody listens on instead (open fails with ENXIO too), which
    // UCX passes over.
    void placeholder(const fs::path &rel, unsigned minor) {
        dir(rel.parent_path());
        const fs::path path = root_ / rel;
        if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(kPlaceholderMajor, minor)) == 0) {
            (void)::chmod(path.c_str(), 0666);  // whatever the umask
            return;
        }
        if (errno != EPERM) {
            fail(errno, rel);
            return;
        }
        static std::once_flag warned;
        std::call_once(warned, [] {
            spdlog::warn(
                "discovery tree: no CAP_MKNOD, so /dev/infiniband placeholders are sockets: "
                "UCX, which wants a character device, will not list the devices");
        });
        // Bound through /proc/self/fd so a long runtime directory does not meet sun_path's 108 bytes.
        UniqueFd dirfd(::open((root_ / rel.parent_path()).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
        UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!dirfd || !sock) {
            fail(errno, rel);
            return;
        }
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        std::snprintf(sa.sun_path, sizeof(sa.sun_path), "/proc/self/fd/%d/%s", dirfd.get(),
                      rel.filename().c_str());
        if (::bind(sock.get(), reinterpret_cast<const sockaddr *>(&sa), sizeof(sa)) < 0) {
            fail(errno, rel);
            return;
        }
        (void)::chmod(path.c_str(), 0666);
    }
    Status status() const { return status_; }

  private:
    void fail(int err, const fs::path &rel) {
        if (err != 0 && status_.isOk()) {
            status_ = Status::fromErrno(
                err, "discovery tree: cannot write " + (root_ / rel).string() + ": " + std::strerror(err));
        }
    }
    fs::path root_;
    bool replace_;
    Status status_;
};

// What every CPU of the host looks like as a sysfs cpumask ("ffffffff,0000000f") and list ("0-35"):
// a software device sits in no NUMA node, so it is local to all of them.
std::pair<std::string, std::string> allCpus() {
    long n = std::max(1L, ::sysconf(_SC_NPROCESSORS_CONF));
    std::string mask;
    for (long hi = ((n + 31) / 32) * 32; hi > 0; hi -= 32) {
        long bits = std::clamp(n - (hi - 32), 0L, 32L);
        uint32_t word = bits == 32 ? 0xffffffffu : ((1u << bits) - 1u);
        char buf[16];
        std::snprintf(buf, sizeof(buf), "%s%08x", mask.empty() ? "" : ",", word);
        mask += buf;
    }
    return {mask + "\n", "0-" + std::to_string(n - 1) + "\n"};
}

void writePorts(Writer &w, const DeviceFacts &f);

void writeDevice(Writer &w, const DeviceFacts &f, int index) {
    const fs::path ib = fs::path("sys/class/infiniband") / f.name;
    const std::string uverbs = "uverbs" + std::to_string(index);
    w.placeholder(fs::path("dev/infiniband") / uverbs, static_cast<unsigned>(index));
    const fs::path verbs = fs::path("sys/class/infiniband_verbs") / uverbs;
    w.file(verbs / "ibdev", f.name + "\n");
    w.file(verbs / "abi_version", std::string(kDeviceAbiVersion) + "\n");
    w.file(ib / "node_type", "1: CA\n");
    auto [mask, list] = allCpus();
    w.file(ib / "device/numa_node", "-1\n");
    w.file(ib / "device/local_cpus", mask);
    w.file(ib / "device/local_cpulist", list);
    if (!f.attr) {
        return;
    }
    const ibv_device_attr &a = *f.attr;
    w.file(ib / "node_guid", guidText(be64toh(a.node_guid)) + "\n");
    w.file(ib / "sys_image_guid", guidText(be64toh(a.sys_image_guid)) + "\n");
    w.file(ib / "fw_ver", std::string(a.fw_ver, strnlen(a.fw_ver, sizeof(a.fw_ver))) + "\n");
    char hw[32];
    std::snprintf(hw, sizeof(hw), "0x%x\n", a.hw_ver);
    w.file(ib / "hw_rev", hw);
    w.file(ib / "hca_type", f.name + "\n");
    w.file(ib / "node_desc", f.name + "\n");
    writePorts(w, f);
}

void writePorts(Writer &w, const DeviceFacts &f) {
    const fs::path ib = fs::path("sys/class/infiniband") / f.name;
    for (size_t i = 0; i < f.ports.size(); ++i) {
        const DeviceFacts::Port &p = f.ports[i];
        const fs::path port = ib / "ports" / std::to_string(i + 1);
        w.file(port / "state", std::to_string(p.attr.state) + ": " + portStateName(p.attr.state) + "\n");
        w.file(port / "phys_state",
               std::to_string(p.attr.phys_state) + ": " + physStateName(p.attr.phys_state) + "\n");
        w.file(port / "rate", rateText(p.attr));
        w.file(port / "link_layer",
               p.attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet\n" : "InfiniBand\n");
        char num[32];
        std::snprintf(num, sizeof(num), "0x%x\n", p.attr.lid);
        w.file(port / "lid", num);
        std::snprintf(num, sizeof(num), "0x%x\n", p.attr.sm_lid);
        w.file(port / "sm_lid", num);
        w.file(port / "lid_mask_count", std::to_string(p.attr.lmc) + "\n");
        w.file(port / "sm_sl", std::to_string(p.attr.sm_sl) + "\n");
        std::snprintf(num, sizeof(num), "0x%08x\n", p.attr.port_cap_flags);
        w.file(port / "cap_mask", num);
        for (size_t g = 0; g < p.gids.size(); ++g) {
            const std::string n = std::to_string(g);
            const std::optional<ibv_gid_entry> &e = p.gids[g];
            w.file(port / "gids" / n, gidText(e ? e->gid : ibv_gid{}) + "\n");
            // The kernel answers an empty slot's type and netdev with an error; a file must say
            // something, so an empty slot gets empty files.
            std::string type, ndev;
            if (e) {
                type = e->gid_type == IBV_GID_TYPE_ROCE_V2 ? "RoCE v2\n" : "IB/RoCE v1\n";
                char ifname[IF_NAMESIZE] = {};
                if (e->ndev_ifindex != 0 && ::if_indextoname(e->ndev_ifindex, ifname) != nullptr) {
                    ndev = std::string(ifname) + "\n";
                }
            }
            w.file(port / "gid_attrs/types" / n, type);
            w.file(port / "gid_attrs/ndevs" / n, ndev);
        }
        // The face answers the default table: one full-membership 0xffff entry (queries.cpp).
        w.file(port / "pkeys/0", "0xffff\n");
    }
}

std::mutex &publishMutex() {
    static auto *mu = new std::mutex;  // publishes (start-up, reloads) never interleave
    return *mu;
}

}  // namespace

std::string discoveryTreePath(const std::string &runtime_dir) {
    return (fs::path(runtime_dir) / kTreeName).string();
}

Status publishDiscoveryTree(const std::string &runtime_dir, DeviceRegistry &devices) {
    std::lock_guard lock(publishMutex());
    std::vector<DeviceFacts> facts;
    for (const DeviceInfo &info : devices.list()) {
        if (Device *dev = devices.find(info.name); dev != nullptr) {
            facts.push_back(gather(*dev));
        }
    }
    const fs::path dir(runtime_dir);
    const std::string generation =
        std::string(kTreeName) + "." +
        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    Writer w(dir / generation);
    w.dir(".");
    w.dir("dev/infiniband");
    w.dir("sys/class/infiniband");
    w.file("sys/class/infiniband_verbs/abi_version", std::string(kClassAbiVersion) + "\n");
    for (size_t i = 0; i < facts.size(); ++i) {
        writeDevice(w, facts[i], static_cast<int>(i));
    }
    std::error_code ec;
    if (!w.status().isOk()) {
        fs::remove_all(dir / generation, ec);
        return w.status();
    }
    // The swap: a new symlink renamed over the old one, so a reader sees one generation or the next.
    const fs::path link = dir / kTreeName;
    const fs::path staged = dir / (std::string(kTreeName) + ".link");
    fs::path previous = fs::read_symlink(link, ec);
    fs::remove(staged, ec);
    if (::symlink(generation.c_str(), staged.c_str()) < 0 || ::rename(staged.c_str(), link.c_str()) < 0) {
        int err = errno;
        fs::remove_all(dir / generation, ec);
        return Status::fromErrno(
            err, "discovery tree: cannot publish " + link.string() + ": " + std::strerror(err));
    }
    for (const fs::directory_entry &e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.starts_with(std::string(kTreeName) + ".") && name != generation &&
            name != previous.string() && name != staged.filename().string()) {
            fs::remove_all(e.path(), ec);
        }
    }
    spdlog::info("discovery tree: {} device(s) under {}", facts.size(), link.string());
    return Status::ok();
}

Status refreshDiscoveryPorts(const std::string &runtime_dir, DeviceRegistry &devices) {
    const fs::path link = fs::path(runtime_dir) / kTreeName;
    std::error_code ec;
    const fs::path generation = fs::read_symlink(link, ec);
    if (ec) {
        return publishDiscoveryTree(runtime_dir, devices);
    }
    std::lock_guard lock(publishMutex());
    Writer w(fs::path(runtime_dir) / generation, true);
    for (const DeviceInfo &info : devices.list()) {
        Device *dev = devices.find(info.name);
        if (dev == nullptr) {
            continue;
        }
        // Only a RoCE port's state and GIDs follow the host's interfaces: an InfiniBand port's
        // files stay as published, not rewritten at every interface change of the host.
        DeviceFacts f = gather(*dev);
        if (std::any_of(f.ports.begin(), f.ports.end(), [](const DeviceFacts::Port &p) {
                return p.attr.link_layer == IBV_LINK_LAYER_ETHERNET;
            })) {
            writePorts(w, f);
        }
    }
    return w.status();
}

}  // namespace ibvx::daemon
