// The brokered scenarios: the same measurements as the direct ones, but with every object made
// by ibv-extendd through libibv_extend.so in broker mode, plus what only a broker has (a control
// path over a socket, tenants as processes, sessions to tear down).
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <infiniband/verbs.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "common/cpu.h"
#include "providers/softnda/include/softnda_device.h"
#include "tools/ibv-extend-perf/broker_harness.h"
#include "tools/ibv-extend-perf/broker_queues.h"
#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/verbs_face.h"
#include "tools/ibv-extend-perf/workers.h"
#include "tools/ibv-extend-perf/wr.h"

extern char **environ;

namespace ibvx::perf {
namespace {

[[noreturn]] void die(const std::string &what) {
    throw std::runtime_error("broker: " + what + " failed (errno " + std::to_string(errno) + ")");
}

// ---- floors -------------------------------------------------------------------------------

// One byte there and back over a Unix socket pair, two threads: the kernel's share of any RPC.
void udsPingPong(const Options &opt, Results &out) {
    const int iters = opt.quick ? 200 : 50000;
    const int warmup = opt.quick ? 20 : 1000;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        die("socketpair");
    }
    std::thread echo([&] {
        char c;
        while (::read(sv[1], &c, 1) == 1) {
            if (::write(sv[1], &c, 1) != 1) {
                break;
            }
        }
    });
    std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] {
        char c = 'x';
        auto t0 = Clock::now();
        if (::write(sv[0], &c, 1) != 1 || ::read(sv[0], &c, 1) != 1) {
            die("uds ping-pong");
        }
        return nsSince(t0);
    });
    ::shutdown(sv[0], SHUT_RDWR);
    echo.join();
    ::close(sv[0]);
    ::close(sv[1]);
    out.add("floors", "uds_pingpong_p50_us", percentile(ns, 50) / 1e3, "us",
            "1 B round trip, Unix socket pair");
    out.add("floors", "uds_pingpong_p99_us", percentile(ns, 99) / 1e3, "us");
}

void nullRpc(const Options &opt, Results &out, BrokerHarness &broker) {
    const int iters = opt.quick ? 50 : 5000;
    const int warmup = opt.quick ? 5 : 200;
    std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] { return broker.healthCheckNs(); });
    out.add("floors", "null_rpc_p50_us", percentile(ns, 50) / 1e3, "us",
            "grpc.health.v1.Health/Check on the broker socket");
    out.add("floors", "null_rpc_p99_us", percentile(ns, 99) / 1e3, "us");
}

// ---- one process's broker objects -----------------------------------------------------------

// ---- syscall counting of one thread ---------------------------------------------------------

// Counts the system calls of the calling thread between start() and stop() with
// `perf stat -e raw_syscalls:sys_enter -t <tid>` run by a helper thread, so starting and stopping
// perf costs the measured thread nothing (it only spins on atomics). Where perf cannot attach to
// a running thread (it answers "<not counted>", as in some containers and VMs), the thread's own
// kernel counters: read()/write() calls (/proc/thread-self/io syscr + syscw) plus voluntary
// context switches (every call that blocked); those miss non-blocking calls other than read and
// write. Either way work done while perf attaches is counted against no work request, so the
// figure can only err high.
class SyscallCounter {
  public:
    // keep_alive runs repeatedly while perf attaches.
    template <typename F>
    void start(F keep_alive) {
        tid_ = static_cast<pid_t>(::gettid());
        base_ = threadCounters();
        if (::access("/usr/bin/perf", X_OK) == 0) {
            helper_ = std::thread([this] { runPerf(); });
            while (!attached_.load(std::memory_order_acquire)) {
                keep_alive();
            }
        }
    }
    // Syscalls since start().
    double stop() {
        if (helper_.joinable()) {
            done_.store(true, std::memory_order_release);
            while (!stopped_.load(std::memory_order_acquire)) {
                ibvx_cpu_relax();
            }
            helper_.join();
            if (count_ >= 0) {
                method_ = "perf stat -e raw_syscalls:sys_enter -t <data thread>";
                return count_;
            }
        }
        method_ = "thread syscr+syscw (/proc/thread-self/io) + voluntary ctx switches";
        // The counters are read with read(): one read() of this second sample is ours.
        return threadCounters() - base_ - 1;
    }
    const std::string &method() const { return method_; }

  private:
    static double threadCounters() {
        double n = 0;
        std::ifstream io("/proc/thread-self/io");
        std::string k;
        double v;
        while (io >> k >> v) {
            if (k == "syscr:" || k == "syscw:") {
                n += v;
            }
        }
        rusage ru{};
        ::getrusage(RUSAGE_THREAD, &ru);
        return n + static_cast<double>(ru.ru_nvcsw);
    }
    void runPerf() {
        // Under SCHED_FIFO this thread and perf (which inherits its policy) run one priority
        // above the spinning threads. At their priority they would wait for a CPU until RT
        // throttling stopped a spinner for 50 ms, long enough for the engine to fall asleep.
        sched_param sp{};
        if (::sched_getscheduler(0) == SCHED_FIFO && ::sched_getparam(0, &sp) == 0 &&
            sp.sched_priority < ::sched_get_priority_max(SCHED_FIFO)) {
            sp.sched_priority += 1;
            ::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &sp);
        }
        std::string out = "/tmp/ibvx-perf-syscalls." + std::to_string(::getpid());
        std::string tid = std::to_string(tid_);
        std::vector<std::string> store = {"/usr/bin/perf",          "stat", "-x", ",",  "-e",
                                          "raw_syscalls:sys_enter", "-t",   tid,  "-o", out};
        std::vector<char *> argv;
        for (auto &a : store) {
            argv.push_back(a.data());
        }
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
        pid_t pid = -1;
        if (posix_spawn(&pid, store[0].c_str(), &fa, nullptr, argv.data(), environ) != 0) {
            pid = -1;
        }
        posix_spawn_file_actions_destroy(&fa);
        // perf gives no sign when its counter is attached; it takes well under this.
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        attached_.store(true, std::memory_order_release);
        while (!done_.load(std::memory_order_acquire)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        count_ = -1;
        if (pid > 0) {
            ::kill(pid, SIGINT);
            int st;
            ::waitpid(pid, &st, 0);
            std::ifstream in(out);
            std::string line;
            while (std::getline(in, line)) {
                if (line.find("raw_syscalls:sys_enter") != std::string::npos && !line.empty() &&
                    line[0] >= '0' && line[0] <= '9') {
                    count_ = std::strtod(line.c_str(), nullptr);
                }
            }
            ::unlink(out.c_str());
        }
        stopped_.store(true, std::memory_order_release);
    }

    pid_t tid_ = 0;
    std::thread helper_;
    std::atomic<bool> attached_{false}, done_{false}, stopped_{false};
    double count_ = -1;
    double base_ = 0;
    std::string method_;
};

// ---- fast path through the broker -----------------------------------------------------------

// Work requests per second for `seconds`: post_chain(first_id) posts kChain WRs with one doorbell
// (the last signaled), two chains in flight on a 64-entry SQ; poll() returns completions taken.
constexpr int kChain = 32;
template <typename PostChain, typename Poll>
double chainRate(double seconds, PostChain post_chain, Poll poll) {
    uint64_t posted = 0;
    int in_flight = 0;
    auto t0 = Clock::now();
    const uint64_t limit_ns = static_cast<uint64_t>(seconds * 1e9);
    while (nsSince(t0) < limit_ns || in_flight > 0) {
        while (in_flight < 2 && nsSince(t0) < limit_ns) {
            post_chain(posted);
            posted += kChain;
            in_flight++;
        }
        in_flight -= poll();
    }
    return static_cast<double>(posted) / (static_cast<double>(nsSince(t0)) / 1e9);
}

// The direct scenario's write8 probe, with the QP pair, CQ and MRs made by the broker and mapped
// into this process.
class BrokerProbe : public Write8Probe {
  public:
    BrokerProbe() {
        // The direct probe's shapes: a 64-entry CQ shared by two QPs with 64-entry SQs.
        cq_ = base_.createCq(64);
        a_ = base_.createQp(cq_, 64);
        b_ = base_.createQp(cq_, 64);
        toRts(a_->qp, b_->qp->qp_num);
        toRts(b_->qp, a_->qp->qp_num);
        src_ = static_cast<uint8_t *>(ibvx_alloc_buf(4096));
        dst_ = static_cast<uint8_t *>(ibvx_alloc_buf(4096));
        if (src_ == nullptr || dst_ == nullptr) {
            die("ibvx_alloc_buf");
        }
        int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        smr_ = ibvx_reg_mr(base_.pd, src_, 4096, acc);
        dmr_ = ibvx_reg_mr(base_.pd, dst_, 4096, acc);
        if (smr_ == nullptr || dmr_ == nullptr) {
            die("ibvx_reg_mr");
        }
        if (softnda_sq_init(&sq_, &a_->sq_info) != 0 || softnda_cq_init(&cqh_, &cq_->cq_info) != 0) {
            die("queue_info");
        }
        sge_ = softnda_sge{reinterpret_cast<uintptr_t>(src_), 8, smr_->lkey};
    }
    ~BrokerProbe() override {
        ibvx_dereg_mr(smr_);
        ibvx_dereg_mr(dmr_);
        ibvx_free_buf(src_);
        ibvx_free_buf(dst_);
        ibv_destroy_qp_extend(base_.ctx, a_);
        ibv_destroy_qp_extend(base_.ctx, b_);
        ibv_destroy_cq_extend(base_.ctx, cq_);
    }
    uint64_t once() override {
        softnda_send_wr w =
            rdmaWrite(&sge_, reinterpret_cast<uintptr_t>(dst_), dmr_->rkey, SOFTNDA_WQE_SIGNALED, id_++);
        auto t0 = Clock::now();
        softnda_sq_post(&sq_, &w);
        softnda_sq_doorbell(&sq_);
        if (int st = waitOneCqe(&cqh_); st != IBV_WC_SUCCESS) {
            die("completion status " + std::to_string(st));
        }
        return nsSince(t0);
    }

    // WRs per second through softnda_sq_post, in chains (chainRate).
    double rate(double seconds) {
        softnda_cqe e[8];
        return chainRate(
            seconds,
            [&](uint64_t) {
                for (int i = 0; i < kChain; ++i) {
                    softnda_send_wr w = rdmaWrite(&sge_, reinterpret_cast<uintptr_t>(dst_), dmr_->rkey,
                                                  i == kChain - 1 ? SOFTNDA_WQE_SIGNALED : 0, id_++);
                    softnda_sq_post(&sq_, &w);
                }
                softnda_sq_doorbell(&sq_);
            },
            [&] {
                int n = softnda_cq_poll(&cqh_, e, 8);
                if (n < 0) {
                    die("helpers rate CQ");
                }
                return n;
            });
    }

  private:
    BrokerBase base_;
    ibv_cq_extend *cq_ = nullptr;
    ibv_qp_extend *a_ = nullptr;
    ibv_qp_extend *b_ = nullptr;
    uint8_t *src_ = nullptr;
    uint8_t *dst_ = nullptr;
    ibv_mr *smr_ = nullptr;
    ibv_mr *dmr_ = nullptr;
    softnda_sq sq_{};
    softnda_cq cqh_{};
    softnda_sge sge_{};
    uint64_t id_ = 0;
};

// Under SCHED_FIFO the kernel stops a CPU's real-time threads for the rest of a period once
// they used sched_rt_runtime_us of it (RT throttling: 50 ms of every second by default). A
// client stopped that long lets the engine fall asleep, and its next doorbell then pays a futex
// wake: a cost of the throttling, not of the fast path. Sleeping one period first gives the data
// phase (perf attaching plus the work requests: well under a period) a whole budget.
void freshRtBudget() {
    if (::sched_getscheduler(0) != SCHED_FIFO) {
        return;
    }
    long period_us = 0;
    std::ifstream("/proc/sys/kernel/sched_rt_period_us") >> period_us;
    std::this_thread::sleep_for(std::chrono::microseconds(std::clamp(period_us, 0L, 2'000'000L) * 11 / 10));
}

// write8 through broker-made queues, one contiguous data phase watched for broker RPCs (its own
// counter) and this thread's system calls; then the ratio against direct from alternating
// blocks of both probes, so a shared machine's changing state hits both halves alike.
void write8Broker(const Options &opt, Results &out, BrokerHarness &broker) {
    const int iters = opt.quick ? 200 : 200000;
    const int warmup = opt.quick ? 20 : 1000;
    BrokerProbe probe;
    // The probe's device is open now, so its engine threads exist.
    broker.raiseEngineThreads();
    if (!opt.quick) {
        freshRtBudget();
    }
    for (int i = 0; i < warmup; ++i) {
        probe.once();
    }
    std::vector<uint64_t> ns;
    ns.reserve(static_cast<size_t>(iters));
    BrokerStats before = broker.stats();
    SyscallCounter sys;
    // Work requests keep the broker's engine awake while perf attaches (an engine asleep costs
    // the next doorbell a futex wake); any syscall they cause is counted, not excused.
    sys.start([&] { probe.once(); });
    for (int i = 0; i < iters; ++i) {
        ns.push_back(probe.once());
    }
    double syscalls = sys.stop();
    BrokerStats after = broker.stats();
    out.add("fastpath", "write8_p50_ns_broker", percentile(ns, 50), "ns",
            "8 B WRITE post->CQE, queues from the broker");
    out.add("fastpath", "write8_p99_ns_broker", percentile(ns, 99), "ns");
    out.add("fastpath", "broker_rpcs_during_fastpath",
            static_cast<double>(after.total_calls - before.total_calls), "calls",
            "Admin/GetStats total_calls over the data phase");
    out.add("fastpath", "client_syscalls_per_wr", syscalls / iters, "calls/WR", sys.method());
    // The one syscall the fast path can make (SPEC.md §4 step 5): the engine had gone to sleep.
    out.add("fastpath", "client_syscalls_during_fastpath", syscalls, "calls",
            "the same count, over " + std::to_string(iters) + " WRs");
    out.add(
        "fastpath", "engine_wakeups_during_fastpath",
        static_cast<double>(after.engine_wakeups - before.engine_wakeups), "wakes",
        "broker's softnda wakeups_by_hint from before perf attached to the end (futex wakes by the client)");

    // Paired: both engines idle after the softnda default 50 us, so the one not measured sleeps.
    auto direct = makeDirectWrite8Probe(opt, 50);
    const int rounds = opt.quick ? 2 : 40;
    const int block = iters / rounds;
    std::vector<uint64_t> d, b, ratio_permille;
    for (int r = 0; r < rounds; ++r) {
        double p50[2];
        int k = 0;
        for (Write8Probe *p : {direct.get(), static_cast<Write8Probe *>(&probe)}) {
            for (int i = 0; i < warmup / 4; ++i) {
                p->once();
            }
            std::vector<uint64_t> blk;
            for (int i = 0; i < block; ++i) {
                blk.push_back(p->once());
            }
            auto &all = p == direct.get() ? d : b;
            all.insert(all.end(), blk.begin(), blk.end());
            p50[k++] = percentile(blk, 50);
        }
        ratio_permille.push_back(static_cast<uint64_t>(p50[1] / std::max(p50[0], 1.0) * 1000.0 + 0.5));
    }
    out.add("fastpath", "write8_p50_ns_direct_paired", percentile(d, 50), "ns",
            std::to_string(rounds) + " alternating blocks of " + std::to_string(block));
    out.add("fastpath", "write8_p50_ns_broker_paired", percentile(b, 50), "ns");
    // The median over rounds of (broker block p50 / direct block p50): a drift of the machine
    // between rounds moves both halves of a round, not the ratio.
    out.add("fastpath", "fastpath_ratio_broker_over_direct", percentile(ratio_permille, 50) / 1000.0, "x",
            "goal 1.00 +- 0.05 (median over paired rounds)");
}

// ---- the standard verbs through the libibverbs face -------------------------------------------

// Two RC QPs on one CQ, made with the standard verbs; 8 B RDMA WRITEs from a heap buffer.
class VerbsProbe : public Write8Probe {
  public:
    explicit VerbsProbe(Face &f) : f_(f) {
        ctx_ = f_.openDevice("softnda0");
        if (ctx_ == nullptr || (pd_ = f_.alloc_pd(ctx_)) == nullptr ||
            (cq_ = f_.create_cq(ctx_, 64, nullptr, nullptr, 0)) == nullptr) {
            die("the face's device, PD or CQ");
        }
        ibv_qp_init_attr_extend x = rcQpAttr(pd_, cq_, 64);
        a_ = f_.create_qp(pd_, &x.attr);
        b_ = f_.create_qp(pd_, &x.attr);
        if (a_ == nullptr || b_ == nullptr) {
            die("ibv_create_qp through the face");
        }
        connect(a_, b_->qp_num);
        connect(b_, a_->qp_num);
        src_.assign(4096, 1);
        dst_.assign(4096, 0);
        int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        smr_ = f_.reg_mr(pd_, src_.data(), src_.size(), acc);
        dmr_ = f_.reg_mr(pd_, dst_.data(), dst_.size(), acc);
        if (smr_ == nullptr || dmr_ == nullptr) {
            die("ibv_reg_mr (heap) through the face");
        }
        sge_ = ibv_sge{reinterpret_cast<uintptr_t>(src_.data()), 8, smr_->lkey};
    }
    ~VerbsProbe() override {
        f_.dereg_mr(smr_);
        f_.dereg_mr(dmr_);
        f_.destroy_qp(a_);
        f_.destroy_qp(b_);
        f_.destroy_cq(cq_);
        f_.dealloc_pd(pd_);
        f_.close_device(ctx_);
    }
    ibv_send_wr write(uint64_t id, unsigned flags) {
        ibv_send_wr w{};
        w.wr_id = id;
        w.sg_list = &sge_;
        w.num_sge = 1;
        w.opcode = IBV_WR_RDMA_WRITE;
        w.send_flags = flags;
        w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst_.data());
        w.wr.rdma.rkey = dmr_->rkey;
        return w;
    }
    uint64_t once() override {
        ibv_send_wr w = write(id_++, IBV_SEND_SIGNALED), *bad = nullptr;
        ibv_wc wc{};
        auto t0 = Clock::now();
        if (ibv_post_send(a_, &w, &bad) != 0) {
            die("ibv_post_send");
        }
        int n;
        while ((n = ibv_poll_cq(cq_, 1, &wc)) == 0) {
        }
        if (n < 0 || wc.status != IBV_WC_SUCCESS) {
            die("ibv_poll_cq completion");
        }
        return nsSince(t0);
    }
    // WRs per second through ibv_post_send, in chains (chainRate).
    double rate(double seconds) {
        std::vector<ibv_send_wr> chain(kChain);
        ibv_wc wc[8];
        return chainRate(
            seconds,
            [&](uint64_t first) {
                for (size_t i = 0; i < chain.size(); ++i) {
                    chain[i] = write(first + i, i + 1 == chain.size() ? IBV_SEND_SIGNALED : 0);
                    chain[i].next = i + 1 < chain.size() ? &chain[i + 1] : nullptr;
                }
                ibv_send_wr *bad = nullptr;
                if (ibv_post_send(a_, chain.data(), &bad) != 0) {
                    die("ibv_post_send (chain)");
                }
            },
            [&] {
                int n = ibv_poll_cq(cq_, 8, wc);
                if (n < 0) {
                    die("ibv_poll_cq");
                }
                return n;
            });
    }

  private:
    void connect(ibv_qp *qp, uint32_t dest) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        int rc = f_.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = dest;
        a.ah_attr.dlid = 1;
        a.ah_attr.port_num = 1;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        rc = rc != 0 ? rc
                     : f_.modify_qp(qp, &a,
                                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTS;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        rc = rc != 0 ? rc
                     : f_.modify_qp(qp, &a,
                                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
        if (rc != 0) {
            die("ibv_modify_qp through the face");
        }
    }

    Face &f_;
    ibv_context *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
    ibv_cq *cq_ = nullptr;
    ibv_qp *a_ = nullptr;
    ibv_qp *b_ = nullptr;
    std::vector<uint8_t> src_, dst_;
    ibv_mr *smr_ = nullptr;
    ibv_mr *dmr_ = nullptr;
    ibv_sge sge_{};
    uint64_t id_ = 0;
};

// The verbs section: the same 8 B WRITE through ibv_post_send/ibv_poll_cq (the face) and through
// the device-side helpers (softnda_device.h on queue_info), both on broker-made queues of one
// device, in alternating blocks; then both message rates; then the verbs path's system calls.
void verbsSection(const Options &opt, Results &out, BrokerHarness &broker) {
    Face face;
    VerbsProbe verbs(face);
    BrokerProbe helpers;
    broker.raiseEngineThreads();
    const int warmup = opt.quick ? 20 : 1000;
    const int rounds = opt.quick ? 2 : 40;
    const int block = opt.quick ? 100 : 5000;
    std::vector<uint64_t> v, h, ratio_permille;
    for (int r = 0; r < rounds; ++r) {
        double p50[2];
        int k = 0;
        for (Write8Probe *p : {static_cast<Write8Probe *>(&helpers), static_cast<Write8Probe *>(&verbs)}) {
            for (int i = 0; i < warmup / 4; ++i) {
                p->once();
            }
            std::vector<uint64_t> blk;
            for (int i = 0; i < block; ++i) {
                blk.push_back(p->once());
            }
            auto &all = p == &verbs ? v : h;
            all.insert(all.end(), blk.begin(), blk.end());
            p50[k++] = percentile(blk, 50);
        }
        ratio_permille.push_back(static_cast<uint64_t>(p50[1] / std::max(p50[0], 1.0) * 1000.0 + 0.5));
    }
    out.add("verbs", "verbs_write8_p50_ns", percentile(v, 50), "ns",
            "8 B WRITE ibv_post_send -> ibv_poll_cq, queues from the broker (face + libsoftnda-verbs.so)");
    out.add("verbs", "helpers_write8_p50_ns", percentile(h, 50), "ns",
            "the same WRITE through softnda_device.h on queue_info, same device, alternating blocks");
    out.add("verbs", "verbs_over_helpers_ratio", percentile(ratio_permille, 50) / 1000.0, "x",
            "goal <= 1.10 (median over paired rounds)");
    const double secs = opt.quick ? 0.05 : 1.0;
    double vr = verbs.rate(secs), hr = helpers.rate(secs);
    out.add("verbs", "verbs_msg_rate_mwrs", vr / 1e6, "M WR/s", "8 B WRITE, chains of 32 via ibv_post_send");
    out.add("verbs", "helpers_msg_rate_mwrs", hr / 1e6, "M WR/s", "the same chains through softnda_sq_post");
    out.add("verbs", "verbs_over_helpers_rate", vr / std::max(hr, 1.0), "x", "goal >= 0.8");

    const int iters = opt.quick ? 200 : 100000;
    if (!opt.quick) {
        freshRtBudget();  // as write8Broker: RT throttling would put the engine to sleep mid-phase
    }
    BrokerStats before = broker.stats();
    SyscallCounter sys;
    sys.start([&] { verbs.once(); });
    for (int i = 0; i < iters; ++i) {
        verbs.once();
    }
    double syscalls = sys.stop();
    BrokerStats after = broker.stats();
    out.add("verbs", "verbs_syscalls_per_wr", syscalls / iters, "calls/WR", sys.method() + ", goal 0");
    out.add("verbs", "verbs_broker_rpcs_during_data",
            static_cast<double>(after.total_calls - before.total_calls), "calls",
            "Admin/GetStats total_calls over the verbs data phase");
}

// ---- control path -------------------------------------------------------------------------

// CreateQp timed (its destroy not), each one right after a null RPC, so the ratio of the two
// comes from the same stretch of a shared machine.
void createQpBroker(const Options &opt, Results &out, BrokerHarness &broker) {
    const int iters = opt.quick ? 20 : 3000;
    const int warmup = opt.quick ? 2 : 100;
    BrokerBase base;
    std::vector<uint64_t> ns, null_ns;
    for (int i = 0; i < iters + warmup; ++i) {
        uint64_t n = broker.healthCheckNs();
        auto t0 = Clock::now();
        ibv_qp_extend *q = base.createQp(base.cq, 64);
        uint64_t t = nsSince(t0);
        if (ibv_destroy_qp_extend(base.ctx, q) != 0) {
            die("ibv_destroy_qp_extend");
        }
        if (i >= warmup) {
            ns.push_back(t);
            null_ns.push_back(n);
        }
    }
    double p50 = percentile(ns, 50), null50 = percentile(null_ns, 50);
    out.add("control", "create_qp_p50_us_broker", p50 / 1e3, "us", "one CreateQp through the broker");
    out.add("control", "create_qp_p99_us_broker", percentile(ns, 99) / 1e3, "us");
    out.add("control", "null_rpc_p50_us_paired", null50 / 1e3, "us",
            "health checks interleaved with the CreateQps");
    out.add("control", "create_qp_over_null_rpc", null50 > 0 ? p50 / null50 : 0, "x",
            "goal <= 1.1 (p50 of CreateQp / p50 of the interleaved null RPCs)");
}

// CQ + QP + INIT/RTR/RTS: what a tenant pays before its first work request. The face answers
// the INIT itself on softnda (docs/verbs.md, "Bring-up"); a second context made with
// IBV_EXTEND_HOLD_INIT=0 sends it as its own call, each of its bring-ups right after one of the
// first's, so the two figures come from the same stretch of a shared machine.
void bringupBroker(const Options &opt, Results &out) {
    const int iters = opt.quick ? 10 : 1000;
    const int warmup = opt.quick ? 1 : 50;
    BrokerBase held;
    ::setenv("IBV_EXTEND_HOLD_INIT", "0", 1);
    BrokerBase sent;
    ::unsetenv("IBV_EXTEND_HOLD_INIT");
    auto once = [](BrokerBase &base) {
        auto t0 = Clock::now();
        ibv_cq_extend *cq = base.createCq(64);
        ibv_qp_extend *q = base.createQp(cq, 64);
        toRts(q->qp, q->qp->qp_num);
        uint64_t t = nsSince(t0);
        if (ibv_destroy_qp_extend(base.ctx, q) != 0 || ibv_destroy_cq_extend(base.ctx, cq) != 0) {
            die("bring-up teardown");
        }
        return t;
    };
    std::vector<uint64_t> sent_ns;
    std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] {
        sent_ns.push_back(once(sent));
        return once(held);
    });
    sent_ns.erase(sent_ns.begin(), sent_ns.begin() + std::min<size_t>(warmup, sent_ns.size()));
    const double p50 = percentile(ns, 50), sent50 = percentile(sent_ns, 50);
    out.add("control", "bringup_p50_us_broker", p50 / 1e3, "us",
            "CQ + QP + modify to RTS (4 calls: INIT held)");
    out.add("control", "bringup_p99_us_broker", percentile(ns, 99) / 1e3, "us");
    out.add("control", "bringup_5calls_p50_us_broker", sent50 / 1e3, "us",
            "the same with IBV_EXTEND_HOLD_INIT=0 (INIT its own call), interleaved");
    out.add("control", "bringup_held_over_5calls", sent50 > 0 ? p50 / sent50 : 0, "x",
            "what answering INIT in the face saves of a bring-up");
}

// What one run of N calling processes gave.
struct ChurnRun {
    std::vector<uint64_t> ns;  // every call's latency
    double client_cpu_ns = 0;  // the processes' CPU time (all threads)
    double broker_cpu_ns = -1;
    double ops_per_s = 0;
};

// N tenant processes making calls at once for `ms`: CreateQp + DestroyQp (every call is one op),
// or with `null` the null RPC.
ChurnRun churnRun(uint32_t n, uint64_t ms, bool null, BrokerHarness &broker) {
    char tmpl[] = "/tmp/ibvx.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
        die("mkdtemp");
    }
    std::string dir = tmpl;
    std::vector<Worker> ws;
    for (uint32_t i = 0; i < n; ++i) {
        std::vector<std::string> args = {"churn", std::to_string(ms), dir + "/w" + std::to_string(i)};
        if (null) {
            args.emplace_back("null");
        }
        ws.push_back(spawnWorker(args));
    }
    for (auto &w : ws) {
        if (readByte(w, 60000) != 'R') {
            die("a churn worker did not start: " + broker.log());
        }
    }
    ChurnRun run;
    double broker_cpu0 = broker.cpuNs();
    for (auto &w : ws) {
        sendByte(w, 'G');
    }
    for (auto &w : ws) {
        if (readByte(w, static_cast<int>(ms) + 60000) != 'D') {
            die("a churn worker failed");
        }
    }
    // Before the tenants exit, so their sessions' ends are not charged to the calls.
    if (broker_cpu0 >= 0) {
        run.broker_cpu_ns = broker.cpuNs() - broker_cpu0;
    }
    for (uint32_t i = 0; i < n; ++i) {
        std::ifstream f(dir + "/w" + std::to_string(i), std::ios::binary);
        std::vector<uint64_t> mine;
        uint64_t v;
        while (f.read(reinterpret_cast<char *>(&v), sizeof(v))) {
            mine.push_back(v);
        }
        if (mine.empty()) {
            die("a churn worker wrote no samples");
        }
        run.client_cpu_ns += static_cast<double>(mine.back());
        run.ns.insert(run.ns.end(), mine.begin(), mine.end() - 1);
        reapWorker(ws[i]);
        ::unlink((dir + "/w" + std::to_string(i)).c_str());
    }
    ::rmdir(dir.c_str());
    run.ops_per_s = static_cast<double>(run.ns.size()) / (static_cast<double>(ms) / 1e3);
    return run;
}

// The concurrency target next to its floor: the same processes making null RPCs.
void clients(const Options &opt, Results &out, BrokerHarness &broker) {
    const uint32_t n = opt.quick ? 4 : opt.clients;
    const uint64_t ms = opt.quick ? 200 : 5000;
    const std::string tag = std::to_string(opt.clients) + "clients";
    const std::string what = std::to_string(n) + " processes, " + std::to_string(ms) + " ms";
    ChurnRun floor = churnRun(n, ms, true, broker);
    ChurnRun run = churnRun(n, ms, false, broker);
    out.add("floors", "null_rpc_ops_per_s_" + tag, floor.ops_per_s, "ops/s", what + ", Health/Check");
    out.add("floors", "null_rpc_p99_us_" + tag, percentile(floor.ns, 99) / 1e3, "us");
    out.add("control", "ops_per_s_" + tag, run.ops_per_s, "ops/s", what + ", CreateQp + DestroyQp");
    out.add("control", "p99_us_" + tag, percentile(run.ns, 99) / 1e3, "us");
    out.add("control", "p50_us_" + tag, percentile(run.ns, 50) / 1e3, "us");
    out.add("control", "ops_over_null_rpc_" + tag, floor.ops_per_s > 0 ? run.ops_per_s / floor.ops_per_s : 0,
            "x", "share of the null-RPC throughput of the same processes");
    // Where the CPU goes, per call: a busy shared machine lowers the throughputs above more
    // than these.
    for (auto [r, name] : {std::pair{&floor, "null_rpc"}, std::pair{&run, "op"}}) {
        double calls = static_cast<double>(std::max<size_t>(r->ns.size(), 1));
        out.add("control", std::string("client_cpu_us_per_") + name + "_" + tag,
                r->client_cpu_ns / calls / 1e3, "us", "tenant processes' CPU time (all threads) / calls");
        if (r->broker_cpu_ns >= 0) {
            out.add("control", std::string("broker_cpu_us_per_") + name + "_" + tag,
                    r->broker_cpu_ns / calls / 1e3, "us", "broker CPU time over the run / calls");
        }
    }
    if (floor.broker_cpu_ns > 0 && run.broker_cpu_ns >= 0 && !run.ns.empty() && !floor.ns.empty()) {
        double op = run.broker_cpu_ns / static_cast<double>(run.ns.size());
        double null_rpc = floor.broker_cpu_ns / static_cast<double>(floor.ns.size());
        out.add("control", "broker_cpu_op_over_null_rpc_" + tag, op / null_rpc, "x",
                "broker CPU per mutating call / per null RPC, same processes (goal <= 1.5)");
    }
}

// Polls the broker until it holds no more objects, sessions and arena bytes than `base`; ms.
// The arena condition matters: GetStats stops counting a session's objects as soon as its end
// begins, while its queues (arena memory) are only released as they are destroyed, CQs after QPs.
double waitReclaimed(BrokerHarness &broker, const BrokerStats &base, Clock::time_point t0) {
    for (;;) {
        BrokerStats s = broker.stats();
        if (s.objects <= base.objects && s.sessions <= base.sessions && s.arena_bytes <= base.arena_bytes) {
            return static_cast<double>(nsSince(t0)) / 1e6;
        }
        if (nsSince(t0) > 120'000'000'000ull) {
            die("the broker did not reclaim a session within 120 s");
        }
        // Leaves the CPU to the broker and the exiting tenant (this thread may be SCHED_FIFO).
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
}

// ---- scale ----------------------------------------------------------------------------------

// `sessions` tenant processes, each with context, PD, CQ and qps/sessions QPs, all live at once.
void scale(const Options &opt, Results &out, BrokerHarness &broker) {
    const uint32_t sessions = opt.quick ? 4 : opt.scale_sessions;
    const uint32_t qps = opt.quick ? 40 : opt.scale_qps;
    const uint32_t per = (qps + sessions - 1) / sessions;
    BrokerStats base = broker.stats();
    long anon0 = broker.statusKiB("RssAnon");
    std::vector<Worker> ws;
    ws.reserve(sessions);
    auto t0 = Clock::now();
    // A few spawns in flight: 1,000 at once would only thrash two cores.
    constexpr size_t kWindow = 8;
    size_t confirmed = 0;
    for (uint32_t i = 0; i < sessions; ++i) {
        ws.push_back(spawnWorker({"hold", std::to_string(per)}));
        while (ws.size() - confirmed > kWindow || (i + 1 == sessions && confirmed < ws.size())) {
            if (readByte(ws[confirmed], 120000) != 'S') {
                die("scale worker " + std::to_string(confirmed) + " did not open its session");
            }
            ++confirmed;
        }
    }
    double open_ms = static_cast<double>(nsSince(t0)) / 1e6;
    long anon1 = broker.statusKiB("RssAnon");
    long long state1 = broker.memfdBytes("ibvx-state-");
    BrokerStats opened = broker.stats();
    t0 = Clock::now();
    confirmed = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
        sendByte(ws[i], 'C');
        while (i + 1 - confirmed > kWindow || (i + 1 == ws.size() && confirmed < ws.size())) {
            if (readByte(ws[confirmed], 120000) != 'R') {
                die("scale worker " + std::to_string(confirmed) + " could not create its QPs");
            }
            ++confirmed;
        }
    }
    double create_ms = static_cast<double>(nsSince(t0)) / 1e6;
    long anon2 = broker.statusKiB("RssAnon");
    long long state2 = broker.memfdBytes("ibvx-state-");
    BrokerStats full = broker.stats();
    uint64_t live = full.objects - opened.objects;
    out.add("scale", "live_qps", static_cast<double>(live), "QPs",
            std::to_string(per) + " per session, created in " + std::to_string(static_cast<int>(create_ms)) +
                " ms");
    out.add("scale", "sessions", static_cast<double>(full.sessions - base.sessions), "sessions",
            "tenant processes, opened in " + std::to_string(static_cast<int>(open_ms)) + " ms");
    // Where a QP's bytes go: the broker's heap (objects, the driver's QP, stored replies, the
    // restart layer's bookkeeping) and its restart state files (memfds, shmem: not in RssAnon).
    const double anon_per_qp = static_cast<double>(anon2 - anon1) * 1024.0 / static_cast<double>(live);
    const double state_per_qp =
        state1 < 0 || state2 < 0 ? 0.0 : static_cast<double>(state2 - state1) / static_cast<double>(live);
    out.add("scale", "broker_anon_bytes_per_qp", anon_per_qp, "B",
            "broker RssAnon growth / QPs (objects, driver QPs, stored replies; queue buffers are memfd)");
    out.add("scale", "broker_state_bytes_per_qp", state_per_qp, "B",
            state1 < 0 ? "restart state files: /proc/<broker>/fd unreadable, counted as 0"
                       : "restart state files (ibvx-state-* memfds, allocated blocks) growth / QPs");
    out.add("scale", "broker_bytes_per_qp", anon_per_qp + state_per_qp, "B",
            "the two above: a QP's broker footprint, restart state included (goal <= 2048)");
    // The heap's share that is softnda's own QP (measured in this process: the broker loads
    // the same driver), and the rest: the broker's objects, handles and stored replies.
    const uint32_t driver_qps = std::min<uint32_t>(qps, 10000);
    const double driver_per_qp = softndaHeapBytesPerQp(opt, driver_qps);
    out.add("scale", "softnda_heap_bytes_per_qp", driver_per_qp, "B",
            "softnda's heap growth / QP, " + std::to_string(driver_qps) +
                " QPs of this shape made in-process (mallinfo2; queue memory apart)");
    const double replies_per_qp =
        static_cast<double>(full.stored_reply_bytes - opened.stored_reply_bytes) / static_cast<double>(live);
    out.add("scale", "broker_reply_bytes_per_qp", replies_per_qp, "B",
            "stored replies' heap growth / QP (GetStats; each session keeps its newest 64)");
    out.add("scale", "broker_core_bytes_per_qp", anon_per_qp - driver_per_qp - replies_per_qp, "B",
            "broker_anon_bytes_per_qp less softnda's and the replies': objects, handles, restart "
            "bookkeeping, allocator");
    out.add("scale", "broker_bytes_per_session",
            static_cast<double>(anon1 - anon0) * 1024.0 / static_cast<double>(sessions), "B",
            "broker RssAnon growth / session (context, PD, CQ, two connections)");
    out.add("scale", "broker_arena_bytes_per_qp",
            static_cast<double>(full.arena_bytes - opened.arena_bytes) / static_cast<double>(live), "B",
            "queue buffers (session arenas), for reference");
    t0 = Clock::now();
    for (auto &w : ws) {
        sendByte(w, 'Q');
    }
    double all_ms = waitReclaimed(broker, base, t0);
    out.add("scale", "teardown_all_ms", all_ms, "ms", "every scale session ends at once");
    for (auto &w : ws) {
        reapWorker(w);
    }
}

// One session with 10,000 QPs ends (its process exits); until the broker holds none of them.
void teardown(const Options &opt, Results &out, BrokerHarness &broker) {
    const uint32_t n = opt.quick ? 100 : 10000;
    BrokerStats base = broker.stats();
    Worker w = spawnWorker({"hold", std::to_string(n)});
    if (readByte(w, 60000) != 'S' || !sendByte(w, 'C') || readByte(w, 600000) != 'R') {
        die("teardown worker");
    }
    auto t0 = Clock::now();
    sendByte(w, 'Q');
    out.add("scale", "teardown_10k_ms", waitReclaimed(broker, base, t0), "ms",
            std::to_string(n) + " QPs of one session, from its exit to the broker holding none");
    reapWorker(w);
}

// A tenant with a brought-up QP and an MR is SIGKILLed; until the broker holds nothing of it.
void reclaim(const Options &opt, Results &out, BrokerHarness &broker) {
    const int reps = opt.quick ? 1 : 20;
    std::vector<uint64_t> us;
    for (int i = 0; i < reps; ++i) {
        BrokerStats base = broker.stats();
        Worker w = spawnWorker({"bringup"});
        if (readByte(w, 60000) != 'R') {
            die("reclaim worker");
        }
        auto t0 = Clock::now();
        ::kill(w.pid, SIGKILL);
        us.push_back(static_cast<uint64_t>(waitReclaimed(broker, base, t0) * 1e3));
        reapWorker(w);
    }
    out.add("scale", "reclaim_after_kill_ms", percentile(us, 50) / 1e3, "ms",
            "SIGKILL of a tenant to its objects gone (median of " + std::to_string(reps) + ")");
}

// ---- restart with live queues (docs/restart.md) ----------------------------------------------

// The longest completion gap this process's WRITE loop sees across each of `reps` broker restarts,
// with a second tenant holding QPs (100 QPs in all); then one restart with a session of 10,000
// objects: how long the handover and the restore took.
void restartScenario(const Options &opt, Results &out, BrokerHarness &broker) {
    if (!broker.owned()) {
        return;  // never restart a broker the tool did not start
    }
    if (const char *emu = std::getenv("IBV_EXTEND_PERF_EMULATOR"); emu != nullptr && *emu != '\0') {
        // A restart execs the broker's own binary, which under qemu-user without a binfmt_misc
        // handler the kernel cannot start (docs/arm64.md): nothing to measure there.
        std::cerr << "ibv-extend-perf: restart scenario skipped under an emulator (the broker cannot exec "
                     "itself)\n";
        return;
    }
    const int reps = opt.quick ? 2 : 10;
    Worker other = spawnWorker({"hold", "98"});
    if (readByte(other, 60000) != 'S' || !sendByte(other, 'C') || readByte(other, 120000) != 'R') {
        die("restart worker");
    }
    std::vector<uint64_t> gaps;
    {
        BrokerProbe probe;  // this process's two QPs
        std::atomic<bool> stop{false};
        std::atomic<uint64_t> max_gap{0};
        std::thread loop([&] {
            auto last = Clock::now();
            while (!stop.load(std::memory_order_relaxed)) {
                probe.once();
                auto t = Clock::now();
                uint64_t gap = static_cast<uint64_t>(
                    std::chrono::duration_cast<std::chrono::nanoseconds>(t - last).count());
                uint64_t seen = max_gap.load(std::memory_order_relaxed);
                while (gap > seen && !max_gap.compare_exchange_weak(seen, gap)) {
                }
                last = t;
            }
        });
        for (int i = 0; i < reps; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            max_gap.store(0);
            broker.restart();
            std::this_thread::sleep_for(std::chrono::milliseconds(100));  // completions resume
            gaps.push_back(max_gap.exchange(0));
        }
        stop.store(true);
        loop.join();
    }
    reapWorker(other);
    out.add("restart", "restart_stall_ms_p50", percentile(gaps, 50) / 1e6, "ms",
            "longest completion gap of a WRITE loop across a restart (2 tenants, 100 QPs), median of " +
                std::to_string(reps));
    out.add("restart", "restart_stall_ms_max", percentile(gaps, 100) / 1e6, "ms",
            "goal <= 100 (the worst of them)");
    const uint32_t n = opt.quick ? 200 : 10000;
    Worker big = spawnWorker({"hold", std::to_string(n)});
    if (readByte(big, 60000) != 'S' || !sendByte(big, 'C') || readByte(big, 600000) != 'R') {
        die("restart restore worker");
    }
    uint64_t took = broker.restart();
    out.add("restart", "restart_restore_ms", static_cast<double>(took), "ms",
            "handover and restore of a session of " + std::to_string(n + 3) +
                " objects (old process stops to new one serving)");
    reapWorker(big);
}

void ratio(Results &out, const char *sec, const char *key, const char *num_sec, const char *num,
           const char *den_sec, const char *den, const char *note) {
    const Row *a = out.find(num_sec, num);
    const Row *b = out.find(den_sec, den);
    if (a != nullptr && b != nullptr && b->value > 0) {
        out.add(sec, key, a->value / b->value, "x", note);
    }
}

}  // namespace

bool wantsBroker(const Options &opt) {
    for (const char *s : {"nullrpc", "write8broker", "verbs", "createqp", "bringup", "clients", "scale",
                          "teardown", "reclaim", "restart", "middleware", "fork"}) {
        if (opt.wants(s)) {
            return true;
        }
    }
    return false;
}

void runFloorsUds(const Options &opt, Results &out) {
    if (opt.wants("uds")) {
        udsPingPong(opt, out);
    }
}

void runBrokered(const Options &opt, Results &out) {
    if (!wantsBroker(opt)) {
        return;
    }
    BrokerHarness broker(opt.daemon, opt.socket, opt.engine_threads, 50);
    // The client library decides its mode once, on its first call: from here on, broker mode.
    ::setenv("IBV_EXTEND_MODE", "broker", 1);
    ::setenv("IBV_EXTEND_SOCKET", broker.socket().c_str(), 1);
    if (opt.wants("nullrpc")) {
        nullRpc(opt, out, broker);
    }
    if (opt.wants("write8broker")) {
        write8Broker(opt, out, broker);
    }
    if (opt.wants("verbs")) {
        verbsSection(opt, out, broker);
    }
    if (opt.wants("createqp")) {
        createQpBroker(opt, out, broker);
    }
    if (opt.wants("bringup")) {
        bringupBroker(opt, out);
    }
    if (opt.wants("clients")) {
        clients(opt, out, broker);
    }
    if (opt.wants("reclaim")) {
        reclaim(opt, out, broker);
    }
    if (opt.wants("teardown")) {
        teardown(opt, out, broker);
    }
    if (opt.wants("scale")) {
        scale(opt, out, broker);
    }
    if (opt.wants("restart")) {
        restartScenario(opt, out, broker);
    }
    if (opt.wants("middleware")) {
        middlewareSection(opt, out, broker.socket());
    }
    if (opt.wants("fork")) {
        forkSection(opt, out);
    }
    ratio(out, "fastpath", "write8_over_shm_floor", "fastpath", "write8_p50_ns_broker", "floors",
          "shm_pingpong_p50_ns", "goal <= 10 (broker figure)");
    ratio(out, "control", "bringup_over_null_rpc", "control", "bringup_p50_us_broker", "floors",
          "null_rpc_p50_us", "bring-up p50 / null RPC p50 (goal <= 4)");
}

}  // namespace ibvx::perf
