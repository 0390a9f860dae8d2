// libibv_extend.so across a lost gRPC connection with the session kept (a broker restart, as
// the tenant sees it), against ibvx-restarting-broker: a control call the broker applied but
// never answered is retried on a new connection with the same idempotency key and answered from
// the stored reply; the session goes on; an ended session (fd channel at EOF) is not retried.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "tests/integration/client/broker_support.h"

namespace {

using ibvx::test::BrokerProcess;

struct LoggedCall {
    std::string method, key, what;
};

class RestartRetryTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = ibvx::test::makeTempDir();
        socket_ = dir_ + "/b.sock";
        log_ = dir_ + "/calls.log";
        ibvx::test::useBrokerAt(socket_, 10000);  // the retry's bound; no test waits for it
        setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    }
    static void TearDownTestSuite() {
        unlink(socket_.c_str());
        unlink(log_.c_str());
        rmdir(dir_.c_str());
    }
    // A fresh broker per test (its first AllocPd loses the connection); the library opens a new
    // session on it once the previous one ended.
    void SetUp() override {
        ASSERT_TRUE(
            broker_.start({ibvx::test::selfDir() + "/ibvx-restarting-broker", "{socket}", log_}, socket_));
        ctx_ = ibvx_open_device("fake0");
        ASSERT_NE(ctx_, nullptr) << strerror(errno);
    }
    void TearDown() override {
        broker_.stop(SIGKILL);
        if (ctx_ != nullptr) {
            ibvx_close_device(ctx_);  // -ECONNRESET: freed locally
        }
    }

    static std::vector<LoggedCall> calls() {
        std::ifstream in(log_);
        std::vector<LoggedCall> out;
        LoggedCall c;
        while (in >> c.method >> c.key >> c.what) {
            out.push_back(c);
        }
        return out;
    }
    static bool isKey(const std::string &k) {
        return k.size() == 16 && k.find_first_not_of("0123456789abcdef") == std::string::npos &&
               k != "0000000000000000";
    }
    static size_t count(const std::string &text, const std::string &what) {
        size_t n = 0;
        for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) {
            ++n;
        }
        return n;
    }

    static inline std::string dir_, socket_, log_;
    BrokerProcess broker_;
    ibv_context_extend *ctx_ = nullptr;
};

TEST_F(RestartRetryTest, ACallAppliedButNeverAnsweredIsRetriedWithItsKeyAndAnsweredOnce) {
    // The broker applies this AllocPd, stores its reply, then loses every gRPC connection.
    testing::internal::CaptureStderr();
    ibv_pd *pd = ibvx_alloc_pd(ctx_);
    std::string warnings = testing::internal::GetCapturedStderr();
    ASSERT_NE(pd, nullptr) << strerror(errno) << "\n" << warnings;

    std::vector<LoggedCall> log = calls();
    ASSERT_EQ(log.size(), 3u);
    EXPECT_EQ(log[0].method, "OpenContext");
    EXPECT_TRUE(isKey(log[0].key)) << log[0].key;
    EXPECT_EQ(log[1].method, "AllocPd");
    EXPECT_EQ(log[1].what, "applied");
    EXPECT_TRUE(isKey(log[1].key)) << log[1].key;
    EXPECT_NE(log[1].key, log[0].key);  // a new key per call
    EXPECT_EQ(log[2].method, "AllocPd");
    EXPECT_EQ(log[2].key, log[1].key);   // the same key on the retry...
    EXPECT_EQ(log[2].what, "replayed");  // ...so it was answered, not applied again
    EXPECT_EQ(count(warnings, "the broker restarted"), 1u) << warnings;
    EXPECT_NE(warnings.find("AllocPd"), std::string::npos) << warnings;

    // The session goes on over the new connection, and calls that need no retry warn nothing.
    testing::internal::CaptureStderr();
    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
    ibv_pd *pd2 = ibvx_alloc_pd(ctx_);
    EXPECT_NE(pd2, nullptr) << strerror(errno);
    if (pd2 != nullptr) {
        EXPECT_EQ(ibvx_dealloc_pd(pd2), 0);
    }
    warnings = testing::internal::GetCapturedStderr();
    EXPECT_EQ(count(warnings, "the broker restarted"), 0u) << warnings;
    log = calls();
    ASSERT_EQ(log.size(), 6u);
    EXPECT_EQ(log[3].method, "DeallocPd");
    EXPECT_EQ(log[4].method, "AllocPd");
    EXPECT_EQ(log[4].what, "applied");
    for (size_t i = 3; i < log.size(); ++i) {
        EXPECT_TRUE(isKey(log[i].key)) << log[i].key;
        EXPECT_NE(log[i].key, log[1].key);
    }
}

TEST_F(RestartRetryTest, AnEndedSessionAnswersEconnresetWithoutARetry) {
    broker_.stop(SIGKILL);  // the fd channel reaches EOF: the session really ended
    testing::internal::CaptureStderr();
    errno = 0;
    EXPECT_EQ(ibvx_alloc_pd(ctx_), nullptr);
    int err = errno;
    std::string warnings = testing::internal::GetCapturedStderr();
    EXPECT_EQ(err, ECONNRESET) << strerror(err);
    EXPECT_EQ(count(warnings, "the broker restarted"), 0u) << warnings;
    EXPECT_EQ(ibvx_close_device(ctx_), -ECONNRESET);
    ctx_ = nullptr;
}

// A broker that dies in the middle of a session's open (it accepted the fd channel and said
// Hello, but never committed the session): the library opens the session again from the start,
// as it retries a call, and the tenant sees a device that works.
class OpenRetryTest : public RestartRetryTest {
  protected:
    void SetUp() override {
        ASSERT_TRUE(broker_.start(
            {ibvx::test::selfDir() + "/ibvx-restarting-broker", "{socket}", log_, "crash-in-first-open"},
            socket_));
    }
};

TEST_F(OpenRetryTest, AnOpenARestartCutsShortIsOpenedAgainAndTheSessionWorks) {
    testing::internal::CaptureStderr();
    ctx_ = ibvx_open_device("fake0");
    std::string warnings = testing::internal::GetCapturedStderr();
    ASSERT_NE(ctx_, nullptr) << strerror(errno) << "\n" << warnings;
    EXPECT_EQ(count(warnings, "opening a session: the broker restarted"), 1u) << warnings;
    std::vector<LoggedCall> log = calls();
    ASSERT_GE(log.size(), 2u);
    EXPECT_EQ(log[0].method, "Attach");
    EXPECT_EQ(log[0].what, "dropped");
    EXPECT_EQ(log[1].method, "OpenContext");  // on the session the second open made
    EXPECT_EQ(log[1].what, "applied");
    ibv_pd *pd = ibvx_alloc_pd(ctx_);
    ASSERT_NE(pd, nullptr) << strerror(errno);
    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
}

}  // namespace
