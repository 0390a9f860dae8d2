// Completion and async events (SPEC.md §9): arming a CQ through its doorbell record, the events
// and fatal_events counters, and the eventfds of set_cq_event_fd / set_async_event_fd.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr uint32_t kArmNext = 1;
constexpr uint32_t kArmSolicited = 2;

// Doorbell-record words of SPEC.md §1.1, as u32 indexes from dbr_pi.
uint32_t *armWord(softnda_cq &cq) {
    return cq.dbr_pi + 2;
}
uint32_t eventsOf(softnda_cq &cq) {
    return __atomic_load_n(cq.dbr_pi + 3, __ATOMIC_ACQUIRE);
}
uint32_t fatalEventsOf(const QpH &q) {
    return __atomic_load_n(q.sq.dbr_pi + 2, __ATOMIC_ACQUIRE);
}
void arm(softnda_cq &cq, uint32_t how) {
    __atomic_store_n(armWord(cq), how, __ATOMIC_RELEASE);
}

// An eventfd this test owns.
class EventFd {
  public:
    EventFd() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) { EXPECT_GE(fd_, 0); }
    ~EventFd() {
        if (fd_ >= 0) {
            close(fd_);
        }
    }
    EventFd(const EventFd &) = delete;
    EventFd &operator=(const EventFd &) = delete;
    int fd() const { return fd_; }
    // What poll() says now, without waiting.
    bool readableNow() const { return waitReadable(0); }
    // Waits (a generous deadline, only against a hang) until poll() reports it readable.
    bool waitReadable(int timeout_ms = 20000) const {
        pollfd p{fd_, POLLIN, 0};
        return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
    }
    // Reads and resets the counter: how many signals arrived (0 when none).
    uint64_t take() const {
        uint64_t v = 0;
        return read(fd_, &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v)) ? v : 0;
    }

  private:
    int fd_;
};

// The eventfds open in this process (what the device dups shows up here; the memfd arena's
// files do not).
size_t openEventFds() {
    size_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    EXPECT_NE(d, nullptr);
    if (d == nullptr) {
        return 0;
    }
    while (dirent *e = readdir(d)) {
        char link[300];
        char target[64];
        snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(link, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strcmp(target, "anon_inode:[eventfd]") == 0 ? 1 : 0;
        }
    }
    closedir(d);
    return n;
}

class Events : public QpPairTest {
  protected:
    void SetUp() override {
        QpPairTest::SetUp();
        sentinel_cq_ = makeCq();
        sentinel_ = makeQp(sentinel_cq_, sentinel_cq_);
        connect(sentinel_, sentinel_);
        makeBuffers(4096, 0x22);
    }

    static int setCqFd(const CqH &cq, int fd) { return softnda_vdev_ops.set_cq_event_fd(cq.ext->cq, fd); }
    int setAsyncFd(int fd) { return softnda_vdev_ops.set_async_event_fd(ctx_, fd); }

    // A signalled WRITE on a_, waited for on scq_.
    softnda_cqe writeOnA(uint64_t id) {
        EXPECT_EQ(postOne(a_, write(id, 8, dmr_->rkey)), 0);
        return waitOne(scq_.cq);
    }

    // Returns once the engine finished everything posted before: one engine thread handles
    // every queue in order, so when a NOP posted now completes, the arm checks of all CQEs
    // already polled are done. Lets a test assert that something did NOT happen.
    void settle() {
        ASSERT_EQ(postOne(sentinel_, wr(SOFTNDA_OP_NOP, 99, nullptr, 0)), 0);
        ASSERT_EQ(waitOne(sentinel_cq_.cq).status, IBV_WC_SUCCESS);
    }

    CqH sentinel_cq_;
    QpH sentinel_;
};

TEST_F(Events, OneArmingRaisesExactlyOneEvent) {
    EventFd efd;
    ASSERT_EQ(setCqFd(scq_, efd.fd()), 0);
    connect(a_, b_);
    arm(scq_.cq, kArmNext);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
    EXPECT_EQ(eventsOf(scq_.cq), 1u);
    EXPECT_EQ(__atomic_load_n(armWord(scq_.cq), __ATOMIC_ACQUIRE), 0u);  // disarmed by the device
    // Not re-armed: later completions raise nothing.
    EXPECT_EQ(writeOnA(2).status, IBV_WC_SUCCESS);
    EXPECT_EQ(writeOnA(3).status, IBV_WC_SUCCESS);
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(eventsOf(scq_.cq), 1u);
    // Re-armed: exactly one more.
    arm(scq_.cq, kArmNext);
    EXPECT_EQ(writeOnA(4).status, IBV_WC_SUCCESS);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
    EXPECT_EQ(eventsOf(scq_.cq), 2u);
}

TEST_F(Events, CqeBeforeArmingRaisesNothing) {
    EventFd efd;
    ASSERT_EQ(setCqFd(scq_, efd.fd()), 0);
    connect(a_, b_);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);
    settle();
    arm(scq_.cq, kArmNext);  // after the CQE: nothing is raised for it
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(eventsOf(scq_.cq), 0u);
    EXPECT_EQ(__atomic_load_n(armWord(scq_.cq), __ATOMIC_ACQUIRE), kArmNext);  // still armed
    EXPECT_EQ(writeOnA(2).status, IBV_WC_SUCCESS);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
}

TEST_F(Events, SolicitedOnlyWaitsForASolicitedReceive) {
    EventFd efd;
    ASSERT_EQ(setCqFd(rcq_, efd.fd()), 0);
    connect(a_, b_);
    softnda_sge rs = sge(dst_.data(), 64, dmr_);
    for (uint64_t i = 0; i < 2; ++i) {
        ASSERT_EQ(postRecv(b_, 100 + i, &rs, 1), 0);
    }
    arm(rcq_.cq, kArmSolicited);
    s_ = sge(src_.data(), 8, smr_);
    ASSERT_EQ(postOne(a_, wr(SOFTNDA_OP_SEND, 1, &s_, 1)), 0);  // unsolicited
    softnda_cqe r = waitOne(rcq_.cq);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.flags & SOFTNDA_CQE_SOLICITED, 0);
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(eventsOf(rcq_.cq), 0u);
    EXPECT_EQ(__atomic_load_n(armWord(rcq_.cq), __ATOMIC_ACQUIRE), kArmSolicited);
    ASSERT_EQ(postOne(a_, wr(SOFTNDA_OP_SEND, 2, &s_, 1, SOFTNDA_WQE_SIGNALED | SOFTNDA_WQE_SOLICITED)), 0);
    r = waitOne(rcq_.cq);
    EXPECT_NE(r.flags & SOFTNDA_CQE_SOLICITED, 0);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
    EXPECT_EQ(eventsOf(rcq_.cq), 1u);
    ASSERT_EQ(waitCqes(scq_.cq, 2).size(), 2u);
}

TEST_F(Events, SolicitedOnlyIsRaisedByAnErrorCompletion) {
    EventFd efd;
    ASSERT_EQ(setCqFd(scq_, efd.fd()), 0);
    connect(a_, b_);
    arm(scq_.cq, kArmSolicited);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);  // a send completion never qualifies
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(postOne(a_, write(2, 8, dmr_->rkey ^ 0x5a5a00)), 0);  // no such rkey
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_REM_ACCESS_ERR);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
    EXPECT_EQ(eventsOf(scq_.cq), 1u);
}

TEST_F(Events, ArmedCqWithoutAnFdStillCountsEvents) {
    connect(a_, b_);
    arm(scq_.cq, kArmNext);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);
    settle();
    EXPECT_EQ(eventsOf(scq_.cq), 1u);
    EXPECT_EQ(__atomic_load_n(armWord(scq_.cq), __ATOMIC_ACQUIRE), 0u);
}

TEST_F(Events, ErrorTransitionsRaiseFatalEventsModifyToErrDoesNot) {
    EventFd efd;
    ASSERT_EQ(setAsyncFd(efd.fd()), 0);
    connect(a_, b_);
    // A bad rkey: the requester moves to ERR, and so does the responder (REM_ACCESS_ERR).
    EXPECT_EQ(postOne(a_, write(1, 8, dmr_->rkey ^ 0x5a5a00)), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_REM_ACCESS_ERR);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(fatalEventsOf(a_), 1u);
    EXPECT_EQ(fatalEventsOf(b_), 1u);
    EXPECT_EQ(efd.take(), 2u);  // both were in ERR before the error CQE was visible
    // The flush of later work on a QP already in ERR raises nothing more.
    EXPECT_EQ(postOne(a_, write(2, 8, dmr_->rkey)), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_WR_FLUSH_ERR);
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(fatalEventsOf(a_), 1u);

    // modify_qp to ERR is the consumer's own doing: no fatal event, even with work flushed.
    CqH cq = makeCq();
    QpH x = makeQp(cq, cq);
    QpH y = makeQp(cq, cq);
    connect(x, y);
    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(softnda_vdev_ops.modify_qp(x.ext->qp, &at, IBV_QP_STATE), 0);
    EXPECT_EQ(postOne(x, write(3, 8, dmr_->rkey)), 0);
    EXPECT_EQ(waitOne(cq.cq).status, IBV_WC_WR_FLUSH_ERR);
    settle();
    EXPECT_FALSE(efd.readableNow());
    EXPECT_EQ(fatalEventsOf(x), 0u);
    EXPECT_EQ(fatalEventsOf(y), 0u);
}

TEST_F(Events, ReceiveErrorRaisesTheResponderFatalEvent) {
    EventFd efd;
    ASSERT_EQ(setAsyncFd(efd.fd()), 0);
    connect(a_, b_);
    softnda_sge tiny = sge(dst_.data(), 4, dmr_);  // too short for the 8-byte SEND
    ASSERT_EQ(postRecv(b_, 7, &tiny, 1), 0);
    s_ = sge(src_.data(), 8, smr_);
    ASSERT_EQ(postOne(a_, wr(SOFTNDA_OP_SEND, 1, &s_, 1)), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_REM_INV_REQ_ERR);
    EXPECT_EQ(waitOne(rcq_.cq).status, IBV_WC_LOC_LEN_ERR);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(fatalEventsOf(a_), 1u);
    EXPECT_EQ(fatalEventsOf(b_), 1u);
}

TEST_F(Events, SrqLimitSignalsTheAsyncFd) {
    EventFd efd;
    ASSERT_EQ(setAsyncFd(efd.fd()), 0);
    SrqH srq = makeSrq(16, 1, 2);
    QpH x = makeQp(scq_, rcq_);
    QpH y = makeQp(scq_, rcq_, QpCaps{}, srq.ext);
    connect(x, y);
    softnda_sge rs = sge(dst_.data(), 64, dmr_);
    for (uint64_t i = 0; i < 3; ++i) {
        ASSERT_EQ(softnda_rq_post(&srq.rq, i, &rs, 1), 0);
    }
    softnda_rq_doorbell(&srq.rq);
    s_ = sge(src_.data(), 8, smr_);
    ASSERT_EQ(postOne(x, wr(SOFTNDA_OP_SEND, 1, &s_, 1)), 0);  // 2 left: not below the limit
    ASSERT_EQ(waitCqes(rcq_.cq, 1).size(), 1u);
    settle();
    EXPECT_FALSE(efd.readableNow());
    ASSERT_EQ(postOne(x, wr(SOFTNDA_OP_SEND, 2, &s_, 1)), 0);  // 1 left: the limit event
    ASSERT_EQ(waitCqes(rcq_.cq, 1).size(), 1u);
    ASSERT_TRUE(efd.waitReadable());
    EXPECT_EQ(efd.take(), 1u);
    EXPECT_EQ(softnda_srq_limit_events(&srq.rq), 1u);
    EXPECT_EQ(fatalEventsOf(x), 0u);
    ASSERT_EQ(waitCqes(scq_.cq, 2).size(), 2u);
}

TEST_F(Events, DetachedFdIsNoLongerSignalled) {
    EventFd efd;
    ASSERT_EQ(setCqFd(scq_, efd.fd()), 0);
    ASSERT_EQ(setCqFd(scq_, -1), 0);
    ASSERT_EQ(setCqFd(scq_, -1), 0);  // detaching twice is fine
    connect(a_, b_);
    arm(scq_.cq, kArmNext);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);
    settle();
    EXPECT_EQ(eventsOf(scq_.cq), 1u);  // raised, but nobody is told
    EXPECT_FALSE(efd.readableNow());
}

TEST_F(Events, ReplacingTheFdSignalsOnlyTheNewOne) {
    EventFd first, second;
    ASSERT_EQ(setCqFd(scq_, first.fd()), 0);
    ASSERT_EQ(setCqFd(scq_, second.fd()), 0);
    connect(a_, b_);
    arm(scq_.cq, kArmNext);
    EXPECT_EQ(writeOnA(1).status, IBV_WC_SUCCESS);
    ASSERT_TRUE(second.waitReadable());
    EXPECT_EQ(second.take(), 1u);
    EXPECT_FALSE(first.readableNow());
}

TEST_F(Events, TheDeviceKeepsItsOwnCopyAndClosesIt) {
    const size_t before = openEventFds();
    CqH cq = makeCq();
    {
        EventFd efd;
        ASSERT_EQ(setCqFd(cq, efd.fd()), 0);
        ASSERT_EQ(setAsyncFd(efd.fd()), 0);
        EXPECT_EQ(openEventFds(), before + 3);  // ours and the device's two dups
    }
    EXPECT_EQ(openEventFds(), before + 2);  // the device's outlive the caller's
    ASSERT_EQ(setAsyncFd(-1), 0);
    EXPECT_EQ(openEventFds(), before + 1);
    ASSERT_EQ(ext_->ops->destroy_cq(cq.ext), 0);  // destroy closes the CQ's
    cqs_.erase(std::find(cqs_.begin(), cqs_.end(), cq.ext));
    EXPECT_EQ(openEventFds(), before);
}

TEST_F(Events, ClosingAContextClosesItsAsyncFd) {
    const size_t before = openEventFds();
    ibv_context *other = softnda_vdev_ops.open_device("softnda0");
    ASSERT_NE(other, nullptr);
    {
        EventFd efd;
        ASSERT_EQ(softnda_vdev_ops.set_async_event_fd(other, efd.fd()), 0);
    }
    EXPECT_GT(openEventFds(), before);
    ASSERT_EQ(softnda_vdev_ops.close_device(other), 0);
    EXPECT_EQ(openEventFds(), before);
}

TEST_F(Events, RefusesWhatIsNotAnEventFd) {
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    // The engine writes 8 bytes per event: a pipe (which can fill and block) is refused.
    EXPECT_EQ(setCqFd(scq_, p[1]), -EINVAL);
    EXPECT_EQ(setAsyncFd(p[1]), -EINVAL);
    close(p[0]);
    close(p[1]);
    EXPECT_EQ(setCqFd(scq_, p[1]), -EBADF);  // closed now
    EXPECT_EQ(setCqFd(scq_, -2), -EBADF);
    EXPECT_EQ(setAsyncFd(-7), -EBADF);
    EXPECT_EQ(softnda_vdev_ops.set_cq_event_fd(nullptr, -1), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.set_async_event_fd(nullptr, -1), -EINVAL);
}

// The fd changes under a busy engine (TSan: the engine must never see a half-swapped or closed
// fd). Every arming still raises exactly one event.
TEST_F(Events, SwappingTheFdWhileEventsAreRaised) {
    EventFd one, two;
    connect(a_, b_);
    std::atomic<bool> stop{false};
    std::thread swapper([&] {
        int fds[] = {one.fd(), two.fd(), -1};
        for (unsigned i = 0; !stop.load(std::memory_order_relaxed); ++i) {
            EXPECT_EQ(setCqFd(scq_, fds[i % 3]), 0);
        }
    });
    constexpr uint32_t kRounds = 300;
    for (uint32_t i = 0; i < kRounds; ++i) {
        arm(scq_.cq, kArmNext);
        ASSERT_EQ(writeOnA(i).status, IBV_WC_SUCCESS);
        settle();
    }
    stop.store(true);
    swapper.join();
    EXPECT_EQ(eventsOf(scq_.cq), kRounds);
    EXPECT_LE(one.take() + two.take(), kRounds);
}

}  // namespace
}  // namespace softnda_test
