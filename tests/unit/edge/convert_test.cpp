// The daemon's checks on wire input, built on the shared converter: UNSPECIFIED enums and
// oversized bytes are INVALID_ARGUMENT with messages naming the field; requests into the core's
// arguments and results into replies; the Admin object view.
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

TEST(EdgeConvert, ACreateRequestAnswersItsFirstBadEnum) {
    pb::CreateQpRequest q;  // dma_mode and qp_type both unspecified: dma_mode is checked first
    auto qp = fromProto(q);
    ASSERT_FALSE(qp.isOk());
    EXPECT_EQ(qp.status().message(), "dma_mode must be DMA_MODE_DEFAULT or DMA_MODE_INDEP_UB");
    q.set_dma_mode(pb::DMA_MODE_DEFAULT);
    qp = fromProto(q);
    ASSERT_FALSE(qp.isOk());
    EXPECT_EQ(qp.status().message(), "qp_type must be RC, UC or UD");
    EXPECT_EQ(fromProto(pb::CreateCqRequest()).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(fromProto(pb::CreateSrqRequest()).status().code(), Code::kInvalidArgument);
}

TEST(EdgeConvert, ACreateRequestBecomesTheCoreArguments) {
    pb::CreateQpRequest q;
    q.set_context(1);
    q.set_pd(2);
    q.set_send_cq(3);
    q.set_recv_cq(4);
    q.set_srq(5);
    q.set_qp_type(pb::QP_TYPE_UD);
    q.mutable_cap()->set_max_send_wr(16);
    q.set_sq_sig_all(true);
    q.set_qp_cap_flag(6);
    q.set_dma_mode(pb::DMA_MODE_INDEP_UB);
    auto qp = fromProto(q);
    ASSERT_TRUE(qp.isOk()) << qp.status().toString();
    EXPECT_EQ(qp->context, 1u);
    EXPECT_EQ(qp->pd, 2u);
    EXPECT_EQ(qp->send_cq, 3u);
    EXPECT_EQ(qp->recv_cq, 4u);
    EXPECT_EQ(qp->srq, 5u);
    EXPECT_EQ(qp->qp_type, IBV_QPT_UD);
    EXPECT_EQ(qp->cap.max_send_wr, 16u);
    EXPECT_TRUE(qp->sq_sig_all);
    EXPECT_EQ(qp->qp_cap_flag, 6u);
    EXPECT_EQ(qp->dma_mode, QU_BUF_DMA_MODE_INDEP_UB);

    pb::CreateCqRequest c;
    c.set_context(1);
    c.set_cqe(64);
    c.set_comp_vector(2);
    c.set_wc_flags(3);
    c.set_cq_cap_flag(4);
    c.set_dma_mode(pb::DMA_MODE_DEFAULT);
    c.set_event_xfer_id(5);
    auto cq = fromProto(c);
    ASSERT_TRUE(cq.isOk()) << cq.status().toString();
    EXPECT_EQ(cq->context, 1u);
    EXPECT_EQ(cq->cqe, 64u);
    EXPECT_EQ(cq->comp_vector, 2u);
    EXPECT_EQ(cq->wc_flags, 3u);
    EXPECT_EQ(cq->cq_cap_flag, 4u);
    EXPECT_EQ(cq->dma_mode, QU_BUF_DMA_MODE_DEFAULT);
    EXPECT_EQ(cq->event_xfer_id, 5u);

    pb::CreateSrqRequest r;
    r.set_context(1);
    r.set_pd(2);
    r.set_max_wr(3);
    r.set_max_sge(4);
    r.set_srq_limit(5);
    r.set_srq_cap_flag(6);
    r.set_dma_mode(pb::DMA_MODE_DEFAULT);
    auto srq = fromProto(r);
    ASSERT_TRUE(srq.isOk()) << srq.status().toString();
    EXPECT_EQ(srq->context, 1u);
    EXPECT_EQ(srq->pd, 2u);
    EXPECT_EQ(srq->max_wr, 3u);
    EXPECT_EQ(srq->max_sge, 4u);
    EXPECT_EQ(srq->srq_limit, 5u);
    EXPECT_EQ(srq->srq_cap_flag, 6u);

    pb::RegMrRequest m;
    m.set_pd(1);
    m.set_xfer_id(2);
    m.set_offset(3);
    m.set_length(4);
    m.set_access(5);
    m.set_iova(6);
    RegMrArgs mr = fromProto(m);
    EXPECT_EQ(mr.pd, 1u);
    EXPECT_EQ(mr.xfer_id, 2u);
    EXPECT_EQ(mr.offset, 3u);
    EXPECT_EQ(mr.length, 4u);
    EXPECT_EQ(mr.access, 5u);
    EXPECT_EQ(mr.iova, 6u);
}

TEST(EdgeConvert, AResultFillsItsReplyWholly) {
    QpResult qp;
    qp.qp = 7;
    qp.qp_num = 0x123;
    qp.state = IBV_QPS_INIT;
    qp.cap.max_send_wr = 16;
    qp.sq.entry_cnt = 64;
    qp.sq.base.region = 9;
    qp.rq.entry_cnt = 32;  // base.region 0: no RegionRef on the wire
    qp.resv[0] = 0xab;
    qp.vendor_priv_info = 42;
    pb::CreateQpResponse q;
    toProto(qp, &q);
    EXPECT_EQ(q.qp(), 7u);
    EXPECT_EQ(q.qp_num(), 0x123u);
    EXPECT_EQ(q.state(), pb::QP_STATE_INIT);
    EXPECT_EQ(q.cap().max_send_wr(), 16u);
    EXPECT_EQ(q.sq_info().entry_cnt(), 64u);
    EXPECT_EQ(q.sq_info().base().region(), 9u);
    EXPECT_EQ(q.rq_info().entry_cnt(), 32u);
    EXPECT_FALSE(q.rq_info().has_base());
    ASSERT_EQ(q.resv().size(), sizeof(qp.resv));
    EXPECT_EQ(static_cast<uint8_t>(q.resv()[0]), 0xab);
    EXPECT_EQ(q.vendor_priv_info(), 42u);

    Released released{3, 5};
    pb::DestroyQpResponse d;
    toProto(released, d.mutable_released_regions());
    ASSERT_EQ(d.released_regions_size(), 2);
    EXPECT_EQ(d.released_regions(0), 3u);
    EXPECT_EQ(d.released_regions(1), 5u);

    pb::HelloResponse h;
    toProto(Version{4, 2, 1}, h.mutable_broker_version());
    EXPECT_EQ(h.broker_version().major(), 4u);
    EXPECT_EQ(h.broker_version().minor(), 2u);
    EXPECT_EQ(h.broker_version().patch(), 1u);
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

    // An XRC SRQ shows its number, an XRC QP its type, a domain its kind.
    ObjectSnapshot x;
    x.kind = ObjectKind::kSrq;
    x.srq_entries = 16;
    x.srq_num = 5;
    pb::ObjectInfo xo;
    toProto(x, &xo);
    ASSERT_TRUE(xo.has_srq());
    EXPECT_EQ(xo.srq().srq_num(), 5u);
    x = {};
    x.kind = ObjectKind::kQp;
    x.qp_type = IBV_QPT_XRC_RECV;
    toProto(x, &xo);
    EXPECT_EQ(xo.qp().qp_type(), pb::QP_TYPE_XRC_RECV);
    x = {};
    x.kind = ObjectKind::kXrcd;
    toProto(x, &xo);
    EXPECT_EQ(xo.kind(), pb::OBJECT_KIND_XRCD);

    ObjectSnapshot pd;
    pd.kind = ObjectKind::kPd;
    pb::ObjectInfo po;
    toProto(pd, &po);
    EXPECT_EQ(po.details_case(), pb::ObjectInfo::DETAILS_NOT_SET);
}

}  // namespace
}  // namespace ibvx::daemon
