#include "daemon/edge/services.h"

#include <spdlog/spdlog.h>

#include "daemon/edge/convert.h"
#include "daemon/edge/grpc_status.h"

namespace ibvx::daemon {
namespace {

void released(const Released &in, google::protobuf::RepeatedField<uint64_t> *out) {
    for (RegionId id : in) {
        out->Add(id);
    }
}

}  // namespace

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

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serve(grpc::CallbackServerContext *ctx, Method m, Fn &&fn) {
    auto call = calls_.begin(ctx, m);
    auto s = sessionOf(ctx);
    if (!s.isOk()) {
        return call.finish(s.status());
    }
    return call.finish(fn(**s), (*s)->id());
}

template <typename Fn>
grpc::ServerUnaryReactor *BrokerService::serveBlocking(grpc::CallbackServerContext *ctx, Method m, Fn fn) {
    auto call = calls_.begin(ctx, m);
    auto s = sessionOf(ctx);
    if (!s.isOk()) {
        return call.finish(s.status());
    }
    std::shared_ptr<Session> session = *s;
    uint64_t id = session->id();
    return calls_.finishOn(
        blocking_, call, [session = std::move(session), fn = std::move(fn)]() { return fn(*session); }, id);
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
    return serve(ctx, Method::kListDevices, [&](Session &s) {
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
    return serve(ctx, Method::kOpenContext, [&](Session &s) {
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
    return serve(ctx, Method::kCloseContext, [&](Session &s) {
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
    return serve(ctx, Method::kQueryDevice, [&](Session &s) {
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
    return serve(ctx, Method::kQueryDeviceAttr, [&](Session &s) {
        ASSIGN_OR_RETURN(ibv_device_attr attr, broker_.queryDeviceAttr(s, req->context()));
        toProto(attr, resp->mutable_attr());
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::QueryPort(grpc::CallbackServerContext *ctx,
                                                   const pb::QueryPortRequest *req,
                                                   pb::QueryPortResponse *resp) {
    return serve(ctx, Method::kQueryPort, [&](Session &s) {
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
                                                         pb::SetAsyncEventFdResponse *) {
    // Waits for the eventfd on the fd channel: never on a callback thread.
    uint64_t context = req->context();
    uint64_t xfer_id = req->xfer_id();
    return serveBlocking(ctx, Method::kSetAsyncEventFd, [this, context, xfer_id](Session &s) {
        return broker_.setAsyncEventFd(s, context, xfer_id);
    });
}

grpc::ServerUnaryReactor *BrokerService::AllocPd(grpc::CallbackServerContext *ctx,
                                                 const pb::AllocPdRequest *req, pb::AllocPdResponse *resp) {
    return serve(ctx, Method::kAllocPd, [&](Session &s) {
        auto r = broker_.allocPd(s, req->context());
        if (!r.isOk()) {
            return r.status();
        }
        resp->set_pd(*r);
        return Status::ok();
    });
}

grpc::ServerUnaryReactor *BrokerService::DeallocPd(grpc::CallbackServerContext *ctx,
                                                   const pb::DeallocPdRequest *req, pb::DeallocPdResponse *) {
    return serve(ctx, Method::kDeallocPd, [&](Session &s) { return broker_.deallocPd(s, req->pd()); });
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
    return serveBlocking(ctx, Method::kRegMr, [this, a, resp](Session &s) {
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
                                                 const pb::DeregMrRequest *req, pb::DeregMrResponse *) {
    return serve(ctx, Method::kDeregMr, [&](Session &s) { return broker_.deregMr(s, req->mr()); });
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
        return serveBlocking(ctx, Method::kCreateCq, create);
    }
    return serve(ctx, Method::kCreateCq, create);
}

grpc::ServerUnaryReactor *BrokerService::DestroyCq(grpc::CallbackServerContext *ctx,
                                                   const pb::DestroyCqRequest *req,
                                                   pb::DestroyCqResponse *resp) {
    return serve(ctx, Method::kDestroyCq, [&](Session &s) {
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
    return serve(ctx, Method::kCreateQp, [&](Session &s) {
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
    return serve(ctx, Method::kDestroyQp, [&](Session &s) {
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
    return serve(ctx, Method::kCreateSrq, [&](Session &s) {
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
    return serve(ctx, Method::kDestroySrq, [&](Session &s) {
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
    return serve(ctx, Method::kModifyQp, [&](Session &s) {
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
    return serve(ctx, Method::kQueryQp, [&](Session &s) {
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
    return serve(ctx, Method::kModifyQpExtend, [&](Session &s) {
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
    return serve(ctx, Method::kQueryQpExtend, [&](Session &s) {
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
    return serve(ctx, Method::kQueryQpSupportedHyroceFeature, [&](Session &s) {
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
    return serve(ctx, Method::kNegoQpHyroceFeature, [&](Session &s) {
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
