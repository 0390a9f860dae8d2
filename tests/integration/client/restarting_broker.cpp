// ibvx-restarting-broker: a stand-in for ibv-extendd that loses its gRPC side the way a broker
// restart does, to test the client's retry on its own. It speaks the real wire contract (one
// Unix socket, preface demux, gRPC on injected fds, the fd channel with its attach handshake:
// stand_in_broker.h) for the calls a tenant needs to open a device and allocate PDs, and keeps
// replies under their idempotency keys as the real broker does.
//
// The first AllocPd it applies is "the call the old broker applied and committed but never
// answered": it stores the reply, then shuts down every gRPC connection and stops accepting for
// a moment (new connections wait in the listen backlog, as they do while a successor starts),
// while the fd channels stay open. The client must retry that call with the same key and get
// the stored reply.
//
// With "crash-in-first-open", the broker also "crashes" in the middle of the first session's
// open: the first fd channel to present its token is closed unanswered, the session Hello opened
// is forgotten (it was never committed) and the gRPC side is lost as above. The client must
// open its session again from the start.
//
// Every mutating call is logged to LOG_PATH as "METHOD KEY applied|replayed" (KEY "-" when the
// call had none), and the dropped attach as "Attach - dropped", so a test sees what ran and
// what was answered from a stored reply.
// Usage: ibvx-restarting-broker SOCKET_PATH LOG_PATH [crash-in-first-open]   (runs until killed)
#include <fcntl.h>
#include <sys/socket.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/unique_fd.h"
#include "tests/integration/client/stand_in_broker.h"

namespace pb = ibv_extend::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;
using ibvx::test::randomHandle;
using ibvx::test::wireError;

namespace {

class RestartingBroker final : public pb::Broker::Service, public ibvx::test::StandInHooks {
  public:
    RestartingBroker(const char *log_path, bool crash_in_first_open)
        : log_(fopen(log_path, "w")), crash_in_open_(crash_in_first_open) {}

    bool dropAttach(const ibvx::SessionToken &t) override {
        {
            std::lock_guard lock(mu_);
            if (!crash_in_open_) {
                return false;
            }
            crash_in_open_ = false;
            log("Attach", "-", "dropped");
        }
        sessions_.forget(t);
        loseGrpc();
        return true;
    }
    std::shared_ptr<ibvx::test::StandInSession> sessionByToken(const ibvx::SessionToken &t) override {
        return sessions_.byToken(t);
    }
    // Connections queue in the backlog while a pause lasts.
    bool accepting() override {
        std::lock_guard lock(mu_);
        return std::chrono::steady_clock::now() >= paused_until_;
    }
    // The server ends of the gRPC connections (dups: ours to shut down, never reused).
    void grpcConnectionOpened(int fd) override {
        std::lock_guard lock(mu_);
        connections_.emplace_back(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    }

    Status Hello(ServerContext *, const pb::HelloRequest *req, pb::HelloResponse *resp) override {
        return sessions_.open(*req, resp);
    }

    Status OpenContext(ServerContext *ctx, const pb::OpenContextRequest *req,
                       pb::OpenContextResponse *resp) override {
        return mutating(ctx, "OpenContext", resp, [&] {
            if (req->device_name() != ibvx::test::kFakeDevice) {
                return wireError(StatusCode::NOT_FOUND, ENODEV, "no device " + req->device_name());
            }
            resp->set_context(randomHandle());
            ibvx::test::describeFakeDevice(resp->mutable_device());
            resp->set_driver_version(3);
            resp->set_driver_ops_present(ibvx::test::kAllDriverOps);
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
            resp->set_pd(randomHandle());
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
        if (sessions_.of(*ctx) == nullptr) {
            return wireError(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        const auto &md = ctx->client_metadata();
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

    FILE *log_;
    ibvx::test::SessionTable<ibvx::test::StandInSession> sessions_;
    std::mutex mu_;
    std::map<std::string, std::string> replies_;          // guarded by mu_: key -> serialized reply
    std::vector<ibvx::UniqueFd> connections_;             // guarded by mu_
    bool dropped_once_ = false;                           // guarded by mu_
    bool crash_in_open_ = false;                          // guarded by mu_
    std::chrono::steady_clock::time_point paused_until_;  // guarded by mu_
};

}  // namespace

int main(int argc, char **argv) {
    const bool crash_in_open = argc == 4 && std::string(argv[3]) == "crash-in-first-open";
    if (argc != 3 && !crash_in_open) {
        fprintf(stderr, "usage: %s SOCKET_PATH LOG_PATH [crash-in-first-open]\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    RestartingBroker broker(argv[2], crash_in_open);
    return ibvx::test::serveStandIn(argv[1], broker, broker);
}
