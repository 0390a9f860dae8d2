// proto <-> core conversions for the Broker and Admin services, on the shared converter
// (proto/convert/struct_convert.h). Every enum and byte field from the wire is checked here
// (UNSPECIFIED and oversized fields are INVALID_ARGUMENT), so the core sees only well-formed C
// structs.
#pragma once

#include "common/status.h"
#include "daemon/core/admin_inspect.h"
#include "daemon/core/broker.h"
#include "ibv_extend/v1/admin.pb.h"
#include "ibv_extend/v1/broker.pb.h"
#include "proto/convert/struct_convert.h"

namespace ibvx::daemon {

namespace pb = ::ibv_extend::v1;

using wire::toProto;

void toProto(const DeviceInfo &in, pb::DeviceInfo *out);
void toProto(const QueueResult &in, pb::QueueInfo *out);
// Both states included.
void toProto(const ibv_qp_attr &in, pb::QpAttr *out);

StatusOr<queue_buf_dma_mode> fromProto(pb::DmaMode m);
StatusOr<ibv_qp_type> fromProto(pb::QpType t);
StatusOr<ibv_qp_state> fromProto(pb::QpState s);
ibv_qp_cap fromProto(const pb::QpCap &c);
// mask tells which fields must be valid (IBV_QP_STATE needs a specified state, ...); a state
// outside the mask is left 0.
Status fromProto(const pb::QpAttr &in, int mask, ibv_qp_attr *out);
Status fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out);
Status fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out);

// Admin: an object of a session listing (the per-kind details from the snapshot's kind).
pb::ObjectKind toProto(ObjectKind kind);
std::optional<ObjectKind> fromProto(pb::ObjectKind kind);
void toProto(const ObjectSnapshot &in, pb::ObjectInfo *out);

}  // namespace ibvx::daemon
