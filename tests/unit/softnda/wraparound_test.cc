// Index wraparound: every queue kind (SQ, RQ, SRQ, CQ) carries more than 2 x 2^16 entries
// through a 16-entry ring, payload order checked on every message.
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr uint32_t kMessages = 2 * 65536 + 4096;
constexpr uint32_t kDepth = 16;
constexpr uint32_t kBatch = 8;

class Wraparound : public SoftndaTest {
  protected:
    void pump(bool use_srq) {
        CqH scq = makeCq(kDepth);
        CqH rcq = makeCq(kDepth);
        ASSERT_EQ(scq.cq.entry_cnt, kDepth);
        SrqH srq;
        if (use_srq) {
            srq = makeSrq(kDepth, 1);
        }
        QpCaps caps;
        caps.send_wr = kDepth;
        caps.recv_wr = kDepth;
        QpH a = makeQp(scq, rcq, caps);
        QpH b = makeQp(scq, rcq, caps, use_srq ? srq.ext : nullptr);
        connect(a, b);
        softnda_rq &rq = use_srq ? srq.rq : b.rq;
        ASSERT_EQ(rq.entry_cnt, kDepth);
        ASSERT_EQ(a.sq.entry_cnt, kDepth);
        std::vector<uint64_t> out(kBatch), in(kBatch);
        ibv_mr *om = reg(out.data(), out.size() * 8);
        ibv_mr *im = reg(in.data(), in.size() * 8);
        uint64_t next_expected = 0;
        for (uint32_t sent = 0; sent < kMessages; sent += kBatch) {
            for (uint32_t i = 0; i < kBatch; ++i) {
                softnda_sge rs = sge(&in[i], 8, im);
                ASSERT_EQ(softnda_rq_post(&rq, i, &rs, 1), 0);
                out[i] = sent + i;
                softnda_sge ss = sge(&out[i], 8, om);
                auto w = wr(SOFTNDA_OP_SEND, sent + i, &ss, 1);
                ASSERT_EQ(softnda_sq_post(&a.sq, &w), 0);
            }
            softnda_rq_doorbell(&rq);
            softnda_sq_doorbell(&a.sq);
            auto r = waitCqes(rcq.cq, kBatch);
            ASSERT_EQ(r.size(), kBatch);
            for (uint32_t i = 0; i < kBatch; ++i) {
                ASSERT_EQ(r[i].status, IBV_WC_SUCCESS);
                ASSERT_EQ(r[i].wr_id, i);
                ASSERT_EQ(in[i], next_expected++);
            }
            auto s = waitCqes(scq.cq, kBatch);
            ASSERT_EQ(s.size(), kBatch);
            ASSERT_EQ(s[kBatch - 1].wr_id, sent + kBatch - 1);
        }
        EXPECT_EQ(__atomic_load_n(a.sq.dbr_ci, __ATOMIC_ACQUIRE), kMessages);
        EXPECT_EQ(__atomic_load_n(rq.dbr_ci, __ATOMIC_ACQUIRE), kMessages);
        EXPECT_EQ(scq.cq.ci, kMessages);
        EXPECT_EQ(rcq.cq.ci, kMessages);
        EXPECT_EQ(softnda_cq_state(&scq.cq), 0u);
    }
};

TEST_F(Wraparound, SqRqAndCqs) {
    pump(false);
}
TEST_F(Wraparound, SrqAndCqs) {
    pump(true);
}

}  // namespace
}  // namespace softnda_test
