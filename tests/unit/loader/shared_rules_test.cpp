// The decisions direct mode and the broker share: opening an extension context
// (extend_open.h), the queue-create rules (create_rules.h) and whether an extend op may reach
// the driver (common/driver_ops.h).
#include <gtest/gtest.h>

#include <cerrno>
#include <climits>

#include "common/driver_ops.h"
#include "providers/loader/create_rules.h"
#include "providers/loader/extend_open.h"

namespace ibvx::loader {
namespace {

struct Driver {
    int version = IBV_EXTEND_DRIVER_VERSION_V3;
    bool null_ops = false;
    bool fail = false;
    int allocs = 0, frees = 0;
};
Driver drv;
ibv_context_extend_ops ops_table{};
ibv_context_extend ext_context{};

ibv_context_extend *allocContext(ibv_context *ctx) {
    drv.allocs++;
    if (drv.fail) {
        errno = ENOMEM;
        return nullptr;
    }
    ops_table.version = drv.version;
    ext_context = {ctx, drv.null_ops ? nullptr : &ops_table};
    return &ext_context;
}
void freeContext(ibv_context_extend *) {
    drv.frees++;
}
const verbs_device_extend_ops kDriver = {"rules", allocContext, freeContext};
const verbs_device_extend_ops kNoAlloc = {"noalloc", nullptr, freeContext};

class ExtendOpenTest : public ::testing::Test {
  protected:
    void SetUp() override { drv = Driver{}; }
    ibv_context ctx_{};
};

TEST_F(ExtendOpenTest, AcceptsKnownVersions) {
    for (int v : {1, 2, 3}) {
        drv.version = v;
        ExtendOpen r = openExtendContext(&kDriver, &ctx_);
        EXPECT_EQ(r.refusal, ExtendRefusal::kNone) << v;
        EXPECT_EQ(r.ext, &ext_context);
    }
    EXPECT_EQ(drv.frees, 0);
}

TEST_F(ExtendOpenTest, RefusesUnknownVersionsAndFreesThem) {
    for (int v : {0, -1, 4, INT_MAX}) {
        drv.version = v;
        ExtendOpen r = openExtendContext(&kDriver, &ctx_);
        EXPECT_EQ(r.refusal, ExtendRefusal::kBadVersion) << v;
        EXPECT_EQ(r.version, v);
        EXPECT_EQ(r.ext, nullptr);
    }
    EXPECT_EQ(drv.frees, 4);
    drv.null_ops = true;
    EXPECT_EQ(openExtendContext(&kDriver, &ctx_).refusal, ExtendRefusal::kBadVersion);
    EXPECT_EQ(drv.frees, 5);
}

TEST_F(ExtendOpenTest, NoDriverAndDriverFailure) {
    EXPECT_EQ(openExtendContext(nullptr, &ctx_).refusal, ExtendRefusal::kNoDriver);
    EXPECT_EQ(openExtendContext(&kNoAlloc, &ctx_).refusal, ExtendRefusal::kNoDriver);
    drv.fail = true;
    ExtendOpen r = openExtendContext(&kDriver, &ctx_);
    EXPECT_EQ(r.refusal, ExtendRefusal::kDriverFailed);
    EXPECT_EQ(r.err, ENOMEM);
    EXPECT_EQ(drv.frees, 0);
}

TEST(CreateRules, RequestChecks) {
    EXPECT_FALSE(checkDmaMode(QU_BUF_DMA_MODE_DEFAULT));
    EXPECT_FALSE(checkDmaMode(QU_BUF_DMA_MODE_INDEP_UB));
    EXPECT_EQ(checkDmaMode(7).value_or(""), "invalid dma_mode");
    EXPECT_EQ(checkDmaMode(-1).value_or(""), "invalid dma_mode");
    ibv_cq_init_attr_extend attr{};
    const int seven = 7;
    std::memcpy(&attr.type, &seven, sizeof(seven));
    EXPECT_EQ(rawEnumValue(attr.type), 7);
    EXPECT_EQ(checkCqRequest(0).value_or(""), "cqe must be > 0");
    EXPECT_FALSE(checkCqRequest(1));
    EXPECT_EQ(checkSrqRequest(0).value_or(""), "max_wr must be > 0");
    EXPECT_FALSE(checkQpType(IBV_QPT_RC));
    EXPECT_FALSE(checkQpType(IBV_QPT_UD));
    EXPECT_FALSE(checkQpType(IBV_QPT_XRC_SEND));
    EXPECT_TRUE(checkQpType(IBV_QPT_XRC_RECV));
    EXPECT_TRUE(checkQpType(IBV_QPT_RAW_PACKET));
}

TEST(CreateRules, LimitsNameTheFieldAndZeroIsUnlimited) {
    QueueLimits l;
    l.max_qp_wr = 16;
    l.max_sge = 2;
    l.max_cqe = 64;
    ibv_qp_cap cap{};
    cap.max_send_wr = 16;
    cap.max_recv_wr = 17;
    EXPECT_EQ(checkQpLimits(cap, l).value_or(""), "max_recv_wr 17 exceeds the device's limit 16");
    cap.max_recv_wr = 1;
    cap.max_inline_data = 1u << 20;  // no inline limit announced
    EXPECT_FALSE(checkQpLimits(cap, l));
    EXPECT_EQ(checkCqLimits(65, l).value_or(""), "cqe 65 exceeds the device's limit 64");
    EXPECT_FALSE(checkSrqLimits(1u << 20, 2, l)) << "max_srq_wr 0: not announced";
    EXPECT_EQ(checkSrqLimits(1, 3, l).value_or(""), "max_sge 3 exceeds the device's limit 2");
}

TEST(DriverOps, AvailabilityNeedsTableVersionAndEntry) {
    ibv_context_extend_ops o{};
    o.version = IBV_EXTEND_DRIVER_VERSION_V1;
    o.modify_qp = [](ibv_context *, ibv_qp_attr_extend *, int) { return 0; };
    o.create_cq = [](ibv_context *, ibv_cq_init_attr_extend *) -> ibv_cq_extend * { return nullptr; };
    EXPECT_FALSE(driverOpAvailable(nullptr, DriverOp::kCreateCq));
    EXPECT_TRUE(driverOpAvailable(&o, DriverOp::kCreateCq));
    EXPECT_FALSE(driverOpAvailable(&o, DriverOp::kCreateQp)) << "entry not set";
    EXPECT_FALSE(driverOpAvailable(&o, DriverOp::kModifyQp)) << "a V2 entry of a V1 driver";
    o.version = IBV_EXTEND_DRIVER_VERSION_V2;
    EXPECT_TRUE(driverOpAvailable(&o, DriverOp::kModifyQp));
    o.nego_qp_hyroce_feature = [](ibv_context *, ibv_qp *, const ibv_hyroce_feature *, ibv_hyroce_feature *,
                                  uint32_t *) { return 0; };
    EXPECT_FALSE(driverOpAvailable(&o, DriverOp::kNegoHyroceFeature));
    o.version = IBV_EXTEND_DRIVER_VERSION_V3;
    EXPECT_TRUE(driverOpAvailable(&o, DriverOp::kNegoHyroceFeature));
    EXPECT_EQ(driverOpsPresent(&o), driverOpBit(DriverOp::kCreateCq) | driverOpBit(DriverOp::kModifyQp) |
                                        driverOpBit(DriverOp::kNegoHyroceFeature));
}

TEST(DriverOps, KnownExtendMask) {
    EXPECT_TRUE(knownExtendMask(0));
    EXPECT_TRUE(knownExtendMask(IBV_QP_ATTR_EXTEND_MAX - 1));
    EXPECT_FALSE(knownExtendMask(IBV_QP_ATTR_EXTEND_MAX));
    EXPECT_FALSE(knownExtendMask(-1));
    EXPECT_FALSE(knownExtendMask(INT_MIN));
}

}  // namespace
}  // namespace ibvx::loader
