// query_device capability rules, extended QP attribute plans and Hyper RoCE answers.
#include "providers/mlx5/features.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>

namespace ibvx::mlx5 {
namespace {

TEST(Mlx5Features, DmabufProbeMeansSupportOnlyWhenTheKernelLookedAtTheFd) {
    EXPECT_TRUE(dmabufRegistrationSupported(EBADF));
    EXPECT_FALSE(dmabufRegistrationSupported(EOPNOTSUPP));       // provider or driver lacks it
    EXPECT_FALSE(dmabufRegistrationSupported(EPROTONOSUPPORT));  // kernel without the method
    EXPECT_FALSE(dmabufRegistrationSupported(ENOSYS));
    EXPECT_FALSE(dmabufRegistrationSupported(EINVAL));
    EXPECT_FALSE(dmabufRegistrationSupported(0));
}

TEST(Mlx5Features, ExtCapBits) {
    EXPECT_EQ(extCapFor({EBADF, true, true}), uint32_t{IBV_EXTEND_DEV_NDR | IBV_EXTEND_DEV_NDA});
    EXPECT_EQ(extCapFor({EOPNOTSUPP, true, true}), uint32_t{IBV_EXTEND_DEV_NDA});
    EXPECT_EQ(extCapFor({EBADF, false, true}), uint32_t{IBV_EXTEND_DEV_NDR});  // no allocators: no NDA
    EXPECT_EQ(extCapFor({EBADF, true, false}), uint32_t{IBV_EXTEND_DEV_NDR});  // no mlx5dv: no UAR
    EXPECT_EQ(extCapFor({EOPNOTSUPP, false, false}), 0u);
}

TEST(Mlx5Features, RoceV2IsTheOnlyFeature) {
    ibv_hyroce_feature f;
    std::memset(&f, 0xff, sizeof(f));
    roceV2Feature(&f);
    EXPECT_EQ(f.type, IBV_HYPER_FEAT_RoCEv2);
    EXPECT_EQ(f.version, IBV_HYPER_FEAT_V0);
    EXPECT_EQ(f.sack_enable, 0);
    for (uint8_t b : f.resv) {
        EXPECT_EQ(b, 0);
    }
    EXPECT_TRUE(isRoceV2Feature(f));
    f.sack_enable = 1;
    EXPECT_FALSE(isRoceV2Feature(f));
    f.sack_enable = 0;
    f.version = IBV_HYPER_FEAT_V1;
    EXPECT_FALSE(isRoceV2Feature(f));
    f.version = IBV_HYPER_FEAT_V0;
    f.type = IBV_HYPER_FEAT_HYPER_ROCE;
    EXPECT_FALSE(isRoceV2Feature(f));
}

ibv_qp_attr_extend attrWithPort(uint32_t port) {
    ibv_qp_attr_extend a{};
    a.udp_src_port = port;
    roceV2Feature(&a.feature);
    return a;
}

TEST(Mlx5Features, ModifySetsTheUdpSourcePort) {
    ModifyPlan plan{};
    ibv_qp_attr_extend a = attrWithPort(49152);
    ASSERT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT, &plan), 0);
    EXPECT_TRUE(plan.set_udp_sport);
    EXPECT_EQ(plan.udp_sport, 49152);

    a.udp_src_port = 65536;
    EXPECT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT, &plan), -EINVAL);
    EXPECT_FALSE(plan.set_udp_sport);
}

TEST(Mlx5Features, ModifyAcceptsRoceV2FeatureAsANoOp) {
    // What the real consumer sends after negotiation: the port plus the negotiated feature.
    ModifyPlan plan{};
    ibv_qp_attr_extend a = attrWithPort(50000);
    ASSERT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE, &plan), 0);
    EXPECT_TRUE(plan.set_udp_sport);
    ASSERT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_HYROCE_FEATURE, &plan), 0);
    EXPECT_FALSE(plan.set_udp_sport);
    ASSERT_EQ(planModify(a, 0, &plan), 0);
}

TEST(Mlx5Features, ModifyRefusesEverythingElseAndAppliesNothing) {
    ModifyPlan plan{};
    ibv_qp_attr_extend a = attrWithPort(50000);
    a.feature.type = IBV_HYPER_FEAT_HYPER_ROCE;
    a.feature.version = IBV_HYPER_FEAT_V2;
    EXPECT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE, &plan),
              -EOPNOTSUPP);
    EXPECT_EQ(plan.unsupported, uint32_t{IBV_QP_ATTR_EXTEND_HYROCE_FEATURE});
    EXPECT_FALSE(plan.set_udp_sport);  // all or nothing

    a = attrWithPort(50000);
    for (int bit : {IBV_QP_ATTR_EXTEND_LB_MODE, IBV_QP_ATTR_EXTEND_MPATH_CONFIG, IBV_QP_ATTR_EXTEND_AR_CONFIG,
                    IBV_QP_ATTR_EXTEND_SACK_CONFIG, IBV_QP_ATTR_EXTEND_LAG_PORT}) {
        EXPECT_EQ(planModify(a, bit | IBV_QP_ATTR_EXTEND_UDP_SRC_PORT, &plan), -EOPNOTSUPP) << bit;
        EXPECT_EQ(plan.unsupported, uint32_t(bit));
        EXPECT_FALSE(plan.set_udp_sport);
    }
    EXPECT_EQ(planModify(a, IBV_QP_ATTR_EXTEND_MAX, &plan), -EINVAL);
    EXPECT_EQ(planModify(a, -1, &plan), -EINVAL);
}

TEST(Mlx5Features, QueryAnswersKnownPortAndRoceV2) {
    uint32_t unsupported = 0;
    EXPECT_EQ(
        planQuery(IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE, true, &unsupported),
        0);
    EXPECT_EQ(planQuery(IBV_QP_ATTR_EXTEND_HYROCE_FEATURE, false, &unsupported), 0);
    EXPECT_EQ(planQuery(IBV_QP_ATTR_EXTEND_UDP_SRC_PORT, false, &unsupported), -EOPNOTSUPP);
    EXPECT_EQ(unsupported, uint32_t{IBV_QP_ATTR_EXTEND_UDP_SRC_PORT});
    EXPECT_EQ(planQuery(IBV_QP_ATTR_EXTEND_LAG_PORT, true, &unsupported), -EOPNOTSUPP);
    EXPECT_EQ(unsupported, uint32_t{IBV_QP_ATTR_EXTEND_LAG_PORT});
    EXPECT_EQ(planQuery(IBV_QP_ATTR_EXTEND_MAX << 1, true, &unsupported), -EINVAL);
}

}  // namespace
}  // namespace ibvx::mlx5
