#include "client/broker/session.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <grpc/fork.h>
#include <grpc/grpc.h>

#include "common/unix_socket.h"
#include "providers/loader/loader.h"

// gRPC's EventEngine fork handlers (libgrpc exports them; no installed header declares them).
namespace grpc_event_engine::experimental {
void PrepareFork();
void PostforkParent();
void PostforkChild();
}  // namespace grpc_event_engine::experimental

// gRPC's fork support switch (libgpr exports it; no installed header declares it). The
// GRPC_ENABLE_FORK_SUPPORT variable is read when libgpr loads, before any code of ours runs, so
// setting it later changes nothing: Fork::Enable is what a library can still turn on.
namespace grpc_core {
class Fork {
  public:
    static void Enable(bool enable);
    static bool Enabled();
};
}  // namespace grpc_core

namespace ibvx::client::broker {
namespace {

constexpr int kMaxMessageBytes = 64 * 1024;

int errnoForGrpc(grpc::StatusCode code) {
    switch (code) {
        case grpc::StatusCode::OK:
            return 0;
        case grpc::StatusCode::CANCELLED:
            return ECANCELED;
        case grpc::StatusCode::INVALID_ARGUMENT:
            return EINVAL;
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            return ETIMEDOUT;
        case grpc::StatusCode::NOT_FOUND:
            return ENOENT;
        case grpc::StatusCode::ALREADY_EXISTS:
            return EEXIST;
        case grpc::StatusCode::PERMISSION_DENIED:
        case grpc::StatusCode::UNAUTHENTICATED:
            return EPERM;
        case grpc::StatusCode::RESOURCE_EXHAUSTED:
            return ENOMEM;
        case grpc::StatusCode::FAILED_PRECONDITION:
            return EBUSY;
        case grpc::StatusCode::OUT_OF_RANGE:
            return ERANGE;
        case grpc::StatusCode::UNIMPLEMENTED:
            return EOPNOTSUPP;
        case grpc::StatusCode::UNAVAILABLE:
            return ENOTCONN;
        default:
            return EIO;
    }
}

int connectUnix(const std::string &path, UniqueFd *out) {
    auto fd = ibvx::connectUnix(path);
    if (!fd.isOk()) {
        return -fd.status().errnoValue();
    }
    *out = std::move(fd).value();
    return 0;
}

// secure_getenv: in a set-uid/set-gid program the caller's environment must not choose the
// broker (a fake one could hand it memory), as libibverbs ignores its variables there.
Settings readSettings() {
    Settings s;
    const char *sock = secure_getenv("IBV_EXTEND_SOCKET");
    s.socket_path = sock != nullptr && sock[0] != '\0' ? sock : kDefaultSocket;
    if (const char *t = secure_getenv("IBV_EXTEND_TIMEOUT_MS")) {
        char *end = nullptr;
        long v = strtol(t, &end, 10);
        if (end != t && *end == '\0' && v > 0 && v <= 3600 * 1000) {
            s.timeout_ms = static_cast<int>(v);
        } else {
            warn("IBV_EXTEND_TIMEOUT_MS='%s' is not a number of milliseconds in 1..3600000; using %d", t,
                 s.timeout_ms);
        }
    }
    return s;
}

// The process-wide session slot. The mutex is re-created in a forked child (another thread of
// the parent may have held it at fork time).
struct Registry {
    std::mutex mu;
    Session *current = nullptr;                 // guarded by mu
    std::vector<std::unique_ptr<Session>> all;  // guarded by mu; keeps every session reachable
};

std::atomic<SessionEndHandler> g_end_handler{nullptr};

Registry &registry() {
    static Registry *r = [] {
        auto *reg = new Registry;
        pthread_atfork(nullptr, nullptr, [] { new (&registry().mu) std::mutex; });
        return reg;
    }();
    return *r;
}

constexpr size_t kKeyChars = 16;  // an idempotency key's hex digits

// getpid() is a system call (glibc caches nothing since 2.25), asked before every call and by
// gone(). The pid is read once and again in a forked child, by a fork handler registered at
// load; the library's other child handlers never ask for it. A child made without fork() (a raw
// clone) would keep the parent's pid; such a child cannot use gRPC either.
std::atomic<pid_t> g_pid{0};  // 0: not read yet
[[maybe_unused]] const int g_pid_handler =
    pthread_atfork(nullptr, nullptr, [] { g_pid.store(::getpid(), std::memory_order_relaxed); });

}  // namespace

pid_t processId() {
    pid_t pid = g_pid.load(std::memory_order_relaxed);
    if (pid == 0) {
        pid = ::getpid();
        g_pid.store(pid, std::memory_order_relaxed);
    }
    return pid;
}

std::string newIdempotencyKey() {
    // Drawn 32 at a time per thread: a getrandom() per mutating call was a system call on every
    // call's path (~5 us each on a VM). A forked child draws its own (pool.pid), though a key
    // only has to differ from its own session's recent keys.
    struct Pool {
        uint64_t v[32];
        size_t left = 0;
        pid_t pid = 0;
    };
    thread_local Pool pool;
    uint64_t v = 0;
    while (v == 0) {
        if (pool.left == 0 || pool.pid != processId()) {
            pool.pid = processId();
            pool.left = getrandom(pool.v, sizeof(pool.v), 0) == static_cast<ssize_t>(sizeof(pool.v))
                            ? std::size(pool.v)
                            : 0;
        }
        if (pool.left != 0) {
            v = pool.v[--pool.left];
            continue;
        }
        // No getrandom (an old kernel, a seccomp filter): a key must only differ from this
        // session's other recent keys, which time, pid and a counter do.
        static std::atomic<uint64_t> counter{0};
        uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        v = (t * 0x9e3779b97f4a7c15ULL) ^ (static_cast<uint64_t>(processId()) << 40) ^ ++counter;
    }
    static constexpr char kHex[] = "0123456789abcdef";
    std::string hex(kKeyChars, '0');
    for (size_t i = kKeyChars; i-- > 0; v >>= 4) {
        hex[i] = kHex[v & 0xf];
    }
    return hex;
}

void setSessionEndHandler(SessionEndHandler handler) {
    g_end_handler.store(handler, std::memory_order_release);
}

bool sessionAlive(const Session *session) {
    return session->alive();
}

bool retryAfter(grpc::StatusCode code, bool fd_channel_open) {
    // CANCELLED too: this library never cancels its calls, so it means the broker went away
    // with the call in flight (its shutdown cancels what has not finished). Whether the old
    // broker applied it or not, the idempotency key makes the retry safe.
    return (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::CANCELLED) && fd_channel_open;
}

const Settings &settings() {
    static const Settings s = readSettings();
    return s;
}

std::chrono::milliseconds retryPause(int retries) {
    return std::chrono::milliseconds(retries <= 1 ? 0 : 10 << std::min(retries - 2, 4));
}

bool openRetryAfter(int rc) {
    // Hello: the connection failed or the broker went away with the call in flight (finish()
    // maps UNAVAILABLE and CANCELLED so). Attach: the broker closed the fd channel before
    // answering (it died), or does not know the token (its predecessor said Hello and died
    // before committing the session).
    return rc == -ENOTCONN || rc == -ECANCELED || rc == -ECONNRESET || rc == -EPIPE || rc == -ENOENT;
}

int Session::open(const Settings &settings, std::unique_ptr<Session> *out) {
    // A broker restart can cut an open short as it can a call: the process that accepted the fd
    // channel or said Hello is gone, and nothing of the session survived it (a session survives
    // from its attach on). The open starts again from the connect, under the policy of a call:
    // one deadline (IBV_EXTEND_TIMEOUT_MS) for all tries, pauses of 10 ms doubling to 160 ms.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(settings.timeout_ms);
    for (int retries = 0;; ++retries) {
        bool refused = false;
        int rc = openOnce(settings, deadline, out, &refused);
        const auto now = std::chrono::steady_clock::now();
        if (rc == 0 || refused || !openRetryAfter(rc) || now >= deadline) {
            return rc == -ECONNRESET || rc == -EPIPE ? -ENOTCONN : rc;  // the fd channel closed: no broker
        }
        if (retries == 0) {
            warn("opening a session: the broker restarted (%s); retrying until the deadline", strerror(-rc));
        }
        std::this_thread::sleep_for(
            std::min<std::chrono::steady_clock::duration>(retryPause(retries + 1), deadline - now));
    }
}

int Session::openOnce(const Settings &settings, std::chrono::steady_clock::time_point deadline,
                      std::unique_ptr<Session> *out, bool *refused) {
    std::unique_ptr<Session> s(new Session);
    s->pid_ = processId();
    s->timeout_ms_ = settings.timeout_ms;

    // The fd channel connects first: a refused connection is the cheapest "no broker here"
    // (never retried: a restarting broker's socket stays, and queues connections meanwhile).
    UniqueFd fdch;
    int rc = connectUnix(settings.socket_path, &fdch);
    if (rc < 0) {
        warn(
            "cannot connect to the broker at %s: %s (is ibv-extendd running? IBV_EXTEND_SOCKET selects the "
            "socket)",
            settings.socket_path.c_str(), strerror(-rc));
        *refused = true;
        return -ENOTCONN;
    }
    s->connectGrpc(settings.socket_path);
    SessionToken token{};
    if (rc = s->hello(&token, deadline); rc != 0) {
        return rc;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    rc = attachClient(fdch.get(), token, static_cast<int>(std::max<int64_t>(left.count(), 1)));
    if (rc < 0) {
        warn("the broker refused the fd channel: %s", strerror(-rc));
        return rc;
    }
    s->fd_channel_ = std::move(fdch);
    s->token_hex_ = tokenToHex(token);
    if (int wrc = s->startWatcher(); wrc < 0) {
        warn(
            "no watcher thread for the session (%s): a program that only polls its queues will not "
            "learn that the broker ended the session",
            strerror(-wrc));
    }
    *out = std::move(s);
    return 0;
}

namespace {

// In a forked child, every connection to the broker's socket is the parent's (the child's own
// come later): its gRPC connections, and its fd channel. The child's copy of the parent's
// channels still runs in the child (gRPC restarts its threads there), and a read there takes
// bytes off the parent's connection: seen in the chaos soak, a child's thread consumed the
// GOAWAY the broker sent the parent. Each such fd becomes /dev/null (the number stays taken, so
// gRPC's objects for it close nothing of anyone else's): the child reads end-of-file, its writes
// go nowhere, and the parent's connections are the parent's alone.
void silenceParentConnections() {
    const std::string &path = settings().socket_path;
    int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    DIR *dir = opendir("/proc/self/fd");
    if (null_fd < 0 || dir == nullptr) {
        if (dir != nullptr) {
            closedir(dir);
        }
        if (null_fd >= 0) {
            close(null_fd);
        }
        return;
    }
    while (dirent *e = readdir(dir)) {
        char *end = nullptr;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir) || fd == null_fd) {
            continue;
        }
        sockaddr_un peer{};
        socklen_t len = sizeof(peer);
        if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr *>(&peer), &len) == 0 &&
            peer.sun_family == AF_UNIX && len > offsetof(sockaddr_un, sun_path) &&
            strncmp(peer.sun_path, path.c_str(), sizeof(peer.sun_path)) == 0) {
            int flags = fcntl(static_cast<int>(fd), F_GETFD);
            dup3(null_fd, static_cast<int>(fd), (flags & FD_CLOEXEC) != 0 ? O_CLOEXEC : 0);
        }
    }
    closedir(dir);
    close(null_fd);
}

// A forked child must not share a polling engine with its parent. gRPC's epoll1 engine keeps
// one epoll set per process; a child that inherits it adds its own connection's fds to the
// parent's set, and the parent's next poll runs the child's fd objects (addresses in the
// child) as its own: the chaos soak's forking tenants crashed in LockfreeEvent::SetReady
// on their timer thread. gRPC 1.51 resets only one polling engine in a child (its fork support
// keeps a single reset function, and the EventEngine's poller replaces the iomgr's), and its
// Debian build registers no fork handlers at all. So: the "poll" strategy, whose pollers keep
// nothing in the kernel (a poll() over fds listed in the process's own memory), unless the
// program chose a strategy; and gRPC's fork handlers registered here (prepareGrpcForFork),
// which stop and restart its threads around fork().
// Registered after shared_pages.cpp's (at load), so gRPC quiesces before the page copy and
// restarts its threads in the child after the pages are the child's own; the child handler that
// silences the parent's connections runs before gRPC's restarts any thread.
void prepareGrpcForFork() {
    static std::once_flag once;
    std::call_once(once, [] {
        // gRPC reads both variables once, at its initialisation: they are ours to choose only
        // before it (a program that initialised gRPC itself keeps its own choice).
        const bool ours = !grpc_is_initialized();
        if (ours) {
            setenv("GRPC_POLL_STRATEGY", "poll", 0);  // read at gRPC's initialisation
            // The fork support switch is read earlier, when libgpr loads (see grpc_core::Fork
            // above): a program that set GRPC_ENABLE_FORK_SUPPORT keeps its choice, otherwise we
            // turn it on. Without it grpc_prefork stops no thread, and a child inherits locks
            // held by the parent's gRPC threads at fork(): the chaos soak's forked children hung
            // in their first call (CI, stop 34).
            if (getenv("GRPC_ENABLE_FORK_SUPPORT") == nullptr) {
                grpc_core::Fork::Enable(true);
            }
        }
        pthread_atfork(nullptr, nullptr, silenceParentConnections);
        // gRPC's handlers only with its fork support on: grpc_prefork complains on every fork
        // otherwise. With it off (the program's choice), gRPC's own rules hold for children.
        if (ours && grpc_core::Fork::Enabled()) {
            pthread_atfork(grpc_prefork, grpc_postfork_parent, grpc_postfork_child);
            pthread_atfork(grpc_event_engine::experimental::PrepareFork,
                           grpc_event_engine::experimental::PostforkParent,
                           grpc_event_engine::experimental::PostforkChild);
        }
    });
}

std::shared_ptr<pb::Broker::Stub> newStub(const std::string &socket_path) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    // A private connection per session: the global subchannel pool would hand a new session
    // (after a broker restart, or in a forked child) the old session's connection or its
    // reconnect back-off.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // A broker restart closes the connection; the socket queues the reconnect until the new
    // broker serves. gRPC's defaults (1 s initial back-off growing to 120 s, 20 s per attempt)
    // are for networks. Give one attempt 1 s, enough for a restoring broker to take the queued
    // connection; a call that fails is retried on a new channel (Session::again), and the
    // back-off (50..250 ms) matters only to a channel nobody calls on.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    return pb::Broker::NewStub(
        grpc::CreateCustomChannel("unix:" + socket_path, grpc::InsecureChannelCredentials(), args));
}

}  // namespace

void Session::connectGrpc(const std::string &socket_path) {
    // gRPC's polling engine survives fork() only with its fork support on, which it reads once,
    // at its first initialisation in the process: on unless the program chose already.
    prepareGrpcForFork();
    socket_path_ = socket_path;
    std::shared_ptr<pb::Broker::Stub> stub = newStub(socket_path);
    std::lock_guard lock(stub_mu_);
    stub_ = std::move(stub);
}

void Session::renewStub(const std::shared_ptr<pb::Broker::Stub> &failed) {
    if (currentStub() != failed) {
        return;  // another thread's retry renewed it already
    }
    std::shared_ptr<pb::Broker::Stub> fresh = newStub(socket_path_);
    std::lock_guard lock(stub_mu_);
    if (stub_ == failed) {  // else another thread's retry renewed it already
        stub_ = std::move(fresh);
    }
}

std::shared_ptr<pb::Broker::Stub> Session::currentStub() const {
    std::lock_guard lock(stub_mu_);
    return stub_;
}

int Session::hello(SessionToken *token, std::chrono::steady_clock::time_point deadline) {
    pb::HelloRequest req;
    req.mutable_client_version()->set_major(IBV_EXTEND_VERSION_MAJOR);
    req.mutable_client_version()->set_minor(IBV_EXTEND_VERSION_MINOR);
    req.mutable_client_version()->set_patch(IBV_EXTEND_VERSION_PATCH);
    req.set_client_name(std::string(program_invocation_short_name).substr(0, 64));
    pb::HelloResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + (deadline - std::chrono::steady_clock::now()));
    // Not wait_for_ready: a connection that fails (the broker restarting) fails the Hello at
    // once, and open() tries again on a new channel (see renewStub()).
    if (int rc = finish("Hello", currentStub()->Hello(&ctx, req, &resp)); rc != 0) {
        return rc;
    }
    if (resp.broker_version().major() != IBV_EXTEND_VERSION_MAJOR) {
        warn("broker speaks version %u.%u, this library %d.%d: upgrade one of them",
             resp.broker_version().major(), resp.broker_version().minor(), IBV_EXTEND_VERSION_MAJOR,
             IBV_EXTEND_VERSION_MINOR);
        return -EPROTONOSUPPORT;
    }
    if (resp.session_token().size() != token->size()) {
        warn("broker sent a %zu-byte session token, expected %zu", resp.session_token().size(),
             token->size());
        return -EPROTO;
    }
    memcpy(token->data(), resp.session_token().data(), token->size());
    return 0;
}

// A thread, not a check on the poll path: a program may be blocked in ibv_get_cq_event() or
// ibv_get_async_event() (a read() of an eventfd) when its session ends, and only another thread
// can wake it; and a thread asleep in poll() costs the data path nothing at all.
int Session::startWatcher() {
    {
        std::lock_guard lock(fd_mu_);
        watch_fd_ = fd_channel_.get();
        watched_ = true;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    // The program's signals are never delivered to this thread (it has no handler to run them
    // in a sensible context, and a program that sigwait()s expects them itself).
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    int rc = pthread_create(
        &thread, &attr,
        [](void *self) -> void * {
            pthread_setname_np(pthread_self(), "ibvx-session");
            auto *s = static_cast<Session *>(self);
            s->watch(s->watch_fd_);
            return nullptr;
        },
        this);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        std::lock_guard lock(fd_mu_);
        watched_ = false;
        return -rc;
    }
    return 0;
}

void Session::watch(int fd) {
    // POLLRDHUP alone: region frames arriving on the channel do not wake this thread; the broker
    // closing it (or the connection breaking: POLLHUP, POLLERR, always reported) does. A broker
    // restart keeps the channel open (it sits in the fd store or crosses the exec), so it never
    // wakes this thread.
    for (;;) {
        pollfd pfd{fd, POLLRDHUP, 0};
        int n = ::poll(&pfd, 1, -1);
        if (n > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0) {
            break;
        }
        if (n < 0 && errno != EINTR) {
            std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ENOMEM: try again
        }
    }
    {
        std::lock_guard lock(fd_mu_);
        channel_eof_ = true;
        watched_ = false;
        fd_channel_.reset();
    }
    markDead();
    warn(
        "the broker ended this process's session (evicted, not restored by a restart, or the broker "
        "stopped): its queues are in the error state and its objects are gone");
    if (SessionEndHandler handler = g_end_handler.load(std::memory_order_acquire)) {
        handler(this);
    }
}

int Session::checkUsable() {
    if (pid_ != processId()) {
        return -ENOTCONN;  // an object of the parent used in a forked child
    }
    if (!alive()) {
        return -ECONNRESET;
    }
    std::lock_guard lock(fd_mu_);
    int rc = pumpLocked(0);
    return rc == -ECONNRESET ? rc : 0;
}

Session::Attempts Session::startCall(bool mutating) {
    Attempts a;
    a.deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_);
    if (mutating) {
        a.key = newIdempotencyKey();
        std::lock_guard lock(retire_mu_);
        for (size_t i = 0; i < kMaxRetireKeys && !retire_.empty(); ++i) {
            if (!a.retire.empty()) {
                a.retire += ',';
            }
            a.retire += retire_.front();
            retire_.pop_front();
        }
    }
    return a;
}

void Session::endCall(Attempts *attempts, const grpc::Status &status) {
    if (attempts->key.empty()) {
        return;
    }
    std::lock_guard lock(retire_mu_);
    if (!status.ok()) {
        // Sent again on the next call: a broker that had them skips keys it no longer keeps.
        for (size_t at = 0; at < attempts->retire.size(); at += kKeyChars + 1) {
            retire_.push_back(attempts->retire.substr(at, kKeyChars));
        }
    }
    retire_.push_back(std::move(attempts->key));
    while (retire_.size() > kMaxRetireKeys) {
        retire_.pop_front();  // the broker ages it out with the session's oldest replies
    }
}

void Session::prepare(grpc::ClientContext *ctx, const Attempts &attempts) const {
    ctx->AddMetadata("ibvx-session", token_hex_);
    if (!attempts.key.empty()) {
        ctx->AddMetadata(kIdempotencyMetadataKey, attempts.key);
    }
    if (!attempts.retire.empty()) {
        ctx->AddMetadata(kRetireMetadataKey, attempts.retire);
    }
    ctx->set_deadline(attempts.deadline);
    // Never wait_for_ready: a try on a channel in transient failure fails at once (it never
    // reached the broker, so it changed nothing), and again() retries on a new channel. A try on a
    // channel that is connecting waits for that connection (at most 1 s, the connect timeout).
}

bool Session::fdChannelOpen() {
    std::lock_guard lock(fd_mu_);
    return pumpLocked(0) != -ECONNRESET && alive();
}

bool Session::again(const char *what, const grpc::Status &status, Attempts *attempts,
                    const std::shared_ptr<pb::Broker::Stub> &stub) {
    if (status.ok() || !retryAfter(status.error_code(), fdChannelOpen())) {
        return false;
    }
    auto now = std::chrono::system_clock::now();
    if (now >= attempts->deadline) {
        return false;
    }
    if (attempts->retries == 0) {
        warn("%s: the broker restarted (%s); the session is kept, retrying the call until its deadline", what,
             status.error_message().c_str());
    }
    // The channel that failed is replaced: its own reconnection waits for gRPC's back-off timer.
    std::this_thread::sleep_for(std::min<std::chrono::system_clock::duration>(
        retryPause(attempts->retries + 1), attempts->deadline - now));
    renewStub(stub);
    ++attempts->retries;
    return true;
}

int Session::finish(const char *what, const grpc::Status &status) {
    if (status.ok()) {
        return 0;
    }
    int err = 0;
    pb::ErrorDetail detail;
    if (!status.error_details().empty() && detail.ParseFromString(status.error_details()) &&
        detail.errno_value() > 0) {
        err = detail.errno_value();
    } else {
        err = errnoForGrpc(status.error_code());
    }
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !token_hex_.empty()) {
        // Tell "broker restarting" from "our session is gone": the fd channel knows.
        std::lock_guard lock(fd_mu_);
        if (pumpLocked(0) == -ECONNRESET) {
            err = ECONNRESET;
        }
    }
    warn("%s failed: %s (%s)", what, status.error_message().c_str(), strerror(err));
    return -err;
}

void Session::markDead() {
    dead_.store(true, std::memory_order_release);
}

int Session::handleFrameLocked(Frame &frame) {
    if (frame.type != FrameType::kRegionAdd || !frame.fd.valid() ||
        frame.payload.size() != sizeof(RegionPayload)) {
        warn("unexpected frame (type %u) on the fd channel; dropping the session",
             static_cast<unsigned>(frame.type));
        return -EPROTO;
    }
    RegionPayload p;
    memcpy(&p, frame.payload.data(), sizeof(p));
    if (p.size == 0 || p.size > (uint64_t{1} << 30)) {
        return -EPROTO;
    }
    if (regions_.count(frame.id) != 0) {
        return 0;  // already mapped; the fd closes with the frame
    }
    void *base = mmap(nullptr, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, frame.fd.get(), 0);
    if (base == MAP_FAILED) {
        int err = errno;
        warn("cannot map region %llu (%llu bytes): %s", static_cast<unsigned long long>(frame.id),
             static_cast<unsigned long long>(p.size), strerror(err));
        return -err;
    }
    // A forked child must not write into the parent's queues by accident.
    madvise(base, p.size, MADV_DONTFORK);
    regions_[frame.id].mapping = UniqueMapping(base, p.size);
    return 0;
}

int Session::pumpLocked(uint64_t region) {
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (;;) {
        if (region != 0 && regions_.count(region) != 0) {
            return 0;
        }
        if (!fd_channel_.valid() || channel_eof_) {
            return -ECONNRESET;
        }
        int wait = 0;
        if (region != 0) {
            auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
            if (left <= 0) {
                warn("the broker referenced region %llu but never sent it",
                     static_cast<unsigned long long>(region));
                return -EPROTO;
            }
            wait = static_cast<int>(left);
        }
        pollfd pfd{fd_channel_.get(), POLLIN, 0};
        int n = ::poll(&pfd, 1, wait);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -errno;
        }
        if (n == 0) {
            if (region == 0) {
                return 0;
            }
            continue;
        }
        Frame frame;
        int r = recvFrame(fd_channel_.get(), &frame, timeout_ms_);
        if (r == 0 || r == -ECONNRESET || r == -EPIPE) {
            // The broker ended the session (evicted it, could not restore it, or stopped). The
            // watcher, when there is one, closes the fd and runs the end handler.
            channel_eof_ = true;
            if (!watched_) {
                fd_channel_.reset();
            }
            markDead();
            return -ECONNRESET;
        }
        if (r < 0 || (r = handleFrameLocked(frame)) == -EPROTO) {
            markDead();
            return r < 0 ? r : -EPROTO;
        }
        if (r < 0) {
            return r;
        }
    }
}

int Session::resolve(const pb::RegionRef &ref, bool present, void **addr) {
    *addr = nullptr;
    if (!present) {
        return 0;
    }
    std::lock_guard lock(fd_mu_);
    int rc = pumpLocked(ref.region());
    if (rc < 0) {
        return rc;
    }
    const UniqueMapping &m = regions_.at(ref.region()).mapping;
    if (ref.offset() > m.size() || ref.length() > m.size() - ref.offset()) {
        warn("region %llu is %zu bytes; the broker referenced [%llu, +%llu)",
             static_cast<unsigned long long>(ref.region()), m.size(),
             static_cast<unsigned long long>(ref.offset()), static_cast<unsigned long long>(ref.length()));
        return -EPROTO;
    }
    *addr = static_cast<char *>(m.get()) + ref.offset();
    return 0;
}

int Session::sendFd(int fd, uint64_t *xfer_id) {
    std::lock_guard lock(fd_mu_);
    if (!fd_channel_.valid() || channel_eof_) {
        return -ECONNRESET;
    }
    uint64_t id = next_xfer_++;
    int rc = sendFrame(fd_channel_.get(), FrameType::kFdTransfer, id, nullptr, 0, fd, timeout_ms_);
    if (rc == -EPIPE || rc == -ECONNRESET) {
        markDead();
        return -ECONNRESET;
    }
    if (rc < 0) {
        return rc;
    }
    *xfer_id = id;
    return 0;
}

void Session::releaseRegions(const google::protobuf::RepeatedField<uint64_t> &ids) {
    std::lock_guard lock(fd_mu_);
    for (uint64_t id : ids) {
        regions_.erase(id);
    }
}

size_t Session::mappedRegions() {
    std::lock_guard lock(fd_mu_);
    return regions_.size();
}

void Session::abandonAfterFork() {
    // The child is single-threaded here, so fd_mu_ (maybe held by a parent thread at fork time)
    // is not taken. Region mappings were not inherited (MADV_DONTFORK); the fd channel copy is
    // closed so the parent's session ends when the parent does. The parent's watcher does not
    // exist here, so the child never runs the end handler on the parent's objects.
    watched_ = false;
    fd_channel_.reset();
    markDead();
}

int currentSession(Session **out) {
    Registry &r = registry();
    std::lock_guard lock(r.mu);
    if (r.current != nullptr && r.current->pid() == processId() && r.current->alive()) {
        *out = r.current;
        return 0;
    }
    if (r.current != nullptr && r.current->pid() != processId()) {
        r.current->abandonAfterFork();
    }
    std::unique_ptr<Session> s;
    int rc = Session::open(settings(), &s);
    if (rc < 0) {
        return rc;
    }
    r.current = s.get();
    r.all.push_back(std::move(s));
    *out = r.current;
    return 0;
}

}  // namespace ibvx::client::broker
