#include "daemon/core/broker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "common/driver_ops.h"
#include "common/fd_kind.h"
#include "daemon/core/driver_call.h"
#include "daemon/core/events.h"
#include "daemon/core/fault_hooks.h"
#include "daemon/core/tenant_mapping.h"
#include "providers/loader/create_rules.h"
#include "providers/loader/extend_open.h"

namespace ibvx::daemon {
namespace {

Status sessionGone() {
    return Status(Code::kUnavailable, ENOTCONN, "session ended");
}

// A create rule's refusal (providers/loader/create_rules.h) as the broker reports it.
Status rule(const loader::RuleError &error) {
    return error ? invalidArgument(*error) : Status::ok();
}

loader::QueueLimits limitsOf(const DeviceInfo &d) {
    return {d.max_qp_wr, d.max_cqe, d.max_srq_wr, d.max_sge, d.max_inline_data};
}

// UNIMPLEMENTED (message) unless the driver offers op (common/driver_ops.h).
Status requireOp(const ibv_context_extend_ops *ops, DriverOp op, const char *message) {
    return driverOpAvailable(ops, op) ? Status::ok() : unimplemented(message);
}

// memfd or dma-buf, by what the kernel calls the file.
bool isSharableMemory(int fd, bool *is_dmabuf) {
    char link[64];
    char target[256];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    if (n < 0) {
        return false;
    }
    target[n] = '\0';
    *is_dmabuf =
        std::strncmp(target, "/dmabuf:", 8) == 0 || std::strncmp(target, "anon_inode:dmabuf", 17) == 0;
    return *is_dmabuf || std::strncmp(target, "/memfd:", 7) == 0;
}

// The eventfd a tenant sent on the fd channel for event delivery (`what` names the call). Taken
// before the session lock, as RegMr's fd: the fd-channel reader must not wait on us.
StatusOr<UniqueFd> takeEventFd(Session &s, uint64_t xfer_id, std::chrono::milliseconds wait, const char *what,
                               const char *call) {
    UniqueFd fd = s.takeXfer(xfer_id, wait);
    if (!fd) {
        return Status(Code::kInvalidArgument, EBADF,
                      std::string("no fd arrived on the fd channel with xfer_id ") + std::to_string(xfer_id) +
                          " for " + what);
    }
    crashOnceAt(call);  // the fd taken, the call not committed (tests only)
    if (!isEventFd(fd.get())) {
        return Status(Code::kInvalidArgument, EINVAL,
                      std::string("the fd for ") + what + " is not an eventfd (create it with eventfd(2))");
    }
    return fd;
}

Status sendOnChannel(Session &s, std::vector<RegionToSend> &regions, int timeout_ms) {
    if (!s.attached()) {
        return Status(Code::kFailedPrecondition, ENOTCONN,
                      "the session's fd channel is not attached: queue memory cannot reach the client");
    }
    for (RegionToSend &r : regions) {
        if (!r.fd) {
            return Status(Code::kInternal, EIO, "cannot duplicate a region fd");
        }
        RegionPayload p{r.size, 0, 0};
        int rc = sendFrame(s.channelFd(), FrameType::kRegionAdd, r.id, &p, sizeof(p), r.fd.get(), timeout_ms);
        if (rc < 0) {
            return Status(Code::kUnavailable, -rc, "cannot send a region on the fd channel");
        }
    }
    return Status::ok();
}

}  // namespace

uint64_t randomHandle() {
    // The kernel's random bytes fetched 512 at a time, per thread: a handle is as unguessable
    // as one getrandom() of its own, and a create no longer pays a syscall for it.
    thread_local std::array<uint64_t, 64> pool;
    thread_local size_t left = 0;
    uint64_t v = 0;
    while (v == 0) {
        if (left == 0) {
            if (::getrandom(pool.data(), sizeof(pool), 0) != static_cast<ssize_t>(sizeof(pool))) {
                continue;
            }
            left = pool.size();
        }
        v = pool[--left];
        pool[left] = 0;  // handed out once: nothing of it stays behind
    }
    return v;
}

Broker::Broker(Options options, DeviceRegistry *devices) : options_(options), devices_(devices) {
    sender_ = [this](Session &s, std::vector<RegionToSend> &regions) {
        return sendOnChannel(s, regions, static_cast<int>(options_.channel_send_timeout.count()));
    };
}

Broker::~Broker() {
    endAllSessions();
}

void Broker::setPolicy(std::shared_ptr<const Policy> policy) {
    std::lock_guard lock(policy_mu_);
    policy_ = policy != nullptr ? std::move(policy) : std::make_shared<const Policy>();
}

std::shared_ptr<const Policy> Broker::policy() const {
    std::lock_guard lock(policy_mu_);
    return policy_;
}

StatusOr<QuotaCharge> Broker::reserve(const PeerIdentity &peer, uint64_t session,
                                      std::initializer_list<std::pair<Quota, uint64_t>> amounts) {
    auto charged = quotas_.reserve(tenantOf(peer), amounts);
    if (!charged.isOk() && charged.status().code() == Code::kResourceExhausted && events_ != nullptr) {
        events_->quotaDenied(peer, session, charged.status().message());
    }
    return charged;
}

TenantKey Broker::tenantOf(const PeerIdentity &peer) {
    return TenantKey{peer.creds.uid, peer.container_id, peer.pod_namespace};
}

StatusOr<QuotaCharge> Broker::charge(const Session &s,
                                     std::initializer_list<std::pair<Quota, uint64_t>> amounts) {
    return reserve(s.identity(), s.id(), amounts);
}

Status Broker::chargeQueueBytes(const Session &s, Object &obj, uint64_t bytes) {
    if (bytes == 0) {
        return Status::ok();
    }
    ASSIGN_OR_RETURN(QuotaCharge more, charge(s, {{Quota::kQueueBytes, bytes}}));
    obj.quota.merge(std::move(more));
    return Status::ok();
}

// ---- sessions ------------------------------------------------------------------------------

StatusOr<std::shared_ptr<Session>> Broker::hello(const PeerIdentity &peer, const Version &client,
                                                 std::string client_name) {
    if (client.major != options_.version.major || client.minor > options_.version.minor) {
        return Status(Code::kFailedPrecondition, EPROTONOSUPPORT,
                      "client version " + std::to_string(client.major) + "." + std::to_string(client.minor) +
                          " is not served by broker " + std::to_string(options_.version.major) + "." +
                          std::to_string(options_.version.minor) + " (same major, minor not newer)");
    }
    if (client_name.size() > 64) {
        return invalidArgument("client_name longer than 64 bytes");
    }
    RETURN_IF_ERROR(policy()->admitConnect(peer));
    ASSIGN_OR_RETURN(QuotaCharge quota, reserve(peer, 0, {{Quota::kSessions, 1}}));
    SessionToken token;
    if (::getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
        return Status::fromErrno(errno, "getrandom failed");
    }
    // Without a pidfd the session still ends on fd-channel EOF.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, peer.creds.pid, 0)));
    std::lock_guard lock(sessions_mu_);
    if (by_token_.size() >= options_.max_sessions) {
        return resourceExhausted("too many sessions (" + std::to_string(options_.max_sessions) + ")");
    }
    auto s =
        std::make_shared<Session>(next_session_id_++, token, peer, std::move(client_name), std::move(pidfd));
    s->quota_ = std::move(quota);
    by_token_[s->tokenHex()] = s;
    return s;
}

StatusOr<std::shared_ptr<Session>> Broker::authenticate(const std::string &token_hex,
                                                        const Credentials &caller) {
    SessionToken token;
    if (!tokenFromHex(token_hex, &token)) {
        return Status(Code::kPermissionDenied, EACCES, "missing or malformed ibvx-session token");
    }
    std::shared_ptr<Session> s;
    {
        std::lock_guard lock(sessions_mu_);
        auto it = by_token_.find(token_hex);
        if (it != by_token_.end()) {
            s = it->second;
        }
    }
    if (s == nullptr) {
        return sessionGone();
    }
    if (!(s->identity().creds == caller)) {
        return permissionDenied("the connection's credentials are not those of the session");
    }
    return s;
}

int Broker::attach(const SessionToken &token, const Credentials &caller, UniqueFd &fd,
                   std::shared_ptr<Session> *out) {
    std::shared_ptr<Session> s;
    {
        std::lock_guard lock(sessions_mu_);
        auto it = by_token_.find(tokenToHex(token));
        if (it == by_token_.end()) {
            return ENOENT;
        }
        s = it->second;
    }
    if (!(s->identity().creds == caller)) {
        return EPERM;
    }
    std::lock_guard lock(s->mu_);
    if (s->ended_) {
        return ENOENT;
    }
    if (s->channel_) {
        return EBUSY;
    }
    s->channel_ = std::move(fd);
    s->channel_fd_ = s->channel_.get();
    *out = s;
    return 0;
}

void Broker::endSession(const std::shared_ptr<Session> &s) {
    {
        std::lock_guard lock(sessions_mu_);
        auto it = by_token_.find(s->tokenHex());
        if (it != by_token_.end() && it->second == s) {
            by_token_.erase(it);
        }
        // Until its teardown is over, and longer when another session holds an XRC target it
        // made (finishTargets() finds it here).
        parked_[s->id()] = s;
    }
    s->ended_ = true;
    {
        std::lock_guard lock(s->xfer_mu_);
        s->xfers_closed_ = true;
        s->xfers_.clear();
        s->xfer_cv_.notify_all();
    }
    {
        std::lock_guard lock(s->mu_);
        if (!teardownLocked(*s)) {
            MappingManager::instance().dropSession(s->memory_.get());
            std::lock_guard parked(sessions_mu_);
            parked_.erase(s->id());
        }
        s->quota_.release();
        s->state_quota_.release();
        s->dropReplies();
        s->channel_fd_ = -1;
        s->channel_.reset();
        if (end_sink_) {
            end_sink_(*s);
        }
    }
    finishTargets();
}

bool Broker::teardownLocked(Session &s) {
    bool kept = false;
    // Children first: nothing is destroyed while something else still uses it.
    for (auto kind = std::rbegin(kParentsFirst); kind != std::rend(kParentsFirst); ++kind) {
        std::vector<Object *> victims;
        for (auto &[handle, obj] : s.objects_) {
            if (obj->kind == *kind) {
                victims.push_back(obj.get());
            }
        }
        for (Object *obj : victims) {
            uint64_t handle = obj->handle;  // obj is freed once destroyed
            if (kept && obj->users != 0) {
                continue;  // used by a target another session holds
            }
            // A driver that refuses the destroy still loses the object: the tenant is gone.
            if (!destroyLocked(s, obj).isOk() && s.objects_.count(handle) != 0) {
                eraseLocked(s, obj);
            }
            kept = kept || s.objects_.count(handle) != 0;
        }
    }
    return kept;
}

void Broker::endAllSessions() {
    for (auto &s : sessions()) {
        endSession(s);
    }
    // Every handle on a parked session's targets was another live session's: gone by now.
    std::lock_guard lock(sessions_mu_);
    parked_.clear();
}

std::vector<std::shared_ptr<Session>> Broker::sessions() {
    std::lock_guard lock(sessions_mu_);
    std::vector<std::shared_ptr<Session>> out;
    for (auto &[t, s] : by_token_) {
        out.push_back(s);
    }
    return out;
}

std::vector<std::shared_ptr<Session>> Broker::unattachedExpired(std::chrono::steady_clock::time_point now) {
    std::vector<std::shared_ptr<Session>> out;
    for (auto &s : sessions()) {
        if (!s->attached() && now - s->createdAt() > options_.attach_timeout) {
            out.push_back(s);
        }
    }
    return out;
}

size_t Broker::sessionCount() {
    std::lock_guard lock(sessions_mu_);
    return by_token_.size();
}

size_t Broker::objectCount() {
    size_t n = 0;
    for (auto &s : sessions()) {
        n += s->objectCount();
    }
    return n;
}

// ---- handles -------------------------------------------------------------------------------

Status Broker::commit(Session &s, StoredReply reply, QuotaCharge reply_quota) {
    auto lock = lockLive(s);
    if (!lock.isOk()) {
        return lock.status();
    }
    if (reply.key != 0) {
        s.addReply(std::move(reply), std::move(reply_quota));
    }
    if (!commit_) {
        (void)s.takeChanges();
        return Status::ok();
    }
    return commit_(s);
}

StatusOr<QuotaCharge> Broker::reserveReply(Session &s) {
    const TenantKey tenant = tenantOf(s.identity());
    for (;;) {
        auto room = quotas_.reserve(tenant, {{Quota::kReplies, 1}});
        if (room.isOk() || room.status().code() != Code::kResourceExhausted) {
            return room;
        }
        if (!s.dropOldestReply()) {  // nothing of its own left to give up
            if (events_ != nullptr) {
                events_->quotaDenied(s.identity(), s.id(), room.status().message());
            }
            return Status(Code::kResourceExhausted, room.status().errnoValue(),
                          room.status().message() +
                              " (replies kept for calls with an idempotency key; this session keeps none to "
                              "give up; the call was not run)");
        }
    }
}

StatusOr<Broker::SessionLock> Broker::lockLive(Session &s) {
    SessionLock lock(s.mu_);
    if (s.ended_) {
        return sessionGone();
    }
    return lock;
}

Status Broker::checkRoom(const Session &s) {
    if (s.objects_.size() >= options_.max_objects_per_session) {
        return resourceExhausted("the session holds " + std::to_string(s.objects_.size()) +
                                 " objects, the limit");
    }
    // One byte more of restart state must fit: at the limit, what the state holds stays and
    // nothing new is made. A probe: nothing is charged.
    Status probe = quotas_.check(tenantOf(s.identity()), {{Quota::kStateBytes, 1}});
    if (!probe.isOk()) {
        if (probe.code() == Code::kResourceExhausted && events_ != nullptr) {
            events_->quotaDenied(s.identity(), s.id(), probe.message());
        }
        return Status(probe.code(), probe.errnoValue(),
                      probe.message() + " (restart state: end objects or sessions to make room)");
    }
    return Status::ok();
}

void Broker::chargeStateBytes(Session &s, uint64_t bytes) {
    if (s.state_quota_.amount(Quota::kStateBytes) == bytes) {
        return;
    }
    // In place, after every commit: a new charge each time cost a tenant lookup, a charge and a
    // release of the old one.
    quotas_.resize(s.state_quota_, tenantOf(s.identity()), Quota::kStateBytes, bytes);
}

StatusOr<Object *> Broker::find(Session &s, uint64_t handle, ObjectKind kind) {
    auto it = s.objects_.find(handle);
    // Another session's handle is simply not in this table: NOT_FOUND, never "not yours".
    if (handle == 0 || it == s.objects_.end() || it->second->kind != kind || it->second->hidden()) {
        return Status(Code::kNotFound, kind == ObjectKind::kContext ? ENODEV : ENOENT,
                      std::string("no ") + kindName(kind) + " with this handle in the session");
    }
    return it->second.get();
}

template <typename T>
StatusOr<T *> Broker::lookup(Session &s, uint64_t handle) {
    ASSIGN_OR_RETURN(Object * obj, find(s, handle, T::kKind));
    return static_cast<T *>(obj);
}

uint64_t Broker::newHandle(Session &s) {
    uint64_t h;
    do {
        h = randomHandle();
    } while (s.objects_.count(h) != 0);
    return h;
}

uint64_t Broker::insert(Session &s, std::unique_ptr<Object> obj) {
    uint64_t h = newHandle(s);
    obj->handle = h;
    ObjectKind kind = obj->kind;
    link(s, std::move(obj));
    if (events_ != nullptr) {
        events_->objectCreated(s, kind, h);
    }
    return h;
}

void Broker::link(Session &s, std::unique_ptr<Object> obj) {
    for (Object *u : obj->uses) {
        ++u->users;
        touchParent(s, u);
    }
    uint64_t h = obj->handle;
    touch(s, obj.get());
    s.objects_.emplace(h, std::move(obj));
    s.object_count_ = s.objects_.size();
}

void Broker::touch(Session &s, Object *obj) {
    obj->state_dirty = true;
    s.changes_.touched.push_back(obj->handle);
}

void Broker::touchParent(Session &s, Object *obj) {
    // A child may change its parents' device state (a context's doorbell pages): exported
    // again, logged only when it did (SessionChanges::parents).
    obj->state_dirty = true;
    s.changes_.parents.push_back(obj->handle);
}

void Broker::eraseLocked(Session &s, Object *obj) {
    for (Object *u : obj->uses) {
        --u->users;
        touchParent(s, u);
    }
    uint64_t h = obj->handle;
    ObjectKind kind = obj->kind;
    s.objects_.erase(h);
    s.object_count_ = s.objects_.size();
    s.changes_.erased.push_back(h);
    if (events_ != nullptr) {
        events_->objectDestroyed(s, kind, h);
    }
}

Status Broker::destroyLocked(Session &s, Object *obj) {
    if (obj->users != 0) {
        return Status(Code::kFailedPrecondition, EBUSY,
                      std::string(kindName(obj->kind)) + " is still used by " + std::to_string(obj->users) +
                          " object(s); destroy those first");
    }
    if (keepsTarget(s, obj)) {
        return Status::ok();  // the tenant's handle is gone; the driver's target stays for the others
    }
    RETURN_IF_ERROR(callDriver(s.memory(), obj->device(),
                               std::string("driver refused to destroy the ") + kindName(obj->kind),
                               [&] { return obj->destroyDriverObject(); }));
    eraseLocked(s, obj);
    return Status::ok();
}

StatusOr<uint64_t> Broker::publish(Session &s, std::unique_ptr<Object> obj,
                                   std::initializer_list<QueueOut> queues) {
    // The rings' size is known only once the driver made them: queue bytes are charged after the
    // create, and a refusal rolls the driver object back like any other failure after it.
    Status st = Status::ok();
    uint64_t bytes = 0;
    for (const QueueOut &q : queues) {
        bytes += uint64_t{q.info->qbuf.entry_cnt} * q.info->qbuf.entry_size;
        if (st.isOk()) {
            auto translated = translate(s, *q.info);
            st = translated.status();
            if (st.isOk()) {
                *q.out = *translated;
            }
        }
    }
    obj->queue_bytes = bytes;
    if (st.isOk()) {
        st = chargeQueueBytes(s, *obj, bytes);
    }
    Object *raw = obj.get();
    uint64_t handle = insert(s, std::move(obj));
    if (st.isOk() && queues.size() != 0) {
        st = sendRegions(s);
    }
    if (!st.isOk()) {
        (void)destroyLocked(s, raw);
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    return handle;
}

Status Broker::sendRegions(Session &s) {
    std::vector<RegionToSend> regions = MappingManager::instance().takeUnsent(*s.memory_);
    if (regions.empty()) {
        return Status::ok();
    }
    return sender_(s, regions);
}

StatusOr<QueueResult> Broker::translate(Session &s, const queue_info &qi) {
    auto &mm = MappingManager::instance();
    QueueResult r;
    r.entry_cnt = qi.qbuf.entry_cnt;
    r.entry_size = qi.qbuf.entry_size;
    struct Item {
        uint64_t addr, len;
        RegionRef *out;
    } items[] = {
        {qi.qbuf.base, uint64_t{qi.qbuf.entry_cnt} * qi.qbuf.entry_size, &r.base},
        {reinterpret_cast<uint64_t>(qi.dbr_pi_va.iov_base), qi.dbr_pi_va.iov_len, &r.dbr_pi},
        {reinterpret_cast<uint64_t>(qi.dbr_ci_va.iov_base), qi.dbr_ci_va.iov_len, &r.dbr_ci},
        {reinterpret_cast<uint64_t>(qi.db_hw_va.iov_base), qi.db_hw_va.iov_len, &r.db_hw},
    };
    for (Item &it : items) {
        ASSIGN_OR_RETURN(*it.out, mm.resolve(*s.memory_, it.addr, it.len));
    }
    static_assert(sizeof(qi.qbuf.resv) == 32 && sizeof(qi.resv) == 32);
    std::memcpy(r.qbuf_resv, qi.qbuf.resv, 32);
    std::memcpy(r.info_resv, qi.resv, 32);
    return r;
}

// ---- calls ---------------------------------------------------------------------------------

std::vector<DeviceInfo> Broker::listDevices() {
    return devices_->list();
}

StatusOr<OpenContextResult> Broker::openContext(Session &s, const std::string &device_name) {
    if (device_name.empty() || device_name.size() > 64) {
        return invalidArgument("device_name must be 1..64 bytes");
    }
    Device *dev = devices_->find(device_name);
    if (dev == nullptr) {
        return Status(Code::kNotFound, ENODEV, "no device named '" + device_name + "'");
    }
    if (dev->driver == nullptr || dev->driver->alloc_context == nullptr) {
        return unimplemented("no extension driver serves '" + device_name + "'");
    }
    RETURN_IF_ERROR(policy()->admitDevice(s.identity(), device_name));
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kContexts, 1}}));
    auto obj = std::make_unique<ContextObject>();
    obj->quota = std::move(quota);
    obj->dev = dev;
    RETURN_IF_ERROR(openDriverContext(s, *obj));
    OpenContextResult r;
    r.device = dev->info;
    r.driver_version = static_cast<uint32_t>(obj->ext->ops->version);
    r.driver_ops_present = driverOpsPresent(obj->ext->ops);
    ASSIGN_OR_RETURN(r.context, publish(s, std::move(obj), {}));
    return r;
}

Status Broker::openDriverContext(Session &s, ContextObject &obj) {
    Device *dev = obj.dev;
    DriverCall call(s.memory(), dev);
    obj.verbs = dev->verbs.openDevice();
    if (obj.verbs == nullptr) {
        return fromDriver(errno, "cannot open device '" + dev->info.name + "'");
    }
    loader::ExtendOpen open = obj.openExtension();
    if (open.refusal == loader::ExtendRefusal::kNone) {
        return Status::ok();
    }
    if (open.refusal == loader::ExtendRefusal::kBadVersion) {
        return unimplemented("driver '" + dev->info.provider + "' announces an unsupported ops version");
    }
    return fromDriver(open.err != 0 ? open.err : EOPNOTSUPP, "the driver did not open an extension context");
}

StatusOr<Released> Broker::destroyByHandle(Session &s, uint64_t handle, ObjectKind kind) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(Object * obj, find(s, handle, kind));
    RETURN_IF_ERROR(destroyLocked(s, obj));
    return MappingManager::instance().takeReleased(*s.memory_);
}

StatusOr<Released> Broker::closeContext(Session &s, uint64_t context) {
    {
        ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
        ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
        if (keepsContextForTargets(s, *ctx)) {
            return Released{};
        }
    }
    return destroyByHandle(s, context, ObjectKind::kContext);
}

StatusOr<ibv_device_attr_extend> Broker::queryDevice(Session &s, uint64_t context) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    RETURN_IF_ERROR(requireOp(ctx->ext->ops, DriverOp::kQueryDevice, "the driver has no query_device"));
    ibv_device_attr_extend attr{};
    RETURN_IF_ERROR(callDriver(s.memory(), ctx->dev, "query_device failed",
                               [&] { return ctx->ext->ops->query_device(ctx->verbs, &attr); }));
    return attr;
}

StatusOr<ibv_device_attr> Broker::queryDeviceAttr(Session &s, uint64_t context) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    ibv_device_attr attr{};
    RETURN_IF_ERROR(callDriver(s.memory(), ctx->dev, "query_device failed",
                               [&] { return ctx->dev->verbs.queryDevice(ctx->verbs, &attr); }));
    return attr;
}

StatusOr<PortInfo> Broker::queryPort(Session &s, uint64_t context, uint8_t port) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    PortInfo info;
    RETURN_IF_ERROR(callDriver(s.memory(), ctx->dev, "query_port failed",
                               [&] { return ctx->dev->verbs.queryPort(ctx->verbs, port, &info.attr); }));
    // The populated entries only: an rdma-core device answers ENODATA for an empty slot.
    const int entries = std::clamp(info.attr.gid_tbl_len, 0, kMaxGidEntries);
    for (int i = 0; i < entries; ++i) {
        ibv_gid_entry g{};
        DriverCall call(s.memory(), ctx->dev);
        if (ctx->dev->verbs.queryGid(ctx->verbs, port, static_cast<uint32_t>(i), &g) == 0) {
            info.gids.push_back(g);
        }
    }
    return info;
}

Status Broker::setAsyncEventFd(Session &s, uint64_t context, uint64_t xfer_id) {
    if (xfer_id == 0) {
        return invalidArgument("SetAsyncEventFd needs the xfer_id of an eventfd sent on the fd channel");
    }
    ASSIGN_OR_RETURN(UniqueFd fd,
                     takeEventFd(s, xfer_id, options_.xfer_wait, "SetAsyncEventFd", "SetAsyncEventFd"));
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    // The driver keeps a dup of the fd (ours closes on return): one per context, which a second
    // call replaces, so it is charged once.
    QuotaCharge event_fd;
    if (ctx->quota.amount(Quota::kEventFds) == 0) {
        ASSIGN_OR_RETURN(event_fd, charge(s, {{Quota::kEventFds, 1}}));
    }
    touch(s, ctx);
    RETURN_IF_ERROR(callDriver(s.memory(), ctx->dev, "the device cannot deliver async events",
                               [&] { return ctx->dev->verbs.setAsyncEventFd(ctx->verbs, fd.get()); }));
    ctx->quota.merge(std::move(event_fd));
    return Status::ok();
}

StatusOr<uint64_t> Broker::allocPd(Session &s, uint64_t context) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, context));
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kPds, 1}}));
    auto obj = std::make_unique<PdObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    ASSIGN_OR_RETURN(obj->pd, createOnDriver(s.memory(), ctx->dev, EOPNOTSUPP, "alloc_pd failed",
                                             [&] { return ctx->dev->verbs.allocPd(ctx->verbs); }));
    obj->uses = {ctx};
    return publish(s, std::move(obj), {});
}

Status Broker::deallocPd(Session &s, uint64_t pd) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(PdObject * p, lookup<PdObject>(s, pd));
    return destroyLocked(s, p);
}

Status Broker::checkAhAttr(Session &s, ContextObject &ctx, const ibv_ah_attr &attr) {
    const uint32_t ports = ctx.dev->info.phys_port_cnt;
    if (attr.port_num == 0 || attr.port_num > ports) {
        return invalidArgument("ah_attr.port_num " + std::to_string(attr.port_num) + " is not a port of '" +
                               ctx.dev->info.name + "' (1.." + std::to_string(ports) + ")");
    }
    if (attr.sl > 15) {
        return invalidArgument("ah_attr.sl " + std::to_string(attr.sl) + " is not a service level (0..15)");
    }
    if (!attr.is_global) {
        if (attr.dlid == 0) {
            return invalidArgument("ah_attr without a GRH needs a non-zero dlid");
        }
        // A RoCE port has no LIDs: Ethernet addresses by GID, and the kernel (rdma_check_ah_attr)
        // and mlx5 refuse such an AH with EINVAL. Asked of the driver only here, off the GRH path.
        ibv_port_attr port{};
        int rc = 0;
        {
            DriverCall call(s.memory(), ctx.dev);
            rc = ctx.dev->verbs.queryPort(ctx.verbs, attr.port_num, &port);
        }
        if (rc == 0 && port.link_layer == IBV_LINK_LAYER_ETHERNET) {
            return invalidArgument("ah_attr without a GRH on port " + std::to_string(attr.port_num) +
                                   " of '" + ctx.dev->info.name +
                                   "', an Ethernet (RoCE) port: set is_global and a dgid");
        }
        return Status::ok();
    }
    static constexpr uint8_t kZero[sizeof(attr.grh.dgid.raw)] = {};
    if (std::memcmp(attr.grh.dgid.raw, kZero, sizeof(kZero)) == 0) {
        return invalidArgument("ah_attr.grh.dgid is all zeros");
    }
    // The source GID must be a populated entry of the port's table, as the kernel checks.
    ibv_gid_entry g{};
    int rc = 0;
    {
        DriverCall call(s.memory(), ctx.dev);
        rc = ctx.dev->verbs.queryGid(ctx.verbs, attr.port_num, attr.grh.sgid_index, &g);
    }
    if (rc != 0) {
        return invalidArgument("ah_attr.grh.sgid_index " + std::to_string(attr.grh.sgid_index) +
                               " names no entry of port " + std::to_string(attr.port_num) + "'s GID table");
    }
    return Status::ok();
}

StatusOr<uint64_t> Broker::createAh(Session &s, uint64_t pd, const ibv_ah_attr &attr) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(PdObject * p, lookup<PdObject>(s, pd));
    RETURN_IF_ERROR(checkAhAttr(s, *p->context, attr));
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kAhs, 1}}));
    auto obj = std::make_unique<AhObject>();
    obj->quota = std::move(quota);
    obj->pd = p;
    obj->attr = attr;
    // A GRH's flow label is 20 bits. The kernel takes any value and devices keep those bits, and
    // consumers count on it: UCX on RoCE passes ~0 (its workaround for rdma-core's flow label
    // to UDP source port rule).
    obj->attr.grh.flow_label &= 0xfffff;
    obj->uses = {p};
    return publish(s, std::move(obj), {});
}

Status Broker::destroyAh(Session &s, uint64_t ah) {
    return destroyByHandle(s, ah, ObjectKind::kAh).status();
}

namespace {

// The fd a RegMr names, checked: a memfd or dma-buf large enough for offset + length.
Status checkMrFd(const UniqueFd &fd, const RegMrArgs &args) {
    bool dmabuf = false;
    if (!isSharableMemory(fd.get(), &dmabuf)) {
        return Status(Code::kInvalidArgument, EBADF, "the fd for RegMr is neither a memfd nor a dma-buf");
    }
    uint64_t size = 0;
    if (dmabuf) {
        off_t end = ::lseek(fd.get(), 0, SEEK_END);
        size = end < 0 ? 0 : static_cast<uint64_t>(end);
    } else {
        struct stat st {};
        if (::fstat(fd.get(), &st) == 0) {
            size = static_cast<uint64_t>(st.st_size);
        }
    }
    if (args.offset + args.length > size) {
        return invalidArgument("offset + length (" + std::to_string(args.offset + args.length) +
                               ") exceeds the fd's size " + std::to_string(size));
    }
    return dmabuf ? Status::ok() : requireFixedSize(fd.get(), "the memfd sent for RegMr");
}

// Maps [offset, offset + length) of fd in the broker, from the page holding offset.
StatusOr<UniqueMapping> mapMrMemory(const UniqueFd &fd, const RegMrArgs &args, void **addr) {
    const uint64_t page = pageSize();
    const uint64_t delta = args.offset % page;
    const size_t map_len = static_cast<size_t>(args.length + delta);
    void *base = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                        static_cast<off_t>(args.offset - delta));
    if (base == MAP_FAILED) {
        return Status::fromErrno(errno, "cannot map the MR's memory in the broker");
    }
    *addr = static_cast<uint8_t *>(base) + delta;
    return UniqueMapping(base, map_len);
}

}  // namespace

struct Broker::MrMemory {
    UniqueFd fd;
    UniqueMapping mapping;
    void *addr = nullptr;    // the first byte named, in mapping
    uint64_t fd_offset = 0;  // where mapping starts in fd
};

StatusOr<Broker::MrMemory> Broker::takeMrMemory(Session &s, const RegMrArgs &args, const char *call) {
    if (args.length == 0) {
        return invalidArgument("MR length must be > 0");
    }
    if (args.offset > UINT64_MAX - args.length) {
        return invalidArgument("MR offset + length overflows");
    }
    MrMemory m;
    RegMrArgs placed = args;  // offset: where the memory is in fd
    if (args.tenant_address != 0) {
        if (args.xfer_id != 0 || args.offset != 0) {
            return invalidArgument(std::string("a ") + call +
                                   " of the tenant's own mapping (tenant_address) names no fd and no offset");
        }
        ASSIGN_OR_RETURN(TenantMapping t,
                         openTenantMapping(s.identity().creds, s.pidfd(), args.tenant_address, args.length));
        m.fd = std::move(t.fd);
        placed.offset = t.offset;
    } else {
        // Wait for the fd before taking the session lock: the fd-channel reader must not wait on us.
        m.fd = s.takeXfer(args.xfer_id, options_.xfer_wait);
        if (!m.fd) {
            return Status(Code::kInvalidArgument, EBADF,
                          "no fd arrived on the fd channel with xfer_id " + std::to_string(args.xfer_id));
        }
        crashOnceAt(call);  // the fd taken, the call not committed (tests only)
        RETURN_IF_ERROR(checkMrFd(m.fd, args));
    }
    ASSIGN_OR_RETURN(m.mapping, mapMrMemory(m.fd, placed, &m.addr));
    m.fd_offset = placed.offset - placed.offset % pageSize();
    return m;
}

StatusOr<RegMrResult> Broker::regMr(Session &s, const RegMrArgs &args) {
    ASSIGN_OR_RETURN(MrMemory memory, takeMrMemory(s, args, "RegMr"));
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(PdObject * pd, lookup<PdObject>(s, args.pd));
    Device *dev = pd->device();
    if (dev->info.max_mr_size != 0 && args.length > dev->info.max_mr_size) {
        return invalidArgument("MR length exceeds the device's max_mr_size");
    }
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kMrs, 1}, {Quota::kMrBytes, args.length}}));
    auto obj = std::make_unique<MrObject>();
    obj->quota = std::move(quota);
    obj->mapping = std::move(memory.mapping);
    obj->fd = std::move(memory.fd);
    obj->fd_offset = memory.fd_offset;
    obj->pd = pd;
    obj->length = args.length;
    void *addr = memory.addr;
    uint64_t iova = args.iova != 0 ? args.iova : reinterpret_cast<uint64_t>(addr);
    ASSIGN_OR_RETURN(obj->mr, createOnDriver(s.memory(), dev, EOPNOTSUPP, "MR registration failed", [&] {
                         return dev->verbs.regMr(pd->pd, addr, args.length, iova,
                                                 static_cast<int>(args.access));
                     }));
    RegMrResult r;
    r.lkey = obj->mr->lkey;
    r.rkey = obj->mr->rkey;
    r.iova = iova;
    obj->uses = {pd};
    ASSIGN_OR_RETURN(r.mr, publish(s, std::move(obj), {}));
    return r;
}

StatusOr<RegMrResult> Broker::reregMr(Session &s, const ReregMrArgs &args) {
    constexpr int kKnown =
        IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
    if (args.flags == 0 || (args.flags & ~kKnown) != 0) {
        return invalidArgument("ReregMr flags " + std::to_string(args.flags) +
                               " are not a non-empty set of IBV_REREG_MR_CHANGE_{TRANSLATION,PD,ACCESS}");
    }
    const bool translate = (args.flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
    const bool new_pd = (args.flags & IBV_REREG_MR_CHANGE_PD) != 0;
    const RegMrArgs &mem = args.memory;
    if (!translate && (mem.xfer_id | mem.offset | mem.length | mem.iova | mem.tenant_address) != 0) {
        return invalidArgument("ReregMr names new memory without IBV_REREG_MR_CHANGE_TRANSLATION");
    }
    if (!new_pd && args.pd != 0) {
        return invalidArgument("ReregMr names a PD without IBV_REREG_MR_CHANGE_PD");
    }
    MrMemory memory;
    if (translate) {
        ASSIGN_OR_RETURN(memory, takeMrMemory(s, mem, "ReregMr"));
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(MrObject * m, lookup<MrObject>(s, args.mr));
    if (m->mr == nullptr) {
        return failedPrecondition("the driver's MR is gone");
    }
    PdObject *pd = m->pd;
    if (new_pd) {
        ASSIGN_OR_RETURN(pd, lookup<PdObject>(s, args.pd));
        if (pd->context != m->pd->context) {
            return invalidArgument("ReregMr's PD is not one of the MR's context");
        }
    }
    Device *dev = m->device();
    QuotaCharge more;
    if (translate) {
        if (dev->info.max_mr_size != 0 && mem.length > dev->info.max_mr_size) {
            return invalidArgument("MR length exceeds the device's max_mr_size");
        }
        const uint64_t charged = m->quota.amount(Quota::kMrBytes);
        if (mem.length > charged) {
            ASSIGN_OR_RETURN(more, charge(s, {{Quota::kMrBytes, mem.length - charged}}));
        }
    }
    void *addr = translate ? memory.addr : nullptr;
    const uint64_t iova = !translate ? 0 : mem.iova != 0 ? mem.iova : reinterpret_cast<uint64_t>(addr);
    // A refusal changes nothing (SPEC.md §13): `more` goes back and the new mapping is unmapped.
    RETURN_IF_ERROR(callDriver(s.memory(), dev, "MR re-registration failed", [&] {
        return dev->verbs.reregMr(m->mr, args.flags, pd->pd, addr, translate ? mem.length : 0, iova,
                                  static_cast<int>(args.access));
    }));
    m->quota.merge(std::move(more));
    if (translate) {
        // The driver no longer reaches the old memory (SPEC.md §13, "When"): it may go.
        m->mapping = std::move(memory.mapping);
        m->fd = std::move(memory.fd);
        m->fd_offset = memory.fd_offset;
        m->length = mem.length;
    }
    if (pd != m->pd) {
        // The restart record names the MR's parent: an import gives the MR its new PD.
        --m->pd->users;
        touchParent(s, m->pd);
        ++pd->users;
        touchParent(s, pd);
        m->pd = pd;
        m->uses = {pd};
    }
    touch(s, m);  // the driver's blob carries the new range and access
    RegMrResult r;
    r.mr = args.mr;
    r.lkey = m->mr->lkey;
    r.rkey = m->mr->rkey;
    r.iova = iova;  // 0: unchanged
    return r;
}

Status Broker::deregMr(Session &s, uint64_t mr) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(MrObject * m, lookup<MrObject>(s, mr));
    return destroyLocked(s, m);
}

StatusOr<CqResult> Broker::createCq(Session &s, const CreateCqArgs &args) {
    RETURN_IF_ERROR(rule(loader::checkDmaMode(static_cast<int>(args.dma_mode))));
    RETURN_IF_ERROR(rule(loader::checkCqRequest(args.cqe)));
    UniqueFd event_fd;
    if (args.event_xfer_id != 0) {
        ASSIGN_OR_RETURN(event_fd, takeEventFd(s, args.event_xfer_id, options_.xfer_wait,
                                               "CreateCq's event_xfer_id", "CreateCq"));
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    RETURN_IF_ERROR(rule(loader::checkCqLimits(args.cqe, limitsOf(ctx->dev->info))));
    RETURN_IF_ERROR(requireOp(ctx->ext->ops, DriverOp::kCreateCq, "the driver has no create_cq"));
    ibv_cq_init_attr_extend attr{};
    attr.attr.cqe = args.cqe;
    attr.attr.comp_vector = args.comp_vector;
    attr.attr.wc_flags = args.wc_flags;
    attr.cq_cap_flag = args.cq_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    // A completion eventfd is kept (the driver's dup) as long as the CQ.
    ASSIGN_OR_RETURN(QuotaCharge quota,
                     charge(s, {{Quota::kCqs, 1}, {Quota::kEventFds, event_fd ? 1u : 0u}}));
    auto obj = std::make_unique<CqObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    ASSIGN_OR_RETURN(obj->cq, createOnDriver(s.memory(), ctx->dev, ENOMEM, "create_cq failed",
                                             [&] { return ctx->ext->ops->create_cq(ctx->verbs, &attr); }));
    if (event_fd) {
        Status st = attachCqEventFd(s, *obj, event_fd);
        if (!st.isOk()) {
            // Not published yet: roll the driver's CQ back here (its memory goes with it).
            (void)callDriver(s.memory(), ctx->dev, "destroy_cq failed",
                             [&] { return obj->destroyDriverObject(); });
            (void)MappingManager::instance().takeReleased(*s.memory_);
            return st;
        }
    }
    CqResult r;
    r.cqe = obj->cq->cq != nullptr ? static_cast<uint32_t>(obj->cq->cq->cqe) : args.cqe;
    std::memcpy(r.resv, obj->cq->resv, sizeof(r.resv));
    obj->uses = {ctx};
    const queue_info *info = &obj->cq->cq_info;
    ASSIGN_OR_RETURN(r.cq, publish(s, std::move(obj), {{info, &r.info}}));
    return r;
}

Status Broker::attachCqEventFd(Session &s, CqObject &cq, const UniqueFd &fd) {
    if (cq.cq->cq == nullptr) {
        return Status(Code::kUnimplemented, EOPNOTSUPP, "the driver's CQ has no ibv_cq to deliver events on");
    }
    // The driver dups the fd; the caller's copy closes when CreateCq returns.
    return callDriver(s.memory(), cq.context->dev, "the device cannot deliver completion events",
                      [&] { return cq.context->dev->verbs.setCqEventFd(cq.cq->cq, fd.get()); });
}

StatusOr<Released> Broker::destroyCq(Session &s, uint64_t cq) {
    return destroyByHandle(s, cq, ObjectKind::kCq);
}

StatusOr<ResizeCqResult> Broker::resizeCq(Session &s, uint64_t cq, uint32_t cqe) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(CqObject * o, lookup<CqObject>(s, cq));
    Device *dev = o->device();
    RETURN_IF_ERROR(rule(loader::checkCqRequest(cqe)));
    RETURN_IF_ERROR(rule(loader::checkCqLimits(cqe, limitsOf(dev->info))));
    if (o->cq->cq == nullptr) {
        return failedPrecondition("the driver's CQ has no ibv_cq");
    }
    const uint32_t old_cqe = static_cast<uint32_t>(o->cq->cq->cqe);
    touch(s, o);  // a refused resize changes nothing, but re-exporting is harmless
    auto resize = [&](uint32_t n) {
        return callDriver(s.memory(), dev, "resize_cq failed", [&] { return dev->verbs.resizeCq(o->cq, n); });
    };
    RETURN_IF_ERROR(resize(cqe));
    const queue_info &qi = o->cq->cq_info;
    const uint64_t bytes = uint64_t{qi.qbuf.entry_cnt} * qi.qbuf.entry_size;
    Status st = bytes > o->queue_bytes ? chargeQueueBytes(s, *o, bytes - o->queue_bytes) : Status::ok();
    if (!st.isOk()) {
        // Back to the depth it had (best effort: completions that arrived meanwhile may not fit,
        // and the CQ then keeps the depth the quota refused).
        if (resize(old_cqe).isOk()) {
            (void)MappingManager::instance().takeReleased(*s.memory_);
            return st;
        }
    } else {
        o->queue_bytes = std::max(o->queue_bytes, bytes);
    }
    ResizeCqResult r;
    r.cqe = static_cast<uint32_t>(o->cq->cq->cqe);
    ASSIGN_OR_RETURN(r.info, translate(s, qi));
    RETURN_IF_ERROR(sendRegions(s));
    r.released = MappingManager::instance().takeReleased(*s.memory_);
    return r;
}

namespace {

// What every QP create answers besides the handle and queue memory.
QpResult qpResultOf(const ibv_qp_extend &qp, const ibv_qp_cap &granted) {
    QpResult r;
    if (qp.qp != nullptr) {
        r.qp_num = qp.qp->qp_num;
        r.state = qp.qp->state;
    }
    r.cap = granted;
    std::memcpy(r.resv, qp.resv, sizeof(r.resv));
    r.vendor_priv_info = qp.vendor_priv_info.value;
    return r;
}

}  // namespace

// The objects a QP uses, looked up and checked to share the QP's context.
struct Broker::QpMembers {
    ContextObject *ctx = nullptr;
    PdObject *pd = nullptr;
    CqObject *send_cq = nullptr, *recv_cq = nullptr;  // recv_cq: none for an XRC initiator
    SrqObject *srq = nullptr;
};

StatusOr<Broker::QpMembers> Broker::qpMembers(Session &s, const CreateQpArgs &args) {
    QpMembers m;
    ASSIGN_OR_RETURN(m.ctx, lookup<ContextObject>(s, args.context));
    ASSIGN_OR_RETURN(m.pd, lookup<PdObject>(s, args.pd));
    ASSIGN_OR_RETURN(m.send_cq, lookup<CqObject>(s, args.send_cq));
    if (args.qp_type == IBV_QPT_XRC_SEND) {
        // An initiator receives nothing (SPEC.md §14): a receive CQ or SRQ would be ignored by
        // the driver, so naming one is a mistake worth reporting.
        if (args.recv_cq != 0 || args.srq != 0 || args.xrcd != 0) {
            return invalidArgument(
                "an XRC initiator QP (IBV_QPT_XRC_SEND) takes a PD and a send CQ only, "
                "no recv_cq, SRQ or XRC domain");
        }
    } else {
        ASSIGN_OR_RETURN(m.recv_cq, lookup<CqObject>(s, args.recv_cq));
    }
    if (args.srq != 0) {
        ASSIGN_OR_RETURN(m.srq, lookup<SrqObject>(s, args.srq));
        if (m.srq->srq_num != 0) {
            return invalidArgument("an XRC SRQ serves XRC target QPs through its number, not as a QP's srq");
        }
    }
    if (args.xrcd != 0) {
        return invalidArgument("only an XRC target QP (IBV_QPT_XRC_RECV) takes an XRC domain");
    }
    if (m.pd->context != m.ctx || m.send_cq->context != m.ctx ||
        (m.recv_cq != nullptr && m.recv_cq->context != m.ctx) ||
        (m.srq != nullptr && m.srq->context != m.ctx)) {
        return invalidArgument(loader::kQpMembership);
    }
    return m;
}

StatusOr<QpResult> Broker::createQp(Session &s, const CreateQpArgs &args) {
    RETURN_IF_ERROR(rule(loader::checkDmaMode(static_cast<int>(args.dma_mode))));
    if (args.qp_type == IBV_QPT_XRC_RECV) {
        return createXrcTargetQp(s, args);
    }
    RETURN_IF_ERROR(rule(loader::checkQpType(args.qp_type)));
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(QpMembers m, qpMembers(s, args));
    ContextObject *ctx = m.ctx;
    RETURN_IF_ERROR(rule(loader::checkQpLimits(args.cap, limitsOf(ctx->dev->info))));
    RETURN_IF_ERROR(requireOp(ctx->ext->ops, DriverOp::kCreateQp, "the driver has no create_qp"));
    ibv_qp_init_attr_extend attr{};
    attr.pd = m.pd->pd;
    attr.attr.send_cq = m.send_cq->cq->cq;
    attr.attr.recv_cq = m.recv_cq != nullptr ? m.recv_cq->cq->cq : nullptr;
    attr.attr.srq = m.srq != nullptr ? m.srq->srq->srq : nullptr;
    attr.attr.qp_type = args.qp_type;
    attr.attr.cap = args.cap;
    attr.attr.sq_sig_all = args.sq_sig_all ? 1 : 0;
    attr.qp_cap_flag = args.qp_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kQps, 1}}));
    auto obj = std::make_unique<QpObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    ASSIGN_OR_RETURN(obj->qp, createOnDriver(s.memory(), ctx->dev, ENOMEM, "create_qp failed",
                                             [&] { return ctx->ext->ops->create_qp(ctx->verbs, &attr); }));
    obj->cap = attr.attr.cap;
    obj->qp_type = attr.attr.qp_type;
    obj->sq_sig_all = attr.attr.sq_sig_all != 0;
    obj->has_srq = m.srq != nullptr;
    QpResult r = qpResultOf(*obj->qp, attr.attr.cap);
    obj->uses = {ctx, m.pd, m.send_cq};
    if (m.recv_cq != nullptr) {
        obj->uses.push_back(m.recv_cq);
    }
    if (m.srq != nullptr) {
        obj->uses.push_back(m.srq);
    }
    const queue_info *sq = &obj->qp->sq_info, *rq = &obj->qp->rq_info;
    ASSIGN_OR_RETURN(r.qp, publish(s, std::move(obj), {{sq, &r.sq}, {rq, &r.rq}}));
    return r;
}

StatusOr<QpResult> Broker::createXrcTargetQp(Session &s, const CreateQpArgs &args) {
    if (args.pd != 0 || args.send_cq != 0 || args.recv_cq != 0 || args.srq != 0) {
        return invalidArgument(
            "an XRC target QP (IBV_QPT_XRC_RECV) takes its XRC domain only, "
            "no PD, CQs or SRQ");
    }
    if (args.xrcd == 0) {
        return invalidArgument("an XRC target QP (IBV_QPT_XRC_RECV) needs an XRC domain (xrcd)");
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    ASSIGN_OR_RETURN(XrcdObject * xrcd, lookup<XrcdObject>(s, args.xrcd));
    if (xrcd->context->dev != ctx->dev) {
        return invalidArgument("the XRC domain belongs to another device than the QP's context");
    }
    ibv_qp_init_attr_extend attr{};
    attr.attr.qp_type = IBV_QPT_XRC_RECV;
    attr.attr.cap = args.cap;
    attr.qp_cap_flag = args.qp_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kQps, 1}}));
    auto obj = std::make_unique<QpObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    ASSIGN_OR_RETURN(obj->qp, createOnDriver(s.memory(), ctx->dev, ENOMEM, "create_xrc_tgt_qp failed", [&] {
                         return ctx->dev->verbs.createXrcTgtQp(ctx->verbs, &attr, xrcd->xrcd);
                     }));
    obj->cap = attr.attr.cap;
    obj->qp_type = IBV_QPT_XRC_RECV;
    QpResult r = qpResultOf(*obj->qp, attr.attr.cap);
    obj->uses = {ctx, xrcd};
    QpObject *made = obj.get();
    const queue_info *sq = &obj->qp->sq_info, *rq = &obj->qp->rq_info;
    ASSIGN_OR_RETURN(r.qp, publish(s, std::move(obj), {{sq, &r.sq}, {rq, &r.rq}}));
    enterTarget(s, *made, *xrcd);  // openable by number from here on (ibv_open_qp)
    return r;
}

StatusOr<Released> Broker::destroyQp(Session &s, uint64_t qp) {
    auto released = destroyByHandle(s, qp, ObjectKind::kQp);
    finishTargets();  // the last handle of a target may have gone: its creator's QpObject goes too
    return released;
}

namespace {

// The key of the file a tenant named for a shared domain: its inode.
StatusOr<XrcdFile> xrcdFileKey(const UniqueFd &file) {
    struct stat st {};
    if (::fstat(file.get(), &st) != 0) {
        return Status(Code::kInvalidArgument, EBADF, "the XRC domain's file cannot be stat()ed");
    }
    return XrcdFile{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
}

}  // namespace

StatusOr<uint64_t> Broker::openXrcd(Session &s, const OpenXrcdArgs &args) {
    if ((args.oflags & ~static_cast<uint32_t>(O_CREAT | O_EXCL)) != 0) {
        return invalidArgument("OpenXrcd oflags may hold O_CREAT and O_EXCL only");
    }
    XrcdOpen how;
    how.create = (args.oflags & O_CREAT) != 0;
    how.exclusive = (args.oflags & O_EXCL) != 0;
    UniqueFd file;
    if (args.file_xfer_id != 0) {
        // Waited for before the session lock, as RegMr's fd: the fd-channel reader must not wait on us.
        file = s.takeXfer(args.file_xfer_id, options_.xfer_wait);
        if (!file) {
            return Status(Code::kInvalidArgument, EBADF,
                          "no fd arrived on the fd channel with xfer_id " +
                              std::to_string(args.file_xfer_id) + " for OpenXrcd");
        }
        crashOnceAt("OpenXrcd");  // the fd taken, the call not committed (tests only)
        ASSIGN_OR_RETURN(how.file, xrcdFileKey(file));
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kXrcds, 1}}));
    auto obj = std::make_unique<XrcdObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    Device *dev = ctx->dev;
    ASSIGN_OR_RETURN(obj->domain, dev->xrcds.open(
                                      how,
                                      [&] {
                                          return createOnDriver(
                                              s.memory(), dev, EOPNOTSUPP, "open_xrcd failed",
                                              [&] { return dev->verbs.openXrcd(ctx->verbs); });
                                      },
                                      [&](ibv_xrcd *x) {
                                          DriverCall call(s.memory(), dev);
                                          return dev->verbs.closeXrcd(x);
                                      }));
    obj->xrcd = obj->domain->xrcd;
    obj->file = std::move(file);
    obj->uses = {ctx};
    return publish(s, std::move(obj), {});
}

Status Broker::mcast(Session &s, const McastArgs &args, bool attach) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, args.qp));
    Device *dev = o->device();
    RETURN_IF_ERROR(callDriver(s.memory(), dev, attach ? "attach_mcast failed" : "detach_mcast failed", [&] {
        return attach ? dev->verbs.attachMcast(o->qp, args.gid, args.lid)
                      : dev->verbs.detachMcast(o->qp, args.gid, args.lid);
    }));
    touch(s, o);  // the QP's blob names its groups
    return Status::ok();
}

StatusOr<MwResult> Broker::allocMw(Session &s, uint64_t pd, ibv_mw_type type) {
    if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
        return invalidArgument("memory window type " + std::to_string(static_cast<int>(type)) +
                               " is neither IBV_MW_TYPE_1 (1) nor IBV_MW_TYPE_2 (2)");
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(PdObject * p, lookup<PdObject>(s, pd));
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kMws, 1}}));
    auto obj = std::make_unique<MwObject>();
    obj->quota = std::move(quota);
    obj->pd = p;
    Device *dev = p->context->dev;
    ASSIGN_OR_RETURN(obj->mw, createOnDriver(s.memory(), dev, EOPNOTSUPP, "alloc_mw failed",
                                             [&] { return dev->verbs.allocMw(p->pd, type); }));
    // The context too: a window may give it its window file (softnda SPEC.md §16), so its
    // state is exported again.
    obj->uses = {p, p->context};
    MwResult out;
    out.rkey = obj->mw->rkey;
    ASSIGN_OR_RETURN(out.handle, publish(s, std::move(obj), {}));
    return out;
}

Status Broker::deallocMw(Session &s, uint64_t mw) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(MwObject * m, lookup<MwObject>(s, mw));
    return destroyLocked(s, m);
}

Status Broker::closeXrcd(Session &s, uint64_t xrcd) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(XrcdObject * x, lookup<XrcdObject>(s, xrcd));
    return destroyLocked(s, x);
}

StatusOr<ibv_srq_extend *> Broker::createDriverSrq(Session &s, ContextObject *ctx,
                                                   ibv_srq_init_attr_extend &attr, XrcdObject *xrcd,
                                                   CqObject *cq) {
    if (xrcd == nullptr) {
        RETURN_IF_ERROR(requireOp(ctx->ext->ops, DriverOp::kCreateSrq, "the driver has no create_srq"));
        return createOnDriver(s.memory(), ctx->dev, ENOMEM, "create_srq failed",
                              [&] { return ctx->ext->ops->create_srq(ctx->verbs, &attr); });
    }
    return createOnDriver(s.memory(), ctx->dev, ENOMEM, "create_xrc_srq failed", [&] {
        return ctx->dev->verbs.createXrcSrq(ctx->verbs, &attr, xrcd->xrcd, cq->cq->cq);
    });
}

StatusOr<SrqResult> Broker::createSrq(Session &s, const CreateSrqArgs &args) {
    RETURN_IF_ERROR(rule(loader::checkDmaMode(static_cast<int>(args.dma_mode))));
    RETURN_IF_ERROR(rule(loader::checkSrqRequest(args.max_wr)));
    if ((args.xrcd == 0) != (args.cq == 0)) {
        return invalidArgument(
            "an XRC SRQ needs both its XRC domain (xrcd) and the CQ its receives complete on");
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    ASSIGN_OR_RETURN(PdObject * pd, lookup<PdObject>(s, args.pd));
    XrcdObject *xrcd = nullptr;
    CqObject *cq = nullptr;
    if (args.xrcd != 0) {
        ASSIGN_OR_RETURN(xrcd, lookup<XrcdObject>(s, args.xrcd));
        ASSIGN_OR_RETURN(cq, lookup<CqObject>(s, args.cq));
    }
    if (pd->context != ctx || (cq != nullptr && cq->context != ctx) ||
        (xrcd != nullptr && xrcd->context->dev != ctx->dev)) {
        return invalidArgument(loader::kSrqMembership);
    }
    RETURN_IF_ERROR(rule(loader::checkSrqLimits(args.max_wr, args.max_sge, limitsOf(ctx->dev->info))));
    ibv_srq_init_attr_extend attr{};
    attr.pd = pd->pd;
    attr.attr.attr.max_wr = args.max_wr;
    attr.attr.attr.max_sge = args.max_sge;
    attr.attr.attr.srq_limit = args.srq_limit;
    attr.srq_cap_flag = args.srq_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kSrqs, 1}}));
    auto obj = std::make_unique<SrqObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    ASSIGN_OR_RETURN(obj->srq, createDriverSrq(s, ctx, attr, xrcd, cq));
    obj->uses = {ctx, pd};
    if (xrcd != nullptr) {
        obj->uses.push_back(xrcd);
        obj->uses.push_back(cq);
        // Read now (the number never changes, a restart keeps it): the tenant's initiators name it.
        uint32_t num = 0;
        DriverCall call(s.memory(), ctx->dev);
        const int rc = ctx->dev->verbs.getSrqNum(obj->srq->srq, &num);
        if (rc < 0 || num == 0) {
            (void)obj->destroyDriverObject();
            return Status(Code::kInternal, rc < 0 ? -rc : EIO, "the driver gave the XRC SRQ no number");
        }
        obj->srq_num = num;
    }
    SrqResult r;
    r.max_wr = attr.attr.attr.max_wr;
    r.max_sge = attr.attr.attr.max_sge;
    r.srq_num = obj->srq_num;
    std::memcpy(r.resv, obj->srq->resv, sizeof(r.resv));
    const queue_info *info = &obj->srq->srq_info;
    ASSIGN_OR_RETURN(r.srq, publish(s, std::move(obj), {{info, &r.info}}));
    return r;
}

StatusOr<Released> Broker::destroySrq(Session &s, uint64_t srq) {
    return destroyByHandle(s, srq, ObjectKind::kSrq);
}

StatusOr<QpObject *> Broker::lookupQpWithVerbs(Session &s, uint64_t qp) {
    ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, qp));
    if (o->qp->qp == nullptr) {
        return failedPrecondition("the driver's QP has no ibv_qp");
    }
    return o;
}

StatusOr<ibv_qp_state> Broker::modifyQp(Session &s, uint64_t qp, ibv_qp_attr attr, int attr_mask,
                                        ibv_qp_attr held_init, int held_init_mask) {
    ibv_qp_state state = IBV_QPS_RESET;
    TargetOwner creator;
    {
        ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
        ASSIGN_OR_RETURN(QpObject * o, lookupQpWithVerbs(s, qp));
        ibv_qp *ibqp = o->qp->qp;
        Device *dev = o->device();
        touch(s, o);  // a refused modify changes nothing, but re-exporting is harmless
        if (held_init_mask != 0) {
            if (!dev->info.plain_init || o->qp_type == IBV_QPT_XRC_RECV || ibqp->state != IBV_QPS_RESET ||
                (held_init_mask & IBV_QP_STATE) == 0 || held_init.qp_state != IBV_QPS_INIT) {
                return invalidArgument(
                    "a held-back modify must be a RESET -> INIT of a QP in RESET on a "
                    "device whose driver guarantees a plain INIT (not an XRC target)");
            }
            RETURN_IF_ERROR(
                callDriver(s.memory(), dev, "modify_qp (the held-back RESET -> INIT) failed",
                           [&] { return dev->verbs.modifyQp(ibqp, &held_init, held_init_mask); }));
        }
        RETURN_IF_ERROR(callDriver(s.memory(), dev, "modify_qp failed",
                                   [&] { return dev->verbs.modifyQp(ibqp, &attr, attr_mask); }));
        state = ibqp->state;
        creator = creatorOf(*o);
    }
    targetChanged(creator);
    return state;
}

StatusOr<QueryQpResult> Broker::queryQp(Session &s, uint64_t qp, int attr_mask) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(QpObject * o, lookupQpWithVerbs(s, qp));
    Device *dev = o->device();
    QueryQpResult r;
    RETURN_IF_ERROR(callDriver(s.memory(), dev, "query_qp failed",
                               [&] { return dev->verbs.queryQp(o->qp->qp, &r.attr, attr_mask, &r.init); }));
    r.init.qp_type = o->qp_type;
    r.init.sq_sig_all = o->sq_sig_all ? 1 : 0;
    return r;
}

StatusOr<uint64_t> Broker::modifyQpExtend(Session &s, uint64_t qp, ibv_qp_attr_extend attr, int attr_mask) {
    uint64_t priv = 0;
    TargetOwner creator;
    {
        ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
        ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, qp));
        auto *ops = o->context->ext->ops;
        if (!driverOpAvailable(ops, DriverOp::kModifyQp) || !knownExtendMask(attr_mask)) {
            return unimplemented("modify_qp_extend is not supported by this driver or mask");
        }
        attr.qp = o->qp->qp;
        touch(s, o);
        RETURN_IF_ERROR(callDriver(s.memory(), o->device(), "modify_qp_extend failed",
                                   [&] { return ops->modify_qp(o->context->verbs, &attr, attr_mask); }));
        priv = o->qp->vendor_priv_info.value;
        creator = creatorOf(*o);
    }
    targetChanged(creator);
    return priv;
}

StatusOr<ibv_qp_attr_extend> Broker::queryQpExtend(Session &s, uint64_t qp, int attr_mask) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, qp));
    auto *ops = o->context->ext->ops;
    if (!driverOpAvailable(ops, DriverOp::kQueryQp) || !knownExtendMask(attr_mask)) {
        return unimplemented("query_qp_extend is not supported by this driver or mask");
    }
    ibv_qp_attr_extend attr{};
    attr.qp = o->qp->qp;
    RETURN_IF_ERROR(callDriver(s.memory(), o->device(), "query_qp_extend failed",
                               [&] { return ops->query_qp(o->context->verbs, &attr, attr_mask); }));
    attr.qp = nullptr;
    return attr;
}

StatusOr<ibv_hyroce_feature> Broker::queryQpSupportedHyroceFeature(Session &s, uint64_t qp, uint32_t sl,
                                                                   uint32_t tc) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, qp));
    auto *ops = o->context->ext->ops;
    RETURN_IF_ERROR(requireOp(ops, DriverOp::kQueryHyroceFeature,
                              "query_qp_supported_hyroce_feature is not supported by this driver"));
    ibv_hyroce_feature f{};
    RETURN_IF_ERROR(callDriver(s.memory(), o->device(), "query_qp_supported_hyroce_feature failed", [&] {
        return ops->query_qp_supported_hyroce_feature(o->context->verbs, o->qp->qp, sl, tc, &f);
    }));
    return f;
}

StatusOr<NegoResult> Broker::negoQpHyroceFeature(Session &s, uint64_t qp, const ibv_hyroce_feature &input) {
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    ASSIGN_OR_RETURN(QpObject * o, lookup<QpObject>(s, qp));
    auto *ops = o->context->ext->ops;
    RETURN_IF_ERROR(requireOp(ops, DriverOp::kNegoHyroceFeature,
                              "nego_qp_hyroce_feature is not supported by this driver"));
    NegoResult r;
    touch(s, o);  // a negotiation may settle the QP's feature
    RETURN_IF_ERROR(callDriver(s.memory(), o->device(), "nego_qp_hyroce_feature failed", [&] {
        return ops->nego_qp_hyroce_feature(o->context->verbs, o->qp->qp, &input, &r.output,
                                           &r.need_more_nego);
    }));
    return r;
}

}  // namespace ibvx::daemon
