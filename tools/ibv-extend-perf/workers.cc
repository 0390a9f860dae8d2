#include "tools/ibv-extend-perf/workers.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include <grpcpp/grpcpp.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "tools/ibv-extend-perf/broker_harness.h"
#include "tools/ibv-extend-perf/scenarios.h"

extern char **environ;

namespace ibvx::perf {
namespace {

// The objects every worker starts with.
struct Base {
    ibv_context_extend *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_cq_extend *cq = nullptr;
};

bool openBase(Base &b) {
    b.ctx = ibvx_open_device("softnda0");
    if (b.ctx == nullptr) {
        return false;
    }
    b.pd = ibvx_alloc_pd(b.ctx);
    if (b.pd == nullptr) {
        return false;
    }
    ibv_cq_init_attr_extend ca{};
    ca.attr.cqe = 64;
    ca.type = QU_BUF_DMA_MODE_DEFAULT;
    b.cq = ibv_create_cq_extend(b.ctx, &ca);
    return b.cq != nullptr;
}

ibv_qp_extend *createQp(const Base &b, uint32_t depth) {
    ibv_qp_init_attr_extend qa = rcQpAttr(b.pd, b.cq->cq, depth);
    qa.type = QU_BUF_DMA_MODE_DEFAULT;
    return ibv_create_qp_extend(b.ctx, &qa);
}

char get(int fd) {
    char c = 0;
    ssize_t r;
    do {
        r = ::read(fd, &c, 1);
    } while (r < 0 && errno == EINTR);
    return r == 1 ? c : 0;
}

void put(char c) {
    ssize_t r;
    do {
        r = ::write(STDOUT_FILENO, &c, 1);
    } while (r < 0 && errno == EINTR);
}

int fail(const char *what) {
    std::fprintf(stderr, "ibv-extend-perf worker: %s: errno %d\n", what, errno);
    put('F');
    return 1;
}

// null: health checks instead of CreateQp/DestroyQp, on a channel of the worker's own and with
// no broker session: the floor of the same many-process load.
int churn(uint64_t ms, const std::string &file, bool null, uint32_t held = 0) {
    Base b;
    std::shared_ptr<grpc::Channel> channel;
    if (null) {
        const char *socket = std::getenv("IBV_EXTEND_SOCKET");
        if (socket == nullptr) {
            return fail("IBV_EXTEND_SOCKET unset");
        }
        channel = healthChannel(socket);
        healthCheckNs(channel.get());  // connected before the start
    } else if (!openBase(b)) {
        return fail("open");
    }
    for (uint32_t i = 0; i < held; ++i) {
        if (createQp(b, 1) == nullptr) {
            return fail("create_qp (held)");
        }
    }
    std::vector<uint64_t> ns;
    ns.reserve(1 << 16);
    put('R');
    if (get(STDIN_FILENO) != 'G') {
        return 1;
    }
    timespec cpu0{}, cpu1{};
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    auto start = Clock::now();
    while (nsSince(start) < ms * 1'000'000ull) {
        if (null) {
            ns.push_back(healthCheckNs(channel.get()));
            continue;
        }
        auto t0 = Clock::now();
        ibv_qp_extend *qp = createQp(b, 16);
        if (qp == nullptr) {
            return fail("create_qp");
        }
        ns.push_back(nsSince(t0));
        t0 = Clock::now();
        if (ibv_destroy_qp_extend(b.ctx, qp) != 0) {
            return fail("destroy_qp");
        }
        ns.push_back(nsSince(t0));
    }
    ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    // The last word is the CPU time the loop took in this process (all its threads: gRPC's too).
    ns.push_back(
        static_cast<uint64_t>((cpu1.tv_sec - cpu0.tv_sec) * 1'000'000'000ll + (cpu1.tv_nsec - cpu0.tv_nsec)));
    FILE *f = std::fopen(file.c_str(), "wb");
    if (f == nullptr || std::fwrite(ns.data(), sizeof(uint64_t), ns.size(), f) != ns.size() ||
        std::fclose(f) != 0) {
        return fail("write samples");
    }
    put('D');
    return 0;
}

int hold(uint32_t n) {
    Base b;
    if (!openBase(b)) {
        return fail("open");
    }
    put('S');
    if (get(STDIN_FILENO) != 'C') {
        _exit(0);
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (createQp(b, 1) == nullptr) {
            return fail("create_qp");
        }
    }
    put('R');
    get(STDIN_FILENO);
    _exit(0);  // the broker ends the session on its own (EOF of the fd channel)
}

int bringup() {
    Base b;
    if (!openBase(b)) {
        return fail("open");
    }
    ibv_qp_extend *qp = createQp(b, 16);
    void *buf = ibvx_alloc_buf(1 << 16);
    if (qp == nullptr || buf == nullptr ||
        ibvx_reg_mr(b.pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE) == nullptr) {
        return fail("qp/mr");
    }
    put('R');
    get(STDIN_FILENO);
    _exit(0);
}

}  // namespace

std::vector<std::string> emulatedArgv(std::vector<std::string> argv) {
    const char *emu = std::getenv("IBV_EXTEND_PERF_EMULATOR");
    if (emu != nullptr && *emu != '\0') {
        argv.insert(argv.begin(), emu);
    }
    return argv;
}

Worker spawnWorker(const std::vector<std::string> &args) {
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) < 0) {
        throw std::runtime_error("pipe2 failed");
    }
    if (::pipe2(from, O_CLOEXEC) < 0) {
        ::close(to[0]);
        ::close(to[1]);
        throw std::runtime_error("pipe2 failed");
    }
    std::string exe = selfExe();
    std::vector<std::string> store = {exe, "--worker"};
    store.insert(store.end(), args.begin(), args.end());
    store = emulatedArgv(std::move(store));
    std::vector<char *> argv;
    for (auto &s : store) {
        argv.push_back(s.data());
    }
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, from[1], STDOUT_FILENO);
    // Tenants run SCHED_OTHER, as real ones do, even when the tool runs SCHED_FIFO (a spawned
    // process would inherit it): at one FIFO priority a woken tenant waits until the running
    // ones block, and 32 calling tenants saw a 32 ms p99 from that alone.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sched_param sp{};
    posix_spawnattr_setschedpolicy(&attr, SCHED_OTHER);
    posix_spawnattr_setschedparam(&attr, &sp);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSCHEDULER);
    Worker w;
    int rc = posix_spawn(&w.pid, store[0].c_str(), &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    ::close(to[0]);
    ::close(from[1]);
    if (rc != 0) {
        ::close(to[1]);
        ::close(from[0]);
        throw std::runtime_error("posix_spawn of a worker failed");
    }
    w.to = to[1];
    w.from = from[0];
    return w;
}

bool sendByte(const Worker &w, char c) {
    ssize_t r;
    do {
        r = ::write(w.to, &c, 1);
    } while (r < 0 && errno == EINTR);
    return r == 1;
}

char readByte(const Worker &w, int timeout_ms) {
    pollfd p{w.from, POLLIN, 0};
    int n;
    do {
        n = ::poll(&p, 1, timeout_ms);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
        return 0;
    }
    char c = 0;
    return ::read(w.from, &c, 1) == 1 ? c : 0;
}

void reapWorker(Worker &w, int timeout_ms) {
    if (w.to >= 0) {
        ::close(w.to);
        w.to = -1;
    }
    if (w.from >= 0) {
        ::close(w.from);
        w.from = -1;
    }
    if (w.pid <= 0) {
        return;
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int st;
    while (::waitpid(w.pid, &st, WNOHANG) != w.pid) {
        if (Clock::now() > deadline) {
            ::kill(w.pid, SIGKILL);
            ::waitpid(w.pid, &st, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    w.pid = -1;
}

int workerMain(const std::vector<std::string> &args) {
    ::signal(SIGPIPE, SIG_IGN);
    if ((args.size() == 3 || (args.size() == 4 && args[3] == "null")) && args[0] == "churn") {
        return churn(std::strtoull(args[1].c_str(), nullptr, 10), args[2], args.size() == 4);
    }
    if (args.size() == 5 && args[0] == "churn" && args[3] == "held") {
        return churn(std::strtoull(args[1].c_str(), nullptr, 10), args[2], false,
                     static_cast<uint32_t>(std::strtoul(args[4].c_str(), nullptr, 10)));
    }
    if (args.size() == 2 && args[0] == "hold") {
        return hold(static_cast<uint32_t>(std::strtoul(args[1].c_str(), nullptr, 10)));
    }
    if (args.size() == 1 && args[0] == "bringup") {
        return bringup();
    }
    std::fprintf(stderr, "ibv-extend-perf: unknown --worker arguments\n");
    return 2;
}

}  // namespace ibvx::perf
