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

void toProto(const Version &in, pb::Version *out);
// The kernel's identity of the tenant (the pod, which the wire does not carry, left out).
void toProto(const PeerIdentity &in, pb::PeerIdentity *out);
void toProto(const DeviceInfo &in, pb::DeviceInfo *out);
void toProto(const QueueResult &in, pb::QueueInfo *out);
// Both states included.
void toProto(const ibv_qp_attr &in, pb::QpAttr *out);

// A call's result into its response message.
void toProto(const OpenContextResult &in, pb::OpenContextResponse *out);
void toProto(const ibv_device_attr_extend &in, pb::QueryDeviceResponse *out);
void toProto(const PortInfo &in, pb::QueryPortResponse *out);
void toProto(const RegMrResult &in, pb::RegMrResponse *out);
void toProto(const DmResult &in, pb::AllocDmResponse *out);
void toProto(const RegMrResult &in, pb::ReregMrResponse *out);
void toProto(const CqResult &in, pb::CreateCqResponse *out);
void toProto(const ResizeCqResult &in, pb::ResizeCqResponse *out);
void toProto(const QpResult &in, pb::CreateQpResponse *out);
void toProto(const SrqResult &in, pb::CreateSrqResponse *out);
void toProto(const QueryQpResult &in, pb::QueryQpResponse *out);
void toProto(const NegoResult &in, pb::NegoQpHyroceFeatureResponse *out);
// The regions a destroy released, which the client may unmap.
void toProto(const Released &in, google::protobuf::RepeatedField<uint64_t> *out);

StatusOr<queue_buf_dma_mode> fromProto(pb::DmaMode m);
StatusOr<ibv_qp_type> fromProto(pb::QpType t);
StatusOr<ibv_qp_state> fromProto(pb::QpState s);
ibv_qp_cap fromProto(const pb::QpCap &c);
// mask tells which fields must be valid (IBV_QP_STATE needs a specified state, ...); a state
// outside the mask is left 0.
Status fromProto(const pb::QpAttr &in, int mask, ibv_qp_attr *out);
Status fromProto(const pb::QpAttrExtend &in, ibv_qp_attr_extend *out);
Status fromProto(const pb::HyroceFeature &in, ibv_hyroce_feature *out);
// A field beyond its C type's range (port_num > 255, dlid > 0xffff, ...) or a dgid of other
// than 16 bytes: INVALID_ARGUMENT, never truncated into another value.
Status fromProto(const pb::AhAttr &in, ibv_ah_attr *out);

// A request into the core's arguments; the first field that is not well-formed answers.
RegMrArgs fromProto(const pb::RegMrRequest &in);
ReregMrArgs fromProto(const pb::ReregMrRequest &in);
StatusOr<CreateCqArgs> fromProto(const pb::CreateCqRequest &in);
StatusOr<McastArgs> fromProto(const pb::McastRequest &in);
StatusOr<CreateQpArgs> fromProto(const pb::CreateQpRequest &in);
StatusOr<CreateSrqArgs> fromProto(const pb::CreateSrqRequest &in);

// Admin: an object of a session listing (the per-kind details from the snapshot's kind).
pb::ObjectKind toProto(ObjectKind kind);
std::optional<ObjectKind> fromProto(pb::ObjectKind kind);
void toProto(const ObjectSnapshot &in, pb::ObjectInfo *out);

}  // namespace ibvx::daemon
