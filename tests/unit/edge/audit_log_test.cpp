// The audit trail's log side (daemon/edge/audit_log.h): every event counted, lines within a
// per-session budget, the suppressed ones reported by the session's next line and at its end.
#include "daemon/edge/audit_log.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <memory>
#include <sstream>
#include <string>

#include "daemon/core/session.h"

namespace ibvx::daemon {
namespace {

size_t count(const std::string &text, const std::string &what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) {
        ++n;
    }
    return n;
}

class AuditLogTest : public ::testing::Test {
  protected:
    void SetUp() override {
        previous_ = spdlog::default_logger();
        auto logger = std::make_shared<spdlog::logger>(
            "audit-test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out_));
        logger->set_pattern("%v");
        logger->set_level(spdlog::level::info);
        spdlog::set_default_logger(logger);
    }
    void TearDown() override { spdlog::set_default_logger(previous_); }

    Session session(uint64_t id) {
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        return Session(id, SessionToken{}, peer, "unit", UniqueFd());
    }

    std::ostringstream out_;
    std::shared_ptr<spdlog::logger> previous_;
    std::chrono::steady_clock::time_point now_{std::chrono::seconds(100)};
    AuditLog audit_{[this] { return now_; }};
};

TEST_F(AuditLogTest, EveryEventIsCountedAndASessionsLinesStayWithinItsBudget) {
    Session a = session(1), b = session(2);
    const uint32_t budget = AuditLog::kLinesPerSessionPerSecond;
    for (uint32_t i = 0; i < budget + 5; ++i) {
        audit_.object(a, AuditLog::Action::kCreate, ObjectKind::kQp, 0x10 + i);
    }
    audit_.object(b, AuditLog::Action::kDestroy, ObjectKind::kCq, 0x99);
    AuditLog::Counters c = audit_.counters();
    EXPECT_EQ(c.creates, budget + 5);
    EXPECT_EQ(c.destroys, 1u);
    EXPECT_EQ(c.lines, budget + 1) << "another session has a budget of its own";
    EXPECT_EQ(c.lines_suppressed, 5u);
    EXPECT_EQ(count(out_.str(), "audit: create qp"), budget);
    EXPECT_EQ(count(out_.str(), "audit: destroy cq 0000000000000099 session 2"), 1u);

    now_ += std::chrono::seconds(1);  // the budget refills: the next line reports the 5
    audit_.object(a, AuditLog::Action::kDestroy, ObjectKind::kQp, 0x10);
    EXPECT_NE(out_.str().find("audit: destroy qp 0000000000000010 session 1"), std::string::npos);
    EXPECT_NE(out_.str().find("(5 earlier event(s) of this session"), std::string::npos) << out_.str();

    for (uint32_t i = 0; i < budget + 2; ++i) {
        audit_.object(a, AuditLog::Action::kDestroy, ObjectKind::kQp, 0x20 + i);
    }
    EXPECT_EQ(audit_.sessionEnded(1), 3u) << "the end reports those since the last line";
    EXPECT_EQ(audit_.sessionEnded(1), 0u);
    c = audit_.counters();
    EXPECT_EQ(c.creates + c.destroys, c.lines + c.lines_suppressed) << "every event: a line or counted";
}

TEST_F(AuditLogTest, BelowInfoNothingIsFormattedButEveryEventIsCounted) {
    spdlog::default_logger()->set_level(spdlog::level::warn);
    Session a = session(1);
    for (uint32_t i = 0; i < 2 * AuditLog::kLinesPerSessionPerSecond; ++i) {
        audit_.object(a, AuditLog::Action::kCreate, ObjectKind::kPd, i + 1);
    }
    AuditLog::Counters c = audit_.counters();
    EXPECT_EQ(c.creates, 2 * AuditLog::kLinesPerSessionPerSecond);
    EXPECT_EQ(c.lines, 0u);
    EXPECT_EQ(c.lines_suppressed, 0u);
    EXPECT_TRUE(out_.str().empty()) << out_.str();
}

}  // namespace
}  // namespace ibvx::daemon
