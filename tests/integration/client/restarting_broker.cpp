// ibvx-restarting-broker: a stand-in for ibv-extendd that loses its gRPC side the way a broker
// restart does, to test the client's retry on its own. It speaks the real wire contract (one
// Unix socket, preface demux, gRPC on injected fds, the fd channel with its attach handshake)
// for the calls a tenant needs to open a device and allocate PDs, and keeps replies under their
// idempotency keys as the real broker does.
//
// The first AllocPd it applies is "the call the old broker applied and committed but never
// answered": it stores the reply, then shuts down every gRPC connection and stops accepting for
// a moment (new connections wait in the listen backlog, as they do while a successor starts),
// while the fd channels stay open. The client must retry that call with the same key and get
// the stored reply.
//
// Every mutating call is logged to LOG_PATH as "METHOD KEY applied|replayed" (KEY "-" when the
// call had none), so a test sees what ran and what was answered from a stored reply.
// Usage: ibvx-restarting-broker SOCKET_PATH LOG_PATH   (runs until SIGTERM/SIGKILL)
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>

#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "ibv_extend/v1/broker.grpc.pb.h"

namespace pb = ibv_extend::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

namespace {

Status error(StatusCode code, int err, const std::string &msg) {
    pb::ErrorDetail d;
    d.set_errno_value(err);
    return Status(code, msg, d.SerializeAsString());
}

class RestartingBroker final : public pb::Broker::Service {
  public:
    explicit RestartingBroker(const char *log_path) : log_(fopen(log_path, "w")) {}

    bool knows(const ibvx::SessionToken &t) {
        std::lock_guard lock(mu_);
        return tokens_.count(ibvx::tokenToHex(t)) != 0;
    }
    // The server ends of the gRPC connections (dups: ours to shut down, never reused).
    void addConnection(ibvx::UniqueFd fd) {
        std::lock_guard lock(mu_);
        connections_.push_back(std::move(fd));
    }
    // Connections queue in the backlog while this is in the future.
    bool accepting() {
        std::lock_guard lock(mu_);
        return std::chrono::steady_clock::now() >= paused_until_;
    }

    Status Hello(ServerContext *, const pb::HelloRequest *, pb::HelloResponse *resp) override {
        ibvx::SessionToken t;
        for (auto &b : t) {
            b = static_cast<uint8_t>(next());
        }
        {
            std::lock_guard lock(mu_);
            tokens_.emplace(ibvx::tokenToHex(t), 0);
        }
        resp->mutable_broker_version()->set_major(4);
        resp->mutable_broker_version()->set_minor(2);
        resp->set_session_token(std::string(reinterpret_cast<char *>(t.data()), t.size()));
        resp->set_attach_timeout_ms(5000);
        return Status::OK;
    }

    Status OpenContext(ServerContext *ctx, const pb::OpenContextRequest *req,
                       pb::OpenContextResponse *resp) override {
        return mutating(ctx, "OpenContext", resp, [&] {
            if (req->device_name() != "fake0") {
                return error(StatusCode::NOT_FOUND, ENODEV, "no device " + req->device_name());
            }
            resp->set_context(next());
            pb::DeviceInfo *d = resp->mutable_device();
            d->set_name("fake0");
            d->set_provider("fake");
            d->set_driver_version(3);
            d->set_phys_port_cnt(1);
            d->set_virtual_device(true);
            resp->set_driver_version(3);
            resp->set_driver_ops_present((1U << 11) - 1);
            return Status::OK;
        });
    }

    Status CloseContext(ServerContext *ctx, const pb::CloseContextRequest *,
                        pb::CloseContextResponse *resp) override {
        return mutating(ctx, "CloseContext", resp, [] { return Status::OK; });
    }

    Status AllocPd(ServerContext *ctx, const pb::AllocPdRequest *, pb::AllocPdResponse *resp) override {
        bool drop = false;
        Status st = mutating(ctx, "AllocPd", resp, [&] {
            resp->set_pd(next());
            std::lock_guard lock(mu_);
            drop = !dropped_once_;
            dropped_once_ = true;
            return Status::OK;
        });
        if (drop) {
            loseGrpc();
        }
        return st;
    }

    Status DeallocPd(ServerContext *ctx, const pb::DeallocPdRequest *, pb::DeallocPdResponse *resp) override {
        return mutating(ctx, "DeallocPd", resp, [] { return Status::OK; });
    }

  private:
    // Answers a stored reply for a known key, else runs fn and stores its reply.
    template <typename Fn>
    Status mutating(ServerContext *ctx, const char *method, google::protobuf::Message *resp, Fn fn) {
        const auto &md = ctx->client_metadata();
        auto s = md.find("ibvx-session");
        if (s == md.end() || !knownToken(std::string(s->second.data(), s->second.size()))) {
            return error(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        auto k = md.find("ibvx-idempotency-key");
        std::string key = k == md.end() ? "-" : std::string(k->second.data(), k->second.size());
        if (key != "-") {
            std::lock_guard lock(mu_);
            auto it = replies_.find(key);
            if (it != replies_.end()) {
                log(method, key, "replayed");
                resp->ParseFromString(it->second);
                return Status::OK;
            }
        }
        Status st = fn();
        std::lock_guard lock(mu_);
        if (st.ok() && key != "-") {
            replies_[key] = resp->SerializeAsString();
        }
        log(method, key, "applied");
        return st;
    }

    bool knownToken(const std::string &hex) {
        std::lock_guard lock(mu_);
        return tokens_.count(hex) != 0;
    }

    // What a restart does to the gRPC side: every connection closes; the socket keeps
    // listening, but nobody accepts for a while.
    void loseGrpc() {
        std::lock_guard lock(mu_);
        paused_until_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
        for (ibvx::UniqueFd &fd : connections_) {
            shutdown(fd.get(), SHUT_RDWR);
        }
        connections_.clear();
    }

    void log(const char *method, const std::string &key, const char *what) {  // mu_ held
        if (log_ != nullptr) {
            fprintf(log_, "%s %s %s\n", method, key.c_str(), what);
            fflush(log_);
        }
    }

    uint64_t next() {
        std::lock_guard lock(rng_mu_);
        uint64_t h = 0;
        while (h == 0) {
            h = rng_();
        }
        return h;
    }

    FILE *log_;
    std::mutex rng_mu_;
    std::mt19937_64 rng_{std::random_device{}()};  // guarded by rng_mu_
    std::mutex mu_;
    std::map<std::string, int> tokens_;                   // guarded by mu_
    std::map<std::string, std::string> replies_;          // guarded by mu_: key -> serialized reply
    std::vector<ibvx::UniqueFd> connections_;             // guarded by mu_
    bool dropped_once_ = false;                           // guarded by mu_
    std::chrono::steady_clock::time_point paused_until_;  // guarded by mu_
};

// The attach handshake, then holds the channel open until the client closes it.
void serveFdChannel(RestartingBroker *broker, int fd) {
    ibvx::UniqueFd sock(fd);
    ibvx::AttachRequest req{};
    size_t got = 0;
    while (got < sizeof(req)) {
        pollfd pfd{fd, POLLIN, 0};
        if (poll(&pfd, 1, 5000) <= 0) {
            return;
        }
        ssize_t n = recv(fd, reinterpret_cast<char *>(&req) + got, sizeof(req) - got, 0);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN) {
                continue;
            }
            return;
        }
        got += static_cast<size_t>(n);
    }
    ibvx::SessionToken t;
    memcpy(t.data(), req.token, t.size());
    bool known = broker->knows(t);
    ibvx::AttachReply rep{{'I', 'B', 'V', 'X'}, known ? 0 : ENOENT};
    if (send(fd, &rep, sizeof(rep), MSG_NOSIGNAL) != sizeof(rep) || !known) {
        return;
    }
    for (;;) {
        ibvx::Frame f;
        if (ibvx::recvFrame(fd, &f, -1) <= 0) {
            return;
        }
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s SOCKET_PATH LOG_PATH\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    RestartingBroker broker(argv[2]);
    grpc::ServerBuilder builder;
    builder.RegisterService(&broker);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();

    int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
    unlink(argv[1]);
    if (bind(lsock, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0 || listen(lsock, 64) < 0) {
        perror("bind/listen");
        return 1;
    }
    for (;;) {
        // Never blocked in accept(), and asked after a connection is there: a pause must hold
        // back the reconnect that follows it (the pause starts before the connections close).
        pollfd pfd{lsock, POLLIN, 0};
        if (poll(&pfd, 1, 10) <= 0 || !broker.accepting()) {
            usleep(10000);
            continue;
        }
        int fd = accept4(lsock, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        std::thread([&broker, &server, fd] {
            char magic[4];
            for (int tries = 0; tries < 500; ++tries) {
                ssize_t n = recv(fd, magic, sizeof(magic), MSG_PEEK);
                if (n == sizeof(magic)) {
                    if (memcmp(magic, ibvx::kPrefaceMagic, 4) == 0) {
                        serveFdChannel(&broker, fd);
                    } else {
                        broker.addConnection(ibvx::UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)));
                        grpc::AddInsecureChannelFromFd(server.get(), fd);
                    }
                    return;
                }
                if (n == 0 || (n < 0 && errno != EAGAIN)) {
                    break;
                }
                usleep(2000);
            }
            close(fd);
        }).detach();
    }
}
