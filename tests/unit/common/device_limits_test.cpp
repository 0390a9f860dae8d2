// copyDeviceLimits() is the one place both device listings (direct mode and the broker's) take
// their limits from: every field must land where its name says, from either kind of device.
#include "common/device_limits.h"

#include <gtest/gtest.h>

#include "ibv_extend_broker.h"

namespace ibvx {
namespace {

TEST(DeviceLimits, VerbsAttrFillsEveryLimitVerbsKnowsAndLeavesTheRest) {
    ibv_device_attr a{};
    a.phys_port_cnt = 2;
    a.max_qp = 101;
    a.max_cq = 102;
    a.max_srq = 103;
    a.max_mr = 104;
    a.max_qp_wr = 105;
    a.max_cqe = 106;
    a.max_srq_wr = 107;
    a.max_sge = 108;
    a.max_mr_size = 1ull << 40;
    ibvx_device_info info{};
    info.max_inline_data = 7;  // verbs has no such limits: what was there stays
    info.max_msg_sz = 9;
    copyDeviceLimits(a, info);
    EXPECT_EQ(info.phys_port_cnt, 2u);
    EXPECT_EQ(info.max_qp, 101u);
    EXPECT_EQ(info.max_cq, 102u);
    EXPECT_EQ(info.max_srq, 103u);
    EXPECT_EQ(info.max_mr, 104u);
    EXPECT_EQ(info.max_qp_wr, 105u);
    EXPECT_EQ(info.max_cqe, 106u);
    EXPECT_EQ(info.max_srq_wr, 107u);
    EXPECT_EQ(info.max_sge, 108u);
    EXPECT_EQ(info.max_mr_size, 1ull << 40);
    EXPECT_EQ(info.max_inline_data, 7u);
    EXPECT_EQ(info.max_msg_sz, 9u);
    EXPECT_EQ(info.ext_cap, 0u);
    EXPECT_EQ(info.driver_version, 0u);
}

TEST(DeviceLimits, VdevAttrFillsEveryLimit) {
    ibv_extend_vdev_attr a{};
    a.phys_port_cnt = 1;
    a.max_qp = 201;
    a.max_cq = 202;
    a.max_srq = 203;
    a.max_mr = 204;
    a.max_qp_wr = 205;
    a.max_cqe = 206;
    a.max_srq_wr = 207;
    a.max_sge = 208;
    a.max_inline_data = 209;
    a.max_msg_sz = 210;
    a.max_mr_size = 3ull << 33;
    ibvx_device_info info{};
    copyDeviceLimits(a, info);
    EXPECT_EQ(info.phys_port_cnt, 1u);
    EXPECT_EQ(info.max_qp, 201u);
    EXPECT_EQ(info.max_cq, 202u);
    EXPECT_EQ(info.max_srq, 203u);
    EXPECT_EQ(info.max_mr, 204u);
    EXPECT_EQ(info.max_qp_wr, 205u);
    EXPECT_EQ(info.max_cqe, 206u);
    EXPECT_EQ(info.max_srq_wr, 207u);
    EXPECT_EQ(info.max_sge, 208u);
    EXPECT_EQ(info.max_inline_data, 209u);
    EXPECT_EQ(info.max_msg_sz, 210u);
    EXPECT_EQ(info.max_mr_size, 3ull << 33);
}

}  // namespace
}  // namespace ibvx
