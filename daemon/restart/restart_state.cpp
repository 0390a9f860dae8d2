#include "daemon/restart/restart_state.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "common/build_config.h"
#include "daemon/core/mapping.h"
#include "daemon/core/objects.h"
#include "ibv_extend/restart/v1/snapshot.pb.h"
#include "providers/loader/extend_open.h"

namespace ibvx::daemon {
namespace {

namespace rpb = ::ibv_extend::restart::v1;

// A successor starts its region ids this far above the floor a commit recorded, and a commit
// rewrites the floor once half of it is used: no call creates this many regions.
constexpr uint64_t kRegionSlack = uint64_t{1} << 20;

uint64_t nowUnixMs() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
}

std::string hex(uint64_t v) {
    char buf[17];
    snprintf(buf, sizeof(buf), "%016" PRIx64, v);
    return buf;
}

std::string prefix(uint64_t session) {
    return "ibvx.s" + std::to_string(session) + ".";
}
std::string stateName(uint64_t session) {
    return prefix(session) + "state";
}
std::string channelName(uint64_t session) {
    return prefix(session) + "ch";
}
std::string chunkName(uint64_t session, RegionId r) {
    return prefix(session) + "c" + std::to_string(r);
}
std::string doorbellName(uint64_t session, RegionId r) {
    return prefix(session) + "d" + std::to_string(r);
}
std::string mrName(uint64_t session, uint64_t handle) {
    return prefix(session) + "m" + hex(handle);
}
std::string driverFdName(uint64_t session, uint64_t handle, size_t n) {
    return prefix(session) + "o" + hex(handle) + "." + std::to_string(n);
}
constexpr const char *kGlobalName = "ibvx.global";

void *relocThunk(void *arg, uint64_t old_addr, uint64_t length) {
    uint64_t a = static_cast<const Relocations *>(arg)->find(old_addr, length);
    return a != 0 ? reinterpret_cast<void *>(a) : nullptr;
}

void toProto(const PeerIdentity &p, uint64_t start_time, rpb::Identity *out) {
    out->set_pid(static_cast<uint32_t>(p.creds.pid));
    out->set_uid(p.creds.uid);
    out->set_gid(p.creds.gid);
    out->set_start_time(start_time);
    out->set_cgroup(p.cgroup);
    out->set_container_id(p.container_id);
    out->set_runtime(p.runtime);
    for (gid_t g : p.groups) {
        out->add_groups(g);
    }
    out->set_k8s_device(p.k8s_device);
    out->set_pod_namespace(p.pod_namespace);
    out->set_pod_name(p.pod_name);
    out->set_pod_container(p.pod_container);
}

PeerIdentity fromProto(const rpb::Identity &m) {
    PeerIdentity p;
    p.creds.pid = static_cast<pid_t>(m.pid());
    p.creds.uid = m.uid();
    p.creds.gid = m.gid();
    p.cgroup = m.cgroup();
    p.container_id = m.container_id();
    p.runtime = m.runtime();
    p.groups.assign(m.groups().begin(), m.groups().end());
    p.k8s_device = m.k8s_device();
    p.pod_namespace = m.pod_namespace();
    p.pod_name = m.pod_name();
    p.pod_container = m.pod_container();
    return p;
}

template <typename T>
T *parentOf(const Object &o, ObjectKind kind, size_t nth = 0) {
    for (Object *u : o.uses) {
        if (u->kind == kind && nth-- == 0) {
            return static_cast<T *>(u);
        }
    }
    return nullptr;
}

Status restoreError(const std::string &what) {
    return Status(Code::kFailedPrecondition, EINVAL, what);
}

}  // namespace

uint64_t processStartTime(pid_t pid) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    if (!std::getline(f, line)) {
        return 0;
    }
    // comm (field 2) may hold spaces and parentheses: fields count from the last ')'.
    size_t close = line.rfind(')');
    if (close == std::string::npos) {
        return 0;
    }
    std::istringstream rest(line.substr(close + 2));
    std::string field;
    // After comm: state is field 3; starttime is field 22.
    for (int i = 3; i <= 22; ++i) {
        if (!(rest >> field)) {
            return 0;
        }
    }
    return std::strtoull(field.c_str(), nullptr, 10);
}

std::string RestoreReport::summary() const {
    std::string took;
    if (!crash) {
        took = "handover took " + std::to_string(took_ms) + " ms";
    } else if (took_ms != 0) {
        took = "after a crash: down at most " + std::to_string(took_ms) +
               " ms (since the old process was last seen alive)";
    } else {
        took = "after a crash: downtime unknown";
    }
    return "restart " + std::to_string(restarts) + ": " + std::to_string(sessions_kept) +
           " session(s) kept with " + std::to_string(objects) + " object(s), " +
           std::to_string(sessions_dropped) + " dropped; " + took + ", restore " +
           std::to_string(restore_ms) + " ms";
}

RestartState::RestartState(Broker &broker, FdStoreHooks store) : broker_(broker), store_(std::move(store)) {}

RestartState::~RestartState() = default;

Status RestartState::start() {
    if (!global_.fd() || global_.fd() < 0) {
        ASSIGN_OR_RETURN(global_, StateFile::create("ibvx-global"));
    }
    RETURN_IF_ERROR(writeGlobal());
    if (store_.enabled()) {
        RETURN_IF_ERROR(store_.add({{kGlobalName, global_.fd()}}));
    }
    return Status::ok();
}

uint64_t RestartState::restarts() const {
    std::lock_guard lock(mu_);
    return restarts_;
}
uint64_t RestartState::lastRestartUnixMs() const {
    std::lock_guard lock(mu_);
    return last_restart_unix_ms_;
}
uint64_t RestartState::lastRestartTookMs() const {
    std::lock_guard lock(mu_);
    return last_took_ms_;
}
bool RestartState::lastRestartWasCrash() const {
    std::lock_guard lock(mu_);
    return last_crash_;
}

void RestartState::markAlive() {
    Status st = writeGlobal();
    std::lock_guard lock(global_mu_);
    if (!st.isOk() && !alive_warned_) {
        alive_warned_ = true;
        spdlog::warn("cannot update ibvx.global ({}): a crash restart's duration will be overstated",
                     st.message());
    }
}

void RestartState::countCallsWith(CallCounter counter) {
    std::lock_guard lock(mu_);
    call_counter_ = std::move(counter);
}

Status RestartState::writeGlobal() {
    std::lock_guard write(global_mu_);
    if (global_.fd() < 0) {
        return Status::ok();  // before start(): nothing to keep alive yet
    }
    rpb::Global g;
    uint64_t next_region = MappingManager::instance().nextRegionId();
    {
        std::lock_guard lock(mu_);
        g.set_format(kSnapshotFormat);
        g.set_writer_version(std::to_string(IBVX_PROJECT_VERSION_MAJOR) + "." +
                             std::to_string(IBVX_PROJECT_VERSION_MINOR) + "." +
                             std::to_string(IBVX_PROJECT_VERSION_PATCH));
        g.set_restarts(restarts_);
        g.set_last_restart_unix_ms(static_cast<int64_t>(last_restart_unix_ms_));
        g.set_next_session_id(broker_.nextSessionId());
        g.set_region_floor(next_region + kRegionSlack);
        g.set_handover_started_unix_ms(static_cast<int64_t>(handover_started_ms_));
        g.set_alive_unix_ms(static_cast<int64_t>(nowUnixMs()));
        region_floor_written_ = next_region;
    }
    std::string bytes;
    g.SerializeToString(&bytes);
    return global_.compact({{uint8_t{1}, bytes}});  // one header record, rewritten whole
}

std::vector<std::pair<std::string, int>> RestartState::sessionFds(Session &s, SessionEntry &e) {
    std::vector<std::pair<std::string, int>> out;
    const uint64_t id = s.id();
    out.emplace_back(stateName(id), e.file.fd());
    if (s.channel_) {
        out.emplace_back(channelName(id), s.channel_.get());
    }
    MemoryState mem = MappingManager::instance().exportState(*s.memory_);
    for (const ChunkState &c : mem.chunks) {
        out.emplace_back(chunkName(id, c.id), c.fd);
    }
    for (const DoorbellState &d : mem.doorbells) {
        out.emplace_back(doorbellName(id, d.id), d.fd);
    }
    for (auto &[handle, obj] : s.objects_) {
        if (obj->kind == ObjectKind::kMr) {
            auto *mr = static_cast<MrObject *>(obj.get());
            if (mr->fd) {
                out.emplace_back(mrName(id, handle), mr->fd.get());
            }
        }
        for (size_t i = 0; i < obj->driver_fds.size(); ++i) {
            out.emplace_back(driverFdName(id, handle, i), obj->driver_fds[i].get());
        }
    }
    return out;
}

namespace {

// ---- log records (StateFile::Record types) ----
enum RecordType : uint8_t {
    kHeader = 1,
    kObjectPut = 2,
    kObjectDel = 3,
    kChunkPut = 4,
    kChunkDel = 5,
    kDoorbellPut = 6,
    kDoorbellDel = 7,
    kReply = 8,
    kAlias = 9,  // "name\ncanonical": name's fd is the file stored as canonical
};

std::string u64Payload(uint64_t v) {
    return std::string(reinterpret_cast<const char *>(&v), sizeof(v));
}

bool u64From(const std::string &p, uint64_t *v) {
    if (p.size() != sizeof(*v)) {
        return false;
    }
    std::memcpy(v, p.data(), sizeof(*v));
    return true;
}

template <typename Msg>
std::string serialized(const Msg &m) {
    std::string out;
    m.SerializeToString(&out);
    return out;
}

std::string objectRecord(uint64_t id, const Object *obj) {
    rpb::Object out;
    out.set_handle(obj->handle);
    out.set_kind(static_cast<uint32_t>(obj->kind));
    for (Object *u : obj->uses) {
        out.add_uses(u->handle);
    }
    for (size_t q = 0; q < kQuotaCount; ++q) {
        out.add_quota(obj->quota.amount(static_cast<Quota>(q)));
    }
    out.set_queue_bytes(obj->queue_bytes);
    rpb::DriverState *ds = out.mutable_driver();
    ds->set_data(obj->driver_state);
    for (size_t i = 0; i < obj->driver_fds.size(); ++i) {
        ds->add_fds(driverFdName(id, obj->handle, i));
    }
    switch (obj->kind) {
        case ObjectKind::kContext:
            out.set_device(static_cast<const ContextObject *>(obj)->dev->info.name);
            break;
        case ObjectKind::kMr: {
            auto *mr = static_cast<const MrObject *>(obj);
            out.set_mr_length(mr->length);
            out.set_mr_map_length(mr->mapping.size());
            out.set_mr_fd(mr->fd ? mrName(id, obj->handle) : std::string());
            out.set_mr_offset(mr->fd_offset);
            out.set_mr_old_address(reinterpret_cast<uint64_t>(mr->mapping.get()));
            break;
        }
        case ObjectKind::kQp: {
            auto *qp = static_cast<const QpObject *>(obj);
            out.set_qp_type(static_cast<uint32_t>(qp->qp_type));
            out.set_sq_sig_all(qp->sq_sig_all);
            out.set_has_srq(qp->has_srq);
            out.set_cap_max_send_wr(qp->cap.max_send_wr);
            out.set_cap_max_recv_wr(qp->cap.max_recv_wr);
            out.set_cap_max_send_sge(qp->cap.max_send_sge);
            out.set_cap_max_recv_sge(qp->cap.max_recv_sge);
            out.set_cap_max_inline_data(qp->cap.max_inline_data);
            break;
        }
        default:
            break;
    }
    return serialized(out);
}

std::string chunkRecord(uint64_t id, const ChunkState &c) {
    rpb::Chunk out;
    out.set_region(c.id);
    out.set_fd(chunkName(id, c.id));
    out.set_size(c.size);
    out.set_old_address(c.base);
    out.set_sent(c.sent);
    for (auto [off, size] : c.used) {
        rpb::Block *b = out.add_used();
        b->set_offset(off);
        b->set_size(size);
    }
    return serialized(out);
}

std::string doorbellRecord(uint64_t id, const DoorbellState &d) {
    rpb::Doorbell out;
    out.set_region(d.id);
    out.set_fd(doorbellName(id, d.id));
    out.set_fd_offset(d.fd_offset);
    out.set_map_size(d.map_size);
    out.set_refs(d.refs);
    out.set_sent(d.sent);
    out.set_old_address(d.page);
    return serialized(out);
}

std::string replyRecord(const StoredReply &r) {
    rpb::Reply out;
    out.set_key(r.key);
    out.set_method(r.method);
    out.set_code(r.code);
    out.set_message(r.message);
    out.set_details(r.details);
    out.set_response(r.response);
    return serialized(out);
}

}  // namespace

void RestartState::exportTouched(Session &s, const std::vector<uint64_t> &handles) {
    for (uint64_t handle : handles) {
        auto it = s.objects_.find(handle);
        if (it == s.objects_.end() || !it->second->state_dirty) {
            continue;  // destroyed since, or already exported (a handle touched twice)
        }
        Object *obj = it->second.get();
        obj->state_dirty = false;
        obj->driver_state.clear();
        obj->driver_fds.clear();
        Device *dev = obj->device();
        if (dev == nullptr || !dev->verbs.keepsAcrossRestart()) {
            continue;  // restart: drops (the plan ends such sessions)
        }
        ibv_extend_vdev_state st{};
        int rc = 0;
        {
            std::unique_lock<std::mutex> driver(dev->driver_mu, std::defer_lock);
            if (dev->serialize_calls) {
                driver.lock();
            }
            rc = dev->verbs.exportObject(obj->vdevKind(), obj->driverObject(), &st);
        }
        if (rc == 0 && (st.len > IBV_EXTEND_VDEV_STATE_MAX || st.fd_cnt > IBV_EXTEND_VDEV_STATE_FDS)) {
            for (uint32_t i = 0; i < std::min<uint32_t>(st.fd_cnt, IBV_EXTEND_VDEV_STATE_FDS); ++i) {
                ::close(st.fds[i]);
            }
            rc = -EOVERFLOW;
        }
        if (rc != 0) {
            // Without its state the object cannot be imported: the restore ends this session.
            spdlog::warn("session {}: cannot export the state of {} {:016x} for restart: {}", s.id(),
                         kindName(obj->kind), handle, std::strerror(-rc));
            continue;
        }
        obj->driver_state.assign(reinterpret_cast<const char *>(st.data), st.len);
        for (uint32_t i = 0; i < st.fd_cnt; ++i) {
            obj->driver_fds.emplace_back(st.fds[i]);
        }
    }
}

CallCounts RestartState::callsOf(const Session &s) const {
    CallCounts c = s.earlierCalls();
    CallCounter counter;
    {
        std::lock_guard lock(mu_);
        counter = call_counter_;
    }
    if (counter) {
        CallCounts now = counter(s.id());
        c.calls += now.calls;
        c.errors += now.errors;
    }
    return c;
}

std::vector<StateFile::Record> RestartState::fullImage(Session &s, SessionEntry &e) {
    std::vector<StateFile::Record> out;
    const uint64_t id = s.id();
    rpb::Session h;
    h.set_id(id);
    h.set_token(std::string(reinterpret_cast<const char *>(s.token().data()), s.token().size()));
    toProto(s.identity(), e.start_time, h.mutable_identity());
    h.set_client_name(s.clientName());
    h.set_created_unix_ms(static_cast<int64_t>(s.createdUnixMs()));
    e.image_calls = callsOf(s);
    h.set_rpc_calls(e.image_calls.calls);
    h.set_rpc_errors(e.image_calls.errors);
    h.set_channel_fd(s.channel_ ? channelName(id) : std::string());
    out.emplace_back(kHeader, serialized(h));
    MemoryState mem = MappingManager::instance().exportState(*s.memory_);
    e.chunks.clear();
    for (const ChunkState &c : mem.chunks) {
        out.emplace_back(kChunkPut, chunkRecord(id, c));
        e.chunks[c.id] = c.version;
    }
    e.doorbells.clear();
    for (const DoorbellState &d : mem.doorbells) {
        out.emplace_back(kDoorbellPut, doorbellRecord(id, d));
        e.doorbells[d.id] = {d.refs, d.sent};
    }
    std::vector<Object *> order;
    order.reserve(s.objects_.size());
    for (auto &[handle, obj] : s.objects_) {
        order.push_back(obj.get());
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const Object *a, const Object *b) { return kindRank(a->kind) < kindRank(b->kind); });
    for (Object *obj : order) {
        out.emplace_back(kObjectPut, objectRecord(id, obj));
    }
    for (const StoredReply &r : s.replies()) {
        out.emplace_back(kReply, replyRecord(r));
    }
    for (const auto &[name, canonical] : e.aliases) {
        out.emplace_back(kAlias, name + "\n" + canonical);
    }
    e.reply_seq = s.reply_seq_;
    e.header_logged = true;
    e.compact_next = false;
    return out;
}

void RestartState::storeAdd(SessionEntry &e, std::vector<std::pair<std::string, int>> &batch,
                            const std::string &name, int fd) {
    if (!store_.enabled() || fd < 0) {
        return;
    }
    auto id = fileOf(e, fd);
    auto it = e.stored.find(name);
    if (it != e.stored.end() && it->second == id) {
        return;
    }
    if (it != e.stored.end()) {
        storeForget(e, name, it->second);  // the same name now carries another file
    }
    e.stored[name] = id;
    SessionEntry::File &f = e.files[id];
    if (f.names++ == 0) {
        f.canonical = name;
        batch.emplace_back(name, fd);
        return;
    }
    e.aliases[name] = f.canonical;
    e.new_aliases.emplace_back(kAlias, name + "\n" + f.canonical);
}

std::pair<uint64_t, uint64_t> RestartState::fileOf(SessionEntry &e, int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        return {0, 0};
    }
    if (S_ISREG(st.st_mode)) {
        return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    }
    const pid_t self = ::getpid();
    for (auto &[probe, id] : e.probes) {
        if (::syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, fd, probe.get()) == 0) {
            return {UINT64_MAX, id};
        }
    }
    uint64_t id = e.probes.size() + 1;
    e.probes.emplace_back(UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)), id);
    return {UINT64_MAX, id};
}

void RestartState::storeForget(SessionEntry &e, const std::string &name, std::pair<uint64_t, uint64_t> id) {
    e.aliases.erase(name);
    auto f = e.files.find(id);
    if (f == e.files.end()) {
        return;
    }
    if (--f->second.names == 0) {
        (void)store_.remove(f->second.canonical);
        e.files.erase(f);
    }
}

void RestartState::storeRemovePrefix(SessionEntry &e, const std::string &prefix) {
    for (auto it = e.stored.lower_bound(prefix); it != e.stored.end() && it->first.rfind(prefix, 0) == 0;) {
        if (store_.enabled()) {
            storeForget(e, it->first, it->second);
        }
        it = e.stored.erase(it);
    }
}

Status RestartState::commit(Session &s) {
    SessionEntry *e = nullptr;
    {
        std::lock_guard lock(mu_);
        auto &slot = entries_[s.id()];
        if (!slot) {
            auto made = StateFile::create("ibvx-state-" + std::to_string(s.id()));
            if (!made.isOk()) {
                entries_.erase(s.id());
                return made.status();
            }
            slot = std::make_unique<SessionEntry>();
            slot->file = std::move(made).value();
            slot->start_time = processStartTime(s.identity().creds.pid);
        }
        e = slot.get();
    }
    const uint64_t id = s.id();
    std::vector<uint64_t> touched = std::exchange(s.touched_, {});
    std::vector<uint64_t> erased = std::exchange(s.erased_, {});
    // Only objects a control call touched are exported again, and only what changed is logged:
    // a commit costs the call's changes, whatever the session holds.
    exportTouched(s, touched);
    std::vector<std::pair<std::string, int>> batch;
    Status written = Status::ok();
    if (!e->header_logged || e->compact_next) {
        if (store_.enabled()) {
            std::set<std::string> now;
            for (auto &[name, fd] : sessionFds(s, *e)) {
                now.insert(name);
                storeAdd(*e, batch, name, fd);
            }
            for (auto it = e->stored.begin(); it != e->stored.end();) {
                if (now.count(it->first) == 0) {
                    storeForget(*e, it->first, it->second);
                    it = e->stored.erase(it);
                } else {
                    ++it;
                }
            }
        }
        e->new_aliases.clear();  // the image carries every alias
        written = e->file.compact(fullImage(s, *e));
    } else {
        std::vector<StateFile::Record> records;
        MemoryState mem = MappingManager::instance().exportState(*s.memory_, &e->chunks);
        std::set<RegionId> live;
        for (const ChunkState &c : mem.chunks) {
            live.insert(c.id);
            if (c.unchanged) {
                continue;
            }
            records.emplace_back(kChunkPut, chunkRecord(id, c));
            storeAdd(*e, batch, chunkName(id, c.id), c.fd);
            e->chunks[c.id] = c.version;
        }
        for (auto it = e->chunks.begin(); it != e->chunks.end();) {
            if (live.count(it->first) == 0) {
                records.emplace_back(kChunkDel, u64Payload(it->first));
                storeRemovePrefix(*e, chunkName(id, it->first));
                it = e->chunks.erase(it);
            } else {
                ++it;
            }
        }
        live.clear();
        for (const DoorbellState &d : mem.doorbells) {
            live.insert(d.id);
            auto it = e->doorbells.find(d.id);
            if (it != e->doorbells.end() && it->second == std::make_pair(d.refs, d.sent)) {
                continue;
            }
            records.emplace_back(kDoorbellPut, doorbellRecord(id, d));
            storeAdd(*e, batch, doorbellName(id, d.id), d.fd);
            e->doorbells[d.id] = {d.refs, d.sent};
        }
        for (auto it = e->doorbells.begin(); it != e->doorbells.end();) {
            if (live.count(it->first) == 0) {
                records.emplace_back(kDoorbellDel, u64Payload(it->first));
                storeRemovePrefix(*e, doorbellName(id, it->first));
                it = e->doorbells.erase(it);
            } else {
                ++it;
            }
        }
        for (uint64_t h : erased) {
            records.emplace_back(kObjectDel, u64Payload(h));
            storeRemovePrefix(*e, mrName(id, h));
            storeRemovePrefix(*e, prefix(id) + "o" + hex(h) + ".");
        }
        std::set<uint64_t> seen;
        for (uint64_t h : touched) {
            auto it = s.objects_.find(h);
            if (it == s.objects_.end() || !seen.insert(h).second) {
                continue;
            }
            Object *obj = it->second.get();
            records.emplace_back(kObjectPut, objectRecord(id, obj));
            if (obj->kind == ObjectKind::kMr) {
                storeAdd(*e, batch, mrName(id, h), static_cast<MrObject *>(obj)->fd.get());
            }
            for (size_t i = 0; i < obj->driver_fds.size(); ++i) {
                storeAdd(*e, batch, driverFdName(id, h, i), obj->driver_fds[i].get());
            }
        }
        if (s.reply_seq_ > e->reply_seq) {
            std::vector<StoredReply> all = s.replies();
            size_t fresh = std::min<uint64_t>(s.reply_seq_ - e->reply_seq, all.size());
            for (size_t i = all.size() - fresh; i < all.size(); ++i) {
                records.emplace_back(kReply, replyRecord(all[i]));
            }
            e->reply_seq = s.reply_seq_;
        }
        for (auto &a : e->new_aliases) {
            records.push_back(std::move(a));
        }
        e->new_aliases.clear();
        written = e->file.append(records);
        // A long-lived session's log is rewritten once it is twice its image: amortized O(1).
        if (e->file.appendedBytes() > std::max<uint64_t>(uint64_t{1} << 20, 2 * e->file.compactedBytes())) {
            e->compact_next = true;
        }
    }
    if (!batch.empty()) {
        Status st = store_.add(batch);
        if (!st.isOk() && !e->warned) {
            e->warned = true;
            spdlog::warn(
                "session {}: the fd store did not take every fd ({}): it survives "
                "ibv-extendctl restart, not a crash",
                id, st.message());
        }
    }
    if (!written.isOk()) {
        e->compact_next = true;  // the log may be behind: the next commit rewrites it whole
        return written;
    }
    bool floor_due = false;
    {
        std::lock_guard lock(mu_);
        floor_due = MappingManager::instance().nextRegionId() >= region_floor_written_ + kRegionSlack / 2;
    }
    if (floor_due) {
        RETURN_IF_ERROR(writeGlobal());
    }
    return Status::ok();
}

void RestartState::sessionEnded(Session &s) {
    std::unique_ptr<SessionEntry> e;
    {
        std::lock_guard lock(mu_);
        auto it = entries_.find(s.id());
        if (it == entries_.end()) {
            return;
        }
        e = std::move(it->second);
        entries_.erase(it);
    }
    if (store_.enabled()) {
        for (auto &[name, id] : e->stored) {
            (void)store_.remove(name);
        }
    }
}

RestartState::Plan RestartState::plan() {
    Plan p;
    std::set<std::string> drivers;
    for (auto &s : broker_.sessions()) {
        std::lock_guard lock(s->mu_);
        bool keeps = s->attached();
        for (auto &[handle, obj] : s->objects_) {
            Device *dev = obj->device();
            if (dev == nullptr || !dev->verbs.keepsAcrossRestart()) {
                keeps = false;
                if (dev != nullptr) {
                    drivers.insert(dev->info.provider);
                }
            }
        }
        if (keeps) {
            ++p.kept;
        } else {
            ++p.dropped;
            p.to_drop.push_back(s);
        }
    }
    p.dropping_drivers.assign(drivers.begin(), drivers.end());
    return p;
}

StatusOr<std::vector<std::pair<std::string, int>>> RestartState::handover() {
    std::vector<std::pair<std::string, int>> out;
    {
        std::lock_guard lock(mu_);
        handover_started_ms_ = nowUnixMs();  // the successor's "took" counts the commits below
    }
    for (auto &s : broker_.sessions()) {
        {
            // The call counts live in the header, which only an image writes: a session that
            // made calls since its last image gets a new one, so the successor goes on from
            // the exact count.
            std::lock_guard slock(s->mu_);
            CallCounts now = callsOf(*s);
            std::lock_guard lock(mu_);
            auto it = entries_.find(s->id());
            if (it != entries_.end()) {
                SessionEntry &e = *it->second;
                e.compact_next =
                    e.compact_next || now.calls != e.image_calls.calls || now.errors != e.image_calls.errors;
            }
        }
        RETURN_IF_ERROR(broker_.commit(*s, StoredReply{}));
    }
    RETURN_IF_ERROR(writeGlobal());
    out.emplace_back(kGlobalName, global_.fd());
    for (auto &s : broker_.sessions()) {
        std::lock_guard slock(s->mu_);
        SessionEntry *e = nullptr;
        {
            std::lock_guard lock(mu_);
            auto it = entries_.find(s->id());
            if (it != entries_.end()) {
                e = it->second.get();
            }
        }
        if (e != nullptr) {
            auto fds = sessionFds(*s, *e);
            out.insert(out.end(), fds.begin(), fds.end());
        }
    }
    return out;
}

void RestartState::dropNames(const std::vector<std::string> &names) {
    if (!store_.enabled()) {
        return;
    }
    for (const std::string &n : names) {
        (void)store_.remove(n);
    }
}

Status RestartState::restoreSession(const std::vector<StateFile::Record> &records,
                                    std::map<std::string, UniqueFd> &fds, StateFile file,
                                    std::shared_ptr<Session> *out, uint64_t *objects) {
    // Replay the log into one image: the header, then the last put of everything not deleted.
    rpb::Session m;
    bool have_header = false;
    std::map<uint64_t, rpb::Object> objs;
    std::map<uint64_t, rpb::Chunk> chunks;
    std::map<uint64_t, rpb::Doorbell> doorbells;
    std::deque<rpb::Reply> replies;
    std::map<std::string, std::string> aliases;
    for (const auto &[type, payload] : records) {
        bool ok = true;
        uint64_t key = 0;
        switch (type) {
            case kHeader:
                ok = !have_header && m.ParseFromString(payload);
                have_header = true;
                break;
            case kObjectPut: {
                rpb::Object o;
                ok = o.ParseFromString(payload);
                if (ok) {
                    objs[o.handle()] = std::move(o);
                }
                break;
            }
            case kObjectDel:
                ok = u64From(payload, &key);
                objs.erase(key);
                break;
            case kChunkPut: {
                rpb::Chunk c;
                ok = c.ParseFromString(payload);
                if (ok) {
                    chunks[c.region()] = std::move(c);
                }
                break;
            }
            case kChunkDel:
                ok = u64From(payload, &key);
                chunks.erase(key);
                break;
            case kDoorbellPut: {
                rpb::Doorbell d;
                ok = d.ParseFromString(payload);
                if (ok) {
                    doorbells[d.region()] = std::move(d);
                }
                break;
            }
            case kDoorbellDel:
                ok = u64From(payload, &key);
                doorbells.erase(key);
                break;
            case kReply: {
                rpb::Reply r;
                ok = r.ParseFromString(payload);
                replies.push_back(std::move(r));
                if (replies.size() > Session::kMaxReplies) {
                    replies.pop_front();
                }
                break;
            }
            case kAlias: {
                size_t nl = payload.find('\n');
                ok = nl != std::string::npos;
                if (ok) {
                    aliases[payload.substr(0, nl)] = payload.substr(nl + 1);
                }
                break;
            }
            default:
                ok = false;
        }
        if (!ok) {
            return restoreError("its state holds a record that does not parse (type " + std::to_string(type) +
                                ")");
        }
    }
    if (!have_header) {
        return restoreError("its state has no header");
    }
    std::vector<rpb::Object *> order;
    for (auto &[h, o] : objs) {
        order.push_back(&o);
    }
    std::stable_sort(order.begin(), order.end(), [](const rpb::Object *a, const rpb::Object *b) {
        return kindRank(static_cast<ObjectKind>(a->kind())) < kindRank(static_cast<ObjectKind>(b->kind()));
    });
    for (rpb::Object *o : order) {
        *m.add_objects() = std::move(*o);
    }
    for (auto &[r, c] : chunks) {
        *m.add_chunks() = std::move(c);
    }
    for (auto &[r, d] : doorbells) {
        *m.add_doorbells() = std::move(d);
    }
    for (auto &r : replies) {
        *m.add_replies() = std::move(r);
    }
    SessionToken token{};
    if (m.token().size() != token.size() || m.id() == 0) {
        return restoreError("its state has no valid token or id");
    }
    std::memcpy(token.data(), m.token().data(), token.size());
    // A name's fd, or its canonical's (the store kept one copy of a file stored under several
    // names): a new fd either way, the originals close when the restore is over.
    auto take = [&](const std::string &name, UniqueFd *fd) -> Status {
        auto it = fds.find(name);
        if (it == fds.end()) {
            auto a = aliases.find(name);
            if (a != aliases.end()) {
                it = fds.find(a->second);
            }
        }
        if (name.empty() || it == fds.end()) {
            return restoreError("missing fd " + (name.empty() ? std::string("(unnamed)") : name));
        }
        fd->reset(::fcntl(it->second.get(), F_DUPFD_CLOEXEC, 0));
        if (!*fd) {
            return Status::fromErrno(errno, "cannot duplicate fd " + name);
        }
        return Status::ok();
    };
    PeerIdentity identity = fromProto(m.identity());
    const pid_t pid = identity.creds.pid;
    // The tenant must be the same process: a pid reused during the window is someone else.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    uint64_t start = processStartTime(pid);
    if (!pidfd || start == 0 || start != m.identity().start_time()) {
        return Status(Code::kNotFound, ESRCH, "its process exited during the restart; reclaimed");
    }
    UniqueFd channel;
    RETURN_IF_ERROR(take(m.channel_fd(), &channel));

    MemoryState ms;
    for (const rpb::Chunk &c : m.chunks()) {
        ChunkState cs;
        cs.id = c.region();
        RETURN_IF_ERROR(take(c.fd(), &cs.owned));
        cs.size = c.size();
        cs.base = c.old_address();
        cs.sent = c.sent();
        for (const rpb::Block &b : c.used()) {
            cs.used.emplace_back(b.offset(), b.size());
        }
        ms.chunks.push_back(std::move(cs));
    }
    for (const rpb::Doorbell &d : m.doorbells()) {
        DoorbellState ds;
        ds.id = d.region();
        RETURN_IF_ERROR(take(d.fd(), &ds.owned));
        ds.fd_offset = d.fd_offset();
        ds.map_size = d.map_size();
        ds.refs = d.refs();
        ds.sent = d.sent();
        ds.page = d.old_address();
        ds.fd = ds.owned.get();
        ms.doorbells.push_back(std::move(ds));
    }
    Relocations reloc;
    ASSIGN_OR_RETURN(std::unique_ptr<SessionMemory> memory,
                     MappingManager::instance().restoreSession(m.id(), std::move(ms), &reloc));
    SessionHistory history;
    history.created_unix_ms = static_cast<uint64_t>(std::max<int64_t>(m.created_unix_ms(), 0));
    history.calls = {m.rpc_calls(), m.rpc_errors()};
    auto s = std::make_shared<Session>(m.id(), token, identity, m.client_name(), std::move(pidfd),
                                       std::move(memory), std::move(channel), history);
    const TenantKey tenant{identity.creds.uid, identity.container_id, identity.pod_namespace};
    QuotaValues one{};
    one[static_cast<size_t>(Quota::kSessions)] = 1;
    s->quota_ = broker_.quotas().restore(tenant, one);

    // From here on a failure tears down what was imported, through the ordinary destroy path.
    auto fail = [&](Status st) {
        broker_.endSession(s);
        return st;
    };
    // No lock: nobody else can reach the session before adoptSession().
    for (const rpb::Object &po : m.objects()) {
        const auto kind = static_cast<ObjectKind>(po.kind());
        if (po.kind() > static_cast<uint32_t>(ObjectKind::kSrq) || po.handle() == 0 ||
            s->objects_.count(po.handle()) != 0) {
            return fail(restoreError("its state holds a malformed object"));
        }
        std::unique_ptr<Object> obj;
        switch (kind) {
            case ObjectKind::kContext:
                obj = std::make_unique<ContextObject>();
                break;
            case ObjectKind::kPd:
                obj = std::make_unique<PdObject>();
                break;
            case ObjectKind::kMr:
                obj = std::make_unique<MrObject>();
                break;
            case ObjectKind::kCq:
                obj = std::make_unique<CqObject>();
                break;
            case ObjectKind::kSrq:
                obj = std::make_unique<SrqObject>();
                break;
            case ObjectKind::kQp:
                obj = std::make_unique<QpObject>();
                break;
        }
        if (po.uses_size() > static_cast<int>(ObjectUses::kMax)) {
            return fail(restoreError("its state holds a malformed object"));
        }
        for (uint64_t h : po.uses()) {
            auto it = s->objects_.find(h);
            if (it == s->objects_.end()) {
                return fail(restoreError("object " + hex(po.handle()) + " uses an unknown handle"));
            }
            obj->uses.push_back(it->second.get());
        }
        // The parents the kind needs, checked before anything reaches the driver.
        ContextObject *ctx =
            kind == ObjectKind::kContext ? nullptr : parentOf<ContextObject>(*obj, ObjectKind::kContext);
        PdObject *pd = parentOf<PdObject>(*obj, ObjectKind::kPd);
        Device *dev = nullptr;
        if (kind == ObjectKind::kContext) {
            dev = broker_.devices().find(po.device());
            static_cast<ContextObject *>(obj.get())->dev = dev;
        } else if (ctx != nullptr) {
            dev = ctx->dev;
        } else if (pd != nullptr) {
            dev = pd->context->dev;
            ctx = pd->context;
        }
        if (dev == nullptr || (kind != ObjectKind::kContext && ctx == nullptr) ||
            ((kind == ObjectKind::kMr || kind == ObjectKind::kQp) && pd == nullptr)) {
            return fail(restoreError("object " + hex(po.handle()) + " has no device or parent"));
        }
        if (!dev->verbs.keepsAcrossRestart()) {
            return fail(
                restoreError("device " + dev->info.name + "'s driver cannot hand over (restart: drops)"));
        }
        if (po.driver().data().empty() || po.driver().data().size() > IBV_EXTEND_VDEV_STATE_MAX ||
            po.driver().fds_size() > IBV_EXTEND_VDEV_STATE_FDS) {
            return fail(restoreError("object " + hex(po.handle()) + " has no usable driver state"));
        }
        switch (kind) {
            case ObjectKind::kPd:
                static_cast<PdObject *>(obj.get())->context = ctx;
                break;
            case ObjectKind::kMr: {
                auto *mr = static_cast<MrObject *>(obj.get());
                mr->pd = pd;
                mr->length = po.mr_length();
                mr->fd_offset = po.mr_offset();
                UniqueFd fd;
                if (Status st = take(po.mr_fd(), &fd); !st.isOk()) {
                    return fail(st);
                }
                const uint64_t len = po.mr_map_length();
                struct stat st {};
                if (len == 0 || ::fstat(fd.get(), &st) != 0 ||
                    po.mr_offset() > static_cast<uint64_t>(st.st_size)) {
                    return fail(restoreError("MR " + hex(po.handle()) + ": its memory fd does not match"));
                }
                void *base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                                    static_cast<off_t>(po.mr_offset()));
                if (base == MAP_FAILED) {
                    return fail(
                        Status::fromErrno(errno, "MR " + hex(po.handle()) + ": cannot map its memory"));
                }
                mr->mapping = UniqueMapping(base, len);
                mr->fd = std::move(fd);
                reloc.add(po.mr_old_address(), reinterpret_cast<uint64_t>(base), len);
                break;
            }
            case ObjectKind::kCq:
                static_cast<CqObject *>(obj.get())->context = ctx;
                break;
            case ObjectKind::kSrq:
                static_cast<SrqObject *>(obj.get())->context = ctx;
                break;
            case ObjectKind::kQp: {
                auto *qp = static_cast<QpObject *>(obj.get());
                qp->context = ctx;
                qp->qp_type = static_cast<ibv_qp_type>(po.qp_type());
                qp->sq_sig_all = po.sq_sig_all();
                qp->has_srq = po.has_srq();
                qp->cap.max_send_wr = po.cap_max_send_wr();
                qp->cap.max_recv_wr = po.cap_max_recv_wr();
                qp->cap.max_send_sge = po.cap_max_send_sge();
                qp->cap.max_recv_sge = po.cap_max_recv_sge();
                qp->cap.max_inline_data = po.cap_max_inline_data();
                break;
            }
            default:
                break;
        }
        ibv_extend_vdev_state st{};
        st.len = static_cast<uint32_t>(po.driver().data().size());
        std::memcpy(st.data, po.driver().data().data(), st.len);
        std::vector<UniqueFd> dfds;
        for (const std::string &name : po.driver().fds()) {
            UniqueFd fd;
            if (Status t = take(name, &fd); !t.isOk()) {
                return fail(t);
            }
            st.fds[st.fd_cnt++] = fd.get();
            dfds.push_back(std::move(fd));
        }
        ibv_extend_vdev_import env{};
        env.device = dev->info.name.c_str();
        env.context = ctx != nullptr ? ctx->verbs : nullptr;
        env.pd = pd != nullptr ? pd->pd : nullptr;
        if (kind == ObjectKind::kQp) {
            CqObject *scq = parentOf<CqObject>(*obj, ObjectKind::kCq, 0);
            CqObject *rcq = parentOf<CqObject>(*obj, ObjectKind::kCq, 1);
            SrqObject *srq = parentOf<SrqObject>(*obj, ObjectKind::kSrq);
            if (scq == nullptr || rcq == nullptr) {
                return fail(restoreError("QP " + hex(po.handle()) + " has no CQs"));
            }
            env.send_cq = scq->cq->cq;
            env.recv_cq = rcq->cq->cq;
            env.srq = srq != nullptr ? srq->srq->srq : nullptr;
        }
        env.ops = MappingManager::ops();
        env.relocate = relocThunk;
        env.arg = &reloc;
        void *made = nullptr;
        {
            ScopedBinding binding(s->memory_.get(), dev->verbs.provider());
            made = dev->verbs.importObject(obj->vdevKind(), &st, &env);
        }
        if (made == nullptr) {
            int err = errno != 0 ? errno : EIO;
            return fail(Status::fromErrno(err, std::string("the driver could not import ") + kindName(kind) +
                                                   " " + hex(po.handle()) + ": " + std::strerror(err)));
        }
        for (UniqueFd &fd : dfds) {
            (void)fd.release();  // the imported object owns them now
        }
        obj->adoptDriverObject(made);
        if (kind == ObjectKind::kContext) {
            auto *c = static_cast<ContextObject *>(obj.get());
            loader::ExtendOpen open = loader::openExtendContext(dev->driver, c->verbs);
            if (open.refusal != loader::ExtendRefusal::kNone) {
                (void)dev->verbs.closeDevice(c->verbs);
                return fail(
                    restoreError("the driver did not open an extension context on the restored device"));
            }
            c->ext = open.ext;
        }
        obj->handle = po.handle();
        QuotaValues amounts{};
        for (int q = 0; q < po.quota_size() && q < static_cast<int>(kQuotaCount); ++q) {
            amounts[static_cast<size_t>(q)] = po.quota(q);
        }
        obj->quota = broker_.quotas().restore(tenant, amounts);
        obj->queue_bytes = po.queue_bytes();
        obj->state_dirty = true;  // the next commit exports it from this process
        for (Object *u : obj->uses) {
            ++u->users;
        }
        s->objects_.emplace(obj->handle, std::move(obj));
        s->object_count_ = s->objects_.size();
    }
    for (const rpb::Reply &r : m.replies()) {
        s->addReply(StoredReply{r.key(), r.method(), r.code(), r.message(), r.details(), r.response()});
    }
    *objects = s->objects_.size();

    auto entry = std::make_unique<SessionEntry>();
    entry->file = std::move(file);
    entry->start_time = start;
    entry->header_logged = true;
    entry->compact_next = true;  // the first commit rewrites the log from this process's state
    for (auto &[h, o] : s->objects_) {
        s->touched_.push_back(h);  // every object is exported again from this process
    }
    if (store_.enabled()) {
        // What the store holds already: the fds came from it, under their canonical names; the
        // other names of the same files are the aliases the log recorded.
        for (auto &[name, fd] : sessionFds(*s, *entry)) {
            auto id = fileOf(*entry, fd);
            entry->stored[name] = id;
            SessionEntry::File &f = entry->files[id];
            ++f.names;
            auto a = aliases.find(name);
            if (a != aliases.end()) {
                entry->aliases[name] = a->second;
                f.canonical = a->second;
            } else if (f.canonical.empty()) {
                f.canonical = name;
            }
        }
    }
    {
        std::lock_guard lock(mu_);
        entries_[s->id()] = std::move(entry);
    }
    *out = s;
    return Status::ok();
}

RestoreReport RestartState::restore(std::vector<std::pair<std::string, UniqueFd>> &fds,
                                    std::vector<std::shared_ptr<Session>> *restored) {
    RestoreReport report;
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, UniqueFd> mine;
    for (auto it = fds.begin(); it != fds.end();) {
        if (it->first.rfind("ibvx.", 0) == 0) {
            if (mine.count(it->first) != 0) {
                report.problems.push_back("fd name " + it->first + " came back twice; the second is closed");
            } else {
                mine.emplace(it->first, std::move(it->second));
            }
            it = fds.erase(it);
        } else {
            ++it;
        }
    }
    if (mine.empty()) {
        return report;
    }
    report.restored = true;
    std::vector<std::string> all_names;
    for (auto &[name, fd] : mine) {
        all_names.push_back(name);
    }

    rpb::Global g;
    bool have_global = false;
    if (auto it = mine.find(kGlobalName); it != mine.end()) {
        auto file = StateFile::adopt(std::move(it->second));
        mine.erase(it);
        if (file.isOk()) {
            auto recs = file->records();
            if (recs.isOk() && recs->size() == 1 && (*recs)[0].first == 1 &&
                g.ParseFromString((*recs)[0].second)) {
                have_global = true;
                global_ = std::move(file).value();
            }
        }
    }
    std::string refuse;
    if (!have_global) {
        refuse = "no readable ibvx.global";
    } else if (g.format() > kSnapshotFormat) {
        refuse = "ibvx.global is format " + std::to_string(g.format()) + ", this broker reads up to " +
                 std::to_string(kSnapshotFormat) + " (a downgrade)";
    }
    if (!refuse.empty()) {
        report.problems.push_back("restore: " + refuse + ": every session ends");
        spdlog::error("restore: {}: every session of the previous broker ends", refuse);
        report.sessions_dropped = 0;
        for (auto &[name, fd] : mine) {
            if (name.size() > 6 && name.compare(name.size() - 6, 6, ".state") == 0) {
                ++report.sessions_dropped;
            }
        }
        mine.clear();
        dropNames(all_names);
        return report;
    }
    {
        std::lock_guard lock(mu_);
        restarts_ = g.restarts() + 1;
        last_restart_unix_ms_ = nowUnixMs();
        // A handover says when it began. A crash does not: the old process's last sign of life
        // (its heartbeat) bounds the gap from above.
        last_crash_ = g.handover_started_unix_ms() <= 0;
        const int64_t since = last_crash_ ? g.alive_unix_ms() : g.handover_started_unix_ms();
        last_took_ms_ = since > 0 && static_cast<uint64_t>(since) <= last_restart_unix_ms_
                            ? last_restart_unix_ms_ - static_cast<uint64_t>(since)
                            : 0;
    }
    MappingManager::instance().raiseRegionFloor(g.region_floor());
    broker_.raiseNextSessionId(g.next_session_id());

    // No engine runs before every object of its device is back (a QP's peer may come later).
    std::vector<Device *> paused;
    for (const DeviceInfo &info : broker_.devices().list()) {
        Device *dev = broker_.devices().find(info.name);
        if (dev != nullptr && dev->verbs.keepsAcrossRestart() && dev->verbs.setPaused(true) == 0) {
            paused.push_back(dev);
        }
    }
    std::vector<std::string> state_names;
    for (auto &[name, fd] : mine) {
        if (name.size() > 6 && name.compare(name.size() - 6, 6, ".state") == 0) {
            state_names.push_back(name);
        }
    }
    for (const std::string &name : state_names) {
        const std::string pre = name.substr(0, name.size() - 5);  // "ibvx.s<id>."
        UniqueFd fd = std::move(mine.at(name));
        mine.erase(name);
        std::string why;
        std::shared_ptr<Session> s;
        uint64_t objects = 0;
        auto file = StateFile::adopt(std::move(fd));
        if (!file.isOk()) {
            why = file.status().message();
        } else {
            auto recs = file->records();
            if (!recs.isOk()) {
                why = recs.status().message();
            } else {
                Status st = restoreSession(*recs, mine, std::move(file).value(), &s, &objects);
                if (!st.isOk()) {
                    why = st.message();
                } else if (Status a = broker_.adoptSession(s); !a.isOk()) {
                    broker_.endSession(s);
                    why = a.message();
                }
            }
        }
        // The session's fds as they came back: what it uses was duplicated, these close now.
        for (auto it = mine.begin(); it != mine.end();) {
            if (it->first.rfind(pre, 0) == 0) {
                it = mine.erase(it);
            } else {
                ++it;
            }
        }
        if (why.empty()) {
            ++report.sessions_kept;
            report.objects += objects;
            restored->push_back(s);
            spdlog::info("restore: session {} (pid {}) kept with {} object(s)", s->id(),
                         s->identity().creds.pid, objects);
            continue;
        }
        ++report.sessions_dropped;
        std::string line = "restore: " + name.substr(5, name.size() - 11) + ": " + why + "; ending it";
        spdlog::warn("{}", line);
        report.problems.push_back(line);
        // Its remaining fds close here; the store forgets every fd of the session.
        std::vector<std::string> names;
        for (auto it = mine.begin(); it != mine.end();) {
            if (it->first.rfind(pre, 0) == 0) {
                it = mine.erase(it);
            } else {
                ++it;
            }
        }
        for (const std::string &n : all_names) {
            if (n.rfind(pre, 0) == 0) {
                names.push_back(n);
            }
        }
        dropNames(names);
    }
    for (Device *dev : paused) {
        (void)dev->verbs.setPaused(false);
    }
    // Leftovers: fds no session claimed (a session that ended during the window, say).
    std::vector<std::string> left;
    for (auto &[name, fd] : mine) {
        left.push_back(name);
    }
    if (!left.empty()) {
        report.problems.push_back("restore: " + std::to_string(left.size()) + " unclaimed fd(s) closed");
        spdlog::info("restore: closing {} fd(s) no restored session claims", left.size());
    }
    mine.clear();
    dropNames(left);
    for (auto &s : *restored) {
        (void)broker_.commit(*s, StoredReply{});
    }
    report.restarts = restarts();
    report.took_ms = lastRestartTookMs();
    report.crash = lastRestartWasCrash();
    report.restore_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    return report;
}

}  // namespace ibvx::daemon
