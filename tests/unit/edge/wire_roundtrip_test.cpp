// The shared struct <-> message converter (proto/convert/struct_convert.h). This file is built
// twice, against the full generated classes and against the client's lite ones, as the
// converter itself is: both builds must agree on every value.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <optional>

#include "proto/convert/struct_convert.h"

namespace ibvx::wire {
namespace {

// Every C value maps to a specified wire value and back; every wire value in [min, max] but
// UNSPECIFIED maps to a C value and back to itself; UNSPECIFIED maps to none.
template <typename C, typename P>
void expectRoundTrips(std::initializer_list<C> values, int min, int max, P unspecified) {
    for (C c : values) {
        P p = toProto(c);
        EXPECT_NE(p, unspecified) << c;
        EXPECT_EQ(fromProto(p), c);
    }
    for (int p = min; p <= max; ++p) {
        if (p != unspecified) {
            std::optional<C> c = fromProto(static_cast<P>(p));
            ASSERT_TRUE(c.has_value()) << p;
            EXPECT_EQ(toProto(*c), p);
        }
    }
    EXPECT_FALSE(fromProto(unspecified).has_value());
}

TEST(WireEnums, EveryQpStateRoundTrips) {
    expectRoundTrips(
        {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR},
        pb::QpState_MIN, pb::QpState_MAX, pb::QP_STATE_UNSPECIFIED);
    EXPECT_EQ(toProto(IBV_QPS_UNKNOWN), pb::QP_STATE_UNSPECIFIED);
}

TEST(WireEnums, EveryQpTypeRoundTrips) {
    expectRoundTrips({IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}, pb::QpType_MIN, pb::QpType_MAX,
                     pb::QP_TYPE_UNSPECIFIED);
    EXPECT_EQ(toProto(IBV_QPT_RAW_PACKET), pb::QP_TYPE_UNSPECIFIED);  // not carried by the broker
}

TEST(WireEnums, EveryDmaModeRoundTrips) {
    expectRoundTrips({QU_BUF_DMA_MODE_DEFAULT, QU_BUF_DMA_MODE_INDEP_UB}, pb::DmaMode_MIN, pb::DmaMode_MAX,
                     pb::DMA_MODE_UNSPECIFIED);
}

ibv_qp_attr sampleAttr() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.cur_qp_state = IBV_QPS_INIT;
    a.path_mtu = IBV_MTU_1024;
    a.qkey = 0x11111111;
    a.rq_psn = 12;
    a.sq_psn = 34;
    a.dest_qp_num = 0x123456;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    a.cap = {16, 8, 2, 1, 64};
    for (int i = 0; i < 16; ++i) {
        a.ah_attr.grh.dgid.raw[i] = static_cast<uint8_t>(0xf0 + i);
    }
    a.ah_attr.grh.flow_label = 7;
    a.ah_attr.grh.sgid_index = 3;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.traffic_class = 5;
    a.ah_attr.is_global = 1;
    a.ah_attr.dlid = 0x1234;
    a.ah_attr.sl = 2;
    a.ah_attr.src_path_bits = 1;
    a.ah_attr.static_rate = 3;
    a.ah_attr.port_num = 1;
    a.pkey_index = 9;
    a.max_rd_atomic = 4;
    a.max_dest_rd_atomic = 5;
    a.min_rnr_timer = 12;
    a.port_num = 1;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 6;
    return a;
}

TEST(WireStructs, QpAttrRoundTripsThroughTheWireBytes) {
    ibv_qp_attr a = sampleAttr();
    pb::QpAttr p;
    toProto(a, IBV_QP_STATE | IBV_QP_CUR_STATE, &p);
    pb::QpAttr parsed;
    ASSERT_TRUE(parsed.ParseFromString(p.SerializeAsString()));
    ibv_qp_attr back{};
    EXPECT_FALSE(fromProto(parsed, &back));
    EXPECT_EQ(std::memcmp(&a, &back, sizeof(a)), 0);
}

TEST(WireStructs, QpAttrStatesOutsideTheMaskStayUnspecified) {
    pb::QpAttr p;
    toProto(sampleAttr(), IBV_QP_PORT, &p);
    EXPECT_EQ(p.qp_state(), pb::QP_STATE_UNSPECIFIED);
    EXPECT_EQ(p.cur_qp_state(), pb::QP_STATE_UNSPECIFIED);
    ibv_qp_attr back{};
    (void)fromProto(p, &back);
    EXPECT_EQ(back.qp_state, IBV_QPS_UNKNOWN);
}

TEST(WireStructs, QpCapRoundTrips) {
    ibv_qp_cap cap{100, 200, 3, 4, 256};
    pb::QpCap p;
    toProto(cap, &p);
    ibv_qp_cap back = fromProto(p);
    EXPECT_EQ(std::memcmp(&cap, &back, sizeof(cap)), 0);
}

TEST(WireStructs, QpAttrExtendRoundTripsExceptItsQpPointer) {
    ibv_qp_attr_extend a{};
    std::memset(&a, 0x5a, sizeof(a));
    a.qp = nullptr;
    a.feature.sack_enable = 1;
    pb::QpAttrExtend p;
    toProto(a, &p);
    ibv_qp_attr_extend back{};
    EXPECT_FALSE(fromProto(p, &back));
    // Everything after the pointer up to the last field (no tail padding).
    size_t from = offsetof(ibv_qp_attr_extend, udp_src_port);
    size_t to = offsetof(ibv_qp_attr_extend, lag_port) + sizeof(a.lag_port);
    EXPECT_EQ(
        std::memcmp(reinterpret_cast<char *>(&a) + from, reinterpret_cast<char *>(&back) + from, to - from),
        0);
}

TEST(WireStructs, OversizedBytesAreTruncatedAndNamed) {
    pb::QpAttrExtend p;
    p.set_ar(std::string(sizeof(ibv_qp_attr_extend::ar) + 1, 'x'));
    ibv_qp_attr_extend back{};
    Oversized big = fromProto(p, &back);
    ASSERT_TRUE(big);
    EXPECT_STREQ(big.field, "ar");
    EXPECT_EQ(big.limit, sizeof(back.ar));

    pb::HyroceFeature f;
    f.set_resv(std::string(64, 'y'));
    ibv_hyroce_feature fb{};
    big = fromProto(f, &fb);
    ASSERT_TRUE(big);
    EXPECT_STREQ(big.field, "feature.resv");
}

TEST(WireStructs, DeviceLimitsRoundTrip) {
    struct Limits {
        uint32_t ext_cap = 1, driver_version = 2, phys_port_cnt = 3, max_qp = 4, max_cq = 5, max_srq = 6,
                 max_mr = 7, max_qp_wr = 8, max_cqe = 9, max_srq_wr = 10, max_sge = 11, max_inline_data = 12,
                 max_msg_sz = 13;
        uint64_t max_mr_size = 1ull << 40;
    } in;
    Limits out{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    pb::DeviceInfo p;
    limitsToProto(in, &p);
    limitsFromProto(p, &out);
    const uint32_t *a = &in.ext_cap, *b = &out.ext_cap;
    for (int i = 0; i < 13; ++i) {
        EXPECT_EQ(a[i], b[i]) << i;
    }
    EXPECT_EQ(out.max_mr_size, in.max_mr_size);
}

}  // namespace
}  // namespace ibvx::wire
