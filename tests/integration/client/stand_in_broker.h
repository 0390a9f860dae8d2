// What the stand-ins for ibv-extendd (ibvx-fake-broker, ibvx-restarting-broker) share: the
// broker's side of the real wire contract without the broker. One Unix socket whose connections
// are told apart by their preface (HTTP/2 goes to a gRPC server with no listening port of its
// own, IBVX is an fd channel), the fd channel's attach handshake and the kFdTransfer frames a
// client sends on it, sessions by token, the device fake0, and failures that carry an
// ErrorDetail errno as the real broker's do. Each stand-in adds the calls it answers.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "ibv_extend/v1/broker.grpc.pb.h"

namespace ibvx::test {

namespace pb = ::ibv_extend::v1;

// A failed call as the real broker sends it: the code, a message, the errno in an ErrorDetail.
grpc::Status wireError(grpc::StatusCode code, int err, const std::string &message);

// A random non-zero value, as the real broker's handles are.
uint64_t randomHandle();

// The one device the stand-ins serve, fake0: virtual, driver ABI V3 with every op.
inline constexpr char kFakeDevice[] = "fake0";
inline constexpr uint32_t kAllDriverOps = (1U << 11) - 1;
void describeFakeDevice(pb::DeviceInfo *d);

// A session: its fd channel and the fds the client sent on it. A stand-in derives its own
// session from this one to keep its objects.
struct StandInSession {
    virtual ~StandInSession() = default;

    // The fd the client sent under xfer id, waited for up to `wait` (it travels on the other
    // connection, so it may arrive after the call naming it); an empty fd if it never came.
    // `lock` holds mu.
    UniqueFd takeXfer(std::unique_lock<std::mutex> &lock, uint64_t id, std::chrono::milliseconds wait);

    std::mutex mu;
    std::condition_variable xfer_arrived;
    UniqueFd fd_channel;                 // guarded by mu; set before the client hears it attached
    std::map<uint64_t, UniqueFd> xfers;  // guarded by mu
};

// What every SessionTable does alike: a random token, Hello's answer for it (broker 4.2, the
// real broker's attach timeout), the token a call names ("" when none).
SessionToken newSessionToken();
void answerHello(const SessionToken &token, pb::HelloResponse *resp);
std::string sessionMetadata(const grpc::ServerContext &ctx);

// The sessions by token: Hello opens one, a call names its own in "ibvx-session" metadata, and
// an fd channel presents the token to attach. S: a StandInSession.
template <typename S>
class SessionTable {
  public:
    // Hello as the real broker answers it: a client of major version 4 gets a new session under
    // a new token.
    grpc::Status open(const pb::HelloRequest &req, pb::HelloResponse *resp);
    // The session of a call's "ibvx-session" metadata; nullptr when it names none.
    std::shared_ptr<S> of(const grpc::ServerContext &ctx) { return byHex(sessionMetadata(ctx)); }
    std::shared_ptr<S> byToken(const SessionToken &token) { return byHex(tokenToHex(token)); }
    // The session is gone (a broker that never committed it died).
    void forget(const SessionToken &token) {
        std::lock_guard lock(mu_);
        sessions_.erase(tokenToHex(token));
    }

  private:
    std::shared_ptr<S> byHex(const std::string &hex) {
        std::lock_guard lock(mu_);
        auto it = sessions_.find(hex);
        return it == sessions_.end() ? nullptr : it->second;
    }

    std::mutex mu_;
    std::map<std::string, std::shared_ptr<S>> sessions_;  // guarded by mu_, by the token's hex
};

// What the socket side asks of a stand-in besides its gRPC service.
class StandInHooks {
  public:
    virtual ~StandInHooks() = default;
    // The session whose token an fd channel presents; nullptr refuses the attach (ENOENT).
    virtual std::shared_ptr<StandInSession> sessionByToken(const SessionToken &token) = 0;
    // Asked before each accept: false leaves new connections waiting in the listen backlog.
    virtual bool accepting() { return true; }
    // Asked when an fd channel presents its token: true closes it unanswered, as a broker that
    // dies in the middle of the attach does.
    virtual bool dropAttach(const SessionToken &token) {
        (void)token;
        return false;
    }
    // An HTTP/2 connection, just before gRPC gets it.
    virtual void grpcConnectionOpened(int fd) { (void)fd; }
};

// Binds socket_path (replacing a stale file) and serves it until the process is killed: every
// connection on a thread of its own, by its preface. Returns only when it cannot start: the
// process's exit status.
int serveStandIn(const char *socket_path, grpc::Service &service, StandInHooks &hooks);

template <typename S>
grpc::Status SessionTable<S>::open(const pb::HelloRequest &req, pb::HelloResponse *resp) {
    if (req.client_version().major() != 4) {
        return wireError(grpc::StatusCode::FAILED_PRECONDITION, EPROTONOSUPPORT, "major version");
    }
    SessionToken token = newSessionToken();
    {
        std::lock_guard lock(mu_);
        sessions_[tokenToHex(token)] = std::make_shared<S>();
    }
    answerHello(token, resp);
    return grpc::Status::OK;
}

}  // namespace ibvx::test
