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

// What RETURN_IF_ERROR tests: a Status, or the status of a StatusOr.
inline const Status &toStatus(const Status &s) {
    return s;
}
template <typename T>
const Status &toStatus(const StatusOr<T> &s) {
    return s.status();
}

}  // namespace ibvx

// Early return of a failed Status or StatusOr, the Abseil/Envoy shape; each names the return it
// hides, so a reader sees the exit at the call site.
//   RETURN_IF_ERROR(checkLimit(...));          // returns the Status if it is not OK
//   ASSIGN_OR_RETURN(Object *o, lookup(...));  // declares o from the StatusOr's value
#define IBVX_STATUS_CONCAT_INNER(a, b) a##b
#define IBVX_STATUS_CONCAT(a, b) IBVX_STATUS_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                                                             \
    do {                                                                                  \
        if (::ibvx::Status ibvx_status_ = ::ibvx::toStatus(expr); !ibvx_status_.isOk()) { \
            return ibvx_status_;                                                          \
        }                                                                                 \
    } while (false)

#define ASSIGN_OR_RETURN(lhs, expr) \
    IBVX_ASSIGN_OR_RETURN_IMPL(IBVX_STATUS_CONCAT(ibvx_statusor_, __LINE__), lhs, expr)
#define IBVX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
    auto tmp = (expr);                             \
    if (!tmp.isOk()) {                             \
        return tmp.status();                       \
    }                                              \
    lhs = std::move(tmp).value()
