#include "daemon/restart/restart_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <google/protobuf/arena.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/build_config.h"
#include "daemon/core/fault_hooks.h"
#include "daemon/core/mapping.h"
#include "daemon/core/objects.h"
#include "daemon/restart/state_records.h"
#include "ibv_extend/restart/v1/snapshot.pb.h"

namespace ibvx::daemon {

using namespace state;

namespace {

namespace rpb = ::ibv_extend::restart::v1;

// A successor starts its region ids this far above the floor a commit recorded, and a commit
// rewrites the floor once half of it is used: no call creates this many regions.
constexpr uint64_t kRegionSlack = uint64_t{1} << 20;

// A session's log is compacted once its appended records pass this and twice its last image.
constexpr uint64_t kLogFloorBytes = uint64_t{16} << 10;

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

template <typename Msg>
std::string serialized(const Msg &m) {
    std::string out;
    m.SerializeToString(&out);
    return out;
}

// A record's message on an arena whose first block is on the caller's stack: a QP's record holds
// its ~1 KiB driver blob, strings and repeated fields, each otherwise an allocation of its own,
// made and freed again on every commit.
template <typename Msg>
struct OnStack {
    alignas(std::max_align_t) char block[4096];
    google::protobuf::Arena arena{block, sizeof(block)};
    Msg &msg = *google::protobuf::Arena::CreateMessage<Msg>(&arena);
};

std::string objectRecord(uint64_t id, const Object *obj) {
    OnStack<rpb::Object> record;
    rpb::Object &out = record.msg;
    out.set_handle(obj->handle);
    out.set_kind(static_cast<uint32_t>(obj->kind));
    for (Object *u : obj->uses) {
        out.add_uses(u->handle);
    }
    out.mutable_quota()->Reserve(static_cast<int>(kQuotaCount));
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
            if (qp->opened) {
                out.set_opened_qp_num(qp->target->qp_num);
            }
            break;
        }
        case ObjectKind::kXrcd: {
            auto *x = static_cast<const XrcdObject *>(obj);
            out.set_xrcd_file(x->file ? xrcdFileName(id, obj->handle) : std::string());
            break;
        }
        case ObjectKind::kAh: {
            const ibv_ah_attr &a = static_cast<const AhObject *>(obj)->attr;
            rpb::AhRecord *ah = out.mutable_ah();
            ah->set_dgid(a.grh.dgid.raw, sizeof(a.grh.dgid.raw));
            ah->set_flow_label(a.grh.flow_label);
            ah->set_sgid_index(a.grh.sgid_index);
            ah->set_hop_limit(a.grh.hop_limit);
            ah->set_traffic_class(a.grh.traffic_class);
            ah->set_is_global(a.is_global != 0);
            ah->set_dlid(a.dlid);
            ah->set_sl(a.sl);
            ah->set_src_path_bits(a.src_path_bits);
            ah->set_static_rate(a.static_rate);
            ah->set_port_num(a.port_num);
            break;
        }
        default:
            break;
    }
    return serialized(out);
}

std::string chunkRecord(uint64_t id, const ChunkState &c) {
    OnStack<rpb::Chunk> record;
    rpb::Chunk &out = record.msg;
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

// What changed in a chunk the log holds (ChunkState::delta): O(the call's changes), where the
// chunk's whole record is O(the queues in it).
std::string chunkDeltaRecord(const ChunkState &c) {
    OnStack<rpb::ChunkDelta> record;
    rpb::ChunkDelta &out = record.msg;
    out.set_region(c.id);
    out.set_sent(c.sent);
    for (const BlockChange &b : c.changes) {
        rpb::BlockChange *m = out.add_changes();
        m->set_offset(b.offset);
        m->set_size(b.size);
        m->set_freed(b.freed);
    }
    return serialized(out);
}

std::string doorbellRecord(uint64_t id, const DoorbellState &d) {
    OnStack<rpb::Doorbell> record;
    rpb::Doorbell &out = record.msg;
    out.set_region(d.id);
    out.set_fd(doorbellName(id, d.id));
    out.set_fd_offset(d.fd_offset);
    out.set_map_size(d.map_size);
    out.set_refs(d.refs);
    out.set_sent(d.sent);
    out.set_old_address(d.page);
    return serialized(out);
}

// retired: keys whose replies the tenant retired since the last record that carried any (a
// replay drops them before it keeps this one).
std::string replyRecord(const StoredReplyView &r, const std::vector<uint64_t> &retired = {}) {
    OnStack<rpb::Reply> record;
    rpb::Reply &out = record.msg;
    out.set_key(r.key);
    out.mutable_retired()->Add(retired.begin(), retired.end());
    out.set_method(r.method.data(), r.method.size());
    out.set_code(r.code);
    out.set_message(r.message.data(), r.message.size());
    out.set_details(r.details.data(), r.details.size());
    out.set_response(r.response.data(), r.response.size());
    return serialized(out);
}

// The fds an object's record names: an MR's memory, a shared XRC domain's file, and the driver
// state's own.
std::vector<std::pair<std::string, int>> objectFds(uint64_t id, const Object &obj) {
    std::vector<std::pair<std::string, int>> out;
    if (obj.kind == ObjectKind::kMr) {
        const auto &mr = static_cast<const MrObject &>(obj);
        if (mr.fd) {
            out.emplace_back(mrName(id, obj.handle), mr.fd.get());
        }
    }
    if (obj.kind == ObjectKind::kXrcd) {
        const auto &x = static_cast<const XrcdObject &>(obj);
        if (x.file) {
            out.emplace_back(xrcdFileName(id, obj.handle), x.file.get());
        }
    }
    for (size_t i = 0; i < obj.driver_fds.size(); ++i) {
        out.emplace_back(driverFdName(id, obj.handle, i), obj.driver_fds[i].get());
    }
    return out;
}

// How a commit logs one kind of region (logRegions): its records, the name of its fd, and what
// the log holds of it, whose change is a change to log.
template <typename State>
struct RegionLog;
template <>
struct RegionLog<ChunkState> {
    static constexpr RecordType kDel = kChunkDel;
    static uint64_t logged(const ChunkState &c) { return c.version; }  // moves with every (de)allocation
    static std::string name(uint64_t id, RegionId r) { return chunkName(id, r); }
    static RecordType type(const ChunkState &c) { return c.delta ? kChunkBlocks : kChunkPut; }
    static std::string record(uint64_t id, const ChunkState &c) {
        return c.delta ? chunkDeltaRecord(c) : chunkRecord(id, c);
    }
};
template <>
struct RegionLog<DoorbellState> {
    static constexpr RecordType kDel = kDoorbellDel;
    static std::pair<int, bool> logged(const DoorbellState &d) { return {d.refs, d.sent}; }
    static std::string name(uint64_t id, RegionId r) { return doorbellName(id, r); }
    static RecordType type(const DoorbellState &) { return kDoorbellPut; }
    static std::string record(uint64_t id, const DoorbellState &d) { return doorbellRecord(id, d); }
};

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
        ASSIGN_OR_RETURN(global_, StateFile::create("ibvx-global", StateFile::Encoding::kPlain));
    }
    RETURN_IF_ERROR(writeGlobal());
    if (store_.enabled()) {
        RETURN_IF_ERROR(store_.add({{kGlobalName, global_.fd()}}));
    }
    return Status::ok();
}

void RestartState::beginHandover() {
    std::lock_guard lock(mu_);
    handover_started_ms_ = nowUnixMs();
}

void RestartState::noteServing() {
    std::lock_guard lock(mu_);
    const uint64_t now = nowUnixMs();
    if (restart_since_ms_ != 0 && restart_since_ms_ <= now) {
        last_took_ms_ = now - restart_since_ms_;
    }
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
    for (const QuotaEdit &e : broker_.quotas().runtimeEdits()) {
        rpb::QuotaOverride *o = g.add_quota_overrides();
        o->set_scope(static_cast<uint32_t>(e.scope));
        o->set_uid(e.uid);
        o->set_tenant(e.name);
        o->set_quota(static_cast<uint32_t>(e.quota));
        o->set_clear(!e.limit.has_value());
        o->set_limit(e.limit.value_or(0));
    }
    std::string bytes;
    g.SerializeToString(&bytes);
    return global_.compact({{uint8_t{1}, bytes}});  // one header record, rewritten whole
}

RestartState::NamedFds RestartState::sessionFds(const Session &s, const SessionEntry &e) const {
    NamedFds out;
    const uint64_t id = s.id();
    out.emplace_back(stateName(id), e.file.fd());
    if (s.channelFd() >= 0) {
        out.emplace_back(channelName(id), s.channelFd());
    }
    MemoryState mem = MappingManager::instance().exportState(s.memory());
    for (const ChunkState &c : mem.chunks) {
        out.emplace_back(chunkName(id, c.id), c.fd);
    }
    for (const DoorbellState &d : mem.doorbells) {
        out.emplace_back(doorbellName(id, d.id), d.fd);
    }
    for (const Object *obj : s.objectsParentsFirst()) {
        for (auto &named : objectFds(id, *obj)) {
            out.push_back(std::move(named));
        }
    }
    return out;
}

void RestartState::exportTouched(Session &s, SessionChanges &changes) {
    // Without its state the object cannot be imported: the restore ends this session.
    auto warn = [&](const Status &st) {
        if (!st.isOk()) {
            spdlog::warn("session {}: {}", s.id(), st.message());
        }
    };
    for (uint64_t handle : changes.touched) {
        warn(broker_.exportObject(s, handle));
    }
    // A parent is logged again only when its export changed: creating a QP leaves its context,
    // PD and CQs as they were (softnda: unless a new doorbell page came with it).
    for (uint64_t handle : changes.parents) {
        bool changed = false;
        warn(broker_.exportObject(s, handle, true, &changed));
        if (changed) {
            changes.touched.push_back(handle);
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

RestartState::Records RestartState::fullImage(Session &s, SessionEntry &e, const SessionChanges &changes,
                                              ObjectRecords *objects) {
    Records out;
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
    h.set_channel_fd(s.channelFd() >= 0 ? channelName(id) : std::string());
    out.emplace_back(kHeader, serialized(h));
    MemoryState mem = MappingManager::instance().exportState(s.memory());
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
    // An object whose latest record in the log is current (the commit did not touch it) is
    // copied as it is stored: no export, no encoding (a compaction of a 100-QP session rebuilt
    // every QP's record, ~15k instructions a call at a 32 KiB floor: docs/BENCHMARKS.md).
    std::string stored;
    if (e.placed) {
        auto bytes = e.file.storedBytes();
        if (bytes.isOk()) {
            stored = std::move(bytes).value();
        }
    }
    const std::set<uint64_t> fresh(changes.touched.begin(), changes.touched.end());
    for (const Object *obj : s.objectsParentsFirst()) {
        objects->emplace_back(out.size(), obj);
        std::string copy;
        if (!stored.empty() && fresh.count(obj->handle) == 0 &&
            e.file.storedRecord(stored, obj->logged_at, &copy)) {
            out.emplace_back(StateFile::kStoredRecord, std::move(copy));
            continue;
        }
        Status kept = broker_.keptState(s, obj->handle);
        if (!kept.isOk()) {
            spdlog::warn("session {}: {}", id, kept.message());  // as exportTouched: the restore ends it
        }
        out.emplace_back(kObjectPut, objectRecord(id, obj));
        broker_.releaseLoggedState(s, obj->handle);
    }
    e.reply_seq = 0;
    s.takeRetired();  // the image holds only the replies kept: none retired
    s.forEachReplySince(&e.reply_seq,
                        [&out](const StoredReplyView &r) { out.emplace_back(kReply, replyRecord(r)); });
    for (const auto &[name, canonical] : e.aliases) {
        out.emplace_back(kAlias, name + "\n" + canonical);
    }
    e.header_logged = true;
    e.compact_next = false;
    return out;
}

void RestartState::storeAdd(SessionEntry &e, const std::string &name, int fd) {
    if (!store_.enabled() || fd < 0) {
        return;
    }
    auto it = e.stored.find(name);
    if (it != e.stored.end() && isFile(fd, it->second)) {
        return;
    }
    auto id = fileOf(fd);
    if (it != e.stored.end()) {
        storeForget(e, name, it->second);  // the same name now carries another file
    }
    e.stored[name] = id;
    e.adds.push_back({name, fd, id});
}

std::pair<uint64_t, uint64_t> RestartState::fileOf(int fd) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        return {0, 0};
    }
    if (S_ISREG(st.st_mode)) {
        return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    }
    const std::pair<uint64_t, uint64_t> inode{static_cast<uint64_t>(st.st_dev),
                                              static_cast<uint64_t>(st.st_ino)};
    const pid_t self = ::getpid();
    std::lock_guard lock(files_mu_);
    for (auto [it, end] = probes_.equal_range(inode); it != end; ++it) {
        if (::syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, fd, files_.at(it->second).probe.get()) == 0) {
            return it->second;
        }
    }
    // Known from now on (no name yet: the commit's syncStore gives it its first).
    std::pair<uint64_t, uint64_t> id{UINT64_MAX, ++next_probe_};
    File &f = files_[id];
    f.probe.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    f.inode = inode;
    probes_.emplace(inode, id);
    return id;
}

bool RestartState::isFile(int fd, std::pair<uint64_t, uint64_t> file) {
    if (file.first != UINT64_MAX) {
        struct stat st {};
        return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
               static_cast<uint64_t>(st.st_dev) == file.first &&
               static_cast<uint64_t>(st.st_ino) == file.second;
    }
    const pid_t self = ::getpid();
    std::lock_guard lock(files_mu_);
    auto f = files_.find(file);
    return f != files_.end() && f->second.probe &&
           ::syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, fd, f->second.probe.get()) == 0;
}

void RestartState::storeForget(SessionEntry &e, const std::string &name, std::pair<uint64_t, uint64_t> id) {
    e.aliases.erase(name);
    e.forgets.push_back(id);
}

void RestartState::dropFileRef(std::pair<uint64_t, uint64_t> id) {
    auto f = files_.find(id);
    if (f == files_.end()) {
        return;
    }
    if (f->second.names > 0 && --f->second.names == 0) {
        (void)store_.remove(f->second.canonical);
        for (auto [it, end] = probes_.equal_range(f->second.inode); it != end; ++it) {
            if (it->second == id) {
                probes_.erase(it);
                break;
            }
        }
        files_.erase(f);
    }
}

void RestartState::syncStore(SessionEntry &e, uint64_t id) {
    NamedFds fresh;
    // The table and the store change together under files_mu_: another session cannot alias a
    // file whose canonical is not stored yet, nor store a file under a name about to be removed.
    std::lock_guard lock(files_mu_);
    for (auto file : e.forgets) {  // first: a name may leave and another take its file
        dropFileRef(file);
    }
    e.forgets.clear();
    for (SessionEntry::Add &add : e.adds) {
        File &f = files_[add.file];
        if (f.names++ == 0) {
            f.canonical = add.name;
            fresh.emplace_back(add.name, add.fd);
            continue;
        }
        e.aliases[add.name] = f.canonical;
        e.new_aliases.emplace_back(kAlias, add.name + "\n" + f.canonical);
    }
    e.adds.clear();
    if (fresh.empty()) {
        return;
    }
    Status st = store_.add(fresh);
    if (!st.isOk() && !e.warned) {
        e.warned = true;
        spdlog::warn(
            "session {}: the fd store did not take every fd ({}): it survives "
            "ibv-extendctl restart, not a crash",
            id, st.message());
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
    ASSIGN_OR_RETURN(SessionEntry * e, entryOf(s));
    SessionChanges &changes = e->changes;
    s.takeChanges(&changes);
    // Only objects a control call touched are exported again, and only what changed is logged:
    // a commit costs the call's changes, whatever the session holds.
    exportTouched(s, changes);
    Status written =
        !e->header_logged || e->compact_next ? writeImage(s, *e, changes) : appendChanges(s, *e, changes);
    if (!written.isOk()) {
        e->compact_next = true;  // the log may be behind: the next commit rewrites it whole
        e->placed = false;       // ... from the objects themselves: their records may be stale
        return written;
    }
    broker_.chargeStateBytes(s, e->file.compactedBytes() + e->file.appendedBytes());
    return keepRegionFloor();
}

StatusOr<RestartState::SessionEntry *> RestartState::entryOf(const Session &s) {
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
    return slot.get();
}

Status RestartState::writeImage(Session &s, SessionEntry &e, const SessionChanges &changes) {
    if (store_.enabled()) {
        std::set<std::string> now;
        for (auto &[name, fd] : sessionFds(s, e)) {
            now.insert(name);
            storeAdd(e, name, fd);
        }
        for (auto it = e.stored.begin(); it != e.stored.end();) {
            if (now.count(it->first) == 0) {
                storeForget(e, it->first, it->second);
                it = e.stored.erase(it);
            } else {
                ++it;
            }
        }
        syncStore(e, s.id());  // the fds are in the store before the state names them
    }
    e.new_aliases.clear();  // the image carries every alias
    ObjectRecords objects;
    Records image = fullImage(s, e, changes, &objects);
    std::vector<StateFile::Placement> placed;
    RETURN_IF_ERROR(e.file.compact(image, &placed));
    notePlacements(objects, placed);
    e.placed = true;
    return Status::ok();
}

void RestartState::notePlacements(const ObjectRecords &objects,
                                  const std::vector<StateFile::Placement> &placed) {
    for (const auto &[index, obj] : objects) {
        obj->logged_at = index < placed.size() ? placed[index] : 0;
    }
}

Status RestartState::appendChanges(Session &s, SessionEntry &e, const SessionChanges &changes) {
    const uint64_t id = s.id();
    Records records;
    records.reserve(8);  // a call's regions, objects and reply: grown by doubling, three allocations
    MemoryState mem = MappingManager::instance().exportChanges(s.memory(), e.chunks);
    logRegions(id, e, mem.chunks, e.chunks, records);
    logRegions(id, e, mem.doorbells, e.doorbells, records);
    ObjectRecords objects;
    logObjects(s, e, changes, records, &objects);
    std::vector<uint64_t> retired = s.takeRetired();  // taken first: a retirement after it waits
    s.forEachReplySince(&e.reply_seq, [&records, &retired](const StoredReplyView &r) {
        records.emplace_back(kReply, replyRecord(r, retired));
        retired.clear();  // the first new reply carries them
    });
    if (!retired.empty()) {
        s.untakeRetired(std::move(retired));  // no reply this commit: the next one carries them
    }
    const bool stores = !e.adds.empty();
    syncStore(e, id);  // the fds are in the store before the log names them; it makes the aliases
    if (stores) {
        crashOnceAt("StoredNotLogged");  // new fds in the store, the log not naming them (tests only)
    }
    for (auto &a : e.new_aliases) {
        records.push_back(std::move(a));
    }
    e.new_aliases.clear();
    std::vector<StateFile::Placement> placed;
    Status written = e.file.append(records, &placed);
    if (written.isOk()) {
        notePlacements(objects, placed);
    }
    // A long-lived session's log is rewritten once what it appended passes its image (each
    // compaction writes no more than was appended since the last: amortized O(1)), so the log
    // stays within twice the image. Every session holds its log in memory (a memfd): at three
    // times the image, sessions of 100 QPs held 1.6 KiB of log per QP (ibv-extend-perf, scale).
    if (e.file.appendedBytes() > std::max<uint64_t>(kLogFloorBytes, e.file.compactedBytes())) {
        e.compact_next = true;
    }
    return written;
}

template <typename State, typename Logged>
void RestartState::logRegions(uint64_t id, SessionEntry &e, const std::vector<State> &now,
                              std::map<RegionId, Logged> &logged, Records &records) {
    using Log = RegionLog<State>;
    // Sorted ids, not a std::set: a node allocation per region on every commit.
    std::vector<RegionId> live;
    live.reserve(now.size());
    for (const State &r : now) {
        live.push_back(r.id);
        auto it = logged.find(r.id);
        if (it != logged.end() && it->second == Log::logged(r)) {
            continue;
        }
        records.emplace_back(Log::type(r), Log::record(id, r));
        if (store_.enabled()) {
            storeAdd(e, Log::name(id, r.id), r.fd);
        }
        logged[r.id] = Log::logged(r);
    }
    std::sort(live.begin(), live.end());
    for (auto it = logged.begin(); it != logged.end();) {
        if (!std::binary_search(live.begin(), live.end(), it->first)) {
            records.emplace_back(Log::kDel, u64Payload(it->first));
            if (store_.enabled()) {
                storeRemovePrefix(e, Log::name(id, it->first));
            }
            it = logged.erase(it);
        } else {
            ++it;
        }
    }
}

void RestartState::logObjects(Session &s, SessionEntry &e, const SessionChanges &changes, Records &records,
                              ObjectRecords *objects) {
    const uint64_t id = s.id();
    for (uint64_t h : changes.erased) {
        records.emplace_back(kObjectDel, u64Payload(h));
        if (store_.enabled()) {  // without the fd store nothing is stored under these names
            storeRemovePrefix(e, mrName(id, h));
            storeRemovePrefix(e, xrcdFileName(id, h));
            storeRemovePrefix(e, driverFdsPrefix(id, h));
        }
    }
    std::set<uint64_t> seen;
    for (uint64_t h : changes.touched) {
        const Object *obj = s.object(h);
        if (obj == nullptr || !seen.insert(h).second) {
            continue;
        }
        objects->emplace_back(records.size(), obj);
        records.emplace_back(kObjectPut, objectRecord(id, obj));
        if (store_.enabled()) {
            for (const auto &[name, fd] : objectFds(id, *obj)) {
                storeAdd(e, name, fd);
            }
        }
        // Logged: should the append fail, the next commit writes an image, which exports it again.
        broker_.releaseLoggedState(s, h);
    }
}

Status RestartState::keepRegionFloor() {
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
        // Its names go; a file another session still uses stays stored (under whichever name).
        std::lock_guard lock(files_mu_);
        for (auto file : e->forgets) {
            dropFileRef(file);
        }
        for (const auto &named : e->stored) {  // a name still queued to add was never counted
            if (std::none_of(e->adds.begin(), e->adds.end(),
                             [&named](const SessionEntry::Add &a) { return a.name == named.first; })) {
                dropFileRef(named.second);
            }
        }
    }
}

RestartState::Plan RestartState::plan() {
    Plan p;
    std::set<std::string> drivers;
    // Sessions kept so far, with the creators of the XRC targets they opened (OpenQp): a handle
    // comes back only with its target, so a session whose target's creator is dropped is dropped
    // too, and so on through the sessions that opened its own targets.
    std::map<uint64_t, std::pair<std::shared_ptr<Session>, std::set<uint64_t>>> kept;
    for (auto &s : broker_.sessions()) {
        auto held = s->hold();
        bool keeps = s->attached();
        std::set<uint64_t> creators;
        for (const Object *obj : s->objectsParentsFirst()) {
            if (obj->kind == ObjectKind::kQp) {
                if (const auto *qp = static_cast<const QpObject *>(obj); qp->opened) {
                    creators.insert(qp->target->creator_session);
                }
            }
            Device *dev = obj->device();
            if (dev == nullptr || !dev->verbs.keepsAcrossRestart()) {
                keeps = false;
                if (dev != nullptr) {
                    drivers.insert(dev->info.provider);
                }
            } else if (const char *why = obj->restartDropReason(); why != nullptr) {
                keeps = false;  // its record carries no driver state (Object::restartDropReason)
                drivers.insert(dev->info.provider + " (" + why + ")");
            }
        }
        if (keeps) {
            kept[s->id()] = {s, std::move(creators)};
        } else {
            p.to_drop.push_back(s);
        }
    }
    for (bool again = true; again;) {
        again = false;
        for (auto it = kept.begin(); it != kept.end();) {
            const std::set<uint64_t> &creators = it->second.second;
            if (std::all_of(creators.begin(), creators.end(),
                            [&](uint64_t c) { return kept.count(c) != 0; })) {
                ++it;
                continue;
            }
            drivers.insert("(XRC targets opened from a dropped session)");
            p.to_drop.push_back(std::move(it->second.first));
            it = kept.erase(it);
            again = true;
        }
    }
    p.kept = static_cast<uint32_t>(kept.size());
    p.dropped = static_cast<uint32_t>(p.to_drop.size());
    p.dropping_drivers.assign(drivers.begin(), drivers.end());
    return p;
}

StatusOr<std::vector<std::pair<std::string, int>>> RestartState::handover() {
    std::vector<std::pair<std::string, int>> out;
    {
        std::lock_guard lock(mu_);
        if (handover_started_ms_ == 0) {
            handover_started_ms_ = nowUnixMs();  // the successor's "took" counts the commits below
        }
    }
    for (auto &s : broker_.sessions()) {
        {
            // The call counts live in the header, which only an image writes: a session that
            // made calls since its last image gets a new one, so the successor goes on from
            // the exact count.
            auto held = s->hold();
            CallCounts now = callsOf(*s);
            std::lock_guard lock(mu_);
            auto it = entries_.find(s->id());
            if (it != entries_.end()) {
                SessionEntry &e = *it->second;
                e.compact_next =
                    e.compact_next || now.calls != e.image_calls.calls || now.errors != e.image_calls.errors;
                // The successor's image is exported anew, every object's state as it is now.
                e.placed = false;
            }
        }
        RETURN_IF_ERROR(broker_.commit(*s, StoredReply{}));
    }
    RETURN_IF_ERROR(writeGlobal());
    out.emplace_back(kGlobalName, global_.fd());
    for (auto &s : broker_.sessions()) {
        auto held = s->hold();
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

}  // namespace ibvx::daemon
