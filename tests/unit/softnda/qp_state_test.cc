// The standard QP state machine through the vdev modify_qp/query_qp: legal paths, refused
// transitions, required and forbidden attributes, values.
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

}  // namespace
}  // namespace softnda_test
