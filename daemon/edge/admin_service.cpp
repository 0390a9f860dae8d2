#include "daemon/edge/admin_service.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <deque>
#include <limits>
#include <mutex>
#include <tuple>

#include "daemon/core/admin_inspect.h"
#include "daemon/edge/convert.h"
#include "daemon/edge/grpc_status.h"
#include "providers/loader/loader.h"

namespace ibvx::daemon {
namespace {

// Entries a page: the reply's byte budget (AdminHooks) cuts a page earlier when they are large.
constexpr uint32_t kDefaultSessionsPerPage = 256, kMaxSessionsPerPage = 512;
constexpr uint32_t kDefaultObjectsPerPage = 1024, kMaxObjectsPerPage = 4096;
constexpr size_t kWatchQueue = 1024;
constexpr std::chrono::seconds kEvictionWait{10};

uint32_t pageSize(uint32_t asked, uint32_t default_size, uint32_t max_size) {
    return asked == 0 ? default_size : std::min(asked, max_size);
}

// A page token is the key of the last entry handed out: a tag letter, then numbers separated by
// dots ("s17", "o17.5.4096"). Opaque to clients; only this file reads it.
std::string pageToken(char tag, std::initializer_list<uint64_t> key) {
    std::string t(1, tag);
    for (uint64_t k : key) {
        t += (t.size() > 1 ? "." : "") + std::to_string(k);
    }
    return t;
}

template <size_t N>
StatusOr<std::array<uint64_t, N>> parsePageToken(const std::string &token, char tag) {
    Status bad = invalidArgument("page_token is not one this broker handed out (list again without it)");
    if (token.size() < 2 || token[0] != tag) {
        return bad;
    }
    std::array<uint64_t, N> key{};
    const char *p = token.data() + 1, *end = token.data() + token.size();
    for (size_t i = 0; i < N; ++i) {
        if (i > 0 && (p == end || *p++ != '.')) {
            return bad;
        }
        auto [next, ec] = std::from_chars(p, end, key[i]);
        if (ec != std::errc() || next == p) {
            return bad;
        }
        p = next;
    }
    if (p != end) {
        return bad;
    }
    return key;
}

std::vector<std::shared_ptr<Session>> sessionsById(Broker &broker) {
    auto sessions = broker.sessions();
    std::sort(sessions.begin(), sessions.end(),
              [](const auto &a, const auto &b) { return a->id() < b->id(); });
    return sessions;
}

// A table's per-method entries into `out` (one per method, declaration order); every error
// count is added to codes as well.
template <typename M>
void methodStats(const BasicRpcStats<M> &stats, google::protobuf::RepeatedPtrField<pb::RpcStats> *out,
                 std::array<uint64_t, kGrpcCodes> *codes, uint64_t *errors) {
    for (size_t i = 0; i < static_cast<size_t>(M::kCount); ++i) {
        auto m = static_cast<M>(i);
        auto *r = out->Add();
        r->set_method(methodName(m));
        r->set_calls(stats.calls(m));
        r->set_errors(stats.errors(m));
        *errors += stats.errors(m);
        for (size_t c = 1; c < kGrpcCodes; ++c) {
            if (uint64_t n = stats.byCode(m, c); n != 0) {
                auto *ec = r->add_errors_by_code();
                ec->set_code(static_cast<pb::ErrorCode>(c));
                ec->set_count(n);
                (*codes)[c] += n;
            }
        }
        auto *h = r->mutable_latency();
        uint64_t count = 0;
        for (size_t b = 0; b <= kLatencyBoundsUs.size(); ++b) {
            if (b < kLatencyBoundsUs.size()) {
                h->add_bucket_upper_us(kLatencyBoundsUs[b]);
            }
            uint64_t n = stats.bucket(m, b);
            h->add_counts(n);
            count += n;
        }
        h->set_sum_us(stats.sumUs(m));
        h->set_count(count);
    }
}

// Counters of every device whose provider keeps them (the device-verbs table's queryCounters).
void addEngineCounters(DeviceRegistry &registry, pb::GetStatsResponse *resp) {
    for (const DeviceInfo &d : registry.list()) {
        Device *dev = registry.find(d.name);
        if (dev == nullptr) {
            continue;
        }
        pb::EngineCounters e;
        e.set_device(d.name);
        e.set_provider(d.provider);
        auto emit = [](void *arg, const char *name, uint64_t value) {
            auto *ctr = static_cast<pb::EngineCounters *>(arg)->add_counters();
            ctr->set_name(name);
            ctr->set_value(value);
        };
        if (dev->verbs.queryCounters(emit, &e) == 0) {
            *resp->add_engines() = std::move(e);
        }
    }
}

void sessionInfo(Session &s, RpcStats &stats, pb::SessionInfo *o) {
    const PeerIdentity &id = s.identity();
    o->set_id(s.id());
    o->set_pid(id.creds.pid);
    o->set_uid(id.creds.uid);
    o->set_gid(id.creds.gid);
    o->set_cgroup(id.cgroup);
    o->set_container_id(id.container_id);
    o->set_pod_namespace(id.pod_namespace);
    o->set_pod_name(id.pod_name);
    o->set_pod_container(id.pod_container);
    o->set_client_name(s.clientName());
    // A restored session's age and calls go on from what the earlier broker processes saw.
    auto age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                     s.createdAt());
    o->set_connected_ms(static_cast<uint64_t>(age.count()));
    o->set_connected_since_unix_ms(s.createdUnixMs());
    o->set_attached(s.attached());
    o->set_objects(s.objectCount());
    MemoryStats m = memoryOf(s);
    o->set_arena_bytes(m.arena_bytes);
    o->set_allocated_bytes(m.allocated_bytes);
    o->set_doorbell_pages(m.doorbell_pages);
    RpcStats::SessionCalls c = stats.ofSession(s.id());
    o->set_rpc_calls(s.earlierCalls().calls + c.calls);
    o->set_rpc_errors(s.earlierCalls().errors + c.errors);
}

// Counts what a page holds: it is full at `limit` entries or once they take the byte budget.
class PageFill {
  public:
    PageFill(uint32_t limit, size_t budget) : limit_(limit), budget_(budget) {}
    bool full() const { return entries_ >= limit_ || bytes_ >= budget_; }
    void add(const google::protobuf::MessageLite &entry) {
        ++entries_;
        bytes_ += entry.ByteSizeLong() + 4;  // + the field's tag and length
    }

  private:
    const uint32_t limit_;
    const size_t budget_;
    uint32_t entries_ = 0;
    size_t bytes_ = 0;
};

// Where an object sits in a listing: by session, then kind, then handle.
using ObjectKey = std::tuple<uint64_t, uint64_t, uint64_t>;

ObjectKey keyOf(const Session &s, const ObjectSnapshot &o) {
    return {s.id(), static_cast<uint64_t>(o.kind), o.handle};
}

// One Watch call: events queue here and are written one at a time. Lives until OnDone.
class WatchReactor final : public grpc::ServerWriteReactor<pb::AdminEvent>, public AdminEventSink {
  public:
    explicit WatchReactor(std::shared_ptr<AdminEvents> hub) : hub_(std::move(hub)) {
        id_ = hub_->subscribe(this);
        if (id_ == 0) {
            Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the broker is stopping"));
            finished_ = true;
        }
    }

    void push(const pb::AdminEvent &event) override {
        std::unique_lock lock(mu_);
        if (finished_ || closing_) {
            return;
        }
        if (writing_) {
            if (queue_.size() < kWatchQueue) {
                queue_.push_back(event);
            }
            return;
        }
        current_ = event;
        writing_ = true;
        lock.unlock();
        StartWrite(&current_);
    }

    void close() override {
        std::unique_lock lock(mu_);
        closing_ = true;
        finishIfIdle(lock, grpc::Status::OK);
    }

    void OnWriteDone(bool ok) override {
        std::unique_lock lock(mu_);
        writing_ = false;
        if (!ok) {
            closing_ = true;
            queue_.clear();
        }
        if (!queue_.empty()) {
            current_ = std::move(queue_.front());
            queue_.pop_front();
            writing_ = true;
            lock.unlock();
            StartWrite(&current_);
            return;
        }
        if (closing_) {
            finishIfIdle(lock, grpc::Status::OK);
        }
    }

    void OnCancel() override {
        std::unique_lock lock(mu_);
        closing_ = true;
        queue_.clear();
        finishIfIdle(lock, grpc::Status::CANCELLED);
    }

    void OnDone() override {
        if (id_ != 0) {
            hub_->unsubscribe(id_);  // no push() can be running on us after this
        }
        delete this;
    }

  private:
    // Finish must come once, and not while a write is in flight.
    void finishIfIdle(std::unique_lock<std::mutex> &lock, grpc::Status st) {
        if (writing_ || finished_) {
            return;
        }
        finished_ = true;
        lock.unlock();
        Finish(std::move(st));
    }

    std::shared_ptr<AdminEvents> hub_;
    uint64_t id_ = 0;
    std::mutex mu_;  // guards everything below
    std::deque<pb::AdminEvent> queue_;
    pb::AdminEvent current_;
    bool writing_ = false;
    bool closing_ = false;
    bool finished_ = false;
};

// Whether a vdev provider's ops carry the restart entries (ibv_extend_vdev.h, ABI V4: all three
// or none), for a provider that serves no device yet. rdma-core extension drivers never do.
bool vdevOpsKeep(const std::vector<const ibv_extend_vdev_ops *> &vdevs, const std::string &provider) {
    for (const ibv_extend_vdev_ops *v : vdevs) {
        if (v->provider != nullptr && provider == v->provider) {
            return v->abi >= IBV_EXTEND_VDEV_ABI_V4 && v->export_object != nullptr &&
                   v->import_object != nullptr && v->set_paused != nullptr;
        }
    }
    return false;
}

void quotaValues(const QuotaValues *used, const QuotaValues &limit,
                 google::protobuf::RepeatedPtrField<pb::QuotaValue> *out) {
    for (size_t i = 0; i < kQuotaCount; ++i) {
        auto *v = out->Add();
        v->set_name(quotaName(static_cast<Quota>(i)));
        v->set_used(used != nullptr ? (*used)[i] : 0);
        v->set_unlimited(limit[i] == kUnlimited);
        v->set_limit(limit[i] == kUnlimited ? 0 : limit[i]);
    }
}

void overrideValues(const QuotaOverride &o, google::protobuf::RepeatedPtrField<pb::QuotaValue> *out) {
    for (size_t i = 0; i < kQuotaCount; ++i) {
        if (!o.max[i]) {
            continue;
        }
        auto *v = out->Add();
        v->set_name(quotaName(static_cast<Quota>(i)));
        v->set_unlimited(*o.max[i] == kUnlimited);
        v->set_limit(*o.max[i] == kUnlimited ? 0 : *o.max[i]);
    }
}

const char *scopeName(pb::QuotaScope scope) {
    switch (scope) {
        case pb::QUOTA_SCOPE_DEFAULT:
            return "default";
        case pb::QUOTA_SCOPE_UID:
            return "uid";
        case pb::QUOTA_SCOPE_CONTAINER:
            return "container";
        case pb::QUOTA_SCOPE_NAMESPACE:
            return "namespace";
        default:
            return "?";
    }
}

// One loaded driver: its devices, its ops version, whether a restart keeps its sessions.
void describeDriver(const loader::DriverInfo &d, const std::vector<DeviceInfo> &devices,
                    const std::vector<const ibv_extend_vdev_ops *> &vdevs, DeviceRegistry &registry,
                    pb::DriverEntry *e) {
    e->set_name(d.name);
    e->set_library(d.library);
    for (const ibv_extend_vdev_ops *v : vdevs) {
        if (v->provider != nullptr && d.name == v->provider) {
            e->set_virtual_provider(true);
            e->set_ops_version(v->abi);
        }
    }
    bool served_any = false, every_device_keeps = true;
    for (const DeviceInfo &dev : devices) {
        if (dev.provider == d.name) {
            e->add_devices(dev.name);
            if (!e->virtual_provider()) {
                e->set_ops_version(dev.driver_version);
            }
            served_any = true;
            Device *found = registry.find(dev.name);
            every_device_keeps = every_device_keeps && found != nullptr && found->verbs.keepsAcrossRestart();
        }
    }
    e->set_restart_keeps(served_any ? every_device_keeps : vdevOpsKeep(vdevs, d.name));
}

void loadAttempt(const loader::LoadRecord &r, pb::LoadAttempt *a) {
    a->set_name(r.name);
    a->set_source(r.source);
    a->set_path(r.path);
    a->set_loaded(r.loaded);
    a->set_error(r.error);
}

// The limit a SetQuota asks for; nullopt clears an override (its account follows the default).
StatusOr<std::optional<uint64_t>> requestedLimit(const pb::SetQuotaRequest &req) {
    // The configuration's range (a [quotas] entry is a TOML integer, signed 64-bit). Above it
    // is no real limit but a mistake, most likely a negative number sent as unsigned (an
    // older ibv-extendctl stored "-5" as 18446744073709551611); kUnlimited among them.
    constexpr uint64_t kMaxLimit = std::numeric_limits<int64_t>::max();
    if (!req.clear() && !req.unlimited() && req.limit() > kMaxLimit) {
        return invalidArgument("quota " + req.quota() + " limit " + std::to_string(req.limit()) +
                               " is out of range: a limit is 0.." + std::to_string(kMaxLimit) +
                               "; set unlimited for no limit");
    }
    if (req.clear()) {
        return std::optional<uint64_t>();
    }
    return std::optional<uint64_t>(req.unlimited() ? kUnlimited : req.limit());
}

std::string limitName(const std::optional<uint64_t> &limit) {
    if (!limit) {
        return "default";
    }
    return *limit == kUnlimited ? "unlimited" : std::to_string(*limit);
}

// An account's name: the uid's, the container's or the namespace's.
void accountInfo(pb::QuotaScope scope, uint32_t uid, const std::string &name, pb::QuotaAccountInfo *a) {
    a->set_scope(scope);
    a->set_uid(uid);
    if (scope == pb::QUOTA_SCOPE_NAMESPACE) {
        a->set_pod_namespace(name);
    } else {
        a->set_container(name);
    }
}

// The account a SetQuota names.
std::string accountName(const pb::SetQuotaRequest &req) {
    switch (req.scope()) {
        case pb::QUOTA_SCOPE_UID:
            return std::to_string(req.uid());
        case pb::QUOTA_SCOPE_CONTAINER:
            return req.container();
        case pb::QUOTA_SCOPE_NAMESPACE:
            return req.pod_namespace();
        default:
            return "";
    }
}

}  // namespace

AdminService::AdminService(Broker &broker, ConnectionRegistry &connections, RpcStats &broker_stats,
                           AdminRpcStats &admin_stats, std::shared_ptr<AdminEvents> events, AdminHooks hooks,
                           EvictFn evict)
    : broker_(broker),
      connections_(connections),
      stats_(broker_stats),
      admin_stats_(admin_stats),
      events_(std::move(events)),
      hooks_(std::move(hooks)),
      evict_(std::move(evict)) {}

Status AdminService::authorize(grpc::CallbackServerContext *ctx) {
    auto peer = connections_.lookup(ctx->peer());
    if (!peer) {
        return permissionDenied("unknown connection");
    }
    if (peer->creds.uid == 0) {
        return Status::ok();
    }
    if (hooks_.admin_gid >= 0 && processInGroup(peer->creds, static_cast<gid_t>(hooks_.admin_gid))) {
        return Status::ok();
    }
    if (hooks_.admin_gid < 0) {
        return permissionDenied("the Admin service is for root only (no [broker] admin_group is configured)");
    }
    return permissionDenied("the Admin service needs root or membership of the admin group '" +
                            hooks_.admin_group + "' (gid " + std::to_string(hooks_.admin_gid) + ")");
}

template <typename Fn>
grpc::ServerUnaryReactor *AdminService::serve(grpc::CallbackServerContext *ctx, AdminMethod m, Fn &&fn) {
    auto call = calls_.begin(ctx, m);
    if (Status st = authorize(ctx); !st.isOk()) {
        return call.finish(st);
    }
    return call.finish(fn());
}

template <typename Start>
grpc::ServerUnaryReactor *AdminService::serveBlocking(grpc::CallbackServerContext *ctx, AdminMethod m,
                                                      Start &&start) {
    auto call = calls_.begin(ctx, m);
    if (Status st = authorize(ctx); !st.isOk()) {
        return call.finish(st);
    }
    StatusOr<BlockingTask> task = start();
    if (!task.isOk()) {
        return call.finish(task.status());
    }
    return calls_.finishOn(blocking_, call, std::move(task).value());
}

uint32_t AdminService::callerUid(grpc::CallbackServerContext *ctx) {
    auto peer = connections_.lookup(ctx->peer());
    return peer ? peer->creds.uid : 0;
}

uint64_t AdminService::uptimeMs() const {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_)
            .count());
}

grpc::ServerUnaryReactor *AdminService::GetStats(grpc::CallbackServerContext *ctx,
                                                 const pb::GetStatsRequest *, pb::GetStatsResponse *resp) {
    return serve(ctx, AdminMethod::kGetStats, [&] {
        std::array<uint64_t, kGrpcCodes> all_codes{}, admin_codes{};
        uint64_t total_errors = 0, admin_errors = 0;
        methodStats(stats_, resp->mutable_rpcs(), &all_codes, &total_errors);
        methodStats(admin_stats_, resp->mutable_admin_rpcs(), &admin_codes, &admin_errors);
        for (size_t c = 1; c < kGrpcCodes; ++c) {
            if (all_codes[c] != 0) {
                auto *ec = resp->add_errors_by_code();
                ec->set_code(static_cast<pb::ErrorCode>(c));
                ec->set_count(all_codes[c]);
            }
        }
        resp->set_total_calls(stats_.total());
        resp->set_total_errors(total_errors);
        resp->set_sessions(static_cast<uint32_t>(broker_.sessionCount()));
        resp->set_objects(broker_.objectCount());
        resp->set_uptime_ms(uptimeMs());
        resp->set_arena_bytes(memoryTotals().arena_bytes);
        resp->set_sessions_opened(sessions_opened_.load());
        resp->set_sessions_evicted(sessions_evicted_.load());
        AuditLog::Counters audit = events_->audit().counters();
        resp->set_audit_creates(audit.creates);
        resp->set_audit_destroys(audit.destroys);
        resp->set_audit_lines(audit.lines);
        resp->set_audit_lines_suppressed(audit.lines_suppressed);
        uint64_t reply_bytes = 0;
        for (const auto &s : broker_.sessions()) {
            reply_bytes += s->storedReplyBytes();
        }
        resp->set_stored_reply_bytes(reply_bytes);
        addEngineCounters(broker_.devices(), resp);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::GetStatus(grpc::CallbackServerContext *ctx,
                                                  const pb::GetStatusRequest *, pb::GetStatusResponse *resp) {
    return serve(ctx, AdminMethod::kGetStatus, [&] {
        toProto(broker_.options().version, resp->mutable_broker_version());
        resp->set_uptime_ms(uptimeMs());
        resp->set_config_path(hooks_.config_path);
        resp->set_socket_path(hooks_.socket_path);
        resp->set_socket_activated(hooks_.socket_activated);
        resp->set_pid(static_cast<int32_t>(::getpid()));
        for (const DeviceInfo &d : broker_.listDevices()) {
            toProto(d, resp->add_devices());
        }
        resp->set_sessions(static_cast<uint32_t>(broker_.sessionCount()));
        resp->set_objects(broker_.objectCount());
        MemoryStats m = memoryTotals();
        resp->set_arena_chunks(m.arena_chunks);
        resp->set_arena_bytes(m.arena_bytes);
        resp->set_allocated_bytes(m.allocated_bytes);
        resp->set_doorbell_pages(m.doorbell_pages);
        resp->set_admin_group(hooks_.admin_gid >= 0 ? hooks_.admin_group : "");
        resp->set_total_calls(stats_.total());
        if (hooks_.restart_info) {
            RestartInfo r = hooks_.restart_info();
            resp->set_restarts(r.restarts);
            resp->set_last_restart_unix_ms(r.last_unix_ms);
            resp->set_last_restart_took_ms(r.last_took_ms);
            resp->set_last_restart_crash(r.last_crash);
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::ListDrivers(grpc::CallbackServerContext *ctx,
                                                    const pb::ListDriversRequest *,
                                                    pb::ListDriversResponse *resp) {
    return serve(ctx, AdminMethod::kListDrivers, [&] {
        std::vector<DeviceInfo> devices = broker_.listDevices();
        std::vector<const ibv_extend_vdev_ops *> vdevs = loader::vdevProviders();
        for (const loader::DriverInfo &d : loader::drivers()) {
            describeDriver(d, devices, vdevs, broker_.devices(), resp->add_drivers());
        }
        for (const loader::LoadRecord &r : loader::loadRecords()) {
            loadAttempt(r, resp->add_load_attempts());
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::ListSessions(grpc::CallbackServerContext *ctx,
                                                     const pb::ListSessionsRequest *req,
                                                     pb::ListSessionsResponse *resp) {
    return serve(ctx, AdminMethod::kListSessions, [&]() -> Status {
        uint64_t after = 0;
        if (!req->page_token().empty()) {
            ASSIGN_OR_RETURN(auto key, parsePageToken<1>(req->page_token(), 's'));
            after = key[0];
        }
        PageFill page(pageSize(req->page_size(), kDefaultSessionsPerPage, kMaxSessionsPerPage),
                      hooks_.reply_budget_bytes);
        for (const auto &s : sessionsById(broker_)) {
            if (s->id() <= after) {
                continue;
            }
            if (page.full()) {
                resp->set_next_page_token(pageToken('s', {after}));
                break;
            }
            auto *info = resp->add_sessions();
            sessionInfo(*s, stats_, info);
            page.add(*info);
            after = s->id();
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::ListObjects(grpc::CallbackServerContext *ctx,
                                                    const pb::ListObjectsRequest *req,
                                                    pb::ListObjectsResponse *resp) {
    return serve(ctx, AdminMethod::kListObjects, [&] { return listObjects(*req, resp); });
}

Status AdminService::listObjects(const pb::ListObjectsRequest &req, pb::ListObjectsResponse *resp) {
    std::optional<ObjectKey> after;
    if (!req.page_token().empty()) {
        ASSIGN_OR_RETURN(auto key, parsePageToken<3>(req.page_token(), 'o'));
        after = ObjectKey{key[0], key[1], key[2]};
    }
    std::optional<ObjectKind> kind;
    if (req.kind() != pb::OBJECT_KIND_UNSPECIFIED) {
        kind = fromProto(req.kind());
        if (!kind) {
            return invalidArgument("kind " + std::to_string(req.kind()) +
                                   " is not an ObjectKind this broker knows");
        }
    }
    PageFill page(pageSize(req.page_size(), kDefaultObjectsPerPage, kMaxObjectsPerPage),
                  hooks_.reply_budget_bytes);
    for (const auto &s : sessionsById(broker_)) {
        const Credentials &c = s->identity().creds;
        if ((req.session() != 0 && s->id() != req.session()) || (req.has_uid() && c.uid != req.uid()) ||
            (after && s->id() < std::get<0>(*after))) {
            continue;
        }
        std::vector<ObjectSnapshot> objects = SessionInspector::objects(*s);
        std::sort(objects.begin(), objects.end(),
                  [&](const auto &a, const auto &b) { return keyOf(*s, a) < keyOf(*s, b); });
        for (const ObjectSnapshot &o : objects) {
            if ((kind && o.kind != *kind) || (!req.device().empty() && req.device() != o.device) ||
                (after && keyOf(*s, o) <= *after)) {
                continue;
            }
            if (page.full()) {
                auto [session, k, handle] = *after;
                resp->set_next_page_token(pageToken('o', {session, k, handle}));
                return Status::ok();
            }
            auto *out = resp->add_objects();
            toProto(o, out);
            out->set_session(s->id());
            out->set_pid(c.pid);
            out->set_uid(c.uid);
            page.add(*out);
            after = keyOf(*s, o);
        }
    }
    return Status::ok();
}

grpc::ServerUnaryReactor *AdminService::EvictSession(grpc::CallbackServerContext *ctx,
                                                     const pb::EvictSessionRequest *req,
                                                     pb::EvictSessionResponse *resp) {
    return serveBlocking(ctx, AdminMethod::kEvictSession, [&]() -> StatusOr<BlockingTask> {
        ASSIGN_OR_RETURN(std::shared_ptr<Session> victim, liveSession(req->session()));
        spdlog::warn("session {} (pid {} uid {}) evicted by uid {}", victim->id(),
                     victim->identity().creds.pid, victim->identity().creds.uid, callerUid(ctx));
        resp->set_objects_destroyed(victim->objectCount());
        ++sessions_evicted_;
        // The event loop tears the session down; waiting for it is the blocking part.
        return BlockingTask([done = evict_(victim)] {
            if (done.wait_for(kEvictionWait) != std::future_status::ready) {
                return Status(Code::kDeadlineExceeded, ETIMEDOUT, "eviction still running");
            }
            return Status::ok();
        });
    });
}

StatusOr<std::shared_ptr<Session>> AdminService::liveSession(uint64_t id) {
    std::shared_ptr<Session> found;
    for (auto &s : broker_.sessions()) {
        if (s->id() == id) {
            found = s;
        }
    }
    if (found == nullptr || found->ended()) {
        return Status(Code::kNotFound, ENOENT, "no live session " + std::to_string(id));
    }
    return found;
}

grpc::ServerUnaryReactor *AdminService::ReloadDrivers(grpc::CallbackServerContext *ctx,
                                                      const pb::ReloadDriversRequest *,
                                                      pb::ReloadDriversResponse *resp) {
    return serve(ctx, AdminMethod::kReloadDrivers, [&] {
        if (!hooks_.reload) {
            return Status(Code::kUnimplemented, ENOSYS, "this broker cannot reload drivers");
        }
        ReloadReport r = hooks_.reload();
        resp->set_new_devices(r.new_devices);
        resp->set_devices(r.devices);
        for (auto &e : r.errors) {
            resp->add_errors(e);
        }
        for (auto &l : r.loaded) {
            resp->add_loaded(l);
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::GetQuotas(grpc::CallbackServerContext *ctx,
                                                  const pb::GetQuotasRequest *, pb::GetQuotasResponse *resp) {
    return serve(ctx, AdminMethod::kGetQuotas, [&] {
        QuotaSnapshot snap = broker_.quotas().snapshot();
        quotaValues(nullptr, snap.defaults, resp->mutable_defaults());
        for (const auto &[uid, account] : snap.uids) {
            accountInfo(pb::QUOTA_SCOPE_UID, uid, "", resp->add_accounts());
            quotaValues(&account.used, account.limit, resp->mutable_accounts()->rbegin()->mutable_quotas());
        }
        for (const auto &[container, account] : snap.containers) {
            accountInfo(pb::QUOTA_SCOPE_CONTAINER, 0, container, resp->add_accounts());
            quotaValues(&account.used, account.limit, resp->mutable_accounts()->rbegin()->mutable_quotas());
        }
        for (const auto &[uid, o] : snap.uid_overrides) {
            accountInfo(pb::QUOTA_SCOPE_UID, uid, "", resp->add_overrides());
            overrideValues(o, resp->mutable_overrides()->rbegin()->mutable_quotas());
        }
        for (const auto &[container, o] : snap.container_overrides) {
            accountInfo(pb::QUOTA_SCOPE_CONTAINER, 0, container, resp->add_overrides());
            overrideValues(o, resp->mutable_overrides()->rbegin()->mutable_quotas());
        }
        for (const auto &[ns, account] : snap.namespaces) {
            accountInfo(pb::QUOTA_SCOPE_NAMESPACE, 0, ns, resp->add_accounts());
            quotaValues(&account.used, account.limit, resp->mutable_accounts()->rbegin()->mutable_quotas());
        }
        for (const auto &[ns, o] : snap.namespace_overrides) {
            accountInfo(pb::QUOTA_SCOPE_NAMESPACE, 0, ns, resp->add_overrides());
            overrideValues(o, resp->mutable_overrides()->rbegin()->mutable_quotas());
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *AdminService::SetQuota(grpc::CallbackServerContext *ctx,
                                                 const pb::SetQuotaRequest *req, pb::SetQuotaResponse *) {
    return serve(ctx, AdminMethod::kSetQuota, [&]() -> Status {
        std::optional<Quota> q = quotaFromName(req->quota());
        if (!q) {
            return invalidArgument("unknown quota '" + req->quota() +
                                   "' (contexts, pds, mrs, mr_bytes, cqs, qps, srqs, queue_bytes, sessions, "
                                   "ahs, event_fds, replies, state_bytes)");
        }
        ASSIGN_OR_RETURN(std::optional<uint64_t> limit, requestedLimit(*req));
        RETURN_IF_ERROR(setQuota(*req, *q, limit));
        spdlog::info("quota {} {} {} set to {} by uid {}", scopeName(req->scope()), accountName(*req),
                     req->quota(), limitName(limit), callerUid(ctx));
        return Status::ok();
    });
}

Status AdminService::setQuota(const pb::SetQuotaRequest &req, Quota q, std::optional<uint64_t> limit) {
    QuotaEdit edit{QuotaScope::kDefault, 0, "", q, limit};
    switch (req.scope()) {
        case pb::QUOTA_SCOPE_DEFAULT:
            break;
        case pb::QUOTA_SCOPE_UID:
            edit.scope = QuotaScope::kUid;
            edit.uid = req.uid();
            break;
        case pb::QUOTA_SCOPE_CONTAINER:
            edit.scope = QuotaScope::kContainer;
            edit.name = req.container();
            break;
        case pb::QUOTA_SCOPE_NAMESPACE:
            edit.scope = QuotaScope::kNamespace;
            edit.name = req.pod_namespace();
            break;
        default:
            return invalidArgument("scope must be default, uid, container or namespace");
    }
    RETURN_IF_ERROR(broker_.quotas().apply(edit));
    // Kept at once where a crash restart finds it, not only at the next heartbeat.
    if (hooks_.quotas_changed) {
        hooks_.quotas_changed();
    }
    return Status::ok();
}

grpc::ServerUnaryReactor *AdminService::Restart(grpc::CallbackServerContext *ctx,
                                                const pb::RestartRequest *req, pb::RestartResponse *resp) {
    return serveBlocking(ctx, AdminMethod::kRestart, [&]() -> StatusOr<BlockingTask> {
        if (!hooks_.restart) {
            return Status(Code::kUnimplemented, ENOSYS, "this broker cannot restart itself");
        }
        // Planning walks every session's objects under the core's locks: not on a callback thread.
        return BlockingTask([this, resp, uid = callerUid(ctx), require_keep = req->require_keep()] {
            return planRestart(require_keep, uid, resp);
        });
    });
}

Status AdminService::planRestart(bool require_keep, uint32_t uid, pb::RestartResponse *resp) {
    ASSIGN_OR_RETURN(RestartPlan plan, hooks_.restart(require_keep));
    spdlog::warn("restart requested by uid {}{}: {} session(s) kept, {} dropped, exec {}", uid,
                 require_keep ? " (require keep)" : "", plan.sessions_kept, plan.sessions_dropped,
                 plan.binary);
    resp->set_sessions_kept(plan.sessions_kept);
    resp->set_sessions_dropped(plan.sessions_dropped);
    for (const std::string &d : plan.dropping_drivers) {
        resp->add_dropping_drivers(d);
    }
    resp->set_binary(plan.binary);
    return Status::ok();
}

// A stream: counted once, when it starts (accepted or refused).
grpc::ServerWriteReactor<pb::AdminEvent> *AdminService::Watch(grpc::CallbackServerContext *ctx,
                                                              const pb::WatchRequest *) {
    auto start = std::chrono::steady_clock::now();
    Status st = authorize(ctx);
    admin_stats_.record(AdminMethod::kWatch, static_cast<int>(toGrpc(st).error_code()),
                        std::chrono::steady_clock::now() - start, 0);
    if (!st.isOk()) {
        spdlog::info("Watch from {} failed: {}", ctx->peer(), st.toString());
        // A reactor that only reports the refusal.
        class Refused final : public grpc::ServerWriteReactor<pb::AdminEvent> {
          public:
            explicit Refused(grpc::Status s) { Finish(std::move(s)); }
            void OnDone() override { delete this; }
        };
        return new Refused(toGrpc(st));
    }
    return new WatchReactor(events_);
}

}  // namespace ibvx::daemon
