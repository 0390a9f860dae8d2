// Broker restarts with live queues (docs/restart.md), as an operator and a tenant meet them: the
// real ibv-extendd, restarted through Admin.Restart (what `ibv-extendctl restart` calls), while
// real tenant processes (restart-tenant through ibv-extend-run, over the libibverbs face) keep a
// verified WRITE loop and control calls going.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/test_client.h"

namespace ibvx::test {
namespace {

using namespace std::chrono_literals;

// A tenant process with a pipe on stdin (closed to stop it) and one on stdout (read by line).
class Tenant {
  public:
    Tenant(const std::string &socket, const std::string &err_path) {
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
            std::vector<std::string> argv = {IBVX_RUN_BINARY,     "--socket", socket, "--",
                                             IBVX_RESTART_TENANT, "softnda0"};
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
            env.push_back(nullptr);
            execve(args[0], args.data(), env.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        in_ = in[1];
        out_ = fdopen(out[0], "r");
    }
    ~Tenant() {
        if (in_ >= 0) {
            close(in_);
        }
        if (pid_ > 0 && !reaped_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (out_ != nullptr) {
            fclose(out_);
        }
    }
    pid_t pid() const { return pid_; }
    // The next stdout line starting with prefix ("" at EOF); other lines are kept in lines().
    std::string lineStarting(const std::string &prefix) {
        char buf[512];
        while (out_ != nullptr && fgets(buf, sizeof(buf), out_) != nullptr) {
            std::string line(buf);
            lines_ += line;
            if (line.rfind(prefix, 0) == 0) {
                return line;
            }
        }
        return "";
    }
    // Closes stdin (the tenant stops) and returns its "done" line.
    std::string finish() {
        close(in_);
        in_ = -1;
        return lineStarting("done ");
    }
    int wait() {
        int status = 0;
        waitpid(pid_, &status, 0);
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    void kill9() {
        kill(pid_, SIGKILL);
        wait();
    }
    const std::string &lines() const { return lines_; }

  private:
    pid_t pid_ = -1;
    int in_ = -1;
    FILE *out_ = nullptr;
    bool reaped_ = false;
    std::string lines_;
};

// "key=value" out of a line like "done wrs=1 failed=0 ...".
uint64_t field(const std::string &line, const std::string &key) {
    size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) {
        ADD_FAILURE() << "no " << key << " in '" << line << "'";
        return UINT64_MAX;
    }
    return std::strtoull(line.c_str() + at + key.size() + 2, nullptr, 10);
}

std::string slurp(const std::string &path) {
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
std::string fdTargets(pid_t pid) {
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
    // Handles of every object, by session pid.
    std::map<int, std::set<uint64_t>> objects() {
        std::map<int, std::set<uint64_t>> out;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        pb::ListObjectsRequest req;
        req.set_page_size(4096);
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

TEST(Restart, FiveRestartsThroughAdminKeepEveryQueueAndHandle) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    AdminClient admin(broker.socket());
    // The baseline is a restarted broker's: the first process also holds fds its start-up left
    // (close-on-exec ones, which no restart carries over).
    {
        pb::RestartResponse resp;
        ASSERT_TRUE(admin.restart(false, &resp).ok()) << broker.log();
        admin.reconnect();
        ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    }
    const int baseline_fds = broker.fdCount();
    const std::string baseline_targets = fdTargets(broker.pid());

    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    std::string ready = tenant.lineStarting("ready ");
    ASSERT_FALSE(ready.empty()) << slurp(broker.dir() + "/tenant.err") << broker.log();
    std::map<int, std::set<uint64_t>> before = admin.objects();
    ASSERT_GE(before[tenant.pid()].size(), 7u);  // context, PD, CQ, 2 QPs, 2 MRs

    std::unique_ptr<Tenant> victim;
    for (uint64_t i = 1; i <= 5; ++i) {
        if (i == 3) {
            victim = std::make_unique<Tenant>(broker.socket(), broker.dir() + "/victim.err");
            ASSERT_FALSE(victim->lineStarting("ready ").empty()) << slurp(broker.dir() + "/victim.err");
        }
        pb::RestartResponse resp;
        grpc::Status st = admin.restart(false, &resp);
        ASSERT_TRUE(st.ok()) << st.error_message() << broker.log();
        EXPECT_GE(resp.sessions_kept(), 1u);
        EXPECT_EQ(resp.sessions_dropped(), 0u);
        EXPECT_FALSE(resp.binary().empty());
        if (victim != nullptr && i == 3) {
            victim->kill9();  // dies during the window: the new broker must reclaim it
        }
        admin.reconnect();
        ASSERT_TRUE(admin.waitRestarts(i + 1)) << "restart " << i << " did not come back\n" << broker.log();
        // The same handles (the tenant's control loop may hold one more QP of its own for a moment).
        std::set<uint64_t> now = admin.objects()[tenant.pid()];
        ASSERT_TRUE(
            std::includes(now.begin(), now.end(), before[tenant.pid()].begin(), before[tenant.pid()].end()))
            << "after restart " << i << "\n"
            << broker.log();
        EXPECT_LE(now.size(), before[tenant.pid()].size() + 1);  // its control loop's QP, at most
    }
    pb::GetStatusResponse status;
    ASSERT_TRUE(admin.status(&status).ok());
    EXPECT_EQ(status.restarts(), 6u);  // the baseline's and five under the tenant
    EXPECT_GT(status.last_restart_unix_ms(), 0u);
    EXPECT_EQ(status.pid(), broker.pid());  // exec keeps the process

    // The victim's session is gone, reclaimed by the broker it died under or the next.
    EXPECT_TRUE(eventually([&] {
        for (auto &[id, pid] : admin.sessions()) {
            if (pid == victim->pid()) {
                return false;
            }
        }
        return true;
    })) << broker.log();

    std::string done = tenant.finish();
    ASSERT_FALSE(done.empty()) << tenant.lines() << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "failed"), 0u) << done;
    EXPECT_EQ(field(done, "control_failed"), 0u) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_GT(field(done, "wrs"), 0u);
    EXPECT_GT(field(done, "control"), 0u);
    ::testing::Test::RecordProperty("max_gap_us", std::to_string(field(done, "max_gap_us")));
    ::testing::Test::RecordProperty("max_control_us", std::to_string(field(done, "max_control_us")));
    printf("restart: %s", done.c_str());

    // Everything the tenants held is given back.
    EXPECT_TRUE(eventually([&] { return admin.sessions().empty(); })) << broker.log();
    // No more than before (a library may close an fd it opened lazily, e.g. /dev/null).
    EXPECT_TRUE(eventually([&] { return broker.fdCount() <= baseline_fds; }))
        << "broker fds " << broker.fdCount() << ", baseline " << baseline_fds << ":\n"
        << fdTargets(broker.pid()) << "baseline:\n"
        << baseline_targets;
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

TEST(Restart, RequireKeepRefusesNothingToRefuseAndAnswersTheBinary) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    AdminClient admin(broker.socket());
    // No session holds a dropping driver's object: require_keep restarts.
    pb::RestartResponse resp;
    ASSERT_TRUE(admin.restart(true, &resp).ok());
    EXPECT_EQ(resp.sessions_dropped(), 0u);
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
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
        events_ = fdopen(out[0], "r");
    }
    ~StoreBroker() {
        if (control_ >= 0) {
            close(control_);  // the harness stops the broker, drops the store and exits
        }
        if (pid_ > 0) {
            waitpid(pid_, nullptr, 0);
        }
        if (events_ != nullptr) {
            fclose(events_);
        }
        std::string cmd = "rm -rf " + dir_;
        (void)!system(cmd.c_str());
    }
    void send(const std::string &line) {
        std::string l = line + "\n";
        ASSERT_EQ(write(control_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
    }
    // The next harness event starting with prefix ("" when the harness ended).
    std::string waitFor(const std::string &prefix) {
        char buf[1024];
        while (events_ != nullptr && fgets(buf, sizeof(buf), events_) != nullptr) {
            std::string line(buf);
            seen_ += line;
            if (line.rfind(prefix, 0) == 0) {
                return line;
            }
        }
        return "";
    }
    const std::string &socket() const { return socket_; }
    std::string log() const { return slurp(dir_ + "/log"); }
    const std::string &seen() const { return seen_; }
    const std::string &dir() const { return dir_; }

  private:
    std::string dir_, socket_, seen_;
    pid_t pid_ = -1;
    int control_ = -1;
    FILE *events_ = nullptr;
};

TEST(RestartFdStore, SystemdRestartAndKill9KeepEveryQueue) {
    StoreBroker broker;
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty())
        << slurp(broker.dir() + "/tenant.err") << broker.log();
    std::set<uint64_t> before = admin.objects()[tenant.pid()];
    ASSERT_GE(before.size(), 7u);
    // systemctl restart (SIGTERM, the store kept), then crashes under Restart=on-failure.
    for (const char *how : {"restart", "kill9", "restart", "kill9"}) {
        broker.send(how);
        ASSERT_FALSE(broker.waitFor("exited ").empty()) << how;
        ASSERT_FALSE(broker.waitFor("ready ").empty()) << how << "\n" << broker.log();
        admin.reconnect();
        ASSERT_TRUE(admin.waitRestarts(0)) << broker.log();
        std::set<uint64_t> now = admin.objects()[tenant.pid()];
        EXPECT_TRUE(std::includes(now.begin(), now.end(), before.begin(), before.end())) << how << "\n"
                                                                                         << broker.log();
    }
    std::string done = tenant.finish();
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "failed"), 0u) << done;
    EXPECT_EQ(field(done, "control_failed"), 0u) << done << slurp(broker.dir() + "/tenant.err");
    printf("restart (fd store): %s", done.c_str());
    EXPECT_TRUE(eventually([&] { return admin.sessions().empty(); })) << broker.log();
}

// Fault injection in the window between a crash and the automatic restart (RestartSec=): one
// tenant's state file corrupted, another's arena chunk missing. Those two sessions end, with a
// log line each naming why; the third tenant does not notice.
TEST(RestartFdStore, CorruptStateAndMissingArenaEndOnlyThoseSessions) {
    StoreBroker broker(/*restart_sec_ms=*/1500);
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant corrupt(broker.socket(), broker.dir() + "/corrupt.err");
    Tenant missing(broker.socket(), broker.dir() + "/missing.err");
    Tenant good(broker.socket(), broker.dir() + "/good.err");
    for (Tenant *t : {&corrupt, &missing, &good}) {
        ASSERT_FALSE(t->lineStarting("ready ").empty()) << broker.log();
    }
    std::map<int, uint64_t> session_of;
    for (auto &[id, pid] : admin.sessions()) {
        session_of[pid] = id;
    }
    const std::string corrupt_state = "ibvx.s" + std::to_string(session_of[corrupt.pid()]) + ".state";
    // An arena chunk of the second tenant, as the harness saw it stored: "ibvx.s<id>.c<region>".
    const std::string chunk_prefix = "ibvx.s" + std::to_string(session_of[missing.pid()]) + ".c";
    auto chunkIn = [&](const std::string &text) -> std::string {
        for (size_t at = text.find("fdstore-add name=" + chunk_prefix); at != std::string::npos;
             at = text.find("fdstore-add name=" + chunk_prefix, at + 1)) {
            std::string name = text.substr(at + 17);
            name = name.substr(0, name.find(' '));
            if (name.size() > chunk_prefix.size() &&
                isdigit(static_cast<unsigned char>(name[chunk_prefix.size()]))) {
                return name;
            }
        }
        return "";
    };
    std::string chunk = chunkIn(broker.seen());
    while (chunk.empty() && !broker.waitFor("fdstore-add ").empty()) {
        chunk = chunkIn(broker.seen());
    }
    ASSERT_FALSE(chunk.empty()) << broker.seen();

    broker.send("kill9");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    broker.send("corrupt-fd " + corrupt_state);
    ASSERT_NE(broker.waitFor("corrupted ").find("fds=1"), std::string::npos) << broker.seen();
    broker.send("drop-fd " + chunk);
    ASSERT_NE(broker.waitFor("dropped ").find("fds=1"), std::string::npos) << broker.seen();
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    std::string log = broker.log();
    EXPECT_NE(log.find("restore: s" + std::to_string(session_of[corrupt.pid()]) + ": "), std::string::npos)
        << log;
    EXPECT_NE(log.find("missing fd " + chunk), std::string::npos) << log;
    auto sessions = admin.sessions();
    EXPECT_EQ(sessions.count(session_of[corrupt.pid()]), 0u);
    EXPECT_EQ(sessions.count(session_of[missing.pid()]), 0u);
    EXPECT_EQ(sessions.count(session_of[good.pid()]), 1u) << log;
    // The two see their session end (the fd channel closes: calls answer ECONNRESET).
    corrupt.kill9();
    missing.kill9();
    std::string done = good.finish();
    EXPECT_EQ(good.wait(), 0) << done << slurp(broker.dir() + "/good.err");
    EXPECT_EQ(field(done, "failed"), 0u);
    EXPECT_EQ(field(done, "control_failed"), 0u) << slurp(broker.dir() + "/good.err");
}

}  // namespace
}  // namespace ibvx::test
