// What carries the broker's state across its own restart (docs/restart.md): the session state
// files, the fds they name, the commit that keeps them current, the list handed to the next
// process, and the restore that rebuilds sessions from them.
//
// It is a client of the core: it reads what changed in a session and its objects through
// Session's public API and the core's export, and rebuilds sessions through Broker::adopt() and
// adoptSession(), as the tenant-facing service creates them through the Broker's calls.
//
// Threading:
//  - commit() runs with the session's mutex held (Broker::commit), so one session's state is
//    written by one thread at a time; a SessionEntry is guarded by its session's mutex (plan()
//    and handover() take it with Session::hold()). mu_ guards the per-session table and the
//    globals and is held only around table operations, never across a driver call or a file
//    write of another session.
//  - files_mu_ guards the table of stored files every session shares (files_); a commit holds it
//    while it updates the table and sends the store its new fds, never across a file write.
//  - restore() runs before the server serves; handover() after it stopped.
//  - global_mu_ serializes the writes of ibvx.global (a commit's region floor, markAlive() from
//    the heartbeat, handover()); it is taken before mu_, never the other way.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/core/broker.h"
#include "daemon/restart/state_file.h"

namespace ibv_extend::restart::v1 {
class Global;
}

namespace ibvx::daemon {

// The snapshot's format: a reader refuses a newer one (a downgrade across a format change).
// 2: session records may be zero-run encoded (state_file.h), and an arena chunk's change is a
// ChunkDelta record; ibvx.global itself stays plain, so a broker of format 1 reads it and refuses.
inline constexpr uint32_t kSnapshotFormat = 2;

// systemd's fd store, as the restart layer sees it (the daemon wires common/fd_store.h). Empty
// functions: no store (re-exec only).
struct FdStoreHooks {
    std::function<Status(const std::vector<std::pair<std::string, int>> &)> add;
    std::function<Status(const std::string &)> remove;
    bool enabled() const { return static_cast<bool>(add); }
};

// What a restore did.
struct RestoreReport {
    bool restored = false;  // there was a state to restore
    uint32_t sessions_kept = 0;
    uint32_t sessions_dropped = 0;
    uint64_t objects = 0;
    uint64_t restarts = 0;
    // From the old process's handover (it stops taking calls) to serving; after a crash (crash
    // set), an upper bound:
    // from the last time the old process was known alive (0: unknown, an older broker's state).
    uint64_t took_ms = 0;
    bool crash = false;
    uint64_t restore_ms = 0;            // this process's part
    std::vector<std::string> problems;  // one line per dropped session or leftover

    // The log line and the broker-restart event: "restart N: S session(s) kept ..., handover
    // took T ms" or, after a crash, "... down at most T ms (since the old process was last
    // seen alive)".
    std::string summary() const;
};

class RestartState {
  public:
    RestartState(Broker &broker, FdStoreHooks store);
    ~RestartState();
    RestartState(const RestartState &) = delete;
    RestartState &operator=(const RestartState &) = delete;

    // Creates ibvx.global (fresh start) or keeps the adopted one (after restore()).
    Status start();

    // Broker::commit's sink: exports what changed, writes the session's state file, puts new fds
    // in the store (and takes gone ones out). Session::mu_ is held by the caller.
    Status commit(Session &s);
    // Broker::endSession's sink: the session's state file and store entries go.
    void sessionEnded(Session &s);

    // Rebuilds sessions from the fds a previous process left (names as LISTEN_FDNAMES). Takes
    // the fds it recognises ("ibvx.*"), leaves the others in fds (the listening socket). Every
    // session it cannot restore ends cleanly (its fds are closed and removed from the store).
    // The caller adds the returned sessions to the server's watch list.
    RestoreReport restore(std::vector<std::pair<std::string, UniqueFd>> &fds,
                          std::vector<std::shared_ptr<Session>> *restored);

    // What a restart would keep and drop now.
    struct Plan {
        uint32_t kept = 0, dropped = 0;
        std::vector<std::string> dropping_drivers;
        std::vector<std::shared_ptr<Session>> to_drop;
    };
    Plan plan();
    // The old process's last step: every session committed, the globals written (with the
    // handover's start time), and the list of every fd the next process needs, named. The fds
    // stay owned by their holders (valid until exec).
    StatusOr<std::vector<std::pair<std::string, int>>> handover();
    // The moment this process stops taking calls for a handover: the successor's "took" counts
    // from here (the in-flight calls' drain included). handover() marks it if nobody did.
    void beginHandover();
    // The moment the successor serves again (after restore() and the server's start): the end
    // of lastRestartTookMs(), which restore() could only bound from below.
    void noteServing();

    uint64_t restarts() const;
    uint64_t lastRestartUnixMs() const;
    uint64_t lastRestartTookMs() const;
    // The last restart followed a crash: lastRestartTookMs() is an upper bound.
    bool lastRestartWasCrash() const;

    // Records that this process is alive (the daemon's heartbeat, at most 1 s apart): after a
    // crash, the successor's restart time is measured from the last mark.
    void markAlive();

    // Where the edge counts each session's calls (ListSessions' CALLS): each state carries
    // them, so a restored session's count goes on. Unset: none are carried.
    using CallCounter = std::function<CallCounts(uint64_t session_id)>;
    void countCallsWith(CallCounter counter);

  private:
    struct SessionEntry {
        StateFile file;
        uint64_t start_time = 0;  // /proc/<pid>/stat field 22
        bool header_logged = false;
        bool compact_next = false;
        std::map<RegionId, uint64_t> chunks;                          // logged chunk versions
        std::map<RegionId, std::pair<int, bool>> doorbells;           // logged (refs, sent)
        uint64_t reply_seq = 0;                                       // replies logged
        std::map<std::string, std::pair<uint64_t, uint64_t>> stored;  // fd store: name -> file
        std::map<std::string, std::string> aliases;  // name -> canonical (maybe another session's)
        // What this commit asks of the shared file table (files_), applied at once by syncStore().
        struct Add {
            std::string name;
            int fd;
            std::pair<uint64_t, uint64_t> file;
        };
        std::vector<Add> adds;
        std::vector<std::pair<uint64_t, uint64_t>> forgets;  // one name of the file gone
        std::vector<StateFile::Record> new_aliases;          // not logged yet
        CallCounts image_calls;                              // the counts the last image's header holds
        bool warned = false;
        // Every object's logged_at names its latest record in file (an image wrote them all,
        // and every append since succeeded): a compaction copies those records. Cleared by a
        // failed write and for the handover, whose image exports every object anew.
        bool placed = false;
        // The last commit's changes, kept for their vectors (Session::takeChanges(into)).
        SessionChanges changes;
    };
    using NamedFds = std::vector<std::pair<std::string, int>>;
    using Records = std::vector<StateFile::Record>;
    // The object records among a commit's records: (index, object).
    using ObjectRecords = std::vector<std::pair<size_t, const Object *>>;

    // ---- the commit (restart_state.cpp); the session held throughout ----
    // The session's entry, made with a new state file at its first commit.
    StatusOr<SessionEntry *> entryOf(const Session &s);
    // Exports the driver state of the objects a call touched (Broker::exportObject), and of
    // their parents; a parent whose export changed joins changes.touched (it is logged).
    void exportTouched(Session &s, SessionChanges &changes);
    // The first commit, or a compaction: the store brought to what the session holds, and the
    // whole state written as a new log.
    Status writeImage(Session &s, SessionEntry &e, const SessionChanges &changes);
    // Notes where each object's record was written (Object::logged_at).
    static void notePlacements(const ObjectRecords &objects, const std::vector<StateFile::Placement> &placed);
    // Any other commit: what the call changed, appended to the log.
    Status appendChanges(Session &s, SessionEntry &e, const SessionChanges &changes);
    // The arena chunks or doorbell pages (State) that appeared or changed since the last commit,
    // and those that went; logged: what the log holds of each (a chunk's version, a doorbell's
    // refs and sent flag).
    template <typename State, typename Logged>
    void logRegions(uint64_t id, SessionEntry &e, const std::vector<State> &now,
                    std::map<RegionId, Logged> &logged, Records &records);
    void logObjects(Session &s, SessionEntry &e, const SessionChanges &changes, Records &records,
                    ObjectRecords *objects);
    // Applies the session's queued adds and forgets to the shared file table and the store: a
    // file new to the broker is stored under this name (one message for the commit, a refusal
    // logged once per session), one another name already holds becomes an alias of it.
    void syncStore(SessionEntry &e, uint64_t id);
    // One name of file gone; the last takes its canonical out of the store. files_mu_ held.
    void dropFileRef(std::pair<uint64_t, uint64_t> file);
    // Rewrites ibvx.global when this process has used half the region ids its floor allows.
    Status keepRegionFloor();
    // Names and fds a session's state needs now (for the store and for exec).
    NamedFds sessionFds(const Session &s, const SessionEntry &e) const;
    // The session's whole state as log records (a compaction, or the first commit); a leaf
    // whose kept driver state was given back is exported again for it (Broker::keptState),
    // unless its last record, untouched by this commit (changes), can be copied (e.placed).
    // objects gets the object records' places among them.
    Records fullImage(Session &s, SessionEntry &e, const SessionChanges &changes, ObjectRecords *objects);
    // Its calls so far, in this process and before (takes mu_).
    CallCounts callsOf(const Session &s) const;
    void storeAdd(SessionEntry &e, const std::string &name, int fd);
    void storeRemovePrefix(SessionEntry &e, const std::string &prefix);
    void storeForget(SessionEntry &e, const std::string &name, std::pair<uint64_t, uint64_t> id);
    // Which file fd is, as systemd tells stored fds apart: (dev, inode) for a regular file (a
    // memfd), a number per open file description for anything else (takes files_mu_).
    std::pair<uint64_t, uint64_t> fileOf(int fd);
    // Whether fd is the file `file` (a commit's usual case: a name keeps its file), in O(1).
    bool isFile(int fd, std::pair<uint64_t, uint64_t> file);
    // Rewrites ibvx.global whole, with the handover's start time once handover() set it.
    Status writeGlobal();
    void dropNames(const std::vector<std::string> &names);

    // ---- the restore (restore.cpp) ----
    // Takes ibvx.global from fds and reads it into g; the refusal (every session then ends)
    // when there is none or this broker cannot read it.
    std::string adoptGlobal(std::map<std::string, UniqueFd> &fds, ibv_extend::restart::v1::Global *g);
    // The restart count and how long the restart took, from the old process's globals.
    // The quota changes the previous process made at runtime, applied over this one's
    // configuration (a change that cannot be is a problem of the report, and skipped).
    void applyQuotaEdits(const ibv_extend::restart::v1::Global &g, RestoreReport *report);
    void noteRestart(const ibv_extend::restart::v1::Global &g);
    // Restores the session whose state fds[state_name] holds, or ends it cleanly. Its fds stay in
    // fds (another session's aliases may name them); restore() closes them all at the end.
    // A restored session's OpenQp handles (ibv_open_qp), adopted once every session's own
    // objects are back: the target each names may be another session's, restored later.
    struct OpenedHandles {
        std::shared_ptr<Session> session;
        std::vector<ObjectImport> handles;
    };
    void restoreOne(const std::string &state_name, std::map<std::string, UniqueFd> &fds,
                    std::vector<std::shared_ptr<Session>> *restored, std::vector<OpenedHandles> *opened,
                    RestoreReport *report);
    Status restoreSession(StateFile file, std::map<std::string, UniqueFd> &fds, std::shared_ptr<Session> *out,
                          uint64_t *objects, std::vector<ObjectImport> *opened);
    // Adopts the handles; a session whose handle finds no target (its creator's session did not
    // come back) ends, and so, in turn, may sessions that had opened its targets.
    void adoptOpenedHandles(std::vector<OpenedHandles> &opened,
                            std::vector<std::shared_ptr<Session>> *restored, RestoreReport *report);
    // Starts the restored session's entry: its log goes on, and the store already holds its
    // fds (under the canonical names the log's aliases say).
    void keepEntry(const Session &s, StateFile file, uint64_t start_time,
                   const std::map<std::string, std::string> &aliases);

    Broker &broker_;
    FdStoreHooks store_;
    mutable std::mutex mu_;
    std::map<uint64_t, std::unique_ptr<SessionEntry>> entries_;
    // The files in the fd store, shared by every session: systemd keeps one copy of a file however
    // many names it is stored under (a memfd behind several MRs, of one session or of a parent and
    // its forked child; a context's doorbell file behind its doorbell regions). The first name
    // stored is the canonical one, every other name (of any session) is logged as an alias of it,
    // and the canonical stays in the store while any name of the file lives, in any session: a
    // session that ends does not take a file another still uses out of the store.
    struct File {
        std::string canonical;
        size_t names = 0;
        UniqueFd probe;  // not a regular file: a dup, told apart by kcmp(KCMP_FILE) as systemd does
        std::pair<uint64_t, uint64_t> inode;  // the probe's (dev, inode): its key in probes_
    };
    std::mutex files_mu_;  // guards files_ and next_probe_; taken after a session's mutex, never with mu_
    std::map<std::pair<uint64_t, uint64_t>, File> files_;
    uint64_t next_probe_ = 0;
    // The probed files by (dev, inode), so a lookup compares only files of one inode (a socket
    // has its own; eventfds share the anonymous inode).
    std::multimap<std::pair<uint64_t, uint64_t>, std::pair<uint64_t, uint64_t>> probes_;
    std::mutex global_mu_;  // serializes writes of global_ (commits, the heartbeat, handover)
    StateFile global_;
    uint64_t restarts_ = 0;
    uint64_t last_restart_unix_ms_ = 0;
    uint64_t last_took_ms_ = 0;
    bool last_crash_ = false;
    uint64_t handover_started_ms_ = 0;  // 0 until beginHandover() or handover()
    uint64_t restart_since_ms_ = 0;     // the old process's handover start (or last sign of life)
    uint64_t region_floor_written_ = 0;
    bool alive_warned_ = false;  // guarded by global_mu_
    CallCounter call_counter_;   // set before serving, read by commits
};

// Reads /proc/<pid>/stat's starttime (clock ticks since boot); 0 when the process is gone.
uint64_t processStartTime(pid_t pid);

}  // namespace ibvx::daemon
