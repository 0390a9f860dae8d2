// The gRPC edge: ibv_extend.v1.Broker on the callback API (Admin: admin_service.h). Each method
// authenticates the call (token + connection credentials), converts proto -> core, calls the
// core and converts back. No state of its own beyond counters.
//
// Mutating calls (isMutating) are idempotent under their "ibvx-idempotency-key" metadata: a key
// whose reply the session stored is answered from it without running anything, and every
// mutating call that ran ends at Broker::commit (reply stored, session state written) before
// its reply leaves (docs/restart.md, "The commit point").
//
// Threading: handlers run on gRPC's callback threads and never wait there. The calls that wait
// up to Broker::Options::xfer_wait for an fd on the fd channel (RegMr, SetAsyncEventFd, CreateCq
// with an event fd) run on the service's BlockingExecutor and finish their reactors from there.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "daemon/core/broker.h"
#include "daemon/edge/blocking_executor.h"
#include "daemon/edge/connections.h"
#include "daemon/edge/pod_resolver.h"
#include "daemon/edge/rpc_stats.h"
#include "daemon/edge/serve.h"
#include "ibv_extend/v1/broker.grpc.pb.h"

namespace ibvx::daemon {

namespace pb = ::ibv_extend::v1;

inline constexpr char kSessionMetadataKey[] = "ibvx-session";
// 16 lower-case hex digits of a non-zero 64-bit value, new per call, the same on its retries.
inline constexpr char kIdempotencyMetadataKey[] = "ibvx-idempotency-key";

// True for the methods that change the session (create, destroy, modify, register, negotiate):
// they take an idempotency key and commit. Hello, ListDevices and the Query* methods do not.
bool isMutating(Method m);
// The key of an "ibvx-idempotency-key" value; INVALID_ARGUMENT unless 16 hex digits, not 0.
StatusOr<uint64_t> parseIdempotencyKey(std::string_view text);

// Keys of earlier calls whose replies the tenant has, comma-separated, on a mutating call: it
// will not retry them, so their stored replies are dropped (a stored reply is ~200 B of heap
// and a record in the restart log; a session keeps up to 64). Optional: a client that sends
// none has its replies kept until they age out, as before.
inline constexpr char kRetireMetadataKey[] = "ibvx-retire-keys";
inline constexpr size_t kMaxRetireKeys = 64;
// The keys of an "ibvx-retire-keys" value; INVALID_ARGUMENT unless 1 to kMaxRetireKeys keys,
// each as parseIdempotencyKey takes it.
StatusOr<std::vector<uint64_t>> parseRetireKeys(std::string_view text);

// Threads and queue of the Broker service's BlockingExecutor.
struct BlockingLimits {
    size_t threads = 4;
    size_t max_queued = 1024;
};

// What the Broker service tells whoever serves the socket: an interface, so the service and the
// server (which watches each session's pidfd and attach deadline) meet at one seam instead of a
// lambda that captures the server. Called from a gRPC thread, once per successful Hello.
class SessionListener {
  public:
    virtual ~SessionListener() = default;
    virtual void sessionOpened(const std::shared_ptr<Session> &session) = 0;
};

class BrokerService final : public pb::Broker::CallbackService {
  public:
    // listener (not owned, may be nullptr) hears of every session Hello created.
    BrokerService(Broker &broker, ConnectionRegistry &connections, RpcStats &stats, SessionListener *listener,
                  BlockingLimits blocking = {});
    // Names each new session's pod ([kubernetes] pod_resources_socket); nullptr: off. Set before
    // serving.
    void setPodResolver(std::shared_ptr<PodResolver> pods) { pods_ = std::move(pods); }

    grpc::ServerUnaryReactor *Hello(grpc::CallbackServerContext *ctx, const pb::HelloRequest *req,
                                    pb::HelloResponse *resp) override;
    grpc::ServerUnaryReactor *ListDevices(grpc::CallbackServerContext *ctx, const pb::ListDevicesRequest *req,
                                          pb::ListDevicesResponse *resp) override;
    grpc::ServerUnaryReactor *OpenContext(grpc::CallbackServerContext *ctx, const pb::OpenContextRequest *req,
                                          pb::OpenContextResponse *resp) override;
    grpc::ServerUnaryReactor *CloseContext(grpc::CallbackServerContext *ctx,
                                           const pb::CloseContextRequest *req,
                                           pb::CloseContextResponse *resp) override;
    grpc::ServerUnaryReactor *QueryDevice(grpc::CallbackServerContext *ctx, const pb::QueryDeviceRequest *req,
                                          pb::QueryDeviceResponse *resp) override;
    grpc::ServerUnaryReactor *QueryDeviceAttr(grpc::CallbackServerContext *ctx,
                                              const pb::QueryDeviceAttrRequest *req,
                                              pb::QueryDeviceAttrResponse *resp) override;
    grpc::ServerUnaryReactor *QueryPort(grpc::CallbackServerContext *ctx, const pb::QueryPortRequest *req,
                                        pb::QueryPortResponse *resp) override;
    grpc::ServerUnaryReactor *SetAsyncEventFd(grpc::CallbackServerContext *ctx,
                                              const pb::SetAsyncEventFdRequest *req,
                                              pb::SetAsyncEventFdResponse *resp) override;
    grpc::ServerUnaryReactor *AllocPd(grpc::CallbackServerContext *ctx, const pb::AllocPdRequest *req,
                                      pb::AllocPdResponse *resp) override;
    grpc::ServerUnaryReactor *DeallocPd(grpc::CallbackServerContext *ctx, const pb::DeallocPdRequest *req,
                                        pb::DeallocPdResponse *resp) override;
    grpc::ServerUnaryReactor *RegMr(grpc::CallbackServerContext *ctx, const pb::RegMrRequest *req,
                                    pb::RegMrResponse *resp) override;
    grpc::ServerUnaryReactor *ReregMr(grpc::CallbackServerContext *ctx, const pb::ReregMrRequest *req,
                                      pb::ReregMrResponse *resp) override;
    grpc::ServerUnaryReactor *DeregMr(grpc::CallbackServerContext *ctx, const pb::DeregMrRequest *req,
                                      pb::DeregMrResponse *resp) override;
    grpc::ServerUnaryReactor *CreateCq(grpc::CallbackServerContext *ctx, const pb::CreateCqRequest *req,
                                       pb::CreateCqResponse *resp) override;
    grpc::ServerUnaryReactor *DestroyCq(grpc::CallbackServerContext *ctx, const pb::DestroyCqRequest *req,
                                        pb::DestroyCqResponse *resp) override;
    grpc::ServerUnaryReactor *CreateQp(grpc::CallbackServerContext *ctx, const pb::CreateQpRequest *req,
                                       pb::CreateQpResponse *resp) override;
    grpc::ServerUnaryReactor *DestroyQp(grpc::CallbackServerContext *ctx, const pb::DestroyQpRequest *req,
                                        pb::DestroyQpResponse *resp) override;
    grpc::ServerUnaryReactor *CreateSrq(grpc::CallbackServerContext *ctx, const pb::CreateSrqRequest *req,
                                        pb::CreateSrqResponse *resp) override;
    grpc::ServerUnaryReactor *DestroySrq(grpc::CallbackServerContext *ctx, const pb::DestroySrqRequest *req,
                                         pb::DestroySrqResponse *resp) override;
    grpc::ServerUnaryReactor *CreateAh(grpc::CallbackServerContext *ctx, const pb::CreateAhRequest *req,
                                       pb::CreateAhResponse *resp) override;
    grpc::ServerUnaryReactor *DestroyAh(grpc::CallbackServerContext *ctx, const pb::DestroyAhRequest *req,
                                        pb::DestroyAhResponse *resp) override;
    grpc::ServerUnaryReactor *ResizeCq(grpc::CallbackServerContext *ctx, const pb::ResizeCqRequest *req,
                                       pb::ResizeCqResponse *resp) override;
    grpc::ServerUnaryReactor *OpenXrcd(grpc::CallbackServerContext *ctx, const pb::OpenXrcdRequest *req,
                                       pb::OpenXrcdResponse *resp) override;
    grpc::ServerUnaryReactor *AttachMcast(grpc::CallbackServerContext *ctx, const pb::McastRequest *req,
                                          pb::McastResponse *resp) override;
    grpc::ServerUnaryReactor *DetachMcast(grpc::CallbackServerContext *ctx, const pb::McastRequest *req,
                                          pb::McastResponse *resp) override;
    grpc::ServerUnaryReactor *AllocDm(grpc::CallbackServerContext *ctx, const pb::AllocDmRequest *req,
                                      pb::AllocDmResponse *resp) override;
    grpc::ServerUnaryReactor *FreeDm(grpc::CallbackServerContext *ctx, const pb::FreeDmRequest *req,
                                     pb::FreeDmResponse *resp) override;
    grpc::ServerUnaryReactor *RegDmMr(grpc::CallbackServerContext *ctx, const pb::RegDmMrRequest *req,
                                      pb::RegMrResponse *resp) override;
    grpc::ServerUnaryReactor *OpenQp(grpc::CallbackServerContext *ctx, const pb::OpenQpRequest *req,
                                     pb::CreateQpResponse *resp) override;
    grpc::ServerUnaryReactor *CloseXrcd(grpc::CallbackServerContext *ctx, const pb::CloseXrcdRequest *req,
                                        pb::CloseXrcdResponse *resp) override;
    grpc::ServerUnaryReactor *AllocMw(grpc::CallbackServerContext *ctx, const pb::AllocMwRequest *req,
                                      pb::AllocMwResponse *resp) override;
    grpc::ServerUnaryReactor *DeallocMw(grpc::CallbackServerContext *ctx, const pb::DeallocMwRequest *req,
                                        pb::DeallocMwResponse *resp) override;
    grpc::ServerUnaryReactor *ModifyQp(grpc::CallbackServerContext *ctx, const pb::ModifyQpRequest *req,
                                       pb::ModifyQpResponse *resp) override;
    grpc::ServerUnaryReactor *QueryQp(grpc::CallbackServerContext *ctx, const pb::QueryQpRequest *req,
                                      pb::QueryQpResponse *resp) override;
    grpc::ServerUnaryReactor *ModifyQpExtend(grpc::CallbackServerContext *ctx,
                                             const pb::ModifyQpExtendRequest *req,
                                             pb::ModifyQpExtendResponse *resp) override;
    grpc::ServerUnaryReactor *QueryQpExtend(grpc::CallbackServerContext *ctx,
                                            const pb::QueryQpExtendRequest *req,
                                            pb::QueryQpExtendResponse *resp) override;
    grpc::ServerUnaryReactor *QueryQpSupportedHyroceFeature(
        grpc::CallbackServerContext *ctx, const pb::QueryQpSupportedHyroceFeatureRequest *req,
        pb::QueryQpSupportedHyroceFeatureResponse *resp) override;
    grpc::ServerUnaryReactor *NegoQpHyroceFeature(grpc::CallbackServerContext *ctx,
                                                  const pb::NegoQpHyroceFeatureRequest *req,
                                                  pb::NegoQpHyroceFeatureResponse *resp) override;

    // Calls currently inside a handler (for a graceful shutdown).
    int inflight() const { return calls_.inflight(); }
    std::chrono::steady_clock::time_point lastFinish() const { return calls_.lastFinish(); }

  private:
    // What happens before a call runs: its session and, for a mutating call, its key (0: none).
    // `replayed` is set when the key's reply is stored: resp holds it, the call must not run.
    struct Admitted {
        std::shared_ptr<Session> session;
        uint64_t key = 0;
        std::optional<Status> replayed;
        // Room for the reply a call with a key stores (Broker::reserveReply); shared, since a
        // blocking call's task is copied. Given back if the call never commits.
        std::shared_ptr<QuotaCharge> reply_quota;
    };

    // The steps of every call but Hello, in order: admit (authenticate; find a stored reply),
    // run the handler's fn(session) (it fills resp), commit a mutating call, finish (counted,
    // timed, answered). A call refused at admission or replayed does not run.
    //
    // serve() runs fn on this thread; serveBlocking() runs fn and the commit on blocking_, so
    // fn copies what it needs from the request (resp lives until the call finishes).
    template <typename Fn>
    grpc::ServerUnaryReactor *serve(grpc::CallbackServerContext *ctx, Method m,
                                    google::protobuf::Message *resp, Fn &&fn);
    template <typename Fn>
    grpc::ServerUnaryReactor *serveBlocking(grpc::CallbackServerContext *ctx, Method m,
                                            google::protobuf::Message *resp, Fn fn);
    StatusOr<Admitted> admit(grpc::CallbackServerContext *ctx, Method m, google::protobuf::Message *resp);
    StatusOr<std::shared_ptr<Session>> sessionOf(grpc::CallbackServerContext *ctx);
    template <typename Fn>
    Status runAndCommit(const Admitted &a, Method m, const google::protobuf::Message &resp, Fn &fn);
    // The commit point of a mutating call that ran (a failed one included).
    void commitReply(const Admitted &a, Method m, const Status &result,
                     const google::protobuf::Message &resp);
    // A call that does not run: refused at admission, or answered from its stored reply.
    static grpc::ServerUnaryReactor *finishWithoutRunning(const CallRecorder<Method>::Call &call,
                                                          const StatusOr<Admitted> &a);

    // Hello's own admission: the connection's identity (and pod) become a new session, logged
    // and announced to the listener.
    StatusOr<std::shared_ptr<Session>> openSession(grpc::CallbackServerContext *ctx,
                                                   const pb::HelloRequest &req);

    Broker &broker_;
    ConnectionRegistry &connections_;
    RpcStats &stats_;
    SessionListener *listener_;
    std::shared_ptr<PodResolver> pods_;
    CallRecorder<Method> calls_{stats_};
    BlockingExecutor blocking_;  // after calls_: its threads finish calls, so it goes first
};

}  // namespace ibvx::daemon
