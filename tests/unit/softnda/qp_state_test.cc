// The standard QP state machine through the vdev modify_qp/query_qp: legal paths, refused
// transitions, required and forbidden attributes, values.
#include <iterator>

#include "common/plain_init.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class QpState : public SoftndaTest {
  protected:
    void SetUp() override {
        SoftndaTest::SetUp();
        cq_ = makeCq();
        q_ = makeQp(cq_, cq_);
        qp_ = q_.ext->qp;
    }
    int go(ibv_qp_state s, int extra_mask = 0, ibv_qp_attr *attr = nullptr) {
        ibv_qp_attr a{};
        if (attr != nullptr) {
            a = *attr;
        }
        a.qp_state = s;
        return softnda_vdev_ops.modify_qp(qp_, &a, IBV_QP_STATE | extra_mask);
    }
    CqH cq_;
    QpH q_;
    ibv_qp *qp_ = nullptr;
};

TEST_F(QpState, FullLegalPath) {
    ASSERT_EQ(toInit(qp_, kAllAccess), 0);
    EXPECT_EQ(qp_->state, IBV_QPS_INIT);
    ASSERT_EQ(toRtr(qp_, 0x123, 77), 0);
    ASSERT_EQ(toRts(qp_, 99, 3), 0);
    EXPECT_EQ(go(IBV_QPS_SQD), 0);
    EXPECT_EQ(go(IBV_QPS_RTS), 0);
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp_, &a, IBV_QP_STATE | IBV_QP_DEST_QPN, &ia), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(a.dest_qp_num, 0x123u);
    EXPECT_EQ(a.rq_psn, 77u);
    EXPECT_EQ(a.sq_psn, 99u);
    EXPECT_EQ(a.rnr_retry, 3);
    EXPECT_EQ(a.port_num, 1);
    EXPECT_EQ(a.qp_access_flags, static_cast<unsigned>(kAllAccess));
    EXPECT_EQ(a.path_mtu, IBV_MTU_4096);
    EXPECT_EQ(ia.qp_type, IBV_QPT_RC);
    EXPECT_EQ(ia.cap.max_send_wr, 64u);
    EXPECT_EQ(go(IBV_QPS_ERR), 0);
    EXPECT_EQ(go(IBV_QPS_RTS), -EINVAL);  // ERR only goes to RESET
    EXPECT_EQ(go(IBV_QPS_RESET), 0);
    EXPECT_EQ(qp_->state, IBV_QPS_RESET);
    EXPECT_EQ(toInit(qp_, kAllAccess), 0);  // and starts over
}

TEST_F(QpState, SkippingStatesIsRefused) {
    EXPECT_EQ(toRtr(qp_, 1), -EINVAL);
    EXPECT_EQ(toRts(qp_), -EINVAL);
    EXPECT_EQ(go(IBV_QPS_SQD), -EINVAL);
    ASSERT_EQ(toInit(qp_, 0), 0);
    EXPECT_EQ(toRts(qp_), -EINVAL);
    ASSERT_EQ(toRtr(qp_, 1), 0);
    EXPECT_EQ(toInit(qp_, 0), -EINVAL);  // no way back
    EXPECT_EQ(go(IBV_QPS_SQD), -EINVAL);
    EXPECT_EQ(qp_->state, IBV_QPS_RTR);
    ibv_qp_attr bad{};
    int out_of_range = 42;  // as a C caller could pass it
    std::memcpy(&bad.qp_state, &out_of_range, sizeof(out_of_range));
    EXPECT_EQ(softnda_vdev_ops.modify_qp(qp_, &bad, IBV_QP_STATE), -EINVAL);
}

TEST_F(QpState, RequiredAttributesMustBePresent) {
    ibv_qp_attr a{};
    a.port_num = 1;
    EXPECT_EQ(go(IBV_QPS_INIT, IBV_QP_PORT, &a), -EINVAL);  // no PKEY_INDEX / ACCESS_FLAGS
    ASSERT_EQ(toInit(qp_, 0), 0);
    a = ibv_qp_attr{};
    a.dest_qp_num = 5;
    EXPECT_EQ(go(IBV_QPS_RTR, IBV_QP_DEST_QPN, &a), -EINVAL);
    ASSERT_EQ(toRtr(qp_, 5), 0);
    EXPECT_EQ(go(IBV_QPS_RTS, IBV_QP_SQ_PSN, &a), -EINVAL);
}

TEST_F(QpState, AttributesOutsideTheTransitionAreRefused) {
    ibv_qp_attr a{};
    a.port_num = 1;
    a.sq_psn = 3;
    EXPECT_EQ(go(IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS | IBV_QP_SQ_PSN, &a),
              -EINVAL);
    EXPECT_EQ(go(IBV_QPS_ERR, IBV_QP_SQ_PSN, &a), -EINVAL);
}

TEST_F(QpState, BadValuesAreRefused) {
    ibv_qp_attr a{};
    a.port_num = 2;  // one port
    EXPECT_EQ(go(IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &a), -EINVAL);
    a.port_num = 1;
    a.pkey_index = 1;
    EXPECT_EQ(go(IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &a), -EINVAL);
    ASSERT_EQ(toInit(qp_, 0), 0);
    ASSERT_EQ(toRtr(qp_, 5), 0);
    a = ibv_qp_attr{};
    a.rnr_retry = 8;
    a.retry_cnt = 7;
    EXPECT_EQ(
        go(IBV_QPS_RTS,
           IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
           &a),
        -EINVAL);
}

TEST_F(QpState, CurrentStateMustMatchWhenGiven) {
    ibv_qp_attr a{};
    a.cur_qp_state = IBV_QPS_INIT;  // it is RESET
    EXPECT_EQ(go(IBV_QPS_ERR, IBV_QP_CUR_STATE, &a), -EINVAL);
    a.cur_qp_state = IBV_QPS_RESET;
    EXPECT_EQ(go(IBV_QPS_ERR, IBV_QP_CUR_STATE, &a), 0);
}

TEST_F(QpState, ForeignQpIsRefused) {
    ibv_qp fake{};
    ibv_qp_attr a{};
    EXPECT_EQ(softnda_vdev_ops.modify_qp(&fake, &a, IBV_QP_STATE), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.query_qp(&fake, &a, IBV_QP_STATE, nullptr), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.modify_qp(qp_, nullptr, IBV_QP_STATE), -EINVAL);
}

// IBV_EXTEND_GUARANTEE_PLAIN_INIT (ibv_extend_vdev.h), which softnda declares and the broker's
// face relies on to answer a RESET -> INIT without a broker call: softnda refuses such a modify
// exactly as plainInitRefusal() (common/plain_init.h), with which the face answers one, says, over every mask
// of the attributes involved, with values at and past their edges, for each type that may be held.
TEST_F(QpState, ResetToInitIsRefusedExactlyAsThePlainInitGuaranteeSays) {
    ASSERT_NE(softnda_vdev_ops.guarantees & IBV_EXTEND_GUARANTEE_PLAIN_INIT, 0u);
    ibv_device_attr dev{};
    ASSERT_EQ(softnda_vdev_ops.query_device(ctx_, &dev), 0);
    const int bits[] = {IBV_QP_PKEY_INDEX, IBV_QP_PORT,      IBV_QP_ACCESS_FLAGS,
                        IBV_QP_QKEY,       IBV_QP_CUR_STATE, IBV_QP_PATH_MTU};
    const uint32_t ports[] = {0u, 1u, dev.phys_port_cnt, dev.phys_port_cnt + 1u};
    int cases = 0, taken = 0;
    for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
        QpCaps c;
        c.type = type;
        ibv_qp *qp = makeQp(cq_, cq_, c).ext->qp;
        for (int subset = 0; subset < (1 << std::size(bits)); ++subset) {
            int mask = IBV_QP_STATE;
            for (size_t b = 0; b < std::size(bits); ++b) {
                mask |= (subset >> b & 1) != 0 ? bits[b] : 0;
            }
            for (uint32_t port : ports) {
                for (uint16_t pkey : {0, 1}) {
                    for (unsigned access : {unsigned{kAllAccess}, unsigned{IBV_ACCESS_ZERO_BASED}}) {
                        for (uint32_t qkey : {0x11u, 0x80000011u}) {
                            for (ibv_qp_state cur : {IBV_QPS_RESET, IBV_QPS_INIT}) {
                                ibv_qp_attr a{};
                                a.qp_state = IBV_QPS_INIT;
                                a.cur_qp_state = cur;
                                a.port_num = static_cast<uint8_t>(port);
                                a.pkey_index = pkey;
                                a.qp_access_flags = access;
                                a.qkey = qkey;
                                a.path_mtu = IBV_MTU_1024;
                                const int face = -ibvx::plainInitRefusal(type, a, mask, dev.phys_port_cnt);
                                ibv_qp_attr sent = a;
                                ASSERT_EQ(softnda_vdev_ops.modify_qp(qp, &sent, mask), face)
                                    << "type " << type << " mask " << std::hex << mask << std::dec << " port "
                                    << port << " pkey " << pkey << " access " << access << " qkey " << qkey
                                    << " cur " << cur;
                                ++cases;
                                if (face == 0) {
                                    ++taken;
                                    ibv_qp_attr reset{};
                                    reset.qp_state = IBV_QPS_RESET;
                                    ASSERT_EQ(softnda_vdev_ops.modify_qp(qp, &reset, IBV_QP_STATE), 0);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    EXPECT_GT(taken, 0) << "of " << cases;
    EXPECT_GT(cases - taken, taken) << "most are refused";
}

}  // namespace
}  // namespace softnda_test
