// Completion timestamps on softnda (SPEC.md §15): a CQ asked for them has 64-byte entries whose
// times lie between what the device clock read before the work and after its completion, never
// decrease in CQE order, and survive a resize; any other CQ keeps 32-byte entries.
#include <time.h>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class Timestamps : public SoftndaTest {
  protected:
    // n signalled NOPs on a loopback QP whose send CQ is scq; their CQEs with their times.
    void runNops(CqH &scq, uint32_t n, std::vector<softnda_cqe> *cqes,
                 std::vector<softnda_cqe_times> *times) {
        CqH rcq = makeCq(4);
        QpH qp = makeQp(scq, rcq);
        connect(qp, qp);
        for (uint32_t i = 0; i < n; ++i) {
            auto w = wr(SOFTNDA_OP_NOP, i, nullptr, 0);
            ASSERT_EQ(softnda_sq_post(&qp.sq, &w), 0);
        }
        softnda_sq_doorbell(&qp.sq);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        softnda_cqe c[8];
        softnda_cqe_times t[8];
        while (cqes->size() < n && std::chrono::steady_clock::now() < deadline) {
            int got = softnda_cq_poll_times(&scq.cq, c, t, 8);
            ASSERT_GE(got, 0);
            cqes->insert(cqes->end(), c, c + got);
            times->insert(times->end(), t, t + got);
        }
        ASSERT_EQ(cqes->size(), n);
    }
};

TEST_F(Timestamps, EitherFlagMakesSixtyFourByteEntriesAndOthersStayThirtyTwo) {
    EXPECT_EQ(makeCq(8, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP).ext->cq_info.qbuf.entry_size,
              SOFTNDA_CQE_TS_SIZE);
    EXPECT_EQ(makeCq(8, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK).ext->cq_info.qbuf.entry_size,
              SOFTNDA_CQE_TS_SIZE);
    EXPECT_EQ(makeCq(8, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM).ext->cq_info.qbuf.entry_size,
              SOFTNDA_CQE_SIZE);
    EXPECT_EQ(makeCq(8).ext->cq_info.qbuf.entry_size, SOFTNDA_CQE_SIZE);
}

TEST_F(Timestamps, TimesLieBetweenTheClockBeforeAndAfterAndNeverDecrease) {
    CqH scq = makeCq(64, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);
    const uint64_t mono0 = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    const uint64_t real0 = softnda_clock_ns(SOFTNDA_CLOCK_WALL);
    std::vector<softnda_cqe> cqes;
    std::vector<softnda_cqe_times> times;
    ASSERT_NO_FATAL_FAILURE(runNops(scq, 40, &cqes, &times));
    const uint64_t mono1 = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    const uint64_t real1 = softnda_clock_ns(SOFTNDA_CLOCK_WALL);
    for (size_t i = 0; i < cqes.size(); ++i) {
        EXPECT_EQ(cqes[i].wr_id, i);
        EXPECT_EQ(cqes[i].status, IBV_WC_SUCCESS);
        EXPECT_GE(times[i].completion, mono0);
        EXPECT_LE(times[i].completion, mono1);
        EXPECT_GE(times[i].wallclock, real0);
        EXPECT_LE(times[i].wallclock, real1);
        EXPECT_EQ(times[i].resv[0] | times[i].resv[1], 0u);
        if (i > 0) {
            EXPECT_GE(times[i].completion, times[i - 1].completion);
        }
    }
}

TEST_F(Timestamps, AResizeKeepsTheEntrySizeAndTheWaitingCompletionsTimes) {
    CqH scq = makeCq(8, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP);
    CqH rcq = makeCq(4);
    QpH qp = makeQp(scq, rcq);
    connect(qp, qp);
    const uint64_t before = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    for (uint64_t i = 0; i < 3; ++i) {
        auto w = wr(SOFTNDA_OP_NOP, i, nullptr, 0);
        ASSERT_EQ(softnda_sq_post(&qp.sq, &w), 0);
    }
    softnda_sq_doorbell(&qp.sq);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(scq.cq.dbr_pi, __ATOMIC_ACQUIRE) != 3 &&
           std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
    }
    const uint64_t after = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    ASSERT_EQ(softnda_vdev_ops.resize_cq(scq.ext, 32), 0);
    ASSERT_EQ(scq.ext->cq_info.qbuf.entry_size, SOFTNDA_CQE_TS_SIZE);
    ASSERT_EQ(softnda_cq_init(&scq.cq, &scq.ext->cq_info), 0);
    softnda_cqe c[3];
    softnda_cqe_times t[3];
    ASSERT_EQ(softnda_cq_poll_times(&scq.cq, c, t, 3), 3);
    for (uint64_t i = 0; i < 3; ++i) {
        EXPECT_EQ(c[i].wr_id, i);
        EXPECT_GE(t[i].completion, before);  // written before the resize, moved with it
        EXPECT_LE(t[i].completion, after);
    }
}

}  // namespace
}  // namespace softnda_test

// The header names the clocks by their Linux ids; they must be the ones POSIX names.
static_assert(SOFTNDA_CLOCK_DEVICE == CLOCK_MONOTONIC);
static_assert(SOFTNDA_CLOCK_WALL == CLOCK_REALTIME);
