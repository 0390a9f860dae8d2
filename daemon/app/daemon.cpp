#include "daemon/app/daemon.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <utility>

#include "common/build_config.h"
#include "common/fd_store.h"
#include "common/unix_socket.h"
#include "daemon/app/config.h"
#include "daemon/app/discovery_tree.h"
#include "daemon/core/broker.h"
#include "daemon/edge/admin_events.h"
#include "daemon/edge/convert.h"
#include "daemon/edge/server.h"
#include "providers/loader/loader.h"

namespace ibvx::daemon {
namespace {

void setupLogging(const std::string &level) {
    std::shared_ptr<spdlog::logger> logger;
    if (getenv("JOURNAL_STREAM") != nullptr) {
        logger = std::make_shared<spdlog::logger>("ibv-extendd",
                                                  std::make_shared<spdlog::sinks::systemd_sink_mt>());
    } else {
        logger = std::make_shared<spdlog::logger>("ibv-extendd",
                                                  std::make_shared<spdlog::sinks::stderr_sink_mt>());
        logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e ibv-extendd[%P] %l: %v");
    }
    logger->set_level(spdlog::level::from_str(level));
    spdlog::set_default_logger(logger);
}

// True when some broker answers on path (then we must not steal its socket).
bool socketAnswers(const std::string &path) {
    return connectUnix(path).isOk();
}

// The listening socket among the inherited fds: a restart's own ("ibvx.listen": this broker
// created the path; "ibvx.listen.sd": systemd's), else the one socket systemd's socket unit
// passed (any name not ours). *created and *activated say which.
StatusOr<UniqueFd> takeListenSocket(std::vector<std::pair<std::string, UniqueFd>> &fds, bool *created,
                                    bool *activated) {
    UniqueFd found;
    size_t sockets = 0;
    for (auto it = fds.begin(); it != fds.end();) {
        const std::string &name = it->first;
        bool ours = name == "ibvx.listen" || name == "ibvx.listen.sd";
        // The restart state's own names; anything else that listens is a socket unit's (whose
        // name is its FileDescriptorName=, by default the unit's name: "ibvx.socket" is possible).
        bool state = name == "ibvx.global" || (name.rfind("ibvx.s", 0) == 0 && name.size() > 6 &&
                                               std::isdigit(static_cast<unsigned char>(name[6])));
        if (ours || (!state && sd_is_socket_unix(it->second.get(), SOCK_STREAM, 1, nullptr, 0) > 0)) {
            ++sockets;
            *created = name == "ibvx.listen";
            *activated = name != "ibvx.listen";
            found = std::move(it->second);
            it = fds.erase(it);
            if (ours) {
                break;
            }
            continue;
        }
        ++it;
    }
    if (sockets > 1) {
        return invalidArgument("systemd passed " + std::to_string(sockets) +
                               " sockets; expected one Unix stream socket");
    }
    return found;
}

StatusOr<UniqueFd> listenOn(const DaemonConfig &cfg, bool *created) {
    *created = false;
    const std::string &path = cfg.socket;
    auto addr = unixAddress(path);
    if (!addr.isOk()) {
        return addr.status();
    }
    std::error_code ec;
    std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) {
        std::filesystem::create_directories(parent, ec);
        if (ec) {
            return Status::fromErrno(ec.value(), "cannot create " + parent.string() + ": " + ec.message());
        }
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            return Status(Code::kAlreadyExists, EEXIST, path + " exists and is not a socket");
        }
        if (socketAnswers(path)) {
            return Status(Code::kAlreadyExists, EADDRINUSE, "another broker is serving " + path);
        }
        ::unlink(path.c_str());  // a stale socket of a broker that died
    }
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
        return Status::fromErrno(errno, "socket failed");
    }
    if (::bind(fd.get(), addr->get(), addr->len) < 0) {
        return Status::fromErrno(errno, "cannot bind " + path + ": " + std::strerror(errno));
    }
    *created = true;
    if (cfg.socket_mode && ::chmod(path.c_str(), *cfg.socket_mode) < 0) {
        return Status::fromErrno(errno, "cannot chmod " + path);
    }
    if (!cfg.socket_group.empty()) {
        group *g = ::getgrnam(cfg.socket_group.c_str());
        if (g == nullptr) {
            return invalidArgument("socket_group '" + cfg.socket_group + "' does not exist");
        }
        if (::chown(path.c_str(), static_cast<uid_t>(-1), g->gr_gid) < 0) {
            return Status::fromErrno(errno, "cannot chown " + path + " to group " + cfg.socket_group);
        }
    }
    if (::listen(fd.get(), 128) < 0) {
        return Status::fromErrno(errno, "listen failed");
    }
    return fd;
}

// The drivers [drivers] names. One that does not load is logged with file, line and name, and
// the broker serves what it has (a host without one vendor's library still serves the others);
// a reload reports it as an error (reload() collects it from the load records), and so does
// --check-config (a warning).
void loadDrivers(const DaemonConfig &cfg, bool first) {
    if (first) {
        loader::loadAll();  // the reference's discovery: config dir and IBV_EXTEND_DRIVERS
    }
    for (size_t i = 0; i < cfg.drivers.size(); ++i) {
        const std::string &name = cfg.drivers[i];
        bool known = false;
        for (const auto &rec : loader::loadRecords()) {
            known = known || (rec.name == name && rec.loaded);
        }
        if (known) {
            continue;
        }
        loader::LoadRecord rec = loader::loadDriver(name, cfg.config_path);
        if (rec.loaded) {
            spdlog::info("loaded extension driver '{}' from {}", name, rec.path);
            continue;
        }
        std::string where = i < cfg.driver_where.size() ? cfg.driver_where[i] : cfg.config_path;
        spdlog::error("{}: drivers.names: cannot load extension driver '{}': {}", where, name, rec.error);
    }
}

// softnda is the embedded default: loaded when no rdma-core device has an extension driver.
void loadDefaultProvider() {
    int count = 0;
    ibv_device **list = ibv_get_device_list(&count);
    bool matched = false;
    if (list != nullptr) {  // NULL (ENOSYS) without RDMA in the kernel; never free NULL
        for (int i = 0; i < count && !matched; ++i) {
            matched = loader::findDriver(list[i]) != nullptr;
        }
        ibv_free_device_list(list);
    }
    if (matched || loader::findDriverByName("softnda") != nullptr) {
        return;
    }
    loader::LoadRecord rec = loader::loadDriver("softnda", "default");
    if (rec.loaded) {
        spdlog::info("no hardware extension driver matched a device; serving softnda from {}", rec.path);
    } else {
        spdlog::warn("no hardware driver matched and softnda could not be loaded: {}", rec.error);
    }
}

Status configureProviders(const DaemonConfig &cfg) {
    for (const ProviderOption &o : cfg.provider_options) {
        const ibv_extend_vdev_ops *provider = nullptr;
        for (const ibv_extend_vdev_ops *v : loader::vdevProviders()) {
            if (o.provider == v->provider) {
                provider = v;
            }
        }
        if (provider == nullptr) {
            return invalidArgument(o.where + ": [" + o.provider +
                                   "] names no loaded virtual-device provider");
        }
        if (provider->configure == nullptr) {
            return invalidArgument(o.where + ": provider " + o.provider + " takes no options");
        }
        int rc = provider->configure(o.key.c_str(), o.value.c_str());
        if (rc == -EBUSY) {
            spdlog::warn("{}: {}.{} not applied: the provider has open devices", o.where, o.provider, o.key);
        } else if (rc == -ENODEV) {
            return invalidArgument(o.where + ": " + o.provider + "." + o.key + " = '" + o.value +
                                   "' names a network interface this host (the broker's network namespace) "
                                   "does not have");
        } else if (rc < 0) {
            return invalidArgument(o.where + ": " + o.provider + "." + o.key + " = '" + o.value +
                                   "' rejected by the provider (unknown key or value out of range)");
        }
    }
    return Status::ok();
}

// Where the discovery tree lives: beside the socket.
std::string runtimeDir(const DaemonConfig &cfg) {
    const std::string dir = std::filesystem::path(cfg.socket).parent_path().string();
    return dir.empty() ? "." : dir;
}

// What the exit code of a failed Daemon::create() is: 2 when the configuration is at fault.
int exitCodeFor(const Status &st) {
    return st.code() == Code::kInvalidArgument ? 2 : 1;
}

// A failure of the server is a runtime failure whatever errno it carries.
Status runtimeFailure(const Status &st) {
    return Status(Code::kInternal, st.errnoValue(), st.message());
}

StatusOr<long> adminGid(const DaemonConfig &cfg) {
    if (cfg.admin_group.empty()) {
        return -1L;
    }
    group *g = ::getgrnam(cfg.admin_group.c_str());
    if (g == nullptr) {
        return invalidArgument(cfg.config_path + ": admin_group '" + cfg.admin_group + "' does not exist");
    }
    return static_cast<long>(g->gr_gid);
}

// The shipped unit's configuration file, what --check-config checks when told no other.
constexpr const char *kDefaultConfig = "/etc/ibv-extend/ibv-extendd.toml";

// The name of the memfd that carries the running configuration's text to the next process.
constexpr const char *kConfigFdName = "ibvx.config";

// The configuration text a previous broker process ran with, when this process is its restart
// (systemd's fd store or an exec passed "ibvx.config"); "" otherwise. Leaves LISTEN_FDS in place
// for Daemon::init().
std::string inheritedConfigText() {
    char **names = nullptr;
    int n = sd_listen_fds_with_names(0, &names);
    std::string text;
    for (int i = 0; i < n; ++i) {
        if (names != nullptr && names[i] != nullptr && std::strcmp(names[i], kConfigFdName) == 0) {
            char buf[4096];
            off_t at = 0;
            ssize_t got;
            while ((got = ::pread(SD_LISTEN_FDS_START + i, buf, sizeof(buf), at)) > 0) {
                text.append(buf, static_cast<size_t>(got));
                at += got;
            }
        }
    }
    if (names != nullptr) {
        for (int i = 0; i < n; ++i) {
            free(names[i]);
        }
        free(names);
    }
    return text;
}

// A start that fails on its configuration, under socket activation, closes the connections
// waiting on systemd's socket: left there, they would trigger the next start at once, again and
// again, until systemd gives up on the socket unit too. Their clients see the broker close.
void closeWaitingConnections() {
    int n = sd_listen_fds(0);
    size_t closed = 0;
    for (int i = 0; i < n; ++i) {
        int fd = SD_LISTEN_FDS_START + i;
        if (sd_is_socket_unix(fd, SOCK_STREAM, 1, nullptr, 0) <= 0) {
            continue;
        }
        pollfd p{fd, POLLIN, 0};
        while (::poll(&p, 1, 0) == 1 && (p.revents & POLLIN) != 0) {
            int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c < 0) {
                break;
            }
            ::close(c);
            ++closed;
        }
    }
    if (closed > 0) {
        fprintf(stderr, "ibv-extendd: closed %zu waiting connection(s): the broker cannot start\n", closed);
    }
}

// --check-config: what a start would refuse, without starting (ExecReload= runs it first).
int checkConfig(const std::string &path) {
    DaemonConfig cfg;
    if (Status st = loadConfigFile(path, &cfg); !st.isOk()) {
        fprintf(stderr, "ibv-extendd: %s\n", st.message().c_str());
        return 2;
    }
    if (auto gid = adminGid(cfg); !gid.isOk()) {
        fprintf(stderr, "ibv-extendd: %s\n", gid.status().message().c_str());
        return 2;
    }
    // Provider options are checked by the providers themselves, as a start would; what they
    // and the loader log goes to stderr (the journal under ExecReload=), warnings and up.
    setupLogging("warn");
    loadDrivers(cfg, true);  // what does not load is logged (a warning: a start serves on)
    loadDefaultProvider();
    if (Status st = configureProviders(cfg); !st.isOk()) {
        fprintf(stderr, "ibv-extendd: %s\n", st.message().c_str());
        return 2;
    }
    printf("%s: configuration OK\n", path.c_str());
    return 0;
}

}  // namespace

void AuditEvents::object(const Session &s, AuditLog::Action action, AdminEvents::Event::Kind event,
                         ObjectKind kind, uint64_t handle) {
    hub_->audit().object(s, action, kind, handle);
    if (!hub_->watched()) {
        return;
    }
    auto e = AdminEvents::aboutSession(event, s);
    e.set_object_kind(toProto(kind));
    e.set_handle(handle);
    hub_->publish(std::move(e));
}

void AuditEvents::objectCreated(const Session &s, ObjectKind kind, uint64_t handle) {
    object(s, AuditLog::Action::kCreate, AdminEvents::Event::OBJECT_CREATE, kind, handle);
}

void AuditEvents::objectDestroyed(const Session &s, ObjectKind kind, uint64_t handle) {
    object(s, AuditLog::Action::kDestroy, AdminEvents::Event::OBJECT_DESTROY, kind, handle);
}

void AuditEvents::quotaDenied(const PeerIdentity &peer, uint64_t session, const std::string &message) {
    // Debug level: a tenant hammering its limit must not flood the log; watchers see each one.
    spdlog::debug("quota: session {} pid {} uid {}: {}", session, peer.creds.pid, peer.creds.uid, message);
    AdminEvents::Event e;
    e.set_kind(AdminEvents::Event::QUOTA_DENIAL);
    e.set_session(session);
    e.set_pid(peer.creds.pid);
    e.set_uid(peer.creds.uid);
    e.set_message(message);
    hub_->publish(std::move(e));
}

Daemon::Daemon(const DaemonConfig &config) : config_(config) {}

StatusOr<std::unique_ptr<Daemon>> Daemon::create(const DaemonConfig &config) {
    std::unique_ptr<Daemon> d(new Daemon(config));
    RETURN_IF_ERROR(d->init());
    return d;
}

Status Daemon::init() {
    ASSIGN_OR_RETURN(long admin_gid, adminGid(config_));
    RETURN_IF_ERROR(blockSignals());
    // What the previous process left: the listening socket and, after a restart, the state.
    ASSIGN_OR_RETURN(inherited_, listenFdsWithNames());
    RETURN_IF_ERROR(loadDevices());
    ASSIGN_OR_RETURN(UniqueFd listen_fd, takeListenSocket(inherited_, &socket_created_, &socket_activated_));
    if (listen_fd) {
        spdlog::info("{}", socket_activated_ ? "using the socket passed by systemd"
                                             : "using the listening socket of the previous broker process");
    } else {
        ASSIGN_OR_RETURN(listen_fd, listenOn(config_, &socket_created_));
    }
    // The previous configuration's text was read by runDaemon() if it was needed; this
    // process keeps its own (keepConfigText below).
    std::erase_if(inherited_, [](const auto &named) { return named.first == kConfigFdName; });
    makeBroker();
    RETURN_IF_ERROR(makeRestartState());
    std::vector<std::shared_ptr<Session>> restored;
    RestoreReport report = restart_->restore(inherited_, &restored);
    inherited_.clear();  // fds nobody claimed close here
    RETURN_IF_ERROR(restart_->start());
    // After the restore: a driver takes its device state back before anything else opens it.
    publishDiscovery();
    keepConfigText(config_.config_text);
    RETURN_IF_ERROR(startServer(admin_gid, std::move(listen_fd)));
    for (auto &s : restored) {
        server_->watchSession(s);
    }
    started_ = true;
    if (report.restored) {
        restart_->noteServing();
        report.took_ms = restart_->lastRestartTookMs();
        std::string summary = report.summary();
        spdlog::info("{}", summary);
        hub_->publish(AdminEvents::simple(AdminEvents::Event::BROKER_RESTART, summary));
    }
    spdlog::info("serving on {} ({} device(s))", config_.socket, devices_.size());
    return Status::ok();
}

Status Daemon::makeRestartState() {
    FdStoreHooks hooks;
    if (config_.fd_store) {
        if (getenv("NOTIFY_SOCKET") == nullptr) {
            spdlog::warn(
                "--fd-store without NOTIFY_SOCKET (not under systemd): no fd store; a crash ends "
                "every session");
        } else {
            auto store = std::make_shared<FdStore>(true);
            fd_store_ = store;
            hooks.add = [store](const std::vector<std::pair<std::string, int>> &fds) {
                return store->addBatch(fds);
            };
            hooks.remove = [store](const std::string &name) { return store->remove(name); };
        }
    }
    restart_ = std::make_unique<RestartState>(*broker_, std::move(hooks));
    broker_->setCommitSink([this](Session &s) { return restart_->commit(s); });
    broker_->setEndSink([this](Session &s) { restart_->sessionEnded(s); });
    char exe[4096];
    ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    binary_ = n > 0 ? std::string(exe, static_cast<size_t>(n)) : std::string();
    // A binary replaced on disk shows as "... (deleted)": the path is what an upgrade execs.
    const std::string deleted = " (deleted)";
    if (binary_.size() > deleted.size() &&
        binary_.compare(binary_.size() - deleted.size(), deleted.size(), deleted) == 0) {
        binary_.resize(binary_.size() - deleted.size());
    }
    return Status::ok();
}

Status Daemon::blockSignals() {
    // Before any thread exists, so every thread inherits the mask and only signalfd sees them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, &old_mask_);
    mask_set_ = true;
    signal(SIGPIPE, SIG_IGN);
    sigfd_.reset(::signalfd(-1, &sigs, SFD_CLOEXEC));
    if (!sigfd_) {
        return Status(Code::kInternal, errno, std::string("signalfd failed: ") + std::strerror(errno));
    }
    return Status::ok();
}

Status Daemon::loadDevices() {
    loadDrivers(config_, true);
    loadDefaultProvider();
    RETURN_IF_ERROR(configureProviders(config_));
    devices_.scan();
    for (const DeviceInfo &dev : devices_.list()) {
        spdlog::info("device {} (driver {}, ops v{}, {})", dev.name, dev.provider, dev.driver_version,
                     dev.virtual_device ? "virtual" : "rdma-core");
    }
    if (devices_.size() == 0) {
        spdlog::warn("no device to serve: tenants will see an empty device list");
    }
    return Status::ok();
}

// The tree is a convenience for tenants' middleware: a broker that cannot write it still serves
// (ibv-extend-run then runs programs without it and says so).
void Daemon::publishDiscovery() {
    if (Status st = publishDiscoveryTree(runtimeDir(config_), devices_); !st.isOk()) {
        spdlog::warn("{}", st.message());
    }
}

void Daemon::makeBroker() {
    Broker::Options bopt;
    bopt.attach_timeout = std::chrono::milliseconds(config_.attach_timeout_ms);
    broker_ = std::make_unique<Broker>(bopt, &devices_);
    broker_->setPolicy(std::make_shared<const Policy>(config_.policy));
    broker_->quotas().configure(config_.quotas);
    if (config_.policy.enabled) {
        spdlog::info("policy: deny by default; {} allowed uid(s), {} allowed gid(s), {} tenant class(es)",
                     config_.policy.allow_uids.size(), config_.policy.allow_gids.size(),
                     config_.policy.classes.size());
    }
    broker_->setEvents(&events_);
}

Status Daemon::startServer(long admin_gid, UniqueFd listen_fd) {
    ServerOptions sopt;
    sopt.handshake_timeout = std::chrono::milliseconds(config_.handshake_timeout_ms);
    sopt.admin_gid = admin_gid;
    sopt.events = hub_;
    sopt.admin.admin_group = config_.admin_group;
    sopt.admin.config_path = config_.config_path;
    sopt.admin.socket_activated = socket_activated_;
    sopt.admin.socket_path = sopt.admin.socket_activated ? std::string() : config_.socket;
    sopt.admin.reload = [this]() { return reload(); };
    sopt.admin.restart = [this](bool require_keep) { return requestRestart(require_keep); };
    sopt.admin.quotas_changed = [this] { restart_->markAlive(); };  // rewrites ibvx.global now
    sopt.admin.restart_info = [this]() {
        return RestartInfo{restart_->restarts(), restart_->lastRestartUnixMs(), restart_->lastRestartTookMs(),
                           restart_->lastRestartWasCrash()};
    };
    // systemd: WATCHDOG=1 at half of WatchdogSec= and a STATUS= line when the counts change,
    // from the serving loop, so a wedged loop gets the broker restarted.
    uint64_t watchdog_usec = 0;
    watchdog_ = sd_watchdog_enabled(0, &watchdog_usec) > 0 && watchdog_usec > 0;
    sopt.heartbeat_period = watchdog_ ? std::chrono::milliseconds(std::max<uint64_t>(watchdog_usec / 2000, 1))
                                      : std::chrono::milliseconds(1000);
    sopt.heartbeat = [this]() { heartbeat(); };
    if (!config_.kubernetes.pod_resources_socket.empty()) {
        sopt.pods = std::make_shared<PodResolver>(config_.kubernetes.pod_resources_socket,
                                                  config_.kubernetes.resource);
        spdlog::info("pod identity from the kubelet's PodResources API at {} (resource {})",
                     config_.kubernetes.pod_resources_socket, config_.kubernetes.resource);
    }
    auto server = BrokerServer::create(*broker_, sopt);
    if (!server.isOk()) {
        return runtimeFailure(server.status());
    }
    server_ = std::move(server).value();
    restart_->countCallsWith([stats = &server_->stats()](uint64_t id) {
        auto c = stats->ofSession(id);
        return CallCounts{c.calls, c.errors};
    });
    if (Status st = server_->start(std::move(listen_fd)); !st.isOk()) {
        return runtimeFailure(st);
    }
    return Status::ok();
}

Daemon::~Daemon() {
    if (started_) {
        sd_notify(0, "STOPPING=1");
        server_->shutdown(std::chrono::seconds(5));
    }
    server_.reset();
    // restart_ goes before broker_, whose destructor ends what sessions are left.
    if (broker_ != nullptr) {
        broker_->setCommitSink({});
        broker_->setEndSink({});
    }
    if (socket_created_) {
        ::unlink(config_.socket.c_str());
    }
    sigfd_.reset();
    if (mask_set_) {
        pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    }
    if (started_) {
        spdlog::info("stopped");
    }
}

std::string Daemon::statusLine() {
    std::string status = fmt::format("STATUS=serving {} session(s), {} object(s) on {} device(s)",
                                     broker_->sessionCount(), broker_->objectCount(), devices_.size());
    std::lock_guard lock(config_error_mu_);
    if (!config_error_.empty()) {
        status += "; configuration error, serving the previous configuration: " + config_error_;
    }
    return status;
}

void Daemon::heartbeat() {
    restart_->markAlive();  // after a crash, the successor's bound on how long it took
    std::string status = statusLine();
    if (status != last_status_) {
        last_status_ = status;
        sd_notify(0, watchdog_ ? ("WATCHDOG=1\n" + status).c_str() : status.c_str());
    } else if (watchdog_) {
        sd_notify(0, "WATCHDOG=1");
    }
}

void Daemon::setConfigError(const std::string &message) {
    std::lock_guard lock(config_error_mu_);
    config_error_ = message;
    std::replace(config_error_.begin(), config_error_.end(), '\n', ' ');  // STATUS= is one line
}

void Daemon::keepConfigText(const std::string &text) {
    UniqueFd fd(::memfd_create("ibvx-config", MFD_CLOEXEC));
    if (!fd || ::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        spdlog::warn("cannot keep the configuration for a restart: {}", std::strerror(errno));
        return;
    }
    if (fd_store_ != nullptr) {
        (void)fd_store_->remove(kConfigFdName);
        if (Status st = fd_store_->add(kConfigFdName, fd.get()); !st.isOk()) {
            spdlog::warn("cannot keep the configuration in the fd store: {}", st.message());
        }
    }
    std::lock_guard lock(config_error_mu_);
    config_fd_ = std::move(fd);
}

ReloadReport Daemon::reload() {
    std::lock_guard lock(reload_mu_);
    ReloadReport report;
    size_t known = loader::loadRecords().size();
    DaemonConfig fresh;
    if (!config_.config_path.empty()) {
        if (Status st = loadConfigFile(config_.config_path, &fresh); !st.isOk()) {
            spdlog::error("reload failed, keeping the old configuration: {}", st.message());
            setConfigError(st.message());
            report.errors.push_back(st.message());
            hub_->publish(AdminEvents::simple(AdminEvents::Event::DRIVER_ERROR, st.message()));
            report.devices = static_cast<uint32_t>(devices_.size());
            return report;
        }
    }
    broker_->setPolicy(std::make_shared<const Policy>(fresh.policy));
    broker_->quotas().configure(fresh.quotas);
    setConfigError("");
    keepConfigText(fresh.config_text);
    loadDrivers(fresh, false);  // failures are in the load records, reported below
    if (Status st = configureProviders(fresh); !st.isOk()) {
        spdlog::error("reload: {}", st.message());
        report.errors.push_back(st.message());
    }
    std::vector<loader::LoadRecord> records = loader::loadRecords();
    for (size_t i = known; i < records.size(); ++i) {
        if (records[i].loaded) {
            report.loaded.push_back(records[i].name);
        } else {
            report.errors.push_back("cannot load driver '" + records[i].name + "': " + records[i].error);
        }
    }
    for (const std::string &e : report.errors) {
        hub_->publish(AdminEvents::simple(AdminEvents::Event::DRIVER_ERROR, e));
    }
    report.new_devices = static_cast<uint32_t>(devices_.scan());
    report.devices = static_cast<uint32_t>(devices_.size());
    if (report.new_devices != 0) {
        publishDiscovery();
    }
    spdlog::info("reload done: {} new device(s), {} total", report.new_devices, report.devices);
    hub_->publish(AdminEvents::simple(
        AdminEvents::Event::RELOAD, fmt::format("{} new device(s), {} total, {} error(s)", report.new_devices,
                                                report.devices, report.errors.size())));
    return report;
}

namespace {

// Link and address changes of the broker's network namespace, for the discovery tree: a RoCE
// port's state and GIDs follow its interface (providers/softnda/SPEC.md §19). No socket (a
// sandbox without AF_NETLINK) only means the tree is refreshed by a reload instead.
UniqueFd watchInterfaces() {
    UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE));
    sockaddr_nl local{};
    local.nl_family = AF_NETLINK;
    local.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR;
    if (!fd || ::bind(fd.get(), reinterpret_cast<const sockaddr *>(&local), sizeof(local)) < 0) {
        spdlog::debug("no netlink watch of interfaces ({}): the discovery tree follows reloads only",
                      std::strerror(errno));
        return UniqueFd();
    }
    return fd;
}

// Reads every notification queued (their content does not matter: the tree is gathered afresh).
void drain(int fd) {
    char buf[8192];
    for (;;) {
        ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && errno == ENOBUFS)) {  // ENOBUFS: some were lost; read on
            return;
        }
    }
}

}  // namespace

Status Daemon::run() {
    sd_notify(0, ("READY=1\n" + statusLine()).c_str());
    UniqueFd interfaces = watchInterfaces();
    // The tree was first written in init(), before this watch: a link or address change in
    // between (a veth's carrier, which the kernel reports a moment after the link is set up)
    // would stay unseen until the next one. Changes from here on are queued, so one reading now
    // closes the gap: of the tree init() wrote (refreshing a missing one would publish it anew).
    std::error_code ec;
    if (interfaces && std::filesystem::is_symlink(discoveryTreePath(runtimeDir(config_)), ec)) {
        if (Status st = refreshDiscoveryPorts(runtimeDir(config_), devices_); !st.isOk()) {
            spdlog::warn("{}", st.message());
        }
    }
    for (;;) {
        pollfd fds[2] = {{sigfd_.get(), POLLIN, 0}, {interfaces.get(), POLLIN, 0}};
        if (::poll(fds, interfaces ? 2 : 1, -1) < 0 && errno != EINTR) {
            return Status(Code::kInternal, errno, std::string("poll failed: ") + std::strerror(errno));
        }
        if (interfaces && (fds[1].revents & POLLIN) != 0) {
            drain(interfaces.get());
            if (Status st = refreshDiscoveryPorts(runtimeDir(config_), devices_); !st.isOk()) {
                spdlog::warn("{}", st.message());
            }
        }
        if ((fds[0].revents & POLLIN) == 0) {
            continue;
        }
        signalfd_siginfo si{};
        ssize_t n = ::read(sigfd_.get(), &si, sizeof(si));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n != static_cast<ssize_t>(sizeof(si))) {
            return Status(Code::kInternal, errno,
                          std::string("signalfd read failed: ") + std::strerror(errno));
        }
        if (si.ssi_signo == SIGHUP) {
            spdlog::info("SIGHUP: reloading driver configuration");
            (void)reload();
            continue;
        }
        if (restart_requested_) {
            return execRestart();
        }
        if (config_.fd_store && restart_ != nullptr && getenv("NOTIFY_SOCKET") != nullptr) {
            // systemd decides: a restart keeps the store (the next start restores), a stop drops
            // it (and with it the tenants' fd channels).
            spdlog::info("{}: handing the sessions to systemd's fd store",
                         strsignal(static_cast<int>(si.ssi_signo)));
            auto fds = handOver(false);
            if (!fds.isOk()) {
                spdlog::error("handover failed ({}); the sessions end", fds.status().message());
                return Status::ok();
            }
            handed_over_ = true;
            return Status::ok();
        }
        spdlog::info("{}: stopping (in-flight calls finish, then every session is torn down)",
                     strsignal(static_cast<int>(si.ssi_signo)));
        return Status::ok();
    }
}

StatusOr<RestartPlan> Daemon::requestRestart(bool require_keep) {
    RestartState::Plan p = restart_->plan();
    RestartPlan out{p.kept, p.dropped, p.dropping_drivers, binary_};
    if (binary_.empty() || ::access(binary_.c_str(), X_OK) != 0) {
        return Status(Code::kFailedPrecondition, ENOENT,
                      "cannot restart: the broker's binary '" + binary_ + "' is not executable");
    }
    if (require_keep && p.dropped > 0) {
        std::string drivers;
        for (const auto &d : p.dropping_drivers) {
            drivers += (drivers.empty() ? "" : ", ") + d;
        }
        return Status(Code::kFailedPrecondition, EBUSY,
                      "restart refused: " + std::to_string(p.dropped) + " live session(s) would be dropped" +
                          (drivers.empty() ? std::string(" (not attached yet)")
                                           : " (driver(s) that cannot hand over: " + drivers + ")"));
    }
    if (restart_requested_.exchange(true)) {
        return Status(Code::kFailedPrecondition, EALREADY, "a restart is already under way");
    }
    spdlog::info("restart requested: {} session(s) kept, {} dropped; exec {}", p.kept, p.dropped, binary_);
    // run()'s thread does it, after this reply has left.
    ::kill(::getpid(), SIGTERM);
    return out;
}

StatusOr<std::vector<std::pair<std::string, int>>> Daemon::handOver(bool exec) {
    // systemd 252 reads STOPPING=1 as "the service is stopping": the unit would go to
    // deactivating and be killed at TimeoutStopSec. A re-exec keeps the pid and comes back with
    // READY=1, which is what RELOADING=1 announces (sd_notify(3)).
    sd_notify(
        0, exec ? "RELOADING=1\nSTATUS=restarting: handing the sessions to a fresh process" : "STOPPING=1");
    // In-flight calls finish (and commit); then nothing else reaches the broker. The tenants'
    // wait starts here: the successor's "took" counts from this mark.
    restart_->beginHandover();
    kept_listen_ = server_->handOver(std::chrono::seconds(5));
    for (auto &s : restart_->plan().to_drop) {
        spdlog::info("session {} (pid {}) ends: its driver cannot hand over", s->id(),
                     s->identity().creds.pid);
        broker_->endSession(s);
    }
    // No WQE is mid-flight when the state is taken for the last time.
    for (const DeviceInfo &info : devices_.list()) {
        Device *dev = devices_.find(info.name);
        if (dev != nullptr && dev->verbs.keepsAcrossRestart()) {
            (void)dev->verbs.setPaused(true);
        }
    }
    ASSIGN_OR_RETURN(auto fds, restart_->handover());
    if (kept_listen_) {
        fds.emplace_back(socket_created_ ? "ibvx.listen" : "ibvx.listen.sd", kept_listen_.get());
    }
    if (config_fd_) {
        fds.emplace_back(kConfigFdName, config_fd_.get());
    }
    return fds;
}

namespace {

// Asks glibc (2.35 and later; older ones ignore the tunable) to back the successor's malloc heap
// with transparent huge pages. The successor builds every restored object at once, in memory it
// touches for the first time, and where a page fault is dear (~12 us per 4 KiB page on a VM that
// shadows page tables) those faults were half of a restore: ~12,800 for 10,003 objects. An
// operator's own glibc.malloc.hugetlb setting stands (0 turns it off).
void askForHugeHeapPages() {
    const char *now = std::getenv("GLIBC_TUNABLES");
    std::string tunables = now != nullptr ? now : "";
    if (tunables.find("glibc.malloc.hugetlb=") != std::string::npos) {
        return;
    }
    tunables += tunables.empty() ? "glibc.malloc.hugetlb=1" : ":glibc.malloc.hugetlb=1";
    (void)::setenv("GLIBC_TUNABLES", tunables.c_str(), 1);
}

}  // namespace

Status Daemon::execRestart() {
    spdlog::info("restarting: handing over to a fresh {}", binary_);
    auto fds = handOver(true);
    if (!fds.isOk()) {
        return Status(Code::kInternal, EIO, "restart failed before exec: " + fds.status().message());
    }
    if (Status st = prepareExecFds(*fds); !st.isOk()) {
        return Status(Code::kInternal, EIO, "restart failed before exec: " + st.message());
    }
    std::vector<char *> argv;
    for (std::string &a : config_.argv) {
        argv.push_back(a.data());
    }
    argv.push_back(nullptr);
    askForHugeHeapPages();
    spdlog::default_logger()->flush();
    ::execv(binary_.c_str(), argv.data());
    // Only a failed exec gets here, with the fd table already rearranged for the next process:
    // nothing here can be trusted to run on. Exit: the tenants' fd channels close with the
    // process (their sessions end), or systemd's fd store restarts the broker from its copies.
    int err = errno;
    spdlog::critical("restart: exec {} failed: {}; exiting", binary_, std::strerror(err));
    spdlog::shutdown();
    _exit(1);
}

namespace {

// What the command line asks for; runDaemon() turns it into a configuration and a start.
struct CommandLine {
    std::string socket, config_path, log_level, check_path;
    bool foreground = false;
    bool fd_store = false;
    bool check = false;
};

// Parses argv into *line. Returns an exit code when the command is done already (--help,
// --version, a bad option), nullopt when the broker should start.
std::optional<int> parseCommandLine(int argc, char **argv, CommandLine *line) {
    CLI::App app{"ibv-extendd: the per-host ibv_extend broker"};
    app.add_option("--socket", line->socket, "Unix socket path (default " IBVX_DEFAULT_SOCKET ")");
    app.add_option("--config", line->config_path, "TOML configuration file");
    app.add_flag("--foreground", line->foreground, "Stay in the foreground (also implied under systemd)");
    app.add_option("--log-level", line->log_level, "trace, debug, info, warn, error, critical or off");
    app.add_flag("--fd-store", line->fd_store,
                 "Keep what a restart needs in systemd's fd store (the unit sets FileDescriptorStoreMax=)");
    auto *check = app.add_option("--check-config", line->check_path,
                                 std::string("Check the configuration (FILE, else --config, else ") +
                                     kDefaultConfig + ") as a start would, and exit: 0 good, 2 not")
                      ->expected(0, 1);
    app.set_version_flag("--version", "ibv-extendd " IBVX_PROJECT_VERSION);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        int rc = app.exit(e);
        return rc == 0 ? 0 : 2;
    }
    line->check = check->count() > 0;
    return std::nullopt;
}

// Reads --config into *cfg. A restart (the previous process's state is here) carries on with the
// configuration that process ran: a typo must not cost the tenants their queues. Then
// *config_error holds the file's error, for the log and STATUS=; a reload of a fixed file takes
// over. Returns false when there is nothing to run.
bool loadStartupConfig(const std::string &config_path, DaemonConfig *cfg, std::string *config_error) {
    if (config_path.empty()) {
        return true;
    }
    Status st = loadConfigFile(config_path, cfg);
    if (st.isOk()) {
        return true;
    }
    std::string previous = inheritedConfigText();
    *cfg = DaemonConfig{};
    if (previous.empty() ||
        !loadConfigText(previous, config_path + " (as the previous broker process read it)", cfg).isOk()) {
        fprintf(stderr, "ibv-extendd: %s\n", st.message().c_str());
        closeWaitingConnections();
        return false;
    }
    cfg->config_path = config_path;
    *config_error = st.message();
    return true;
}

// The flags override the file; a bad --log-level or admin group is refused before anything starts.
bool applyFlags(const CommandLine &line, int argc, char **argv, DaemonConfig *cfg) {
    if (!line.socket.empty()) {
        cfg->socket = line.socket;
    }
    cfg->fd_store = line.fd_store;
    cfg->argv.assign(argv, argv + argc);
    if (!line.log_level.empty()) {
        if (!validLogLevel(line.log_level)) {
            fprintf(stderr,
                    "ibv-extendd: --log-level '%s' is not one of trace, debug, info, warn, error, critical, "
                    "off\n",
                    line.log_level.c_str());
            return false;
        }
        cfg->log_level = line.log_level;
    }
    if (auto gid = adminGid(*cfg); !gid.isOk()) {
        fprintf(stderr, "ibv-extendd: %s\n", gid.status().message().c_str());
        return false;
    }
    return true;
}

// Detach before Daemon::create() starts any thread: fork() keeps only the calling one. Not under
// systemd, and not after a restart's exec (LISTEN_PID is this process): that process detached
// already, and a fork would leave the inherited fds to a pid they were not passed to.
bool detachUnlessManaged(bool foreground) {
    const char *listen_pid = getenv("LISTEN_PID");
    bool restarted = listen_pid != nullptr && std::to_string(::getpid()) == listen_pid;
    if (foreground || restarted || getenv("NOTIFY_SOCKET") != nullptr ||
        getenv("JOURNAL_STREAM") != nullptr) {
        return true;
    }
    if (::daemon(0, 1) < 0) {
        spdlog::critical("cannot detach: {}", std::strerror(errno));
        return false;
    }
    return true;
}

// Runs the broker until it stops; the exit code.
int serve(const DaemonConfig &cfg, const std::string &config_error) {
    auto daemon = Daemon::create(cfg);
    if (!daemon.isOk()) {
        spdlog::critical("{}", daemon.status().message());
        return exitCodeFor(daemon.status());
    }
    if (!config_error.empty()) {
        (*daemon)->setConfigError(config_error);
    }
    Status served = (*daemon)->run();
    if (!served.isOk()) {
        spdlog::critical("{}", served.message());
    }
    if ((*daemon)->handedOver()) {
        // The sessions belong to the fd store now: tearing them down here would destroy the
        // queues the next start restores.
        spdlog::info("state handed over; exiting without teardown");
        spdlog::shutdown();
        _exit(0);
    }
    daemon->reset();
    return served.isOk() ? 0 : 1;
}

}  // namespace

int runDaemon(int argc, char **argv) {
    CommandLine line;
    if (auto done = parseCommandLine(argc, argv, &line)) {
        return *done;
    }
    if (line.check) {
        return checkConfig(!line.check_path.empty()    ? line.check_path
                           : !line.config_path.empty() ? line.config_path
                                                       : kDefaultConfig);
    }
    DaemonConfig cfg;
    std::string config_error;
    if (!loadStartupConfig(line.config_path, &cfg, &config_error) || !applyFlags(line, argc, argv, &cfg)) {
        return 2;
    }
    setupLogging(cfg.log_level);
    if (!config_error.empty()) {
        spdlog::error(
            "configuration error: {}; this restart serves the previous configuration until a reload "
            "of a fixed file",
            config_error);
    }
    if (!detachUnlessManaged(line.foreground)) {
        return 1;
    }
    return serve(cfg, config_error);
}

}  // namespace ibvx::daemon
