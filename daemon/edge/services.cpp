#include "daemon/edge/services.h"

#include <spdlog/spdlog.h>

#include <string>

#include "daemon/edge/convert.h"
#include "daemon/edge/grpc_status.h"

namespace ibvx::daemon {
namespace {

void released(const Released &in, google::protobuf::RepeatedField<uint64_t> *out) {
    for (RegionId id : in) {
        out->Add(id);
    }
}

// The full gRPC name ("/ibv_extend.v1.Broker/CreateCq"): what a stored reply is filed under, so
// a reply stored by one build is recognised by the next.
std::string fullMethodName(Method m) {
    return std::string("/") + pb::Broker::service_full_name() + "/" + methodName(m);
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
    switch (m) {
        case Method::kOpenContext:
        case Method::kCloseContext:
        case Method::kAllocPd:
        case Method::kDeallocPd:
        case Method::kRegMr:
        case Method::kDeregMr:
        case Method::kCreateCq:
        case Method::kDestroyCq:
        case Method::kCreateQp:
        case Method::kDestroyQp:
        case Method::kCreateSrq:
        case Method::kDestroySrq:
        case Method::kModifyQp:
        case Method::kModifyQpExtend:
        case Method::kNegoQpHyroceFeature:  // the driver's negotiation moves the QP's state
        case Method::kSetAsyncEventFd:
            return true;
        case Method::kHello:  // creates a session, but a retried Hello is a new session anyway
        case Method::kListDevices:
        case Method::kQueryDevice:
        case Method::kQueryQp:
        case Method::kQueryQpExtend:
        case Method::kQueryQpSupportedHyroceFeature:
        case Method::kQueryDeviceAttr:
        case Method::kQueryPort:
        case Method::kCount:
            return false;
    }
    return false;
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

BrokerService::BrokerService(Broker &broker, ConnectionRegistry &connections, RpcStats &stats,
                             SessionListener *listener, BlockingLimits blocking)
    : broker_(broker),
      connections_(connections),
      stats_(stats),
      listener_(listener),
      blocking_(blocking.threads, blocking.max_queued) {}

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
    auto it = md.find(kIdempotencyMetadataKey);
    if (it == md.end()) {
        return a;  // a client from before idempotency keys: the call runs as it always did
    }
    ASSIGN_OR_RETURN(a.key, parseIdempotencyKey(std::string_view(it->second.data(), it->second.size())));
    // No lock from here to the commit: a client sends a key again only after the try before
    // failed, so two calls with one key at once are a broken client, and each just runs.
    std::optional<StoredReply> stored = a.session->findReply(a.key);
    if (!stored) {
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

void BrokerService::commitReply(Session &s, Method m, uint64_t key, const Status &result,
                                const google::protobuf::Message &resp) {
    grpc::Status wire = toGrpc(result);
    StoredReply reply;
    reply.key = key;
    reply.method = fullMethodName(m);
    reply.code = static_cast<int>(wire.error_code());
    reply.message = wire.error_message();
    reply.details = wire.error_details();
    if (result.isOk()) {
        reply.response = resp.SerializeAsString();  // a failed call sends no message
    }
    // The call did happen: its reply goes out either way; only a crash now would lose it.
    if (Status st = broker_.commit(s, std::move(reply)); !st.isOk()) {
        spdlog::warn("session {}: {} could not be committed: {}", s.id(), methodName(m), st.toString());
    }
}

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serve(grpc::CallbackServerContext *ctx, Method m,
                                               google::protobuf::Message *resp, Fn &&fn) {
    auto call = calls_.begin(ctx, m);
    auto a = admit(ctx, m, resp);
    if (!a.isOk()) {
        return call.finish(a.status());
    }
    Session &s = *a->session;
    if (a->replayed) {
        return call.finish(*a->replayed, s.id());
    }
    Status result = fn(s);
    if (isMutating(m)) {
        commitReply(s, m, a->key, result, *resp);
    }
    return call.finish(result, s.id());
}

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serveBlocking(grpc::CallbackServerContext *ctx, Method m,
                                                       google::protobuf::Message *resp, Fn fn) {
    auto call = calls_.begin(ctx, m);
    auto a = admit(ctx, m, resp);
    if (!a.isOk()) {
        return call.finish(a.status());
    }
    uint64_t id = a->session->id();
    if (a->replayed) {
        return call.finish(*a->replayed, id);
    }
    return calls_.finishOn(
        blocking_, call,
        [this, m, resp, key = a->key, session = std::move(a->session), fn = std::move(fn)]() {
            Status result = fn(*session);
            if (isMutating(m)) {
                commitReply(*session, m, key, result, *resp);
            }
            return result;
        },
        id);
}

grpc::ServerUnaryReactor *BrokerService::Hello(grpc::CallbackServerContext *ctx, const pb::HelloRequest *req,
                                               pb::HelloResponse *resp) {
    auto call = calls_.begin(ctx, Method::kHello);
    auto peer = connections_.lookup(ctx->peer());
    if (!peer) {
        return call.finish(permissionDenied("unknown connection"));
    }
    if (pods_ != nullptr) {
        pods_->annotate(&*peer);  // never fails: unknown pods stay empty
    }
    Version v{req->client_version().major(), req->client_version().minor(), req->client_version().patch()};
    auto s = broker_.hello(*peer, v, req->client_name());
    if (!s.isOk()) {
        return call.finish(s.status());
    }
    const Session &session = **s;
    spdlog::info("session {} opened: pid {} uid {} gid {} cgroup '{}' client '{}'{}", session.id(),
                 peer->creds.pid, peer->creds.uid, peer->creds.gid, peer->cgroup, session.clientName(),
                 peer->pod_name.empty() ? std::string()
                                        : " pod " + peer->pod_namespace + "/" + peer->pod_name +
                                              " container " + peer->pod_container);
    if (listener_ != nullptr) {
        listener_->sessionOpened(*s);
    }
    const Version &bv = broker_.options().version;
    resp->mutable_broker_version()->set_major(bv.major);
    resp->mutable_broker_version()->set_minor(bv.minor);
    resp->mutable_broker_version()->set_patch(bv.patch);
    resp->set_session_token(session.token().data(), session.token().size());
    auto *id = resp->mutable_identity();
    id->set_pid(peer->creds.pid);
    id->set_uid(peer->creds.uid);
    id->set_gid(peer->creds.gid);
    id->set_cgroup(peer->cgroup);
    id->set_container_id(peer->container_id);
    resp->set_attach_timeout_ms(static_cast<uint32_t>(broker_.options().attach_timeout.count()));
    return call.finish(Status::ok(), session.id());
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
    return serve(ctx, Method::kOpenContext, resp, [&](Session &s) {
        auto r = broker_.openContext(s, req->device_name());
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_context(r->context);
        toProto(r->device, resp->mutable_device());
        resp->set_driver_version(r->driver_version);
        resp->set_driver_ops_present(r->driver_ops_present);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::CloseContext(grpc::CallbackServerContext *ctx,
                                                      const pb::CloseContextRequest *req,
                                                      pb::CloseContextResponse *resp) {
    return serve(ctx, Method::kCloseContext, resp, [&](Session &s) {
        auto r = broker_.closeContext(s, req->context());
        if (!r.isOk()) {
            return r.status();
        }
        released(*r, resp->mutable_released_regions());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryDevice(grpc::CallbackServerContext *ctx,
                                                     const pb::QueryDeviceRequest *req,
                                                     pb::QueryDeviceResponse *resp) {
    return serve(ctx, Method::kQueryDevice, resp, [&](Session &s) {
        auto r = broker_.queryDevice(s, req->context());
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_ext_cap(r->ext_cap);
        resp->set_resv(r->resv, sizeof(r->resv));
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryDeviceAttr(grpc::CallbackServerContext *ctx,
                                                         const pb::QueryDeviceAttrRequest *req,
                                                         pb::QueryDeviceAttrResponse *resp) {
    return serve(ctx, Method::kQueryDeviceAttr, resp, [&](Session &s) {
        ASSIGN_OR_RETURN(ibv_device_attr attr, broker_.queryDeviceAttr(s, req->context()));
        toProto(attr, resp->mutable_attr());
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
        ASSIGN_OR_RETURN(PortInfo port,
                         broker_.queryPort(s, req->context(), static_cast<uint8_t>(req->port_num())));
        toProto(port.attr, resp->mutable_attr());
        for (const ibv_gid_entry &g : port.gids) {
            toProto(g, resp->add_gids());
        }
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::SetAsyncEventFd(grpc::CallbackServerContext *ctx,
                                                         const pb::SetAsyncEventFdRequest *req,
                                                         pb::SetAsyncEventFdResponse *resp) {
    // Waits for the eventfd on the fd channel: never on a callback thread.
    uint64_t context = req->context();
    uint64_t xfer_id = req->xfer_id();
    return serveBlocking(ctx, Method::kSetAsyncEventFd, resp, [this, context, xfer_id](Session &s) {
        return broker_.setAsyncEventFd(s, context, xfer_id);
    });
}

grpc::ServerUnaryReactor *BrokerService::AllocPd(grpc::CallbackServerContext *ctx,
                                                 const pb::AllocPdRequest *req, pb::AllocPdResponse *resp) {
    return serve(ctx, Method::kAllocPd, resp, [&](Session &s) {
        auto r = broker_.allocPd(s, req->context());
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_pd(*r);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DeallocPd(grpc::CallbackServerContext *ctx,
                                                   const pb::DeallocPdRequest *req,
                                                   pb::DeallocPdResponse *resp) {
    return serve(ctx, Method::kDeallocPd, resp, [&](Session &s) { return broker_.deallocPd(s, req->pd()); });
}

grpc::ServerUnaryReactor *BrokerService::RegMr(grpc::CallbackServerContext *ctx, const pb::RegMrRequest *req,
                                               pb::RegMrResponse *resp) {
    RegMrArgs a;
    a.pd = req->pd();
    a.xfer_id = req->xfer_id();
    a.offset = req->offset();
    a.length = req->length();
    a.access = req->access();
    a.iova = req->iova();
    // Waits for the fd on the fd channel: never on a callback thread. resp lives until Finish.
    return serveBlocking(ctx, Method::kRegMr, resp, [this, a, resp](Session &s) {
        auto r = broker_.regMr(s, a);
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_mr(r->mr);
        resp->set_lkey(r->lkey);
        resp->set_rkey(r->rkey);
        resp->set_iova(r->iova);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DeregMr(grpc::CallbackServerContext *ctx,
                                                 const pb::DeregMrRequest *req, pb::DeregMrResponse *resp) {
    return serve(ctx, Method::kDeregMr, resp, [&](Session &s) { return broker_.deregMr(s, req->mr()); });
}

grpc::ServerUnaryReactor *BrokerService::CreateCq(grpc::CallbackServerContext *ctx,
                                                  const pb::CreateCqRequest *req,
                                                  pb::CreateCqResponse *resp) {
    auto mode = fromProto(req->dma_mode());
    CreateCqArgs a;
    a.context = req->context();
    a.cqe = req->cqe();
    a.comp_vector = req->comp_vector();
    a.wc_flags = req->wc_flags();
    a.cq_cap_flag = req->cq_cap_flag();
    a.dma_mode = mode.isOk() ? *mode : QU_BUF_DMA_MODE_DEFAULT;
    a.event_xfer_id = req->event_xfer_id();
    // resp lives until Finish; a, mode by value: serveBlocking runs after this returns.
    auto create = [this, a, mode_status = mode.status(), resp](Session &s) {
        if (!mode_status.isOk()) {
            return mode_status;
        }
        auto r = broker_.createCq(s, a);
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_cq(r->cq);
        resp->set_cqe(r->cqe);
        toProto(r->info, resp->mutable_cq_info());
        resp->set_resv(r->resv, sizeof(r->resv));
        return Status::ok();
    };
    // With an event fd the call waits for it on the fd channel, as RegMr does: never on a
    // callback thread.
    if (a.event_xfer_id != 0) {
        return serveBlocking(ctx, Method::kCreateCq, resp, create);
    }
    return serve(ctx, Method::kCreateCq, resp, create);
}

grpc::ServerUnaryReactor *BrokerService::DestroyCq(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyCqRequest *req,
                                                   pb::DestroyCqResponse *resp) {
    return serve(ctx, Method::kDestroyCq, resp, [&](Session &s) {
        auto r = broker_.destroyCq(s, req->cq());
        if (!r.isOk()) {
            return r.status();
        }
        released(*r, resp->mutable_released_regions());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::CreateQp(grpc::CallbackServerContext *ctx,
                                                  const pb::CreateQpRequest *req,
                                                  pb::CreateQpResponse *resp) {
    return serve(ctx, Method::kCreateQp, resp, [&](Session &s) {
        auto mode = fromProto(req->dma_mode());
        if (!mode.isOk()) {
            return mode.status();
        }
        auto type = fromProto(req->qp_type());
        if (!type.isOk()) {
            return type.status();
        }
        CreateQpArgs a;
        a.context = req->context();
        a.pd = req->pd();
        a.send_cq = req->send_cq();
        a.recv_cq = req->recv_cq();
        a.srq = req->srq();
        a.qp_type = *type;
        a.cap = fromProto(req->cap());
        a.sq_sig_all = req->sq_sig_all();
        a.qp_cap_flag = req->qp_cap_flag();
        a.dma_mode = *mode;
        auto r = broker_.createQp(s, a);
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_qp(r->qp);
        resp->set_qp_num(r->qp_num);
        resp->set_state(toProto(r->state));
        toProto(r->cap, resp->mutable_cap());
        toProto(r->sq, resp->mutable_sq_info());
        toProto(r->rq, resp->mutable_rq_info());
        resp->set_resv(r->resv, sizeof(r->resv));
        resp->set_vendor_priv_info(r->vendor_priv_info);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DestroyQp(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyQpRequest *req,
                                                   pb::DestroyQpResponse *resp) {
    return serve(ctx, Method::kDestroyQp, resp, [&](Session &s) {
        auto r = broker_.destroyQp(s, req->qp());
        if (!r.isOk()) {
            return r.status();
        }
        released(*r, resp->mutable_released_regions());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::CreateSrq(grpc::CallbackServerContext *ctx,
                                                   const pb::CreateSrqRequest *req,
                                                   pb::CreateSrqResponse *resp) {
    return serve(ctx, Method::kCreateSrq, resp, [&](Session &s) {
        auto mode = fromProto(req->dma_mode());
        if (!mode.isOk()) {
            return mode.status();
        }
        CreateSrqArgs a;
        a.context = req->context();
        a.pd = req->pd();
        a.max_wr = req->max_wr();
        a.max_sge = req->max_sge();
        a.srq_limit = req->srq_limit();
        a.srq_cap_flag = req->srq_cap_flag();
        a.dma_mode = *mode;
        auto r = broker_.createSrq(s, a);
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_srq(r->srq);
        resp->set_max_wr(r->max_wr);
        resp->set_max_sge(r->max_sge);
        toProto(r->info, resp->mutable_srq_info());
        resp->set_resv(r->resv, sizeof(r->resv));
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DestroySrq(grpc::CallbackServerContext *ctx,
                                                    const pb::DestroySrqRequest *req,
                                                    pb::DestroySrqResponse *resp) {
    return serve(ctx, Method::kDestroySrq, resp, [&](Session &s) {
        auto r = broker_.destroySrq(s, req->srq());
        if (!r.isOk()) {
            return r.status();
        }
        released(*r, resp->mutable_released_regions());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::ModifyQp(grpc::CallbackServerContext *ctx,
                                                  const pb::ModifyQpRequest *req,
                                                  pb::ModifyQpResponse *resp) {
    return serve(ctx, Method::kModifyQp, resp, [&](Session &s) {
        ibv_qp_attr attr;
        int mask = static_cast<int>(req->attr_mask());
        if (Status st = fromProto(req->attr(), mask, &attr); !st.isOk()) {
            return st;
        }
        auto r = broker_.modifyQp(s, req->qp(), attr, mask);
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_state(toProto(*r));
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQp(grpc::CallbackServerContext *ctx,
                                                 const pb::QueryQpRequest *req, pb::QueryQpResponse *resp) {
    return serve(ctx, Method::kQueryQp, resp, [&](Session &s) {
        auto r = broker_.queryQp(s, req->qp(), static_cast<int>(req->attr_mask()));
        if (!r.isOk()) {
            return r.status();
        }
        toProto(r->attr, resp->mutable_attr());
        toProto(r->init.cap, resp->mutable_init_cap());
        resp->set_qp_type(toProto(r->init.qp_type));
        resp->set_sq_sig_all(r->init.sq_sig_all != 0);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::ModifyQpExtend(grpc::CallbackServerContext *ctx,
                                                        const pb::ModifyQpExtendRequest *req,
                                                        pb::ModifyQpExtendResponse *resp) {
    return serve(ctx, Method::kModifyQpExtend, resp, [&](Session &s) {
        ibv_qp_attr_extend attr;
        if (Status st = fromProto(req->attr(), &attr); !st.isOk()) {
            return st;
        }
        auto r = broker_.modifyQpExtend(s, req->qp(), attr, static_cast<int>(req->attr_mask()));
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_vendor_priv_info(*r);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQpExtend(grpc::CallbackServerContext *ctx,
                                                       const pb::QueryQpExtendRequest *req,
                                                       pb::QueryQpExtendResponse *resp) {
    return serve(ctx, Method::kQueryQpExtend, resp, [&](Session &s) {
        auto r = broker_.queryQpExtend(s, req->qp(), static_cast<int>(req->attr_mask()));
        if (!r.isOk()) {
            return r.status();
        }
        toProto(*r, resp->mutable_attr());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryQpSupportedHyroceFeature(
    grpc::CallbackServerContext *ctx, const pb::QueryQpSupportedHyroceFeatureRequest *req,
    pb::QueryQpSupportedHyroceFeatureResponse *resp) {
    return serve(ctx, Method::kQueryQpSupportedHyroceFeature, resp, [&](Session &s) {
        auto r = broker_.queryQpSupportedHyroceFeature(s, req->qp(), req->sl(), req->tc());
        if (!r.isOk()) {
            return r.status();
        }
        toProto(*r, resp->mutable_feature());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::NegoQpHyroceFeature(grpc::CallbackServerContext *ctx,
                                                             const pb::NegoQpHyroceFeatureRequest *req,
                                                             pb::NegoQpHyroceFeatureResponse *resp) {
    return serve(ctx, Method::kNegoQpHyroceFeature, resp, [&](Session &s) {
        ibv_hyroce_feature in;
        if (Status st = fromProto(req->input(), &in); !st.isOk()) {
            return st;
        }
        auto r = broker_.negoQpHyroceFeature(s, req->qp(), in);
        if (!r.isOk()) {
            return r.status();
        }
        toProto(r->output, resp->mutable_output());
        resp->set_need_more_nego(r->need_more_nego);
        return Status::ok();
    });
}

}  // namespace ibvx::daemon
