// One broker session per process: the gRPC channel for control calls and the fd channel that
// brings region fds in and sends memory fds out.
//
// Threading: a Session is shared by every thread of the process. The gRPC stub is thread-safe on
// its own. fd_mu_ guards the fd channel socket, the region cache and the xfer id counter; it is
// held while reading pending frames (bounded by the call deadline) and never across a gRPC call.
//
// A broker restart keeps the session (docs/restart.md): the fd channel stays open while the gRPC
// connection dies. call() then retries the same request, with the same idempotency key, until
// the call's deadline; gRPC reconnects to the same socket meanwhile.
//
// The end of a session (eviction, a restart that could not restore it, the broker stopping) is
// the broker closing the fd channel, after it destroyed the session's objects. A program that
// only polls its queues makes no call that would notice, so each session has a watcher: a thread
// asleep in poll() on the fd channel for POLLRDHUP (a hang-up; data frames do not wake it). It
// marks the session dead and runs the end handler (setSessionEndHandler: the libibverbs face
// moves the queues to ERR) once, on the watcher thread. The watcher owns the fd channel's number
// while it runs: nothing else closes the fd then (pumpLocked notes EOF instead), so poll() never
// watches a reused number. A forked child has no watcher; its copy of the fd channel is the
// parent's and is closed by abandonAfterFork(). Why a thread, not a check on the poll path:
// docs/verbs.md, "When the session ends".
//
// Lifetime: sessions are never destroyed. A session whose broker went away stays allocated so
// the shadow objects pointing at it keep answering -ECONNRESET; a session inherited through
// fork() stays allocated so the child never runs the parent's gRPC destructors (whose threads do
// not exist in the child). Both are deliberate, bounded leaks: one object per broker restart or
// fork, kept reachable in a process-wide list.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>

#include <grpcpp/grpcpp.h>

#include "client/broker/session_end.h"
#include "common/build_config.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "ibv_extend/v1/broker.grpc.pb.h"
#include "proto/broker_methods.h"
#include "providers/loader/loader.h"

namespace ibvx::client::broker {

namespace pb = ::ibv_extend::v1;

// Settings read from the environment once per process.
struct Settings {
    std::string socket_path;  // IBV_EXTEND_SOCKET, else the default
    int timeout_ms = 10000;   // IBV_EXTEND_TIMEOUT_MS: deadline of every call
};
const Settings &settings();

inline constexpr const char *kDefaultSocket = IBVX_DEFAULT_SOCKET;
inline constexpr const char *kIdempotencyMetadataKey = "ibvx-idempotency-key";
// The keys of this process's earlier calls that ended (their replies are here, or they will
// never be retried), told to the broker on the next mutating call so it drops their stored
// replies instead of keeping each session's newest 64 (daemon/edge/services.h).
inline constexpr const char *kRetireMetadataKey = "ibvx-retire-keys";
inline constexpr size_t kMaxRetireKeys = 64;  // per call, as the broker takes them

// The calls that change nothing on the broker (by request type), as broker.proto says them
// (option idempotency_level; proto/broker_methods.h, the table the daemon reads too). Every other
// call carries an idempotency key, so a retry after a broker restart is answered, never applied
// twice; an rpc that says neither fails the build.
template <typename Req>
inline constexpr bool kReadOnlyCall = !kMutatingRequest<Req>;

// A new idempotency key: 16 lower-case hex digits of a random non-zero 64-bit value.
std::string newIdempotencyKey();
// This process's pid, without a system call (kept up to date across fork()).
pid_t processId();

// Whether a failed call is tried again: UNAVAILABLE (the connection failed or the channel is in
// transient failure) or CANCELLED (the broker shut down with the call in flight) while the
// session's fd channel is open means "the broker is restarting". With the fd channel at EOF the
// session ended; any other code is an answer.
bool retryAfter(grpc::StatusCode code, bool fd_channel_open);

// Whether a session open that failed with rc (a negative errno) after its fd channel connected
// is tried again: the broker went away during Hello or the attach (a restart).
bool openRetryAfter(int rc);

// The pause before a call's or an open's retry number `retries` (1, 2, ...): none before the
// first (it waits for the connection itself), then 10 ms doubling to 160 ms.
std::chrono::milliseconds retryPause(int retries);

class Session {
  public:
    // Connects, says Hello and attaches the fd channel. 0 or a negative errno (-ENOTCONN when
    // nothing answers on the socket). An open a broker restart cuts short is tried again, as
    // calls are, until IBV_EXTEND_TIMEOUT_MS has passed (openRetryAfter).
    static int open(const Settings &settings, std::unique_ptr<Session> *out);

    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    pid_t pid() const { return pid_; }
    // False once the broker closed the fd channel: the session and all its objects are gone.
    bool alive() const { return !dead_.load(std::memory_order_acquire); }
    // True when objects of this session can never be used again from this process (the broker
    // ended it, or this is a forked child holding the parent's objects): free them locally.
    bool gone() const { return !alive() || pid_ != processId(); }

    // One unary call with the session token and a deadline (a mutating call also with a new
    // idempotency key), retried while the broker restarts (retryAfter) until that deadline.
    // 0 or a negative errno (the ErrorDetail errno when the broker sent one, else one mapped
    // from the gRPC code).
    template <typename Req, typename Resp>
    int call(const char *what,
             grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
             const Req &req, Resp *resp) {
        int rc = checkUsable();
        if (rc != 0) {
            return rc;
        }
        Attempts attempts = startCall(!kReadOnlyCall<Req>);
        for (;;) {
            grpc::ClientContext ctx;
            prepare(&ctx, attempts);
            std::shared_ptr<pb::Broker::Stub> stub = currentStub();
            grpc::Status status = (stub.get()->*method)(&ctx, req, resp);
            if (!again(what, status, &attempts, stub)) {
                endCall(&attempts, status);
                return finish(what, status);
            }
            resp->Clear();
        }
    }

    // A call that names an fd it sends on the fd channel (RegMr, SetAsyncEventFd, CreateCq with
    // an event fd): sends fd, names it in req (set_xfer(req, id)), calls. A broker that took the
    // fd and was replaced by a restart before it committed the call answers the retry EBADF ("no
    // fd arrived"): that attempt changed nothing, so the fd is sent again and the call made
    // again, as a new call (docs/restart.md). A few times at most, for restarts back to back.
    template <typename Req, typename Resp, typename SetXfer>
    int callWithFd(const char *what,
                   grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                   int fd, Req req, SetXfer set_xfer, Resp *resp) {
        constexpr int kSends = 3;
        int rc = -EBADF;
        for (int send = 0; send < kSends && rc == -EBADF; ++send) {
            uint64_t xfer = 0;
            if (rc = sendFd(fd, &xfer); rc != 0) {
                return rc;
            }
            set_xfer(&req, xfer);
            resp->Clear();
            rc = call(what, method, req, resp);
        }
        return rc;
    }

    // The local address of a RegionRef, mapping regions the broker sent (pending frames are read
    // until it is there). *addr = nullptr for an absent ref. 0 or a negative errno.
    int resolve(const pb::RegionRef &ref, bool present, void **addr);
    // Sends fd to the broker on the fd channel; *xfer_id names it in RegMr.
    int sendFd(int fd, uint64_t *xfer_id);
    // Unmaps regions the broker released.
    void releaseRegions(const google::protobuf::RepeatedField<uint64_t> &ids);
    // Number of regions currently mapped (tests).
    size_t mappedRegions();

    // Called in a forked child on the parent's session: drops what the child may drop without
    // touching gRPC (its copy of the fd channel), so the parent's session ends with the parent.
    void abandonAfterFork();

  private:
    // One call across its tries: one deadline and one key for all of them.
    struct Attempts {
        std::chrono::system_clock::time_point deadline;
        std::string key;     // empty: a read-only call
        std::string retire;  // kRetireMetadataKey's value, sent on every try (empty: none)
        int retries = 0;
    };

    Session() = default;
    // Steps of open(): the gRPC channel to the broker's socket (it connects lazily); Hello, whose
    // answer is the session token (0 or a negative errno).
    void connectGrpc(const std::string &socket_path);
    // A new channel, for the calls after a try that found the broker gone (`failed`: the stub
    // that try used; the first of several threads to fail on it replaces it). A retry never
    // waits on a channel's own reconnection: it needs gRPC's timers, which a forked child may
    // not have (gRPC 1.51's fork support restarts some of its threads, not all).
    void renewStub(const std::shared_ptr<pb::Broker::Stub> &failed);
    std::shared_ptr<pb::Broker::Stub> currentStub() const;
    // One try of open(); *refused: nothing listens on the socket (not tried again).
    static int openOnce(const Settings &settings, std::chrono::steady_clock::time_point deadline,
                        std::unique_ptr<Session> *out, bool *refused);
    int hello(SessionToken *token, std::chrono::steady_clock::time_point deadline);
    int checkUsable();
    Attempts startCall(bool mutating);
    void prepare(grpc::ClientContext *ctx, const Attempts &attempts) const;
    // After a call's last try: its key is retired on the next call, and the keys it was to
    // retire are kept for the next call again when it failed (it may not have reached the broker).
    void endCall(Attempts *attempts, const grpc::Status &status);
    // After a try on `stub`: true (after a pause, on a new channel) when the call is to be tried
    // again; warns on its first retry.
    bool again(const char *what, const grpc::Status &status, Attempts *attempts,
               const std::shared_ptr<pb::Broker::Stub> &stub);
    bool fdChannelOpen();
    int finish(const char *what, const grpc::Status &status);
    // Reads frames until `region` is mapped (region == 0: only what is already pending).
    // Caller holds fd_mu_.
    int pumpLocked(uint64_t region);
    int handleFrameLocked(Frame &frame);
    void markDead();
    // Starts the watcher on the fd channel (called once, by open()). 0 or a negative errno.
    int startWatcher();
    void watch(int fd);

    pid_t pid_ = 0;
    int timeout_ms_ = 10000;
    std::string socket_path_;
    mutable std::mutex stub_mu_;
    std::shared_ptr<pb::Broker::Stub> stub_;  // guarded by stub_mu_ (renewStub() replaces it)
    std::string token_hex_;
    std::atomic<bool> dead_{false};
    std::mutex retire_mu_;
    std::deque<std::string> retire_;  // guarded by retire_mu_: keys to retire, oldest first

    struct Region {
        UniqueMapping mapping;
    };
    std::mutex fd_mu_;
    UniqueFd fd_channel_;                 // guarded by fd_mu_
    bool watched_ = false;                // guarded by fd_mu_: the watcher owns the fd's number
    int watch_fd_ = -1;                   // the fd channel's number, set before the watcher starts
    bool channel_eof_ = false;            // guarded by fd_mu_: the broker closed the channel
    std::map<uint64_t, Region> regions_;  // guarded by fd_mu_
    uint64_t next_xfer_ = 1;              // guarded by fd_mu_
};

// The process's session, connecting on first use (or after the broker went away, or in a forked
// child). 0 or a negative errno.
int currentSession(Session **out);

// Prints "ibv_extend: Warning: ..." when IBV_EXTEND_SHOW_WARNINGS is set: the loader's warn(),
// the one the library's direct mode prints with.
using loader::warn;

}  // namespace ibvx::client::broker
