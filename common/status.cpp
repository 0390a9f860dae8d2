#include "common/status.h"

namespace ibvx {

const char *codeName(Code code) {
    switch (code) {
        case Code::kOk:
            return "OK";
        case Code::kInvalidArgument:
            return "INVALID_ARGUMENT";
        case Code::kNotFound:
            return "NOT_FOUND";
        case Code::kAlreadyExists:
            return "ALREADY_EXISTS";
        case Code::kPermissionDenied:
            return "PERMISSION_DENIED";
        case Code::kResourceExhausted:
            return "RESOURCE_EXHAUSTED";
        case Code::kFailedPrecondition:
            return "FAILED_PRECONDITION";
        case Code::kUnimplemented:
            return "UNIMPLEMENTED";
        case Code::kUnavailable:
            return "UNAVAILABLE";
        case Code::kDeadlineExceeded:
            return "DEADLINE_EXCEEDED";
        case Code::kInternal:
            return "INTERNAL";
    }
    return "UNKNOWN";
}

Code codeForErrno(int err) {
    switch (err) {
        case 0:
            return Code::kOk;
        case EINVAL:
        case E2BIG:
        case ERANGE:
        case EBADF:
        case EFAULT:
            return Code::kInvalidArgument;
        case ENOENT:
        case ENODEV:
        case ENXIO:
            return Code::kNotFound;
        case EEXIST:
            return Code::kAlreadyExists;
        case EPERM:
        case EACCES:
            return Code::kPermissionDenied;
        case ENOMEM:
        case ENOSPC:
        case EDQUOT:
        case EMFILE:
        case ENFILE:
        case EAGAIN:
            return Code::kResourceExhausted;
        case EBUSY:
        // The path to another host is not there (softnda's RoCEv2 socket, SPEC.md §18): the
        // device's state, not a fault of the broker. Never UNAVAILABLE, which tells a client the
        // broker is restarting and to try again.
        case EHOSTUNREACH:
        case ENETUNREACH:
        case ENETDOWN:
        case EAFNOSUPPORT:
        case EADDRINUSE:
        case EADDRNOTAVAIL:
            return Code::kFailedPrecondition;
        case EOPNOTSUPP:
        case ENOSYS:
            return Code::kUnimplemented;
        case ENOTCONN:
        case ECONNRESET:
        case ECONNREFUSED:
        case EPIPE:
        case ESHUTDOWN:
            return Code::kUnavailable;
        case ETIMEDOUT:
            return Code::kDeadlineExceeded;
        default:
            return Code::kInternal;
    }
}

int errnoForCode(Code code) {
    switch (code) {
        case Code::kOk:
            return 0;
        case Code::kInvalidArgument:
            return EINVAL;
        case Code::kNotFound:
            return ENOENT;
        case Code::kAlreadyExists:
            return EEXIST;
        case Code::kPermissionDenied:
            return EPERM;
        case Code::kResourceExhausted:
            return ENOMEM;
        case Code::kFailedPrecondition:
            return EBUSY;
        case Code::kUnimplemented:
            return EOPNOTSUPP;
        case Code::kUnavailable:
            return ENOTCONN;
        case Code::kDeadlineExceeded:
            return ETIMEDOUT;
        case Code::kInternal:
            return EIO;
    }
    return EIO;
}

std::string Status::toString() const {
    if (isOk()) {
        return "OK";
    }
    return std::string(codeName(code_)) + ": " + message_;
}

Status invalidArgument(std::string message) {
    return Status(Code::kInvalidArgument, EINVAL, std::move(message));
}
Status notFound(std::string message) {
    return Status(Code::kNotFound, ENOENT, std::move(message));
}
Status failedPrecondition(std::string message) {
    return Status(Code::kFailedPrecondition, EBUSY, std::move(message));
}
Status resourceExhausted(std::string message) {
    return Status(Code::kResourceExhausted, ENOMEM, std::move(message));
}
Status permissionDenied(std::string message) {
    return Status(Code::kPermissionDenied, EPERM, std::move(message));
}
Status unimplemented(std::string message) {
    return Status(Code::kUnimplemented, EOPNOTSUPP, std::move(message));
}

}  // namespace ibvx
