// The daemon's checks on wire input, built on the shared converter: UNSPECIFIED enums and
// oversized bytes are INVALID_ARGUMENT with messages naming the field; the Admin object view.
#include <gtest/gtest.h>

#include "daemon/edge/convert.h"

namespace ibvx::daemon {
namespace {

TEST(EdgeConvert, UnspecifiedEnumsAreInvalidArgument) {
    auto mode = fromProto(pb::DMA_MODE_UNSPECIFIED);
    ASSERT_FALSE(mode.isOk());
    EXPECT_EQ(mode.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(mode.status().message(), "dma_mode must be DMA_MODE_DEFAULT or DMA_MODE_INDEP_UB");
    auto type = fromProto(pb::QP_TYPE_UNSPECIFIED);
    ASSERT_FALSE(type.isOk());
    EXPECT_EQ(type.status().message(), "qp_type must be RC, UC or UD");
    auto state = fromProto(pb::QP_STATE_UNSPECIFIED);
    ASSERT_FALSE(state.isOk());
    EXPECT_EQ(state.status().message(), "QP state is unspecified or unknown");
    auto unknown = fromProto(static_cast<pb::QpState>(99));
    EXPECT_FALSE(unknown.isOk());
    auto err = fromProto(pb::QP_STATE_ERR);
    auto ud = fromProto(pb::QP_TYPE_UD);
    auto indep = fromProto(pb::DMA_MODE_INDEP_UB);
    EXPECT_EQ(*err, IBV_QPS_ERR);
    EXPECT_EQ(*ud, IBV_QPT_UD);
    EXPECT_EQ(*indep, QU_BUF_DMA_MODE_INDEP_UB);
}

TEST(EdgeConvert, QpAttrStatesAreCheckedOnlyWhenTheMaskNamesThem) {
    pb::QpAttr p;  // both states unspecified
    p.set_qkey(42);
    ibv_qp_attr a;
    ASSERT_TRUE(fromProto(p, IBV_QP_QKEY, &a).isOk());
    EXPECT_EQ(a.qkey, 42u);
    EXPECT_EQ(a.qp_state, IBV_QPS_RESET);  // left 0 outside the mask
    EXPECT_EQ(a.cur_qp_state, IBV_QPS_RESET);
    Status st = fromProto(p, IBV_QP_STATE, &a);
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.message(), "QP state is unspecified or unknown");
    p.set_qp_state(pb::QP_STATE_RTS);
    EXPECT_EQ(fromProto(p, IBV_QP_STATE | IBV_QP_CUR_STATE, &a).code(), Code::kInvalidArgument);
    ASSERT_TRUE(fromProto(p, IBV_QP_STATE, &a).isOk());
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
}

TEST(EdgeConvert, OversizedBytesAreInvalidArgumentNamingTheField) {
    pb::QpAttr p;
    p.mutable_ah_attr()->mutable_dgid()->set_raw(std::string(17, 'g'));
    ibv_qp_attr a;
    Status st = fromProto(p, 0, &a);
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.message(), "ah_attr.dgid is longer than 16 bytes");

    pb::QpAttrExtend x;
    x.set_sack(std::string(1000, 's'));
    ibv_qp_attr_extend e;
    st = fromProto(x, &e);
    EXPECT_EQ(st.message(), "sack is longer than " + std::to_string(sizeof(e.sack)) + " bytes");
    x.mutable_feature()->set_resv(std::string(62, 'r'));
    EXPECT_EQ(fromProto(x, &e).message(), "feature.resv is longer than 61 bytes");  // the first one
    x.mutable_feature()->set_version(256);
    EXPECT_EQ(fromProto(x, &e).message(), "hyroce feature type/version out of range");

    pb::HyroceFeature f;
    f.set_type(300);
    ibv_hyroce_feature hf;
    EXPECT_EQ(fromProto(f, &hf).message(), "hyroce feature type/version out of range");
}

TEST(EdgeConvert, ObjectKindsRoundTripAndUnspecifiedIsNone) {
    for (ObjectKind k : {ObjectKind::kContext, ObjectKind::kPd, ObjectKind::kMr, ObjectKind::kCq,
                         ObjectKind::kQp, ObjectKind::kSrq}) {
        pb::ObjectKind p = toProto(k);
        EXPECT_NE(p, pb::OBJECT_KIND_UNSPECIFIED);
        EXPECT_EQ(fromProto(p), k);
    }
    EXPECT_FALSE(fromProto(pb::OBJECT_KIND_UNSPECIFIED).has_value());
    EXPECT_FALSE(fromProto(static_cast<pb::ObjectKind>(42)).has_value());
}

TEST(EdgeConvert, ObjectSnapshotCarriesItsKindsDetails) {
    ObjectSnapshot q;
    q.handle = 7;
    q.kind = ObjectKind::kQp;
    q.device = "softnda0";
    q.users = 0;
    q.uses = {1, 2, 3};
    q.qp_num = 99;
    q.qp_state = IBV_QPS_RTS;
    q.qp_type = IBV_QPT_UD;
    q.qp_cap = {16, 8, 2, 1, 64};
    q.qp_has_srq = true;
    pb::ObjectInfo o;
    toProto(q, &o);
    EXPECT_EQ(o.handle(), 7u);
    EXPECT_EQ(o.kind(), pb::OBJECT_KIND_QP);
    EXPECT_EQ(o.device(), "softnda0");
    EXPECT_EQ(o.uses_size(), 3);
    ASSERT_TRUE(o.has_qp());
    EXPECT_EQ(o.qp().state(), pb::QP_STATE_RTS);
    EXPECT_EQ(o.qp().qp_type(), pb::QP_TYPE_UD);
    EXPECT_EQ(o.qp().max_send_wr(), 16u);
    EXPECT_TRUE(o.qp().has_srq());

    ObjectSnapshot m;
    m.kind = ObjectKind::kMr;
    m.mr_length = 4096;
    m.lkey = 1;
    m.rkey = 2;
    pb::ObjectInfo mo;
    toProto(m, &mo);
    ASSERT_TRUE(mo.has_mr());
    EXPECT_EQ(mo.mr().length(), 4096u);
    EXPECT_EQ(mo.mr().rkey(), 2u);

    ObjectSnapshot pd;
    pd.kind = ObjectKind::kPd;
    pb::ObjectInfo po;
    toProto(pd, &po);
    EXPECT_EQ(po.details_case(), pb::ObjectInfo::DETAILS_NOT_SET);
}

}  // namespace
}  // namespace ibvx::daemon
