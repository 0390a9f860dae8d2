// What the restart tests and the chaos soak (tests/integration/chaos) share: a tenant process
// through ibv-extend-run, an Admin client that reads sessions, objects and status, and the broker
// under fdstore_harness (systemd's fd store). Header only; the including target defines
// IBVX_RUN_BINARY, IBVX_RESTART_TENANT, IBVX_FDSTORE_HARNESS, IBVX_EXTEND_LIB_DIR and
// IBVX_SANITIZER_PRELOAD (cmake: ibvx_restart_support_defs).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "tests/integration/daemon/test_client.h"

namespace ibvx::test {

using namespace std::chrono_literals;

// Lines from a child's pipe, each read within a budget: a child that hangs fails the test with
// what it printed instead of holding the test until ctest's timeout kills it, silently.
class LineReader {
  public:
    LineReader() = default;
    explicit LineReader(int fd) : fd_(fd) {}
    // The next line starting with prefix; every line read is appended to *kept. "" at EOF or when
    // the budget ran out (timedOut() says which).
    std::string next(const std::string &prefix, std::string *kept, std::chrono::milliseconds budget) {
        const auto deadline = std::chrono::steady_clock::now() + budget;
        timed_out_ = false;
        for (;;) {
            for (size_t nl; (nl = buf_.find('\n')) != std::string::npos;) {
                std::string line = buf_.substr(0, nl + 1);
                buf_.erase(0, nl + 1);
                *kept += line;
                if (line.rfind(prefix, 0) == 0) {
                    return line;
                }
            }
            if (!fd_) {
                return "";
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd p{fd_.get(), POLLIN, 0};
            const int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
            if (ready < 0 && errno == EINTR) {
                continue;
            }
            if (ready <= 0) {
                timed_out_ = ready == 0;
                return "";
            }
            char chunk[4096];
            const ssize_t n = ::read(fd_.get(), chunk, sizeof(chunk));
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                fd_.reset();
                continue;  // lines already read still count; then EOF
            }
            buf_.append(chunk, static_cast<size_t>(n));
        }
    }
    bool timedOut() const { return timed_out_; }

  private:
    UniqueFd fd_;
    std::string buf_;
    bool timed_out_ = false;
};

// How long a child may take to print the line a test waits for. A loaded CI machine restarts a
// broker in seconds; a minute means the child hangs.
inline constexpr std::chrono::milliseconds kLineBudget = 60s;

// A tenant process (restart-tenant unless program says otherwise, through ibv-extend-run) with a
// pipe on stdin (closed to stop it) and one on stdout (read by line).
class Tenant {
  public:
    Tenant(const std::string &socket, const std::string &err_path,
           const std::vector<std::string> &program = {IBVX_RESTART_TENANT, "softnda0"}) {
        int in[2], out[2];
        if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
            return;
        }
        pid_ = fork();
        if (pid_ == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            dup2(err, 2);
            std::vector<std::string> argv = {IBVX_RUN_BINARY, "--socket", socket, "--"};
            argv.insert(argv.end(), program.begin(), program.end());
            std::vector<char *> args;
            for (auto &a : argv) {
                args.push_back(a.data());
            }
            args.push_back(nullptr);
            std::string ld = "LD_LIBRARY_PATH=" IBVX_EXTEND_LIB_DIR;
            std::string preload = "LD_PRELOAD=" IBVX_SANITIZER_PRELOAD;
            std::vector<char *> env = {const_cast<char *>("PATH=/usr/bin:/bin"), ld.data(),
                                       const_cast<char *>("IBV_EXTEND_SHOW_WARNINGS=1"),
                                       const_cast<char *>("ASAN_OPTIONS=detect_leaks=0")};
            if (std::string(IBVX_SANITIZER_PRELOAD).size() != 0) {
                env.push_back(preload.data());
            }
            // gRPC's own logging, when the run asks for it (GRPC_VERBOSITY=DEBUG and GRPC_TRACE:
            // what a tenant's channel did), goes to the tenant's stderr file.
            std::vector<std::string> grpc_log;
            for (const char *name : {"GRPC_VERBOSITY", "GRPC_TRACE"}) {
                if (const char *v = getenv(name); v != nullptr) {
                    grpc_log.push_back(std::string(name) + "=" + v);
                }
            }
            for (auto &e : grpc_log) {
                env.push_back(e.data());
            }
            env.push_back(nullptr);
            execve(args[0], args.data(), env.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        in_ = in[1];
        out_ = std::make_unique<LineReader>(out[0]);
    }
    ~Tenant() {
        if (in_ >= 0) {
            close(in_);
        }
        if (pid_ > 0 && !reaped_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    pid_t pid() const { return pid_; }
    // The next stdout line starting with prefix ("" at EOF, or after budget with no such line:
    // lines() then ends with a note); every line is kept in lines().
    std::string lineStarting(const std::string &prefix, std::chrono::milliseconds budget = kLineBudget) {
        if (out_ == nullptr) {
            return "";
        }
        std::string line = out_->next(prefix, &lines_, budget);
        if (out_->timedOut()) {
            lines_ += "[no line starting '" + prefix + "' within " + std::to_string(budget.count()) +
                      " ms: the tenant hangs]\n";
        }
        return line;
    }
    // Closes stdin (the tenant stops) and returns its "done" line.
    std::string finish() {
        close(in_);
        in_ = -1;
        return lineStarting("done ");
    }
    // Its exit code (128 + signal if killed). One that has not exited within budget is killed
    // (the code then says SIGKILL) and lines() says it hung.
    int wait(std::chrono::milliseconds budget = kLineBudget) {
        int status = 0;
        const auto deadline = std::chrono::steady_clock::now() + budget;
        while (waitpid(pid_, &status, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() >= deadline) {
                lines_ += "[not exited within " + std::to_string(budget.count()) + " ms: killed]\n";
                kill(pid_, SIGKILL);
                waitpid(pid_, &status, 0);
                break;
            }
            std::this_thread::sleep_for(10ms);
        }
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    // Whether it has exited (then *rc is what wait() would return), without waiting.
    bool exited(int *rc) {
        int status = 0;
        if (reaped_ || waitpid(pid_, &status, WNOHANG) != pid_) {
            return reaped_;
        }
        reaped_ = true;
        *rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return true;
    }
    void kill9() {
        kill(pid_, SIGKILL);
        wait();
    }
    const std::string &lines() const { return lines_; }

  private:
    pid_t pid_ = -1;
    int in_ = -1;
    std::unique_ptr<LineReader> out_;
    bool reaped_ = false;
    std::string lines_;
};

// "key=value" out of a line like "done wrs=1 failed=0 ...".
inline uint64_t field(const std::string &line, const std::string &key) {
    size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) {
        ADD_FAILURE() << "no " << key << " in '" << line << "'";
        return UINT64_MAX;
    }
    return std::strtoull(line.c_str() + at + key.size() + 2, nullptr, 10);
}

inline std::string slurp(const std::string &path) {
    std::string s;
    if (FILE *f = fopen(path.c_str(), "r")) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
            s.append(buf, n);
        }
        fclose(f);
    }
    return s;
}

// What each of the process's fds is, one per line (for a leak's message).
inline std::string fdTargets(pid_t pid) {
    std::string out;
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d)) {
            char target[512];
            ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
            if (n > 0) {
                out += std::string(e->d_name) + " -> " + std::string(target, static_cast<size_t>(n)) + "\n";
            }
        }
        closedir(d);
    }
    return out;
}

class AdminClient {
  public:
    explicit AdminClient(const std::string &socket) : socket_(socket) { reconnect(); }
    void reconnect() {
        channel_ = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
        stub_ = pb::Admin::NewStub(channel_);
    }
    grpc::Status restart(bool require_keep, pb::RestartResponse *resp) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 10s);
        pb::RestartRequest req;
        req.set_require_keep(require_keep);
        return stub_->Restart(&ctx, req, resp);
    }
    grpc::Status status(pb::GetStatusResponse *resp) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        ctx.set_wait_for_ready(true);
        return stub_->GetStatus(&ctx, pb::GetStatusRequest{}, resp);
    }
    grpc::Status setQuota(const pb::SetQuotaRequest &req) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        pb::SetQuotaResponse resp;
        return stub_->SetQuota(&ctx, req, &resp);
    }
    // "scope name quota=limit" of every override, and "default quota=limit" of every limited
    // default: what `ibv-extendctl quotas` shows of the limits.
    std::set<std::string> quotaLimits() {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        ctx.set_wait_for_ready(true);
        pb::GetQuotasResponse resp;
        EXPECT_TRUE(stub_->GetQuotas(&ctx, pb::GetQuotasRequest{}, &resp).ok());
        std::set<std::string> out;
        auto limit = [](const pb::QuotaValue &v) {
            return v.unlimited() ? "unlimited" : std::to_string(v.limit());
        };
        for (const auto &d : resp.defaults()) {
            if (!d.unlimited()) {
                out.insert("default " + d.name() + "=" + limit(d));
            }
        }
        for (const auto &o : resp.overrides()) {
            const std::string who = o.scope() == pb::QUOTA_SCOPE_UID ? "uid " + std::to_string(o.uid())
                                    : o.scope() == pb::QUOTA_SCOPE_NAMESPACE
                                        ? "namespace " + o.pod_namespace()
                                        : "container " + o.container();
            for (const auto &q : o.quotas()) {
                out.insert(who + " " + q.name() + "=" + limit(q));
            }
        }
        return out;
    }
    // Handles of every object, by session pid.
    // pid's lasting objects: restart-tenant makes and destroys a QP every 20 ms, which one listing
    // may catch; of two listings 50 ms apart, only what lasts is in both.
    std::set<uint64_t> lastingObjects(int pid) {
        std::set<uint64_t> first = objects()[pid];
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        std::set<uint64_t> second = objects()[pid], both;
        std::set_intersection(first.begin(), first.end(), second.begin(), second.end(),
                              std::inserter(both, both.begin()));
        return both;
    }
    std::map<int, std::set<uint64_t>> objects(pb::ObjectKind kind = pb::OBJECT_KIND_UNSPECIFIED) {
        std::map<int, std::set<uint64_t>> out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        pb::ListObjectsRequest req;
        req.set_page_size(4096);
        req.set_kind(kind);
        pb::ListObjectsResponse resp;
        EXPECT_TRUE(stub_->ListObjects(&ctx, req, &resp).ok());
        std::map<uint64_t, int> pid_of;
        for (const auto &s : sessions()) {
            pid_of[s.first] = s.second;
        }
        for (const auto &o : resp.objects()) {
            out[pid_of[o.session()]].insert(o.handle());
        }
        return out;
    }
    // What ListSessions says of each session, by id.
    std::map<uint64_t, pb::SessionInfo> sessionInfos() {
        std::map<uint64_t, pb::SessionInfo> out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        pb::ListSessionsResponse resp;
        EXPECT_TRUE(stub_->ListSessions(&ctx, pb::ListSessionsRequest{}, &resp).ok());
        for (const auto &s : resp.sessions()) {
            out[s.id()] = s;
        }
        return out;
    }
    // An engine counter of softnda0 ("wqes_executed", ...); 0 when the broker does not answer.
    uint64_t engineCounter(const std::string &name) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        pb::GetStatsResponse resp;
        if (!stub_->GetStats(&ctx, pb::GetStatsRequest{}, &resp).ok()) {
            return 0;
        }
        for (const auto &e : resp.engines()) {
            for (const auto &c : e.counters()) {
                if (e.device() == "softnda0" && c.name() == name) {
                    return c.value();
                }
            }
        }
        return 0;
    }
    // session id -> pid
    std::map<uint64_t, int> sessions() {
        std::map<uint64_t, int> out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        pb::ListSessionsResponse resp;
        EXPECT_TRUE(stub_->ListSessions(&ctx, pb::ListSessionsRequest{}, &resp).ok());
        for (const auto &s : resp.sessions()) {
            out[s.id()] = s.pid();
        }
        return out;
    }
    // Waits until the broker serves with `restarts` restarts behind it.
    bool waitRestarts(uint64_t restarts, std::chrono::milliseconds timeout = 20s) {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            pb::GetStatusResponse st;
            if (status(&st).ok() && st.restarts() >= restarts) {
                return true;
            }
            std::this_thread::sleep_for(20ms);
        }
        return false;
    }

  private:
    std::string socket_;
    std::shared_ptr<grpc::Channel> channel_;
    std::unique_ptr<pb::Admin::Stub> stub_;
};

template <typename Fn>
bool eventually(Fn fn, std::chrono::milliseconds timeout = 10s) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (fn()) {
            return true;
        }
        std::this_thread::sleep_for(20ms);
    }
    return fn();
}

// ---- through systemd's fd store ----------------------------------------------------------
// systemd cannot run as PID 1 here: fdstore_harness is a test double of its service manager,
// written on the published sd_notify/sd_listen_fds protocol (see the top of that file). It owns
// the listening socket like a .socket unit and the fd store like the service's unit.
class StoreBroker {
  public:
    explicit StoreBroker(int restart_sec_ms = 0) {
        char tmpl[] = "/tmp/ibvx-fds.XXXXXX";
        dir_ = mkdtemp(tmpl);
        socket_ = dir_ + "/b.sock";
        int in[2], out[2];
        if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
            return;
        }
        pid_ = fork();
        if (pid_ == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            int err = open((dir_ + "/log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            dup2(err, 2);
            std::string daemon = std::string(std::getenv("IBVX_BUILD_DIR")) + "/daemon/ibv-extendd";
            std::vector<std::string> argv = {IBVX_FDSTORE_HARNESS,
                                             "--listen",
                                             socket_,
                                             "--fdstore-max",
                                             "65536",
                                             "--restart",
                                             "on-failure",
                                             "--restart-sec",
                                             std::to_string(restart_sec_ms),
                                             "--",
                                             daemon,
                                             "--foreground",
                                             "--fd-store",
                                             "--log-level",
                                             "debug"};
            std::vector<char *> args;
            for (auto &a : argv) {
                args.push_back(a.data());
            }
            args.push_back(nullptr);
            execv(args[0], args.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        control_ = in[1];
        events_ = std::make_unique<LineReader>(out[0]);
    }
    ~StoreBroker() {
        if (control_ >= 0) {
            close(control_);  // the harness stops the broker, drops the store and exits
        }
        if (pid_ > 0) {
            waitpid(pid_, nullptr, 0);
        }
        events_.reset();
        if (getenv("IBVX_TEST_KEEP") != nullptr) {  // the broker's log and the tenants' stderr, to read
            fprintf(stderr, "kept %s\n", dir_.c_str());
            return;
        }
        std::string cmd = "rm -rf " + dir_;
        (void)!system(cmd.c_str());
    }
    void send(const std::string &line) {
        std::string l = line + "\n";
        ASSERT_EQ(write(control_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
    }
    // The next harness event starting with prefix ("" when the harness ended, or after budget
    // with no such event: seen() then ends with a note).
    std::string waitFor(const std::string &prefix, std::chrono::milliseconds budget = kLineBudget) {
        if (events_ == nullptr) {
            return "";
        }
        const auto deadline = std::chrono::steady_clock::now() + budget;
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            // One line at a time: a "ready" line on the way names the broker's pid.
            std::string line = events_->next("", &seen_, std::max(left, std::chrono::milliseconds(0)));
            if (line.empty()) {
                if (events_->timedOut()) {
                    seen_ += "[no harness event '" + prefix + "' within " + std::to_string(budget.count()) +
                             " ms]\n";
                }
                return "";
            }
            if (line.rfind("ready pid=", 0) == 0) {
                service_pid_ = std::atoi(line.c_str() + 10);
            }
            if (line.rfind(prefix, 0) == 0) {
                return line;
            }
        }
    }
    const std::string &socket() const { return socket_; }
    std::string log() const { return slurp(dir_ + "/log"); }
    const std::string &seen() const { return seen_; }
    // Drops the events read so far (a long run reads many: every stored fd is one).
    void forgetSeen() { seen_.clear(); }
    const std::string &dir() const { return dir_; }
    // The broker's pid, as the last "ready" event said (-1 before the first).
    pid_t servicePid() const { return service_pid_; }

  private:
    std::string dir_, socket_, seen_;
    pid_t pid_ = -1, service_pid_ = -1;
    int control_ = -1;
    std::unique_ptr<LineReader> events_;
};

}  // namespace ibvx::test
