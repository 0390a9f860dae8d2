#include <gtest/gtest.h>

#include "common/memfd_region.h"
#include "common/status.h"

namespace ibvx {
namespace {

TEST(Status, ErrnoMapsToWireCodeAndBack) {
    EXPECT_EQ(codeForErrno(EINVAL), Code::kInvalidArgument);
    EXPECT_EQ(codeForErrno(ENOENT), Code::kNotFound);
    EXPECT_EQ(codeForErrno(EPERM), Code::kPermissionDenied);
    EXPECT_EQ(codeForErrno(ENOMEM), Code::kResourceExhausted);
    EXPECT_EQ(codeForErrno(EBUSY), Code::kFailedPrecondition);
    // A RoCE device with no path to the peer's host (no socket, no route): not the broker's fault,
    // and not UNAVAILABLE, on which a client would retry as across a restart.
    for (int e : {EHOSTUNREACH, ENETUNREACH, ENETDOWN, EAFNOSUPPORT, EADDRINUSE, EADDRNOTAVAIL}) {
        EXPECT_EQ(codeForErrno(e), Code::kFailedPrecondition) << e;
    }
    EXPECT_EQ(codeForErrno(EOPNOTSUPP), Code::kUnimplemented);
    EXPECT_EQ(codeForErrno(ECONNRESET), Code::kUnavailable);
    for (int e : {EINVAL, ENOENT, EPERM, ENOMEM, EBUSY, EOPNOTSUPP, ETIMEDOUT}) {
        EXPECT_EQ(codeForErrno(errnoForCode(codeForErrno(e))), codeForErrno(e)) << e;
    }
    Status s = Status::fromErrno(EBUSY, "CQ is used by a QP");
    EXPECT_FALSE(s.isOk());
    EXPECT_EQ(s.toString(), "FAILED_PRECONDITION: CQ is used by a QP");
}

TEST(MemfdRegion, CreateRoundsToPagesAndSealsSize) {
    auto r = MemfdRegion::create("t", 100);
    ASSERT_TRUE(r.isOk());
    EXPECT_EQ(r->size(), pageSize());
    EXPECT_TRUE(r->contains(r->data(), pageSize()));
    EXPECT_FALSE(r->contains(static_cast<char *>(r->data()) + 1, pageSize()));
    EXPECT_LT(::ftruncate(r->fd(), 1 << 20), 0);  // F_SEAL_GROW
}

TEST(MemfdRegion, ZeroSizeIsInvalid) {
    auto r = MemfdRegion::create("t", 0);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

TEST(MemfdRegion, HugepageRequestFallsBackSilently) {
    auto r = MemfdRegion::create("t", 8192, /*try_hugepages=*/true);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_GE(r->size(), 8192u);
}

}  // namespace
}  // namespace ibvx
