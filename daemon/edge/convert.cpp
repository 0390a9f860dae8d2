#include "daemon/edge/convert.h"

#include <cstring>

namespace ibvx::daemon {
namespace {

void toProto(const RegionRef &in, pb::RegionRef *out) {
    out->set_region(in.region);
    out->set_offset(in.offset);
    out->set_length(in.length);
}

// An oversized bytes field is the caller's error, never silently truncated.
Status refuse(wire::Oversized big) {
    if (!big) {
        return Status::ok();
    }
    return invalidArgument(std::string(big.field) + " is longer than " + std::to_string(big.limit) +
                           " bytes");
}

Status checkFeatureRange(const pb::HyroceFeature &in) {
    if (in.type() > 0xff || in.version() > 0xff) {
        return invalidArgument("hyroce feature type/version out of range");
    }
    return Status::ok();
}

constexpr std::pair<ObjectKind, pb::ObjectKind> kObjectKinds[] = {
    {ObjectKind::kContext, pb::OBJECT_KIND_CONTEXT}, {ObjectKind::kPd, pb::OBJECT_KIND_PD},
    {ObjectKind::kMr, pb::OBJECT_KIND_MR},           {ObjectKind::kCq, pb::OBJECT_KIND_CQ},
    {ObjectKind::kQp, pb::OBJECT_KIND_QP},           {ObjectKind::kSrq, pb::OBJECT_KIND_SRQ},
    {ObjectKind::kAh, pb::OBJECT_KIND_AH},           {ObjectKind::kXrcd, pb::OBJECT_KIND_XRCD},
    {ObjectKind::kMw, pb::OBJECT_KIND_MW},           {ObjectKind::kDm, pb::OBJECT_KIND_DM},
};

void qpDetails(const ObjectSnapshot &in, pb::QpDetails *q) {
    q->set_qp_num(in.qp_num);
    q->set_state(wire::toProto(in.qp_state));
    q->set_qp_type(wire::toProto(in.qp_type));
    q->set_max_send_wr(in.qp_cap.max_send_wr);
    q->set_max_recv_wr(in.qp_cap.max_recv_wr);
    q->set_max_send_sge(in.qp_cap.max_send_sge);
    q->set_max_recv_sge(in.qp_cap.max_recv_sge);
    q->set_max_inline_data(in.qp_cap.max_inline_data);
    q->set_has_srq(in.qp_has_srq);
    q->set_target_handles(in.qp_target_handles);
    q->set_opened(in.qp_opened);
    q->set_released(in.qp_released);
}

}  // namespace

void toProto(const DmResult &in, pb::AllocDmResponse *out) {
    out->set_dm(in.dm);
    toProto(in.memory, out->mutable_memory());
}

void toProto(const Version &in, pb::Version *out) {
    out->set_major(in.major);
    out->set_minor(in.minor);
    out->set_patch(in.patch);
}

void toProto(const PeerIdentity &in, pb::PeerIdentity *out) {
    out->set_pid(in.creds.pid);
    out->set_uid(in.creds.uid);
    out->set_gid(in.creds.gid);
    out->set_cgroup(in.cgroup);
    out->set_container_id(in.container_id);
}

void toProto(const DeviceInfo &in, pb::DeviceInfo *out) {
    out->set_name(in.name);
    out->set_provider(in.provider);
    wire::limitsToProto(in, out);
    out->set_virtual_device(in.virtual_device);
    out->set_plain_init(in.plain_init);
}

void toProto(const QueueResult &in, pb::QueueInfo *out) {
    if (in.base.region != 0) {
        toProto(in.base, out->mutable_base());
    }
    out->set_entry_cnt(in.entry_cnt);
    out->set_entry_size(in.entry_size);
    if (in.dbr_pi.region != 0) {
        toProto(in.dbr_pi, out->mutable_dbr_pi());
    }
    if (in.dbr_ci.region != 0) {
        toProto(in.dbr_ci, out->mutable_dbr_ci());
    }
    if (in.db_hw.region != 0) {
        toProto(in.db_hw, out->mutable_db_hw());
    }
    out->set_qbuf_resv(in.qbuf_resv, sizeof(in.qbuf_resv));
    out->set_info_resv(in.info_resv, sizeof(in.info_resv));
}

void toProto(const ibv_qp_attr &in, pb::QpAttr *out) {
    wire::toProto(in, IBV_QP_STATE | IBV_QP_CUR_STATE, out);
}

void toProto(const OpenContextResult &in, pb::OpenContextResponse *out) {
    out->set_context(in.context);
    toProto(in.device, out->mutable_device());
    out->set_driver_version(in.driver_version);
    out->set_driver_ops_present(in.driver_ops_present);
}

void toProto(const ibv_device_attr_extend &in, pb::QueryDeviceResponse *out) {
    out->set_ext_cap(in.ext_cap);
    out->set_resv(in.resv, sizeof(in.resv));
}

void toProto(const PortInfo &in, pb::QueryPortResponse *out) {
    toProto(in.attr, out->mutable_attr());
    for (const ibv_gid_entry &g : in.gids) {
        toProto(g, out->add_gids());
    }
}

void toProto(const RegMrResult &in, pb::RegMrResponse *out) {
    out->set_mr(in.mr);
    out->set_lkey(in.lkey);
    out->set_rkey(in.rkey);
    out->set_iova(in.iova);
}

void toProto(const RegMrResult &in, pb::ReregMrResponse *out) {
    out->set_lkey(in.lkey);
    out->set_rkey(in.rkey);
    out->set_iova(in.iova);
}

void toProto(const CqResult &in, pb::CreateCqResponse *out) {
    out->set_cq(in.cq);
    out->set_cqe(in.cqe);
    toProto(in.info, out->mutable_cq_info());
    out->set_resv(in.resv, sizeof(in.resv));
}

void toProto(const ResizeCqResult &in, pb::ResizeCqResponse *out) {
    out->set_cqe(in.cqe);
    toProto(in.info, out->mutable_cq_info());
    toProto(in.released, out->mutable_released_regions());
}

void toProto(const QpResult &in, pb::CreateQpResponse *out) {
    out->set_qp(in.qp);
    out->set_qp_num(in.qp_num);
    out->set_state(toProto(in.state));
    toProto(in.cap, out->mutable_cap());
    toProto(in.sq, out->mutable_sq_info());
    toProto(in.rq, out->mutable_rq_info());
    out->set_resv(in.resv, sizeof(in.resv));
    out->set_vendor_priv_info(in.vendor_priv_info);
}

void toProto(const SrqResult &in, pb::CreateSrqResponse *out) {
    out->set_srq(in.srq);
    out->set_max_wr(in.max_wr);
    out->set_max_sge(in.max_sge);
    out->set_srq_num(in.srq_num);
    toProto(in.info, out->mutable_srq_info());
    out->set_resv(in.resv, sizeof(in.resv));
}

void toProto(const QueryQpResult &in, pb::QueryQpResponse *out) {
    toProto(in.attr, out->mutable_attr());
    toProto(in.init.cap, out->mutable_init_cap());
    out->set_qp_type(toProto(in.init.qp_type));
    out->set_sq_sig_all(in.init.sq_sig_all != 0);
}

void toProto(const NegoResult &in, pb::NegoQpHyroceFeatureResponse *out) {
    toProto(in.output, out->mutable_output());
    out->set_need_more_nego(in.need_more_nego);
}

void toProto(const Released &in, google::protobuf::RepeatedField<uint64_t> *out) {
    for (RegionId id : in) {
        out->Add(id);
    }
}

StatusOr<queue_buf_dma_mode> fromProto(pb::DmaMode m) {
    if (auto mode = wire::fromProto(m)) {
        return *mode;
    }
    return invalidArgument("dma_mode must be DMA_MODE_DEFAULT or DMA_MODE_INDEP_UB");
}

StatusOr<ibv_qp_type> fromProto(pb::QpType t) {
    if (auto type = wire::fromProto(t)) {
        return *type;
    }
    return invalidArgument("qp_type must be RC, UC or UD");
}

StatusOr<ibv_qp_state> fromProto(pb::QpState s) {
    if (auto state = wire::fromProto(s)) {
        return *state;
    }
    return invalidArgument("QP state is unspecified or unknown");
}

ibv_qp_cap fromProto(const pb::QpCap &c) {
    return wire::fromProto(c);
}

Status fromProto(const pb::QpAttr &in, int mask, ibv_qp_attr *out) {
    *out = {};
    wire::Oversized big = wire::fromProto(in, out);
    out->qp_state = {};
    out->cur_qp_state = {};
    if ((mask & IBV_QP_STATE) != 0) {
        ASSIGN_OR_RETURN(out->qp_state, fromProto(in.qp_state()));
    }
    if ((mask & IBV_QP_CUR_STATE) != 0) {
        ASSIGN_OR_RETURN(out->cur_qp_state, fromProto(in.cur_qp_state()));
    }
    return refuse(big);
}

Status fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out) {
    *out = {};
    RETURN_IF_ERROR(checkFeatureRange(in));
    return refuse(wire::fromProto(in, out));
}

Status fromProto(const pb::AhAttr &in, ibv_ah_attr *out) {
    *out = {};
    const struct {
        const char *name;
        uint32_t value, max;
    } fields[] = {{"ah_attr.sgid_index", in.sgid_index(), UINT8_MAX},
                  {"ah_attr.hop_limit", in.hop_limit(), UINT8_MAX},
                  {"ah_attr.traffic_class", in.traffic_class(), UINT8_MAX},
                  {"ah_attr.dlid", in.dlid(), UINT16_MAX},
                  {"ah_attr.sl", in.sl(), UINT8_MAX},
                  {"ah_attr.src_path_bits", in.src_path_bits(), UINT8_MAX},
                  {"ah_attr.static_rate", in.static_rate(), UINT8_MAX},
                  {"ah_attr.port_num", in.port_num(), UINT8_MAX}};
    for (const auto &f : fields) {
        if (f.value > f.max) {
            return invalidArgument(std::string(f.name) + " " + std::to_string(f.value) +
                                   " is out of range (0.." + std::to_string(f.max) + ")");
        }
    }
    if (in.is_global() && in.dgid().raw().size() != sizeof(out->grh.dgid.raw)) {
        return invalidArgument("ah_attr.dgid must be 16 bytes with a GRH");
    }
    return refuse(wire::fromProto(in, out));
}

Status fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out) {
    *out = {};
    RETURN_IF_ERROR(checkFeatureRange(in.feature()));
    return refuse(wire::fromProto(in, out));
}

RegMrArgs fromProto(const pb::RegMrRequest &in) {
    RegMrArgs a;
    a.pd = in.pd();
    a.xfer_id = in.xfer_id();
    a.offset = in.offset();
    a.length = in.length();
    a.access = in.access();
    a.iova = in.iova();
    a.tenant_address = in.tenant_address();
    return a;
}

ReregMrArgs fromProto(const pb::ReregMrRequest &in) {
    ReregMrArgs a;
    a.mr = in.mr();
    a.flags = static_cast<int>(in.flags());
    a.pd = in.pd();
    a.access = in.access();
    a.memory.xfer_id = in.xfer_id();
    a.memory.offset = in.offset();
    a.memory.length = in.length();
    a.memory.iova = in.iova();
    a.memory.tenant_address = in.tenant_address();
    return a;
}

StatusOr<CreateCqArgs> fromProto(const pb::CreateCqRequest &in) {
    CreateCqArgs a;
    ASSIGN_OR_RETURN(a.dma_mode, fromProto(in.dma_mode()));
    a.context = in.context();
    a.cqe = in.cqe();
    a.comp_vector = in.comp_vector();
    a.wc_flags = in.wc_flags();
    a.cq_cap_flag = in.cq_cap_flag();
    a.event_xfer_id = in.event_xfer_id();
    return a;
}

StatusOr<McastArgs> fromProto(const pb::McastRequest &in) {
    McastArgs a;
    if (in.gid().size() != sizeof(a.gid.raw)) {
        return invalidArgument("gid must be 16 bytes, got " + std::to_string(in.gid().size()));
    }
    if (in.lid() > 0xffff) {
        return invalidArgument("lid must fit 16 bits, got " + std::to_string(in.lid()));
    }
    a.qp = in.qp();
    std::memcpy(a.gid.raw, in.gid().data(), sizeof(a.gid.raw));
    a.lid = static_cast<uint16_t>(in.lid());
    return a;
}

StatusOr<CreateQpArgs> fromProto(const pb::CreateQpRequest &in) {
    CreateQpArgs a;
    ASSIGN_OR_RETURN(a.dma_mode, fromProto(in.dma_mode()));
    ASSIGN_OR_RETURN(a.qp_type, fromProto(in.qp_type()));
    a.context = in.context();
    a.pd = in.pd();
    a.send_cq = in.send_cq();
    a.recv_cq = in.recv_cq();
    a.srq = in.srq();
    a.xrcd = in.xrcd();
    a.cap = fromProto(in.cap());
    a.sq_sig_all = in.sq_sig_all();
    a.qp_cap_flag = in.qp_cap_flag();
    return a;
}

StatusOr<CreateSrqArgs> fromProto(const pb::CreateSrqRequest &in) {
    CreateSrqArgs a;
    ASSIGN_OR_RETURN(a.dma_mode, fromProto(in.dma_mode()));
    a.context = in.context();
    a.pd = in.pd();
    a.max_wr = in.max_wr();
    a.max_sge = in.max_sge();
    a.srq_limit = in.srq_limit();
    a.srq_cap_flag = in.srq_cap_flag();
    a.xrcd = in.xrcd();
    a.cq = in.cq();
    return a;
}

pb::ObjectKind toProto(ObjectKind kind) {
    for (const auto &[k, p] : kObjectKinds) {
        if (k == kind) {
            return p;
        }
    }
    return pb::OBJECT_KIND_UNSPECIFIED;
}

std::optional<ObjectKind> fromProto(pb::ObjectKind kind) {
    for (const auto &[k, p] : kObjectKinds) {
        if (p == kind) {
            return k;
        }
    }
    return std::nullopt;
}

void toProto(const ObjectSnapshot &in, pb::ObjectInfo *out) {
    out->set_handle(in.handle);
    out->set_kind(daemon::toProto(in.kind));
    out->set_device(in.device);
    out->set_users(in.users);
    for (uint64_t u : in.uses) {
        out->add_uses(u);
    }
    switch (in.kind) {
        case ObjectKind::kQp:
            qpDetails(in, out->mutable_qp());
            break;
        case ObjectKind::kCq:
            out->mutable_cq()->set_cqe(in.cqe);
            out->mutable_cq()->set_queue_bytes(in.queue_bytes);
            break;
        case ObjectKind::kSrq:
            out->mutable_srq()->set_max_wr(in.srq_entries);
            out->mutable_srq()->set_entry_size(in.srq_entry_size);
            out->mutable_srq()->set_srq_num(in.srq_num);
            break;
        case ObjectKind::kMr:
            out->mutable_mr()->set_length(in.mr_length);
            out->mutable_mr()->set_lkey(in.lkey);
            out->mutable_mr()->set_rkey(in.rkey);
            break;
        case ObjectKind::kAh:
            out->mutable_ah()->set_port_num(in.ah.port_num);
            out->mutable_ah()->set_is_global(in.ah.is_global != 0);
            out->mutable_ah()->set_dlid(in.ah.dlid);
            out->mutable_ah()->set_sgid_index(in.ah.grh.sgid_index);
            break;
        default:
            break;
    }
}

}  // namespace ibvx::daemon
