#include "tools/ibv-extend-perf/broker_harness.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>

#include "common/unix_socket.h"
#include "ibv_extend/v1/admin.grpc.pb.h"
#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/workers.h"

namespace ibvx::perf {
namespace {

bool answers(const std::string &path, pid_t *peer) {
    auto fd = connectUnix(path);
    if (!fd.isOk()) {
        return false;
    }
    if (peer != nullptr) {
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (::getsockopt(fd->get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
            *peer = cred.pid;
        }
    }
    return true;
}

std::string findDaemon(const std::string &given) {
    if (!given.empty()) {
        return given;
    }
    std::filesystem::path self = std::filesystem::path(selfExe()).parent_path();
    for (const auto &cand :
         {self / "ibv-extendd", self / "../../daemon/ibv-extendd", self / "../daemon/ibv-extendd"}) {
        if (::access(cand.c_str(), X_OK) == 0) {
            return std::filesystem::weakly_canonical(cand).string();
        }
    }
    throw std::runtime_error(
        "ibv-extendd not found next to the tool or in the build tree: pass --daemon PATH");
}

}  // namespace

std::string selfExe() {
    std::error_code ec;
    auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
    return ec ? std::string() : p.string();
}

struct BrokerHarness::Rpc {
    std::shared_ptr<grpc::Channel> admin_channel;
    std::unique_ptr<ibv_extend::v1::Admin::Stub> admin;
    std::shared_ptr<grpc::Channel> health_channel;
};

BrokerHarness::BrokerHarness(const std::string &daemon, const std::string &socket, uint32_t engine_threads,
                             uint32_t spin_us, int netns, const std::string &softnda_extra) {
    if (!socket.empty()) {
        socket_ = socket;
        if (!answers(socket_, &pid_)) {
            throw std::runtime_error("no broker answers on " + socket_);
        }
    } else {
        std::string binary = findDaemon(daemon);
        char tmpl[] = "/tmp/ibvx.XXXXXX";
        if (::mkdtemp(tmpl) == nullptr) {
            throw std::runtime_error("mkdtemp failed");
        }
        dir_ = tmpl;
        socket_ = dir_ + "/b.sock";
        std::string config = dir_ + "/ibv-extendd.toml";
        // max_qp leaves room for the scale scenario's 100,000 QPs plus the other scenarios'.
        std::ofstream(config) << "[broker]\nlog_level = \"warn\"\nattach_timeout_ms = 60000\n\n[softnda]\n"
                              << "engine_threads = " << engine_threads << "\nspin_us = " << spin_us
                              << "\nmax_qp = 262144\nmax_cq = 262144\n"
                              << softnda_extra;
        if (std::getenv("IBV_EXTEND_PROVIDER_DIR") == nullptr) {
            auto prov = std::filesystem::path(binary).parent_path() / "../providers-out";
            if (std::filesystem::exists(prov)) {
                ::setenv("IBV_EXTEND_PROVIDER_DIR", std::filesystem::weakly_canonical(prov).c_str(), 1);
            }
        }
        // 1,000 tenant sessions are 2,000 connections: the broker inherits this limit.
        rlimit rl{};
        if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
            rl.rlim_cur = rl.rlim_max;
            ::setrlimit(RLIMIT_NOFILE, &rl);
        }
        std::string log_path = dir_ + "/log";
        std::vector<std::string> store =
            emulatedArgv({binary, "--socket", socket_, "--foreground", "--config", config});
        std::vector<const char *> argv;
        for (const auto &a : store) {
            argv.push_back(a.c_str());
        }
        argv.push_back(nullptr);
        pid_ = ::fork();
        if (pid_ < 0) {
            throw std::runtime_error("fork failed");
        }
        if (pid_ == 0) {
            // The broker runs as a deployed one does, SCHED_OTHER, whatever this tool runs at:
            // gRPC's threads are not written for SCHED_FIFO (under it the broker burnt four times
            // the CPU per call). Only its emulated NIC is raised (raiseEngineThreads).
            sched_param other{};
            ::sched_setscheduler(0, SCHED_OTHER, &other);
            int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (log >= 0) {
                ::dup2(log, STDOUT_FILENO);
                ::dup2(log, STDERR_FILENO);
            }
            if (netns >= 0 && ::setns(netns, CLONE_NEWNET) != 0) {
                static const char kSetnsFailed[] = "setns into the broker's network namespace failed\n";
                (void)!::write(STDERR_FILENO, kSetnsFailed, sizeof(kSetnsFailed) - 1);
                _exit(126);
            }
            ::execv(argv[0], const_cast<char *const *>(argv.data()));
            _exit(127);
        }
        own_ = true;
        auto deadline = Clock::now() + std::chrono::seconds(30);
        // Ready once the socket answers and the discovery tree beside it is published: the broker
        // listens a moment before it publishes the tree, and a tenant started in between
        // (ibv-extend-run --sandbox=on) finds no tree to bind.
        const std::string tree = dir_ + "/discovery";
        for (;;) {
            if (answers(socket_, nullptr) && ::access(tree.c_str(), F_OK) == 0) {
                break;
            }
            int st;
            if (::waitpid(pid_, &st, WNOHANG) == pid_ || Clock::now() > deadline) {
                own_ = false;
                throw std::runtime_error("ibv-extendd did not start: " + log());
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    rpc_ = std::make_unique<Rpc>();
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    rpc_->admin_channel =
        grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args);
    rpc_->admin = ibv_extend::v1::Admin::NewStub(rpc_->admin_channel);
    rpc_->health_channel = healthChannel(socket_);
}

BrokerHarness::~BrokerHarness() {
    rpc_.reset();
    if (own_ && pid_ > 0) {
        ::kill(pid_, SIGTERM);
        auto deadline = Clock::now() + std::chrono::seconds(10);
        int st;
        while (::waitpid(pid_, &st, WNOHANG) != pid_) {
            if (Clock::now() > deadline) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, &st, 0);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    if (!dir_.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
}

BrokerStats BrokerHarness::stats() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ibv_extend::v1::GetStatsRequest req;
    ibv_extend::v1::GetStatsResponse resp;
    grpc::Status s = rpc_->admin->GetStats(&ctx, req, &resp);
    if (!s.ok()) {
        throw std::runtime_error("Admin/GetStats: " + s.error_message());
    }
    BrokerStats out;
    out.total_calls = resp.total_calls();
    out.sessions = resp.sessions();
    out.objects = resp.objects();
    out.arena_bytes = resp.arena_bytes();
    out.stored_reply_bytes = resp.stored_reply_bytes();
    for (const auto &e : resp.engines()) {
        for (const auto &c : e.counters()) {
            if (c.name() == "wakeups_by_hint") {
                out.engine_wakeups += c.value();
            }
        }
    }
    return out;
}

uint64_t BrokerHarness::restart() {
    auto status = [&](ibv_extend::v1::GetStatusResponse *resp) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        ctx.set_wait_for_ready(true);
        return rpc_->admin->GetStatus(&ctx, ibv_extend::v1::GetStatusRequest{}, resp);
    };
    ibv_extend::v1::GetStatusResponse before;
    if (!status(&before).ok()) {
        throw std::runtime_error("Admin/GetStatus failed before the restart");
    }
    {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        ibv_extend::v1::RestartResponse resp;
        grpc::Status s = rpc_->admin->Restart(&ctx, ibv_extend::v1::RestartRequest{}, &resp);
        if (!s.ok()) {
            throw std::runtime_error("Admin/Restart: " + s.error_message());
        }
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
        ibv_extend::v1::GetStatusResponse now;
        if (status(&now).ok() && now.restarts() > before.restarts()) {
            return now.last_restart_took_ms();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    throw std::runtime_error("the broker did not come back from its restart");
}

std::shared_ptr<grpc::Channel> healthChannel(const std::string &socket) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.use_local_subchannel_pool", 1);
    return grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
}

uint64_t healthCheckNs(grpc::Channel *channel) {
    // The sync path generated stubs use, with an empty (valid) HealthCheckRequest, so the figure
    // is the transport and the server's dispatch and nothing else.
    static const grpc::internal::RpcMethod kCheck("/grpc.health.v1.Health/Check",
                                                  grpc::internal::RpcMethod::NORMAL_RPC);
    grpc::ByteBuffer req, resp;
    grpc::Slice empty;
    req = grpc::ByteBuffer(&empty, 1);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto t0 = Clock::now();
    grpc::Status s = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(channel, kCheck,
                                                                                           &ctx, req, &resp);
    uint64_t ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    if (!s.ok()) {
        throw std::runtime_error("grpc.health.v1.Health/Check: " + s.error_message());
    }
    return ns;
}

uint64_t BrokerHarness::healthCheckNs() {
    return perf::healthCheckNs(rpc_->health_channel.get());
}

long BrokerHarness::statusKiB(const char *field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line, key = std::string(field) + ":";
    while (std::getline(in, line)) {
        if (line.rfind(key, 0) == 0) {
            return std::strtol(line.c_str() + key.size(), nullptr, 10);
        }
    }
    return -1;
}

long long BrokerHarness::memfdBytes(const std::string &prefix) const {
    const std::string dir = "/proc/" + std::to_string(pid_) + "/fd";
    std::error_code ec;
    std::filesystem::directory_iterator it(dir, ec);
    if (ec) {
        return -1;
    }
    const std::string memfd = "/memfd:" + prefix;
    long long total = 0;
    for (const auto &entry : it) {
        std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
        if (ec || target.rfind(memfd, 0) != 0) {
            continue;
        }
        struct stat st {};
        if (::stat(entry.path().c_str(), &st) == 0) {
            total += static_cast<long long>(st.st_blocks) * 512;
        }
    }
    return total;
}

int BrokerHarness::raiseEngineThreads() const {
    sched_param sp{};
    if (!own_ || ::sched_getscheduler(0) != SCHED_FIFO || ::sched_getparam(0, &sp) != 0) {
        return 0;
    }
    int raised = 0;
    std::error_code ec;
    for (const auto &task :
         std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
        std::string comm;
        std::getline(std::ifstream(task.path() / "comm"), comm);
        if (comm.rfind("softnda-eng", 0) == 0) {
            pid_t tid = static_cast<pid_t>(std::strtol(task.path().filename().c_str(), nullptr, 10));
            if (::sched_setscheduler(tid, SCHED_FIFO, &sp) == 0) {
                ++raised;
            }
        }
    }
    return raised;
}

double BrokerHarness::cpuNs() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
    std::string stat;
    std::getline(in, stat);
    // Fields 14 and 15 (utime, stime) follow the ")" that ends the command name, which may
    // itself hold spaces.
    auto close = stat.rfind(')');
    if (close == std::string::npos) {
        return -1;
    }
    std::istringstream fields(stat.substr(close + 2));
    std::string f;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> f; ++i) {
        if (i >= 14) {
            ticks += std::strtod(f.c_str(), nullptr);
        }
    }
    return ticks * 1e9 / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::string BrokerHarness::log() const {
    std::ifstream in(dir_ + "/log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace ibvx::perf
