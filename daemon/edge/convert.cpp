#include "daemon/edge/convert.h"

#include <cstring>

namespace ibvx::daemon {
namespace {

void toProto(const RegionRef &in, pb::RegionRef *out) {
    out->set_region(in.region);
    out->set_offset(in.offset);
    out->set_length(in.length);
}

// Copies a bytes field into a fixed C array; longer than the array is an error, shorter is
// zero-filled (proto3 drops trailing intent anyway).
Status copyBytes(const std::string &in, void *out, size_t size, const char *field) {
    if (in.size() > size) {
        return invalidArgument(std::string(field) + " is longer than " + std::to_string(size) + " bytes");
    }
    std::memset(out, 0, size);
    std::memcpy(out, in.data(), in.size());
    return Status::ok();
}

}  // namespace

void toProto(const DeviceInfo &in, pb::DeviceInfo *out) {
    out->set_name(in.name);
    out->set_provider(in.provider);
    out->set_ext_cap(in.ext_cap);
    out->set_driver_version(in.driver_version);
    out->set_phys_port_cnt(in.phys_port_cnt);
    out->set_max_qp(in.max_qp);
    out->set_max_cq(in.max_cq);
    out->set_max_srq(in.max_srq);
    out->set_max_mr(in.max_mr);
    out->set_max_qp_wr(in.max_qp_wr);
    out->set_max_cqe(in.max_cqe);
    out->set_max_srq_wr(in.max_srq_wr);
    out->set_max_sge(in.max_sge);
    out->set_max_inline_data(in.max_inline_data);
    out->set_max_msg_sz(in.max_msg_sz);
    out->set_max_mr_size(in.max_mr_size);
    out->set_virtual_device(in.virtual_device);
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

pb::QpState toProto(ibv_qp_state s) {
    if (s >= IBV_QPS_RESET && s <= IBV_QPS_ERR) {
        return static_cast<pb::QpState>(static_cast<int>(s) + 1);
    }
    return pb::QP_STATE_UNSPECIFIED;
}

pb::QpType toProto(ibv_qp_type t) {
    switch (t) {
        case IBV_QPT_RC:
            return pb::QP_TYPE_RC;
        case IBV_QPT_UC:
            return pb::QP_TYPE_UC;
        case IBV_QPT_UD:
            return pb::QP_TYPE_UD;
        default:
            return pb::QP_TYPE_UNSPECIFIED;
    }
}

void toProto(const ibv_qp_cap &in, pb::QpCap *out) {
    out->set_max_send_wr(in.max_send_wr);
    out->set_max_recv_wr(in.max_recv_wr);
    out->set_max_send_sge(in.max_send_sge);
    out->set_max_recv_sge(in.max_recv_sge);
    out->set_max_inline_data(in.max_inline_data);
}

void toProto(const ibv_qp_attr &in, pb::QpAttr *out) {
    out->set_qp_state(toProto(in.qp_state));
    out->set_cur_qp_state(toProto(in.cur_qp_state));
    out->set_path_mtu(in.path_mtu);
    out->set_qkey(in.qkey);
    out->set_rq_psn(in.rq_psn);
    out->set_sq_psn(in.sq_psn);
    out->set_dest_qp_num(in.dest_qp_num);
    out->set_qp_access_flags(static_cast<uint32_t>(in.qp_access_flags));
    toProto(in.cap, out->mutable_cap());
    pb::AhAttr *ah = out->mutable_ah_attr();
    ah->mutable_dgid()->set_raw(in.ah_attr.grh.dgid.raw, sizeof(in.ah_attr.grh.dgid.raw));
    ah->set_flow_label(in.ah_attr.grh.flow_label);
    ah->set_sgid_index(in.ah_attr.grh.sgid_index);
    ah->set_hop_limit(in.ah_attr.grh.hop_limit);
    ah->set_traffic_class(in.ah_attr.grh.traffic_class);
    ah->set_is_global(in.ah_attr.is_global != 0);
    ah->set_dlid(in.ah_attr.dlid);
    ah->set_sl(in.ah_attr.sl);
    ah->set_src_path_bits(in.ah_attr.src_path_bits);
    ah->set_static_rate(in.ah_attr.static_rate);
    ah->set_port_num(in.ah_attr.port_num);
    out->set_pkey_index(in.pkey_index);
    out->set_max_rd_atomic(in.max_rd_atomic);
    out->set_max_dest_rd_atomic(in.max_dest_rd_atomic);
    out->set_min_rnr_timer(in.min_rnr_timer);
    out->set_port_num(in.port_num);
    out->set_timeout(in.timeout);
    out->set_retry_cnt(in.retry_cnt);
    out->set_rnr_retry(in.rnr_retry);
}

void toProto(const ibv_hyroce_feature &in, pb::HyroceFeature *out) {
    out->set_type(in.type);
    out->set_version(in.version);
    out->set_sack_enable(in.sack_enable != 0);
    out->set_resv(in.resv, sizeof(in.resv));
}

void toProto(const ibv_qp_attr_extend &in, pb::QpAttrExtend *out) {
    out->set_udp_src_port(in.udp_src_port);
    toProto(in.feature, out->mutable_feature());
    out->set_lb_mode(in.lb_mode);
    out->set_mpath(&in.mpath, sizeof(in.mpath));
    out->set_ar(&in.ar, sizeof(in.ar));
    out->set_sack(&in.sack, sizeof(in.sack));
    out->set_resv(in.resv, sizeof(in.resv));
    out->set_lag_port(in.lag_port);
}

StatusOr<queue_buf_dma_mode> fromProto(pb::DmaMode m) {
    switch (m) {
        case pb::DMA_MODE_DEFAULT:
            return QU_BUF_DMA_MODE_DEFAULT;
        case pb::DMA_MODE_INDEP_UB:
            return QU_BUF_DMA_MODE_INDEP_UB;
        default:
            return invalidArgument("dma_mode must be DMA_MODE_DEFAULT or DMA_MODE_INDEP_UB");
    }
}

StatusOr<ibv_qp_type> fromProto(pb::QpType t) {
    switch (t) {
        case pb::QP_TYPE_RC:
            return IBV_QPT_RC;
        case pb::QP_TYPE_UC:
            return IBV_QPT_UC;
        case pb::QP_TYPE_UD:
            return IBV_QPT_UD;
        default:
            return invalidArgument("qp_type must be RC, UC or UD");
    }
}

StatusOr<ibv_qp_state> fromProto(pb::QpState s) {
    if (s >= pb::QP_STATE_RESET && s <= pb::QP_STATE_ERR) {
        return static_cast<ibv_qp_state>(static_cast<int>(s) - 1);
    }
    return invalidArgument("QP state is unspecified or unknown");
}

ibv_qp_cap fromProto(const pb::QpCap &c) {
    ibv_qp_cap cap{};
    cap.max_send_wr = c.max_send_wr();
    cap.max_recv_wr = c.max_recv_wr();
    cap.max_send_sge = c.max_send_sge();
    cap.max_recv_sge = c.max_recv_sge();
    cap.max_inline_data = c.max_inline_data();
    return cap;
}

Status fromProto(const pb::QpAttr &in, int mask, ibv_qp_attr *out) {
    *out = {};
    if ((mask & IBV_QP_STATE) != 0) {
        auto s = fromProto(in.qp_state());
        if (!s.isOk()) {
            return s.status();
        }
        out->qp_state = *s;
    }
    if ((mask & IBV_QP_CUR_STATE) != 0) {
        auto s = fromProto(in.cur_qp_state());
        if (!s.isOk()) {
            return s.status();
        }
        out->cur_qp_state = *s;
    }
    out->path_mtu = static_cast<ibv_mtu>(in.path_mtu());
    out->qkey = in.qkey();
    out->rq_psn = in.rq_psn();
    out->sq_psn = in.sq_psn();
    out->dest_qp_num = in.dest_qp_num();
    out->qp_access_flags = static_cast<unsigned>(in.qp_access_flags());
    out->cap = fromProto(in.cap());
    const pb::AhAttr &ah = in.ah_attr();
    if (Status st = copyBytes(ah.dgid().raw(), out->ah_attr.grh.dgid.raw, 16, "ah_attr.dgid"); !st.isOk()) {
        return st;
    }
    out->ah_attr.grh.flow_label = ah.flow_label();
    out->ah_attr.grh.sgid_index = static_cast<uint8_t>(ah.sgid_index());
    out->ah_attr.grh.hop_limit = static_cast<uint8_t>(ah.hop_limit());
    out->ah_attr.grh.traffic_class = static_cast<uint8_t>(ah.traffic_class());
    out->ah_attr.is_global = ah.is_global() ? 1 : 0;
    out->ah_attr.dlid = static_cast<uint16_t>(ah.dlid());
    out->ah_attr.sl = static_cast<uint8_t>(ah.sl());
    out->ah_attr.src_path_bits = static_cast<uint8_t>(ah.src_path_bits());
    out->ah_attr.static_rate = static_cast<uint8_t>(ah.static_rate());
    out->ah_attr.port_num = static_cast<uint8_t>(ah.port_num());
    out->pkey_index = static_cast<uint16_t>(in.pkey_index());
    out->max_rd_atomic = static_cast<uint8_t>(in.max_rd_atomic());
    out->max_dest_rd_atomic = static_cast<uint8_t>(in.max_dest_rd_atomic());
    out->min_rnr_timer = static_cast<uint8_t>(in.min_rnr_timer());
    out->port_num = static_cast<uint8_t>(in.port_num());
    out->timeout = static_cast<uint8_t>(in.timeout());
    out->retry_cnt = static_cast<uint8_t>(in.retry_cnt());
    out->rnr_retry = static_cast<uint8_t>(in.rnr_retry());
    return Status::ok();
}

Status fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out) {
    *out = {};
    if (in.type() > 0xff || in.version() > 0xff) {
        return invalidArgument("hyroce feature type/version out of range");
    }
    out->type = static_cast<uint8_t>(in.type());
    out->version = static_cast<uint8_t>(in.version());
    out->sack_enable = in.sack_enable() ? 1 : 0;
    return copyBytes(in.resv(), out->resv, sizeof(out->resv), "feature.resv");
}

Status fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out) {
    *out = {};
    out->udp_src_port = in.udp_src_port();
    if (Status st = fromProto(in.feature(), &out->feature); !st.isOk()) {
        return st;
    }
    out->lb_mode = in.lb_mode();
    for (Status st : {copyBytes(in.mpath(), &out->mpath, sizeof(out->mpath), "mpath"),
                      copyBytes(in.ar(), &out->ar, sizeof(out->ar), "ar"),
                      copyBytes(in.sack(), &out->sack, sizeof(out->sack), "sack"),
                      copyBytes(in.resv(), out->resv, sizeof(out->resv), "resv")}) {
        if (!st.isOk()) {
            return st;
        }
    }
    out->lag_port = in.lag_port();
    return Status::ok();
}

}  // namespace ibvx::daemon
