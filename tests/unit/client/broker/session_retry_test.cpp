// The pieces of the broker-restart retry in client/broker/session.h that a fake broker cannot
// show one by one (tests/integration/client/restart_retry_test.cpp runs them together): which
// failures are retried, which calls carry a key, and what a key looks like.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <set>
#include <string>

#include "client/broker/session.h"

namespace ibvx::client::broker {
namespace {

TEST(SessionRetry, OnlyUnavailableOrCancelledWithTheFdChannelOpenIsRetried) {
    EXPECT_TRUE(retryAfter(grpc::StatusCode::UNAVAILABLE, true));
    EXPECT_FALSE(retryAfter(grpc::StatusCode::UNAVAILABLE, false));  // EOF: the session ended
    // The broker shut down with the call in flight (this library never cancels its own calls).
    EXPECT_TRUE(retryAfter(grpc::StatusCode::CANCELLED, true));
    EXPECT_FALSE(retryAfter(grpc::StatusCode::CANCELLED, false));
    for (grpc::StatusCode c :
         {grpc::StatusCode::OK, grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::INVALID_ARGUMENT,
          grpc::StatusCode::NOT_FOUND, grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN,
          grpc::StatusCode::RESOURCE_EXHAUSTED}) {
        EXPECT_FALSE(retryAfter(c, true)) << c;
        EXPECT_FALSE(retryAfter(c, false)) << c;
    }
}

TEST(SessionRetry, AnOpenIsRetriedOnlyWhenTheBrokerWentAwayDuringIt) {
    // Hello: UNAVAILABLE or CANCELLED; attach: closed unanswered, or a token the broker lost.
    for (int rc : {-ENOTCONN, -ECANCELED, -ECONNRESET, -EPIPE, -ENOENT}) {
        EXPECT_TRUE(openRetryAfter(rc)) << rc;
    }
    // Answers: a version mismatch, a refused peer, a quota, a timeout (the deadline is spent).
    for (int rc : {-EPROTONOSUPPORT, -EPROTO, -EPERM, -ENOMEM, -ETIMEDOUT, -EBUSY}) {
        EXPECT_FALSE(openRetryAfter(rc)) << rc;
    }
}

TEST(SessionRetry, RetriesPauseNoneFirstThenTenMillisecondsDoublingToOneHundredSixty) {
    const int want[] = {0, 0, 10, 20, 40, 80, 160, 160, 160};
    for (int n = 1; n <= 8; ++n) {
        EXPECT_EQ(retryPause(n).count(), want[n]) << n;
    }
}

TEST(SessionRetry, KeysAreSixteenLowerCaseHexDigitsNewPerCall) {
    std::set<std::string> seen;
    for (int i = 0; i < 1000; ++i) {
        std::string k = newIdempotencyKey();
        ASSERT_EQ(k.size(), 16u) << k;
        EXPECT_EQ(k.find_first_not_of("0123456789abcdef"), std::string::npos) << k;
        EXPECT_NE(k, "0000000000000000");
        seen.insert(k);
    }
    EXPECT_EQ(seen.size(), 1000u);
}

// The pid and the keys are kept in memory (no system call per call): a forked child must see its
// own pid, and must not draw the keys its parent is about to use.
TEST(SessionRetry, AForkedChildHasItsOwnPidAndKeys) {
    const pid_t parent = processId();
    EXPECT_EQ(parent, ::getpid());
    (void)newIdempotencyKey();  // the parent's batch of keys, inherited by the child below
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        const bool own_pid = processId() == ::getpid() && processId() != parent;
        const std::string key = newIdempotencyKey();
        _exit(own_pid && ::write(fds[1], key.data(), key.size()) == static_cast<ssize_t>(key.size()) ? 0 : 1);
    }
    ::close(fds[1]);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child's processId() was not its own pid";
    char child_key[16];
    ASSERT_EQ(::read(fds[0], child_key, sizeof(child_key)), static_cast<ssize_t>(sizeof(child_key)));
    ::close(fds[0]);
    EXPECT_NE(std::string(child_key, sizeof(child_key)), newIdempotencyKey())
        << "the child drew the key its parent drew next";
    EXPECT_EQ(processId(), parent);
}

// Which calls carry a key, checked when this test compiles: every method's request type answers
// kReadOnlyCall as its rpc's idempotency_level says (the table's rows against the template the
// client's calls read), and a few by name, as they always were.
#define IBVX_CHECK_READ_ONLY(name, request, response, mutating) \
    static_assert(kReadOnlyCall<pb::request> == !(mutating), #name);
IBVX_BROKER_METHODS(IBVX_CHECK_READ_ONLY)
#undef IBVX_CHECK_READ_ONLY
static_assert(kReadOnlyCall<pb::ListDevicesRequest>);
static_assert(kReadOnlyCall<pb::QueryQpRequest>);
static_assert(!kReadOnlyCall<pb::CreateQpRequest>);
static_assert(!kReadOnlyCall<pb::McastRequest>);  // AttachMcast and DetachMcast
static_assert(!kReadOnlyCall<pb::OpenQpRequest>);

}  // namespace
}  // namespace ibvx::client::broker
