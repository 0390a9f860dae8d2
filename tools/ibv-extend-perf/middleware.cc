// The middleware scenario: what UCX and Open MPI cost through the broker, measured beside the same
// transfers without the middleware in one run.
//  - UCX's UCT-level put_lat (8 B) and put_bw (64 KiB), Debian's ucx_perftest between two tenants
//    of ibv-extend-run over rc_verbs on softnda0, against the same puts through softnda's
//    device-side helpers (softnda_device.h) on broker-made queues in this process: two threads
//    bouncing an 8 B RDMA WRITE, each spinning on its own slot until the peer's put lands (what
//    put_lat does), and a window of 64 KiB WRITEs (what put_bw does).
//  - Open MPI's 8 B ping-pong (ibvx-mpi-pingpong, UCX pml, verbs transports only) beside Debian's
//    ibv_rc_pingpong through the face, both round trips between two tenants.
// The programs are found at configure time (CMakeLists.txt); a build without them (a cross build,
// a machine without ucx-utils or Open MPI) skips the part that needs them and says so.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "common/cpu.h"
#include "common/tcp_ports.h"
#include "common/unique_fd.h"
#include "providers/softnda/include/softnda_device.h"
#include "tools/ibv-extend-perf/broker_harness.h"
#include "tools/ibv-extend-perf/broker_queues.h"
#include "tools/ibv-extend-perf/programs.h"
#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/workers.h"
#include "tools/ibv-extend-perf/wr.h"

namespace ibvx::perf {
namespace {

[[noreturn]] void fail(const std::string &what) {
    throw std::runtime_error("middleware: " + what);
}

// ---- the same puts through softnda's helpers ----------------------------------------------

constexpr size_t kSlot = 0;     // the 8 B a peer's put lands in
constexpr size_t kSource = 64;  // the 8 B this side puts
constexpr size_t kBulk = 4096;  // the 64 KiB of put_bw
constexpr uint32_t kBulkBytes = 65536;
constexpr size_t kBufBytes = kBulk + kBulkBytes;

// One end: its own CQ and QP (so each thread polls only its own queues) and a registered buffer.
struct End {
    ibv_cq_extend *cq = nullptr;
    ibv_qp_extend *qp = nullptr;
    uint8_t *buf = nullptr;
    ibv_mr *mr = nullptr;
    softnda_sq sq{};
    softnda_cq cqh{};

    uint64_t slot() const {
        return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t *>(buf + kSlot))
            .load(std::memory_order_acquire);
    }
};

class HelperPuts {
  public:
    HelperPuts() {
        for (End *e : {&a_, &b_}) {
            e->cq = base_.createCq(64);
            e->qp = base_.createQp(e->cq, 64);
            e->buf = static_cast<uint8_t *>(ibvx_alloc_buf(kBufBytes));
            if (e->buf == nullptr) {
                fail("ibvx_alloc_buf");
            }
            std::memset(e->buf, 0, kBufBytes);
            e->mr =
                ibvx_reg_mr(base_.pd, e->buf, kBufBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            if (e->mr == nullptr) {
                fail("ibvx_reg_mr");
            }
            if (softnda_sq_init(&e->sq, &e->qp->sq_info) != 0 ||
                softnda_cq_init(&e->cqh, &e->cq->cq_info) != 0) {
                fail("queue_info of a broker-made queue");
            }
        }
        toRts(a_.qp->qp, b_.qp->qp->qp_num);
        toRts(b_.qp->qp, a_.qp->qp->qp_num);
    }
    ~HelperPuts() {
        for (End *e : {&a_, &b_}) {
            ibvx_dereg_mr(e->mr);
            ibvx_free_buf(e->buf);
            ibv_destroy_qp_extend(base_.ctx, e->qp);
            ibv_destroy_cq_extend(base_.ctx, e->cq);
        }
    }
    HelperPuts(const HelperPuts &) = delete;
    HelperPuts &operator=(const HelperPuts &) = delete;

    // One-way latency (half of each round trip), ns, of the measured rounds after warmup.
    std::vector<uint64_t> latency(int iters, int warmup) {
        const uint64_t total = static_cast<uint64_t>(iters + warmup);
        std::vector<uint64_t> half_rtt;
        half_rtt.reserve(static_cast<size_t>(iters));
        // Either side failing stops the other: the echo thread is joined before any error
        // leaves this function (a joinable std::thread destroyed would terminate the tool).
        std::atomic<bool> stop{false};
        std::exception_ptr echo_error;
        std::thread echo([&] {
            try {
                for (uint64_t i = 1; i <= total; ++i) {
                    while (b_.slot() != i) {
                        if (stop) {
                            return;
                        }
                        ibvx_cpu_relax();
                    }
                    put8(b_, a_, i);
                }
            } catch (...) {
                echo_error = std::current_exception();
                stop = true;
            }
        });
        try {
            for (uint64_t i = 1; i <= total && !stop; ++i) {
                auto t0 = Clock::now();
                put8(a_, b_, i, [&] {
                    while (a_.slot() != i && !stop) {
                        ibvx_cpu_relax();
                    }
                });
                if (i > static_cast<uint64_t>(warmup) && !stop) {
                    half_rtt.push_back(nsSince(t0) / 2);
                }
            }
        } catch (...) {
            stop = true;
            echo.join();
            throw;
        }
        echo.join();
        if (echo_error) {
            std::rethrow_exception(echo_error);
        }
        return half_rtt;
    }

    // 64 KiB WRITEs from a to b, `window` in flight, for about `seconds`; MiB/s (UCX's MB/s).
    double bandwidth(double seconds, int window) {
        softnda_sge sge{reinterpret_cast<uintptr_t>(a_.buf + kBulk), kBulkBytes, a_.mr->lkey};
        const uint64_t remote = reinterpret_cast<uintptr_t>(b_.buf + kBulk);
        uint64_t posted = 0, done = 0;
        softnda_cqe e[16];
        auto drain = [&] {
            int n = softnda_cq_poll(&a_.cqh, e, 16);
            for (int k = 0; k < n; ++k) {
                if (e[k].status != IBV_WC_SUCCESS) {
                    fail("a 64 KiB WRITE completed with status " + std::to_string(e[k].status));
                }
            }
            if (n < 0) {
                fail("the CQ of the bandwidth QP is in error");
            }
            done += static_cast<uint64_t>(n);
        };
        const auto t0 = Clock::now();
        const auto until =
            t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
        while (Clock::now() < until) {
            bool rang = false;
            while (posted - done < static_cast<uint64_t>(window)) {
                softnda_send_wr w = rdmaWrite(&sge, remote, b_.mr->rkey, SOFTNDA_WQE_SIGNALED, posted++);
                softnda_sq_post(&a_.sq, &w);
                rang = true;
            }
            if (rang) {
                softnda_sq_doorbell(&a_.sq);
            }
            drain();
        }
        while (done < posted) {
            drain();
        }
        const double secs = static_cast<double>(nsSince(t0)) / 1e9;
        return static_cast<double>(done) * kBulkBytes / (1024.0 * 1024.0) / secs;
    }

  private:
    // An 8 B put of `value` from `from`'s source into `to`'s slot; wait() runs between the
    // doorbell and reaping the completion (the latency side spins for the answer there).
    template <typename Wait = void (*)()>
    void put8(
        End &from, const End &to, uint64_t value, Wait wait = [] {}) {
        std::memcpy(from.buf + kSource, &value, sizeof(value));
        softnda_sge sge{reinterpret_cast<uintptr_t>(from.buf + kSource), 8, from.mr->lkey};
        softnda_send_wr w = rdmaWrite(&sge, reinterpret_cast<uintptr_t>(to.buf + kSlot), to.mr->rkey,
                                      SOFTNDA_WQE_SIGNALED, value);
        softnda_sq_post(&from.sq, &w);
        softnda_sq_doorbell(&from.sq);
        wait();
        if (int st = waitOneCqe(&from.cqh); st != IBV_WC_SUCCESS) {
            fail("an 8 B put completed with status " + std::to_string(st));
        }
    }

    BrokerBase base_;
    End a_, b_;
};

// ---- programs nobody here wrote, as tenants (programs.h) --------------------------------------

// A server program and its client on a fresh loopback port (the programs' out-of-band exchange):
// the client starts once the server listens; the client's output.
template <typename Server, typename Client>
std::string serverAndClient(Server server, Client client, const std::vector<std::string> &env) {
    const int port = freePort();
    Program s(server(port), env);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!listening(port)) {
        if (Clock::now() > deadline) {
            fail("the server never listened on port " + std::to_string(port) + ":\n" +
                 s.finish(std::chrono::milliseconds(0)));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Program c(client(port), env);
    std::string out = c.finish(std::chrono::minutes(3));
    s.finish(std::chrono::seconds(30));
    return out;
}

// The number after `key` in text (the first occurrence), or throws.
double numberAfter(const std::string &text, const std::string &key, int skip = 0) {
    size_t at = text.find(key);
    if (at == std::string::npos) {
        fail("no \"" + key + "\" in:\n" + text);
    }
    std::istringstream in(text.substr(at + key.size()));
    double v = 0;
    for (int i = 0; i <= skip; ++i) {
        if (!(in >> v)) {
            fail("no number after \"" + key + "\" in:\n" + text);
        }
    }
    return v;
}

// The number just before `key` ("... = 10.50 usec/iter"), or throws.
double numberBefore(const std::string &text, const std::string &key) {
    size_t at = text.find(key);
    size_t from = at == std::string::npos ? std::string::npos : text.rfind(' ', at == 0 ? 0 : at - 1);
    if (at == std::string::npos || from == std::string::npos) {
        fail("no number before \"" + key + "\" in:\n" + text);
    }
    return std::strtod(text.c_str() + from + 1, nullptr);
}

const std::vector<std::string> kUcxEnv = {"UCX_WARN_UNUSED_ENV_VARS=n"};

// ucx_perftest's "Final:" row: iterations, typical (50th percentile) / average / overall latency
// (us), average /
// overall bandwidth (MB/s, 2^20 bytes), average / overall message rate.
std::string ucxPerftest(const std::string &socket, const std::vector<std::string> &test) {
    auto server = [&](int port) {
        return tenant(socket, {IBVX_PERF_UCX_PERFTEST, "-p", std::to_string(port), "-d", "softnda0:1", "-x",
                               "rc_verbs"});
    };
    auto client = [&](int port) {
        std::vector<std::string> argv = server(port);
        argv.insert(argv.begin() + 6, "127.0.0.1");
        argv.insert(argv.end(), test.begin(), test.end());
        return argv;
    };
    return serverAndClient(server, client, kUcxEnv);
}

void ucxSection(const Options &opt, Results &out, const std::string &socket) {
    HelperPuts helpers;
    const int iters = opt.quick ? 1000 : 100000;
    std::vector<uint64_t> h = helpers.latency(iters, opt.quick ? 100 : 10000);
    const double helpers_p50 = percentile(h, 50);
    std::string lat = ucxPerftest(socket, {"-t", "put_lat", "-s", "8", "-n", std::to_string(iters)});
    const double ucx_typical_ns = numberAfter(lat, "Final:", 1) * 1e3;
    out.add("middleware", "helpers_put_lat_p50_ns", helpers_p50, "ns",
            "8 B put ping-pong, half round trip, softnda helpers on broker queues, two threads");
    out.add("middleware", "ucx_put_lat_ns", ucx_typical_ns, "ns",
            "ucx_perftest put_lat 8 B rc_verbs, typical, two tenants of ibv-extend-run");
    out.add("middleware", "ucx_put_lat_over_helpers", ucx_typical_ns / std::max(helpers_p50, 1.0), "x",
            "goal <= 1.3");

    const double helpers_bw = helpers.bandwidth(opt.quick ? 0.2 : 3.0, 32);
    std::string bw = ucxPerftest(socket, {"-t", "put_bw", "-D", "zcopy", "-s", std::to_string(kBulkBytes),
                                          "-n", std::to_string(opt.quick ? 1000 : 50000)});
    const double ucx_bw = numberAfter(bw, "Final:", 5);
    out.add("middleware", "helpers_put_bw_mibs", helpers_bw, "MiB/s",
            "64 KiB RDMA WRITEs, 32 in flight, softnda helpers on broker queues");
    out.add("middleware", "ucx_put_bw_mibs", ucx_bw, "MiB/s", "ucx_perftest put_bw 64 KiB rc_verbs, overall");
    out.add("middleware", "ucx_put_bw_over_helpers", ucx_bw / std::max(helpers_bw, 1.0), "x", "goal >= 0.8");
}

void mpiSection(const Options &opt, Results &out, const std::string &socket) {
    const int iters = opt.quick ? 200 : 20000;
    std::vector<std::string> mpirun = {IBVX_PERF_MPIRUN,
                                       "--oversubscribe",
                                       "-np",
                                       "2",
                                       "--mca",
                                       "pml",
                                       "ucx",
                                       "--mca",
                                       "osc",
                                       "ucx",
                                       "--mca",
                                       "btl",
                                       "self"};
    if (::geteuid() == 0) {
        mpirun.push_back("--allow-run-as-root");  // the bench's job is root's when root runs it
    }
    std::vector<std::string> job = tenant(
        socket, {ourProgram("ibvx-mpi-pingpong", IBVX_PERF_MPI_PINGPONG), std::to_string(iters), "1000"});
    mpirun.insert(mpirun.end(), job.begin(), job.end());
    std::vector<std::string> env = kUcxEnv;
    env.push_back("UCX_TLS=rc_verbs,ud_verbs,self");  // every message crosses softnda
    std::string mpi = Program(mpirun, env).finish(std::chrono::minutes(3));
    if (numberAfter(mpi, "bad_messages") != 0) {
        fail("ibvx-mpi-pingpong saw wrong messages:\n" + mpi);
    }
    const double mpi_rtt = numberAfter(mpi, "rtt_us");

    auto rc = [&](int port) {
        return tenant(socket, {"/usr/bin/ibv_rc_pingpong", "-d", "softnda0", "-s", "8", "-n",
                               std::to_string(iters), "-p", std::to_string(port)});
    };
    std::string pp = serverAndClient(rc,
                                     [&](int port) {
                                         auto argv = rc(port);
                                         argv.push_back("127.0.0.1");
                                         return argv;
                                     },
                                     {});
    const double rc_rtt = numberBefore(pp, " usec/iter");
    out.add("middleware", "mpi_pingpong_rtt_us", mpi_rtt, "us",
            "Open MPI 8 B MPI_Send/MPI_Recv round trip, UCX pml over rc_verbs/ud_verbs");
    out.add("middleware", "ibv_rc_pingpong_rtt_us", rc_rtt, "us",
            "ibv_rc_pingpong -s 8 usec/iter through the face");
    out.add("middleware", "mpi_over_rc_pingpong", mpi_rtt / std::max(rc_rtt, 1e-3), "x",
            "what Open MPI and UCX add to a verbs round trip");
}

}  // namespace

void middlewareSection(const Options &opt, Results &out, const std::string &socket) {
    // UCX's and Open MPI's processes run SCHED_OTHER; under --sched-fifo the helpers' threads
    // would outrank them on the same cores. Both sides run as the tenants do, for this section.
    SchedOtherScope as_tenants;
    if (std::string(IBVX_PERF_UCX_PERFTEST).empty()) {
        std::cerr << "middleware: no ucx_perftest in this build (ucx-utils, native builds only); UCX part "
                     "skipped\n";
    } else {
        ucxSection(opt, out, socket);
    }
    if (std::string(IBVX_PERF_MPIRUN).empty() || std::string(IBVX_PERF_MPI_PINGPONG).empty()) {
        std::cerr
            << "middleware: no Open MPI in this build (openmpi-bin, libopenmpi-dev); MPI part skipped\n";
    } else {
        mpiSection(opt, out, socket);
    }
}

}  // namespace ibvx::perf
