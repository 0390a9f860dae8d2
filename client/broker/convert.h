// The client's face of the shared converter (proto/convert/struct_convert.h, compiled here
// against the lite classes). The client trusts the broker's replies: an unknown state reads as
// IBV_QPS_UNKNOWN, an unknown QP type as RC, and bytes too long for their array are truncated.
#pragma once

#include <infiniband/verbs.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "ibv_extend/v1/broker.pb.h"
#include "proto/convert/struct_convert.h"

namespace ibvx::client::broker {

namespace pb = ::ibv_extend::v1;

inline pb::QpState toProtoState(ibv_qp_state s) {
    return wire::toProto(s);
}
inline ibv_qp_state fromProtoState(pb::QpState s) {
    return wire::fromProto(s).value_or(IBV_QPS_UNKNOWN);
}
// QP_TYPE_UNSPECIFIED for a type the broker does not carry (it answers INVALID_ARGUMENT).
inline pb::QpType toProtoQpType(ibv_qp_type t) {
    return wire::toProto(t);
}
inline ibv_qp_type fromProtoQpType(pb::QpType t) {
    return wire::fromProto(t).value_or(IBV_QPT_RC);
}
inline pb::DmaMode toProtoDmaMode(queue_buf_dma_mode m) {
    return wire::toProto(m);
}

inline void toProto(const ibv_qp_cap &cap, pb::QpCap *out) {
    wire::toProto(cap, out);
}
inline void fromProto(const pb::QpCap &cap, ibv_qp_cap *out) {
    *out = wire::fromProto(cap);
}

// Only fields attr_mask names are meaningful to the broker; enums outside the mask stay unset.
inline void toProto(const ibv_qp_attr &attr, int attr_mask, pb::QpAttr *out) {
    wire::toProto(attr, attr_mask, out);
}
inline void fromProto(const pb::QpAttr &attr, ibv_qp_attr *out) {
    (void)wire::fromProto(attr, out);
}

inline void toProto(const ibv_hyroce_feature &f, pb::HyroceFeature *out) {
    wire::toProto(f, out);
}
inline void fromProto(const pb::HyroceFeature &f, ibv_hyroce_feature *out) {
    (void)wire::fromProto(f, out);
}

inline void toProto(const ibv_qp_attr_extend &attr, pb::QpAttrExtend *out) {
    wire::toProto(attr, out);
}
inline void fromProto(const pb::QpAttrExtend &attr, ibv_qp_attr_extend *out) {
    (void)wire::fromProto(attr, out);
}

void fromProto(const pb::DeviceInfo &d, ibvx_device_info *out);

// Copies at most dst_size bytes of src into dst (the rest of dst is left as it was).
void copyBytes(const std::string &src, void *dst, size_t dst_size);

}  // namespace ibvx::client::broker
