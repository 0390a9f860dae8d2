// XRC (SPEC.md §14): an initiator's message lands on the SRQ its WQE names at the target, in
// the target's domain, completing on that SRQ's CQ; memory is checked against the SRQ's PD; an
// SRQ number outside the target's domain is an invalid request. Objects of two contexts of the
// device share one domain, as two processes do.
#include <set>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class Xrc : public SoftndaTest {
  protected:
    void SetUp() override {
        SoftndaTest::SetUp();
        xrcd_ = softnda_vdev_ops.open_xrcd(ctx_);
        ASSERT_NE(xrcd_, nullptr);
        scq_ = makeCq();
        xcq_ = makeCq();
    }

    void TearDown() override {
        for (auto it = qps_.rbegin(); it != qps_.rend(); ++it) {
            EXPECT_EQ(ext_->ops->destroy_qp(*it), 0);
        }
        qps_.clear();
        for (auto *s : srqs_) {
            EXPECT_EQ(ext_->ops->destroy_srq(s), 0);
        }
        srqs_.clear();
        for (ibv_xrcd *x : {xrcd_, other_xrcd_}) {
            if (x != nullptr) {
                EXPECT_EQ(softnda_vdev_ops.close_xrcd(x), 0);
            }
        }
        SoftndaTest::TearDown();
    }

    SrqH makeXrcSrq(ibv_xrcd *xrcd, const CqH &cq, uint32_t max_wr = 16) {
        SrqH h;
        ibv_srq_init_attr_extend a{};
        a.pd = pd_;
        a.attr.attr.max_wr = max_wr;
        a.attr.attr.max_sge = 2;
        a.ops = arena().ops();
        h.ext = softnda_vdev_ops.create_xrc_srq(ctx_, &a, xrcd, cq.ext->cq);
        EXPECT_NE(h.ext, nullptr) << "errno " << errno;
        if (h.ext != nullptr) {
            srqs_.push_back(h.ext);
            EXPECT_EQ(softnda_rq_init(&h.rq, &h.ext->srq_info), 0);
        }
        return h;
    }

    static uint32_t srqn(const SrqH &s) {
        uint32_t n = 0;
        EXPECT_EQ(softnda_vdev_ops.get_srq_num(s.ext->srq, &n), 0);
        return n;
    }

    QpH makeIni() {
        QpH h;
        ibv_qp_init_attr_extend a{};
        a.pd = pd_;
        a.attr.send_cq = scq_.ext->cq;
        a.attr.qp_type = IBV_QPT_XRC_SEND;
        a.attr.cap.max_send_wr = 16;
        a.attr.cap.max_send_sge = 2;
        a.attr.cap.max_inline_data = 32;
        a.ops = arena().ops();
        h.ext = ext_->ops->create_qp(ctx_, &a);
        EXPECT_NE(h.ext, nullptr) << "errno " << errno;
        if (h.ext != nullptr) {
            qps_.push_back(h.ext);
            EXPECT_EQ(softnda_sq_init_xrc(&h.sq, &h.ext->sq_info), 0);
            EXPECT_EQ(a.attr.cap.max_recv_wr, 0u);
            EXPECT_GE(a.attr.cap.max_inline_data, 32u);
        }
        return h;
    }

    QpH makeTgt(ibv_xrcd *xrcd) {
        QpH h;
        ibv_qp_init_attr_extend a{};
        a.ops = arena().ops();
        h.ext = softnda_vdev_ops.create_xrc_tgt_qp(ctx_, &a, xrcd);
        EXPECT_NE(h.ext, nullptr) << "errno " << errno;
        if (h.ext != nullptr) {
            qps_.push_back(h.ext);
        }
        return h;
    }

    // INI -> TGT: the RC state steps (the TGT's RTS with TIMEOUT and SQ_PSN only).
    void connectXrc(QpH &ini, QpH &tgt) {
        ASSERT_EQ(toInit(ini.ext->qp, 0), 0);
        ASSERT_EQ(toInit(tgt.ext->qp, kAllAccess), 0);
        ASSERT_EQ(toRtr(ini.ext->qp, tgt.qpn()), 0);
        ASSERT_EQ(toRtr(tgt.ext->qp, ini.qpn()), 0);
        ASSERT_EQ(toRts(ini.ext->qp), 0);
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        ASSERT_EQ(softnda_vdev_ops.modify_qp(tgt.ext->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT),
                  0);
    }

    ibv_xrcd *xrcd_ = nullptr;
    ibv_xrcd *other_xrcd_ = nullptr;
    CqH scq_, xcq_;
};

TEST_F(Xrc, SendLandsOnTheNamedSrqAndCompletesOnItsCq) {
    CqH xcq2 = makeCq();
    SrqH s1 = makeXrcSrq(xrcd_, xcq_);
    SrqH s2 = makeXrcSrq(xrcd_, xcq2);
    ASSERT_NE(srqn(s1), srqn(s2));
    QpH ini = makeIni();
    QpH tgt = makeTgt(xrcd_);
    connectXrc(ini, tgt);

    char in1[64] = {}, in2[64] = {};
    softnda_sge r1 = sge(in1, sizeof(in1), reg(in1, sizeof(in1)));
    softnda_sge r2 = sge(in2, sizeof(in2), reg(in2, sizeof(in2)));
    ASSERT_EQ(softnda_rq_post(&s1.rq, 11, &r1, 1), 0);
    softnda_rq_doorbell(&s1.rq);
    ASSERT_EQ(softnda_rq_post(&s2.rq, 22, &r2, 1), 0);
    softnda_rq_doorbell(&s2.rq);

    char out[] = "to srq two";
    softnda_sge o = sge(out, sizeof(out), reg(out, sizeof(out)));
    softnda_send_wr w = wr(SOFTNDA_OP_SEND_WITH_IMM, 7, &o, 1);
    w.imm_data = 0x1234;
    w.remote_srqn = srqn(s2);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    softnda_cqe sc = waitOne(scq_.cq);
    EXPECT_EQ(sc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(sc.wr_id, 7u);
    softnda_cqe rc = waitOne(xcq2.cq);
    EXPECT_EQ(rc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc.wr_id, 22u);
    EXPECT_EQ(rc.byte_len, sizeof(out));
    EXPECT_EQ(rc.qp_num, tgt.qpn());  // the target QP, as IB reports an XRC receive
    EXPECT_EQ(rc.src_qp, ini.qpn());
    EXPECT_EQ(rc.imm_data, 0x1234u);
    EXPECT_STREQ(in2, out);
    EXPECT_TRUE(staysEmpty(xcq_.cq));  // SRQ one's receive is still posted
    EXPECT_EQ(in1[0], 0);

    // Inline data sits after the XRC segment too.
    softnda_send_wr inl = wr(SOFTNDA_OP_SEND, 8, nullptr, 0);
    inl.inline_data = "inline!";
    inl.inline_len = 8;
    inl.remote_srqn = srqn(s1);
    ASSERT_EQ(postAndRing(&ini.sq, inl), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    rc = waitOne(xcq_.cq);
    EXPECT_EQ(rc.wr_id, 11u);
    EXPECT_STREQ(in1, "inline!");
}

TEST_F(Xrc, RdmaChecksTheRkeyAgainstTheSrqsPd) {
    SrqH s = makeXrcSrq(xrcd_, xcq_);
    QpH ini = makeIni();
    QpH tgt = makeTgt(xrcd_);
    connectXrc(ini, tgt);
    uint64_t src = 0x0102030405060708ull, dst = 0;
    softnda_sge o;
    softnda_send_wr w = write8(&src, &dst, &o);
    w.remote_srqn = srqn(s);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst, src);

    // An MR of another PD: the SRQ's PD decides, as IB says for XRC.
    ibv_pd *other = softnda_vdev_ops.alloc_pd(ctx_);
    ASSERT_NE(other, nullptr);
    uint64_t dst2 = 0;
    ibv_mr *mr2 = softnda_vdev_ops.reg_mr(other, &dst2, 8, reinterpret_cast<uintptr_t>(&dst2), kAllAccess);
    ASSERT_NE(mr2, nullptr);
    w.remote_addr = reinterpret_cast<uintptr_t>(&dst2);
    w.rkey = mr2->rkey;
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(dst2, 0u);
    EXPECT_EQ(qpState(tgt), IBV_QPS_ERR);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(mr2), 0);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(other), 0);
}

TEST_F(Xrc, SrqOfAnotherDomainIsAnInvalidRequest) {
    other_xrcd_ = softnda_vdev_ops.open_xrcd(ctx_);
    ASSERT_NE(other_xrcd_, nullptr);
    SrqH foreign = makeXrcSrq(other_xrcd_, xcq_);
    QpH ini = makeIni();
    QpH tgt = makeTgt(xrcd_);
    connectXrc(ini, tgt);
    char in[16] = {};
    softnda_sge r = sge(in, sizeof(in), reg(in, sizeof(in)));
    ASSERT_EQ(softnda_rq_post(&foreign.rq, 1, &r, 1), 0);
    softnda_rq_doorbell(&foreign.rq);
    char out[8] = "x";
    softnda_sge o = sge(out, sizeof(out), reg(out, sizeof(out)));
    softnda_send_wr w = wr(SOFTNDA_OP_SEND, 5, &o, 1);
    w.remote_srqn = srqn(foreign);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_EQ(qpState(ini), IBV_QPS_ERR);
    EXPECT_EQ(qpState(tgt), IBV_QPS_ERR);
    EXPECT_TRUE(staysEmpty(xcq_.cq));
    EXPECT_EQ(in[0], 0);
}

TEST_F(Xrc, EmptySrqIsAnRnrWaitUntilAReceiveIsPosted) {
    SrqH s = makeXrcSrq(xrcd_, xcq_);
    QpH ini = makeIni();
    QpH tgt = makeTgt(xrcd_);
    connectXrc(ini, tgt);
    char out[8] = "late";
    softnda_sge o = sge(out, sizeof(out), reg(out, sizeof(out)));
    softnda_send_wr w = wr(SOFTNDA_OP_SEND, 5, &o, 1);
    w.remote_srqn = srqn(s);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    EXPECT_TRUE(staysEmpty(scq_.cq));  // rnr_retry 7: it waits
    char in[8] = {};
    softnda_sge r = sge(in, sizeof(in), reg(in, sizeof(in)));
    ASSERT_EQ(softnda_rq_post(&s.rq, 1, &r, 1), 0);
    softnda_rq_doorbell(&s.rq);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(waitOne(xcq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_STREQ(in, "late");
}

TEST_F(Xrc, ObjectsHoldTheirParents) {
    SrqH s = makeXrcSrq(xrcd_, xcq_);
    QpH tgt = makeTgt(xrcd_);
    EXPECT_EQ(softnda_vdev_ops.close_xrcd(xrcd_), -EBUSY);
    EXPECT_EQ(ext_->ops->destroy_cq(xcq_.ext), -EBUSY);
    // A target is not made by create_qp (it needs its domain); an INI takes no SRQ.
    ibv_qp_init_attr_extend a = qpAttr(scq_, scq_);
    a.attr.qp_type = IBV_QPT_XRC_RECV;
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
    a = qpAttr(scq_, scq_, QpCaps{}, s.ext);
    a.attr.qp_type = IBV_QPT_XRC_SEND;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    // An XRC SRQ is not a QP's SRQ.
    a = qpAttr(scq_, scq_, QpCaps{}, s.ext);
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    // A basic SRQ has no number.
    SrqH basic = makeSrq(4);
    uint32_t n = 0;
    EXPECT_EQ(softnda_vdev_ops.get_srq_num(basic.ext->srq, &n), -EINVAL);
    // The target's state table: RTS needs TIMEOUT and SQ_PSN, not the requester's attributes.
    ASSERT_EQ(toInit(tgt.ext->qp, kAllAccess), 0);
    ASSERT_EQ(toRtr(tgt.ext->qp, 1), 0);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_RTS;
    EXPECT_EQ(softnda_vdev_ops.modify_qp(tgt.ext->qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), -EINVAL);
    // Every XRC object has a restart blob (restart_test.cc restores them).
    ibv_extend_vdev_state st{};
    EXPECT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_SRQ, s.ext, &st), 0);
    EXPECT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_QP, tgt.ext, &st), 0);
    EXPECT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_XRCD, xrcd_, &st), 0);
}

// A second context of the device (a second tenant): its own PD, send CQ and doorbell pages.
struct Tenant {
    ibv_context *ctx = nullptr;
    ibv_context_extend *ext = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq_extend *cq = nullptr;
    softnda_cq cqh{};
    std::vector<ibv_qp_extend *> qps;
    std::vector<ibv_mr *> mrs;

    void open(const ibv_cq_init_attr_extend &ca) {
        ctx = softnda_vdev_ops.open_device("softnda0");
        ASSERT_NE(ctx, nullptr);
        ext = softnda_driver_ops.alloc_context(ctx);
        pd = softnda_vdev_ops.alloc_pd(ctx);
        auto a = ca;
        cq = ext->ops->create_cq(ctx, &a);
        ASSERT_NE(cq, nullptr);
        ASSERT_EQ(softnda_cq_init(&cqh, &cq->cq_info), 0);
    }
    void close() {
        for (auto it = qps.rbegin(); it != qps.rend(); ++it) {
            EXPECT_EQ(ext->ops->destroy_qp(*it), 0);
        }
        for (ibv_mr *m : mrs) {
            EXPECT_EQ(softnda_vdev_ops.dereg_mr(m), 0);
        }
        EXPECT_EQ(ext->ops->destroy_cq(cq), 0);
        EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd), 0);
        softnda_driver_ops.free_context(ext);
        EXPECT_EQ(softnda_vdev_ops.close_device(ctx), 0);
    }
    ibv_mr *reg(void *addr, size_t len) {
        mrs.push_back(softnda_vdev_ops.reg_mr(pd, addr, len, reinterpret_cast<uintptr_t>(addr), kAllAccess));
        return mrs.back();
    }
    // An initiator on this tenant's CQ, and a target of its own in xrcd.
    void makeXrcPair(ibv_extend_ops *ops, ibv_xrcd *xrcd, uint32_t depth, QpH *ini, QpH *tgt) {
        ibv_qp_init_attr_extend ia{};
        ia.pd = pd;
        ia.attr.send_cq = cq->cq;
        ia.attr.qp_type = IBV_QPT_XRC_SEND;
        ia.attr.cap.max_send_wr = depth;
        ia.attr.cap.max_send_sge = 1;
        ia.ops = ops;
        ini->ext = ext->ops->create_qp(ctx, &ia);
        ASSERT_NE(ini->ext, nullptr);
        qps.push_back(ini->ext);
        ASSERT_EQ(softnda_sq_init_xrc(&ini->sq, &ini->ext->sq_info), 0);
        ibv_qp_init_attr_extend ta{};
        ta.ops = ops;
        tgt->ext = softnda_vdev_ops.create_xrc_tgt_qp(ctx, &ta, xrcd);
        ASSERT_NE(tgt->ext, nullptr);
        qps.push_back(tgt->ext);
    }
};

// Two contexts of the device (two tenants) share one domain: the SRQ is the first one's, the
// initiator and the target the second's.
TEST_F(Xrc, ADomainIsSharedAcrossContexts) {
    SrqH s = makeXrcSrq(xrcd_, xcq_);
    Tenant t;
    ASSERT_NO_FATAL_FAILURE(t.open(cqAttr(64)));
    QpH ini, tgt;
    ASSERT_NO_FATAL_FAILURE(t.makeXrcPair(arena().ops(), xrcd_, 4, &ini, &tgt));
    connectXrc(ini, tgt);

    char in[16] = {};
    softnda_sge r = sge(in, sizeof(in), reg(in, sizeof(in)));
    ASSERT_EQ(softnda_rq_post(&s.rq, 3, &r, 1), 0);
    softnda_rq_doorbell(&s.rq);
    char out[16] = "shared domain";
    softnda_sge o = sge(out, sizeof(out), t.reg(out, sizeof(out)));
    softnda_send_wr w = wr(SOFTNDA_OP_SEND, 9, &o, 1);
    w.remote_srqn = srqn(s);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    EXPECT_EQ(waitOne(t.cqh).status, IBV_WC_SUCCESS);
    softnda_cqe c = waitOne(xcq_.cq);
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.qp_num, tgt.qpn());
    EXPECT_STREQ(in, out);
    t.close();
}

// A domain outlives the context that opened it (a broker shares one among processes, and the
// opener may go first): the opener's context closes while the domain is open, and another
// context's SRQ and target in the domain still work.
TEST_F(Xrc, ADomainOutlivesItsOpenersContext) {
    Tenant opener;
    ASSERT_NO_FATAL_FAILURE(opener.open(cqAttr(16)));
    ibv_xrcd *shared = softnda_vdev_ops.open_xrcd(opener.ctx);
    ASSERT_NE(shared, nullptr);
    opener.close();  // close_device answers 0 with the domain still open

    SrqH s = makeXrcSrq(shared, xcq_);
    Tenant t;
    ASSERT_NO_FATAL_FAILURE(t.open(cqAttr(64)));
    QpH ini, tgt;
    ASSERT_NO_FATAL_FAILURE(t.makeXrcPair(arena().ops(), shared, 4, &ini, &tgt));
    connectXrc(ini, tgt);
    char in[16] = {};
    softnda_sge r = sge(in, sizeof(in), reg(in, sizeof(in)));
    ASSERT_EQ(softnda_rq_post(&s.rq, 3, &r, 1), 0);
    softnda_rq_doorbell(&s.rq);
    char out[16] = "opener gone";
    softnda_sge o = sge(out, sizeof(out), t.reg(out, sizeof(out)));
    softnda_send_wr w = wr(SOFTNDA_OP_SEND, 9, &o, 1);
    w.remote_srqn = srqn(s);
    ASSERT_EQ(postAndRing(&ini.sq, w), 0);
    EXPECT_EQ(waitOne(t.cqh).status, IBV_WC_SUCCESS);
    EXPECT_EQ(waitOne(xcq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_STREQ(in, out);
    EXPECT_EQ(softnda_vdev_ops.close_xrcd(shared), -EBUSY) << "its SRQ and target still use it";
    t.close();
    EXPECT_EQ(ext_->ops->destroy_srq(s.ext), 0);
    srqs_.clear();
    EXPECT_EQ(softnda_vdev_ops.close_xrcd(shared), 0);
}

// Two engine threads: two tenants' initiators (their doorbell pages, so their SQs, belong to
// different threads), each through its own target, fill one XRC SRQ at once. Every message lands
// in exactly one receive and every receive completes once on the SRQ's CQ.
class XrcTwoEngines : public Xrc {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"engine_threads", "2"}, {"spin_us", "20"}, {"sleep_us", "200"}};
    }
};

TEST_F(XrcTwoEngines, InitiatorsOnTwoThreadsShareOneSrq) {
    constexpr uint32_t kPer = 200;
    CqH big = makeCq(2 * kPer);
    SrqH s = makeXrcSrq(xrcd_, big, 2 * kPer);
    std::vector<uint64_t> in(2 * kPer, 0);
    ibv_mr *inmr = reg(in.data(), in.size() * 8);
    for (uint32_t i = 0; i < 2 * kPer; ++i) {
        softnda_sge r = sge(&in[i], 8, inmr);
        ASSERT_EQ(softnda_rq_post(&s.rq, i, &r, 1), 0);
    }
    softnda_rq_doorbell(&s.rq);
    Tenant t[2];
    QpH ini[2], tgt[2];
    std::vector<uint64_t> out[2];
    ibv_mr *outmr[2];
    for (int k = 0; k < 2; ++k) {
        ASSERT_NO_FATAL_FAILURE(t[k].open(cqAttr(2 * kPer)));
        ASSERT_NO_FATAL_FAILURE(t[k].makeXrcPair(arena().ops(), xrcd_, kPer, &ini[k], &tgt[k]));
        connectXrc(ini[k], tgt[k]);
        out[k].resize(kPer);
        for (uint32_t i = 0; i < kPer; ++i) {
            out[k][i] = (uint64_t{k + 1u} << 32) | i;
        }
        outmr[k] = t[k].reg(out[k].data(), kPer * 8);
    }
    std::thread senders[2];
    for (int k = 0; k < 2; ++k) {
        senders[k] = std::thread([&, k] {
            for (uint32_t i = 0; i < kPer; ++i) {
                softnda_sge o = sge(&out[k][i], 8, outmr[k]);
                softnda_send_wr w = wr(SOFTNDA_OP_SEND, i, &o, 1, 0);
                w.remote_srqn = srqn(s);
                ASSERT_EQ(postAndRing(&ini[k].sq, w), 0);
            }
        });
    }
    for (auto &th : senders) {
        th.join();
    }
    auto got = waitCqes(big.cq, 2 * kPer);
    ASSERT_EQ(got.size(), 2 * kPer);
    std::set<uint64_t> values;
    for (const softnda_cqe &c : got) {
        EXPECT_EQ(c.status, IBV_WC_SUCCESS);
        EXPECT_TRUE(c.qp_num == tgt[0].qpn() || c.qp_num == tgt[1].qpn());
        values.insert(in[c.wr_id]);
    }
    EXPECT_EQ(values.size(), 2 * kPer);  // each message once, each receive once
    EXPECT_EQ(values.count(0), 0u);
    for (Tenant &x : t) {
        x.close();
    }
}

}  // namespace
}  // namespace softnda_test
