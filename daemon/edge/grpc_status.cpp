#include "daemon/edge/grpc_status.h"

#include "ibv_extend/v1/broker.pb.h"

namespace ibvx::daemon {

grpc::StatusCode grpcCode(Code code) {
    switch (code) {
        case Code::kOk:
            return grpc::StatusCode::OK;
        case Code::kInvalidArgument:
            return grpc::StatusCode::INVALID_ARGUMENT;
        case Code::kNotFound:
            return grpc::StatusCode::NOT_FOUND;
        case Code::kAlreadyExists:
            return grpc::StatusCode::ALREADY_EXISTS;
        case Code::kPermissionDenied:
            return grpc::StatusCode::PERMISSION_DENIED;
        case Code::kResourceExhausted:
            return grpc::StatusCode::RESOURCE_EXHAUSTED;
        case Code::kFailedPrecondition:
            return grpc::StatusCode::FAILED_PRECONDITION;
        case Code::kUnimplemented:
            return grpc::StatusCode::UNIMPLEMENTED;
        case Code::kUnavailable:
            return grpc::StatusCode::UNAVAILABLE;
        case Code::kDeadlineExceeded:
            return grpc::StatusCode::DEADLINE_EXCEEDED;
        case Code::kInternal:
            return grpc::StatusCode::INTERNAL;
    }
    return grpc::StatusCode::UNKNOWN;
}

grpc::Status toGrpc(const Status &status) {
    if (status.isOk()) {
        return grpc::Status::OK;
    }
    ibv_extend::v1::ErrorDetail detail;
    detail.set_errno_value(status.errnoValue() != 0 ? status.errnoValue() : errnoForCode(status.code()));
    return grpc::Status(grpcCode(status.code()), status.message(), detail.SerializeAsString());
}

}  // namespace ibvx::daemon
