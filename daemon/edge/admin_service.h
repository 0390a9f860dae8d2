// ibv_extend.v1.Admin on the callback API: status, drivers, sessions, objects, stats, eviction,
// reload and the Watch event stream. Every method first checks the caller (root or the admin
// group, from the connection's SO_PEERCRED). Reads go through the core's locks; eviction is
// handed to the server's event loop, which alone ends sessions, and waited for on the service's
// BlockingExecutor, never on a gRPC callback thread. Every unary call is counted in the Admin
// stats table and logged on failure (serve.h), as Broker calls are in theirs.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "daemon/core/broker.h"
#include "daemon/edge/admin_events.h"
#include "daemon/edge/blocking_executor.h"
#include "daemon/edge/connections.h"
#include "daemon/edge/rpc_stats.h"
#include "daemon/edge/serve.h"
#include "ibv_extend/v1/admin.grpc.pb.h"

namespace ibvx::daemon {

namespace pb = ::ibv_extend::v1;

// What a driver reload did (SIGHUP and Admin.ReloadDrivers share it).
struct ReloadReport {
    uint32_t new_devices = 0;
    uint32_t devices = 0;
    std::vector<std::string> loaded;
    std::vector<std::string> errors;
};

// What a restart keeps and drops (Admin.Restart, docs/restart.md).
struct RestartPlan {
    uint32_t sessions_kept = 0;
    uint32_t sessions_dropped = 0;
    std::vector<std::string> dropping_drivers;
    std::string binary;
};

// The broker's restart history (GetStatus).
struct RestartInfo {
    uint64_t restarts = 0;
    uint64_t last_unix_ms = 0;
    uint64_t last_took_ms = 0;
    bool last_crash = false;  // after a crash: last_took_ms is an upper bound
};

// What the daemon tells the Admin service about itself.
struct AdminHooks {
    long admin_gid = -1;      // < 0: root only
    std::string admin_group;  // its name, for messages and GetStatus
    std::string config_path;
    std::string socket_path;
    bool socket_activated = false;
    std::function<ReloadReport()> reload;  // nullptr: ReloadDrivers answers UNIMPLEMENTED
    // Plans a restart and, when it is allowed, schedules it to start once the reply is sent
    // (FAILED_PRECONDITION with require_keep and a session to drop). nullptr: UNIMPLEMENTED.
    std::function<StatusOr<RestartPlan>(bool require_keep)> restart;
    std::function<RestartInfo()> restart_info;  // nullptr: no restart so far
    // After a SetQuota changed a limit: the restart state keeps it (nullptr: nothing to do).
    std::function<void()> quotas_changed;
    // A listing page ends early once its entries take this many bytes, so the reply stays under
    // the server's message limit whatever the page size (room is left for one more entry).
    size_t reply_budget_bytes = 48 * 1024;
};

// Ends a session from the event loop; the future is ready once everything is destroyed.
using EvictFn = std::function<std::shared_future<void>(const std::shared_ptr<Session> &)>;

class AdminService final : public pb::Admin::CallbackService {
  public:
    // broker_stats: the Broker service's table (reported by GetStats); admin_stats: this one's.
    AdminService(Broker &broker, ConnectionRegistry &connections, RpcStats &broker_stats,
                 AdminRpcStats &admin_stats, std::shared_ptr<AdminEvents> events, AdminHooks hooks,
                 EvictFn evict);

    grpc::ServerUnaryReactor *GetStats(grpc::CallbackServerContext *ctx, const pb::GetStatsRequest *req,
                                       pb::GetStatsResponse *resp) override;
    grpc::ServerUnaryReactor *GetStatus(grpc::CallbackServerContext *ctx, const pb::GetStatusRequest *req,
                                        pb::GetStatusResponse *resp) override;
    grpc::ServerUnaryReactor *ListDrivers(grpc::CallbackServerContext *ctx, const pb::ListDriversRequest *req,
                                          pb::ListDriversResponse *resp) override;
    grpc::ServerUnaryReactor *ListSessions(grpc::CallbackServerContext *ctx,
                                           const pb::ListSessionsRequest *req,
                                           pb::ListSessionsResponse *resp) override;
    grpc::ServerUnaryReactor *ListObjects(grpc::CallbackServerContext *ctx, const pb::ListObjectsRequest *req,
                                          pb::ListObjectsResponse *resp) override;
    grpc::ServerUnaryReactor *EvictSession(grpc::CallbackServerContext *ctx,
                                           const pb::EvictSessionRequest *req,
                                           pb::EvictSessionResponse *resp) override;
    grpc::ServerUnaryReactor *ReloadDrivers(grpc::CallbackServerContext *ctx,
                                            const pb::ReloadDriversRequest *req,
                                            pb::ReloadDriversResponse *resp) override;
    grpc::ServerWriteReactor<pb::AdminEvent> *Watch(grpc::CallbackServerContext *ctx,
                                                    const pb::WatchRequest *req) override;

    grpc::ServerUnaryReactor *GetQuotas(grpc::CallbackServerContext *ctx, const pb::GetQuotasRequest *req,
                                        pb::GetQuotasResponse *resp) override;
    grpc::ServerUnaryReactor *SetQuota(grpc::CallbackServerContext *ctx, const pb::SetQuotaRequest *req,
                                       pb::SetQuotaResponse *resp) override;
    grpc::ServerUnaryReactor *Restart(grpc::CallbackServerContext *ctx, const pb::RestartRequest *req,
                                      pb::RestartResponse *resp) override;

    uint64_t sessionsOpened() const { return sessions_opened_.load(); }
    void countSessionOpened() { ++sessions_opened_; }
    int inflight() const { return calls_.inflight(); }
    std::chrono::steady_clock::time_point lastFinish() const { return calls_.lastFinish(); }

  private:
    // What a call that waits runs on blocking_ (it finishes the call there).
    using BlockingTask = std::function<Status()>;

    Status authorize(grpc::CallbackServerContext *ctx);
    // Authorizes, runs fn() (a Status), counts and finishes the call.
    template <typename Fn>
    grpc::ServerUnaryReactor *serve(grpc::CallbackServerContext *ctx, AdminMethod m, Fn &&fn);
    // The same for a call that waits: start() runs here and answers an error, which finishes
    // the call, or the BlockingTask that does the waiting, never on a gRPC callback thread.
    template <typename Start>
    grpc::ServerUnaryReactor *serveBlocking(grpc::CallbackServerContext *ctx, AdminMethod m, Start &&start);
    // The caller's uid, for the log (0 if its connection is gone).
    uint32_t callerUid(grpc::CallbackServerContext *ctx);

    Status listObjects(const pb::ListObjectsRequest &req, pb::ListObjectsResponse *resp);
    StatusOr<std::shared_ptr<Session>> liveSession(uint64_t id);
    Status setQuota(const pb::SetQuotaRequest &req, Quota q, std::optional<uint64_t> limit);
    Status planRestart(bool require_keep, uint32_t uid, pb::RestartResponse *resp);
    uint64_t uptimeMs() const;

    Broker &broker_;
    ConnectionRegistry &connections_;
    RpcStats &stats_;
    AdminRpcStats &admin_stats_;
    std::shared_ptr<AdminEvents> events_;
    const AdminHooks hooks_;
    EvictFn evict_;
    std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
    std::atomic<uint64_t> sessions_opened_{0};
    std::atomic<uint64_t> sessions_evicted_{0};
    CallRecorder<AdminMethod> calls_{admin_stats_};
    BlockingExecutor blocking_{2, 64};  // after calls_: its threads finish calls, so it goes first
};

}  // namespace ibvx::daemon
