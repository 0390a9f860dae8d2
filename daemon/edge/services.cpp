#include "daemon/edge/services.h"

#include <spdlog/spdlog.h>

#include <array>
#include <string>

#include "daemon/edge/arena_messages.h"
#include "daemon/edge/convert.h"
#include "daemon/edge/grpc_status.h"

namespace ibvx::daemon {
namespace {

// A core call's result into its reply (the call's response or one of its fields): the error as
// it is, or the reply filled in.
template <typename T, typename Out>
Status reply(StatusOr<T> result, Out *out) {
    RETURN_IF_ERROR(result);
    toProto(result.value(), out);
    return Status::ok();
}

// The full gRPC name ("/ibv_extend.v1.Broker/CreateCq"): what a stored reply is filed under, so
// a reply stored by one build is recognised by the next. Built once: every mutating call
// stores one.
const std::string &fullMethodName(Method m) {
    static const std::array<std::string, static_cast<size_t>(Method::kCount)> names = [] {
        std::array<std::string, static_cast<size_t>(Method::kCount)> out;
        for (size_t i = 0; i < out.size(); ++i) {
            out[i] =
                std::string("/") + pb::Broker::service_full_name() + "/" + methodName(static_cast<Method>(i));
        }
        return out;
    }();
    return names[static_cast<size_t>(m)];
}

// The status a stored reply was sent with. The reply was built by toGrpc() from a Status (here
// or in the broker this one restarted from), so the code maps back and toGrpc() of the result
// sends the same code, message and errno again.
Status storedStatus(const StoredReply &r) {
    if (r.code == static_cast<int>(grpc::StatusCode::OK)) {
        return Status::ok();
    }
    Code code = Code::kInternal;
    for (int c = static_cast<int>(Code::kInvalidArgument); c <= static_cast<int>(Code::kInternal); ++c) {
        if (static_cast<int>(grpcCode(static_cast<Code>(c))) == r.code) {
            code = static_cast<Code>(c);
        }
    }
    pb::ErrorDetail detail;
    int err = !r.details.empty() && detail.ParseFromString(r.details) ? detail.errno_value() : 0;
    return Status(code, err, r.message);
}

}  // namespace

bool isMutating(Method m) {
    return m < Method::kCount && brokerMethod(m).mutating;  // broker.proto's idempotency_level
}

StatusOr<uint64_t> parseIdempotencyKey(std::string_view text) {
    auto bad = [&] {
        return invalidArgument(
            "ibvx-idempotency-key must be 16 lower-case hex digits of a non-zero value, got '" +
            std::string(text.substr(0, 32)) + "'");
    };
    if (text.size() != 16) {
        return bad();
    }
    uint64_t key = 0;
    for (char c : text) {
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0) {
            return bad();
        }
        key = key << 4 | static_cast<uint64_t>(digit);
    }
    if (key == 0) {
        return bad();
    }
    return key;
}

StatusOr<std::vector<uint64_t>> parseRetireKeys(std::string_view text) {
    const std::string_view all = text;
    std::vector<uint64_t> keys;
    for (;;) {
        size_t comma = text.find(',');
        if (keys.size() == kMaxRetireKeys) {
            return invalidArgument(std::string(kRetireMetadataKey) + " names more than " +
                                   std::to_string(kMaxRetireKeys) + " keys");
        }
        StatusOr<uint64_t> key = parseIdempotencyKey(text.substr(0, comma));
        if (!key.isOk()) {
            return invalidArgument(
                std::string(kRetireMetadataKey) +
                " must be keys of 16 lower-case hex digits, not 0, separated by commas, got '" +
                std::string(all.substr(0, 64)) + (all.size() > 64 ? "...'" : "'"));
        }
        keys.push_back(*key);
        if (comma == std::string_view::npos) {
            return keys;
        }
        text.remove_prefix(comma + 1);
    }
}

BrokerService::BrokerService(Broker &broker, ConnectionRegistry &connections, RpcStats &stats,
                             SessionListener *listener, BlockingLimits blocking)
    : broker_(broker),
      connections_(connections),
      stats_(stats),
      listener_(listener),
      blocking_(blocking.threads, blocking.max_queued) {
    // Every method's request and response on one arena (daemon/edge/arena_messages.h).
#define IBVX_ARENA_FOR(name, request, response, mutating) \
    useArenaMessages(&BrokerService::SetMessageAllocatorFor_##name, this);
    IBVX_BROKER_METHODS(IBVX_ARENA_FOR)
#undef IBVX_ARENA_FOR
}

StatusOr<std::shared_ptr<Session>> BrokerService::sessionOf(grpc::CallbackServerContext *ctx) {
    auto peer = connections_.lookup(ctx->peer());
    if (!peer) {
        return permissionDenied("unknown connection");
    }
    const auto &md = ctx->client_metadata();
    auto it = md.find(kSessionMetadataKey);
    if (it == md.end()) {
        return Status(Code::kPermissionDenied, EACCES, "missing ibvx-session metadata (call Hello first)");
    }
    return broker_.authenticate(std::string(it->second.data(), it->second.size()), peer->creds);
}

StatusOr<BrokerService::Admitted> BrokerService::admit(grpc::CallbackServerContext *ctx, Method m,
                                                       google::protobuf::Message *resp) {
    Admitted a;
    ASSIGN_OR_RETURN(a.session, sessionOf(ctx));
    if (!isMutating(m)) {
        return a;
    }
    const auto &md = ctx->client_metadata();
    if (auto retire = md.find(kRetireMetadataKey); retire != md.end()) {
        ASSIGN_OR_RETURN(std::vector<uint64_t> keys,
                         parseRetireKeys(std::string_view(retire->second.data(), retire->second.size())));
        a.session->retireReplies(keys);
    }
    auto it = md.find(kIdempotencyMetadataKey);
    if (it == md.end()) {
        return a;  // a client from before idempotency keys: the call runs as it always did
    }
    ASSIGN_OR_RETURN(a.key, parseIdempotencyKey(std::string_view(it->second.data(), it->second.size())));
    // No lock from here to the commit: a client sends a key again only after the try before
    // failed, so two calls with one key at once are a broken client, and each just runs.
    std::optional<StoredReply> stored = a.session->findReply(a.key);
    if (!stored) {
        ASSIGN_OR_RETURN(QuotaCharge room, broker_.reserveReply(*a.session));
        a.reply_quota = std::make_shared<QuotaCharge>(std::move(room));
        return a;
    }
    if (stored->method != fullMethodName(m)) {
        return invalidArgument(
            "idempotency key reused: " + std::string(it->second.data(), it->second.size()) +
            " was sent with " + stored->method + "; every call needs a new key");
    }
    if (!resp->ParseFromString(stored->response)) {
        return Status(Code::kInternal, EIO, "the stored reply of this call does not parse");
    }
    a.replayed = storedStatus(*stored);
    return a;
}

void BrokerService::commitReply(const Admitted &a, Method m, const Status &result,
                                const google::protobuf::Message &resp) {
    Session &s = *a.session;
    grpc::Status wire = toGrpc(result);
    StoredReply stored;
    stored.key = a.key;
    stored.method = fullMethodName(m);
    stored.code = static_cast<int>(wire.error_code());
    stored.message = wire.error_message();
    stored.details = wire.error_details();
    if (result.isOk()) {
        stored.response = resp.SerializeAsString();  // a failed call sends no message
    }
    // The call did happen: its reply goes out either way; only a crash now would lose it.
    QuotaCharge room = a.reply_quota != nullptr ? std::move(*a.reply_quota) : QuotaCharge();
    if (Status st = broker_.commit(s, std::move(stored), std::move(room)); !st.isOk()) {
        spdlog::warn("session {}: {} could not be committed: {}", s.id(), methodName(m), st.toString());
    }
}

template <typename Fn>
Status BrokerService::runAndCommit(const Admitted &a, Method m, const google::protobuf::Message &resp,
                                   Fn &fn) {
    Status result = fn(*a.session);
    if (isMutating(m)) {
        commitReply(a, m, result, resp);
    }
    return result;
}

grpc::ServerUnaryReactor *BrokerService::finishWithoutRunning(const CallRecorder<Method>::Call &call,
                                                              const StatusOr<Admitted> &a) {
    if (!a.isOk()) {
        return call.finish(a.status());
    }
    return call.finish(*a->replayed, a->session->id());
}

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serve(grpc::CallbackServerContext *ctx, Method m,
                                               google::protobuf::Message *resp, Fn &&fn) {
    auto call = calls_.begin(ctx, m);
    auto a = admit(ctx, m, resp);
    if (!a.isOk() || a->replayed) {
        return finishWithoutRunning(call, a);
    }
    return call.finish(runAndCommit(*a, m, *resp, fn), a->session->id());
}

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serveBlocking(grpc::CallbackServerContext *ctx, Method m,
                                                       google::protobuf::Message *resp, Fn fn) {
    auto call = calls_.begin(ctx, m);
    auto a = admit(ctx, m, resp);
    if (!a.isOk() || a->replayed) {
        return finishWithoutRunning(call, a);
    }
    uint64_t id = a->session->id();
    return calls_.finishOn(
        blocking_, call,
        [this, m, resp, a = std::move(a).value(), fn = std::move(fn)]() mutable {
            return runAndCommit(a, m, *resp, fn);
        },
        id);
}

grpc::ServerUnaryReactor *BrokerService::Hello(grpc::CallbackServerContext *ctx, const pb::HelloRequest *req,
                                               pb::HelloResponse *resp) {
    auto call = calls_.begin(ctx, Method::kHello);
    auto session = openSession(ctx, *req);
    if (!session.isOk()) {
        return call.finish(session.status());
    }
    const Session &s = **session;
    toProto(broker_.options().version, resp->mutable_broker_version());
    resp->set_session_token(s.token().data(), s.token().size());
    toProto(s.identity(), resp->mutable_identity());
    resp->set_attach_timeout_ms(static_cast<uint32_t>(broker_.options().attach_timeout.count()));
    return call.finish(Status::ok(), s.id());
}

StatusOr<std::shared_ptr<Session>> BrokerService::openSession(grpc::CallbackServerContext *ctx,
                                                              const pb::HelloRequest &req) {
    auto peer = connections_.lookup(ctx->peer());
    if (!peer) {
        return permissionDenied("unknown connection");
    }
    if (pods_ != nullptr) {
        pods_->annotate(&*peer);  // never fails: unknown pods stay empty
    }
    Version v{req.client_version().major(), req.client_version().minor(), req.client_version().patch()};
    ASSIGN_OR_RETURN(std::shared_ptr<Session> session, broker_.hello(*peer, v, req.client_name()));
    spdlog::info("session {} opened: pid {} uid {} gid {} cgroup '{}' client '{}'{}", session->id(),
                 peer->creds.pid, peer->creds.uid, peer->creds.gid, peer->cgroup, session->clientName(),
                 peer->pod_name.empty() ? std::string()
                                        : " pod " + peer->pod_namespace + "/" + peer->pod_name +
                                              " container " + peer->pod_container);
    if (listener_ != nullptr) {
        listener_->sessionOpened(session);
    }
    return session;
}

grpc::ServerUnaryReactor *BrokerService::ListDevices(grpc::CallbackServerContext *ctx,
                                                     const pb::ListDevicesRequest *,
                                                     pb::ListDevicesResponse *resp) {
    return serve(ctx, Method::kListDevices, resp, [&](Session &s) {
        std::shared_ptr<const Policy> policy = broker_.policy();
        for (const DeviceInfo &d : broker_.listDevices()) {
            if (resp->devices_size() >= 1024) {
                break;
            }
            if (!policy->admitDevice(s.identity(), d.name).isOk()) {
                continue;  // a tenant sees only the devices [policy] lets it open
            }
            toProto(d, resp->add_devices());
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::OpenContext(grpc::CallbackServerContext *ctx,
                                                     const pb::OpenContextRequest *req,
                                                     pb::OpenContextResponse *resp) {
    return serve(ctx, Method::kOpenContext, resp,
                 [&](Session &s) { return reply(broker_.openContext(s, req->device_name()), resp); });
}

grpc::ServerUnaryReactor *BrokerService::CloseContext(grpc::CallbackServerContext *ctx,
                                                      const pb::CloseContextRequest *req,
                                                      pb::CloseContextResponse *resp) {
    return serve(ctx, Method::kCloseContext, resp, [&](Session &s) {
        return reply(broker_.closeContext(s, req->context()), resp->mutable_released_regions());
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryDevice(grpc::CallbackServerContext *ctx,
                                                     const pb::QueryDeviceRequest *req,
                                                     pb::QueryDeviceResponse *resp) {
    return serve(ctx, Method::kQueryDevice, resp,
                 [&](Session &s) { return reply(broker_.queryDevice(s, req->context()), resp); });
}

grpc::ServerUnaryReactor *BrokerService::QueryDeviceAttr(grpc::CallbackServerContext *ctx,
                                                         const pb::QueryDeviceAttrRequest *req,
                                                         pb::QueryDeviceAttrResponse *resp) {
    return serve(ctx, Method::kQueryDeviceAttr, resp, [&](Session &s) -> Status {
        RETURN_IF_ERROR(reply(broker_.queryDeviceAttr(s, req->context()), resp->mutable_attr()));
        ASSIGN_OR_RETURN(uint64_t dm_size, broker_.maxDmSize(s, req->context()));
        resp->set_max_dm_size(dm_size);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryPort(grpc::CallbackServerContext *ctx,
                                                   const pb::QueryPortRequest *req,
                                                   pb::QueryPortResponse *resp) {
    return serve(ctx, Method::kQueryPort, resp, [&](Session &s) {
        if (req->port_num() == 0 || req->port_num() > 255) {
            return invalidArgument("port_num must be 1..255");
        }
        return reply(broker_.queryPort(s, req->context(), static_cast<uint8_t>(req->port_num())), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::SetAsyncEventFd(grpc::CallbackServerContext *ctx,
                                                         const pb::SetAsyncEventFdRequest *req,
                                                         pb::SetAsyncEventFdResponse *resp) {
    // Waits for the eventfd on the fd channel: never on a callback thread.
    return serveBlocking(ctx, Method::kSetAsyncEventFd, resp,
                         [this, context = req->context(), xfer_id = req->xfer_id()](Session &s) {
                             return broker_.setAsyncEventFd(s, context, xfer_id);
                         });
}

grpc::ServerUnaryReactor *BrokerService::AllocPd(grpc::CallbackServerContext *ctx,
                                                 const pb::AllocPdRequest *req, pb::AllocPdResponse *resp) {
    return serve(ctx, Method::kAllocPd, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(uint64_t pd, broker_.allocPd(s, req->context()));
        resp->set_pd(pd);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DeallocPd(grpc::CallbackServerContext *ctx,
                                                   const pb::DeallocPdRequest *req,
                                                   pb::DeallocPdResponse *resp) {
    return serve(ctx, Method::kDeallocPd, resp, [&](Session &s) { return broker_.deallocPd(s, req->pd()); });
}

grpc::ServerUnaryReactor *BrokerService::OpenXrcd(grpc::CallbackServerContext *ctx,
                                                  const pb::OpenXrcdRequest *req,
                                                  pb::OpenXrcdResponse *resp) {
    return serve(ctx, Method::kOpenXrcd, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(uint64_t xrcd,
                         broker_.openXrcd(s, {req->context(), req->file_xfer_id(), req->oflags()}));
        resp->set_xrcd(xrcd);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::CloseXrcd(grpc::CallbackServerContext *ctx,
                                                   const pb::CloseXrcdRequest *req,
                                                   pb::CloseXrcdResponse *resp) {
    return serve(ctx, Method::kCloseXrcd, resp,
                 [&](Session &s) { return broker_.closeXrcd(s, req->xrcd()); });
}

grpc::ServerUnaryReactor *BrokerService::AllocMw(grpc::CallbackServerContext *ctx,
                                                 const pb::AllocMwRequest *req, pb::AllocMwResponse *resp) {
    return serve(ctx, Method::kAllocMw, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(MwResult mw, broker_.allocMw(s, req->pd(), static_cast<ibv_mw_type>(req->type())));
        resp->set_mw(mw.handle);
        resp->set_rkey(mw.rkey);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DeallocMw(grpc::CallbackServerContext *ctx,
                                                   const pb::DeallocMwRequest *req,
                                                   pb::DeallocMwResponse *resp) {
    return serve(ctx, Method::kDeallocMw, resp, [&](Session &s) { return broker_.deallocMw(s, req->mw()); });
}

grpc::ServerUnaryReactor *BrokerService::AttachMcast(grpc::CallbackServerContext *ctx,
                                                     const pb::McastRequest *req, pb::McastResponse *resp) {
    return serve(ctx, Method::kAttachMcast, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(McastArgs a, fromProto(*req));
        return broker_.mcast(s, a, true);
    });
}

grpc::ServerUnaryReactor *BrokerService::DetachMcast(grpc::CallbackServerContext *ctx,
                                                     const pb::McastRequest *req, pb::McastResponse *resp) {
    return serve(ctx, Method::kDetachMcast, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(McastArgs a, fromProto(*req));
        return broker_.mcast(s, a, false);
    });
}

grpc::ServerUnaryReactor *BrokerService::AllocDm(grpc::CallbackServerContext *ctx,
                                                 const pb::AllocDmRequest *req, pb::AllocDmResponse *resp) {
    return serve(ctx, Method::kAllocDm, resp, [&](Session &s) -> Status {
        AllocDmArgs a{req->context(), req->length(), req->log_align_req(), req->comp_mask()};
        ASSIGN_OR_RETURN(DmResult r, broker_.allocDm(s, a));
        toProto(r, resp);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::FreeDm(grpc::CallbackServerContext *ctx,
                                                const pb::FreeDmRequest *req, pb::FreeDmResponse *resp) {
    return serve(ctx, Method::kFreeDm, resp, [&](Session &s) {
        return reply(broker_.freeDm(s, req->dm()), resp->mutable_released_regions());
    });
}

grpc::ServerUnaryReactor *BrokerService::RegDmMr(grpc::CallbackServerContext *ctx,
                                                 const pb::RegDmMrRequest *req, pb::RegMrResponse *resp) {
    return serve(ctx, Method::kRegDmMr, resp, [&](Session &s) {
        RegDmMrArgs a{req->pd(), req->dm(), req->offset(), req->length(), req->access()};
        return reply(broker_.regDmMr(s, a), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::RegMr(grpc::CallbackServerContext *ctx, const pb::RegMrRequest *req,
                                               pb::RegMrResponse *resp) {
    // Waits for the fd on the fd channel: never on a callback thread. resp lives until Finish.
    return serveBlocking(ctx, Method::kRegMr, resp, [this, args = fromProto(*req), resp](Session &s) {
        return reply(broker_.regMr(s, args), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::ReregMr(grpc::CallbackServerContext *ctx,
                                                 const pb::ReregMrRequest *req, pb::ReregMrResponse *resp) {
    auto rereg = [this, args = fromProto(*req), resp](Session &s) -> Status {
        ASSIGN_OR_RETURN(RegMrResult r, broker_.reregMr(s, args));
        toProto(r, resp);
        return Status::ok();
    };
    // New memory is waited for on the fd channel, as RegMr's: never on a callback thread.
    if ((req->flags() & IBV_REREG_MR_CHANGE_TRANSLATION) != 0) {
        return serveBlocking(ctx, Method::kReregMr, resp, rereg);
    }
    return serve(ctx, Method::kReregMr, resp, rereg);
}

grpc::ServerUnaryReactor *BrokerService::DeregMr(grpc::CallbackServerContext *ctx,
                                                 const pb::DeregMrRequest *req, pb::DeregMrResponse *resp) {
    return serve(ctx, Method::kDeregMr, resp, [&](Session &s) { return broker_.deregMr(s, req->mr()); });
}

grpc::ServerUnaryReactor *BrokerService::CreateCq(grpc::CallbackServerContext *ctx,
                                                  const pb::CreateCqRequest *req,
                                                  pb::CreateCqResponse *resp) {
    // Converted here, checked once the call is admitted; by value, as serveBlocking runs it
    // after this returns (resp lives until Finish).
    auto create = [this, args = fromProto(*req), resp](Session &s) -> Status {
        RETURN_IF_ERROR(args);
        return reply(broker_.createCq(s, args.value()), resp);
    };
    // With an event fd the call waits for it on the fd channel, as RegMr does: never on a
    // callback thread.
    if (req->event_xfer_id() != 0) {
        return serveBlocking(ctx, Method::kCreateCq, resp, create);
    }
    return serve(ctx, Method::kCreateCq, resp, create);
}

grpc::ServerUnaryReactor *BrokerService::DestroyCq(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyCqRequest *req,
                                                   pb::DestroyCqResponse *resp) {
    return serve(ctx, Method::kDestroyCq, resp, [&](Session &s) {
        return reply(broker_.destroyCq(s, req->cq()), resp->mutable_released_regions());
    });
}

grpc::ServerUnaryReactor *BrokerService::CreateQp(grpc::CallbackServerContext *ctx,
                                                  const pb::CreateQpRequest *req,
                                                  pb::CreateQpResponse *resp) {
    return serve(ctx, Method::kCreateQp, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(CreateQpArgs args, fromProto(*req));
        return reply(broker_.createQp(s, args), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::OpenQp(grpc::CallbackServerContext *ctx,
                                                const pb::OpenQpRequest *req, pb::CreateQpResponse *resp) {
    return serve(ctx, Method::kOpenQp, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(ibv_qp_type type, fromProto(req->qp_type()));
        return reply(broker_.openQp(s, {req->context(), req->xrcd(), req->qp_num(), type}), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::DestroyQp(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyQpRequest *req,
                                                   pb::DestroyQpResponse *resp) {
    return serve(ctx, Method::kDestroyQp, resp, [&](Session &s) {
        return reply(broker_.destroyQp(s, req->qp()), resp->mutable_released_regions());
    });
}

grpc::ServerUnaryReactor *BrokerService::CreateSrq(grpc::CallbackServerContext *ctx,
                                                   const pb::CreateSrqRequest *req,
                                                   pb::CreateSrqResponse *resp) {
    return serve(ctx, Method::kCreateSrq, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(CreateSrqArgs args, fromProto(*req));
        return reply(broker_.createSrq(s, args), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::DestroySrq(grpc::CallbackServerContext *ctx,
                                                    const pb::DestroySrqRequest *req,
                                                    pb::DestroySrqResponse *resp) {
    return serve(ctx, Method::kDestroySrq, resp, [&](Session &s) {
        return reply(broker_.destroySrq(s, req->srq()), resp->mutable_released_regions());
    });
}

grpc::ServerUnaryReactor *BrokerService::CreateAh(grpc::CallbackServerContext *ctx,
                                                  const pb::CreateAhRequest *req,
                                                  pb::CreateAhResponse *resp) {
    return serve(ctx, Method::kCreateAh, resp, [&](Session &s) -> Status {
        ibv_ah_attr attr;
        RETURN_IF_ERROR(fromProto(req->attr(), &attr));
        ASSIGN_OR_RETURN(uint64_t ah, broker_.createAh(s, req->pd(), attr));
        resp->set_ah(ah);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DestroyAh(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyAhRequest *req,
                                                   pb::DestroyAhResponse *resp) {
    return serve(ctx, Method::kDestroyAh, resp, [&](Session &s) { return broker_.destroyAh(s, req->ah()); });
}

grpc::ServerUnaryReactor *BrokerService::ResizeCq(grpc::CallbackServerContext *ctx,
                                                  const pb::ResizeCqRequest *req,
                                                  pb::ResizeCqResponse *resp) {
    return serve(ctx, Method::kResizeCq, resp, [&](Session &s) -> Status {
        ASSIGN_OR_RETURN(ResizeCqResult r, broker_.resizeCq(s, req->cq(), req->cqe()));
        toProto(r, resp);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::ModifyQp(grpc::CallbackServerContext *ctx,
                                                  const pb::ModifyQpRequest *req,
                                                  pb::ModifyQpResponse *resp) {
    return serve(ctx, Method::kModifyQp, resp, [&](Session &s) -> Status {
        int mask = static_cast<int>(req->attr_mask());
        ibv_qp_attr attr;
        RETURN_IF_ERROR(fromProto(req->attr(), mask, &attr));
        const int held_mask = static_cast<int>(req->held_init_mask());
        ibv_qp_attr held{};
        if (held_mask != 0) {
            RETURN_IF_ERROR(fromProto(req->held_init_attr(), held_mask, &held));
        }
        ASSIGN_OR_RETURN(ibv_qp_state state, broker_.modifyQp(s, req->qp(), attr, mask, held, held_mask));
        resp->set_state(toProto(state));
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQp(grpc::CallbackServerContext *ctx,
                                                 const pb::QueryQpRequest *req, pb::QueryQpResponse *resp) {
    return serve(ctx, Method::kQueryQp, resp, [&](Session &s) {
        return reply(broker_.queryQp(s, req->qp(), static_cast<int>(req->attr_mask())), resp);
    });
}

grpc::ServerUnaryReactor *BrokerService::ModifyQpExtend(grpc::CallbackServerContext *ctx,
                                                        const pb::ModifyQpExtendRequest *req,
                                                        pb::ModifyQpExtendResponse *resp) {
    return serve(ctx, Method::kModifyQpExtend, resp, [&](Session &s) -> Status {
        ibv_qp_attr_extend attr;
        RETURN_IF_ERROR(fromProto(req->attr(), &attr));
        ASSIGN_OR_RETURN(uint64_t vendor_priv_info,
                         broker_.modifyQpExtend(s, req->qp(), attr, static_cast<int>(req->attr_mask())));
        resp->set_vendor_priv_info(vendor_priv_info);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQpExtend(grpc::CallbackServerContext *ctx,
                                                       const pb::QueryQpExtendRequest *req,
                                                       pb::QueryQpExtendResponse *resp) {
    return serve(ctx, Method::kQueryQpExtend, resp, [&](Session &s) {
        return reply(broker_.queryQpExtend(s, req->qp(), static_cast<int>(req->attr_mask())),
                     resp->mutable_attr());
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQpSupportedHyroceFeature(
    grpc::CallbackServerContext *ctx, const pb::QueryQpSupportedHyroceFeatureRequest *req,
    pb::QueryQpSupportedHyroceFeatureResponse *resp) {
    return serve(ctx, Method::kQueryQpSupportedHyroceFeature, resp, [&](Session &s) {
        return reply(broker_.queryQpSupportedHyroceFeature(s, req->qp(), req->sl(), req->tc()),
                     resp->mutable_feature());
    });
}

grpc::ServerUnaryReactor *BrokerService::NegoQpHyroceFeature(grpc::CallbackServerContext *ctx,
                                                             const pb::NegoQpHyroceFeatureRequest *req,
                                                             pb::NegoQpHyroceFeatureResponse *resp) {
    return serve(ctx, Method::kNegoQpHyroceFeature, resp, [&](Session &s) -> Status {
        ibv_hyroce_feature input;
        RETURN_IF_ERROR(fromProto(req->input(), &input));
        return reply(broker_.negoQpHyroceFeature(s, req->qp(), input), resp);
    });
}

}  // namespace ibvx::daemon
