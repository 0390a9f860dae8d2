// proto <-> core conversions for the Broker service. Every enum and byte field from the wire is
// checked here (UNSPECIFIED and oversized fields are INVALID_ARGUMENT), so the core sees only
// well-formed C structs.
#pragma once

#include "common/status.h"
#include "daemon/core/broker.h"
#include "ibv_extend/v1/broker.pb.h"

namespace ibvx::daemon {

namespace pb = ::ibv_extend::v1;

void toProto(const DeviceInfo &in, pb::DeviceInfo *out);
void toProto(const QueueResult &in, pb::QueueInfo *out);
void toProto(const ibv_qp_attr &in, pb::QpAttr *out);
void toProto(const ibv_qp_cap &in, pb::QpCap *out);
void toProto(const ibv_qp_attr_extend &in, pb::QpAttrExtend *out);
void toProto(const ibv_hyroce_feature &in, pb::HyroceFeature *out);
pb::QpState toProto(ibv_qp_state s);
pb::QpType toProto(ibv_qp_type t);

StatusOr<queue_buf_dma_mode> fromProto(pb::DmaMode m);
StatusOr<ibv_qp_type> fromProto(pb::QpType t);
StatusOr<ibv_qp_state> fromProto(pb::QpState s);
ibv_qp_cap fromProto(const pb::QpCap &c);
// mask tells which fields must be valid (IBV_QP_STATE needs a specified state, ...).
Status fromProto(const pb::QpAttr &in, int mask, ibv_qp_attr *out);
Status fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out);
Status fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out);

}  // namespace ibvx::daemon
