// UD and UC (SPEC.md §11): who receives a WQE, what a receiver sees (GRH, source QP and LID), and
// that nothing is acknowledged or retried: a message nobody takes is dropped, the sender completes.
#include <endian.h>

#include <set>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr uint32_t kQkey = 0x11111111;
constexpr uint32_t kMcastQpn = 0xffffff;  // the QPN a datagram to a multicast group names (IBA)

int modify(ibv_qp *qp, ibv_qp_attr a, int mask) {
    return softnda_vdev_ops.modify_qp(qp, &a, mask);
}

// UD: RESET -> INIT (P_Key index, port, Q_Key) -> RTR (nothing) -> RTS (SQ PSN).
int udUp(ibv_qp *qp, uint32_t qkey) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    if (int rc = modify(qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY); rc != 0) {
        return rc;
    }
    a.qp_state = IBV_QPS_RTR;
    if (int rc = modify(qp, a, IBV_QP_STATE); rc != 0) {
        return rc;
    }
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    return modify(qp, a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

// UC: RESET -> INIT -> RTR (AV, MTU, destination, RQ PSN) -> RTS (SQ PSN); no reliability attributes.
int ucUp(ibv_qp *qp, uint32_t dest) {
    if (int rc = toInit(qp, kAllAccess); rc != 0) {
        return rc;
    }
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.ah_attr.port_num = 1;
    if (int rc = modify(qp, a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN);
        rc != 0) {
        return rc;
    }
    a.qp_state = IBV_QPS_RTS;
    return modify(qp, a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

class Transport : public SoftndaTest {
  protected:
    void SetUp() override {
        SoftndaTest::SetUp();
        scq_ = makeCq();
        rcq_ = makeCq();
        ibv_port_attr port{};
        ASSERT_EQ(softnda_vdev_ops.query_port(ctx_, 1, &port), 0);
        lid_ = port.lid;
        src_.resize(8192);
        for (size_t i = 0; i < src_.size(); ++i) {
            src_[i] = static_cast<uint8_t>(i * 7 + 3);
        }
        dst_.assign(8192, 0xee);
        smr_ = reg(src_.data(), src_.size());
        dmr_ = reg(dst_.data(), dst_.size());
    }

    QpH makeTyped(ibv_qp_type type) {
        QpCaps c;
        c.type = type;
        return makeQp(scq_, rcq_, c);
    }

    // A signalled SEND of the first len bytes of src_ to a UD QP.
    softnda_send_wr udSend(uint64_t id, uint32_t len, uint32_t qpn, uint32_t qkey, uint16_t dlid) {
        s_ = sge(src_.data(), len, smr_);
        auto w = wr(SOFTNDA_OP_SEND, id, &s_, 1);
        softnda_send_wr_set_ud(&w, qpn, qkey, dlid);
        return w;
    }

    void postDst(QpH &q, uint64_t id, uint32_t len) {
        r_ = sge(dst_.data(), len, dmr_);
        ASSERT_EQ(postRecv(q, id, &r_, 1), 0);
    }

    CqH scq_, rcq_;
    uint16_t lid_ = 0;
    std::vector<uint8_t> src_, dst_;
    ibv_mr *smr_ = nullptr, *dmr_ = nullptr;
    softnda_sge s_{}, r_{};
};

TEST_F(Transport, CreatesRcUcAndUdButNotRawPacket) {
    QpH ud = makeTyped(IBV_QPT_UD);
    QpH uc = makeTyped(IBV_QPT_UC);
    EXPECT_EQ(ud.ext->qp->qp_type, IBV_QPT_UD);
    EXPECT_EQ(uc.ext->qp->qp_type, IBV_QPT_UC);
    auto a = qpAttr(scq_, rcq_);
    a.attr.qp_type = IBV_QPT_RAW_PACKET;  // XRC: xrc_test.cc
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(Transport, UdStateMachineNeedsAQkeyAndNoPeer) {
    QpH q = makeTyped(IBV_QPT_UD);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    // INIT without the Q_Key, or with the RC access flags, is refused.
    EXPECT_EQ(modify(q.ext->qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), -EINVAL);
    EXPECT_EQ(modify(q.ext->qp, a,
                     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY | IBV_QP_ACCESS_FLAGS),
              -EINVAL);
    // A privileged Q_Key is not for an unprivileged consumer.
    a.qkey = 0x80000001;
    EXPECT_EQ(modify(q.ext->qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), -EPERM);
    a.qkey = kQkey;
    ASSERT_EQ(modify(q.ext->qp, a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    a.qp_state = IBV_QPS_RTR;
    a.dest_qp_num = 5;
    EXPECT_EQ(modify(q.ext->qp, a, IBV_QP_STATE | IBV_QP_DEST_QPN), -EINVAL);  // no peer on UD
    ASSERT_EQ(modify(q.ext->qp, a, IBV_QP_STATE), 0);
    a.qp_state = IBV_QPS_RTS;
    EXPECT_EQ(modify(q.ext->qp, a, IBV_QP_STATE), -EINVAL);  // the SQ PSN is required
    ASSERT_EQ(modify(q.ext->qp, a, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(q.ext->qp, &got, IBV_QP_QKEY, &init), 0);
    EXPECT_EQ(got.qkey, kQkey);
    EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(init.qp_type, IBV_QPT_UD);
}

TEST_F(Transport, UdDatagramArrivesBehindAGrhWithItsSource) {
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    ASSERT_EQ(udUp(b.ext->qp, kQkey), 0);
    postDst(b, 9, SOFTNDA_GRH_SIZE + 1000);
    ASSERT_EQ(postOne(a, udSend(1, 1000, b.qpn(), kQkey, lid_)), 0);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.opcode, IBV_WC_RECV);
    EXPECT_EQ(r.wr_id, 9u);
    EXPECT_EQ(r.byte_len, SOFTNDA_GRH_SIZE + 1000);
    EXPECT_NE(r.flags & SOFTNDA_CQE_GRH, 0);
    EXPECT_EQ(r.qp_num, b.qpn());
    EXPECT_EQ(r.src_qp, a.qpn());
    EXPECT_EQ(softnda_cqe_slid(&r), lid_);
    EXPECT_EQ(std::memcmp(dst_.data() + SOFTNDA_GRH_SIZE, src_.data(), 1000), 0);
    EXPECT_EQ(dst_[SOFTNDA_GRH_SIZE + 1000], 0xee);
    // The GRH: IPv6, payload length, next header IBA, and both GIDs (fe80::<port GUID>).
    EXPECT_EQ(dst_[0] >> 4, 6);
    EXPECT_EQ((dst_[4] << 8) | dst_[5], 1000);
    EXPECT_EQ(dst_[6], 0x1b);
    ibv_gid_entry gid{};
    ASSERT_EQ(softnda_vdev_ops.query_gid(ctx_, 1, 0, &gid), 0);
    EXPECT_EQ(std::memcmp(dst_.data() + 8, gid.gid.raw, 16), 0);
    EXPECT_EQ(std::memcmp(dst_.data() + 24, gid.gid.raw, 16), 0);
    softnda_cqe s = waitOne(scq_.cq);
    EXPECT_EQ(s.status, IBV_WC_SUCCESS);
    EXPECT_EQ(s.opcode, IBV_WC_SEND);
}

TEST_F(Transport, UdPrivilegedRemoteQkeyMeansTheSendersOwn) {
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    ASSERT_EQ(udUp(b.ext->qp, kQkey), 0);
    postDst(b, 1, 4096 + SOFTNDA_GRH_SIZE);
    ASSERT_EQ(postOne(a, udSend(1, 16, b.qpn(), 0x80000000u, lid_)), 0);
    EXPECT_EQ(waitOne(rcq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
}

TEST_F(Transport, UdDatagramsNobodyTakesAreDroppedAndTheSenderCompletes) {
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    QpH rc = makeQp(scq_, rcq_);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    ASSERT_EQ(udUp(b.ext->qp, kQkey), 0);
    ASSERT_EQ(postOne(a, udSend(1, 8, b.qpn(), kQkey, lid_)), 0);  // no receive posted
    softnda_cqe first = waitOne(scq_.cq);
    EXPECT_EQ(first.wr_id, 1u);
    EXPECT_EQ(first.status, IBV_WC_SUCCESS);
    postDst(b, 7, 4096 + SOFTNDA_GRH_SIZE);
    ASSERT_EQ(postOne(a, udSend(2, 8, b.qpn(), kQkey + 1, lid_)), 0);  // wrong Q_Key
    ASSERT_EQ(postOne(a, udSend(3, 8, b.qpn(), kQkey, lid_ + 1)), 0);  // no such LID
    ASSERT_EQ(postOne(a, udSend(4, 8, 0xfffff0, kQkey, lid_)), 0);     // no such QP
    ASSERT_EQ(postOne(a, udSend(5, 8, rc.qpn(), kQkey, lid_)), 0);     // not a UD QP
    auto sent = waitCqes(scq_.cq, 4);
    ASSERT_EQ(sent.size(), 4u);
    for (size_t i = 0; i < sent.size(); ++i) {
        EXPECT_EQ(sent[i].wr_id, i + 2);
        EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS);
    }
    EXPECT_TRUE(staysEmpty(rcq_.cq));
    // The receive is still there for the next datagram that qualifies.
    ASSERT_EQ(postOne(a, udSend(6, 8, b.qpn(), kQkey, lid_)), 0);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.wr_id, 7u);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(qpState(b), IBV_QPS_RTS);
}

// Multicast (SPEC.md §11.3): a datagram to an MLID and the multicast QPN reaches every QP that
// joined a group with that MLID, behind a GRH whose DGID is the group's; a QP that left, or never
// joined, gets nothing; a unicast QPN to a multicast LID reaches nobody.
TEST_F(Transport, McastDatagramReachesEveryMemberAndNobodyElse) {
    ibv_gid mgid{};
    mgid.raw[0] = 0xff;
    mgid.raw[1] = 0x0e;
    mgid.raw[15] = 0x42;
    constexpr uint16_t kMlid = 0xc007;
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    QpH c = makeTyped(IBV_QPT_UD);
    QpH d = makeTyped(IBV_QPT_UD);
    for (QpH *q : {&a, &b, &c, &d}) {
        ASSERT_EQ(udUp(q->ext->qp, kQkey), 0);
    }
    ASSERT_EQ(softnda_vdev_ops.attach_mcast(b.ext, &mgid, kMlid), 0);
    ASSERT_EQ(softnda_vdev_ops.attach_mcast(c.ext, &mgid, kMlid), 0);
    softnda_sge rs[3];
    QpH *receivers[3] = {&b, &c, &d};
    for (size_t i = 0; i < 3; ++i) {
        rs[i] = sge(dst_.data() + i * 2048, 2048, dmr_);
        ASSERT_EQ(postRecv(*receivers[i], 100 + i, &rs[i], 1), 0);
    }
    ASSERT_EQ(postOne(a, udSend(1, 64, kMcastQpn, kQkey, kMlid)), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    auto got = waitCqes(rcq_.cq, 2);
    ASSERT_EQ(got.size(), 2u);
    std::set<uint32_t> qpns;
    for (const softnda_cqe &r : got) {
        EXPECT_EQ(r.status, IBV_WC_SUCCESS);
        EXPECT_EQ(r.byte_len, SOFTNDA_GRH_SIZE + 64);
        EXPECT_EQ(r.src_qp, a.qpn());
        EXPECT_NE(r.flags & SOFTNDA_CQE_GRH, 0);
        qpns.insert(r.qp_num);
        const uint8_t *buf = dst_.data() + (r.wr_id - 100) * 2048;
        EXPECT_EQ(std::memcmp(buf + 24, mgid.raw, 16), 0);  // DGID: the group's
        EXPECT_EQ(std::memcmp(buf + SOFTNDA_GRH_SIZE, src_.data(), 64), 0);
    }
    EXPECT_EQ(qpns, (std::set<uint32_t>{b.qpn(), c.qpn()}));
    EXPECT_TRUE(staysEmpty(rcq_.cq));  // d never joined

    // c leaves; the next datagram reaches b only, and a unicast QPN to the MLID nobody.
    ASSERT_EQ(softnda_vdev_ops.detach_mcast(c.ext, &mgid, kMlid), 0);
    ASSERT_EQ(postRecv(b, 103, &rs[0], 1), 0);
    ASSERT_EQ(postOne(a, udSend(2, 8, b.qpn(), kQkey, kMlid)), 0);
    ASSERT_EQ(postOne(a, udSend(3, 8, kMcastQpn, kQkey, kMlid)), 0);
    EXPECT_EQ(waitCqes(scq_.cq, 2).size(), 2u);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.qp_num, b.qpn());
    EXPECT_EQ(r.wr_id, 103u);
    EXPECT_TRUE(staysEmpty(rcq_.cq));
}

TEST_F(Transport, McastJoiningRulesAndLimits) {
    ibv_gid mgid{};
    mgid.raw[0] = 0xff;
    ibv_gid unicast{};
    unicast.raw[0] = 0xfe;
    QpH ud = makeTyped(IBV_QPT_UD);
    QpH rc = makeQp(scq_, rcq_);
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(rc.ext, &mgid, 0xc001), -EINVAL);  // UD only
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &unicast, 0xc001), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, lid_), -EINVAL);    // a unicast LID
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, 0xffff), -EINVAL);  // permissive
    EXPECT_EQ(softnda_vdev_ops.detach_mcast(ud.ext, &mgid, 0xc001), -EINVAL);  // not joined
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, 0xc001), 0);
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, 0xc001), 0);  // again: nothing changes
    EXPECT_EQ(softnda_vdev_ops.detach_mcast(ud.ext, &mgid, 0xc001), 0);
    EXPECT_EQ(softnda_vdev_ops.detach_mcast(ud.ext, &mgid, 0xc001), -EINVAL);  // left once
    for (uint16_t i = 0; i < 16; ++i) {
        mgid.raw[15] = static_cast<uint8_t>(i);
        ASSERT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, static_cast<uint16_t>(0xc100 + i)), 0);
    }
    mgid.raw[15] = 16;
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(ud.ext, &mgid, 0xc200), -ENOMEM);  // 16 groups per QP
    ibv_device_attr attr{};
    ASSERT_EQ(softnda_vdev_ops.query_device(ctx_, &attr), 0);
    EXPECT_GT(attr.max_mcast_grp, 0);
    EXPECT_GT(attr.max_mcast_qp_attach, 0);
    EXPECT_GE(attr.max_total_mcast_qp_attach, attr.max_mcast_qp_attach);
}

TEST_F(Transport, UdMessageOverTheMtuIsALocalLengthError) {
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    ASSERT_EQ(udUp(b.ext->qp, kQkey), 0);
    postDst(b, 1, 8192);
    ASSERT_EQ(postOne(a, udSend(1, 4097, b.qpn(), kQkey, lid_)), 0);
    softnda_cqe s = waitOne(scq_.cq);
    EXPECT_EQ(s.status, IBV_WC_LOC_LEN_ERR);
    EXPECT_EQ(qpState(a), IBV_QPS_ERR);
    EXPECT_TRUE(staysEmpty(rcq_.cq));
}

TEST_F(Transport, UdReceiveWithoutRoomForTheGrhFailsAtTheReceiver) {
    QpH a = makeTyped(IBV_QPT_UD);
    QpH b = makeTyped(IBV_QPT_UD);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    ASSERT_EQ(udUp(b.ext->qp, kQkey), 0);
    postDst(b, 1, 100);  // the payload fits, the GRH and the payload do not
    ASSERT_EQ(postOne(a, udSend(1, 100, b.qpn(), kQkey, lid_)), 0);
    EXPECT_EQ(waitOne(rcq_.cq).status, IBV_WC_LOC_LEN_ERR);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(qpState(b), IBV_QPS_ERR);
    EXPECT_EQ(qpState(a), IBV_QPS_RTS);
}

TEST_F(Transport, UdExecutesOnlySends) {
    QpH a = makeTyped(IBV_QPT_UD);
    ASSERT_EQ(udUp(a.ext->qp, kQkey), 0);
    s_ = sge(src_.data(), 8, smr_);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s_, 1);
    ASSERT_EQ(postOne(a, w), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_LOC_QP_OP_ERR);
}

TEST_F(Transport, UcSendAndWriteWithImmArrive) {
    QpH a = makeTyped(IBV_QPT_UC);
    QpH b = makeTyped(IBV_QPT_UC);
    ASSERT_EQ(ucUp(a.ext->qp, b.qpn()), 0);
    ASSERT_EQ(ucUp(b.ext->qp, a.qpn()), 0);
    postDst(b, 1, 4096);
    ASSERT_EQ(postOne(a, wr(SOFTNDA_OP_SEND, 1, &(s_ = sge(src_.data(), 3000, smr_)), 1)), 0);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.byte_len, 3000u);
    EXPECT_EQ(r.src_qp, a.qpn());
    EXPECT_EQ(r.flags & SOFTNDA_CQE_GRH, 0);
    EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 3000), 0);
    // A WRITE_WITH_IMM lands in the MR and consumes a receive.
    postDst(b, 2, 16);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE_WITH_IMM, 2, &(s_ = sge(src_.data() + 100, 500, smr_)), 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data()) + 5000;
    w.rkey = dmr_->rkey;
    w.imm_data = 0x1234;
    ASSERT_EQ(postOne(a, w), 0);
    r = waitOne(rcq_.cq);
    EXPECT_EQ(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(r.imm_data, 0x1234u);
    EXPECT_EQ(std::memcmp(dst_.data() + 5000, src_.data() + 100, 500), 0);
    auto sent = waitCqes(scq_.cq, 2);
    ASSERT_EQ(sent.size(), 2u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(sent[1].status, IBV_WC_SUCCESS);
}

TEST_F(Transport, UcDropsWhatThePeerCannotTakeAndNothingWaits) {
    QpH a = makeTyped(IBV_QPT_UC);
    QpH b = makeTyped(IBV_QPT_UC);
    ASSERT_EQ(ucUp(a.ext->qp, b.qpn()), 0);
    ASSERT_EQ(ucUp(b.ext->qp, a.qpn()), 0);
    // No receive posted; a WRITE with a bad rkey; then a peer that is gone.
    ASSERT_EQ(postOne(a, wr(SOFTNDA_OP_SEND, 1, &(s_ = sge(src_.data(), 8, smr_)), 1)), 0);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 2, &s_, 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst_.data());
    w.rkey = dmr_->rkey + 1;
    ASSERT_EQ(postOne(a, w), 0);
    auto sent = waitCqes(scq_.cq, 2);
    ASSERT_EQ(sent.size(), 2u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(sent[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(qpState(a), IBV_QPS_RTS);
    EXPECT_EQ(qpState(b), IBV_QPS_RTS);
    EXPECT_EQ(dst_[0], 0xee);
    destroyQp(b);
    ASSERT_EQ(postOne(a, wr(SOFTNDA_OP_SEND, 3, &s_, 1)), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.wr_id, 3u);
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);  // not a retry exhaustion: UC never retries
    EXPECT_TRUE(staysEmpty(rcq_.cq));
}

TEST_F(Transport, UcHasNoReadsAndNoReliabilityAttributes) {
    QpH a = makeTyped(IBV_QPT_UC);
    ASSERT_EQ(toInit(a.ext->qp, kAllAccess), 0);
    EXPECT_EQ(toRtr(a.ext->qp, a.qpn()), -EINVAL);  // MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER are RC's
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(modify(a.ext->qp, reset, IBV_QP_STATE), 0);
    ASSERT_EQ(ucUp(a.ext->qp, a.qpn()), 0);
    auto w = wr(SOFTNDA_OP_RDMA_READ, 1, &(s_ = sge(dst_.data(), 8, dmr_)), 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(src_.data());
    w.rkey = smr_->rkey;
    ASSERT_EQ(postOne(a, w), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_LOC_QP_OP_ERR);
}

}  // namespace
}  // namespace softnda_test
