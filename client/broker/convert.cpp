#include "client/broker/convert.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ibvx::client::broker {

void copyBytes(const std::string &src, void *dst, size_t dst_size) {
    memcpy(dst, src.data(), std::min(src.size(), dst_size));
}

namespace {

template <typename T>
std::string rawBytes(const T &v) {
    return std::string(reinterpret_cast<const char *>(&v), sizeof(v));
}

}  // namespace

pb::QpState toProtoState(ibv_qp_state s) {
    switch (s) {
        case IBV_QPS_RESET:
            return pb::QP_STATE_RESET;
        case IBV_QPS_INIT:
            return pb::QP_STATE_INIT;
        case IBV_QPS_RTR:
            return pb::QP_STATE_RTR;
        case IBV_QPS_RTS:
            return pb::QP_STATE_RTS;
        case IBV_QPS_SQD:
            return pb::QP_STATE_SQD;
        case IBV_QPS_SQE:
            return pb::QP_STATE_SQE;
        case IBV_QPS_ERR:
            return pb::QP_STATE_ERR;
        default:
            return pb::QP_STATE_UNSPECIFIED;
    }
}

ibv_qp_state fromProtoState(pb::QpState s) {
    switch (s) {
        case pb::QP_STATE_RESET:
            return IBV_QPS_RESET;
        case pb::QP_STATE_INIT:
            return IBV_QPS_INIT;
        case pb::QP_STATE_RTR:
            return IBV_QPS_RTR;
        case pb::QP_STATE_RTS:
            return IBV_QPS_RTS;
        case pb::QP_STATE_SQD:
            return IBV_QPS_SQD;
        case pb::QP_STATE_SQE:
            return IBV_QPS_SQE;
        case pb::QP_STATE_ERR:
            return IBV_QPS_ERR;
        default:
            return IBV_QPS_UNKNOWN;
    }
}

pb::QpType toProtoQpType(ibv_qp_type t) {
    switch (t) {
        case IBV_QPT_RC:
            return pb::QP_TYPE_RC;
        case IBV_QPT_UC:
            return pb::QP_TYPE_UC;
        case IBV_QPT_UD:
            return pb::QP_TYPE_UD;
        default:
            return pb::QP_TYPE_UNSPECIFIED;  // the broker answers INVALID_ARGUMENT
    }
}

ibv_qp_type fromProtoQpType(pb::QpType t) {
    switch (t) {
        case pb::QP_TYPE_UC:
            return IBV_QPT_UC;
        case pb::QP_TYPE_UD:
            return IBV_QPT_UD;
        default:
            return IBV_QPT_RC;
    }
}

pb::DmaMode toProtoDmaMode(queue_buf_dma_mode m) {
    switch (m) {
        case QU_BUF_DMA_MODE_DEFAULT:
            return pb::DMA_MODE_DEFAULT;
        case QU_BUF_DMA_MODE_INDEP_UB:
            return pb::DMA_MODE_INDEP_UB;
        default:
            return pb::DMA_MODE_UNSPECIFIED;
    }
}

void toProto(const ibv_qp_cap &cap, pb::QpCap *out) {
    out->set_max_send_wr(cap.max_send_wr);
    out->set_max_recv_wr(cap.max_recv_wr);
    out->set_max_send_sge(cap.max_send_sge);
    out->set_max_recv_sge(cap.max_recv_sge);
    out->set_max_inline_data(cap.max_inline_data);
}

void fromProto(const pb::QpCap &cap, ibv_qp_cap *out) {
    out->max_send_wr = cap.max_send_wr();
    out->max_recv_wr = cap.max_recv_wr();
    out->max_send_sge = cap.max_send_sge();
    out->max_recv_sge = cap.max_recv_sge();
    out->max_inline_data = cap.max_inline_data();
}

void toProto(const ibv_qp_attr &a, int mask, pb::QpAttr *out) {
    if ((mask & IBV_QP_STATE) != 0) {
        out->set_qp_state(toProtoState(a.qp_state));
    }
    if ((mask & IBV_QP_CUR_STATE) != 0) {
        out->set_cur_qp_state(toProtoState(a.cur_qp_state));
    }
    out->set_path_mtu(a.path_mtu);
    out->set_qkey(a.qkey);
    out->set_rq_psn(a.rq_psn);
    out->set_sq_psn(a.sq_psn);
    out->set_dest_qp_num(a.dest_qp_num);
    out->set_qp_access_flags(static_cast<uint32_t>(a.qp_access_flags));
    toProto(a.cap, out->mutable_cap());
    pb::AhAttr *ah = out->mutable_ah_attr();
    ah->mutable_dgid()->set_raw(rawBytes(a.ah_attr.grh.dgid.raw));
    ah->set_flow_label(a.ah_attr.grh.flow_label);
    ah->set_sgid_index(a.ah_attr.grh.sgid_index);
    ah->set_hop_limit(a.ah_attr.grh.hop_limit);
    ah->set_traffic_class(a.ah_attr.grh.traffic_class);
    ah->set_is_global(a.ah_attr.is_global != 0);
    ah->set_dlid(a.ah_attr.dlid);
    ah->set_sl(a.ah_attr.sl);
    ah->set_src_path_bits(a.ah_attr.src_path_bits);
    ah->set_static_rate(a.ah_attr.static_rate);
    ah->set_port_num(a.ah_attr.port_num);
    out->set_pkey_index(a.pkey_index);
    out->set_max_rd_atomic(a.max_rd_atomic);
    out->set_max_dest_rd_atomic(a.max_dest_rd_atomic);
    out->set_min_rnr_timer(a.min_rnr_timer);
    out->set_port_num(a.port_num);
    out->set_timeout(a.timeout);
    out->set_retry_cnt(a.retry_cnt);
    out->set_rnr_retry(a.rnr_retry);
}

void fromProto(const pb::QpAttr &p, ibv_qp_attr *a) {
    a->qp_state = fromProtoState(p.qp_state());
    a->cur_qp_state = fromProtoState(p.cur_qp_state());
    a->path_mtu = static_cast<ibv_mtu>(p.path_mtu());
    a->qkey = p.qkey();
    a->rq_psn = p.rq_psn();
    a->sq_psn = p.sq_psn();
    a->dest_qp_num = p.dest_qp_num();
    a->qp_access_flags = static_cast<unsigned>(p.qp_access_flags());
    fromProto(p.cap(), &a->cap);
    const pb::AhAttr &ah = p.ah_attr();
    copyBytes(ah.dgid().raw(), a->ah_attr.grh.dgid.raw, sizeof(a->ah_attr.grh.dgid.raw));
    a->ah_attr.grh.flow_label = ah.flow_label();
    a->ah_attr.grh.sgid_index = static_cast<uint8_t>(ah.sgid_index());
    a->ah_attr.grh.hop_limit = static_cast<uint8_t>(ah.hop_limit());
    a->ah_attr.grh.traffic_class = static_cast<uint8_t>(ah.traffic_class());
    a->ah_attr.is_global = ah.is_global() ? 1 : 0;
    a->ah_attr.dlid = static_cast<uint16_t>(ah.dlid());
    a->ah_attr.sl = static_cast<uint8_t>(ah.sl());
    a->ah_attr.src_path_bits = static_cast<uint8_t>(ah.src_path_bits());
    a->ah_attr.static_rate = static_cast<uint8_t>(ah.static_rate());
    a->ah_attr.port_num = static_cast<uint8_t>(ah.port_num());
    a->pkey_index = static_cast<uint16_t>(p.pkey_index());
    a->max_rd_atomic = static_cast<uint8_t>(p.max_rd_atomic());
    a->max_dest_rd_atomic = static_cast<uint8_t>(p.max_dest_rd_atomic());
    a->min_rnr_timer = static_cast<uint8_t>(p.min_rnr_timer());
    a->port_num = static_cast<uint8_t>(p.port_num());
    a->timeout = static_cast<uint8_t>(p.timeout());
    a->retry_cnt = static_cast<uint8_t>(p.retry_cnt());
    a->rnr_retry = static_cast<uint8_t>(p.rnr_retry());
}

void toProto(const ibv_hyroce_feature &f, pb::HyroceFeature *out) {
    out->set_type(f.type);
    out->set_version(f.version);
    out->set_sack_enable(f.sack_enable != 0);
    out->set_resv(rawBytes(f.resv));
}

void fromProto(const pb::HyroceFeature &f, ibv_hyroce_feature *out) {
    out->type = static_cast<uint8_t>(f.type());
    out->version = static_cast<uint8_t>(f.version());
    out->sack_enable = f.sack_enable() ? 1 : 0;
    copyBytes(f.resv(), out->resv, sizeof(out->resv));
}

void toProto(const ibv_qp_attr_extend &a, pb::QpAttrExtend *out) {
    out->set_udp_src_port(a.udp_src_port);
    toProto(a.feature, out->mutable_feature());
    out->set_lb_mode(a.lb_mode);
    out->set_mpath(rawBytes(a.mpath));
    out->set_ar(rawBytes(a.ar));
    out->set_sack(rawBytes(a.sack));
    out->set_resv(rawBytes(a.resv));
    out->set_lag_port(a.lag_port);
}

void fromProto(const pb::QpAttrExtend &p, ibv_qp_attr_extend *a) {
    a->udp_src_port = p.udp_src_port();
    fromProto(p.feature(), &a->feature);
    a->lb_mode = p.lb_mode();
    copyBytes(p.mpath(), &a->mpath, sizeof(a->mpath));
    copyBytes(p.ar(), &a->ar, sizeof(a->ar));
    copyBytes(p.sack(), &a->sack, sizeof(a->sack));
    copyBytes(p.resv(), a->resv, sizeof(a->resv));
    a->lag_port = p.lag_port();
}

void fromProto(const pb::DeviceInfo &d, ibvx_device_info *out) {
    *out = ibvx_device_info{};
    snprintf(out->name, sizeof(out->name), "%s", d.name().c_str());
    snprintf(out->provider, sizeof(out->provider), "%s", d.provider().c_str());
    out->ext_cap = d.ext_cap();
    out->driver_version = d.driver_version();
    out->phys_port_cnt = d.phys_port_cnt();
    out->max_qp = d.max_qp();
    out->max_cq = d.max_cq();
    out->max_srq = d.max_srq();
    out->max_mr = d.max_mr();
    out->max_qp_wr = d.max_qp_wr();
    out->max_cqe = d.max_cqe();
    out->max_srq_wr = d.max_srq_wr();
    out->max_sge = d.max_sge();
    out->max_inline_data = d.max_inline_data();
    out->max_msg_sz = d.max_msg_sz();
    out->max_mr_size = d.max_mr_size();
}

}  // namespace ibvx::client::broker
