// ibv-extendd as an object: Daemon::create() builds everything the broker serves with (drivers,
// devices, the socket, the Broker and its BrokerServer), run() serves until a stop signal, and
// the destructor tears it down. runDaemon() (run.h) is the thin command-line front of it, so
// main.cpp stays one line and tests link the rest.
#pragma once

#include <signal.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/fd_store.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/app/config.h"
#include "daemon/app/run.h"
#include "daemon/core/broker.h"
#include "daemon/core/device.h"
#include "daemon/core/events.h"
#include "daemon/edge/admin_events.h"
#include "daemon/edge/admin_service.h"
#include "daemon/edge/server.h"
#include "daemon/restart/restart_state.h"

namespace ibvx::daemon {

// The daemon's BrokerEvents: every object event is counted and becomes an Admin Watch event and,
// within its session's line budget, an audit log line (AuditLog); every quota refusal a debug
// line and a QUOTA_DENIAL event.
class AuditEvents final : public BrokerEvents {
  public:
    explicit AuditEvents(std::shared_ptr<AdminEvents> hub) : hub_(std::move(hub)) {}

    void objectCreated(const Session &s, ObjectKind kind, uint64_t handle) override;
    void objectDestroyed(const Session &s, ObjectKind kind, uint64_t handle) override;
    void quotaDenied(const PeerIdentity &peer, uint64_t session, const std::string &message) override;

  private:
    void object(const Session &s, AuditLog::Action action, AdminEvents::Event::Kind event, ObjectKind kind,
                uint64_t handle);

    std::shared_ptr<AdminEvents> hub_;
};

class Daemon {
  public:
    // Blocks SIGTERM, SIGINT and SIGHUP in the calling thread first (every thread the daemon
    // starts inherits that mask, so only run()'s signalfd sees them): call it before starting
    // threads of your own. Then loads the drivers, scans the devices, binds the socket (or takes
    // systemd's) and starts serving. Failures: INVALID_ARGUMENT for what the configuration got
    // wrong (a provider option, a bad socket path or group), any other code for a runtime failure.
    static StatusOr<std::unique_ptr<Daemon>> create(const DaemonConfig &config);
    // Stops accepting, lets in-flight calls finish, ends every session, removes a socket it
    // created and restores the signal mask create() found.
    ~Daemon();
    Daemon(const Daemon &) = delete;
    Daemon &operator=(const Daemon &) = delete;

    // Rereads the configuration file, applies its policy and quotas, loads new drivers and scans
    // for new devices. SIGHUP (run()'s thread) and Admin.ReloadDrivers (a gRPC thread) share it.
    ReloadReport reload();
    // Serves until SIGTERM or SIGINT (OK) or until the signalfd fails; SIGHUP reloads. A restart
    // (Admin.Restart) execs the binary from here and does not return unless the exec failed;
    // with --fd-store, SIGTERM hands the state to the store and run() returns with handedOver().
    Status run();
    // The sessions were handed over (fd store): the process must exit without tearing them
    // down, so the destructor must not run (runDaemon calls _exit).
    bool handedOver() const { return handed_over_; }

    // A configuration the broker could not apply (a restart's broken file, a failed reload):
    // shown in systemd's STATUS= line until a good reload clears it ("").
    void setConfigError(const std::string &message);

    Broker &broker() { return *broker_; }
    DeviceRegistry &devices() { return devices_; }
    const std::string &socketPath() const { return config_.socket; }

  private:
    explicit Daemon(const DaemonConfig &config);
    // The steps of create(), in order.
    Status init();
    Status blockSignals();
    Status loadDevices();     // drivers, provider options, the device scan
    void publishDiscovery();  // the discovery tree for the devices known now (discovery_tree.h)
    void makeBroker();        // with the configured policy and quotas, reporting to events_
    Status startServer(long admin_gid, UniqueFd listen_fd);
    Status makeRestartState();  // the commit and end sinks, the fd store, the binary's path
    // The systemd watchdog ping and STATUS= line, from the server's event loop.
    void heartbeat();
    std::string statusLine();  // "STATUS=serving ...", with a configuration error if there is one
    // Admin.Restart: plan, refuse or schedule.
    StatusOr<RestartPlan> requestRestart(bool require_keep);
    // Stops serving and commits everything for the next process; the sessions a restart drops
    // end here. Returns the fds the next process needs (named) and keeps them open.
    // exec: the process execs itself next (systemd hears RELOADING=1, not STOPPING=1).
    StatusOr<std::vector<std::pair<std::string, int>>> handOver(bool exec);
    // The running configuration's text in a memfd, for the next process (the fd store and
    // the exec both carry it as "ibvx.config").
    void keepConfigText(const std::string &text);
    // handOver(), then exec the binary again (returns only on failure).
    Status execRestart();

    DaemonConfig config_;
    sigset_t old_mask_{};
    bool mask_set_ = false;
    UniqueFd sigfd_;
    bool socket_created_ = false;
    bool started_ = false;  // the server serves: teardown announces STOPPING and logs "stopped"
    bool watchdog_ = false;
    std::string last_status_;  // event-loop thread only
    std::mutex reload_mu_;
    DeviceRegistry devices_;
    // Declared before broker_ so they outlive it: a broker's last sessions report to them.
    std::shared_ptr<AdminEvents> hub_ = std::make_shared<AdminEvents>();
    AuditEvents events_{hub_};
    std::unique_ptr<Broker> broker_;
    std::unique_ptr<RestartState> restart_;
    std::unique_ptr<BrokerServer> server_;
    std::vector<std::pair<std::string, UniqueFd>> inherited_;  // LISTEN_FDS, until restored
    bool socket_activated_ = false;
    std::string binary_;  // what a restart execs (the path this process was started from)
    std::atomic<bool> restart_requested_{false};
    bool handed_over_ = false;
    UniqueFd kept_listen_;               // the listening socket across a handover
    std::shared_ptr<FdStore> fd_store_;  // with --fd-store under systemd
    std::mutex config_error_mu_;         // guards config_error_ and config_fd_
    std::string config_error_;
    UniqueFd config_fd_;
};

}  // namespace ibvx::daemon
