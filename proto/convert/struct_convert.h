// The C structs of libibverbs / ibv_extend.h <-> the messages of broker.proto, in one place for
// both ends of the wire. This file is compiled twice: against the full generated classes (the
// daemon's edge) and against the client's lite ones (libibv_extend.so); both generations give
// the classes the same names, so one source serves both.
//
// Pure and lenient: an enum value without a counterpart maps to *_UNSPECIFIED (to the wire) or
// std::nullopt (from the wire), and a bytes field longer than its C array is truncated and
// reported. Deciding what is an error (the daemon refuses UNSPECIFIED and oversized input) is
// the caller's business.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <optional>
#include <string>

#include <ibv_extend.h>

#include "ibv_extend/v1/broker.pb.h"

namespace ibvx::wire {

namespace pb = ::ibv_extend::v1;

pb::QpState toProto(ibv_qp_state s);
std::optional<ibv_qp_state> fromProto(pb::QpState s);
pb::QpType toProto(ibv_qp_type t);
std::optional<ibv_qp_type> fromProto(pb::QpType t);
pb::DmaMode toProto(queue_buf_dma_mode m);
std::optional<queue_buf_dma_mode> fromProto(pb::DmaMode m);

// A bytes field from the wire that did not fit its C array (it was truncated). Empty (field ==
// nullptr) when everything fit.
struct Oversized {
    const char *field = nullptr;  // "ah_attr.dgid", "feature.resv", "mpath", ...
    size_t limit = 0;             // the array's size in bytes
    explicit operator bool() const { return field != nullptr; }
};

// Zero-fills dst and copies at most dst_size bytes of src into it.
Oversized copyBytes(const std::string &src, void *dst, size_t dst_size, const char *field);

void toProto(const ibv_qp_cap &in, pb::QpCap *out);
ibv_qp_cap fromProto(const pb::QpCap &in);

// struct ibv_ah_attr (a QP's path, CreateAh). Fields wider on the wire are truncated to their
// C type: a caller that must refuse them checks the ranges first.
void toProto(const ibv_ah_attr &in, pb::AhAttr *out);
Oversized fromProto(const pb::AhAttr &in, ibv_ah_attr *out);

// The two states are written only when mask names them (IBV_QP_STATE, IBV_QP_CUR_STATE).
void toProto(const ibv_qp_attr &in, int mask, pb::QpAttr *out);
// Every field; a state the wire leaves unspecified (or that is unknown) becomes IBV_QPS_UNKNOWN.
Oversized fromProto(const pb::QpAttr &in, ibv_qp_attr *out);

void toProto(const ibv_hyroce_feature &in, pb::HyroceFeature *out);
// type and version are truncated to their uint8_t fields.
Oversized fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out);

// struct ibv_qp_attr_extend without its qp pointer (the caller sends the QP handle).
void toProto(const ibv_qp_attr_extend &in, pb::QpAttrExtend *out);
Oversized fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out);

// The standard device and port queries (QueryDeviceAttr, QueryPort). GUIDs travel in host
// order; a GID is its 16 network-order bytes.
void toProto(const ibv_device_attr &in, pb::DeviceAttr *out);
void fromProto(const pb::DeviceAttr &in, ibv_device_attr *out);
void toProto(const ibv_port_attr &in, pb::PortAttr *out);
void fromProto(const pb::PortAttr &in, ibv_port_attr *out);
void toProto(const ibv_gid_entry &in, pb::GidEntry *out);
Oversized fromProto(const pb::GidEntry &in, ibv_gid_entry *out);

// The numeric limits of a device: the daemon's DeviceInfo and the client's ibvx_device_info
// share these field names (their name/provider strings differ in type and are set by the caller).
template <typename Limits>
void limitsToProto(const Limits &in, pb::DeviceInfo *out) {
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
}

template <typename Limits>
void limitsFromProto(const pb::DeviceInfo &in, Limits *out) {
    out->ext_cap = in.ext_cap();
    out->driver_version = in.driver_version();
    out->phys_port_cnt = in.phys_port_cnt();
    out->max_qp = in.max_qp();
    out->max_cq = in.max_cq();
    out->max_srq = in.max_srq();
    out->max_mr = in.max_mr();
    out->max_qp_wr = in.max_qp_wr();
    out->max_cqe = in.max_cqe();
    out->max_srq_wr = in.max_srq_wr();
    out->max_sge = in.max_sge();
    out->max_inline_data = in.max_inline_data();
    out->max_msg_sz = in.max_msg_sz();
    out->max_mr_size = in.max_mr_size();
}

}  // namespace ibvx::wire
