// Status -> grpc::Status, with the errno in a serialized ibv_extend.v1.ErrorDetail.
#pragma once

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace ibvx::daemon {

grpc::StatusCode grpcCode(Code code);
grpc::Status toGrpc(const Status &status);

}  // namespace ibvx::daemon
