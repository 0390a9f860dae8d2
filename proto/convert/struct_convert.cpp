#include "proto/convert/struct_convert.h"

#include <endian.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

namespace ibvx::wire {
namespace {

// Each enum's pairs, once: both directions look them up here.
constexpr std::pair<ibv_qp_state, pb::QpState> kQpStates[] = {
    {IBV_QPS_RESET, pb::QP_STATE_RESET}, {IBV_QPS_INIT, pb::QP_STATE_INIT}, {IBV_QPS_RTR, pb::QP_STATE_RTR},
    {IBV_QPS_RTS, pb::QP_STATE_RTS},     {IBV_QPS_SQD, pb::QP_STATE_SQD},   {IBV_QPS_SQE, pb::QP_STATE_SQE},
    {IBV_QPS_ERR, pb::QP_STATE_ERR}};
constexpr std::pair<ibv_qp_type, pb::QpType> kQpTypes[] = {{IBV_QPT_RC, pb::QP_TYPE_RC},
                                                           {IBV_QPT_UC, pb::QP_TYPE_UC},
                                                           {IBV_QPT_UD, pb::QP_TYPE_UD},
                                                           {IBV_QPT_XRC_SEND, pb::QP_TYPE_XRC_SEND},
                                                           {IBV_QPT_XRC_RECV, pb::QP_TYPE_XRC_RECV}};
constexpr std::pair<queue_buf_dma_mode, pb::DmaMode> kDmaModes[] = {
    {QU_BUF_DMA_MODE_DEFAULT, pb::DMA_MODE_DEFAULT}, {QU_BUF_DMA_MODE_INDEP_UB, pb::DMA_MODE_INDEP_UB}};

template <typename C, typename P, size_t N>
P toWire(const std::pair<C, P> (&table)[N], C value, P unspecified) {
    for (const auto &[c, p] : table) {
        if (c == value) {
            return p;
        }
    }
    return unspecified;
}

template <typename C, typename P, size_t N>
std::optional<C> fromWire(const std::pair<C, P> (&table)[N], P value) {
    for (const auto &[c, p] : table) {
        if (p == value) {
            return c;
        }
    }
    return std::nullopt;
}

template <typename T>
void setRaw(const T &v, std::string *out) {
    out->assign(reinterpret_cast<const char *>(&v), sizeof(v));
}

// The first oversized field of several copies, in the order given.
Oversized firstOf(std::initializer_list<Oversized> results) {
    for (const Oversized &o : results) {
        if (o) {
            return o;
        }
    }
    return {};
}

}  // namespace

pb::QpState toProto(ibv_qp_state s) {
    return toWire(kQpStates, s, pb::QP_STATE_UNSPECIFIED);
}
std::optional<ibv_qp_state> fromProto(pb::QpState s) {
    return fromWire(kQpStates, s);
}
pb::QpType toProto(ibv_qp_type t) {
    return toWire(kQpTypes, t, pb::QP_TYPE_UNSPECIFIED);
}
std::optional<ibv_qp_type> fromProto(pb::QpType t) {
    return fromWire(kQpTypes, t);
}
pb::DmaMode toProto(queue_buf_dma_mode m) {
    return toWire(kDmaModes, m, pb::DMA_MODE_UNSPECIFIED);
}
std::optional<queue_buf_dma_mode> fromProto(pb::DmaMode m) {
    return fromWire(kDmaModes, m);
}

Oversized copyBytes(const std::string &src, void *dst, size_t dst_size, const char *field) {
    std::memset(dst, 0, dst_size);
    std::memcpy(dst, src.data(), std::min(src.size(), dst_size));
    return src.size() > dst_size ? Oversized{field, dst_size} : Oversized{};
}

void toProto(const ibv_qp_cap &in, pb::QpCap *out) {
    out->set_max_send_wr(in.max_send_wr);
    out->set_max_recv_wr(in.max_recv_wr);
    out->set_max_send_sge(in.max_send_sge);
    out->set_max_recv_sge(in.max_recv_sge);
    out->set_max_inline_data(in.max_inline_data);
}

ibv_qp_cap fromProto(const pb::QpCap &in) {
    ibv_qp_cap cap{};
    cap.max_send_wr = in.max_send_wr();
    cap.max_recv_wr = in.max_recv_wr();
    cap.max_send_sge = in.max_send_sge();
    cap.max_recv_sge = in.max_recv_sge();
    cap.max_inline_data = in.max_inline_data();
    return cap;
}

void toProto(const ibv_ah_attr &in, pb::AhAttr *out) {
    setRaw(in.grh.dgid.raw, out->mutable_dgid()->mutable_raw());
    out->set_flow_label(in.grh.flow_label);
    out->set_sgid_index(in.grh.sgid_index);
    out->set_hop_limit(in.grh.hop_limit);
    out->set_traffic_class(in.grh.traffic_class);
    out->set_is_global(in.is_global != 0);
    out->set_dlid(in.dlid);
    out->set_sl(in.sl);
    out->set_src_path_bits(in.src_path_bits);
    out->set_static_rate(in.static_rate);
    out->set_port_num(in.port_num);
}

Oversized fromProto(const pb::AhAttr &in, ibv_ah_attr *out) {
    Oversized big = copyBytes(in.dgid().raw(), out->grh.dgid.raw, sizeof(out->grh.dgid.raw), "ah_attr.dgid");
    out->grh.flow_label = in.flow_label();
    out->grh.sgid_index = static_cast<uint8_t>(in.sgid_index());
    out->grh.hop_limit = static_cast<uint8_t>(in.hop_limit());
    out->grh.traffic_class = static_cast<uint8_t>(in.traffic_class());
    out->is_global = in.is_global() ? 1 : 0;
    out->dlid = static_cast<uint16_t>(in.dlid());
    out->sl = static_cast<uint8_t>(in.sl());
    out->src_path_bits = static_cast<uint8_t>(in.src_path_bits());
    out->static_rate = static_cast<uint8_t>(in.static_rate());
    out->port_num = static_cast<uint8_t>(in.port_num());
    return big;
}

void toProto(const ibv_qp_attr &in, int mask, pb::QpAttr *out) {
    if ((mask & IBV_QP_STATE) != 0) {
        out->set_qp_state(toProto(in.qp_state));
    }
    if ((mask & IBV_QP_CUR_STATE) != 0) {
        out->set_cur_qp_state(toProto(in.cur_qp_state));
    }
    // Programs leave the fields their mask does not name uninitialised (Debian's
    // ibv_xsrq_pingpong does): copy path_mtu's bytes rather than load a garbage enum.
    uint32_t mtu = 0;
    static_assert(sizeof(in.path_mtu) == sizeof(mtu));
    std::memcpy(&mtu, &in.path_mtu, sizeof(mtu));
    out->set_path_mtu(mtu);
    out->set_qkey(in.qkey);
    out->set_rq_psn(in.rq_psn);
    out->set_sq_psn(in.sq_psn);
    out->set_dest_qp_num(in.dest_qp_num);
    out->set_qp_access_flags(static_cast<uint32_t>(in.qp_access_flags));
    toProto(in.cap, out->mutable_cap());
    toProto(in.ah_attr, out->mutable_ah_attr());
    out->set_pkey_index(in.pkey_index);
    out->set_max_rd_atomic(in.max_rd_atomic);
    out->set_max_dest_rd_atomic(in.max_dest_rd_atomic);
    out->set_min_rnr_timer(in.min_rnr_timer);
    out->set_port_num(in.port_num);
    out->set_timeout(in.timeout);
    out->set_retry_cnt(in.retry_cnt);
    out->set_rnr_retry(in.rnr_retry);
}

Oversized fromProto(const pb::QpAttr &in, ibv_qp_attr *out) {
    out->qp_state = fromProto(in.qp_state()).value_or(IBV_QPS_UNKNOWN);
    out->cur_qp_state = fromProto(in.cur_qp_state()).value_or(IBV_QPS_UNKNOWN);
    // Only IB's MTUs become an ibv_mtu; anything else (a field outside the mask, bad input) is 0,
    // which no driver takes for an MTU.
    out->path_mtu = in.path_mtu() >= IBV_MTU_256 && in.path_mtu() <= IBV_MTU_4096
                        ? static_cast<ibv_mtu>(in.path_mtu())
                        : static_cast<ibv_mtu>(0);
    out->qkey = in.qkey();
    out->rq_psn = in.rq_psn();
    out->sq_psn = in.sq_psn();
    out->dest_qp_num = in.dest_qp_num();
    out->qp_access_flags = static_cast<unsigned>(in.qp_access_flags());
    out->cap = fromProto(in.cap());
    Oversized big = fromProto(in.ah_attr(), &out->ah_attr);
    out->pkey_index = static_cast<uint16_t>(in.pkey_index());
    out->max_rd_atomic = static_cast<uint8_t>(in.max_rd_atomic());
    out->max_dest_rd_atomic = static_cast<uint8_t>(in.max_dest_rd_atomic());
    out->min_rnr_timer = static_cast<uint8_t>(in.min_rnr_timer());
    out->port_num = static_cast<uint8_t>(in.port_num());
    out->timeout = static_cast<uint8_t>(in.timeout());
    out->retry_cnt = static_cast<uint8_t>(in.retry_cnt());
    out->rnr_retry = static_cast<uint8_t>(in.rnr_retry());
    return big;
}

void toProto(const ibv_hyroce_feature &in, pb::HyroceFeature *out) {
    out->set_type(in.type);
    out->set_version(in.version);
    out->set_sack_enable(in.sack_enable != 0);
    setRaw(in.resv, out->mutable_resv());
}

Oversized fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out) {
    out->type = static_cast<uint8_t>(in.type());
    out->version = static_cast<uint8_t>(in.version());
    out->sack_enable = in.sack_enable() ? 1 : 0;
    return copyBytes(in.resv(), out->resv, sizeof(out->resv), "feature.resv");
}

void toProto(const ibv_qp_attr_extend &in, pb::QpAttrExtend *out) {
    out->set_udp_src_port(in.udp_src_port);
    toProto(in.feature, out->mutable_feature());
    out->set_lb_mode(in.lb_mode);
    setRaw(in.mpath, out->mutable_mpath());
    setRaw(in.ar, out->mutable_ar());
    setRaw(in.sack, out->mutable_sack());
    setRaw(in.resv, out->mutable_resv());
    out->set_lag_port(in.lag_port);
}

Oversized fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out) {
    out->udp_src_port = in.udp_src_port();
    Oversized feature = fromProto(in.feature(), &out->feature);
    out->lb_mode = in.lb_mode();
    out->lag_port = in.lag_port();
    return firstOf({feature, copyBytes(in.mpath(), &out->mpath, sizeof(out->mpath), "mpath"),
                    copyBytes(in.ar(), &out->ar, sizeof(out->ar), "ar"),
                    copyBytes(in.sack(), &out->sack, sizeof(out->sack), "sack"),
                    copyBytes(in.resv(), out->resv, sizeof(out->resv), "resv")});
}

// ---- the standard queries: one list of fields per struct, used both ways ----

// clang-format off
#define IBVX_DEVICE_ATTR_FIELDS(X) \
    X(max_mr_size)                 \
    X(page_size_cap)               \
    X(vendor_id)                   \
    X(vendor_part_id)              \
    X(hw_ver)                      \
    X(max_qp)                      \
    X(max_qp_wr)                   \
    X(device_cap_flags)            \
    X(max_sge)                     \
    X(max_sge_rd)                  \
    X(max_cq)                      \
    X(max_cqe)                     \
    X(max_mr)                      \
    X(max_pd)                      \
    X(max_qp_rd_atom)              \
    X(max_ee_rd_atom)              \
    X(max_res_rd_atom)             \
    X(max_qp_init_rd_atom)         \
    X(max_ee_init_rd_atom)         \
    X(atomic_cap)                  \
    X(max_ee)                      \
    X(max_rdd)                     \
    X(max_mw)                      \
    X(max_raw_ipv6_qp)             \
    X(max_raw_ethy_qp)             \
    X(max_mcast_grp)               \
    X(max_mcast_qp_attach)         \
    X(max_total_mcast_qp_attach)   \
    X(max_ah)                      \
    X(max_fmr)                     \
    X(max_map_per_fmr)             \
    X(max_srq)                     \
    X(max_srq_wr)                  \
    X(max_srq_sge)                 \
    X(max_pkeys)                   \
    X(local_ca_ack_delay)          \
    X(phys_port_cnt)
#define IBVX_PORT_ATTR_FIELDS(X) \
    X(state)                     \
    X(max_mtu)                   \
    X(active_mtu)                \
    X(gid_tbl_len)               \
    X(port_cap_flags)            \
    X(max_msg_sz)                \
    X(bad_pkey_cntr)             \
    X(qkey_viol_cntr)            \
    X(pkey_tbl_len)              \
    X(lid)                       \
    X(sm_lid)                    \
    X(lmc)                       \
    X(max_vl_num)                \
    X(sm_sl)                     \
    X(subnet_timeout)            \
    X(init_type_reply)           \
    X(active_width)              \
    X(active_speed)              \
    X(phys_state)                \
    X(link_layer)                \
    X(flags)                     \
    X(port_cap_flags2)
// clang-format on

void toProto(const ibv_device_attr &in, pb::DeviceAttr *out) {
    out->set_fw_ver(std::string(in.fw_ver, strnlen(in.fw_ver, sizeof(in.fw_ver))));
    out->set_node_guid(be64toh(in.node_guid));
    out->set_sys_image_guid(be64toh(in.sys_image_guid));
#define X(f) out->set_##f(in.f);
    IBVX_DEVICE_ATTR_FIELDS(X)
#undef X
}

void fromProto(const pb::DeviceAttr &in, ibv_device_attr *out) {
    *out = ibv_device_attr{};
    snprintf(out->fw_ver, sizeof(out->fw_ver), "%s", in.fw_ver().c_str());
    out->node_guid = htobe64(in.node_guid());
    out->sys_image_guid = htobe64(in.sys_image_guid());
#define X(f) out->f = static_cast<decltype(out->f)>(in.f());
    IBVX_DEVICE_ATTR_FIELDS(X)
#undef X
}

void toProto(const ibv_port_attr &in, pb::PortAttr *out) {
#define X(f) out->set_##f(static_cast<uint32_t>(in.f));
    IBVX_PORT_ATTR_FIELDS(X)
#undef X
}

void fromProto(const pb::PortAttr &in, ibv_port_attr *out) {
    *out = ibv_port_attr{};
#define X(f) out->f = static_cast<decltype(out->f)>(in.f());
    IBVX_PORT_ATTR_FIELDS(X)
#undef X
}

void toProto(const ibv_gid_entry &in, pb::GidEntry *out) {
    out->set_gid(in.gid.raw, sizeof(in.gid.raw));
    out->set_index(in.gid_index);
    out->set_gid_type(in.gid_type);
    out->set_ndev_ifindex(in.ndev_ifindex);
}

Oversized fromProto(const pb::GidEntry &in, ibv_gid_entry *out) {
    *out = ibv_gid_entry{};
    out->gid_index = in.index();
    out->gid_type = in.gid_type();
    out->ndev_ifindex = in.ndev_ifindex();
    return copyBytes(in.gid(), out->gid.raw, sizeof(out->gid.raw), "gid");
}

#undef IBVX_DEVICE_ATTR_FIELDS
#undef IBVX_PORT_ATTR_FIELDS

}  // namespace ibvx::wire
