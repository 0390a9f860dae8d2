// Hostile tenants against softnda's engine, the emulated NIC that runs inside the broker and reads
// what tenants write: queue entries, doorbells, registered memory, the eventfds they hand over.
// DESIGN.md's security stance says every count and length read there is bounded by where it
// lands, every descriptor the engine maps is sealed against shrinking, no write to a tenant's
// descriptor can block, and no tenant's work can hold the device from others. Each test runs one
// attack of engine-attacker (engine_attacker.c) as uid 65534 through ibv-extend-run against a real
// ibv-extendd, then holds the broker to what an unharmed one does:
//  - it lives, and `ibv-extendctl stats` answers;
//  - an honest tenant (a pair of connected RC QPs) started before the attack still moves verified
//    data, and one started after works;
//  - once the attacker is gone it holds the objects and no more fds than before the attack;
// and the attacker got the answer a NIC gives (an error completion, a refused call).
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "ibv_extend/v1/admin.grpc.pb.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/wait_for.h"
#include "tests/integration/verbs/tenant.h"

namespace ibvx::test {
namespace {

namespace pb = ::ibv_extend::v1;
using std::chrono::seconds;

// Guards against a wedged broker, never measures of speed: a healthy broker answers in
// milliseconds, and these only bound how long a failing test takes to say so.
constexpr int kAttackMs = 90000;
constexpr int kTenantMs = 20000;
constexpr auto kCtlWait = seconds(20);
constexpr auto kBaselineWait = seconds(10);

// What the attacker said: the first value of each "KEY VALUE" line, and its CALL lines in order.
struct Report {
    std::map<std::string, std::string> values;
    std::vector<std::string> calls;
    std::string out, err;
    int rc = -1;

    std::string operator[](const std::string &key) const {
        auto it = values.find(key);
        return it == values.end() ? "(not said)" : it->second;
    }
    // The value's first word: a completion status's number, "OK", an errno's name.
    std::string first(const std::string &key) const {
        std::istringstream in((*this)[key]);
        std::string w;
        in >> w;
        return w;
    }
    std::string text() const { return "the attacker said:\n" + out + "its stderr:\n" + err; }
};

std::string number(int v) {
    return std::to_string(v);
}

// An honest tenant: engine-attacker's "honest" mode, a pair of connected RC QPs that SENDs and
// WRITEs verified bytes once per round.
class Honest {
  public:
    Honest(const std::string &socket, std::string err_path)
        : err_(std::move(err_path)),
          tenant_(viaRun(socket, IBVX_ENGINE_ATTACKER, {"honest", "softnda0"}), tenantEnv(), err_) {}

    bool ready() { return tenant_.readLine(kTenantMs) == "READY"; }
    // One round: "" when its bytes arrived, else what it said (and its stderr).
    std::string round() {
        ++rounds_;
        tenant_.reply();
        const std::string said = tenant_.readLine(kTenantMs);
        return said == "ROUND " + number(rounds_) + " OK" ? "" : "\"" + said + "\"\n" + slurp(err_);
    }
    std::string err() const { return slurp(err_); }

  private:
    std::string err_;
    Contained tenant_;
    int rounds_ = 0;
};

class EngineAttackTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (geteuid() != 0) {
            GTEST_SKIP() << "needs root: the tenants run as uid 65534";
        }
        // A tenant that died (with the broker) must not take the test with it on the next line
        // written to its stdin.
        signal(SIGPIPE, SIG_IGN);
        broker_ = std::make_unique<BrokerProcess>(std::string("[broker]\nsocket_mode = \"0666\"\n"));
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ASSERT_EQ(chmod(broker_->dir().c_str(), 0755), 0);
        ASSERT_TRUE(
            waitFor([&] { return access((broker_->dir() + "/discovery").c_str(), F_OK) == 0; }, seconds(10)))
            << broker_->log();
        before_ = std::make_unique<Honest>(broker_->socket(), broker_->dir() + "/honest-before.err");
        ASSERT_TRUE(before_->ready()) << before_->err();
        ASSERT_EQ(before_->round(), "");
        fds0_ = broker_->fdTargets();
        std::optional<std::map<std::string, int>> objects = objectKinds();
        ASSERT_TRUE(objects.has_value());
        objects0_ = *objects;
    }

    // Runs engine-attacker MODE as a tenant to its end (killed if it outlives kAttackMs).
    Report attack(const std::string &mode) {
        Report r;
        const std::string err = broker_->dir() + "/" + mode + ".err";
        Contained c(viaRun(broker_->socket(), IBVX_ENGINE_ATTACKER, {mode, "softnda0"}), tenantEnv(), err);
        r.out = c.readAll(kAttackMs);
        if (!c.exited()) {
            kill(c.pid(), SIGKILL);
        }
        r.rc = c.wait();
        r.err = slurp(err);
        std::istringstream in(r.out);
        std::string line;
        while (std::getline(in, line)) {
            const size_t space = line.find(' ');
            const std::string key = line.substr(0, space);
            const std::string value = space == std::string::npos ? "" : line.substr(space + 1);
            if (key == "CALL") {
                r.calls.push_back(value);
            } else {
                r.values.emplace(key, value);
            }
        }
        std::printf("%s: %s", mode.c_str(), r.out.c_str());
        return r;
    }

    // "" while the broker lives; else how it ended (it stays a zombie for BrokerProcess to reap).
    std::string brokerDeath() const {
        siginfo_t info{};
        if (waitid(P_PID, broker_->pid(), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
            return "";
        }
        if (info.si_code == CLD_EXITED) {
            return "exited with status " + number(info.si_status);
        }
        return "killed by signal " + number(info.si_status) + " (" + strsignal(info.si_status) + ")";
    }

    // Objects the broker holds, by kind, over every session; nothing when it does not answer.
    std::optional<std::map<std::string, int>> objectKinds() const {
        auto channel = grpc::CreateChannel("unix:" + broker_->socket(), grpc::InsecureChannelCredentials());
        auto admin = pb::Admin::NewStub(channel);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
        pb::ListObjectsRequest req;
        pb::ListObjectsResponse resp;
        if (!admin->ListObjects(&ctx, req, &resp).ok()) {
            return std::nullopt;
        }
        std::map<std::string, int> kinds;
        for (const auto &o : resp.objects()) {
            kinds[pb::ObjectKind_Name(o.kind())]++;
        }
        return kinds;
    }

    // `ibv-extendctl --socket S stats`: its exit status and output, or -1 when it had not
    // finished within kCtlWait (it is killed then).
    int ctlStats(std::string *out) const {
        const std::string socket = broker_->socket();
        const char *argv[] = {IBVX_CTL_BINARY, "--socket", socket.c_str(), "stats", nullptr};
        int pipefd[2];
        if (pipe2(pipefd, O_CLOEXEC) != 0) {
            return -2;
        }
        const pid_t pid = fork();
        if (pid == 0) {
            dup2(pipefd[1], STDOUT_FILENO);
            dup2(pipefd[1], STDERR_FILENO);
            execv(argv[0], const_cast<char *const *>(argv));
            _exit(127);
        }
        close(pipefd[1]);
        const auto deadline = std::chrono::steady_clock::now() + kCtlWait;
        char buf[4096];
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            pollfd p{pipefd[0], POLLIN, 0};
            if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                break;
            }
            const ssize_t n = read(pipefd[0], buf, sizeof(buf));
            if (n <= 0) {
                break;
            }
            out->append(buf, static_cast<size_t>(n));
        }
        close(pipefd[0]);
        int status = 0;
        if (!waitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, seconds(1))) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            *out += "\n(no answer within " + number(static_cast<int>(kCtlWait.count())) + " s)";
            return -1;
        }
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }

    // Everything but the attacker's own answer: see the file's comment. Whether the broker lives
    // is judged last: one that is dying (a SIGBUS, a core being written) may not have ended yet
    // when the attacker did.
    void expectBrokerUnharmed() {
        std::string ctl;
        EXPECT_EQ(ctlStats(&ctl), 0) << "ibv-extendctl stats: " << ctl;
        EXPECT_EQ(before_->round(), "") << "the honest pair started before the attack";
        // The attacker's session ends after its process: give the broker time to drop it.
        auto fds = [&] { return broker_->fdCount(); };
        std::optional<std::map<std::string, int>> objects;
        waitFor(
            [&] {
                objects = objectKinds();
                return !brokerDeath().empty() ||
                       (fds() >= 0 && fds() <= static_cast<int>(fds0_.size()) && objects == objects0_);
            },
            kBaselineWait, std::chrono::milliseconds(50));
        EXPECT_TRUE(objects.has_value() && *objects == objects0_)
            << "objects before the attack: " << testing::PrintToString(objects0_)
            << "\nafter it: " << (objects ? testing::PrintToString(*objects) : std::string("no answer"));
        // A leak only adds fds; the baseline may hold one the broker was about to close.
        const std::vector<std::string> fds1 = broker_->fdTargets();
        std::vector<std::string> added;
        std::set_difference(fds1.begin(), fds1.end(), fds0_.begin(), fds0_.end(), std::back_inserter(added));
        EXPECT_TRUE(fds() >= 0 && fds() <= static_cast<int>(fds0_.size()))
            << "broker fds: " << fds0_.size() << " before the attack, " << fds()
            << " after; new: " << testing::PrintToString(added);
        Honest after(broker_->socket(), broker_->dir() + "/honest-after.err");
        EXPECT_TRUE(after.ready()) << "the honest pair started after the attack\n" << after.err();
        EXPECT_EQ(after.round(), "") << "the honest pair started after the attack";
        const std::string log = broker_->log();
        EXPECT_EQ(brokerDeath(), "") << "the broker died; its log ends:\n"
                                     << log.substr(log.size() > 3000 ? log.size() - 3000 : 0);
    }

    std::unique_ptr<BrokerProcess> broker_;
    std::unique_ptr<Honest> before_;
    std::vector<std::string> fds0_;
    std::map<std::string, int> objects0_;
};

// ---- 1: a WQE longer than the engine's copy of one ----
// An XRC initiator made with max_inline_data 464 has 1,024-byte SQ entries; the engine copies a
// WQE into room for 464 inline bytes or 29 SGEs.

void expectLocalQpError(const Report &r) {
    EXPECT_EQ(r.first("status"), number(IBV_WC_LOC_QP_OP_ERR)) << r.text();
    EXPECT_EQ(r["qp_state"], number(IBV_QPS_ERR)) << r.text();
}

TEST_F(EngineAttackTest, InlineDataPastTheEnginesCopyIsALocalQpError) {
    Report r = attack("xrc-inline");  // inline_len 960
    expectBrokerUnharmed();
    expectLocalQpError(r);
}

TEST_F(EngineAttackTest, SgesPastTheEnginesCopyAreALocalQpError) {
    Report r = attack("xrc-sge");  // num_sge 60
    expectBrokerUnharmed();
    expectLocalQpError(r);
}

// ---- 2: a receive with more SGEs than the engine's copy of one ----
// max_recv_sge 16 makes 512-byte receive entries, room for 31 SGEs; the engine holds 29. The
// device may not offer more than it takes, and a receive that says more is the tenant's error.

void expectReceiveRefused(const Report &r) {
    for (const char *key : {"granted_max_recv_sge", "queried_max_recv_sge"}) {
        const int v = std::atoi(r[key].c_str());
        EXPECT_LE(v, 29) << key << "\n" << r.text();
    }
    EXPECT_NE(r["granted_max_recv_sge"], "(not said)") << r.text();
    EXPECT_EQ(r.first("recv_status"), number(IBV_WC_LOC_QP_OP_ERR)) << r.text();
    EXPECT_EQ(r["qp_state"], number(IBV_QPS_ERR)) << r.text();
}

TEST_F(EngineAttackTest, AReceiveOf31SgesIsALocalQpError) {
    Report r = attack("recv-sge-qp");
    expectBrokerUnharmed();
    expectReceiveRefused(r);
}

TEST_F(EngineAttackTest, AnSrqReceiveOf31SgesIsALocalQpError) {
    Report r = attack("recv-sge-srq");
    expectBrokerUnharmed();
    expectReceiveRefused(r);
}

// ---- 3: registered memory shrunk under its MR, then an RDMA WRITE from it ----

void expectShrinkRefused(const Report &r, const std::string &prefix = "") {
    EXPECT_EQ(r[prefix + "truncate"], "EPERM") << r.text();
    EXPECT_EQ(r.first(prefix + "write_status"), number(IBV_WC_SUCCESS)) << r.text();
    EXPECT_EQ(r[prefix + "data"], "ok") << r.text();
}

// ibvx_alloc_buf's memfd ("ibvx-buf").
TEST_F(EngineAttackTest, ShrinkingAnIbvxAllocBufIsRefused) {
    Report r = attack("shrink-buf");
    expectBrokerUnharmed();
    expectShrinkRefused(r);
}

// Heap memory the face moved onto its memfd ("ibvx-shared-pages").
TEST_F(EngineAttackTest, ShrinkingTheFacesSharedPagesIsRefused) {
    Report r = attack("shrink-heap");
    expectBrokerUnharmed();
    EXPECT_EQ(r["memfd"], "/memfd:ibvx-shared-pages") << r.text();
    expectShrinkRefused(r);
}

// The tenant's own memfd, mapped shared and registered in place: only one sealed against
// shrinking may be registered.
TEST_F(EngineAttackTest, OnlyAMemfdSealedAgainstShrinkingRegistersInPlace) {
    Report r = attack("shrink-memfd");
    expectBrokerUnharmed();
    EXPECT_EQ(r["sealed_reg"], "OK") << r.text();
    expectShrinkRefused(r, "sealed_");
    EXPECT_EQ(r["unsealed_reg"], "EACCES") << r.text();
}

// ---- 4: memory the broker sent, shrunk: the doorbell BAR, hugetlb queue memory ----

TEST_F(EngineAttackTest, ShrinkingTheDoorbellBarIsRefused) {
    Report r = attack("shrink-bar");
    expectBrokerUnharmed();
    EXPECT_EQ(r["memfd"].rfind("/memfd:softnda-bar", 0), 0u) << r.text();
    expectShrinkRefused(r);
}

// Hugepages for a test's length: nr_hugepages raised by `more`, put back after.
class HugePages {
  public:
    explicit HugePages(long more) : old_(read()) {
        configured_ = old_ >= 0 && write(old_ + more) && read() >= old_ + more;
    }
    ~HugePages() {
        if (old_ >= 0) {
            write(old_);
        }
    }
    HugePages(const HugePages &) = delete;
    HugePages &operator=(const HugePages &) = delete;
    bool configured() const { return configured_; }

  private:
    static constexpr const char *kKnob = "/proc/sys/vm/nr_hugepages";
    static long read() {
        std::ifstream in(kKnob);
        long v = -1;
        in >> v;
        return in ? v : -1;
    }
    static bool write(long v) {
        std::ofstream out(kKnob);
        out << v << "\n";
        out.flush();
        return static_cast<bool>(out);
    }
    long old_;
    bool configured_ = false;
};

// Queue memory comes from MFD_HUGETLB memfds (common/memfd_region.cpp) where a pool exists.
TEST_F(EngineAttackTest, ShrinkingHugetlbQueueMemoryIsRefused) {
    HugePages pool(8);  // a session's arena is 2 MiB of it
    if (!pool.configured()) {
        GTEST_SKIP() << "hugepages cannot be configured here (/proc/sys/vm/nr_hugepages)";
    }
    Report r = attack("shrink-queue");
    if (r["memfd"].rfind("not-hugetlb", 0) == 0) {
        GTEST_SKIP() << "a hugepage pool is configured, but the attacker's queue memory did not come from it "
                        "(another process took the pages?)\n"
                     << r.text();
    }
    expectBrokerUnharmed();
    expectShrinkRefused(r);
}

// ---- 5: eventfds the engine writes to, left full ----
// At 0xfffffffffffffffe an eventfd takes no more: a blocking write waits for a reader.

TEST_F(EngineAttackTest, AFullCompletionChannelDoesNotWedgeTheBroker) {
    Report r = attack("full-channel");
    EXPECT_EQ(r["filled"], "OK") << r.text();
    EXPECT_EQ(r.first("write_status"), number(IBV_WC_SUCCESS)) << r.text();
    EXPECT_EQ(r.rc, 0) << r.text();
    expectBrokerUnharmed();
}

TEST_F(EngineAttackTest, AFullAsyncEventFdDoesNotWedgeTheBroker) {
    Report r = attack("full-async");
    EXPECT_EQ(r["filled"], "OK") << r.text();
    // The bad key's error completion comes whether or not its event could be written.
    EXPECT_EQ(r.first("write_status"), number(IBV_WC_LOC_PROT_ERR)) << r.text();
    EXPECT_EQ(r.rc, 0) << r.text();
    expectBrokerUnharmed();
}

// ---- 6: WQEs of 1.8 GiB each, 16 queued ----
// The criterion is an order, not a time: another tenant's control call, made while the hog's
// SENDs run, completes while at most 2 of them complete (the one under way, and one more the
// counter may show late).

TEST_F(EngineAttackTest, ABigWqeHogDoesNotHoldTheDeviceFromOthers) {
    constexpr unsigned kHogWqes = 16;  // engine_attacker.c HOG_WQES
    Report r = attack("hog");
    expectBrokerUnharmed();
    EXPECT_EQ(r["hog"], number(kHogWqes) + " of " + number(kHogWqes) + " failed 0 control_exit 0")
        << r.text();
    int while_hogged = 0;
    for (const std::string &call : r.calls) {
        std::istringstream in(call);
        std::string name;
        unsigned before = 0, after = 0;
        in >> name >> before >> after;
        if (before >= kHogWqes) {
            continue;  // made after the hog ended
        }
        ++while_hogged;
        EXPECT_LE(after - before, 2u) << "the hog's SENDs that completed during " << name << "\n" << r.text();
    }
    // Otherwise the criterion never applied: every call came after the hog.
    EXPECT_GE(while_hogged, 8) << "control calls made while the hog ran\n" << r.text();
}

}  // namespace
}  // namespace ibvx::test
