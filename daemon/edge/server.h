// The broker's socket and its gRPC server. The broker owns the listening socket: it accepts
// every connection non-blocking, records the peer's kernel identity, peeks at the preface and
// hands HTTP/2 connections to a gRPC server that has no listening port of its own
// (AddInsecureChannelFromFd), keeps IBVX connections as session fd channels, and drops
// anything else or anything silent for longer than the handshake timeout.
//
// Threading: one event-loop thread owns the epoll set and every entry in it (listening socket,
// connections in handshake, fd channels, session pidfds). Other threads reach it only through
// watchSession() (queued under queue_mu_, then the loop is woken through an eventfd). The loop
// ends sessions itself (fd-channel EOF, malformed frame, pidfd exit, attach timeout), so a
// session's fds are never closed while the loop still polls them.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/core/broker.h"
#include "daemon/edge/admin_events.h"
#include "daemon/edge/admin_service.h"
#include "daemon/edge/connections.h"
#include "daemon/edge/rate_limit.h"
#include "daemon/edge/rpc_stats.h"
#include "daemon/edge/services.h"

namespace ibvx::daemon {

struct ServerOptions {
    std::chrono::milliseconds handshake_timeout{2000};
    size_t max_pending_handshakes = 256;
    // One uid may hold at most this many of those, so it cannot starve the others.
    size_t max_handshakes_per_uid = 32;
    // HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: calls in flight per connection.
    int max_calls_per_connection = 64;
    int max_message_bytes = 64 * 1024;
    long admin_gid = -1;  // < 0: Admin is root-only
    AdminHooks admin;     // what the Admin service reports and runs (admin.admin_gid is ignored)
    std::shared_ptr<AdminEvents> events;  // Watch events hub (nullptr: the server makes its own)
    // Called from the event loop every heartbeat_period (0: never): the daemon's systemd
    // watchdog ping and STATUS= line, so a wedged loop stops the pings.
    std::function<void()> heartbeat;
    std::chrono::milliseconds heartbeat_period{0};
    std::shared_ptr<PodResolver> pods;  // [kubernetes] pod identity (nullptr: off)
};

class BrokerServer final : public SessionListener {
  public:
    static StatusOr<std::unique_ptr<BrokerServer>> create(Broker &broker, ServerOptions options);
    ~BrokerServer();
    BrokerServer(const BrokerServer &) = delete;
    BrokerServer &operator=(const BrokerServer &) = delete;

    // Starts serving on a bound, listening Unix socket (made non-blocking here).
    Status start(UniqueFd listen_fd);
    // Stops accepting, lets in-flight calls finish (up to grace), ends every session. Idempotent.
    void shutdown(std::chrono::milliseconds grace);
    // The same, but the sessions stay (a restart hands them to the next process): returns the
    // listening socket.
    UniqueFd handOver(std::chrono::milliseconds grace);

    RpcStats &stats() { return stats_; }
    std::shared_ptr<AdminEvents> events() { return events_; }
    // Ends a session from the event loop (Admin.EvictSession); ready once it is torn down.
    std::shared_future<void> evictSession(const std::shared_ptr<Session> &session);
    // Called by Hello (SessionListener): the loop starts watching the session's pidfd and attach
    // deadline, the Admin counters and Watch hear of it.
    void sessionOpened(const std::shared_ptr<Session> &session) override;
    void watchSession(const std::shared_ptr<Session> &session);

  private:
    enum class EntryKind { kListen, kWake, kHandshake, kChannel, kPidfd };
    struct Entry {
        EntryKind kind = EntryKind::kHandshake;
        int fd = -1;
        UniqueFd owned;  // kListen, kWake and kHandshake own their fd; sessions own theirs
        PeerIdentity peer;
        std::chrono::steady_clock::time_point deadline{};
        std::shared_ptr<Session> session;

        static Entry owning(EntryKind kind, UniqueFd fd) {
            Entry e;
            e.kind = kind;
            e.fd = fd.get();
            e.owned = std::move(fd);
            return e;
        }
        // An fd the session owns (its pidfd or fd channel), watched for it.
        static Entry watching(EntryKind kind, int fd, std::shared_ptr<Session> session) {
            Entry e;
            e.kind = kind;
            e.fd = fd;
            e.session = std::move(session);
            return e;
        }
    };
    // A session to end from the loop, and who waits for it.
    using Eviction = std::pair<std::shared_ptr<Session>, std::shared_ptr<std::promise<void>>>;

    BrokerServer(Broker &broker, ServerOptions options);
    // The event loop: waits on the epoll set (50 ms at most), dispatches what is ready, reaps
    // what expired every 50 ms and calls the heartbeat every heartbeat_period.
    void loop();
    // One ready entry, by its kind.
    void dispatch(uint64_t id);
    // Wakes the loop (watchSession, evictSession, shutdown).
    void wake();
    // What other threads queued for the loop: sessions to watch, sessions to evict.
    void takeQueued(int wake_fd);
    // The session's pidfd and, for a session restored with its fd channel, the channel.
    void startWatching(const std::shared_ptr<Session> &s);
    uint64_t add(Entry entry, uint32_t events);
    void remove(uint64_t id);
    void acceptAll(int listen_fd);
    // Every connection the loop drops gets a log line (rate-limited: a tenant may cause them).
    template <typename... Args>
    void logDropped(fmt::format_string<Args...> what, Args &&...args);
    void handshake(uint64_t id);
    void readChannel(uint64_t id);
    void endSession(const std::shared_ptr<Session> &session, const char *why);
    void reap();
    void shutdownImpl(std::chrono::milliseconds grace, bool keep_sessions);

    Broker &broker_;
    const ServerOptions options_;
    ConnectionRegistry connections_;
    RpcStats stats_;
    AdminRpcStats admin_stats_;
    std::shared_ptr<AdminEvents> events_ = std::make_shared<AdminEvents>();
    std::unique_ptr<BrokerService> broker_service_;
    std::unique_ptr<AdminService> admin_service_;
    std::unique_ptr<grpc::Server> server_;

    UniqueFd epoll_;
    std::thread thread_;
    std::atomic<bool> stop_{false};
    bool shut_down_ = false;
    UniqueFd listen_fd_;  // kept by a handover
    int wake_fd_ = -1;

    // Loop-thread only.
    std::unordered_map<uint64_t, Entry> entries_;
    uint64_t next_id_ = 1;
    size_t handshakes_ = 0;
    RateLimiter drop_log_{20};

    std::mutex queue_mu_;  // guards to_watch_ and to_evict_
    std::vector<std::shared_ptr<Session>> to_watch_;
    std::vector<Eviction> to_evict_;
};

}  // namespace ibvx::daemon
