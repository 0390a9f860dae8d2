// ibv_resize_cq on softnda (SPEC.md §12): completions not yet polled survive a grow and a shrink,
// in order, on any lap of either ring; a size below them is refused and changes nothing; a
// resize between the engine's passes while it completes work loses nothing (under TSan).
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class ResizeCq : public SoftndaTest {
  protected:
    void SetUp() override {
        SoftndaTest::SetUp();
        scq_ = makeCq(4);
        rcq_ = makeCq(4);
        QpCaps caps;
        caps.send_wr = 32;
        a_ = makeQp(scq_, rcq_, caps);
        connect(a_, a_);
    }

    // n signalled NOPs with wr_ids from first on, rung once; returns when the engine has
    // written all their CQEs (without polling them).
    void completeNops(uint64_t first, uint32_t n) {
        uint32_t target = __atomic_load_n(scq_.cq.dbr_pi, __ATOMIC_ACQUIRE) + n;
        for (uint32_t i = 0; i < n; ++i) {
            auto w = wr(SOFTNDA_OP_NOP, first + i, nullptr, 0);
            ASSERT_EQ(softnda_sq_post(&a_.sq, &w), 0);
        }
        softnda_sq_doorbell(&a_.sq);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (__atomic_load_n(scq_.cq.dbr_pi, __ATOMIC_ACQUIRE) != target &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::yield();
        }
        ASSERT_EQ(__atomic_load_n(scq_.cq.dbr_pi, __ATOMIC_ACQUIRE), target);
    }

    void expectPolled(uint64_t first, uint32_t n) {
        auto got = waitCqes(scq_.cq, n);
        ASSERT_EQ(got.size(), n);
        for (uint32_t i = 0; i < n; ++i) {
            EXPECT_EQ(got[i].wr_id, first + i);
            EXPECT_EQ(got[i].status, IBV_WC_SUCCESS);
        }
    }

    int resize(uint32_t cqe) {
        int rc = softnda_vdev_ops.resize_cq(scq_.ext, cqe);
        if (rc == 0) {
            EXPECT_EQ(softnda_cq_init(&scq_.cq, &scq_.ext->cq_info), 0);
        }
        return rc;
    }

    CqH scq_, rcq_;
    QpH a_;
};

TEST_F(ResizeCq, GrowKeepsWaitingCompletionsOnAnOddLap) {
    completeNops(0, 4);  // a full 4-entry CQ
    expectPolled(0, 2);
    completeNops(4, 2);  // CQEs 2..5 wait: 4 and 5 on the ring's second lap
    ASSERT_EQ(resize(8), 0);
    EXPECT_EQ(scq_.ext->cq->cqe, 8);
    EXPECT_EQ(scq_.cq.entry_cnt, 8u);
    EXPECT_EQ(scq_.cq.ci, 2u);  // indices carry over
    // Slots 6 and 7 next take CQEs 6 and 7 (first lap), slots 0 and 1 CQEs 8 and 9 (second lap,
    // where zeroed memory would read as written): none may show before the engine writes it.
    expectPolled(2, 4);
    EXPECT_TRUE(staysEmpty(scq_.cq));
    completeNops(6, 8);  // a whole new ring's worth, across its lap
    expectPolled(6, 8);
    completeNops(14, 8);
    expectPolled(14, 8);
    EXPECT_TRUE(staysEmpty(scq_.cq));
}

TEST_F(ResizeCq, ShrinkDownToTheWaitingCompletionsButNotBelow) {
    ASSERT_EQ(resize(32), 0);
    completeNops(0, 5);
    EXPECT_EQ(resize(4), -EINVAL);  // 5 wait: nothing changes
    EXPECT_EQ(scq_.ext->cq->cqe, 32);
    EXPECT_EQ(resize(0), -EINVAL);
    ASSERT_EQ(resize(5), 0);
    EXPECT_EQ(scq_.ext->cq->cqe, 8);
    expectPolled(0, 5);
    ASSERT_EQ(resize(2), 0);
    EXPECT_EQ(scq_.ext->cq->cqe, 2);
    completeNops(5, 2);
    expectPolled(5, 2);
    EXPECT_TRUE(staysEmpty(scq_.cq));
}

TEST_F(ResizeCq, AnOverflowedCqStaysInItsErrorState) {
    completeNops(0, 4);
    auto w = wr(SOFTNDA_OP_NOP, 4, nullptr, 0);
    ASSERT_EQ(postAndRing(&a_.sq, w), 0);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (softnda_cq_state(&scq_.cq) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
    }
    ASSERT_NE(softnda_cq_state(&scq_.cq), 0u);
    ASSERT_EQ(resize(16), 0);
    EXPECT_NE(softnda_cq_state(&scq_.cq), 0u);
    auto got = waitCqes(scq_.cq, 4);
    EXPECT_EQ(got.size(), 4u);
    softnda_cqe c;
    EXPECT_EQ(softnda_cq_poll(&scq_.cq, &c, 1), -EOVERFLOW);
}

// Resizes while the engine is still completing the batch just rung: each resize lands between
// two passes, and every completion arrives once, in order.
TEST_F(ResizeCq, ResizingWhileTheEngineCompletesLosesNothing) {
    ASSERT_EQ(resize(32), 0);
    uint64_t next = 0;
    for (int round = 0; round < 200; ++round) {
        for (uint32_t i = 0; i < 16; ++i) {
            auto w = wr(SOFTNDA_OP_NOP, next + i, nullptr, 0);
            ASSERT_EQ(softnda_sq_post(&a_.sq, &w), 0);
        }
        softnda_sq_doorbell(&a_.sq);
        ASSERT_EQ(resize(round % 2 == 0 ? 16 : 64), 0);
        auto got = waitCqes(scq_.cq, 16);
        ASSERT_EQ(got.size(), 16u);
        for (uint32_t i = 0; i < 16; ++i) {
            ASSERT_EQ(got[i].wr_id, next + i);
        }
        next += 16;
    }
    EXPECT_EQ(softnda_cq_state(&scq_.cq), 0u);
}

}  // namespace
}  // namespace softnda_test
