// Broker restarts with live queues (docs/restart.md), as an operator and a tenant meet them: the
// real ibv-extendd, restarted through Admin.Restart (what `ibv-extendctl restart` calls), while
// real tenant processes (restart-tenant through ibv-extend-run, over the libibverbs face) keep a
// verified WRITE loop and control calls going.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "tests/integration/daemon/broker_calls.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/test_client.h"
#include "tests/integration/restart/restart_support.h"

namespace ibvx::test {
namespace {

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
    std::map<int, std::set<uint64_t>> before = {{tenant.pid(), admin.lastingObjects(tenant.pid())}};
    ASSERT_GE(before[tenant.pid()].size(), 9u);  // context, PD, 2 CQs, 2 QPs, 2 MRs, AH
    const std::set<uint64_t> ahs = admin.objects(pb::OBJECT_KIND_AH)[tenant.pid()];
    ASSERT_EQ(ahs.size(), 1u) << "the broker keeps the tenant's AH";

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
    EXPECT_EQ(admin.objects(pb::OBJECT_KIND_AH)[tenant.pid()], ahs) << "the AH outlived five restarts";
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

// The successor's malloc heap is asked onto transparent huge pages (GLIBC_TUNABLES, read by
// glibc at its start), after the tunables the old process had; an operator's own
// glibc.malloc.hugetlb stands. Read from the successor's /proc/PID/environ, where glibc has cut
// the value at each ':' in place as it parsed it: the tunables are looked for as they stand.
TEST(Restart, TheSuccessorAsksForHugeHeapPagesUnlessTheOperatorChoseOtherwise) {
    struct Case {
        std::string given;
        std::vector<std::string> present, absent;
    };
    const std::vector<Case> cases = {
        {"", {"GLIBC_TUNABLES=glibc.malloc.hugetlb=1"}, {}},
        {"glibc.malloc.arena_max=2",
         {"GLIBC_TUNABLES=glibc.malloc.arena_max=2", "glibc.malloc.hugetlb=1"},
         {}},
        {"glibc.malloc.hugetlb=0", {"GLIBC_TUNABLES=glibc.malloc.hugetlb=0"}, {"glibc.malloc.hugetlb=1"}}};
    for (const Case &c : cases) {
        BrokerOptions o;
        if (!c.given.empty()) {
            o.env.push_back("GLIBC_TUNABLES=" + c.given);
        }
        BrokerProcess broker(o);
        ASSERT_TRUE(broker.started()) << broker.log();
        AdminClient admin(broker.socket());
        pb::RestartResponse resp;
        ASSERT_TRUE(admin.restart(false, &resp).ok()) << c.given;
        admin.reconnect();
        ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
        std::FILE *f = std::fopen(("/proc/" + std::to_string(broker.pid()) + "/environ").c_str(), "r");
        ASSERT_NE(f, nullptr);
        std::string env(1, '\0');  // each entry is then found as "\0NAME=..."
        for (int ch; (ch = std::fgetc(f)) != EOF;) {
            env.push_back(static_cast<char>(ch));
        }
        std::fclose(f);
        for (const std::string &p : c.present) {
            EXPECT_NE(env.find(std::string(1, '\0') + p + std::string(1, '\0')), std::string::npos)
                << "given '" << c.given << "': no " << p;
        }
        for (const std::string &p : c.absent) {
            EXPECT_EQ(env.find(p), std::string::npos) << "given '" << c.given << "': " << p;
        }
        EXPECT_EQ(broker.terminate(), 0) << broker.log();
    }
}

// Sessions' AGE and CALLS (ibv-extendctl sessions) go on across a restart: the state carries
// the session's creation time and its call counts.
TEST(Restart, SessionsKeepTheirAgeAndCallsAcrossARestart) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty()) << slurp(broker.dir() + "/tenant.err");
    std::this_thread::sleep_for(1200ms);  // an age the restart's own time cannot explain
    std::map<uint64_t, pb::SessionInfo> before = admin.sessionInfos();
    ASSERT_EQ(before.size(), 1u);
    pb::RestartResponse resp;
    ASSERT_TRUE(admin.restart(true, &resp).ok()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    std::map<uint64_t, pb::SessionInfo> after = admin.sessionInfos();
    ASSERT_EQ(after.size(), 1u);
    const pb::SessionInfo &b = before.begin()->second, &a = after.begin()->second;
    EXPECT_EQ(a.id(), b.id());
    EXPECT_GE(a.connected_ms(), b.connected_ms()) << broker.log();
    EXPECT_GE(a.connected_ms(), 1200u);
    EXPECT_EQ(a.connected_since_unix_ms(), b.connected_since_unix_ms());
    EXPECT_GE(a.rpc_calls(), b.rpc_calls()) << broker.log();
    EXPECT_GT(b.rpc_calls(), 5u);  // Hello, the pair's bring-up, the control loop
    EXPECT_EQ(a.rpc_errors(), b.rpc_errors());
    std::string done = tenant.finish();
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "control_failed"), 0u) << done;
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

// ---- the default daemonizing mode ----------------------------------------------------------
// `ibv-extendd` with neither --foreground nor NOTIFY_SOCKET detaches (daemon(3)). The test
// process is a child subreaper, so the detached broker is its child again: it can be waited
// for, and nothing of it can outlive the test unseen.
class DetachedBroker {
  public:
    DetachedBroker() {
        char tmpl[] = "/tmp/ibvx-dm.XXXXXX";
        dir_ = mkdtemp(tmpl);
        socket_ = dir_ + "/b.sock";
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        std::vector<std::string> env;
        for (char **e = environ; *e != nullptr; ++e) {
            std::string v(*e);
            // What would keep it in the foreground, or hand it fds it is not meant to have.
            if (v.rfind("NOTIFY_SOCKET=", 0) != 0 && v.rfind("JOURNAL_STREAM=", 0) != 0 &&
                v.rfind("LISTEN_", 0) != 0 && v.rfind("WATCHDOG_", 0) != 0) {
                env.push_back(v);
            }
        }
        std::vector<char *> envp;
        for (auto &v : env) {
            envp.push_back(v.data());
        }
        envp.push_back(nullptr);
        std::string daemon = std::string(std::getenv("IBVX_BUILD_DIR")) + "/daemon/ibv-extendd";
        std::vector<std::string> argv = {daemon, "--socket", socket_, "--log-level", "debug"};
        std::vector<char *> args;
        for (auto &a : argv) {
            args.push_back(a.data());
        }
        args.push_back(nullptr);
        std::string log = dir_ + "/log";
        pid_t launcher = fork();
        if (launcher == 0) {
            int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
            dup2(fd, 1);
            dup2(fd, 2);
            execve(args[0], args.data(), envp.data());
            _exit(127);
        }
        int st = 0;
        waitpid(launcher, &st, 0);  // daemon(3): the process started returns once it has forked
        launcher_rc_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        launcher_ = launcher;
    }
    ~DetachedBroker() {
        if (pid_ > 0 && !reaped_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        std::string cmd = "rm -rf " + dir_;
        (void)!system(cmd.c_str());
    }
    // The detached broker's pid, from its own status; -1 when none answers within 20 s.
    pid_t findPid(AdminClient &admin) {
        if (!eventually([&] { return ibvx::connectUnix(socket_).isOk(); }, 20s)) {
            return -1;
        }
        pb::GetStatusResponse st;
        if (!admin.status(&st).ok()) {
            return -1;
        }
        pid_ = st.pid();
        return pid_;
    }
    // SIGTERM, then the exit code (128 + signal), or -1 when it did not exit within 10 s.
    int terminate() {
        kill(pid_, SIGTERM);
        int st = 0;
        if (!eventually([&] { return waitpid(pid_, &st, WNOHANG) == pid_; }, 10s)) {
            return -1;
        }
        reaped_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    int launcherRc() const { return launcher_rc_; }
    pid_t launcher() const { return launcher_; }
    const std::string &socket() const { return socket_; }
    const std::string &dir() const { return dir_; }
    std::string log() const { return slurp(dir_ + "/log"); }

  private:
    std::string dir_, socket_;
    pid_t launcher_ = -1, pid_ = -1;
    int launcher_rc_ = -1;
    bool reaped_ = false;
};

// This process's children that are still there (zombies included), as "pid comm" lines.
std::string childrenLeft() {
    std::string out;
    const std::string self = std::to_string(getpid());
    if (DIR *d = opendir("/proc")) {
        while (dirent *e = readdir(d)) {
            if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) {
                continue;
            }
            std::string stat = slurp(std::string("/proc/") + e->d_name + "/stat");
            size_t close = stat.rfind(')');
            if (close == std::string::npos) {
                continue;
            }
            // After comm: state, then ppid.
            char state = 0;
            int ppid = 0;
            if (sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) == 2 &&
                std::to_string(ppid) == self) {
                out += std::string(e->d_name) + " " + stat.substr(0, close + 1) + "\n";
            }
        }
        closedir(d);
    }
    return out;
}

TEST(RestartDaemonizing, RequireKeepRestartsTheDetachedBrokerInPlace) {
    DetachedBroker broker;
    EXPECT_EQ(broker.launcherRc(), 0) << broker.log();
    AdminClient admin(broker.socket());
    const pid_t pid = broker.findPid(admin);
    ASSERT_GT(pid, 0) << broker.log();
    EXPECT_NE(pid, broker.launcher());  // it did detach

    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty())
        << slurp(broker.dir() + "/tenant.err") << broker.log();
    std::map<uint64_t, int> sessions_before = admin.sessions();
    std::set<uint64_t> objects_before = admin.lastingObjects(tenant.pid());
    ASSERT_EQ(sessions_before.size(), 1u);
    ASSERT_GE(objects_before.size(), 7u);

    pb::RestartResponse resp;
    grpc::Status st = admin.restart(/*require_keep=*/true, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message() << broker.log();
    EXPECT_EQ(resp.sessions_kept(), 1u);
    EXPECT_EQ(resp.sessions_dropped(), 0u);
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    pb::GetStatusResponse status;
    ASSERT_TRUE(admin.status(&status).ok());
    EXPECT_EQ(status.pid(), pid);  // the exec'd broker did not detach again
    EXPECT_EQ(status.sessions(), 1u);
    EXPECT_FALSE(status.last_restart_crash());
    EXPECT_EQ(admin.sessions(), sessions_before) << broker.log();
    std::set<uint64_t> now = admin.objects()[tenant.pid()];
    EXPECT_TRUE(std::includes(now.begin(), now.end(), objects_before.begin(), objects_before.end()))
        << broker.log();
    std::string log = broker.log();
    EXPECT_NE(log.find("restart 1: 1 session(s) kept"), std::string::npos) << log;
    EXPECT_EQ(log.find("another broker is serving"), std::string::npos) << log;

    std::string done = tenant.finish();
    ASSERT_FALSE(done.empty()) << tenant.lines() << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "failed"), 0u) << done;
    EXPECT_EQ(field(done, "control_failed"), 0u) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_GT(field(done, "wrs"), 0u);

    EXPECT_EQ(broker.terminate(), 0) << broker.log();
    EXPECT_EQ(kill(pid, 0), -1);
    EXPECT_EQ(childrenLeft(), "");
    EXPECT_NE(access(broker.socket().c_str(), F_OK), 0) << "the socket outlived the broker";
}

// ---- Debian's pingpong programs across a restart (--foreground) ------------------------------

// An admin restart with --require-keep (the broker's first) that keeps `sessions` sessions and
// every handle of `kind` as it was.
void restartKeeping(BrokerProcess &broker, AdminClient &admin, uint32_t sessions, pb::ObjectKind kind) {
    const auto before = admin.objects(kind);
    pb::RestartResponse resp;
    grpc::Status st = admin.restart(/*require_keep=*/true, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message() << broker.log();
    EXPECT_EQ(resp.sessions_kept(), sessions);
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    EXPECT_EQ(admin.objects(kind), before) << "handles changed across the restart";
}

// Runs `program -d softnda0 -n iters -p PORT` as a server and a client tenant, restarts the
// broker (require_keep) once the pair has executed a fifth of its work requests, and checks that
// no session ends early and both ends finish, their output holding a line starting with `done`.
// The objects of kind `kept` the pair holds keep their handles across the restart.
void pairRunsOnAcrossARestart(const char *program, int iters, const std::string &done, pb::ObjectKind kept) {
    if (access(program, X_OK) != 0) {
        GTEST_SKIP() << "no " << program << " (Debian's ibverbs-utils)";
    }
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    AdminClient admin(broker.socket());
    const std::string port = std::to_string(freeLoopbackPort());
    const std::vector<std::string> server_argv = {program, "-d", "softnda0", "-n", std::to_string(iters),
                                                  "-p",    port};
    std::vector<std::string> client_argv = server_argv;
    client_argv.push_back("localhost");
    Tenant server(broker.socket(), broker.dir() + "/server.err", server_argv);
    std::unique_ptr<Tenant> client;
    int rc = -1;
    // The client is retried while the server is not listening yet; then the pair must be moving.
    ASSERT_TRUE(eventually(
        [&] {
            if (client == nullptr || client->exited(&rc)) {
                client = std::make_unique<Tenant>(broker.socket(), broker.dir() + "/client.err", client_argv);
            }
            return admin.engineCounter("wqes_executed") >= static_cast<uint64_t>(iters / 5);
        },
        20s))
        << slurp(broker.dir() + "/server.err") << slurp(broker.dir() + "/client.err") << broker.log();
    ASSERT_EQ(admin.sessions().size(), 2u);
    const auto kept_before = admin.objects(kept);
    ASSERT_EQ(kept_before.size(), 2u) << "both tenants hold objects of the kind";

    // The clients that found no server yet ended their sessions before this point.
    const size_t restart_at = broker.log().size();
    ASSERT_NO_FATAL_FAILURE(restartKeeping(broker, admin, 2, kept));

    // No session ends while the pair runs ("session N ended (fd channel closed)" after a restore
    // was the bug), and both ends finish.
    int server_rc = -1, client_rc = -1;
    bool ended_early = false;
    bool finished = eventually(
        [&] {
            bool s = server.exited(&server_rc), c = client->exited(&client_rc);
            if (!s && !c && !ended_early && broker.log().find(" ended (", restart_at) != std::string::npos) {
                // A tenant that finished ends its session as it exits, a moment before waitpid
                // sees it: a session that ended while its tenant lives on is the early end. (One
                // that ended under a tenant which then exits is caught by the exit codes below.)
                ended_early =
                    !eventually([&] { return server.exited(&server_rc) || client->exited(&client_rc); }, 5s);
            }
            return s && c;
        },
        120s);
    EXPECT_FALSE(ended_early) << broker.log();
    ASSERT_TRUE(finished) << "the pair did not finish after the restart (engine wqes_executed "
                          << admin.engineCounter("wqes_executed") << ")\n"
                          << broker.log();
    std::string server_out = server.lineStarting(done), client_out = client->lineStarting(done);
    EXPECT_EQ(server_rc, 0) << server.lines() << slurp(broker.dir() + "/server.err");
    EXPECT_EQ(client_rc, 0) << client->lines() << slurp(broker.dir() + "/client.err");
    EXPECT_FALSE(server_out.empty()) << server.lines();
    EXPECT_FALSE(client_out.empty()) << client->lines();
    printf("%s across a restart: %s", program, client_out.c_str());
    EXPECT_TRUE(eventually([&] { return admin.sessions().empty(); })) << broker.log();
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

TEST(RestartForeground, RcPingpongPairRunsOnAcrossARequireKeepRestart) {
    // Under a second on an idle host, many times that on a loaded one (a 2-core CI machine runs
    // two tests at once): the restart comes a fifth of the way in, the deadline is generous.
    constexpr int kIters = 5000;
    pairRunsOnAcrossARestart("/usr/bin/ibv_rc_pingpong", kIters, std::to_string(kIters) + " iters in",
                             pb::OBJECT_KIND_QP);
}

// XRC (softnda SPEC.md §14): the domains, XRC SRQs (with their numbers), target and initiator
// QPs of both tenants are carried by the restart while the messages flow. ibv_xsrq_pingpong
// prints no count: its "remote:" address line is what each side prints once connected.
TEST(RestartForeground, XsrqPingpongPairRunsOnAcrossARequireKeepRestart) {
    pairRunsOnAcrossARestart("/usr/bin/ibv_xsrq_pingpong", 5000, "  remote:", pb::OBJECT_KIND_XRCD);
}

// UD (softnda SPEC.md §11): the QPs with their Q_Keys and both tenants' address handles are
// carried by the restart while the datagrams flow (an admin restart pauses the engine between
// WQEs, so none is in flight: §10's at-most-once for a datagram does not enter).
TEST(RestartForeground, UdPingpongPairRunsOnAcrossARequireKeepRestart) {
    // Enough that the pair is still running when the restart is checked: with 2,000 (0.4 s) a
    // pair under ctest -j2 finished during the restart, and its handles were gone (1 run in 20).
    constexpr int kIters = 10000;
    pairRunsOnAcrossARestart("/usr/bin/ibv_ud_pingpong", kIters, std::to_string(kIters) + " iters in",
                             pb::OBJECT_KIND_AH);
}

// ibv_open_qp (docs/restart.md): one tenant's XRC target with another's handle on it, which drove
// the target to RTS, is carried by a --require-keep restart with both handles. After it SENDs
// still arrive through the target, the creator sees the state the handle set (its record was
// committed when the handle changed it), lets go and ends, and the last handle takes the target.
TEST(RestartForeground, AnOpenedXrcTargetIsCarriedWithBothHandles) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant opener(broker.socket(), broker.dir() + "/opener.err", {IBVX_XRC_OPEN_QP, "softnda0", "--pause"});
    ASSERT_FALSE(opener.lineStarting("paused").empty())
        << opener.lines() << slurp(broker.dir() + "/opener.err") << broker.log();
    ASSERT_EQ(admin.sessions().size(), 2u) << "the opener and the creator it started";
    ASSERT_EQ(admin.objects(pb::OBJECT_KIND_QP).size(), 2u)
        << "both hold QPs: a handle on the target each, the opener an initiator";
    ASSERT_NO_FATAL_FAILURE(restartKeeping(broker, admin, 2, pb::OBJECT_KIND_QP));

    std::string done = opener.finish();
    EXPECT_EQ(opener.wait(), 0) << opener.lines() << slurp(broker.dir() + "/opener.err") << broker.log();
    EXPECT_EQ(done.rfind("done OK", 0), 0u) << opener.lines();
    EXPECT_TRUE(eventually([&] { return admin.sessions().empty(); })) << broker.log();
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

TEST(RestartFdStore, SystemdRestartAndKill9KeepEveryQueue) {
    StoreBroker broker;
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty())
        << slurp(broker.dir() + "/tenant.err") << broker.log();
    std::set<uint64_t> before = admin.lastingObjects(tenant.pid());
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

// A crash between a commit's FDSTORE=1 and its log append leaves an fd in the store under a kept
// session's name that its state never names (the harness plants one while the broker is down).
// The successor forgets it. Before, it stayed for good: the chaos soak ended with a doorbell
// page's name still stored after every session had ended (most likely the same BAR file stored
// again under a new name, deduplicated into the old one, whose removal then missed it).
TEST(RestartFdStore, AnFdStoredButNeverLoggedIsForgottenByTheSuccessor) {
    StoreBroker broker(/*restart_sec_ms=*/1000);
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty()) << broker.log();
    auto sessions = admin.sessions();
    ASSERT_EQ(sessions.size(), 1u);
    const std::string planted = "ibvx.s" + std::to_string(sessions.begin()->first) + ".d987654321";
    broker.send("kill9");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    broker.send("plant-fd " + planted);
    ASSERT_FALSE(broker.waitFor("planted ").empty()) << broker.seen();
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    EXPECT_EQ(admin.sessions().count(sessions.begin()->first), 1u) << "the session is kept" << broker.log();
    // The restore forgets it before the successor says it is ready (events read so far).
    EXPECT_NE(broker.seen().find("fdstore-remove name=" + planted + " removed=1"), std::string::npos)
        << "the successor kept the fd its session's state does not name\n"
        << broker.seen() << broker.log();
    const std::string log = broker.log();
    const size_t line = log.find("did not commit:");
    EXPECT_NE(line, std::string::npos) << log;
    EXPECT_NE(log.find(planted, line), std::string::npos) << log;
    std::string done = tenant.finish();
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "failed"), 0u) << done;
}

// After a crash the broker cannot know when the old process stopped: status's took is an upper
// bound, from the old process's last heartbeat, so it covers RestartSec= and is flagged as a
// crash; a systemctl restart (a handover) is not.
TEST(RestartFdStore, Kill9ReportsAnUpperBoundOfTheGapNotZero) {
    constexpr uint64_t kRestartSecMs = 1200;
    StoreBroker broker(static_cast<int>(kRestartSecMs));
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    std::this_thread::sleep_for(1500ms);  // a heartbeat or two
    const auto killed = std::chrono::steady_clock::now();
    broker.send("kill9");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    pb::GetStatusResponse status;
    ASSERT_TRUE(admin.status(&status).ok());
    const auto seen_ms = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed)
            .count());
    EXPECT_TRUE(status.last_restart_crash());
    EXPECT_GE(status.last_restart_took_ms(), kRestartSecMs) << broker.log();
    // At most one heartbeat period (1 s) before the kill, and the test saw the rest.
    EXPECT_LE(status.last_restart_took_ms(), seen_ms + 1000) << broker.log();
    std::string log = broker.log();
    EXPECT_NE(log.find("after a crash: down at most "), std::string::npos) << log;

    std::string ctl = std::string(std::getenv("IBVX_BUILD_DIR")) +
                      "/tools/ibv-extendctl/ibv-extendctl --socket " + broker.socket() + " status";
    std::string out;
    if (FILE *p = popen(ctl.c_str(), "r")) {
        char buf[512];
        while (fgets(buf, sizeof(buf), p) != nullptr) {
            out += buf;
        }
        pclose(p);
    }
    EXPECT_NE(out.find("restarts: 1 (last "), std::string::npos) << out;
    EXPECT_NE(out.find(", after a crash: took ≤"), std::string::npos) << out;
    EXPECT_EQ(out.find("took 0ms"), std::string::npos) << out;

    broker.send("restart");  // a handover says when it began: an exact time, no crash
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(2)) << broker.log();
    ASSERT_TRUE(admin.status(&status).ok());
    EXPECT_FALSE(status.last_restart_crash());
    EXPECT_LT(status.last_restart_took_ms(), kRestartSecMs) << broker.log();  // RestartSec= is for crashes
}

// A call that sends an fd (SetAsyncEventFd at ibv_open_device, CreateCq with a completion
// channel, RegMr, ReregMr onto new memory) whose fd the old broker took but whose commit it never reached:
// the broker dies in exactly that window (a crash point, daemon/core/fault_hooks.h). The successor answers
// the retry "no fd arrived" (EBADF); the client sends the fd again and makes the call anew, so the tenant
// sees nothing: every call succeeds and its RC loop runs clean. And a broker that dies just after
// telling the tenant its fd channel is attached (AttachReplied): the session was committed before
// that reply, so the successor knows it and the tenant's next call finds it. And a commit that
// put new fds in the store but died before its log named them (StoredNotLogged): the successor
// forgets those fds. In every case, once the tenant has ended the store holds no fd of its.
TEST(RestartFdStore, ACallWhoseFdTheOldBrokerTookSucceedsAfterTheCrash) {
    char tmpl[] = "/tmp/ibvx-crash.XXXXXX";
    const std::string markers = mkdtemp(tmpl);
    for (const std::string point :
         {"AttachReplied", "SetAsyncEventFd", "CreateCq", "RegMr", "ReregMr", "StoredNotLogged"}) {
        SCOPED_TRACE(point);
        const std::string marker = markers + "/" + point;
        ASSERT_EQ(setenv("IBVX_FAULT_CRASH_ONCE", (point + ":" + marker).c_str(), 1), 0);
        StoreBroker broker;
        ASSERT_EQ(unsetenv("IBVX_FAULT_CRASH_ONCE"), 0);
        ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
        AdminClient admin(broker.socket());
        const std::string err = broker.dir() + "/tenant.err";
        Tenant tenant(broker.socket(), err);
        ASSERT_FALSE(tenant.lineStarting("ready ").empty()) << slurp(err) << broker.log();
        EXPECT_EQ(access(marker.c_str(), F_OK), 0) << "the broker never reached the crash point";
        ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
        EXPECT_EQ(slurp(err).find("raises no async events"), std::string::npos) << slurp(err);
        std::string done = tenant.finish();
        EXPECT_EQ(tenant.wait(), 0) << done << slurp(err);
        EXPECT_EQ(field(done, "failed"), 0u) << done;
        EXPECT_EQ(field(done, "control_failed"), 0u) << done << slurp(err);
        EXPECT_TRUE(eventually([&] { return admin.sessions().empty(); })) << broker.log();
        std::string status;
        EXPECT_TRUE(eventually([&] {
            broker.send("status");
            status = broker.waitFor("status ");
            return status.find(" names=") != std::string::npos && status.find("ibvx.s") == std::string::npos;
        })) << "the tenant ended, yet the fd store still holds a session's fd: "
            << status << broker.log();
    }
    std::string cmd = "rm -rf " + markers;
    (void)!system(cmd.c_str());
}

// Runtime quota changes (ibv-extendctl quotas set) outlive a crash and a handover: ibvx.global
// carries them, rewritten as each is made, and the successor applies them over its own
// configuration. Namespace accounts are set and shown like the others.
TEST(RestartFdStore, RuntimeQuotaChangesOutliveKill9AndRestart) {
    StoreBroker broker;
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    auto set = [&](pb::QuotaScope scope, const std::string &who, const std::string &quota, uint64_t limit,
                   bool clear = false) {
        pb::SetQuotaRequest req;
        req.set_scope(scope);
        if (scope == pb::QUOTA_SCOPE_UID) {
            req.set_uid(static_cast<uint32_t>(std::stoul(who)));
        } else if (scope == pb::QUOTA_SCOPE_NAMESPACE) {
            req.set_pod_namespace(who);
        } else {
            req.set_container(who);
        }
        req.set_quota(quota);
        req.set_limit(limit);
        req.set_clear(clear);
        grpc::Status st = admin.setQuota(req);
        EXPECT_TRUE(st.ok()) << st.error_message();
    };
    set(pb::QUOTA_SCOPE_UID, "1000", "qps", 7);
    set(pb::QUOTA_SCOPE_UID, "1000", "cqs", 3);
    set(pb::QUOTA_SCOPE_UID, "1000", "cqs", 0, true);  // cleared again: not carried as an override
    set(pb::QUOTA_SCOPE_CONTAINER, "0123456789abcdef", "mrs", 5);
    set(pb::QUOTA_SCOPE_NAMESPACE, "team-a", "qps", 64);
    set(pb::QUOTA_SCOPE_DEFAULT, "", "sessions", 12);
    const std::set<std::string> want = {"uid 1000 qps=7", "container 0123456789abcdef mrs=5",
                                        "namespace team-a qps=64", "default sessions=12"};
    ASSERT_EQ(admin.quotaLimits(), want);
    pb::SetQuotaRequest nameless;
    nameless.set_scope(pb::QUOTA_SCOPE_NAMESPACE);
    nameless.set_quota("qps");
    nameless.set_limit(1);
    EXPECT_EQ(admin.setQuota(nameless).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

    broker.send("kill9");  // no heartbeat in between: the change itself was kept
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    EXPECT_EQ(admin.quotaLimits(), want) << broker.log();

    broker.send("restart");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(2)) << broker.log();
    EXPECT_EQ(admin.quotaLimits(), want) << broker.log();
}

// After a crash the session's age still goes on (its creation time is in its state).
TEST(RestartFdStore, Kill9KeepsTheSessionsAge) {
    StoreBroker broker;
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    Tenant tenant(broker.socket(), broker.dir() + "/tenant.err");
    ASSERT_FALSE(tenant.lineStarting("ready ").empty())
        << slurp(broker.dir() + "/tenant.err") << broker.log();
    std::this_thread::sleep_for(1200ms);
    std::map<uint64_t, pb::SessionInfo> before = admin.sessionInfos();
    ASSERT_EQ(before.size(), 1u);
    broker.send("kill9");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    std::map<uint64_t, pb::SessionInfo> after = admin.sessionInfos();
    ASSERT_EQ(after.size(), 1u) << broker.log();
    EXPECT_EQ(after.begin()->first, before.begin()->first);
    EXPECT_GE(after.begin()->second.connected_ms(), before.begin()->second.connected_ms());
    EXPECT_EQ(after.begin()->second.connected_since_unix_ms(),
              before.begin()->second.connected_since_unix_ms());
    std::string done = tenant.finish();
    EXPECT_EQ(tenant.wait(), 0) << done << slurp(broker.dir() + "/tenant.err");
    EXPECT_EQ(field(done, "control_failed"), 0u) << done;
}

// A file two sessions share (a forked child registering its parent's memfd; here two sessions of
// one process) is stored once: the first session's name holds it and the second's is an alias.
// When the first session ends, the file stays in the store for the second, so a crash after
// that loses nothing: the second session comes back with its MR, and a WRITE through that MR
// (queues made before the crash, posted after it) moves the memfd's bytes.
TEST(RestartFdStore, AFileTwoSessionsShareOutlivesTheFirstSessionAndACrash) {
    StoreBroker broker;
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    AdminClient admin(broker.socket());
    const size_t len = 65536;
    UniqueFd mfd(memfd_create("shared", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(mfd.get(), len), 0);
    ASSERT_EQ(fcntl(mfd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the broker maps only sealed memory
    auto *buf = static_cast<uint8_t *>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd.get(), 0));
    ASSERT_NE(buf, MAP_FAILED);
    auto regMr = [&](TestClient &c, const Handles &h, uint64_t xfer, pb::RegMrResponse *mr) {
        ASSERT_EQ(c.sendFd(xfer, mfd.get()), 0);
        pb::RegMrRequest req;
        req.set_pd(h.pd);
        req.set_xfer_id(xfer);
        req.set_length(len);
        req.set_access(kAllAccess);
        req.set_iova(reinterpret_cast<uint64_t>(buf));
        grpc::Status st = c.call(&pb::Broker::Stub::RegMr, req, mr);
        ASSERT_TRUE(st.ok()) << st.error_message();
    };
    auto first = std::make_unique<TestClient>(broker.socket());
    ASSERT_TRUE(first->connect());
    pb::RegMrResponse mr1, mr2;
    regMr(*first, openDevice(*first), 1, &mr1);
    const uint64_t first_id = admin.sessions().begin()->first;

    TestClient second(broker.socket());
    ASSERT_TRUE(second.connect());
    Handles h = openDevice(second);
    regMr(second, h, 2, &mr2);
    pb::CreateCqResponse cq;
    ASSERT_TRUE(createCq(second, h.ctx, 64, &cq).ok());
    pb::CreateQpResponse qa, qb;
    ASSERT_TRUE(createQp(second, h, cq.cq(), 0, &qa).ok());
    ASSERT_TRUE(createQp(second, h, cq.cq(), 0, &qb).ok());
    ASSERT_GE(second.drainRegions(), 0);
    connectQp(second, qa.qp(), qb.qp_num());
    connectQp(second, qb.qp(), qa.qp_num());
    auto sessions = admin.sessions();
    ASSERT_EQ(sessions.size(), 2u);
    const uint64_t second_id = sessions.rbegin()->first;
    ASSERT_NE(second_id, first_id);

    first.reset();  // its fd channel closes: the session ends, and its names leave the store
    ASSERT_TRUE(eventually([&] { return admin.sessions().size() == 1; })) << broker.log();
    broker.send("kill9");
    ASSERT_FALSE(broker.waitFor("exited ").empty());
    ASSERT_FALSE(broker.waitFor("ready ").empty()) << broker.log();
    admin.reconnect();
    ASSERT_TRUE(admin.waitRestarts(1)) << broker.log();
    ASSERT_EQ(admin.sessions().count(second_id), 1u) << broker.log();
    EXPECT_EQ(admin.objects()[getpid()].count(mr2.mr()), 1u) << broker.log();

    for (size_t i = 0; i < 4096; ++i) {
        buf[i] = static_cast<uint8_t>(i * 7 + 3);
    }
    queue_info sqi = localQueue(second, qa.sq_info());
    queue_info cqi = localQueue(second, cq.cq_info());
    softnda_sq sq;
    softnda_cq dcq;
    ASSERT_EQ(softnda_sq_init(&sq, &sqi), 0);
    ASSERT_EQ(softnda_cq_init(&dcq, &cqi), 0);
    softnda_sge sge{reinterpret_cast<uint64_t>(buf), 4096, mr2.lkey()};
    softnda_send_wr wr{};
    wr.wr_id = 7;
    wr.opcode = SOFTNDA_OP_RDMA_WRITE;
    wr.flags = SOFTNDA_WQE_SIGNALED;
    wr.remote_addr = reinterpret_cast<uint64_t>(buf) + 8192;
    wr.rkey = mr2.rkey();
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(softnda_sq_post(&sq, &wr), 0);
    softnda_sq_doorbell(&sq);
    softnda_cqe cqe{};
    ASSERT_TRUE(eventually([&] { return softnda_cq_poll(&dcq, &cqe, 1) == 1; })) << broker.log();
    EXPECT_EQ(cqe.wr_id, 7u);
    EXPECT_EQ(cqe.status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(buf, buf + 8192, 4096), 0);
    munmap(buf, len);
}

}  // namespace
}  // namespace ibvx::test
