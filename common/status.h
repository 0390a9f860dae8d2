// Status / StatusOr: how every module inside the project reports failure (no exceptions across
// module boundaries). A Status carries a gRPC-like code for the wire, the errno the reference C
// API returns for the same failure, and a message a human can act on.
#pragma once

#include <cerrno>
#include <optional>
#include <string>
#include <utility>

namespace ibvx {

enum class Code {
    kOk = 0,
    kInvalidArgument,
    kNotFound,
    kAlreadyExists,
    kPermissionDenied,
    kResourceExhausted,
    kFailedPrecondition,
    kUnimplemented,
    kUnavailable,
    kDeadlineExceeded,
    kInternal,
};

const char *codeName(Code code);

// The code a failure with this errno is reported as on the wire.
Code codeForErrno(int err);
// The errno reported to C callers when the broker sent no errno detail.
int errnoForCode(Code code);

class [[nodiscard]] Status {
  public:
    Status() = default;
    Status(Code code, int err, std::string message)
        : code_(code), errno_(err), message_(std::move(message)) {}

    static Status ok() { return Status(); }
    // Picks the code from the errno.
    static Status fromErrno(int err, std::string message) {
        return Status(codeForErrno(err), err, std::move(message));
    }

    bool isOk() const { return code_ == Code::kOk; }
    Code code() const { return code_; }
    int errnoValue() const { return errno_; }
    const std::string &message() const { return message_; }
    std::string toString() const;

  private:
    Code code_ = Code::kOk;
    int errno_ = 0;
    std::string message_;
};

Status invalidArgument(std::string message);
Status notFound(std::string message);
Status failedPrecondition(std::string message);
Status resourceExhausted(std::string message);
Status permissionDenied(std::string message);
Status unimplemented(std::string message);

template <typename T>
class [[nodiscard]] StatusOr {
  public:
    StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design
    StatusOr(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design

    bool isOk() const { return status_.isOk(); }
    const Status &status() const { return status_; }
    T &value() & { return *value_; }
    const T &value() const & { return *value_; }
    T &&value() && { return std::move(*value_); }
    T *operator->() { return &*value_; }
    const T *operator->() const { return &*value_; }
    T &operator*() & { return *value_; }

  private:
    Status status_;
    std::optional<T> value_;
};

}  // namespace ibvx
