// The broker's memory windows over the real softnda driver (SPEC.md §16): windows of a PD, owned
// by a session, counted in the "mws" quota, keeping their PD busy, destroyed before their PD (and
// any MR) at the session's end; bad requests refused with nothing left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
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

// A window has restart state (softnda SPEC.md §16): its own blob, and its binding in its
// context's window file, which the context exports as one more fd once it has a window. The
// window names its context, so a commit after alloc_mw exports the context again.
TEST_F(BrokerMwTest, AWindowIsExportedAndItsContextCarriesTheWindowFile) {
    ObjectImport ctx_before = exportedForRestore(*broker_, *session_, ctx_);
    auto w = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_2);
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    {
        auto held = session_->hold();
        const Object *mw = session_->object(w->handle);
        ASSERT_NE(mw, nullptr);
        std::vector<uint64_t> uses;
        for (const Object *u : mw->uses) {
            uses.push_back(u->handle);
        }
        EXPECT_EQ(uses, (std::vector<uint64_t>{pd_, ctx_}));
    }
    ObjectImport mw_in = exportedForRestore(*broker_, *session_, w->handle);
    EXPECT_FALSE(mw_in.driver_state.empty());
    EXPECT_TRUE(mw_in.driver_fds.empty());
    ObjectImport ctx_after = exportedForRestore(*broker_, *session_, ctx_);
    ASSERT_EQ(ctx_after.driver_fds.size(), ctx_before.driver_fds.size() + 1);
    struct stat st {};
    ASSERT_EQ(::fstat(ctx_after.driver_fds.back().get(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_GT(st.st_size, 0);
}

// A restart plan keeps a session that holds windows, so `ibv-extendctl restart --require-keep`
// goes ahead.
TEST_F(BrokerMwTest, ARestartPlanKeepsASessionThatHoldsAWindow) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    UniqueFd channel(sv[0]), peer_end(sv[1]);
    std::shared_ptr<Session> attached;
    ASSERT_EQ(broker_->attach(session_->token(), {getpid(), getuid(), getgid()}, channel, &attached), 0);
    RestartState restart(*broker_, FdStoreHooks{});
    auto w = broker_->allocMw(*session_, pd_, IBV_MW_TYPE_1);
    ASSERT_TRUE(w.isOk()) << w.status().toString();
    RestartState::Plan with_window = restart.plan();
    EXPECT_EQ(with_window.kept, 1u);
    EXPECT_EQ(with_window.dropped, 0u);
    EXPECT_TRUE(with_window.dropping_drivers.empty());
}

}  // namespace
}  // namespace ibvx::daemon
