// UCX 1.13 (Debian's ucx-utils) over the libibverbs face, UCT level: ucx_info lists the broker's
// device with an IB memory domain and rc_verbs, and ucx_perftest's put_lat, put_bw, get, am_lat
// and am_bw run between two unprivileged tenants over rc_verbs, each in ibv-extend-run's sandbox
// (UCX considers a device only when /dev/infiniband/<dev_name> is a character device it may
// open, docs/verbs.md). Short iteration counts: these prove the transport works; figures belong
// to the benchmark.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

constexpr long kNobody = 65534;

// A TCP port nobody listens on now, for ucx_perftest's out-of-band exchange.
int freePort() {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    int port = -1;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&sa), &len) == 0) {
        port = ntohs(sa.sin_port);
    }
    if (fd >= 0) {
        ::close(fd);
    }
    return port;
}

// Whether something listens on the TCP port (read from /proc/net/tcp{,6}: connecting to find out
// would take the server's only accept).
bool listening(int port) {
    char want[16];
    std::snprintf(want, sizeof(want), ":%04X ", port);
    for (const char *table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::ifstream in(table);
        std::string line;
        while (std::getline(in, line)) {
            // sl local_address rem_address st ...: st 0A is LISTEN
            if (line.find(want) != std::string::npos && line.find(" 0A ") != std::string::npos) {
                return true;
            }
        }
    }
    return false;
}

class UcxTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (std::string(IBVX_UCX_PERFTEST).empty() || std::string(IBVX_UCX_INFO).empty()) {
            GTEST_SKIP() << "ucx-utils is not installed (scripts/install-deps.sh)";
        }
        broker_ = std::make_unique<BrokerProcess>("[broker]\nsocket_mode = \"0666\"\n");
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ASSERT_EQ(::chmod(broker_->dir().c_str(), 0755), 0);
        // The socket accepts from its bind on; the discovery tree comes just before serving.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (::access((broker_->dir() + "/discovery").c_str(), F_OK) != 0 &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        // UCX sees the device only inside the sandbox; where bwrap cannot make one (a chroot
        // whose "/" is not a mount point) there is nothing to test.
        ProcessResult probe = tenant({"/bin/true"});
        if (probe.exit_code != 0 && probe.err.find("bwrap cannot make the sandbox") != std::string::npos) {
            GTEST_SKIP() << probe.err;
        }
        ASSERT_EQ(probe.exit_code, 0) << probe.err;
    }

    // argv run as uid 65534 through ibv-extend-run, in the sandbox or not at all.
    ProcessResult tenant(const std::vector<std::string> &command, int timeout_ms = 60000) const {
        std::vector<std::string> argv = {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on",
                                         "--"};
        argv.insert(argv.end(), command.begin(), command.end());
        RunOptions o;
        o.uid = kNobody;
        o.timeout_ms = timeout_ms;
        o.env = {"PATH=/usr/bin:/bin", "UCX_WARN_UNUSED_ENV_VARS=n"};
        return runProcess(argv, o);
    }

    // One ucx_perftest case: a server tenant, then a client tenant naming it, over rc_verbs.
    void perftest(const std::vector<std::string> &args) {
        const int port = freePort();
        ASSERT_GT(port, 0);
        const std::vector<std::string> common = {"-d",       "softnda0:1", "-x",
                                                 "rc_verbs", "-p",         std::to_string(port)};
        std::vector<std::string> server = {IBVX_UCX_PERFTEST};
        server.insert(server.end(), common.begin(), common.end());
        auto served = std::async(std::launch::async, [&] { return tenant(server); });
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!listening(port) && std::chrono::steady_clock::now() < deadline &&
               served.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
        }
        std::vector<std::string> client = {IBVX_UCX_PERFTEST, "127.0.0.1"};
        client.insert(client.end(), common.begin(), common.end());
        client.insert(client.end(), args.begin(), args.end());
        ProcessResult c = tenant(client);
        ProcessResult s = served.get();
        EXPECT_EQ(c.exit_code, 0) << c.out << c.err << broker_->log();
        EXPECT_EQ(s.exit_code, 0) << s.out << s.err;
        EXPECT_THAT(c.out, ::testing::HasSubstr("Final:"));
        std::printf("%s", c.out.substr(c.out.find("Final:")).c_str());
    }

    std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(UcxTest, UcxInfoListsTheDeviceWithAnIbMemoryDomainAndRcVerbs) {
    ProcessResult r = tenant({IBVX_UCX_INFO, "-d"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, ::testing::ContainsRegex("# Memory domain: softnda0\n"));
    EXPECT_THAT(r.out, ::testing::ContainsRegex("# +Transport: rc_verbs\n# +Device: softnda0:1\n"));
}

TEST_F(UcxTest, PutLatency) {
    perftest({"-t", "put_lat", "-n", "100", "-w", "10"});
}

TEST_F(UcxTest, PutBandwidthZeroCopy64KiB) {
    perftest({"-t", "put_bw", "-D", "zcopy", "-s", "65536", "-n", "200", "-w", "10"});
}

TEST_F(UcxTest, GetBandwidthZeroCopy64KiB) {
    perftest({"-t", "get", "-D", "zcopy", "-s", "65536", "-n", "200", "-w", "10"});
}

// Active messages are SENDs into rc_verbs' SRQ; rc_verbs flushes with zero-length WRITEs.
TEST_F(UcxTest, ActiveMessageLatency) {
    perftest({"-t", "am_lat", "-n", "100", "-w", "10"});
}

TEST_F(UcxTest, ActiveMessageBandwidthBcopy4KiB) {
    perftest({"-t", "am_bw", "-D", "bcopy", "-s", "4096", "-n", "200", "-w", "10"});
}

}  // namespace
}  // namespace ibvx::test
