#include "daemon/core/broker.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/driver_ops.h"

namespace ibvx::daemon {
namespace {

Status sessionGone() {
    return Status(Code::kUnavailable, ENOTCONN, "session ended");
}

Status fromDriver(int err, const std::string &what) {
    if (err == 0) {
        err = EIO;
    }
    return Status::fromErrno(err, what + ": " + std::strerror(err));
}

// Driver int calls return a negative errno (reference) ; libibverbs a positive one or -1 + errno.
int driverErr(int rc) {
    if (rc < 0) {
        return rc == -1 && errno != 0 ? errno : -rc;
    }
    return rc;
}

// Holds a device's driver lock and binds the thread to the session for one driver call.
class DriverCall {
  public:
    DriverCall(SessionMemory *mem, Device *dev) : lock_(dev->driver_mu), binding_(mem, dev->vdev) {}

  private:
    std::lock_guard<std::mutex> lock_;
    ScopedBinding binding_;
};

bool validDmaMode(queue_buf_dma_mode m) {
    return m == QU_BUF_DMA_MODE_DEFAULT || m == QU_BUF_DMA_MODE_INDEP_UB;
}

Status checkLimit(uint64_t value, uint32_t max, const char *what) {
    if (max != 0 && value > max) {
        return invalidArgument(std::string(what) + " " + std::to_string(value) +
                               " exceeds the device's limit " + std::to_string(max));
    }
    return Status::ok();
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
    uint64_t v = 0;
    while (v == 0) {
        if (::getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) {
            v = 0;
        }
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

StatusOr<QuotaCharge> Broker::charge(const Session &s,
                                     std::initializer_list<std::pair<Quota, uint64_t>> amounts) {
    auto charged = quotas_.reserve(TenantKey{s.identity().creds.uid, s.identity().container_id}, amounts);
    if (!charged.isOk() && charged.status().code() == Code::kResourceExhausted && quota_denied_) {
        quota_denied_(s.identity(), s.id(), charged.status().message());
    }
    return charged;
}

Status Broker::chargeQueueBytes(const Session &s, Object &obj,
                                std::initializer_list<const queue_info *> queues) {
    // Known only once the driver sized the rings: charged after the create, and a refusal rolls
    // the driver object back like any other failure after it.
    uint64_t bytes = 0;
    for (const queue_info *q : queues) {
        bytes += uint64_t{q->qbuf.entry_cnt} * q->qbuf.entry_size;
    }
    if (bytes == 0) {
        return Status::ok();
    }
    auto more = charge(s, {{Quota::kQueueBytes, bytes}});
    if (!more.isOk()) {
        return more.status();
    }
    obj.quota.merge(std::move(*more));
    return Status::ok();
}

void Broker::audit(const Session &s, const char *action, ObjectKind kind, uint64_t handle) {
    if (audit_) {
        audit_(s, action, kind, handle);
    }
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
    if (Status st = policy()->admitConnect(peer); !st.isOk()) {
        return st;
    }
    auto quota = quotas_.reserve(TenantKey{peer.creds.uid, peer.container_id}, {{Quota::kSessions, 1}});
    if (!quota.isOk()) {
        if (quota.status().code() == Code::kResourceExhausted && quota_denied_) {
            quota_denied_(peer, 0, quota.status().message());
        }
        return quota.status();
    }
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
    s->quota_ = std::move(*quota);
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
    }
    s->ended_ = true;
    {
        std::lock_guard lock(s->xfer_mu_);
        s->xfers_closed_ = true;
        s->xfers_.clear();
        s->xfer_cv_.notify_all();
    }
    std::lock_guard lock(s->mu_);
    // Dependency order: nothing is destroyed while something else still uses it.
    for (ObjectKind kind : {ObjectKind::kQp, ObjectKind::kSrq, ObjectKind::kCq, ObjectKind::kMr,
                            ObjectKind::kPd, ObjectKind::kContext}) {
        std::vector<Object *> victims;
        for (auto &[handle, obj] : s->objects_) {
            if (obj->kind == kind) {
                victims.push_back(obj.get());
            }
        }
        for (Object *obj : victims) {
            uint64_t handle = obj->handle;  // obj is freed once destroyed
            // A driver that refuses the destroy still loses the object: the tenant is gone.
            if (!destroyLocked(*s, obj).isOk() && s->objects_.count(handle) != 0) {
                eraseLocked(*s, obj);
            }
        }
    }
    MappingManager::instance().dropSession(s->memory_.get());
    s->quota_.release();
    s->channel_fd_ = -1;
    s->channel_.reset();
}

void Broker::endAllSessions() {
    for (auto &s : sessions()) {
        endSession(s);
    }
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

template <typename T>
StatusOr<T *> Broker::lookup(Session &s, uint64_t handle, ObjectKind kind) {
    auto it = s.objects_.find(handle);
    // Another session's handle is simply not in this table: NOT_FOUND, never "not yours".
    if (handle == 0 || it == s.objects_.end() || it->second->kind != kind) {
        return Status(Code::kNotFound, kind == ObjectKind::kContext ? ENODEV : ENOENT,
                      std::string("no ") + kindName(kind) + " with this handle in the session");
    }
    return static_cast<T *>(it->second.get());
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
    for (Object *u : obj->uses) {
        ++u->users;
    }
    ObjectKind kind = obj->kind;
    s.objects_.emplace(h, std::move(obj));
    s.object_count_ = s.objects_.size();
    audit(s, "create", kind, h);
    return h;
}

void Broker::eraseLocked(Session &s, Object *obj) {
    for (Object *u : obj->uses) {
        --u->users;
    }
    uint64_t h = obj->handle;
    ObjectKind kind = obj->kind;
    s.objects_.erase(h);
    s.object_count_ = s.objects_.size();
    audit(s, "destroy", kind, h);
}

Status Broker::destroyLocked(Session &s, Object *obj) {
    if (obj->users != 0) {
        return Status(Code::kFailedPrecondition, EBUSY,
                      std::string(kindName(obj->kind)) + " is still used by " + std::to_string(obj->users) +
                          " object(s); destroy those first");
    }
    SessionMemory *mem = s.memory_.get();
    int rc = 0;
    switch (obj->kind) {
        case ObjectKind::kContext: {
            auto *c = static_cast<ContextObject *>(obj);
            {
                DriverCall call(mem, c->device);
                if (c->device->driver->free_context != nullptr) {
                    c->device->driver->free_context(c->ext);
                }
                if (c->device->vdev != nullptr) {
                    if (c->device->vdev->close_device != nullptr) {
                        c->device->vdev->close_device(c->verbs);
                    }
                } else {
                    ibv_close_device(c->verbs);
                }
            }
            break;
        }
        case ObjectKind::kPd: {
            auto *p = static_cast<PdObject *>(obj);
            DriverCall call(mem, p->context->device);
            const ibv_extend_vdev_ops *v = p->context->device->vdev;
            rc = v != nullptr ? (v->dealloc_pd != nullptr ? v->dealloc_pd(p->pd) : -EOPNOTSUPP)
                              : ibv_dealloc_pd(p->pd);
            break;
        }
        case ObjectKind::kMr: {
            auto *m = static_cast<MrObject *>(obj);
            DriverCall call(mem, m->pd->context->device);
            const ibv_extend_vdev_ops *v = m->pd->context->device->vdev;
            rc = v != nullptr ? (v->dereg_mr != nullptr ? v->dereg_mr(m->mr) : -EOPNOTSUPP)
                              : ibv_dereg_mr(m->mr);
            break;
        }
        case ObjectKind::kCq: {
            auto *c = static_cast<CqObject *>(obj);
            DriverCall call(mem, c->context->device);
            auto *ops = c->context->ext->ops;
            rc = ops->destroy_cq != nullptr ? ops->destroy_cq(c->cq) : -EOPNOTSUPP;
            break;
        }
        case ObjectKind::kQp: {
            auto *q = static_cast<QpObject *>(obj);
            DriverCall call(mem, q->context->device);
            auto *ops = q->context->ext->ops;
            rc = ops->destroy_qp != nullptr ? ops->destroy_qp(q->qp) : -EOPNOTSUPP;
            break;
        }
        case ObjectKind::kSrq: {
            auto *q = static_cast<SrqObject *>(obj);
            DriverCall call(mem, q->context->device);
            auto *ops = q->context->ext->ops;
            rc = ops->destroy_srq != nullptr ? ops->destroy_srq(q->srq) : -EOPNOTSUPP;
            break;
        }
    }
    if (rc != 0) {
        return fromDriver(driverErr(rc), std::string("driver refused to destroy the ") + kindName(obj->kind));
    }
    eraseLocked(s, obj);
    return Status::ok();
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
        auto ref = mm.resolve(*s.memory_, it.addr, it.len);
        if (!ref.isOk()) {
            return ref.status();
        }
        *it.out = *ref;
    }
    static_assert(sizeof(qi.qbuf.resv) == 32 && sizeof(qi.resv) == 32);
    std::memcpy(r.qbuf_resv, qi.qbuf.resv, 32);
    std::memcpy(r.info_resv, qi.resv, 32);
    return r;
}

#define IBVX_LOCK_SESSION(s)                \
    std::lock_guard session_lock_((s).mu_); \
    if ((s).ended_) {                       \
        return sessionGone();               \
    }

#define IBVX_CHECK_ROOM(s)                                                                    \
    if ((s).objects_.size() >= options_.max_objects_per_session) {                            \
        return resourceExhausted("the session holds " + std::to_string((s).objects_.size()) + \
                                 " objects, the limit");                                      \
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
    if (Status st = policy()->admitDevice(s.identity(), device_name); !st.isOk()) {
        return st;
    }
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto quota = charge(s, {{Quota::kContexts, 1}});
    if (!quota.isOk()) {
        return quota.status();
    }
    auto obj = std::make_unique<ContextObject>();
    obj->quota = std::move(*quota);
    obj->device = dev;
    {
        DriverCall call(s.memory_.get(), dev);
        errno = 0;
        obj->verbs =
            dev->vdev != nullptr
                ? (dev->vdev->open_device != nullptr ? dev->vdev->open_device(device_name.c_str()) : nullptr)
                : ibv_open_device(dev->verbs_device);
        if (obj->verbs == nullptr) {
            return fromDriver(errno, "cannot open device '" + device_name + "'");
        }
        errno = 0;
        obj->ext = dev->driver->alloc_context(obj->verbs);
        int err = errno;
        auto closeDevice = [&] {
            if (dev->vdev != nullptr) {
                if (dev->vdev->close_device != nullptr) {
                    dev->vdev->close_device(obj->verbs);
                }
            } else {
                ibv_close_device(obj->verbs);
            }
        };
        if (obj->ext == nullptr) {
            closeDevice();
            return fromDriver(err != 0 ? err : EOPNOTSUPP, "the driver did not open an extension context");
        }
        if (obj->ext->ops == nullptr || obj->ext->ops->version <= IBV_EXTEND_DRIVER_VERSION_UNUSED ||
            obj->ext->ops->version > IBV_EXTEND_DRIVER_VERSION_MAX) {
            if (dev->driver->free_context != nullptr) {
                dev->driver->free_context(obj->ext);
            }
            closeDevice();
            return unimplemented("driver '" + dev->info.provider + "' announces an unsupported ops version");
        }
    }
    OpenContextResult r;
    r.device = dev->info;
    r.driver_version = static_cast<uint32_t>(obj->ext->ops->version);
    r.driver_ops_present = driverOpsPresent(obj->ext->ops);
    r.context = insert(s, std::move(obj));
    return r;
}

StatusOr<Released> Broker::destroyByHandle(Session &s, uint64_t handle, ObjectKind kind) {
    IBVX_LOCK_SESSION(s);
    auto obj = lookup<Object>(s, handle, kind);
    if (!obj.isOk()) {
        return obj.status();
    }
    if (Status st = destroyLocked(s, *obj); !st.isOk()) {
        return st;
    }
    return MappingManager::instance().takeReleased(*s.memory_);
}

StatusOr<Released> Broker::closeContext(Session &s, uint64_t context) {
    return destroyByHandle(s, context, ObjectKind::kContext);
}

StatusOr<ibv_device_attr_extend> Broker::queryDevice(Session &s, uint64_t context) {
    IBVX_LOCK_SESSION(s);
    auto c = lookup<ContextObject>(s, context, ObjectKind::kContext);
    if (!c.isOk()) {
        return c.status();
    }
    auto *ctx = *c;
    if (ctx->ext->ops->query_device == nullptr) {
        return unimplemented("the driver has no query_device");
    }
    ibv_device_attr_extend attr{};
    DriverCall call(s.memory_.get(), ctx->device);
    int rc = ctx->ext->ops->query_device(ctx->verbs, &attr);
    if (rc != 0) {
        return fromDriver(driverErr(rc), "query_device failed");
    }
    return attr;
}

StatusOr<uint64_t> Broker::allocPd(Session &s, uint64_t context) {
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto c = lookup<ContextObject>(s, context, ObjectKind::kContext);
    if (!c.isOk()) {
        return c.status();
    }
    auto quota = charge(s, {{Quota::kPds, 1}});
    if (!quota.isOk()) {
        return quota.status();
    }
    auto obj = std::make_unique<PdObject>();
    obj->quota = std::move(*quota);
    obj->context = *c;
    {
        DriverCall call(s.memory_.get(), obj->context->device);
        const ibv_extend_vdev_ops *v = obj->context->device->vdev;
        errno = 0;
        obj->pd = v != nullptr ? (v->alloc_pd != nullptr ? v->alloc_pd(obj->context->verbs) : nullptr)
                               : ibv_alloc_pd(obj->context->verbs);
        if (obj->pd == nullptr) {
            return fromDriver(errno != 0 ? errno : EOPNOTSUPP, "alloc_pd failed");
        }
    }
    obj->uses = {obj->context};
    return insert(s, std::move(obj));
}

Status Broker::deallocPd(Session &s, uint64_t pd) {
    IBVX_LOCK_SESSION(s);
    auto p = lookup<PdObject>(s, pd, ObjectKind::kPd);
    if (!p.isOk()) {
        return p.status();
    }
    return destroyLocked(s, *p);
}

StatusOr<RegMrResult> Broker::regMr(Session &s, const RegMrArgs &args) {
    if (args.length == 0) {
        return invalidArgument("MR length must be > 0");
    }
    if (args.offset > UINT64_MAX - args.length) {
        return invalidArgument("MR offset + length overflows");
    }
    // Wait for the fd before taking the session lock: the fd-channel reader must not wait on us.
    UniqueFd fd = s.takeXfer(args.xfer_id, options_.xfer_wait);
    if (!fd) {
        return Status(Code::kInvalidArgument, EBADF,
                      "no fd arrived on the fd channel with xfer_id " + std::to_string(args.xfer_id));
    }
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
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto p = lookup<PdObject>(s, args.pd, ObjectKind::kPd);
    if (!p.isOk()) {
        return p.status();
    }
    Device *dev = (*p)->context->device;
    if (dev->info.max_mr_size != 0 && args.length > dev->info.max_mr_size) {
        return invalidArgument("MR length exceeds the device's max_mr_size");
    }
    auto quota = charge(s, {{Quota::kMrs, 1}, {Quota::kMrBytes, args.length}});
    if (!quota.isOk()) {
        return quota.status();
    }
    const uint64_t page = pageSize();
    const uint64_t delta = args.offset % page;
    const size_t map_len = static_cast<size_t>(args.length + delta);
    void *base = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                        static_cast<off_t>(args.offset - delta));
    if (base == MAP_FAILED) {
        return Status::fromErrno(errno, "cannot map the MR's memory in the broker");
    }
    auto obj = std::make_unique<MrObject>();
    obj->quota = std::move(*quota);
    obj->mapping = UniqueMapping(base, map_len);
    obj->pd = *p;
    obj->length = args.length;
    void *addr = static_cast<uint8_t *>(base) + delta;
    uint64_t iova = args.iova != 0 ? args.iova : reinterpret_cast<uint64_t>(addr);
    {
        DriverCall call(s.memory_.get(), dev);
        errno = 0;
        if (dev->vdev != nullptr) {
            obj->mr = dev->vdev->reg_mr != nullptr ? dev->vdev->reg_mr(obj->pd->pd, addr, args.length, iova,
                                                                       static_cast<int>(args.access))
                                                   : nullptr;
        } else {
            obj->mr = ibv_reg_mr_iova(obj->pd->pd, addr, args.length, iova, static_cast<int>(args.access));
        }
        if (obj->mr == nullptr) {
            return fromDriver(errno != 0 ? errno : EOPNOTSUPP, "MR registration failed");
        }
    }
    RegMrResult r;
    r.lkey = obj->mr->lkey;
    r.rkey = obj->mr->rkey;
    r.iova = iova;
    obj->uses = {obj->pd};
    r.mr = insert(s, std::move(obj));
    return r;
}

Status Broker::deregMr(Session &s, uint64_t mr) {
    IBVX_LOCK_SESSION(s);
    auto m = lookup<MrObject>(s, mr, ObjectKind::kMr);
    if (!m.isOk()) {
        return m.status();
    }
    return destroyLocked(s, *m);
}

StatusOr<CqResult> Broker::createCq(Session &s, const CreateCqArgs &args) {
    if (!validDmaMode(args.dma_mode)) {
        return invalidArgument("invalid dma_mode");
    }
    if (args.cqe == 0) {
        return invalidArgument("cqe must be > 0");
    }
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto c = lookup<ContextObject>(s, args.context, ObjectKind::kContext);
    if (!c.isOk()) {
        return c.status();
    }
    ContextObject *ctx = *c;
    if (Status st = checkLimit(args.cqe, ctx->device->info.max_cqe, "cqe"); !st.isOk()) {
        return st;
    }
    if (ctx->ext->ops->create_cq == nullptr) {
        return unimplemented("the driver has no create_cq");
    }
    ibv_cq_init_attr_extend attr{};
    attr.attr.cqe = args.cqe;
    attr.attr.comp_vector = args.comp_vector;
    attr.attr.wc_flags = args.wc_flags;
    attr.cq_cap_flag = args.cq_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    auto quota = charge(s, {{Quota::kCqs, 1}});
    if (!quota.isOk()) {
        return quota.status();
    }
    auto obj = std::make_unique<CqObject>();
    obj->quota = std::move(*quota);
    obj->context = ctx;
    {
        DriverCall call(s.memory_.get(), ctx->device);
        errno = 0;
        obj->cq = ctx->ext->ops->create_cq(ctx->verbs, &attr);
        if (obj->cq == nullptr) {
            return fromDriver(errno != 0 ? errno : ENOMEM, "create_cq failed");
        }
    }
    auto info = translate(s, obj->cq->cq_info);
    CqResult r;
    if (info.isOk()) {
        r.info = *info;
        r.cqe = obj->cq->cq != nullptr ? static_cast<uint32_t>(obj->cq->cq->cqe) : args.cqe;
        std::memcpy(r.resv, obj->cq->resv, sizeof(r.resv));
    }
    obj->uses = {ctx};
    obj->queue_bytes = uint64_t{obj->cq->cq_info.qbuf.entry_cnt} * obj->cq->cq_info.qbuf.entry_size;
    Status qst = chargeQueueBytes(s, *obj, {&obj->cq->cq_info});
    Object *raw = obj.get();
    r.cq = insert(s, std::move(obj));
    Status st = !qst.isOk() ? qst : info.isOk() ? sendRegions(s) : info.status();
    if (!st.isOk()) {
        (void)destroyLocked(s, raw);
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    return r;
}

StatusOr<Released> Broker::destroyCq(Session &s, uint64_t cq) {
    return destroyByHandle(s, cq, ObjectKind::kCq);
}

StatusOr<QpResult> Broker::createQp(Session &s, const CreateQpArgs &args) {
    if (!validDmaMode(args.dma_mode)) {
        return invalidArgument("invalid dma_mode");
    }
    if (args.qp_type != IBV_QPT_RC && args.qp_type != IBV_QPT_UC && args.qp_type != IBV_QPT_UD) {
        return invalidArgument("invalid qp_type");
    }
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto c = lookup<ContextObject>(s, args.context, ObjectKind::kContext);
    if (!c.isOk()) {
        return c.status();
    }
    auto p = lookup<PdObject>(s, args.pd, ObjectKind::kPd);
    if (!p.isOk()) {
        return p.status();
    }
    auto scq = lookup<CqObject>(s, args.send_cq, ObjectKind::kCq);
    if (!scq.isOk()) {
        return scq.status();
    }
    auto rcq = lookup<CqObject>(s, args.recv_cq, ObjectKind::kCq);
    if (!rcq.isOk()) {
        return rcq.status();
    }
    SrqObject *srq = nullptr;
    if (args.srq != 0) {
        auto q = lookup<SrqObject>(s, args.srq, ObjectKind::kSrq);
        if (!q.isOk()) {
            return q.status();
        }
        srq = *q;
    }
    ContextObject *ctx = *c;
    if ((*p)->context != ctx || (*scq)->context != ctx || (*rcq)->context != ctx ||
        (srq != nullptr && srq->context != ctx)) {
        return invalidArgument("the PD, CQs and SRQ must belong to the QP's context");
    }
    const DeviceInfo &d = ctx->device->info;
    for (Status st : {checkLimit(args.cap.max_send_wr, d.max_qp_wr, "max_send_wr"),
                      checkLimit(args.cap.max_recv_wr, d.max_qp_wr, "max_recv_wr"),
                      checkLimit(args.cap.max_send_sge, d.max_sge, "max_send_sge"),
                      checkLimit(args.cap.max_recv_sge, d.max_sge, "max_recv_sge"),
                      checkLimit(args.cap.max_inline_data, d.max_inline_data, "max_inline_data")}) {
        if (!st.isOk()) {
            return st;
        }
    }
    if (ctx->ext->ops->create_qp == nullptr) {
        return unimplemented("the driver has no create_qp");
    }
    ibv_qp_init_attr_extend attr{};
    attr.pd = (*p)->pd;
    attr.attr.send_cq = (*scq)->cq->cq;
    attr.attr.recv_cq = (*rcq)->cq->cq;
    attr.attr.srq = srq != nullptr ? srq->srq->srq : nullptr;
    attr.attr.qp_type = args.qp_type;
    attr.attr.cap = args.cap;
    attr.attr.sq_sig_all = args.sq_sig_all ? 1 : 0;
    attr.qp_cap_flag = args.qp_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    auto quota = charge(s, {{Quota::kQps, 1}});
    if (!quota.isOk()) {
        return quota.status();
    }
    auto obj = std::make_unique<QpObject>();
    obj->quota = std::move(*quota);
    obj->context = ctx;
    {
        DriverCall call(s.memory_.get(), ctx->device);
        errno = 0;
        obj->qp = ctx->ext->ops->create_qp(ctx->verbs, &attr);
        if (obj->qp == nullptr) {
            return fromDriver(errno != 0 ? errno : ENOMEM, "create_qp failed");
        }
    }
    obj->cap = attr.attr.cap;
    obj->qp_type = attr.attr.qp_type;
    obj->sq_sig_all = attr.attr.sq_sig_all != 0;
    obj->has_srq = srq != nullptr;
    QpResult r;
    auto sq = translate(s, obj->qp->sq_info);
    auto rq = translate(s, obj->qp->rq_info);
    Status st = !sq.isOk() ? sq.status() : rq.status();
    if (st.isOk()) {
        r.sq = *sq;
        r.rq = *rq;
        if (obj->qp->qp != nullptr) {
            r.qp_num = obj->qp->qp->qp_num;
            r.state = obj->qp->qp->state;
        }
        r.cap = attr.attr.cap;
        std::memcpy(r.resv, obj->qp->resv, sizeof(r.resv));
        r.vendor_priv_info = obj->qp->vendor_priv_info.value;
    }
    obj->uses = {ctx, *p, *scq, *rcq};
    if (srq != nullptr) {
        obj->uses.push_back(srq);
    }
    if (st.isOk()) {
        st = chargeQueueBytes(s, *obj, {&obj->qp->sq_info, &obj->qp->rq_info});
    }
    Object *raw = obj.get();
    r.qp = insert(s, std::move(obj));
    if (st.isOk()) {
        st = sendRegions(s);
    }
    if (!st.isOk()) {
        (void)destroyLocked(s, raw);
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    return r;
}

StatusOr<Released> Broker::destroyQp(Session &s, uint64_t qp) {
    return destroyByHandle(s, qp, ObjectKind::kQp);
}

StatusOr<SrqResult> Broker::createSrq(Session &s, const CreateSrqArgs &args) {
    if (!validDmaMode(args.dma_mode)) {
        return invalidArgument("invalid dma_mode");
    }
    if (args.max_wr == 0) {
        return invalidArgument("max_wr must be > 0");
    }
    IBVX_LOCK_SESSION(s);
    IBVX_CHECK_ROOM(s);
    auto c = lookup<ContextObject>(s, args.context, ObjectKind::kContext);
    if (!c.isOk()) {
        return c.status();
    }
    auto p = lookup<PdObject>(s, args.pd, ObjectKind::kPd);
    if (!p.isOk()) {
        return p.status();
    }
    ContextObject *ctx = *c;
    if ((*p)->context != ctx) {
        return invalidArgument("the PD must belong to the SRQ's context");
    }
    const DeviceInfo &d = ctx->device->info;
    for (Status st :
         {checkLimit(args.max_wr, d.max_srq_wr, "max_wr"), checkLimit(args.max_sge, d.max_sge, "max_sge")}) {
        if (!st.isOk()) {
            return st;
        }
    }
    if (ctx->ext->ops->create_srq == nullptr) {
        return unimplemented("the driver has no create_srq");
    }
    ibv_srq_init_attr_extend attr{};
    attr.pd = (*p)->pd;
    attr.attr.attr.max_wr = args.max_wr;
    attr.attr.attr.max_sge = args.max_sge;
    attr.attr.attr.srq_limit = args.srq_limit;
    attr.srq_cap_flag = args.srq_cap_flag;
    attr.type = args.dma_mode;
    attr.ops = MappingManager::ops();
    auto quota = charge(s, {{Quota::kSrqs, 1}});
    if (!quota.isOk()) {
        return quota.status();
    }
    auto obj = std::make_unique<SrqObject>();
    obj->quota = std::move(*quota);
    obj->context = ctx;
    {
        DriverCall call(s.memory_.get(), ctx->device);
        errno = 0;
        obj->srq = ctx->ext->ops->create_srq(ctx->verbs, &attr);
        if (obj->srq == nullptr) {
            return fromDriver(errno != 0 ? errno : ENOMEM, "create_srq failed");
        }
    }
    SrqResult r;
    auto info = translate(s, obj->srq->srq_info);
    if (info.isOk()) {
        r.info = *info;
        r.max_wr = attr.attr.attr.max_wr;
        r.max_sge = attr.attr.attr.max_sge;
        std::memcpy(r.resv, obj->srq->resv, sizeof(r.resv));
    }
    obj->uses = {ctx, *p};
    Status qst = chargeQueueBytes(s, *obj, {&obj->srq->srq_info});
    Object *raw = obj.get();
    r.srq = insert(s, std::move(obj));
    Status st = !qst.isOk() ? qst : info.isOk() ? sendRegions(s) : info.status();
    if (!st.isOk()) {
        (void)destroyLocked(s, raw);
        (void)MappingManager::instance().takeReleased(*s.memory_);
        return st;
    }
    return r;
}

StatusOr<Released> Broker::destroySrq(Session &s, uint64_t srq) {
    return destroyByHandle(s, srq, ObjectKind::kSrq);
}

StatusOr<ibv_qp_state> Broker::modifyQp(Session &s, uint64_t qp, ibv_qp_attr attr, int attr_mask) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    ibv_qp *ibqp = o->qp->qp;
    if (ibqp == nullptr) {
        return failedPrecondition("the driver's QP has no ibv_qp");
    }
    Device *dev = o->context->device;
    DriverCall call(s.memory_.get(), dev);
    int rc;
    if (dev->vdev != nullptr) {
        rc = dev->vdev->modify_qp != nullptr ? dev->vdev->modify_qp(ibqp, &attr, attr_mask) : -EOPNOTSUPP;
    } else {
        rc = ibv_modify_qp(ibqp, &attr, attr_mask);
    }
    if (rc != 0) {
        return fromDriver(driverErr(rc), "modify_qp failed");
    }
    if ((attr_mask & IBV_QP_STATE) != 0) {
        ibqp->state = attr.qp_state;
    }
    return ibqp->state;
}

StatusOr<QueryQpResult> Broker::queryQp(Session &s, uint64_t qp, int attr_mask) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    ibv_qp *ibqp = o->qp->qp;
    if (ibqp == nullptr) {
        return failedPrecondition("the driver's QP has no ibv_qp");
    }
    Device *dev = o->context->device;
    QueryQpResult r;
    DriverCall call(s.memory_.get(), dev);
    int rc;
    if (dev->vdev != nullptr) {
        rc = dev->vdev->query_qp != nullptr ? dev->vdev->query_qp(ibqp, &r.attr, attr_mask, &r.init)
                                            : -EOPNOTSUPP;
    } else {
        rc = ibv_query_qp(ibqp, &r.attr, attr_mask, &r.init);
    }
    if (rc != 0) {
        return fromDriver(driverErr(rc), "query_qp failed");
    }
    r.init.qp_type = o->qp_type;
    r.init.sq_sig_all = o->sq_sig_all ? 1 : 0;
    return r;
}

namespace {

bool knownExtendMask(int attr_mask) {
    return (static_cast<unsigned>(attr_mask) & ~(static_cast<unsigned>(IBV_QP_ATTR_EXTEND_MAX) - 1U)) == 0;
}

}  // namespace

StatusOr<uint64_t> Broker::modifyQpExtend(Session &s, uint64_t qp, ibv_qp_attr_extend attr, int attr_mask) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    auto *ops = o->context->ext->ops;
    if (ops->version < IBV_EXTEND_DRIVER_VERSION_V2 || !knownExtendMask(attr_mask) ||
        ops->modify_qp == nullptr) {
        return unimplemented("modify_qp_extend is not supported by this driver or mask");
    }
    attr.qp = o->qp->qp;
    DriverCall call(s.memory_.get(), o->context->device);
    int rc = ops->modify_qp(o->context->verbs, &attr, attr_mask);
    if (rc != 0) {
        return fromDriver(driverErr(rc), "modify_qp_extend failed");
    }
    return o->qp->vendor_priv_info.value;
}

StatusOr<ibv_qp_attr_extend> Broker::queryQpExtend(Session &s, uint64_t qp, int attr_mask) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    auto *ops = o->context->ext->ops;
    if (ops->version < IBV_EXTEND_DRIVER_VERSION_V2 || !knownExtendMask(attr_mask) ||
        ops->query_qp == nullptr) {
        return unimplemented("query_qp_extend is not supported by this driver or mask");
    }
    ibv_qp_attr_extend attr{};
    attr.qp = o->qp->qp;
    DriverCall call(s.memory_.get(), o->context->device);
    int rc = ops->query_qp(o->context->verbs, &attr, attr_mask);
    if (rc != 0) {
        return fromDriver(driverErr(rc), "query_qp_extend failed");
    }
    attr.qp = nullptr;
    return attr;
}

StatusOr<ibv_hyroce_feature> Broker::queryQpSupportedHyroceFeature(Session &s, uint64_t qp, uint32_t sl,
                                                                   uint32_t tc) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    auto *ops = o->context->ext->ops;
    if (ops->version < IBV_EXTEND_DRIVER_VERSION_V3 || ops->query_qp_supported_hyroce_feature == nullptr) {
        return unimplemented("query_qp_supported_hyroce_feature is not supported by this driver");
    }
    ibv_hyroce_feature f{};
    DriverCall call(s.memory_.get(), o->context->device);
    int rc = ops->query_qp_supported_hyroce_feature(o->context->verbs, o->qp->qp, sl, tc, &f);
    if (rc != 0) {
        return fromDriver(driverErr(rc), "query_qp_supported_hyroce_feature failed");
    }
    return f;
}

StatusOr<NegoResult> Broker::negoQpHyroceFeature(Session &s, uint64_t qp, const ibv_hyroce_feature &input) {
    IBVX_LOCK_SESSION(s);
    auto q = lookup<QpObject>(s, qp, ObjectKind::kQp);
    if (!q.isOk()) {
        return q.status();
    }
    QpObject *o = *q;
    auto *ops = o->context->ext->ops;
    if (ops->version < IBV_EXTEND_DRIVER_VERSION_V3 || ops->nego_qp_hyroce_feature == nullptr) {
        return unimplemented("nego_qp_hyroce_feature is not supported by this driver");
    }
    NegoResult r;
    DriverCall call(s.memory_.get(), o->context->device);
    int rc = ops->nego_qp_hyroce_feature(o->context->verbs, o->qp->qp, &input, &r.output, &r.need_more_nego);
    if (rc != 0) {
        return fromDriver(driverErr(rc), "nego_qp_hyroce_feature failed");
    }
    return r;
}

}  // namespace ibvx::daemon
