// The restore (docs/restart.md, "The restore"): sessions rebuilt from the fds a previous broker
// process left, their objects made again through the core (Broker::adopt), parents first. A
// session that cannot come back ends cleanly; nothing of it reaches another session.
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <google/protobuf/arena.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <set>
#include <string_view>

#include "daemon/core/mapping.h"
#include "daemon/restart/restart_state.h"
#include "daemon/restart/state_records.h"
#include "ibv_extend/restart/v1/snapshot.pb.h"

namespace ibvx::daemon {

using namespace state;

namespace {

namespace rpb = ::ibv_extend::restart::v1;

Status restoreError(const std::string &what) {
    return Status(Code::kFailedPrecondition, EINVAL, what);
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

// A session's log replayed into one image: its header, and the last put of everything not
// deleted since. The header and the objects live in the replay's arena: a 10,000-object image
// is ~50,000 protobuf allocations (messages, strings, repeated fields) that malloc would place
// one by one in memory the new process touches for the first time, then free one by one.
class LogReplay {
  public:
    LogReplay()
        : arena_(arenaOptions()), header_(google::protobuf::Arena::CreateMessage<rpb::Session>(&arena_)) {}

    // false: the record does not parse.
    bool apply(uint8_t type, std::string_view payload);
    // The header with the objects (parents first), chunks, doorbells and the newest replies;
    // the replay's own, valid while it lives. Called once.
    StatusOr<const rpb::Session *> image();
    std::map<std::string, std::string> &aliases() { return aliases_; }  // name -> canonical

  private:
    template <typename Msg, typename Key>
    static bool put(std::map<uint64_t, Msg> &into, std::string_view payload, Key key) {
        Msg m;
        if (!parse(m, payload)) {
            return false;
        }
        into[key(m)] = std::move(m);
        return true;
    }
    template <typename Msg>
    static bool erase(std::map<uint64_t, Msg> &from, std::string_view payload) {
        uint64_t key = 0;
        bool ok = u64From(payload, &key);
        from.erase(key);
        return ok;
    }

    static bool parse(google::protobuf::MessageLite &m, std::string_view payload) {
        return m.ParseFromArray(payload.data(), static_cast<int>(payload.size()));
    }
    static google::protobuf::ArenaOptions arenaOptions() {
        google::protobuf::ArenaOptions o;
        o.start_block_size = 4096;
        o.max_block_size = 64 * 1024;  // under malloc's mmap threshold: blocks come from its heap
        return o;
    }
    bool putObject(std::string_view payload);
    bool putChunk(std::string_view payload);
    bool changeChunk(std::string_view payload);

    google::protobuf::Arena arena_;  // first: the messages below are its
    rpb::Session *header_;
    bool have_header_ = false;
    // The latest put of each handle (an earlier one stays in the arena, unused, until the end).
    std::map<uint64_t, rpb::Object *> objects_;
    // A chunk's record, and its used blocks (offset -> size) apart, as the deltas change them.
    std::map<uint64_t, rpb::Chunk> chunks_;
    std::map<uint64_t, std::map<uint32_t, uint32_t>> blocks_;
    std::map<uint64_t, rpb::Doorbell> doorbells_;
    std::deque<rpb::Reply> replies_;
    std::map<std::string, std::string> aliases_;
};

bool LogReplay::apply(uint8_t type, std::string_view payload) {
    switch (type) {
        case kHeader: {
            bool ok = !have_header_ && parse(*header_, payload);
            have_header_ = true;
            return ok;
        }
        case kObjectPut:
            return putObject(payload);
        case kObjectDel:
            return erase(objects_, payload);
        case kChunkPut:
            return putChunk(payload);
        case kChunkDel:
            if (uint64_t region = 0; u64From(payload, &region)) {
                blocks_.erase(region);
            }
            return erase(chunks_, payload);
        case kChunkBlocks:
            return changeChunk(payload);
        case kDoorbellPut:
            return put(doorbells_, payload, [](const rpb::Doorbell &d) { return d.region(); });
        case kDoorbellDel:
            return erase(doorbells_, payload);
        case kReply: {
            rpb::Reply r;
            bool ok = parse(r, payload);
            for (uint64_t key : r.retired()) {
                std::erase_if(replies_, [key](const rpb::Reply &kept) { return kept.key() == key; });
            }
            r.clear_retired();
            replies_.push_back(std::move(r));
            if (replies_.size() > Session::kMaxReplies) {
                replies_.pop_front();
            }
            return ok;
        }
        case kAlias: {
            size_t nl = payload.find('\n');
            if (nl == std::string::npos) {
                return false;
            }
            aliases_[std::string(payload.substr(0, nl))] = std::string(payload.substr(nl + 1));
            return true;
        }
        default:
            return false;
    }
}

bool LogReplay::putObject(std::string_view payload) {
    auto *o = google::protobuf::Arena::CreateMessage<rpb::Object>(&arena_);
    if (!parse(*o, payload)) {
        return false;
    }
    objects_[o->handle()] = o;
    return true;
}

bool LogReplay::putChunk(std::string_view payload) {
    rpb::Chunk c;
    if (!parse(c, payload)) {
        return false;
    }
    auto &blocks = blocks_[c.region()];
    blocks.clear();
    for (const rpb::Block &b : c.used()) {
        blocks[b.offset()] = b.size();  // a repeated offset is caught by restoreSession's checks
    }
    c.clear_used();
    chunks_[c.region()] = std::move(c);
    return true;
}

// A delta applies to the chunk's latest record, in order: a free names a block that is there
// (offset and size), an allocation an offset that is free. Anything else is a corrupt log.
bool LogReplay::changeChunk(std::string_view payload) {
    rpb::ChunkDelta d;
    if (!parse(d, payload)) {
        return false;
    }
    auto chunk = chunks_.find(d.region());
    if (chunk == chunks_.end()) {
        return false;
    }
    chunk->second.set_sent(d.sent());
    auto &blocks = blocks_[d.region()];
    for (const rpb::BlockChange &b : d.changes()) {
        auto it = blocks.find(b.offset());
        if (b.freed()) {
            if (it == blocks.end() || it->second != b.size()) {
                return false;
            }
            blocks.erase(it);
        } else if (it == blocks.end()) {
            blocks.emplace(b.offset(), b.size());
        } else {
            return false;
        }
    }
    return true;
}

StatusOr<const rpb::Session *> LogReplay::image() {
    if (!have_header_) {
        return restoreError("its state has no header");
    }
    std::vector<rpb::Object *> all;
    all.reserve(objects_.size());
    for (auto &[h, o] : objects_) {
        all.push_back(o);
    }
    header_->mutable_objects()->Reserve(static_cast<int>(all.size()));
    for (rpb::Object *o :
         inParentsFirstOrder(all, [](const rpb::Object *m) { return static_cast<ObjectKind>(m->kind()); })) {
        header_->mutable_objects()->AddAllocated(o);  // the same arena: taken, not copied
    }
    objects_.clear();
    for (auto &[r, c] : chunks_) {
        for (auto [offset, size] : blocks_[r]) {
            rpb::Block *b = c.add_used();
            b->set_offset(offset);
            b->set_size(size);
        }
        *header_->add_chunks() = std::move(c);
    }
    for (auto &[r, d] : doorbells_) {
        *header_->add_doorbells() = std::move(d);
    }
    for (auto &r : replies_) {
        *header_->add_replies() = std::move(r);
    }
    return header_;
}

// The fds that came back for a session, by the names its state gives them: a name's own fd, or
// its canonical's (the store kept one copy of a file stored under several names). Each take is
// a new fd; the originals close when the restore is over.
class ReturnedFds {
  public:
    ReturnedFds(const std::map<std::string, UniqueFd> &fds, const std::map<std::string, std::string> &aliases)
        : fds_(fds), aliases_(aliases) {}

    Status take(const std::string &name, UniqueFd *fd) const {
        auto it = fds_.find(name);
        if (it == fds_.end()) {
            auto a = aliases_.find(name);
            if (a != aliases_.end()) {
                it = fds_.find(a->second);
            }
        }
        if (name.empty() || it == fds_.end()) {
            return restoreError("missing fd " + (name.empty() ? std::string("(unnamed)") : name));
        }
        fd->reset(::fcntl(it->second.get(), F_DUPFD_CLOEXEC, 0));
        if (!*fd) {
            return Status::fromErrno(errno, "cannot duplicate fd " + name);
        }
        return Status::ok();
    }

  private:
    const std::map<std::string, UniqueFd> &fds_;
    const std::map<std::string, std::string> &aliases_;
};

StatusOr<SessionToken> tokenOf(const rpb::Session &m) {
    SessionToken token{};
    if (m.token().size() != token.size() || m.id() == 0) {
        return restoreError("its state has no valid token or id");
    }
    std::memcpy(token.data(), m.token().data(), token.size());
    return token;
}

// The session's memory as its state records it, mapped anew (reloc learns old -> new addresses).
StatusOr<std::unique_ptr<SessionMemory>> restoreMemory(const rpb::Session &m, const ReturnedFds &fds,
                                                       Relocations *reloc) {
    MemoryState ms;
    for (const rpb::Chunk &c : m.chunks()) {
        ChunkState cs;
        cs.id = c.region();
        RETURN_IF_ERROR(fds.take(c.fd(), &cs.owned));
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
        RETURN_IF_ERROR(fds.take(d.fd(), &ds.owned));
        ds.fd_offset = d.fd_offset();
        ds.map_size = d.map_size();
        ds.refs = d.refs();
        ds.sent = d.sent();
        ds.page = d.old_address();
        ds.fd = ds.owned.get();
        ms.doorbells.push_back(std::move(ds));
    }
    return MappingManager::instance().restoreSession(m.id(), std::move(ms), reloc);
}

SessionHistory historyOf(const rpb::Session &m) {
    SessionHistory h;
    h.created_unix_ms = static_cast<uint64_t>(std::max<int64_t>(m.created_unix_ms(), 0));
    h.calls = {m.rpc_calls(), m.rpc_errors()};
    for (const rpb::Reply &r : m.replies()) {
        h.replies.push_back(
            StoredReply{r.key(), r.method(), r.code(), r.message(), r.details(), r.response()});
    }
    return h;
}

// An AH's attributes as its record kept them (written by this broker's kind, so in range).
ibv_ah_attr ahOf(const rpb::AhRecord &r) {
    ibv_ah_attr a{};
    std::memcpy(a.grh.dgid.raw, r.dgid().data(), std::min(r.dgid().size(), sizeof(a.grh.dgid.raw)));
    a.grh.flow_label = r.flow_label();
    a.grh.sgid_index = static_cast<uint8_t>(r.sgid_index());
    a.grh.hop_limit = static_cast<uint8_t>(r.hop_limit());
    a.grh.traffic_class = static_cast<uint8_t>(r.traffic_class());
    a.is_global = r.is_global() ? 1 : 0;
    a.dlid = static_cast<uint16_t>(r.dlid());
    a.sl = static_cast<uint8_t>(r.sl());
    a.src_path_bits = static_cast<uint8_t>(r.src_path_bits());
    a.static_rate = static_cast<uint8_t>(r.static_rate());
    a.port_num = static_cast<uint8_t>(r.port_num());
    return a;
}

// What Broker::adopt needs of one object record, its fds taken.
StatusOr<ObjectImport> importOf(const rpb::Object &po, const ReturnedFds &fds) {
    ObjectImport in;
    in.handle = po.handle();
    in.kind = static_cast<ObjectKind>(po.kind());
    in.uses.assign(po.uses().begin(), po.uses().end());
    in.device = po.device();
    for (int q = 0; q < po.quota_size() && q < static_cast<int>(kQuotaCount); ++q) {
        in.quota[static_cast<size_t>(q)] = po.quota(q);
    }
    in.queue_bytes = po.queue_bytes();
    in.driver_state = po.driver().data();
    if (in.kind == ObjectKind::kMr) {
        // An MR on device memory has no memory of its own (its DM's is in the session's arena):
        // no fd; any other MR without one fails to map (Broker::adopt).
        if (!po.mr_fd().empty()) {
            RETURN_IF_ERROR(fds.take(po.mr_fd(), &in.mr.fd));
        }
        in.mr.fd_offset = po.mr_offset();
        in.mr.length = po.mr_length();
        in.mr.map_length = po.mr_map_length();
        in.mr.old_address = po.mr_old_address();
    }
    if (in.kind == ObjectKind::kXrcd && !po.xrcd_file().empty()) {
        RETURN_IF_ERROR(fds.take(po.xrcd_file(), &in.xrcd_file));
    }
    for (const std::string &name : po.driver().fds()) {
        RETURN_IF_ERROR(fds.take(name, &in.driver_fds.emplace_back()));
    }
    if (in.kind == ObjectKind::kQp) {
        // Checked before it becomes an ibv_qp_type: outside the enum's values it is no value at all.
        const uint32_t type = po.qp_type();
        if (type != IBV_QPT_RC && type != IBV_QPT_UC && type != IBV_QPT_UD && type != IBV_QPT_XRC_SEND &&
            type != IBV_QPT_XRC_RECV) {
            return invalidArgument("QP " + std::to_string(po.handle()) + " has type " + std::to_string(type) +
                                   ", not one the broker makes (RC, UC, UD, XRC)");
        }
        in.qp.type = static_cast<ibv_qp_type>(type);
        in.qp.sq_sig_all = po.sq_sig_all();
        in.qp.has_srq = po.has_srq();
        in.qp.cap.max_send_wr = po.cap_max_send_wr();
        in.qp.cap.max_recv_wr = po.cap_max_recv_wr();
        in.qp.cap.max_send_sge = po.cap_max_send_sge();
        in.qp.cap.max_recv_sge = po.cap_max_recv_sge();
        in.qp.cap.max_inline_data = po.cap_max_inline_data();
        in.qp.opened_num = po.opened_qp_num();
        if (in.qp.opened_num != 0 &&
            (in.qp.type != IBV_QPT_XRC_RECV || !in.driver_state.empty() || !in.driver_fds.empty())) {
            return invalidArgument("QP " + std::to_string(po.handle()) +
                                   " names an opened XRC target but is no bare XRC target handle");
        }
    }
    if (in.kind == ObjectKind::kAh) {
        in.ah = ahOf(po.ah());
    }
    return in;
}

// The fds named ibvx.* among those that came back, by name; the others (the listening socket)
// stay in fds.
std::map<std::string, UniqueFd> takeStateFds(std::vector<std::pair<std::string, UniqueFd>> &fds,
                                             RestoreReport *report) {
    std::map<std::string, UniqueFd> mine;
    for (auto it = fds.begin(); it != fds.end();) {
        if (it->first.rfind("ibvx.", 0) == 0) {
            if (mine.count(it->first) != 0) {
                report->problems.push_back("fd name " + it->first + " came back twice; the second is closed");
            } else {
                mine.emplace(it->first, std::move(it->second));
            }
            it = fds.erase(it);
        } else {
            ++it;
        }
    }
    return mine;
}

// Every device whose driver hands over, paused: no engine runs before every object of its
// device is back (a QP's peer may come later).
std::vector<Device *> pauseHandingOver(DeviceRegistry &devices) {
    std::vector<Device *> paused;
    for (const DeviceInfo &info : devices.list()) {
        Device *dev = devices.find(info.name);
        if (dev != nullptr && dev->verbs.keepsAcrossRestart() && dev->verbs.setPaused(true) == 0) {
            paused.push_back(dev);
        }
    }
    return paused;
}

}  // namespace

Status RestartState::restoreSession(StateFile file, std::map<std::string, UniqueFd> &fds,
                                    std::shared_ptr<Session> *out, uint64_t *objects,
                                    std::vector<ObjectImport> *opened) {
    // Replayed as the records are read: the log is never held decoded beside its image, whose
    // memory a restore of 10,000 objects touches for the first time (docs/restart.md, "Measured").
    LogReplay replay;
    RETURN_IF_ERROR(file.forEachRecord([&replay](uint8_t type, std::string_view payload) {
        if (!replay.apply(type, payload)) {
            return restoreError("its state holds a record that does not parse (type " + std::to_string(type) +
                                ")");
        }
        return Status::ok();
    }));
    const std::map<std::string, std::string> aliases = std::move(replay.aliases());
    ASSIGN_OR_RETURN(const rpb::Session *image, replay.image());
    const rpb::Session &m = *image;
    ASSIGN_OR_RETURN(SessionToken token, tokenOf(m));
    const ReturnedFds returned(fds, aliases);
    PeerIdentity identity = fromProto(m.identity());
    const pid_t pid = identity.creds.pid;
    // The tenant must be the same process: a pid reused during the window is someone else.
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    const uint64_t start = processStartTime(pid);
    if (!pidfd || start == 0 || start != m.identity().start_time()) {
        return Status(Code::kNotFound, ESRCH, "its process exited during the restart; reclaimed");
    }
    UniqueFd channel;
    RETURN_IF_ERROR(returned.take(m.channel_fd(), &channel));
    Relocations reloc;
    ASSIGN_OR_RETURN(std::unique_ptr<SessionMemory> memory, restoreMemory(m, returned, &reloc));
    auto s = std::make_shared<Session>(m.id(), token, identity, m.client_name(), std::move(pidfd),
                                       std::move(memory), std::move(channel), historyOf(m));
    std::vector<ObjectImport> handles;
    for (const rpb::Object &po : m.objects()) {
        auto in = importOf(po, returned);
        if (in.isOk() && in->kind == ObjectKind::kQp && in->qp.opened_num != 0) {
            handles.push_back(std::move(in).value());  // nothing in its session uses it: it waits
            continue;
        }
        Status st = in.isOk() ? broker_.adopt(*s, std::move(in).value(), reloc) : in.status();
        if (!st.isOk()) {
            broker_.endSession(s);  // what was adopted goes through the ordinary destroy path
            return st;
        }
    }
    *objects = s->objectCount();
    *opened = std::move(handles);
    keepEntry(*s, std::move(file), start, aliases);
    *out = s;
    return Status::ok();
}

void RestartState::keepEntry(const Session &s, StateFile file, uint64_t start_time,
                             const std::map<std::string, std::string> &aliases) {
    auto entry = std::make_unique<SessionEntry>();
    entry->file = std::move(file);
    entry->start_time = start_time;
    entry->header_logged = true;
    entry->compact_next = true;  // the first commit rewrites the log from this process's state
    if (store_.enabled()) {
        // What the store holds already: the fds came from it, under their canonical names; the
        // other names of the same files are the aliases the log recorded, whose canonical may be
        // another session's name (a file two sessions share), of one that has ended even.
        auto held = s.hold();
        for (auto &[name, fd] : sessionFds(s, *entry)) {
            auto id = fileOf(fd);
            entry->stored[name] = id;
            std::lock_guard files(files_mu_);
            File &f = files_[id];
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
    std::lock_guard lock(mu_);
    entries_[s.id()] = std::move(entry);
}

std::string RestartState::adoptGlobal(std::map<std::string, UniqueFd> &fds, rpb::Global *g) {
    bool have_global = false;
    if (auto it = fds.find(kGlobalName); it != fds.end()) {
        auto file = StateFile::adopt(std::move(it->second), StateFile::Encoding::kPlain);
        fds.erase(it);
        if (file.isOk()) {
            auto recs = file->records();
            if (recs.isOk() && recs->size() == 1 && (*recs)[0].first == 1 &&
                g->ParseFromString((*recs)[0].second)) {
                have_global = true;
                global_ = std::move(file).value();
            }
        }
    }
    if (!have_global) {
        return "no readable ibvx.global";
    }
    if (g->format() > kSnapshotFormat) {
        return "ibvx.global is format " + std::to_string(g->format()) + ", this broker reads up to " +
               std::to_string(kSnapshotFormat) + " (a downgrade)";
    }
    return "";
}

void RestartState::applyQuotaEdits(const rpb::Global &g, RestoreReport *report) {
    for (const rpb::QuotaOverride &o : g.quota_overrides()) {
        QuotaEdit e;
        e.scope = static_cast<QuotaScope>(o.scope());
        e.uid = o.uid();
        e.name = o.tenant();
        e.quota = static_cast<Quota>(o.quota());
        if (!o.clear()) {
            e.limit = o.limit();
        }
        Status st =
            o.scope() <= static_cast<uint32_t>(QuotaScope::kNamespace)
                ? broker_.quotas().apply(e)
                : Status(Code::kInvalidArgument, EINVAL, "no quota scope " + std::to_string(o.scope()));
        if (!st.isOk()) {
            report->problems.push_back("restore: a runtime quota change is not applied: " + st.message());
            spdlog::warn("{}", report->problems.back());
        }
    }
}

void RestartState::noteRestart(const rpb::Global &g) {
    std::lock_guard lock(mu_);
    restarts_ = g.restarts() + 1;
    last_restart_unix_ms_ = nowUnixMs();
    // A handover says when it began. A crash does not: the old process's last sign of life
    // (its heartbeat) bounds the gap from above.
    last_crash_ = g.handover_started_unix_ms() <= 0;
    const int64_t since = last_crash_ ? g.alive_unix_ms() : g.handover_started_unix_ms();
    restart_since_ms_ =
        since > 0 && static_cast<uint64_t>(since) <= last_restart_unix_ms_ ? static_cast<uint64_t>(since) : 0;
    // Until noteServing(): the restore below is not counted yet.
    last_took_ms_ = restart_since_ms_ != 0 ? last_restart_unix_ms_ - restart_since_ms_ : 0;
}

void RestartState::restoreOne(const std::string &state_name, std::map<std::string, UniqueFd> &fds,
                              std::vector<std::shared_ptr<Session>> *restored,
                              std::vector<OpenedHandles> *opened, RestoreReport *report) {
    auto file = StateFile::adopt(std::move(fds.at(state_name)));
    fds.erase(state_name);
    std::shared_ptr<Session> s;
    uint64_t objects = 0;
    std::vector<ObjectImport> handles;
    Status st = file.status();
    if (st.isOk()) {
        st = restoreSession(std::move(file).value(), fds, &s, &objects, &handles);
    }
    if (st.isOk()) {
        if (st = broker_.adoptSession(s); !st.isOk()) {
            broker_.endSession(s);
        } else if (auto e = entryOf(*s); e.isOk()) {
            auto lock = s->hold();
            broker_.chargeStateBytes(*s, (*e)->file.compactedBytes() + (*e)->file.appendedBytes());
        }
    }
    if (st.isOk()) {
        ++report->sessions_kept;
        report->objects += objects;
        restored->push_back(s);
        if (!handles.empty()) {
            opened->push_back({s, std::move(handles)});
        }
        spdlog::info("restore: session {} (pid {}) kept with {} object(s)", s->id(), s->identity().creds.pid,
                     objects);
        return;
    }
    ++report->sessions_dropped;
    std::string line =
        "restore: " + state_name.substr(5, state_name.size() - 11) + ": " + st.message() + "; ending it";
    spdlog::warn("{}", line);
    report->problems.push_back(line);
}

void RestartState::adoptOpenedHandles(std::vector<OpenedHandles> &opened,
                                      std::vector<std::shared_ptr<Session>> *restored,
                                      RestoreReport *report) {
    for (OpenedHandles &o : opened) {
        Status st = Status::ok();
        for (ObjectImport &in : o.handles) {
            Relocations none;  // a handle has no memory of its own
            if (st = broker_.adopt(*o.session, std::move(in), none); !st.isOk()) {
                break;
            }
            ++report->objects;
        }
        if (st.isOk()) {
            continue;
        }
        // Ended as a session whose own restore failed is: the targets it made go the ordinary
        // way (kept for handles adopted before, gone for those after, which then fail too).
        --report->sessions_kept;
        ++report->sessions_dropped;
        report->objects -= o.session->objectCount();
        restored->erase(std::remove(restored->begin(), restored->end(), o.session), restored->end());
        std::string line =
            "restore: session " + std::to_string(o.session->id()) + ": " + st.message() + "; ending it";
        spdlog::warn("{}", line);
        report->problems.push_back(std::move(line));
        broker_.endSession(o.session);
    }
}

RestoreReport RestartState::restore(std::vector<std::pair<std::string, UniqueFd>> &fds,
                                    std::vector<std::shared_ptr<Session>> *restored) {
    RestoreReport report;
    const auto t0 = std::chrono::steady_clock::now();
    std::map<std::string, UniqueFd> mine = takeStateFds(fds, &report);
    if (mine.empty()) {
        return report;
    }
    report.restored = true;
    std::vector<std::string> all_names;
    for (auto &[name, fd] : mine) {
        all_names.push_back(name);
    }
    rpb::Global g;
    if (std::string refuse = adoptGlobal(mine, &g); !refuse.empty()) {
        report.problems.push_back("restore: " + refuse + ": every session ends");
        spdlog::error("restore: {}: every session of the previous broker ends", refuse);
        report.sessions_dropped = static_cast<uint32_t>(std::count_if(
            mine.begin(), mine.end(), [](const auto &named) { return isStateName(named.first); }));
        mine.clear();
        dropNames(all_names);
        return report;
    }
    noteRestart(g);
    applyQuotaEdits(g, &report);
    MappingManager::instance().raiseRegionFloor(g.region_floor());
    broker_.raiseNextSessionId(g.next_session_id());

    const std::vector<Device *> paused = pauseHandingOver(broker_.devices());
    std::vector<std::string> state_names;
    for (auto &[name, fd] : mine) {
        if (isStateName(name)) {
            state_names.push_back(name);
        }
    }
    // Every session's fds stay until all are restored: a session's file may be stored under
    // another session's name (a file they share), whichever comes back first.
    std::vector<OpenedHandles> opened;
    for (const std::string &name : state_names) {
        restoreOne(name, mine, restored, &opened, &report);
    }
    adoptOpenedHandles(opened, restored, &report);
    for (Device *dev : paused) {
        (void)dev->verbs.setPaused(false);
    }
    // Each restored session's first commit exports its objects again and stores every fd its
    // state names (entry->stored): what the store must keep of it is known only after this.
    std::set<uint64_t> committed;
    for (auto &s : *restored) {
        if (broker_.commit(*s, StoredReply{}).isOk()) {
            committed.insert(s->id());
        }
    }
    // What the restored sessions use was duplicated; the fds that came back close now. The store
    // keeps the names the restored sessions' files are stored under, and forgets the others:
    // a dropped session's, and leftovers no session claims (a session that ended during the
    // window, say; a file's name whose sessions all ended). A kept session's own name that its
    // state does not use goes too: the old broker stored it for a call it never committed (a
    // crash between the two), and the session, knowing nothing of it, would never forget it
    // (the chaos soak found a doorbell page's fd left in the store after every session ended).
    std::set<std::string> kept_prefixes, dropped_prefixes, claimed;
    for (const auto &s : *restored) {
        kept_prefixes.insert(prefix(s->id()));
    }
    if (store_.enabled()) {
        std::lock_guard lock(mu_);
        for (const auto &s : *restored) {
            if (auto it = entries_.find(s->id()); it != entries_.end() && committed.count(s->id()) != 0) {
                for (const auto &[name, file] : it->second->stored) {
                    claimed.insert(name);
                }
            } else {
                claimed.insert(prefix(s->id()));  // its commit failed: keep every name of its
            }
        }
    }
    // A name the restored sessions need: one they store, or, without the store, any of theirs.
    auto needed = [&](const std::string &name) {
        const std::string pre = name.substr(0, name.find('.', 6) + 1);  // "ibvx.s<id>."
        if (kept_prefixes.count(pre) == 0) {
            return false;
        }
        return !store_.enabled() || claimed.count(name) != 0 || claimed.count(pre) != 0;
    };
    for (const std::string &name : state_names) {
        const std::string pre = name.substr(0, name.size() - 5);  // "ibvx.s<id>."
        if (kept_prefixes.count(pre) == 0) {
            dropped_prefixes.insert(pre);
        }
    }
    std::set<std::string> stored;
    {
        std::lock_guard lock(files_mu_);
        for (const auto &[id, f] : files_) {
            stored.insert(f.canonical);
        }
    }
    auto under = [](const std::set<std::string> &prefixes, const std::string &name) {
        const std::string pre = name.substr(0, name.find('.', 6) + 1);  // "ibvx.s<id>."
        return prefixes.count(pre) != 0;
    };
    std::vector<std::string> forget;
    size_t left = 0;
    std::string uncommitted;
    for (const std::string &name : all_names) {
        if (name == kGlobalName || stored.count(name) != 0 || needed(name)) {
            continue;
        }
        forget.push_back(name);
        if (under(kept_prefixes, name)) {
            uncommitted += " " + name;  // a crash's expected leftover, not a problem
        } else if (!under(dropped_prefixes, name)) {
            ++left;
        }
    }
    if (left != 0) {
        report.problems.push_back("restore: " + std::to_string(left) + " unclaimed fd(s) closed");
        spdlog::info("restore: closing {} fd(s) no restored session claims", left);
    }
    if (!uncommitted.empty()) {
        spdlog::info("restore: closing fd(s) stored for calls the previous broker did not commit:{}",
                     uncommitted);
    }
    mine.clear();
    dropNames(forget);
    report.restarts = restarts();
    report.took_ms = lastRestartTookMs();
    report.crash = lastRestartWasCrash();
    report.restore_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    return report;
}

}  // namespace ibvx::daemon
