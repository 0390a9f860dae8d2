#include "daemon/edge/admin_service.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <deque>
#include <mutex>

#include "daemon/core/admin_inspect.h"
#include "daemon/edge/convert.h"
#include "daemon/edge/grpc_status.h"
#include "providers/loader/loader.h"
#include "providers/softnda/include/softnda.h"

namespace ibvx::daemon {
namespace {

const char *const kCodeNames[kGrpcCodes] = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};

constexpr int kMaxObjectsPerReply = 4096;  // keeps a reply under the 64 KiB message limit
constexpr size_t kWatchQueue = 1024;

using QueryCountersFn = int (*)(const char *, softnda_counters *);

// softnda_query_counters from the loaded softnda library (the broker dlopens providers, so the
// symbol is not linked in). nullptr when softnda is not loaded.
QueryCountersFn softndaCounters() {
    for (const loader::DriverInfo &d : loader::drivers()) {
        if (d.name != SOFTNDA_PROVIDER_NAME || d.library.empty()) {
            continue;
        }
        void *h = ::dlopen(d.library.c_str(), RTLD_NOW | RTLD_NOLOAD);
        if (h == nullptr) {
            return nullptr;
        }
        auto fn = reinterpret_cast<QueryCountersFn>(::dlsym(h, "softnda_query_counters"));
        ::dlclose(h);  // drivers are never unloaded: the loader keeps its own reference
        return fn;
    }
    return nullptr;
}

void addEngineCounters(const std::vector<DeviceInfo> &devices, pb::GetStatsResponse *resp) {
    QueryCountersFn fn = nullptr;
    bool looked = false;
    for (const DeviceInfo &d : devices) {
        if (d.provider != SOFTNDA_PROVIDER_NAME) {
            continue;
        }
        if (!looked) {
            fn = softndaCounters();
            looked = true;
        }
        softnda_counters c{};
        if (fn == nullptr || fn(d.name.c_str(), &c) < 0) {
            continue;
        }
        auto *e = resp->add_engines();
        e->set_device(d.name);
        e->set_provider(d.provider);
        auto add = [e](const char *name, uint64_t v) {
            auto *ctr = e->add_counters();
            ctr->set_name(name);
            ctr->set_value(v);
        };
        add("wqes_executed", c.wqes_executed);
        add("bytes", c.bytes);
        add("doorbells", c.doorbells);
        add("cqes", c.cqes);
        add("errors", c.errors);
        add("flushed", c.flushed);
        add("rnr_naks", c.rnr_naks);
        add("cq_overflows", c.cq_overflows);
        add("dropped_cqes", c.dropped_cqes);
        add("srq_limit_events", c.srq_limit_events);
        add("passes", c.passes);
        add("sleeps", c.sleeps);
        add("wakeups_by_hint", c.wakeups_by_hint);
        add("sweeps", c.sweeps);
    }
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

}  // namespace

AdminService::AdminService(Broker &broker, ConnectionRegistry &connections, RpcStats &stats,
                           std::shared_ptr<AdminEvents> events, AdminHooks hooks, EvictFn evict)
    : broker_(broker),
      connections_(connections),
      stats_(stats),
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

grpc::ServerUnaryReactor *AdminService::reply(grpc::CallbackServerContext *ctx, const Status &st) {
    auto *reactor = ctx->DefaultReactor();
    reactor->Finish(toGrpc(st));
    return reactor;
}

uint64_t AdminService::uptimeMs() const {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started_)
            .count());
}

grpc::ServerUnaryReactor *AdminService::GetStats(grpc::CallbackServerContext *ctx,
                                                 const pb::GetStatsRequest *, pb::GetStatsResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    std::array<uint64_t, kGrpcCodes> all_codes{};
    uint64_t total_errors = 0;
    for (size_t i = 0; i < static_cast<size_t>(Method::kCount); ++i) {
        auto m = static_cast<Method>(i);
        auto *r = resp->add_rpcs();
        r->set_method(methodName(m));
        r->set_calls(stats_.calls(m));
        r->set_errors(stats_.errors(m));
        total_errors += stats_.errors(m);
        for (size_t c = 1; c < kGrpcCodes; ++c) {
            if (uint64_t n = stats_.byCode(m, c); n != 0) {
                auto *ec = r->add_errors_by_code();
                ec->set_code(kCodeNames[c]);
                ec->set_count(n);
                all_codes[c] += n;
            }
        }
        auto *h = r->mutable_latency();
        uint64_t count = 0;
        for (size_t b = 0; b <= kLatencyBoundsUs.size(); ++b) {
            if (b < kLatencyBoundsUs.size()) {
                h->add_bucket_upper_us(kLatencyBoundsUs[b]);
            }
            uint64_t n = stats_.bucket(m, b);
            h->add_counts(n);
            count += n;
        }
        h->set_sum_us(stats_.sumUs(m));
        h->set_count(count);
    }
    for (size_t c = 1; c < kGrpcCodes; ++c) {
        if (all_codes[c] != 0) {
            auto *ec = resp->add_errors_by_code();
            ec->set_code(kCodeNames[c]);
            ec->set_count(all_codes[c]);
        }
    }
    resp->set_total_calls(stats_.total());
    resp->set_total_errors(total_errors);
    resp->set_sessions(static_cast<uint32_t>(broker_.sessionCount()));
    resp->set_objects(broker_.objectCount());
    resp->set_uptime_ms(uptimeMs());
    resp->set_arena_bytes(MappingManager::instance().totals().arena_bytes);
    resp->set_sessions_opened(sessions_opened_.load());
    resp->set_sessions_evicted(sessions_evicted_.load());
    addEngineCounters(broker_.listDevices(), resp);
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::GetStatus(grpc::CallbackServerContext *ctx,
                                                  const pb::GetStatusRequest *, pb::GetStatusResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    const Version &v = broker_.options().version;
    resp->mutable_broker_version()->set_major(v.major);
    resp->mutable_broker_version()->set_minor(v.minor);
    resp->mutable_broker_version()->set_patch(v.patch);
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
    MemoryStats m = MappingManager::instance().totals();
    resp->set_arena_chunks(m.arena_chunks);
    resp->set_arena_bytes(m.arena_bytes);
    resp->set_allocated_bytes(m.allocated_bytes);
    resp->set_doorbell_pages(m.doorbell_pages);
    resp->set_admin_group(hooks_.admin_gid >= 0 ? hooks_.admin_group : "");
    resp->set_total_calls(stats_.total());
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::ListDrivers(grpc::CallbackServerContext *ctx,
                                                    const pb::ListDriversRequest *,
                                                    pb::ListDriversResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    std::vector<DeviceInfo> devices = broker_.listDevices();
    std::vector<const ibv_extend_vdev_ops *> vdevs = loader::vdevProviders();
    for (const loader::DriverInfo &d : loader::drivers()) {
        auto *e = resp->add_drivers();
        e->set_name(d.name);
        e->set_library(d.library);
        for (const ibv_extend_vdev_ops *v : vdevs) {
            if (v->provider != nullptr && d.name == v->provider) {
                e->set_virtual_provider(true);
                e->set_ops_version(v->abi);
            }
        }
        for (const DeviceInfo &dev : devices) {
            if (dev.provider == d.name) {
                e->add_devices(dev.name);
                if (!e->virtual_provider()) {
                    e->set_ops_version(dev.driver_version);
                }
            }
        }
    }
    for (const loader::LoadRecord &r : loader::loadRecords()) {
        auto *a = resp->add_load_attempts();
        a->set_name(r.name);
        a->set_source(r.source);
        a->set_path(r.path);
        a->set_loaded(r.loaded);
        a->set_error(r.error);
    }
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::ListSessions(grpc::CallbackServerContext *ctx,
                                                     const pb::ListSessionsRequest *,
                                                     pb::ListSessionsResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    auto sessions = broker_.sessions();
    std::sort(sessions.begin(), sessions.end(),
              [](const auto &a, const auto &b) { return a->id() < b->id(); });
    auto now = std::chrono::steady_clock::now();
    auto wall = std::chrono::system_clock::now();
    for (const auto &s : sessions) {
        if (resp->sessions_size() >= 512) {
            break;  // 64 KiB reply limit
        }
        auto *o = resp->add_sessions();
        const PeerIdentity &id = s->identity();
        o->set_id(s->id());
        o->set_pid(id.creds.pid);
        o->set_uid(id.creds.uid);
        o->set_gid(id.creds.gid);
        o->set_cgroup(id.cgroup);
        o->set_container_id(id.container_id);
        o->set_client_name(s->clientName());
        auto age = std::chrono::duration_cast<std::chrono::milliseconds>(now - s->createdAt());
        o->set_connected_ms(static_cast<uint64_t>(age.count()));
        o->set_connected_since_unix_ms(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::milliseconds>((wall - age).time_since_epoch()).count()));
        o->set_attached(s->attached());
        o->set_objects(s->objectCount());
        MemoryStats m = MappingManager::instance().stats(s->memory());
        o->set_arena_bytes(m.arena_bytes);
        o->set_allocated_bytes(m.allocated_bytes);
        o->set_doorbell_pages(m.doorbell_pages);
        RpcStats::SessionCalls c = stats_.ofSession(s->id());
        o->set_rpc_calls(c.calls);
        o->set_rpc_errors(c.errors);
    }
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::ListObjects(grpc::CallbackServerContext *ctx,
                                                    const pb::ListObjectsRequest *req,
                                                    pb::ListObjectsResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    auto sessions = broker_.sessions();
    std::sort(sessions.begin(), sessions.end(),
              [](const auto &a, const auto &b) { return a->id() < b->id(); });
    for (const auto &s : sessions) {
        const Credentials &c = s->identity().creds;
        if ((req->session() != 0 && s->id() != req->session()) || (req->has_uid() && c.uid != req->uid())) {
            continue;
        }
        for (const ObjectSnapshot &o : SessionInspector::objects(*s)) {
            if ((!req->kind().empty() && req->kind() != kindName(o.kind)) ||
                (!req->device().empty() && req->device() != o.device)) {
                continue;
            }
            if (resp->objects_size() >= kMaxObjectsPerReply) {
                resp->set_truncated(true);
                return reply(ctx, Status::ok());
            }
            auto *out = resp->add_objects();
            out->set_handle(o.handle);
            out->set_kind(kindName(o.kind));
            out->set_session(s->id());
            out->set_pid(c.pid);
            out->set_uid(c.uid);
            out->set_device(o.device);
            out->set_users(o.users);
            for (uint64_t u : o.uses) {
                out->add_uses(u);
            }
            switch (o.kind) {
                case ObjectKind::kQp: {
                    auto *q = out->mutable_qp();
                    q->set_qp_num(o.qp_num);
                    q->set_state(qpStateName(o.qp_state));
                    q->set_qp_type(qpTypeName(o.qp_type));
                    q->set_max_send_wr(o.qp_cap.max_send_wr);
                    q->set_max_recv_wr(o.qp_cap.max_recv_wr);
                    q->set_max_send_sge(o.qp_cap.max_send_sge);
                    q->set_max_recv_sge(o.qp_cap.max_recv_sge);
                    q->set_max_inline_data(o.qp_cap.max_inline_data);
                    q->set_has_srq(o.qp_has_srq);
                    break;
                }
                case ObjectKind::kCq:
                    out->mutable_cq()->set_cqe(o.cqe);
                    out->mutable_cq()->set_queue_bytes(o.queue_bytes);
                    break;
                case ObjectKind::kSrq:
                    out->mutable_srq()->set_max_wr(o.srq_entries);
                    out->mutable_srq()->set_entry_size(o.srq_entry_size);
                    break;
                case ObjectKind::kMr:
                    out->mutable_mr()->set_length(o.mr_length);
                    out->mutable_mr()->set_lkey(o.lkey);
                    out->mutable_mr()->set_rkey(o.rkey);
                    break;
                default:
                    break;
            }
        }
    }
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::EvictSession(grpc::CallbackServerContext *ctx,
                                                     const pb::EvictSessionRequest *req,
                                                     pb::EvictSessionResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    std::shared_ptr<Session> victim;
    for (auto &s : broker_.sessions()) {
        if (s->id() == req->session()) {
            victim = s;
        }
    }
    if (victim == nullptr || victim->ended()) {
        return reply(ctx,
                     Status(Code::kNotFound, ENOENT, "no live session " + std::to_string(req->session())));
    }
    auto peer = connections_.lookup(ctx->peer());
    spdlog::warn("session {} (pid {} uid {}) evicted by uid {}", victim->id(), victim->identity().creds.pid,
                 victim->identity().creds.uid, peer ? peer->creds.uid : 0);
    resp->set_objects_destroyed(victim->objectCount());
    ++sessions_evicted_;
    std::shared_future<void> done = evict_(victim);
    if (done.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
        return reply(ctx, Status(Code::kDeadlineExceeded, ETIMEDOUT, "eviction still running"));
    }
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::ReloadDrivers(grpc::CallbackServerContext *ctx,
                                                      const pb::ReloadDriversRequest *,
                                                      pb::ReloadDriversResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    if (!hooks_.reload) {
        return reply(ctx, Status(Code::kUnimplemented, ENOSYS, "this broker cannot reload drivers"));
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
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::GetQuotas(grpc::CallbackServerContext *ctx,
                                                  const pb::GetQuotasRequest *, pb::GetQuotasResponse *resp) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    QuotaSnapshot snap = broker_.quotas().snapshot();
    quotaValues(nullptr, snap.defaults, resp->mutable_defaults());
    for (const auto &[uid, account] : snap.uids) {
        auto *a = resp->add_accounts();
        a->set_scope("uid");
        a->set_uid(uid);
        quotaValues(&account.used, account.limit, a->mutable_quotas());
    }
    for (const auto &[container, account] : snap.containers) {
        auto *a = resp->add_accounts();
        a->set_scope("container");
        a->set_container(container);
        quotaValues(&account.used, account.limit, a->mutable_quotas());
    }
    for (const auto &[uid, o] : snap.uid_overrides) {
        auto *a = resp->add_overrides();
        a->set_scope("uid");
        a->set_uid(uid);
        overrideValues(o, a->mutable_quotas());
    }
    for (const auto &[container, o] : snap.container_overrides) {
        auto *a = resp->add_overrides();
        a->set_scope("container");
        a->set_container(container);
        overrideValues(o, a->mutable_quotas());
    }
    return reply(ctx, Status::ok());
}

grpc::ServerUnaryReactor *AdminService::SetQuota(grpc::CallbackServerContext *ctx,
                                                 const pb::SetQuotaRequest *req, pb::SetQuotaResponse *) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
        return reply(ctx, st);
    }
    std::optional<Quota> q = quotaFromName(req->quota());
    if (!q) {
        return reply(
            ctx, invalidArgument("unknown quota '" + req->quota() +
                                 "' (contexts, pds, mrs, mr_bytes, cqs, qps, srqs, queue_bytes, sessions)"));
    }
    std::optional<uint64_t> limit;
    if (!req->clear()) {
        limit = req->unlimited() ? kUnlimited : req->limit();
    }
    if (req->scope() == "default") {
        if (!limit) {
            return reply(ctx, invalidArgument("a default cannot be cleared; set it to unlimited"));
        }
        broker_.quotas().setDefault(*q, *limit);
    } else if (req->scope() == "uid") {
        broker_.quotas().setOverride(QuotaScope::kUid, req->uid(), "", *q, limit);
    } else if (req->scope() == "container") {
        if (req->container().empty()) {
            return reply(ctx, invalidArgument("container scope needs a container id"));
        }
        broker_.quotas().setOverride(QuotaScope::kContainer, 0, req->container(), *q, limit);
    } else {
        return reply(ctx, invalidArgument("scope must be default, uid or container"));
    }
    auto peer = connections_.lookup(ctx->peer());
    spdlog::info("quota {} {} {} set to {} by uid {}", req->scope(),
                 req->scope() == "container" ? req->container() : std::to_string(req->uid()), req->quota(),
                 !limit                 ? std::string("default")
                 : *limit == kUnlimited ? std::string("unlimited")
                                        : std::to_string(*limit),
                 peer ? peer->creds.uid : 0);
    return reply(ctx, Status::ok());
}

grpc::ServerWriteReactor<pb::AdminEvent> *AdminService::Watch(grpc::CallbackServerContext *ctx,
                                                              const pb::WatchRequest *) {
    Status st = authorize(ctx);
    if (!st.isOk()) {
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
