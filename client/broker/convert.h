// C structs of ibv_extend.h / libibverbs <-> the wire messages of broker.proto. Pure functions:
// no session, no I/O (queue addresses are resolved by the caller through the session).
#pragma once

#include <infiniband/verbs.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "ibv_extend/v1/broker.pb.h"

namespace ibvx::client::broker {

namespace pb = ::ibv_extend::v1;

pb::QpState toProtoState(ibv_qp_state s);
ibv_qp_state fromProtoState(pb::QpState s);
pb::QpType toProtoQpType(ibv_qp_type t);
ibv_qp_type fromProtoQpType(pb::QpType t);
pb::DmaMode toProtoDmaMode(queue_buf_dma_mode m);

void toProto(const ibv_qp_cap &cap, pb::QpCap *out);
void fromProto(const pb::QpCap &cap, ibv_qp_cap *out);

// Only fields attr_mask names are meaningful to the broker; enums outside the mask stay unset.
void toProto(const ibv_qp_attr &attr, int attr_mask, pb::QpAttr *out);
void fromProto(const pb::QpAttr &attr, ibv_qp_attr *out);

void toProto(const ibv_hyroce_feature &f, pb::HyroceFeature *out);
void fromProto(const pb::HyroceFeature &f, ibv_hyroce_feature *out);

// struct ibv_qp_attr_extend without its qp pointer (the caller sends the QP handle).
void toProto(const ibv_qp_attr_extend &attr, pb::QpAttrExtend *out);
void fromProto(const pb::QpAttrExtend &attr, ibv_qp_attr_extend *out);

void fromProto(const pb::DeviceInfo &d, ibvx_device_info *out);

// Copies at most dst_size bytes of src into dst (the rest of dst is left as it was).
void copyBytes(const std::string &src, void *dst, size_t dst_size);

}  // namespace ibvx::client::broker
