// Many QPs driven by many threads at once over two engine threads, with control operations and
// counter reads running alongside (also run under ThreadSanitizer). Plus the idle engine: it
// goes to sleep, a doorbell's wake hint wakes it, and a thousand idle QPs do not get in the way.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "providers/softnda/src/softnda_internal.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

class Concurrency : public SoftndaTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"engine_threads", "2"}, {"spin_us", "20"}, {"sleep_us", "200"}};
    }
    // Doorbell pages are split between engine threads by page; fills the current page with CQ
    // registers so the next queues land on the next page (the other engine thread).
    void fillDoorbellPage() {
        for (int i = 0; i < 64; ++i) {
            CqH c = makeCq(2);
            auto reg = reinterpret_cast<uintptr_t>(c.ext->cq_info.db_hw_va.iov_base);
            if (((reg & 4095) - SOFTNDA_DB_REGS_OFFSET) / SOFTNDA_DB_REG_STRIDE ==
                SOFTNDA_DB_REGS_PER_PAGE - 1) {
                return;
            }
        }
    }
};

struct Pair {
    CqH scq, rcq;
    QpH a, b;
    std::vector<uint8_t> src, dst, rbuf;
    ibv_mr *smr = nullptr, *dmr = nullptr, *rmr = nullptr;
};

TEST_F(Concurrency, ManyQpsManyThreads) {
    constexpr int kThreads = 4;
    constexpr int kPairsPerThread = 2;
    constexpr int kIters = 400;
    std::vector<std::unique_ptr<Pair>> pairs;
    for (int i = 0; i < kThreads * kPairsPerThread; ++i) {
        if (i == kThreads * kPairsPerThread / 2) {
            fillDoorbellPage();  // half the pairs on each engine thread
        }
        auto p = std::make_unique<Pair>();
        p->scq = makeCq(64);
        p->rcq = makeCq(64);
        p->a = makeQp(p->scq, p->rcq);
        p->b = makeQp(p->scq, p->rcq);
        connect(p->a, p->b);
        p->src.resize(256);
        p->dst.resize(256);
        p->rbuf.resize(256);
        p->smr = reg(p->src.data(), 256);
        p->dmr = reg(p->dst.data(), 256);
        p->rmr = reg(p->rbuf.data(), 256);
        pairs.push_back(std::move(p));
    }
    std::atomic<int> failures{0};
    std::atomic<bool> done{false};
    auto worker = [&](int t) {
        for (int it = 0; it < kIters; ++it) {
            for (int k = 0; k < kPairsPerThread; ++k) {
                Pair &p = *pairs[static_cast<size_t>(t * kPairsPerThread + k)];
                uint8_t tag = static_cast<uint8_t>(it * 7 + t);
                std::fill(p.src.begin(), p.src.end(), tag);
                softnda_sge rs = sge(p.rbuf.data(), 128, p.rmr);
                softnda_sge s1 = sge(p.src.data(), 128, p.smr);
                softnda_sge s2 = sge(p.src.data() + 128, 128, p.smr);
                auto w = wr(SOFTNDA_OP_RDMA_WRITE, 1, &s1, 1);
                w.remote_addr = reinterpret_cast<uintptr_t>(p.dst.data());
                w.rkey = p.dmr->rkey;
                auto s = wr(SOFTNDA_OP_SEND, 2, &s2, 1);
                if (softnda_rq_post(&p.b.rq, 3, &rs, 1) != 0 || softnda_sq_post(&p.a.sq, &w) != 0 ||
                    softnda_sq_post(&p.a.sq, &s) != 0) {
                    failures++;
                    return;
                }
                softnda_rq_doorbell(&p.b.rq);
                softnda_sq_doorbell(&p.a.sq);
                auto sc = waitCqes(p.scq.cq, 2);
                auto rc = waitCqes(p.rcq.cq, 1);
                if (sc.size() != 2 || rc.size() != 1 || sc[0].status != 0 || sc[1].status != 0 ||
                    rc[0].status != 0 || p.dst[0] != tag || p.dst[127] != tag || p.rbuf[0] != tag ||
                    p.rbuf[127] != tag) {
                    failures++;
                    return;
                }
            }
        }
    };
    // Control operations and counter reads race with the engine on purpose.
    std::thread control([&] {
        while (!done.load()) {
            auto ca = cqAttr(8);
            ibv_cq_extend *cq = ext_->ops->create_cq(ctx_, &ca);
            if (cq == nullptr) {
                failures++;
                return;
            }
            CqH h;
            h.ext = cq;
            auto qa = qpAttr(h, h);
            ibv_qp_extend *qp = ext_->ops->create_qp(ctx_, &qa);
            softnda_counters c{};
            if (qp == nullptr || softnda_query_counters("softnda0", &c) != 0 ||
                ext_->ops->destroy_qp(qp) != 0 || ext_->ops->destroy_cq(cq) != 0) {
                failures++;
                return;
            }
        }
    });
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back(worker, t);
    }
    for (auto &th : threads) {
        th.join();
    }
    done = true;
    control.join();
    EXPECT_EQ(failures.load(), 0);
    softnda_counters c{};
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    EXPECT_GE(c.wqes_executed, static_cast<uint64_t>(kThreads * kPairsPerThread * kIters * 2));
}

TEST_F(Concurrency, SrqSharedByManyQpsAcrossEngineThreads) {
    constexpr int kPairs = 8;
    constexpr int kPerSender = 200;
    constexpr uint32_t kSlot = 16;
    SrqH srq = makeSrq(256, 1);
    CqH scq = makeCq(4096);
    CqH rcq = makeCq(4096);
    std::vector<QpH> senders, receivers;
    for (int i = 0; i < kPairs; ++i) {
        if (i == kPairs / 2) {
            fillDoorbellPage();  // the SRQ is consumed from both engine threads
        }
        senders.push_back(makeQp(scq, rcq));
        receivers.push_back(makeQp(scq, rcq, QpCaps{}, srq.ext));
        connect(senders.back(), receivers.back());
    }
    const size_t total = static_cast<size_t>(kPairs) * kPerSender;
    std::vector<uint8_t> rbuf(total * kSlot, 0);
    std::vector<uint8_t> sbuf(kPairs * kSlot);
    ibv_mr *rm = reg(rbuf.data(), rbuf.size());
    ibv_mr *sm = reg(sbuf.data(), sbuf.size());
    // One producer keeps the SRQ stocked (wr_id = receive slot) while every sender sends.
    std::atomic<bool> stop{false};
    std::thread stocker([&] {
        size_t next = 0;
        while (next < total && !stop.load()) {
            softnda_sge rs = sge(rbuf.data() + next * kSlot, kSlot, rm);
            if (softnda_rq_post(&srq.rq, next, &rs, 1) == 0) {
                next++;
                softnda_rq_doorbell(&srq.rq);
            } else {
                std::this_thread::yield();
            }
        }
    });
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < kPerSender; ++i) {
                for (int p = t * 2; p < t * 2 + 2; ++p) {
                    uint8_t *msg = sbuf.data() + p * kSlot;
                    std::memset(msg, p + 1, kSlot);
                    softnda_sge s = sge(msg, kSlot, sm);
                    auto w = wr(SOFTNDA_OP_SEND, static_cast<uint64_t>(p), &s, 1, 0);
                    QpH &q = senders[static_cast<size_t>(p)];
                    while (softnda_sq_post(&q.sq, &w) == -ENOSPC) {
                        std::this_thread::yield();
                    }
                    softnda_sq_doorbell(&q.sq);
                    // The send buffer is reused: wait until the engine has consumed this WQE.
                    while (__atomic_load_n(q.sq.dbr_ci, __ATOMIC_ACQUIRE) != q.sq.pi) {
                        std::this_thread::yield();
                    }
                }
            }
            (void)failures;
        });
    }
    for (auto &th : threads) {
        th.join();
    }
    auto cqes = waitCqes(rcq.cq, total);
    stop = true;
    stocker.join();
    ASSERT_EQ(cqes.size(), total);
    std::vector<int> per_receiver(kPairs, 0);
    std::vector<bool> slot_seen(total, false);
    for (const auto &c : cqes) {
        ASSERT_EQ(c.status, IBV_WC_SUCCESS);
        ASSERT_LT(c.wr_id, total);
        ASSERT_FALSE(slot_seen[c.wr_id]) << "receive consumed twice";
        slot_seen[c.wr_id] = true;
        int pair = -1;
        for (int p = 0; p < kPairs; ++p) {
            if (receivers[static_cast<size_t>(p)].qpn() == c.qp_num) {
                pair = p;
            }
        }
        ASSERT_GE(pair, 0);
        EXPECT_EQ(c.src_qp, senders[static_cast<size_t>(pair)].qpn());
        per_receiver[static_cast<size_t>(pair)]++;
        const uint8_t *got = rbuf.data() + c.wr_id * kSlot;
        for (uint32_t b = 0; b < kSlot; ++b) {
            ASSERT_EQ(got[b], pair + 1);
        }
    }
    for (int n : per_receiver) {
        EXPECT_EQ(n, kPerSender);
    }
    EXPECT_EQ(__atomic_load_n(srq.rq.dbr_ci, __ATOMIC_ACQUIRE), total);
}

TEST_F(Concurrency, IdleEngineSleepsAndTheHintWakesIt) {
    if (!softnda::haveFutexWaitv()) {
        GTEST_SKIP() << "no futex_waitv here (Linux < 5.16 or qemu-user): the engine cannot wait on "
                        "wake hints (NoFutexWaitv covers that fallback)";
    }
    CqH cq = makeCq();
    QpH a = makeQp(cq, cq);
    QpH b = makeQp(cq, cq);
    connect(a, b);
    uint64_t v = 3, d = 0;
    softnda_sge s;
    softnda_send_wr w = write8(&v, &d, &s);
    softnda_counters c{};
    for (int round = 0; round < 50; ++round) {
        ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
        uint64_t sleeps = c.sleeps;
        for (int i = 0; i < 2000 && c.sleeps == sleeps; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
        }
        ASSERT_GT(c.sleeps, sleeps) << "an idle engine must go to sleep";
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        ASSERT_EQ(postOne(a, w), 0);
        ASSERT_EQ(waitOne(cq.cq).status, IBV_WC_SUCCESS);
        ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
        if (c.wakeups_by_hint > 0) {
            break;
        }
    }
    EXPECT_GT(c.wakeups_by_hint, 0u);
}

TEST_F(Concurrency, ThousandIdleQpsDoNotHideARing) {
    rlimit rl{};
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_cur < 4096 && rl.rlim_max >= 4096) {
        rl.rlim_cur = 4096;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    CqH cq = makeCq();
    QpCaps caps;
    caps.send_wr = 1;
    caps.recv_wr = 1;
    for (int i = 0; i < 1000; ++i) {
        makeQp(cq, cq, caps);
    }
    QpH a = makeQp(cq, cq);
    QpH b = makeQp(cq, cq);
    connect(a, b);
    uint64_t v = 9, d = 0;
    ibv_mr *m = reg(&v, 8);
    ibv_mr *dm = reg(&d, 8);
    softnda_sge s = sge(&v, 8, m);
    for (uint64_t i = 0; i < 100; ++i) {
        v = i;
        auto w = wr(SOFTNDA_OP_RDMA_WRITE, i, &s, 1);
        w.remote_addr = reinterpret_cast<uintptr_t>(&d);
        w.rkey = dm->rkey;
        ASSERT_EQ(postOne(a, w), 0);
        ASSERT_EQ(waitOne(cq.cq).wr_id, i);
        ASSERT_EQ(d, i);
    }
}

// The sleep of a kernel without futex_waitv, forced here so every host runs it: the engine
// waits on its kick word only, arms no page (so a helper's ring makes no system call and wakes
// nothing), and still finds every doorbell rung while it sleeps and wakes for control operations.
class NoFutexWaitv : public SoftndaTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override { return {{"futex_waitv", "0"}}; }
};

TEST_F(NoFutexWaitv, RingsWhileAsleepAreFoundAndNoHintIsArmed) {
    CqH cq = makeCq();
    QpH a = makeQp(cq, cq);
    QpH b = makeQp(cq, cq);
    connect(a, b);
    uint64_t v = 5, d = 0;
    softnda_sge s;
    softnda_send_wr w = write8(&v, &d, &s);
    softnda_counters c{};
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    const uint64_t hints_before = c.wakeups_by_hint;  // the counters live as long as the device
    for (int round = 0; round < 5; ++round) {
        ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
        uint64_t sleeps = c.sleeps;
        for (int i = 0; i < 2000 && c.sleeps == sleeps; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
        }
        ASSERT_GT(c.sleeps, sleeps) << "an idle engine must go to sleep";
        EXPECT_EQ(__atomic_load_n(a.sq.db.engine_sleeping, __ATOMIC_SEQ_CST), 0u)
            << "a page was armed for a wake hint nobody waits on";
        ASSERT_EQ(postOne(a, w), 0);
        ASSERT_EQ(waitOne(cq.cq).status, IBV_WC_SUCCESS);
    }
    EXPECT_EQ(d, 5u);
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    EXPECT_EQ(c.wakeups_by_hint, hints_before);
}

TEST_F(NoFutexWaitv, ControlOperationsWakeASleepingEngine) {
    CqH cq = makeCq();
    QpH a = makeQp(cq, cq);
    QpH b = makeQp(cq, cq);
    connect(a, b);
    uint64_t buf = 0;
    ibv_mr *m = reg(&buf, 8);
    softnda_sge s = sge(&buf, 8, m);
    ASSERT_EQ(postRecv(b, 42, &s, 1), 0);
    softnda_counters c{};
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    uint64_t sleeps = c.sleeps;
    for (int i = 0; i < 2000 && c.sleeps == sleeps; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    }
    ASSERT_GT(c.sleeps, sleeps);
    // Moving b to ERR pokes its engine thread (the kick word), which flushes the receive.
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    ASSERT_EQ(softnda_vdev_ops.modify_qp(b.ext->qp, &attr, IBV_QP_STATE), 0);
    softnda_cqe e = waitOne(cq.cq);
    EXPECT_EQ(e.wr_id, 42u);
    EXPECT_EQ(e.status, IBV_WC_WR_FLUSH_ERR);
}

}  // namespace
}  // namespace softnda_test
