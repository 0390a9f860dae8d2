// Every opcode end to end through the device-side helpers, data checked byte for byte.
#include <chrono>
#include <numeric>
#include <random>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937 rng(seed);
    for (auto &b : v) {
        b = static_cast<uint8_t>(rng());
    }
    return v;
}

class Opcodes : public QpPairTest {
  protected:
    void SetUp() override {
        QpPairTest::SetUp();
        connect(a_, b_);
    }
};

TEST_F(Opcodes, RdmaWriteGathersThreeSegments) {
    auto src = pattern(3000, 1);
    std::vector<uint8_t> dst(4096, 0xee);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    softnda_sge s[3] = {sge(src.data(), 1000, smr), sge(src.data() + 1000, 1500, smr),
                        sge(src.data() + 2500, 500, smr)};
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 77, s, 3);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + 10;
    w.rkey = dmr->rkey;
    ASSERT_EQ(postOne(a_, w), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(c.wr_id, 77u);
    EXPECT_EQ(c.qp_num, a_.qpn());
    EXPECT_EQ(std::memcmp(dst.data() + 10, src.data(), 3000), 0);
    EXPECT_EQ(dst[9], 0xee);
    EXPECT_EQ(dst[3010], 0xee);
    EXPECT_TRUE(staysEmpty(rcq_.cq));  // a plain WRITE consumes no receive
}

TEST_F(Opcodes, SendScattersIntoReceiveSegments) {
    auto src = pattern(1000, 2);
    std::vector<uint8_t> r1(300, 0), r2(800, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *m1 = reg(r1.data(), r1.size());
    ibv_mr *m2 = reg(r2.data(), r2.size());
    softnda_sge rs[2] = {sge(r1.data(), 300, m1), sge(r2.data(), 800, m2)};
    ASSERT_EQ(postRecv(b_, 555, rs, 2), 0);
    softnda_sge s[2] = {sge(src.data(), 600, smr), sge(src.data() + 600, 400, smr)};
    ASSERT_EQ(postOne(a_, wr(SOFTNDA_OP_SEND, 1, s, 2)), 0);
    softnda_cqe rc = waitOne(rcq_.cq);
    EXPECT_EQ(rc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc.opcode, IBV_WC_RECV);
    EXPECT_EQ(rc.wr_id, 555u);
    EXPECT_EQ(rc.byte_len, 1000u);
    EXPECT_EQ(rc.qp_num, b_.qpn());
    EXPECT_EQ(rc.src_qp, a_.qpn());
    EXPECT_EQ(rc.flags & SOFTNDA_CQE_WITH_IMM, 0);
    EXPECT_EQ(std::memcmp(r1.data(), src.data(), 300), 0);
    EXPECT_EQ(std::memcmp(r2.data(), src.data() + 300, 700), 0);
    EXPECT_EQ(r2[700], 0);
    softnda_cqe sc = waitOne(scq_.cq);
    EXPECT_EQ(sc.opcode, IBV_WC_SEND);
    EXPECT_EQ(sc.status, IBV_WC_SUCCESS);
}

TEST_F(Opcodes, SendWithImmediateAndSolicited) {
    uint64_t v = 0x1122334455667788ull, got = 0;
    ibv_mr *smr = reg(&v, 8);
    ibv_mr *rmr = reg(&got, 8);
    softnda_sge rs = sge(&got, 8, rmr);
    ASSERT_EQ(postRecv(b_, 9, &rs, 1), 0);
    softnda_sge s = sge(&v, 8, smr);
    auto w = wr(SOFTNDA_OP_SEND_WITH_IMM, 3, &s, 1, SOFTNDA_WQE_SIGNALED | SOFTNDA_WQE_SOLICITED);
    w.imm_data = 0xdeadbeef;
    ASSERT_EQ(postOne(a_, w), 0);
    softnda_cqe rc = waitOne(rcq_.cq);
    EXPECT_EQ(rc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc.opcode, IBV_WC_RECV);
    EXPECT_EQ(rc.imm_data, 0xdeadbeefu);
    EXPECT_EQ(rc.flags, SOFTNDA_CQE_WITH_IMM | SOFTNDA_CQE_SOLICITED);
    EXPECT_EQ(got, v);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
}

TEST_F(Opcodes, WriteWithImmediateConsumesOneReceive) {
    auto src = pattern(512, 3);
    std::vector<uint8_t> dst(512, 0), rbuf(16, 0x5a);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_mr *rmr = reg(rbuf.data(), rbuf.size());
    softnda_sge rs = sge(rbuf.data(), 16, rmr);
    ASSERT_EQ(postRecv(b_, 42, &rs, 1), 0);
    ASSERT_EQ(postRecv(b_, 43, &rs, 1), 0);
    softnda_sge s = sge(src.data(), 512, smr);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE_WITH_IMM, 5, &s, 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    w.rkey = dmr->rkey;
    w.imm_data = 1234;
    ASSERT_EQ(postOne(a_, w), 0);
    softnda_cqe rc = waitOne(rcq_.cq);
    EXPECT_EQ(rc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(rc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(rc.wr_id, 42u);
    EXPECT_EQ(rc.byte_len, 512u);
    EXPECT_EQ(rc.imm_data, 1234u);
    EXPECT_EQ(dst, src);
    EXPECT_EQ(rbuf, std::vector<uint8_t>(16, 0x5a));  // the receive buffer is not written
    EXPECT_EQ(__atomic_load_n(b_.rq.dbr_ci, __ATOMIC_ACQUIRE), 1u);
    EXPECT_EQ(waitOne(scq_.cq).opcode, IBV_WC_RDMA_WRITE);
}

TEST_F(Opcodes, RdmaReadIntoTwoSegments) {
    auto remote = pattern(2048, 4);
    std::vector<uint8_t> l1(1024, 0), l2(1024, 0);
    ibv_mr *rm = reg(remote.data(), remote.size());
    ibv_mr *m1 = reg(l1.data(), l1.size());
    ibv_mr *m2 = reg(l2.data(), l2.size());
    softnda_sge s[2] = {sge(l1.data(), 1024, m1), sge(l2.data(), 1000, m2)};
    auto w = wr(SOFTNDA_OP_RDMA_READ, 8, s, 2);
    w.remote_addr = reinterpret_cast<uintptr_t>(remote.data()) + 24;
    w.rkey = rm->rkey;
    ASSERT_EQ(postOne(a_, w), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(c.byte_len, 2024u);
    EXPECT_EQ(std::memcmp(l1.data(), remote.data() + 24, 1024), 0);
    EXPECT_EQ(std::memcmp(l2.data(), remote.data() + 24 + 1024, 1000), 0);
    EXPECT_EQ(l2[1000], 0);
}

TEST_F(Opcodes, AtomicsReturnTheOriginalValue) {
    alignas(8) uint64_t target[2] = {100, 7};
    alignas(8) uint64_t result[3] = {0, 0, 0};
    ibv_mr *tm = reg(target, sizeof(target));
    ibv_mr *rm = reg(result, sizeof(result));
    softnda_sge s0 = sge(&result[0], 8, rm), s1 = sge(&result[1], 8, rm), s2 = sge(&result[2], 8, rm);
    auto faa = wr(SOFTNDA_OP_ATOMIC_FETCH_AND_ADD, 1, &s0, 1);
    faa.remote_addr = reinterpret_cast<uintptr_t>(&target[0]);
    faa.rkey = tm->rkey;
    faa.compare_add = 23;
    auto cas_hit = wr(SOFTNDA_OP_ATOMIC_CMP_AND_SWP, 2, &s1, 1);
    cas_hit.remote_addr = reinterpret_cast<uintptr_t>(&target[1]);
    cas_hit.rkey = tm->rkey;
    cas_hit.compare_add = 7;
    cas_hit.swap = 70;
    auto cas_miss = cas_hit;
    cas_miss.wr_id = 3;
    cas_miss.sg_list = &s2;
    cas_miss.compare_add = 7;  // now 70: no swap
    cas_miss.swap = 700;
    ASSERT_EQ(softnda_sq_post(&a_.sq, &faa), 0);
    ASSERT_EQ(softnda_sq_post(&a_.sq, &cas_hit), 0);
    ASSERT_EQ(softnda_sq_post(&a_.sq, &cas_miss), 0);
    softnda_sq_doorbell(&a_.sq);
    auto cqes = waitCqes(scq_.cq, 3);
    ASSERT_EQ(cqes.size(), 3u);
    EXPECT_EQ(cqes[0].opcode, IBV_WC_FETCH_ADD);
    EXPECT_EQ(cqes[1].opcode, IBV_WC_COMP_SWAP);
    for (auto &c : cqes) {
        EXPECT_EQ(c.status, IBV_WC_SUCCESS);
        EXPECT_EQ(c.byte_len, 8u);
    }
    EXPECT_EQ(result[0], 100u);
    EXPECT_EQ(result[1], 7u);
    EXPECT_EQ(result[2], 70u);
    EXPECT_EQ(target[0], 123u);
    EXPECT_EQ(target[1], 70u);
}

TEST_F(Opcodes, InlineDataIsCopiedAtPostTime) {
    char msg[40] = "inline payload travels inside the WQE";
    std::vector<char> dst(64, 0), rbuf(64, 0);
    ibv_mr *dm = reg(dst.data(), dst.size());
    ibv_mr *rm = reg(rbuf.data(), rbuf.size());
    softnda_sge rs = sge(rbuf.data(), 64, rm);
    ASSERT_EQ(postRecv(b_, 1, &rs, 1), 0);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, nullptr, 0);
    w.inline_data = msg;
    w.inline_len = sizeof(msg);
    w.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    w.rkey = dm->rkey;
    auto s = wr(SOFTNDA_OP_SEND, 2, nullptr, 0);
    s.inline_data = msg;
    s.inline_len = sizeof(msg);
    ASSERT_EQ(softnda_sq_post(&a_.sq, &w), 0);
    ASSERT_EQ(softnda_sq_post(&a_.sq, &s), 0);
    char original[40];
    std::memcpy(original, msg, sizeof(msg));
    std::memset(msg, 'X', sizeof(msg));  // no MR, no later read of the source
    softnda_sq_doorbell(&a_.sq);
    auto c = waitCqes(scq_.cq, 2);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(c[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(dst.data(), original, sizeof(original)), 0);
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.byte_len, sizeof(original));
    EXPECT_EQ(std::memcmp(rbuf.data(), original, sizeof(original)), 0);
}

TEST_F(Opcodes, UnsignaledWorkRequestsCompleteSelectively) {
    std::vector<uint64_t> src(11), dst(11, 0);
    std::iota(src.begin(), src.end(), 1000);
    ibv_mr *sm = reg(src.data(), src.size() * 8);
    ibv_mr *dm = reg(dst.data(), dst.size() * 8);
    softnda_sge s[11];
    for (int i = 0; i < 11; ++i) {
        s[i] = sge(&src[static_cast<size_t>(i)], 8, sm);
        auto w =
            wr(SOFTNDA_OP_RDMA_WRITE, static_cast<uint64_t>(i), &s[i], 1, i == 10 ? SOFTNDA_WQE_SIGNALED : 0);
        w.remote_addr = reinterpret_cast<uintptr_t>(&dst[static_cast<size_t>(i)]);
        w.rkey = dm->rkey;
        ASSERT_EQ(softnda_sq_post(&a_.sq, &w), 0);
    }
    softnda_sq_doorbell(&a_.sq);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.wr_id, 10u);
    EXPECT_EQ(dst, src);
    EXPECT_EQ(__atomic_load_n(a_.sq.dbr_ci, __ATOMIC_ACQUIRE), 11u);
    EXPECT_TRUE(staysEmpty(scq_.cq));
}

TEST_F(Opcodes, SqSigAllSignalsEverything) {
    QpCaps caps;
    caps.sq_sig_all = 1;
    QpH x = makeQp(scq_, rcq_, caps);
    connect(x, x);  // a QP may talk to itself
    uint64_t v = 5, d = 0;
    ibv_mr *m = reg(&v, 8);
    ibv_mr *dm = reg(&d, 8);
    softnda_sge s = sge(&v, 8, m);
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 31, &s, 1, 0);
    w.remote_addr = reinterpret_cast<uintptr_t>(&d);
    w.rkey = dm->rkey;
    ASSERT_EQ(postOne(x, w), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.wr_id, 31u);
    EXPECT_EQ(d, 5u);
}

TEST_F(Opcodes, FencedWriteAfterReadSeesOrder) {
    uint64_t remote = 111, read_back = 0, newval = 222;
    ibv_mr *rm = reg(&remote, 8);
    ibv_mr *lm = reg(&read_back, 8);
    ibv_mr *nm = reg(&newval, 8);
    softnda_sge rs = sge(&read_back, 8, lm), ws = sge(&newval, 8, nm);
    auto rd = wr(SOFTNDA_OP_RDMA_READ, 1, &rs, 1);
    rd.remote_addr = reinterpret_cast<uintptr_t>(&remote);
    rd.rkey = rm->rkey;
    auto wrt = wr(SOFTNDA_OP_RDMA_WRITE, 2, &ws, 1, SOFTNDA_WQE_SIGNALED | SOFTNDA_WQE_FENCE);
    wrt.remote_addr = rd.remote_addr;
    wrt.rkey = rm->rkey;
    ASSERT_EQ(softnda_sq_post(&a_.sq, &rd), 0);
    ASSERT_EQ(softnda_sq_post(&a_.sq, &wrt), 0);
    softnda_sq_doorbell(&a_.sq);
    auto c = waitCqes(scq_.cq, 2);
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(read_back, 111u);
    EXPECT_EQ(remote, 222u);
}

TEST_F(Opcodes, SignaledNopCompletes) {
    ASSERT_EQ(postOne(a_, wr(SOFTNDA_OP_NOP, 99, nullptr, 0)), 0);
    softnda_cqe c = waitOne(scq_.cq);
    EXPECT_EQ(c.status, IBV_WC_SUCCESS);
    EXPECT_EQ(c.wr_id, 99u);
}

TEST_F(Opcodes, MrIovaDiffersFromHostAddress) {
    // A broker registers tenant memory under the tenant's address: WQEs carry iovas only.
    uint64_t src = 0xabcdef, dst = 0;
    ibv_mr *sm = softnda_vdev_ops.reg_mr(pd_, &src, 8, 0x100000, kAllAccess);
    ibv_mr *dm = softnda_vdev_ops.reg_mr(pd_, &dst, 8, 0x200000, kAllAccess);
    ASSERT_NE(sm, nullptr);
    ASSERT_NE(dm, nullptr);
    mrs_.push_back(sm);
    mrs_.push_back(dm);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(dm->addr), 0x200000u);
    softnda_sge s{0x100000, 8, sm->lkey};
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s, 1);
    w.remote_addr = 0x200000;
    w.rkey = dm->rkey;
    ASSERT_EQ(postOne(a_, w), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst, 0xabcdefu);
}

TEST_F(Opcodes, CountersReflectTheWork) {
    softnda_counters before{}, after{};
    ASSERT_EQ(softnda_query_counters("softnda0", &before), 0);
    uint64_t v = 1, d = 0;
    softnda_sge s;
    softnda_send_wr w = write8(&v, &d, &s);
    ASSERT_EQ(postOne(a_, w), 0);
    waitOne(scq_.cq);
    // The doorbell counts when the engine takes the register's new value (SPEC.md §7). CI once
    // read it unchanged right after the CQE, under load, though the engine counts before it runs
    // the WQE (cause not pinned down). A late count is waited for, up to 5 s; none still fails.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    do {
        ASSERT_EQ(softnda_query_counters("softnda0", &after), 0);
    } while (after.doorbells == before.doorbells && std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(after.wqes_executed - before.wqes_executed, 1u);
    EXPECT_EQ(after.bytes - before.bytes, 8u);
    EXPECT_GE(after.doorbells - before.doorbells, 1u);
    EXPECT_EQ(after.cqes - before.cqes, 1u);
    EXPECT_EQ(softnda_query_counters("nope0", &after), -ENODEV);
    EXPECT_EQ(softnda_query_counters(nullptr, &after), -EINVAL);
}

}  // namespace
}  // namespace softnda_test

namespace softnda_test {
namespace {

// Two tenants: a second context on the same device, its own PD, CQ and QP, connected by QPN.
TEST_F(Opcodes, LoopbackAcrossContexts) {
    ibv_context *ctx2 = softnda_vdev_ops.open_device("softnda0");
    ASSERT_NE(ctx2, nullptr);
    ibv_context_extend *ext2 = softnda_driver_ops.alloc_context(ctx2);
    ibv_pd *pd2 = softnda_vdev_ops.alloc_pd(ctx2);
    ASSERT_TRUE(ext2 && pd2);
    auto ca = cqAttr(16);
    ibv_cq_extend *cq2 = ext2->ops->create_cq(ctx2, &ca);
    ASSERT_NE(cq2, nullptr);
    // Objects of one context are refused in the other.
    CqH foreign;
    foreign.ext = cq2;
    auto bad = qpAttr(foreign, foreign);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &bad), nullptr);
    EXPECT_EQ(errno, EINVAL);
    auto qa = qpAttr(foreign, foreign);
    qa.pd = pd2;
    ibv_qp_extend *q2 = ext2->ops->create_qp(ctx2, &qa);
    ASSERT_NE(q2, nullptr);
    // Each context has its own doorbell pages.
    auto page = [](const queue_info &qi) {
        return reinterpret_cast<uintptr_t>(qi.db_hw_va.iov_base) & ~uintptr_t{4095};
    };
    EXPECT_NE(page(q2->sq_info), page(a_.ext->sq_info));

    QpH t2;
    t2.ext = q2;
    ASSERT_EQ(softnda_sq_init(&t2.sq, &q2->sq_info), 0);
    ASSERT_EQ(toInit(q2->qp, kAllAccess), 0);
    ASSERT_EQ(toRtr(q2->qp, a_.qpn()), 0);
    ASSERT_EQ(toRts(q2->qp), 0);
    // Re-point a_ at the other tenant's QP.
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(softnda_vdev_ops.modify_qp(a_.ext->qp, &r, IBV_QP_STATE), 0);
    ASSERT_EQ(toInit(a_.ext->qp, kAllAccess), 0);
    ASSERT_EQ(toRtr(a_.ext->qp, q2->qp->qp_num), 0);
    ASSERT_EQ(toRts(a_.ext->qp), 0);

    uint64_t src = 0x7e11a7, dst = 0;
    ibv_mr *sm = softnda_vdev_ops.reg_mr(pd2, &src, 8, reinterpret_cast<uintptr_t>(&src), kAllAccess);
    ibv_mr *dm = reg(&dst, 8);
    ASSERT_NE(sm, nullptr);
    softnda_sge s{reinterpret_cast<uintptr_t>(&src), 8, sm->lkey};
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s, 1);
    w.remote_addr = reinterpret_cast<uintptr_t>(&dst);
    w.rkey = dm->rkey;
    ASSERT_EQ(postOne(t2, w), 0);
    softnda_cq c2;
    ASSERT_EQ(softnda_cq_init(&c2, &cq2->cq_info), 0);
    EXPECT_EQ(waitOne(c2).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst, 0x7e11a7u);

    EXPECT_EQ(softnda_vdev_ops.close_device(ctx2), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(sm), 0);
    EXPECT_EQ(ext2->ops->destroy_qp(q2), 0);
    EXPECT_EQ(ext2->ops->destroy_cq(cq2), 0);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd2), 0);
    softnda_driver_ops.free_context(ext2);
    EXPECT_EQ(softnda_vdev_ops.close_device(ctx2), 0);
}

// A WRITE or READ of zero bytes names no memory (IBA C9-88): whatever its rkey and address, it
// completes, and a zero-length WRITE_WITH_IMM still delivers its immediate into a receive.
TEST_F(Opcodes, ZeroLengthRdmaChecksNoRkey) {
    uint64_t word = 0;
    ibv_mr *mr = reg(&word, sizeof(word));
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, nullptr, 0);
    w.remote_addr = 0xdead0000;
    w.rkey = 0xbad;
    ASSERT_EQ(postOne(a_, w), 0);
    auto r = wr(SOFTNDA_OP_RDMA_READ, 2, nullptr, 0);
    r.remote_addr = 0;
    r.rkey = 0;
    ASSERT_EQ(postOne(a_, r), 0);
    softnda_sge rs = sge(&word, 8, mr);
    ASSERT_EQ(postRecv(b_, 30, &rs, 1), 0);
    auto wi = wr(SOFTNDA_OP_RDMA_WRITE_WITH_IMM, 3, nullptr, 0);
    wi.rkey = 0x5eed;
    wi.imm_data = 77;
    ASSERT_EQ(postOne(a_, wi), 0);
    auto done = waitCqes(scq_.cq, 3);
    ASSERT_EQ(done.size(), 3u);
    for (size_t i = 0; i < done.size(); ++i) {
        EXPECT_EQ(done[i].wr_id, i + 1);
        EXPECT_EQ(done[i].status, IBV_WC_SUCCESS);
        EXPECT_EQ(done[i].byte_len, 0u);
    }
    softnda_cqe got = waitOne(rcq_.cq);
    EXPECT_EQ(got.status, IBV_WC_SUCCESS);
    EXPECT_EQ(got.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(got.imm_data, 77u);
    EXPECT_EQ(got.byte_len, 0u);
    EXPECT_EQ(qpState(b_), IBV_QPS_RTS);
}

}  // namespace
}  // namespace softnda_test
