// The broker's memory windows over the real softnda driver (SPEC.md §16): windows of a PD, owned
// by a session, counted in the "mws" quota, keeping their PD busy, destroyed before their PD (and
// any MR) at the session's end; bad requests refused with nothing left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

class DestroyLog : public BrokerEvents {
  public:
    void objectCreated(const Session &, ObjectKind, uint64_t) override {}
    void objectDestroyed(const Session &, ObjectKind kind, uint64_t) override {
        log.push_back(kindName(kind));
    }
    void quotaDenied(const PeerIdentity &, uint64_t, const std::string &) override {}
    std::vector<std::string> log;
};

class BrokerMwTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        broker_ = std::make_unique<Broker>(Broker::Options{}, devices_);
        broker_->setRegionSender([](Session &, std::vector<RegionToSend> &) { return Status::ok(); });
        broker_->setEvents(&events_);
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        auto s = broker_->hello(peer, {4, 2, 0}, "unit");
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        session_ = *s;
        auto ctx = broker_->openContext(*session_, "softnda0");
        ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
        ctx_ = ctx->context;
        auto pd = broker_->allocPd(*session_, ctx_);
        ASSERT_TRUE(pd.isOk()) << pd.status().toString();
        pd_ = *pd;
    }
    void TearDown() override { broker_.reset(); }

    uint64_t held(Quota q) {
        return broker_->quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(q)];
    }

    std::unique_ptr<Broker> broker_;
    DestroyLog events_;
    std::shared_ptr<Session> session_;
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

}  // namespace
}  // namespace ibvx::daemon
