// The broker's device memory over the real softnda driver (SPEC.md §17): an allocation is a
// session object whose bytes are in the session's own memory (sent as a region), charged to
// "dm_bytes"; an MR on it makes its free answer EBUSY; the device's memory comes back when a
// session ends; bad requests are refused with nothing left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "tests/unit/daemon/softnda_broker.h"

namespace ibvx::daemon {
namespace {

constexpr unsigned kDmAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

class BrokerDmTest : public SoftndaBrokerTest {
  protected:
    uint64_t context(Session &s) {
        auto ctx = broker_->openContext(s, "softnda0");
        EXPECT_TRUE(ctx.isOk()) << ctx.status().toString();
        return ctx->context;
    }

    StatusOr<DmResult> alloc(Session &s, uint64_t ctx, uint64_t length) {
        return broker_->allocDm(s, AllocDmArgs{ctx, length, 0, 0});
    }
};

TEST_F(BrokerDmTest, AnAllocationIsASessionObjectWithItsBytesInASentRegion) {
    const uint64_t ctx = context(*session_);
    auto size = broker_->maxDmSize(*session_, ctx);
    ASSERT_TRUE(size.isOk());
    EXPECT_EQ(*size, 256u * 1024);
    auto dm = alloc(*session_, ctx, 1000);
    ASSERT_TRUE(dm.isOk()) << dm.status().toString();
    EXPECT_NE(dm->dm, 0u);
    EXPECT_NE(dm->memory.region, 0u);
    EXPECT_EQ(dm->memory.length, 1024u);  // 64-byte units
    EXPECT_NE(std::find(sent_.begin(), sent_.end(), dm->memory.region), sent_.end());
    EXPECT_EQ(held(Quota::kDmBytes), 1000u);

    auto pd = broker_->allocPd(*session_, ctx);
    ASSERT_TRUE(pd.isOk());
    auto mr = broker_->regDmMr(*session_, RegDmMrArgs{*pd, dm->dm, 0, 1000, kDmAccess});
    ASSERT_TRUE(mr.isOk()) << mr.status().toString();
    EXPECT_EQ(mr->iova, 0u);
    EXPECT_NE(mr->rkey, 0u);
    const uint64_t mrs = held(Quota::kMrs);
    EXPECT_EQ(held(Quota::kMrBytes), 0u);  // the bytes are the DM's

    auto busy = broker_->freeDm(*session_, dm->dm);
    EXPECT_EQ(busy.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(busy.status().errnoValue(), EBUSY);
    ASSERT_TRUE(broker_->deregMr(*session_, mr->mr).isOk());
    EXPECT_EQ(held(Quota::kMrs), mrs - 1);
    ASSERT_TRUE(broker_->freeDm(*session_, dm->dm).isOk());
    EXPECT_EQ(held(Quota::kDmBytes), 0u);
    broker_->endSession(session_);
}

TEST_F(BrokerDmTest, TheDeviceFillsUpAndASessionsEndGivesItsMemoryBack) {
    const uint64_t ctx = context(*session_);
    auto all = alloc(*session_, ctx, 256 * 1024);
    ASSERT_TRUE(all.isOk()) << all.status().toString();
    auto other = newSession();
    const uint64_t other_ctx = context(*other);
    auto full = alloc(*other, other_ctx, 64);
    EXPECT_EQ(full.status().errnoValue(), ENOMEM);
    EXPECT_EQ(full.status().code(), Code::kResourceExhausted);
    // The other session cannot name the first one's DM.
    auto pd = broker_->allocPd(*other, other_ctx);
    ASSERT_TRUE(pd.isOk());
    EXPECT_EQ(broker_->regDmMr(*other, RegDmMrArgs{*pd, all->dm, 0, 64, kDmAccess}).status().code(),
              Code::kNotFound);
    EXPECT_EQ(broker_->freeDm(*other, all->dm).status().code(), Code::kNotFound);
    // A crash ends the session the same way: everything it held goes.
    broker_->endSession(session_);
    EXPECT_TRUE(alloc(*other, other_ctx, 256 * 1024).isOk());
    broker_->endSession(other);
    EXPECT_EQ(held(Quota::kDmBytes), 0u);
}

TEST_F(BrokerDmTest, TheQuotaAndBadRequestsAreRefusedWithNothingLeft) {
    const uint64_t ctx = context(*session_);
    broker_->quotas().setOverride(QuotaScope::kUid, getuid(), "", Quota::kDmBytes, 4096);
    EXPECT_EQ(alloc(*session_, ctx, 8192).status().code(), Code::kResourceExhausted);
    auto dm = alloc(*session_, ctx, 4096);
    ASSERT_TRUE(dm.isOk()) << dm.status().toString();
    EXPECT_EQ(alloc(*session_, ctx, 64).status().code(), Code::kResourceExhausted);
    broker_->quotas().setOverride(QuotaScope::kUid, getuid(), "", Quota::kDmBytes, std::nullopt);

    EXPECT_EQ(alloc(*session_, ctx, 0).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(alloc(*session_, ctx, 256 * 1024 + 1).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(broker_->allocDm(*session_, AllocDmArgs{ctx, 64, 13, 0}).status().code(),
              Code::kInvalidArgument);
    auto pd = broker_->allocPd(*session_, ctx);
    ASSERT_TRUE(pd.isOk());
    const size_t objects = broker_->objectCount();
    // Not zero-based, past the allocation.
    EXPECT_EQ(
        broker_->regDmMr(*session_, RegDmMrArgs{*pd, dm->dm, 0, 64, IBV_ACCESS_LOCAL_WRITE}).status().code(),
        Code::kInvalidArgument);
    EXPECT_EQ(broker_->regDmMr(*session_, RegDmMrArgs{*pd, dm->dm, 4000, 200, kDmAccess}).status().code(),
              Code::kInvalidArgument);
    EXPECT_EQ(broker_->objectCount(), objects);
    EXPECT_TRUE(broker_->freeDm(*session_, dm->dm).isOk());
    broker_->endSession(session_);
}

}  // namespace
}  // namespace ibvx::daemon
