// A session: one tenant process's connection to the broker, the objects it created and its
// memory. Created by Broker::hello(), ended by Broker::endSession().
//
// Threading:
//  - mu_ guards objects_, what changed since the last commit, ended_ and writes on the fd
//    channel. Every Broker call on a session holds it for its whole duration (driver calls
//    included), so the calls of one session run one at a time; different sessions run in
//    parallel. A reader outside a Broker call takes it with hold(). Lock order: Session::mu_ ->
//    Device::driver_mu (for drivers that need it, device.h) -> MappingManager's mutex.
//  - xfer_mu_ guards the fds the tenant sent for RegMr (filled by the fd-channel reader, taken
//    by RegMr); never held together with mu_.
//  - identity, token and id never change after construction.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "daemon/core/identity.h"
#include "daemon/core/mapping.h"
#include "daemon/core/objects.h"
#include "daemon/core/quota.h"

namespace ibvx::daemon {

// The answer to a mutating call, kept under the call's idempotency key so the same call retried
// after a broker restart is answered instead of applied twice (docs/restart.md). The edge fills
// it (gRPC code and serialized response); the core only stores it and puts it in the snapshot.
struct StoredReply {
    uint64_t key = 0;
    std::string method;  // full gRPC method name: the key of another call is refused
    int code = 0;        // grpc::StatusCode
    std::string message;
    std::string details;   // Status.error_details
    std::string response;  // the serialized response message
};

// A stored reply read in place (Session::forEachReplySince): valid during the callback only.
struct StoredReplyView {
    uint64_t key = 0;
    std::string_view method;
    int code = 0;
    std::string_view message;
    std::string_view details;
    std::string_view response;
};

// What a session did before this broker process: when it was created and the Broker calls
// made under it (the restart layer carries them across a restart, docs/restart.md). A session
// this process opened has created_unix_ms now and no calls.
struct CallCounts {
    uint64_t calls = 0;
    uint64_t errors = 0;
};
struct SessionHistory {
    uint64_t created_unix_ms = 0;
    CallCounts calls;
    std::vector<StoredReply> replies;  // oldest first: the replies it stored, answered again on retry
};

// What control calls changed in a session since the restart layer last took it (its commit
// writes these objects' records again, docs/restart.md).
struct SessionChanges {
    std::vector<uint64_t> touched;  // created or changed (a handle may repeat)
    std::vector<uint64_t> erased;   // destroyed
    // Parents of an object created or destroyed (a handle may repeat): their driver state may
    // have changed with it (a context's doorbell pages), most often it did not, so the commit
    // logs them only when their exported state differs from the last export.
    std::vector<uint64_t> parents;
};

class Session {
  public:
    // At most this many fds may wait for a RegMr (a flood ends the session).
    static constexpr size_t kMaxPendingXfers = 64;

    Session(uint64_t id, const SessionToken &token, PeerIdentity identity, std::string client_name,
            UniqueFd pidfd);
    // A session a restarted broker rebuilt (daemon/restart): its memory and attached fd channel
    // come from the snapshot's fds; its objects are added by Broker::adopt(); its age, calls and
    // stored replies continue from history.
    Session(uint64_t id, const SessionToken &token, PeerIdentity identity, std::string client_name,
            UniqueFd pidfd, std::unique_ptr<SessionMemory> memory, UniqueFd channel, SessionHistory history);
    ~Session();
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    uint64_t id() const { return id_; }
    const SessionToken &token() const { return token_; }
    const std::string &tokenHex() const { return token_hex_; }
    const PeerIdentity &identity() const { return identity_; }
    const std::string &clientName() const { return client_name_; }
    // When Hello created it, in this process's steady clock (earlier than this process's start
    // for a restored session) and as wall-clock milliseconds.
    std::chrono::steady_clock::time_point createdAt() const { return created_; }
    uint64_t createdUnixMs() const { return created_unix_ms_; }
    // The calls made under it by earlier broker processes (none for a session this one
    // opened): the edge adds its own count.
    const CallCounts &earlierCalls() const { return earlier_calls_; }
    int pidfd() const { return pidfd_.get(); }
    // The attached fd channel, -1 before attach. Read by the broker's event loop.
    int channelFd() const { return channel_fd_.load(); }
    bool attached() const { return channel_fd_.load() >= 0; }
    bool ended() const { return ended_.load(); }
    size_t objectCount() const { return object_count_.load(); }
    SessionMemory &memory() { return *memory_; }
    const SessionMemory &memory() const { return *memory_; }

    // Stores an fd the tenant sent (kFdTransfer). false when the table is full or the id is
    // already used (the fd is closed either way): a protocol violation.
    bool putXfer(uint64_t xfer_id, UniqueFd fd);
    // Takes the fd sent with xfer_id, waiting up to timeout for it (the RPC may overtake the
    // frame). Invalid fd when it did not come.
    UniqueFd takeXfer(uint64_t xfer_id, std::chrono::milliseconds timeout);

    // The newest kMaxReplies stored replies (Broker::commit adds them). Keys are the client's
    // (random, per call); an unknown key gives nullopt.
    static constexpr size_t kMaxReplies = 64;
    std::optional<StoredReply> findReply(uint64_t key) const;
    std::vector<StoredReply> replies() const;
    // The replies stored after the first *seq ever stored (the newest kMaxReplies at most),
    // oldest first; *seq becomes the count stored so far. From 0: every reply kept.
    std::vector<StoredReply> repliesSince(uint64_t *seq) const;
    // The same replies, each handed to fn in place, without copies (the restart layer's commit
    // writes them as records). fn runs under the replies' lock: it must not call the session.
    void forEachReplySince(uint64_t *seq, const std::function<void(const StoredReplyView &)> &fn) const;
    // The heap bytes its stored replies hold, as kept (Admin GetStats: where a QP's bytes go).
    size_t storedReplyBytes() const;
    // Drops the stored replies of these keys: the tenant has them and will not retry those
    // calls ("ibvx-retire-keys", services.h). Keys not kept are skipped. Returns how many it
    // dropped; their keys wait in takeRetired() for the restart layer's log.
    size_t retireReplies(const std::vector<uint64_t> &keys);
    // The keys retired since the last take (the newest kMaxReplies at most), and their return
    // when the commit that took them logged no reply to carry them.
    std::vector<uint64_t> takeRetired();
    void untakeRetired(std::vector<uint64_t> keys);

    // ---- its state, for readers outside a Broker call ----
    // (the Admin inspector, and the restart layer that keeps sessions across a broker restart.)
    // hold() takes mu_: no call on the session runs while it is held, so the objects stay still.
    // The restart layer's commit runs inside Broker::commit, which holds it already. Never call
    // the Broker on the session while holding it.
    [[nodiscard]] std::unique_lock<std::mutex> hold() const { return std::unique_lock(mu_); }
    // With mu_ held: the object with this handle (nullptr when none), and every object, parents
    // before the objects that use them (kParentsFirst).
    const Object *object(uint64_t handle) const;
    std::vector<const Object *> objectsParentsFirst() const;
    // With mu_ held: what changed since the last call (the restart layer's commit).
    SessionChanges takeChanges();
    // The same into *into, whose vectors are cleared and handed back to the session: a commit
    // that keeps one SessionChanges allocates none of these vectors again.
    void takeChanges(SessionChanges *into);

  private:
    friend class Broker;

    const uint64_t id_;
    const SessionToken token_;
    const std::string token_hex_;
    const PeerIdentity identity_;
    const std::string client_name_;
    const std::chrono::steady_clock::time_point created_;
    const uint64_t created_unix_ms_;
    const CallCounts earlier_calls_;
    UniqueFd pidfd_;
    QuotaCharge quota_;  // the session itself (Quota::kSessions); released by Broker::endSession
    // Its restart state's bytes (Quota::kStateBytes), as the restart layer last counted them;
    // guarded by mu_ (a commit holds it), released by Broker::endSession.
    QuotaCharge state_quota_;

    mutable std::mutex mu_;
    UniqueFd channel_;
    std::atomic<int> channel_fd_{-1};
    std::atomic<bool> ended_{false};
    std::unordered_map<uint64_t, std::unique_ptr<Object>> objects_;
    std::atomic<size_t> object_count_{0};
    SessionChanges changes_;  // since takeChanges()
    std::unique_ptr<SessionMemory> memory_;

    // A stored reply as kept here: its key and one buffer holding the rest, length-prefixed
    // (one allocation instead of up to five strings; a session keeps kMaxReplies of them), and
    // what it holds of the tenant's "replies" quota (given back when it is dropped). The buffer
    // is kept with its zero runs as counts (common/zero_runs.h) when that is shorter: a
    // CreateQp's reply is ~600 bytes, 430 of them zeros, and 64 of them per session were a
    // quarter of a QP's bytes in the broker (issue 25). Its first byte says which form it is in.
    struct PackedReply {
        uint64_t key = 0;
        uint64_t seq = 0;  // its place in reply_seq_'s count (forEachReplySince)
        std::string bytes;
        QuotaCharge quota;
    };
    static PackedReply pack(const StoredReply &r);
    // The reply p holds, its views into p or into *scratch (where an encoded one is decoded).
    static StoredReplyView view(const PackedReply &p, std::string *scratch);

    // Leaf lock: guards replies_ (newest last).
    mutable std::mutex replies_mu_;
    std::deque<PackedReply> replies_;
    uint64_t reply_seq_ = 0;         // replies ever added (the restart layer logs the new ones)
    std::vector<uint64_t> retired_;  // keys retired since takeRetired(), oldest first
    // Packs it outside the lock; quota is its charge (Broker::reserveReply), none for a restored one.
    void addReply(StoredReply reply, QuotaCharge quota = {});
    // Gives up the oldest stored reply and its charge; false when none is kept.
    bool dropOldestReply();
    // Charges every kept reply that holds nothing yet (a restored session's), with charge().
    void chargeReplies(const std::function<QuotaCharge()> &charge);
    // Drops every stored reply (the session ended: nothing retries into it).
    void dropReplies();

    std::mutex xfer_mu_;
    std::condition_variable xfer_cv_;
    std::map<uint64_t, UniqueFd> xfers_;
    bool xfers_closed_ = false;
};

}  // namespace ibvx::daemon
