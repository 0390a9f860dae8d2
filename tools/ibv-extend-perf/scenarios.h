// Scenario functions of ibv-extend-perf. Each measures one thing and adds its figures to a
// Results; the broker scenarios (issue 7) join as further functions of the same shape.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ibv_extend.h>

#include "tools/ibv-extend-perf/results.h"

namespace ibvx::perf {

struct Options {
    bool quick = false;              // seconds-long smoke run; figures are not meaningful
    uint32_t engine_threads = 1;     // softnda engine threads
    std::vector<std::string> only;   // scenario names to run; empty = all
    std::string daemon;              // ibv-extendd to start ("" = found next to the tool)
    std::string socket;              // a running broker to use instead ("" = start one)
    uint32_t clients = 32;           // tenant processes of the concurrency scenario
    uint32_t scale_sessions = 1000;  // tenant processes of the scale scenario
    uint32_t scale_qps = 100000;     // QPs over all of them
    bool wants(const std::string &name) const {
        if (only.empty()) {
            return true;
        }
        for (const auto &o : only) {
            if (o == name) {
                return true;
            }
        }
        return false;
    }
};

// Percentile (0..100) of samples (sorted in place).
double percentile(std::vector<uint64_t> &samples, double pct);

using Clock = std::chrono::steady_clock;

inline uint64_t nsSince(Clock::time_point t0) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// The QP every scenario uses: RC, one CQ for both queues, sq_depth send WRs, one receive WR,
// one SGE each way. Callers add the queue-memory mode or ops table.
inline ibv_qp_init_attr_extend rcQpAttr(ibv_pd *pd, ibv_cq *cq, uint32_t sq_depth) {
    ibv_qp_init_attr_extend qa{};
    qa.pd = pd;
    qa.attr.send_cq = cq;
    qa.attr.recv_cq = cq;
    qa.attr.qp_type = IBV_QPT_RC;
    qa.attr.cap.max_send_wr = sq_depth;
    qa.attr.cap.max_recv_wr = 1;
    qa.attr.cap.max_send_sge = 1;
    qa.attr.cap.max_recv_sge = 1;
    return qa;
}

// Calls one_ns() warmup + iters times and keeps the last iters figures it returns.
template <typename F>
std::vector<uint64_t> timedSamples(int iters, int warmup, F one_ns) {
    std::vector<uint64_t> ns;
    ns.reserve(static_cast<size_t>(iters));
    for (int i = 0; i < iters + warmup; ++i) {
        uint64_t t = one_ns();
        if (i >= warmup) {
            ns.push_back(t);
        }
    }
    return ns;
}

// Scenario names (for --only): pingpong, memcpy, uds, write8, unreliable, idle10k, msgrate, write1m, nullrpc,
// write8broker, verbs, createqp, bringup, clients, reclaim, teardown, scale, restart, middleware, fork,
// udp, roce.

// floors.shm_pingpong_p50_ns / _p99_ns: a cache line bounced between two threads (round trip).
// floors.memcpy_gbps: single-thread memcpy of 1 MiB buffers.
void runFloors(const Options &opt, Results &out);

// In-process softnda ("direct"): 8 B WRITE post->CQE latency, 8 B WRITE message rate with
// doorbell batching and selective signaling, 1 MiB WRITE bandwidth; and the ratios against
// the floors measured in the same run.
void runSoftndaDirect(const Options &opt, Results &out);

// floors.uds_pingpong_p50_us / _p99_us: one byte there and back over a Unix socket pair.
void runFloorsUds(const Options &opt, Results &out);

// One 8 B RDMA WRITE, post + doorbell -> CQE, per call; ns. The paired fast-path comparison
// alternates blocks of a direct and a brokered probe so both see the same machine state.
class Write8Probe {
  public:
    virtual ~Write8Probe() = default;
    virtual uint64_t once() = 0;
};
// In-process softnda, its engine idle after spin_us.
std::unique_ptr<Write8Probe> makeDirectWrite8Probe(const Options &opt, uint32_t spin_us);

// control.create_qp_p50_us_direct: the driver's create_qp in this process.
void runControlDirect(const Options &opt, Results &out);
// The heap bytes softnda holds per QP of the scale scenario's shape (RC, SQ depth 1): its heap's
// growth (mallinfo2, every arena) while this process makes `qps` of them, queue memory apart.
double softndaHeapBytesPerQp(const Options &opt, uint32_t qps);

// Everything through a broker (started on a temp socket, or opt.socket): null RPC floor,
// write8 with broker-made queues (+ RPCs and syscalls during it), create_qp and bring-up,
// concurrent tenant processes, scale, teardown and reclaim; then the broker/direct ratios.
// Switches this process's client library to broker mode.
void runBrokered(const Options &opt, Results &out);
bool wantsBroker(const Options &opt);

// UCX put_lat/put_bw and Open MPI's ping-pong between tenants of ibv-extend-run on the broker at
// socket, beside softnda's helpers and ibv_rc_pingpong (middleware.cc).
void middlewareSection(const Options &opt, Results &out, const std::string &socket);

// fork() of a process with memory registered through the face, beside the same memory
// unregistered (fork_cost.cc).
void forkSection(const Options &opt, Results &out);

// Two namespaces joined by a veth pair, one broker each (roce.cc): the UDP floor of that path
// (scenario udp) and RDMA WRITE/SEND through the brokers beside it (scenario roce, which measures
// the floor too). Root only; skipped with a line otherwise, and in --quick unless named.
void runRoce(const Options &opt, Results &out);

// machine.cores, kernel, cpu, date, git_commit.
void collectMachine(Results &out);

}  // namespace ibvx::perf
