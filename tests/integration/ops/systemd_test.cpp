// ibv-extendd as a systemd service: socket activation through systemd-socket-activate, the
// sd_notify protocol (READY=1, STATUS=, WATCHDOG=1) read from a test NOTIFY_SOCKET, and an
// install into a temporary prefix whose daemon and CLI run from there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/unique_fd.h"
#include "run_process.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/test_client.h"

namespace ibvx::test {
namespace {

namespace fs = std::filesystem;

std::string buildDir() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    return b != nullptr ? b : ".";
}

std::string tempDir() {
    char tmpl[] = "/tmp/ibvx.XXXXXX";
    return ::mkdtemp(tmpl) != nullptr ? tmpl : "";
}

bool waitForSocket(const std::string &path, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
        if (connectUnix(path)) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

TEST(Systemd, SocketActivatedDaemonServesClients) {
    std::string dir = tempDir();
    ASSERT_FALSE(dir.empty());
    std::string sock = dir + "/act.sock";
    const char *providers = std::getenv("IBV_EXTEND_PROVIDER_DIR");
    ASSERT_NE(providers, nullptr);
    // The daemon's own --socket names a path it must not bind: it has to serve the passed one.
    Background bg = startBackground(
        {"/usr/bin/systemd-socket-activate", "-l", sock, "-E",
         std::string("IBV_EXTEND_PROVIDER_DIR=") + providers, buildDir() + "/daemon/ibv-extendd",
         "--foreground", "--socket", dir + "/not-this.sock"},
        dir + "/log");
    ASSERT_TRUE(waitForSocket(sock, 10000)) << readFile(dir + "/log");
    ProcessResult r = runProcess({ctlBinary(), "--socket", sock, "status"});
    EXPECT_EQ(r.exit_code, 0) << r.err << readFile(dir + "/log");
    EXPECT_NE(r.out.find("passed by systemd"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("softnda0"), std::string::npos) << r.out;
    TestClient c(sock);
    EXPECT_TRUE(c.connect());
    EXPECT_FALSE(fs::exists(dir + "/not-this.sock"));
    ::kill(bg.pid, SIGTERM);
    EXPECT_EQ(waitBackground(bg, 10000), 0) << readFile(dir + "/log");
    EXPECT_NE(readFile(dir + "/log").find("using the socket passed by systemd"), std::string::npos);
    fs::remove_all(dir);
}

class NotifySocket {
  public:
    explicit NotifySocket(const std::string &path) : path_(path) {
        fd_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
        bound_ = fd_ && ::bind(fd_.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
    }
    bool bound() const { return bound_; }
    // Messages until pred accepts one or timeout; every message read is kept in all().
    template <typename Pred>
    bool waitFor(Pred pred, int timeout_ms) {
        auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (std::chrono::steady_clock::now() < deadline) {
            timeval tv{0, 100000};
            ::setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            char buf[4096];
            ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
            if (n > 0) {
                all_.emplace_back(buf, static_cast<size_t>(n));
                if (pred(all_.back())) {
                    return true;
                }
            }
        }
        return false;
    }
    const std::vector<std::string> &all() const { return all_; }

  private:
    std::string path_;
    UniqueFd fd_;
    bool bound_ = false;
    std::vector<std::string> all_;
};

TEST(Systemd, NotifiesReadyStatusAndWatchdog) {
    std::string dir = tempDir();
    ASSERT_FALSE(dir.empty());
    NotifySocket notify(dir + "/notify");
    ASSERT_TRUE(notify.bound());
    BrokerOptions o;
    o.env = {"NOTIFY_SOCKET=" + dir + "/notify", "WATCHDOG_USEC=400000"};
    BrokerProcess broker(o);
    ASSERT_TRUE(broker.started()) << broker.log();
    auto has = [](const std::string &m, const char *what) { return m.find(what) != std::string::npos; };
    ASSERT_TRUE(notify.waitFor([&](const std::string &m) { return has(m, "READY=1"); }, 10000));
    EXPECT_NE(notify.all().back().find("STATUS=serving 0 session(s), 0 object(s) on 1 device(s)"),
              std::string::npos)
        << notify.all().back();
    int pings = 0;
    notify.waitFor(
        [&](const std::string &m) {
            pings += has(m, "WATCHDOG=1") ? 1 : 0;
            return pings >= 3;
        },
        10000);
    EXPECT_GE(pings, 3);
    TestClient c(broker.socket());
    ASSERT_TRUE(c.connect());
    EXPECT_TRUE(
        notify.waitFor([&](const std::string &m) { return has(m, "STATUS=serving 1 session(s)"); }, 10000));
    EXPECT_EQ(broker.terminate(), 0);
    EXPECT_TRUE(notify.waitFor([&](const std::string &m) { return has(m, "STOPPING=1"); }, 5000));
    fs::remove_all(dir);
}

TEST(Install, TempPrefixHasTheLayoutAndItsDaemonAndCliRun) {
    std::string prefix = tempDir();
    ASSERT_FALSE(prefix.empty());
    ProcessResult inst = runProcess({"/usr/bin/cmake", "--install", buildDir(), "--prefix", prefix},
                                    RunOptions{{}, -1, 120000});
    ASSERT_EQ(inst.exit_code, 0) << inst.out << inst.err;
    for (const char *f :
         {"sbin/ibv-extendd", "bin/ibv-extendctl", "lib/libibv_extend.so", "include/ibv_extend.h",
          "lib/pkgconfig/ibv-extend.pc", "lib/ibv_extend/libsoftnda.so",
          "lib/systemd/system/ibv-extendd.service", "lib/systemd/system/ibv-extendd.socket",
          "lib/sysusers.d/ibv-extend.conf", "lib/tmpfiles.d/ibv-extend.conf",
          "share/doc/ibv-extend/examples/ibv-extendd.toml"}) {
        EXPECT_TRUE(fs::exists(prefix + "/" + f)) << f;
    }
    bool man = false;
    for (const char *m : {"share/man/man8/ibv-extendd.8", "share/doc/ibv-extend/man/ibv-extendd.8.txt"}) {
        man = man || fs::exists(prefix + "/" + m);
    }
    EXPECT_TRUE(man);
    ProcessResult pc = runProcess({"/usr/bin/pkg-config", "--cflags", "--libs", "ibv-extend"},
                                  RunOptions{{"PKG_CONFIG_PATH=" + prefix + "/lib/pkgconfig"}, -1, 10000});
    EXPECT_EQ(pc.exit_code, 0) << pc.err;
    EXPECT_NE(pc.out.find("-libv_extend"), std::string::npos) << pc.out;
    // Relocatable: the paths are spelled from the .pc file's place inside the prefix.
    EXPECT_NE(pc.out.find("-I" + prefix + "/"), std::string::npos) << pc.out;
    EXPECT_NE(pc.out.find("-L" + prefix + "/"), std::string::npos) << pc.out;

    std::string sock = prefix + "/b.sock";
    Background d =
        startBackground({prefix + "/sbin/ibv-extendd", "--foreground", "--socket", sock},
                        prefix + "/daemon.log", {"IBV_EXTEND_PROVIDER_DIR=" + prefix + "/lib/ibv_extend"});
    ASSERT_TRUE(waitForSocket(sock, 10000)) << readFile(prefix + "/daemon.log");
    ProcessResult r = runProcess({prefix + "/bin/ibv-extendctl", "--socket", sock, "status"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("softnda0"), std::string::npos) << r.out;
    EXPECT_NE(readFile(prefix + "/daemon.log").find(prefix + "/lib/ibv_extend/libsoftnda.so"),
              std::string::npos)
        << readFile(prefix + "/daemon.log");
    ::kill(d.pid, SIGTERM);
    EXPECT_EQ(waitBackground(d, 10000), 0);
    fs::remove_all(prefix);
}

}  // namespace
}  // namespace ibvx::test
