#include "daemon/edge/server.h"

#include <fcntl.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "common/fd_channel.h"
#include "daemon/core/fault_hooks.h"

namespace ibvx::daemon {
namespace {

constexpr char kHttp2Preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr size_t kHttp2PrefaceLen = sizeof(kHttp2Preface) - 1;

bool isPrefix(const uint8_t *buf, size_t n, const char *magic, size_t magic_len) {
    return std::memcmp(buf, magic, std::min(n, magic_len)) == 0;
}

}  // namespace

BrokerServer::BrokerServer(Broker &broker, ServerOptions options) : broker_(broker), options_(options) {}

StatusOr<std::unique_ptr<BrokerServer>> BrokerServer::create(Broker &broker, ServerOptions options) {
    std::unique_ptr<BrokerServer> s(new BrokerServer(broker, options));
    if (options.events != nullptr) {
        s->events_ = options.events;
    }
    s->broker_service_ = std::make_unique<BrokerService>(broker, s->connections_, s->stats_, s.get());
    s->broker_service_->setPodResolver(options.pods);
    AdminHooks hooks = options.admin;
    hooks.admin_gid = options.admin_gid;
    // A listing page keeps to the send limit, with room for its last entry and the framing.
    hooks.reply_budget_bytes = static_cast<size_t>(options.max_message_bytes) * 3 / 4;
    s->admin_service_ = std::make_unique<AdminService>(
        broker, s->connections_, s->stats_, s->admin_stats_, s->events_, std::move(hooks),
        [raw = s.get()](const std::shared_ptr<Session> &session) { return raw->evictSession(session); });
    grpc::EnableDefaultHealthCheckService(true);
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    builder.RegisterService(s->broker_service_.get());
    builder.RegisterService(s->admin_service_.get());
    builder.SetMaxReceiveMessageSize(options.max_message_bytes);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_calls_per_connection);
    builder.SetMaxSendMessageSize(options.max_message_bytes);
    // No AddListeningPort: connections arrive through AddInsecureChannelFromFd only.
    s->server_ = builder.BuildAndStart();
    if (s->server_ == nullptr) {
        return Status(Code::kInternal, EIO, "cannot start the gRPC server");
    }
    s->epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!s->epoll_) {
        return Status::fromErrno(errno, "epoll_create1 failed");
    }
    return s;
}

BrokerServer::~BrokerServer() {
    shutdown(std::chrono::milliseconds(0));
}

Status BrokerServer::start(UniqueFd listen_fd) {
    int flags = ::fcntl(listen_fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(listen_fd.get(), F_SETFL, flags | O_NONBLOCK) < 0) {
        return Status::fromErrno(errno, "cannot make the listening socket non-blocking");
    }
    UniqueFd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake) {
        return Status::fromErrno(errno, "eventfd failed");
    }
    wake_fd_ = wake.get();
    add(Entry::owning(EntryKind::kListen, std::move(listen_fd)), EPOLLIN);
    add(Entry::owning(EntryKind::kWake, std::move(wake)), EPOLLIN);
    thread_ = std::thread([this] { loop(); });
    return Status::ok();
}

void BrokerServer::sessionOpened(const std::shared_ptr<Session> &session) {
    watchSession(session);
    admin_service_->countSessionOpened();
    events_->publish(AdminEvents::aboutSession(AdminEvents::Event::SESSION_OPEN, *session,
                                               "client '" + session->clientName() + "'"));
}

void BrokerServer::watchSession(const std::shared_ptr<Session> &session) {
    {
        std::lock_guard lock(queue_mu_);
        to_watch_.push_back(session);
    }
    wake();
}

std::shared_future<void> BrokerServer::evictSession(const std::shared_ptr<Session> &session) {
    auto done = std::make_shared<std::promise<void>>();
    std::shared_future<void> f = done->get_future().share();
    {
        std::lock_guard lock(queue_mu_);
        to_evict_.push_back(Eviction{session, std::move(done)});
    }
    wake();
    return f;
}

void BrokerServer::wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0) {
        (void)!::write(wake_fd_, &one, sizeof(one));
    }
}

void BrokerServer::shutdown(std::chrono::milliseconds grace) {
    shutdownImpl(grace, /*keep_sessions=*/false);
}

void BrokerServer::shutdownImpl(std::chrono::milliseconds grace, bool keep_sessions) {
    if (shut_down_) {
        return;
    }
    shut_down_ = true;
    // 1. Stop the loop: no more accepts, handshakes or attaches.
    stop_ = true;
    if (thread_.joinable()) {
        wake();
        thread_.join();
    }
    // Pending evictions: the loop is gone, the sessions end below.
    {
        std::lock_guard lock(queue_mu_);
        for (auto &[session, done] : to_evict_) {
            done->set_value();
        }
        to_evict_.clear();
    }
    // 2. Let in-flight calls finish; after the grace period gRPC cancels the rest. Watch streams
    // end now, or they would hold the server until the deadline.
    events_->closeAll();
    if (server_ != nullptr) {
        auto deadline = std::chrono::steady_clock::now() + grace;
        std::thread closer([&] {
            using Clock = std::chrono::steady_clock;
            while (Clock::now() < deadline &&
                   (broker_service_->inflight() > 0 || admin_service_->inflight() > 0)) {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            // The last replies leave: gRPC writes a reply as its call is finished, on that thread,
            // unless its connection is mid-write; a quiet spell after the last finish is the
            // margin. (A fixed 50 ms here was a tenth of a restart's whole wait.)
            constexpr auto kQuiet = std::chrono::milliseconds(10);
            for (;;) {
                const auto last = std::max(broker_service_->lastFinish(), admin_service_->lastFinish());
                const auto now = Clock::now();
                if (now - last >= kQuiet || now >= deadline) {
                    break;
                }
                std::this_thread::sleep_for(last + kQuiet - now);
            }
            connections_.shutdownAll();
        });
        server_->Shutdown(std::chrono::system_clock::now() + grace);
        closer.join();
    }
    // 3. Every session's objects, memory and fds, unless they are handed over.
    if (!keep_sessions) {
        broker_.endAllSessions();
    }
    for (auto &[id, e] : entries_) {
        if (e.kind == EntryKind::kListen) {
            listen_fd_ = std::move(e.owned);
        }
    }
    entries_.clear();
    wake_fd_ = -1;
}

UniqueFd BrokerServer::handOver(std::chrono::milliseconds grace) {
    shutdownImpl(grace, /*keep_sessions=*/true);
    return std::move(listen_fd_);
}

uint64_t BrokerServer::add(Entry entry, uint32_t events) {
    uint64_t id = next_id_++;
    epoll_event ev{};
    ev.events = events;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, entry.fd, &ev) < 0) {
        spdlog::error("epoll_ctl ADD fd {} failed: {}", entry.fd, std::strerror(errno));
    }
    if (entry.kind == EntryKind::kHandshake) {
        ++handshakes_;
    }
    entries_.emplace(id, std::move(entry));
    return id;
}

void BrokerServer::remove(uint64_t id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
        return;
    }
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd, nullptr);
    if (it->second.kind == EntryKind::kHandshake) {
        --handshakes_;
    }
    entries_.erase(it);
}

void BrokerServer::loop() {
    epoll_event events[64];
    auto last_reap = std::chrono::steady_clock::now();
    auto last_beat = last_reap;
    while (!stop_) {
        int n = ::epoll_wait(epoll_.get(), events, 64, 50);
        if (n < 0 && errno != EINTR) {
            spdlog::error("epoll_wait failed: {}", std::strerror(errno));
            break;
        }
        for (int i = 0; i < n && !stop_; ++i) {
            dispatch(events[i].data.u64);
        }
        auto now = std::chrono::steady_clock::now();
        if (now - last_reap >= std::chrono::milliseconds(50)) {
            last_reap = now;
            reap();
        }
        if (options_.heartbeat && options_.heartbeat_period.count() > 0 &&
            now - last_beat >= options_.heartbeat_period) {
            last_beat = now;
            options_.heartbeat();
        }
    }
}

void BrokerServer::dispatch(uint64_t id) {
    auto it = entries_.find(id);
    if (it == entries_.end()) {
        return;  // removed earlier in this batch
    }
    switch (it->second.kind) {
        case EntryKind::kListen:
            acceptAll(it->second.fd);
            break;
        case EntryKind::kWake:
            takeQueued(it->second.fd);
            break;
        case EntryKind::kHandshake:
            handshake(id);
            break;
        case EntryKind::kChannel:
            readChannel(id);
            break;
        case EntryKind::kPidfd: {
            auto s = it->second.session;  // a copy: ending the session removes this entry
            endSession(s, "process exited");
            break;
        }
    }
}

void BrokerServer::takeQueued(int wake_fd) {
    uint64_t v;
    (void)!::read(wake_fd, &v, sizeof(v));
    std::vector<std::shared_ptr<Session>> watch;
    std::vector<Eviction> evict;
    {
        std::lock_guard lock(queue_mu_);
        watch.swap(to_watch_);
        evict.swap(to_evict_);
    }
    for (auto &s : watch) {
        startWatching(s);
    }
    for (auto &[session, done] : evict) {
        if (!session->ended()) {
            events_->publish(AdminEvents::aboutSession(AdminEvents::Event::EVICTION, *session,
                                                       "evicted by an administrator"));
            endSession(session, "evicted by an administrator");
        }
        done->set_value();
    }
}

void BrokerServer::startWatching(const std::shared_ptr<Session> &s) {
    if (s->pidfd() >= 0 && !s->ended()) {
        add(Entry::watching(EntryKind::kPidfd, s->pidfd(), s), EPOLLIN);
    }
    // A session restored after a restart comes with its fd channel.
    if (s->attached() && !s->ended()) {
        add(Entry::watching(EntryKind::kChannel, s->channelFd(), s), EPOLLIN | EPOLLRDHUP);
    }
}

template <typename... Args>
void BrokerServer::logDropped(fmt::format_string<Args...> what, Args &&...args) {
    uint64_t suppressed = 0;
    if (!drop_log_.allow(&suppressed)) {
        return;
    }
    std::string line = fmt::format(what, std::forward<Args>(args)...);
    if (suppressed > 0) {
        spdlog::warn("{} ({} more dropped connection(s) not logged)", line, suppressed);
    } else {
        spdlog::warn("{}", line);
    }
}

void BrokerServer::acceptAll(int listen_fd) {
    for (;;) {
        // Non-blocking: gRPC's event engine hangs on a blocking fd.
        UniqueFd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) {
            if (errno == EINTR || errno == ECONNABORTED) {
                continue;
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                spdlog::warn("accept4 failed: {}", std::strerror(errno));
            }
            return;
        }
        if (handshakes_ >= options_.max_pending_handshakes) {
            logDropped("too many connections in handshake ({}); connection dropped", handshakes_);
            continue;
        }
        auto peer = peerIdentity(fd.get());
        if (!peer.isOk()) {
            logDropped("connection dropped: {}", peer.status().message());
            continue;
        }
        size_t mine = 0;
        for (const auto &[eid, other] : entries_) {
            if (other.kind == EntryKind::kHandshake && other.peer.creds.uid == peer->creds.uid) {
                ++mine;
            }
        }
        if (mine >= options_.max_handshakes_per_uid) {
            logDropped("uid {} (pid {}) already has {} connections in handshake; connection dropped",
                       peer->creds.uid, peer->creds.pid, mine);
            continue;
        }
        Entry e = Entry::owning(EntryKind::kHandshake, std::move(fd));
        e.peer = std::move(peer).value();
        e.deadline = std::chrono::steady_clock::now() + options_.handshake_timeout;
        // Edge-triggered while in handshake: a partial preface stays unread in the socket, and a
        // level-triggered entry would spin until the rest (or the timeout) arrives.
        add(std::move(e), EPOLLIN | EPOLLRDHUP | EPOLLET);
    }
}

void BrokerServer::handshake(uint64_t id) {
    Entry &e = entries_.at(id);
    uint8_t buf[sizeof(AttachRequest)];
    ssize_t n = ::recv(e.fd, buf, sizeof(buf), MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    if (n <= 0) {
        remove(id);  // closed or failed before saying anything useful
        return;
    }
    auto len = static_cast<size_t>(n);
    bool ibvx = isPrefix(buf, len, kPrefaceMagic, sizeof(kPrefaceMagic));
    bool http2 = isPrefix(buf, len, kHttp2Preface, kHttp2PrefaceLen);
    if (!ibvx && !http2) {
        spdlog::info("connection from pid {} uid {} sent neither HTTP/2 nor IBVX; closed", e.peer.creds.pid,
                     e.peer.creds.uid);
        remove(id);
        return;
    }
    if (http2) {
        // The whole preface before gRPC gets the connection: gRPC has no deadline for a peer that
        // stops mid-preface, ours (handshake_timeout) applies until then.
        if (len < kHttp2PrefaceLen) {
            return;  // wait for more
        }
        (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, e.fd, nullptr);
        connections_.set(e.fd, e.peer);
        int fd = e.owned.release();
        --handshakes_;
        entries_.erase(id);
        grpc::AddInsecureChannelFromFd(server_.get(), fd);
        return;
    }
    if (len < sizeof(AttachRequest)) {
        return;
    }
    AttachRequest req;
    if (::recv(e.fd, &req, sizeof(req), 0) != static_cast<ssize_t>(sizeof(req))) {
        remove(id);
        return;
    }
    int status = 0;
    std::shared_ptr<Session> session;
    if (req.version != kFdChannelVersion) {
        status = EPROTONOSUPPORT;
    } else {
        SessionToken token;
        std::memcpy(token.data(), req.token, token.size());
        status = broker_.attach(token, e.peer.creds, e.owned, &session);
    }
    if (status == 0) {
        // The commit point of the attach, before the reply: once the tenant hears it is attached
        // and makes its next call, the session survives a crash (its fd channel is in the
        // snapshot and the fd store). Committed after the reply, a crash in between lost it.
        if (Status st = broker_.commit(*session, StoredReply{}); !st.isOk()) {
            spdlog::warn("session {}: cannot keep its state for a restart: {}", session->id(), st.message());
        }
    }
    AttachReply rep{};
    std::memcpy(rep.magic, kPrefaceMagic, sizeof(rep.magic));
    rep.status = status;
    (void)::send(e.fd, &rep, sizeof(rep), MSG_NOSIGNAL | MSG_DONTWAIT);
    crashOnceAt("AttachReplied");  // the tenant told it is attached (tests only)
    if (status != 0) {
        spdlog::info("fd-channel attach from pid {} refused: {}", e.peer.creds.pid, std::strerror(status));
        remove(id);
        return;
    }
    // The session owns the fd now; the entry only watches it, level-triggered: one frame is
    // read per wake-up.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, e.fd, &ev);
    e.kind = EntryKind::kChannel;
    e.session = session;
    --handshakes_;
    spdlog::debug("session {} attached its fd channel", session->id());
}

void BrokerServer::readChannel(uint64_t id) {
    std::shared_ptr<Session> s = entries_.at(id).session;
    Frame f;
    int r = recvFrame(s->channelFd(), &f, 100);
    if (r == 0) {
        endSession(s, "fd channel closed");
        return;
    }
    if (r < 0) {
        endSession(s, "malformed fd-channel frame");
        return;
    }
    if (f.type != FrameType::kFdTransfer || !f.fd) {
        endSession(s, "unexpected fd-channel frame");
        return;
    }
    if (!s->putXfer(f.id, std::move(f.fd))) {
        endSession(s, "fd transfer refused (duplicate id or too many pending)");
    }
}

void BrokerServer::endSession(const std::shared_ptr<Session> &session, const char *why) {
    std::vector<uint64_t> ids;
    for (auto &[id, e] : entries_) {
        if (e.session == session) {
            ids.push_back(id);
        }
    }
    for (uint64_t id : ids) {
        remove(id);
    }
    size_t objects = session->objectCount();
    broker_.endSession(session);
    stats_.forgetSession(session->id());
    events_->publish(AdminEvents::aboutSession(AdminEvents::Event::SESSION_CLOSE, *session, why));
    const auto &c = session->identity().creds;
    uint64_t unlogged = events_->audit().sessionEnded(session->id());
    spdlog::info("session {} ended ({}): pid {} uid {}, {} object(s) destroyed{}", session->id(), why, c.pid,
                 c.uid, objects,
                 unlogged == 0
                     ? std::string()
                     : fmt::format("; {} audit event(s) since its last audit line over its {} lines/s "
                                   "not logged (ibv-extendctl watch, ibv_extend_audit_* counters)",
                                   unlogged, AuditLog::kLinesPerSessionPerSecond));
}

void BrokerServer::reap() {
    auto now = std::chrono::steady_clock::now();
    std::vector<uint64_t> expired;
    for (auto &[id, e] : entries_) {
        if (e.kind == EntryKind::kHandshake && now > e.deadline) {
            expired.push_back(id);
        }
    }
    for (uint64_t id : expired) {
        spdlog::info("connection from pid {} said nothing within the handshake timeout; closed",
                     entries_.at(id).peer.creds.pid);
        remove(id);
    }
    for (auto &s : broker_.unattachedExpired(now)) {
        endSession(s, "fd channel not attached in time");
    }
}

}  // namespace ibvx::daemon
