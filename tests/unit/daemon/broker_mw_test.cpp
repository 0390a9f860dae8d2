// The broker's memory windows over the real softnda driver (SPEC.md §16): windows of a PD, owned
// by a session, counted in the "mws" quota, keeping their PD busy, destroyed before their PD (and
// any MR) at the session's end; bad requests refused with nothing left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "daemon/restart/restart_state.h"
#include "tests/unit/daemon/softnda_broker.h"

namespace ibvx::daemon {
namespace {

class BrokerMwTest : public SoftndaBrokerTest {
  protected:
    void SetUp() override {
        SoftndaBrokerTest::SetUp();
        ASSERT_NE(session_, nullptr);
        auto ctx = broker_->openContext(*session_, "softnda0");
        ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
        ctx_ = ctx->context;
        auto pd = broker_->allocPd(*session_, ctx_);
        ASSERT_TRUE(pd.isOk()) << pd.status().toString();
        pd_ = *pd;
    }
    uint64_t ctx_ = 0, pd_ = 0;
};

TEST_F(BrokerMwTest, WindowsOfAPdAreChargedAndKeepItBusy) {
    auto w1 = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_1);
    ASSERT_TRUE(w1.isOk()) << w1.status().toString();
    auto w2 = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_2);
    ASSERT_TRUE(w2.isOk()) << w2.status().toString();
    EXPECT_NE(w1->handle, w2->handle);
    EXPECT_NE(w1->rkey, w2->rkey);
    EXPECT_NE(w1->rkey & 0x80000000u, 0u);  // a window's rkey (SPEC.md §16)
    EXPECT_EQ(held(Quota::kMws), 2u);
    Status busy = broker_->deallocPd(*session_, pd_);
    EXPECT_EQ(busy.code(), Code::kFailedPrecondition) << busy.toString();
    ASSERT_TRUE(broker_->deallocMw(*session_, w1->handle).isOk());
    EXPECT_EQ(held(Quota::kMws), 1u);
    EXPECT_EQ(broker_->deallocMw(*session_, w1->handle).code(), Code::kNotFound) << "deallocated already";
    ASSERT_TRUE(broker_->deallocMw(*session_, w2->handle).isOk());
    EXPECT_TRUE(broker_->deallocPd(*session_, pd_).isOk());
    EXPECT_EQ(held(Quota::kMws), 0u);
}

TEST_F(BrokerMwTest, BadRequestsLeaveNothing) {
    auto bad_type = broker_->allocMw(*session_, pd_, static_cast<ibv_mw_type>(3));
    EXPECT_EQ(bad_type.status().code(), Code::kInvalidArgument) << bad_type.status().toString();
    auto no_pd = broker_->allocMw(*session_, pd_ + 1000, IBV_MW_TYPE_2);
    EXPECT_EQ(no_pd.status().code(), Code::kNotFound) << no_pd.status().toString();
    auto not_a_pd = broker_->allocMw(*session_, ctx_, IBV_MW_TYPE_2);
    EXPECT_FALSE(not_a_pd.isOk());
    EXPECT_EQ(held(Quota::kMws), 0u);
}

TEST_F(BrokerMwTest, TheSessionsEndFreesWindowsBeforeTheirPd) {
    auto w = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_2);
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    broker_->endSession(session_);
    const std::vector<std::string> order = {"mw", "pd", "context"};
    EXPECT_EQ(events_.log, order);
    EXPECT_EQ(held(Quota::kMws), 0u);
}

// A restart does not carry windows (docs/restart.md): the driver exports no state for one, so a
// restore cannot adopt it (and ends the session that held it), while the PD it hung on is kept.
TEST_F(BrokerMwTest, AWindowHasNoRestartStateAndIsNotAdopted) {
    auto w = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_2);
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    Status st;
    ObjectImport ctx_in = exportedForRestore(*broker_, *session_, ctx_, &st);
    ASSERT_TRUE(st.isOk()) << st.toString();
    ObjectImport pd_in = exportedForRestore(*broker_, *session_, pd_, &st);
    ASSERT_TRUE(st.isOk()) << st.toString();
    ObjectImport mw_in = exportedForRestore(*broker_, *session_, w->handle, &st);
    EXPECT_EQ(st.errnoValue(), EOPNOTSUPP) << st.toString();
    EXPECT_TRUE(mw_in.driver_state.empty());
    PeerIdentity peer;
    peer.creds = {getpid(), getuid(), getgid()};
    auto restored = broker_->hello(peer, {4, 2, 0}, "unit");
    ASSERT_TRUE(restored.isOk());
    Relocations relocations;
    Device *dev = devices_->find("softnda0");
    ASSERT_EQ(dev->verbs.setPaused(true), 0);
    EXPECT_TRUE(broker_->adopt(**restored, std::move(ctx_in), relocations).isOk());
    EXPECT_TRUE(broker_->adopt(**restored, std::move(pd_in), relocations).isOk());
    EXPECT_FALSE(broker_->adopt(**restored, std::move(mw_in), relocations).isOk());
    ASSERT_EQ(dev->verbs.setPaused(false), 0);
    EXPECT_EQ(held(Quota::kMws), 1u) << "the original's only";
    broker_->endSession(*restored);
}

// A restart plan counts a session that holds a window as dropped (a restore cannot bring the
// window back), so `ibv-extendctl restart --require-keep` refuses instead of ending it; once the
// window is gone the session is kept again.
TEST_F(BrokerMwTest, ARestartPlanDropsASessionThatHoldsAWindow) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd channel(sv[0]), peer_end(sv[1]);
    std::shared_ptr<Session> attached;
    ASSERT_EQ(broker_->attach(session_->token(), {getpid(), getuid(), getgid()}, channel, &attached), 0);
    RestartState restart(*broker_, FdStoreHooks{});
    RestartState::Plan before = restart.plan();
    EXPECT_EQ(before.kept, 1u);
    EXPECT_EQ(before.dropped, 0u);
    auto w = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_1);
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    RestartState::Plan with_window = restart.plan();
    EXPECT_EQ(with_window.kept, 0u);
    EXPECT_EQ(with_window.dropped, 1u);
    ASSERT_EQ(with_window.dropping_drivers.size(), 1u);
    EXPECT_EQ(with_window.dropping_drivers[0], "softnda (memory windows)");
    ASSERT_TRUE(broker_->deallocMw(*session_, w->handle).isOk());
    EXPECT_EQ(restart.plan().kept, 1u);
}

}  // namespace
}  // namespace ibvx::daemon
