// fdstore_harness on its own, with counter_service (a memfd counter it keeps in the fd store):
// the store survives `restart` and a kill -9 under Restart=on-failure, is dropped by stop +
// start, refuses fds beyond FileDescriptorStoreMax=, and passes a --listen socket first.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Generous: only there so that a broken harness fails the test instead of hanging it.
constexpr std::chrono::seconds kDeadline{30};

class Harness {
  public:
    // options: the harness's; service_args: counter_service's.
    explicit Harness(std::vector<std::string> options, std::vector<std::string> service_args = {}) {
        std::vector<std::string> args = {FDSTORE_HARNESS};
        args.insert(args.end(), options.begin(), options.end());
        args.emplace_back("--");
        args.emplace_back(FDSTORE_COUNTER_SERVICE);
        args.insert(args.end(), service_args.begin(), service_args.end());
        int in[2], out[2];
        if (::pipe2(in, O_CLOEXEC) < 0 || ::pipe2(out, O_CLOEXEC) < 0) {
            return;
        }
        pid_ = ::fork();
        if (pid_ == 0) {
            ::dup2(in[0], 0);
            ::dup2(out[1], 1);
            std::vector<char *> argv;
            for (std::string &a : args) {
                argv.push_back(a.data());
            }
            argv.push_back(nullptr);
            ::execv(argv[0], argv.data());
            ::_exit(127);
        }
        ::close(in[0]);
        ::close(out[1]);
        control_ = in[1];
        events_ = out[0];
    }
    ~Harness() {
        if (pid_ > 0) {
            ::close(control_);  // end of input: the harness stops the service and exits
            int status = 0;
            ::waitpid(pid_, &status, 0);
        }
        ::close(events_);
    }

    void send(const std::string &line) {
        std::string l = line + "\n";
        ASSERT_EQ(::write(control_, l.data(), l.size()), static_cast<ssize_t>(l.size()));
    }

    // The next event line starting with `prefix` (the ones before it are kept in seen()), or ""
    // when the harness ends or the deadline passes first.
    std::string waitFor(const std::string &prefix) {
        auto until = std::chrono::steady_clock::now() + kDeadline;
        for (;;) {
            size_t nl;
            while ((nl = buffer_.find('\n')) != std::string::npos) {
                std::string line = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                seen_ += line + "\n";
                if (line.rfind(prefix, 0) == 0) {
                    return line;
                }
            }
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                until - std::chrono::steady_clock::now());
            pollfd p{events_, POLLIN, 0};
            if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
                return "";
            }
            char buf[1024];
            ssize_t n = ::read(events_, buf, sizeof(buf));
            if (n <= 0) {
                return "";
            }
            buffer_.append(buf, static_cast<size_t>(n));
        }
    }
    const std::string &seen() const { return seen_; }

  private:
    pid_t pid_ = -1;
    int control_ = -1, events_ = -1;
    std::string buffer_, seen_;
};

// The count counter_service reported on its latest start ("status-text pid=N text=count=C ...").
std::string nextCount(Harness &h) {
    std::string line = h.waitFor("status-text ");
    size_t at = line.find("count=");
    return at == std::string::npos ? "none" : line.substr(at + 6, line.find(' ', at) - at - 6);
}

TEST(FdstoreHarness, RestartKeepsTheStore) {
    Harness h({"--fdstore-max", "16"});
    EXPECT_NE(h.waitFor("started ").find("fds=0"), std::string::npos) << h.seen();
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    ASSERT_NE(h.waitFor("ready "), "") << h.seen();
    EXPECT_NE(h.seen().find("fdstore-add name=counter fds=1 store=1"), std::string::npos) << h.seen();

    h.send("restart");
    EXPECT_NE(h.waitFor("stopping "), "") << h.seen();
    EXPECT_NE(h.waitFor("exited ").find("status=exited:0"), std::string::npos) << h.seen();
    EXPECT_NE(h.waitFor("started ").find("fds=1"), std::string::npos) << h.seen();
    EXPECT_EQ(nextCount(h), "2") << h.seen();
    ASSERT_NE(h.waitFor("ready "), "") << h.seen();
    h.send("status");
    EXPECT_NE(h.waitFor("status pid=").find("restarts=1 store=1 ready=1 state=running"), std::string::npos)
        << h.seen();
}

TEST(FdstoreHarness, Kill9UnderOnFailureKeepsTheStore) {
    Harness h({"--fdstore-max", "16", "--restart", "on-failure"});
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    ASSERT_NE(h.waitFor("ready "), "") << h.seen();
    h.send("kill9");
    EXPECT_NE(h.waitFor("exited ").find("status=killed:9"), std::string::npos) << h.seen();
    EXPECT_NE(h.waitFor("started ").find("fds=1"), std::string::npos) << h.seen();
    EXPECT_EQ(nextCount(h), "2") << h.seen();
}

TEST(FdstoreHarness, Kill9WithoutRestartStopsAndDropsTheStore) {
    Harness h({"--fdstore-max", "16"});
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    h.send("kill9");
    EXPECT_NE(h.waitFor("exited ").find("status=killed:9"), std::string::npos) << h.seen();
    EXPECT_EQ(h.waitFor("fdstore-dropped "), "fdstore-dropped fds=1") << h.seen();
    EXPECT_NE(h.waitFor("stopped"), "") << h.seen();
}

TEST(FdstoreHarness, StopThenStartDropsTheStore) {
    Harness h({"--fdstore-max", "16", "--restart", "on-failure"});
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    ASSERT_NE(h.waitFor("ready "), "") << h.seen();
    h.send("stop");
    EXPECT_NE(h.waitFor("exited ").find("status=exited:0"), std::string::npos) << h.seen();
    EXPECT_EQ(h.waitFor("fdstore-dropped "), "fdstore-dropped fds=1") << h.seen();
    EXPECT_NE(h.waitFor("stopped"), "") << h.seen();
    h.send("start");
    EXPECT_NE(h.waitFor("started ").find("fds=0"), std::string::npos) << h.seen();
    EXPECT_EQ(nextCount(h), "1") << h.seen();
}

TEST(FdstoreHarness, StoreBeyondFileDescriptorStoreMaxIsRefused) {
    Harness h({"--fdstore-max", "2"}, {"--extra", "3"});
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    h.send("status");
    EXPECT_NE(h.waitFor("status pid=").find("store=2"), std::string::npos) << h.seen();
    EXPECT_NE(h.seen().find("fdstore-refused name=extra fds=1 reason=FileDescriptorStoreMax=2"),
              std::string::npos)
        << h.seen();
    h.send("restart");
    EXPECT_NE(h.waitFor("started pid=").find("fds=2"), std::string::npos) << h.seen();
    EXPECT_NE(h.waitFor("status-text ").find("names=counter,extra"), std::string::npos) << h.seen();
}

TEST(FdstoreHarness, WithoutFileDescriptorStoreMaxNothingIsKept) {
    Harness h({});
    EXPECT_EQ(nextCount(h), "1") << h.seen();
    EXPECT_NE(h.seen().find("fdstore-refused name=counter fds=1 reason=FileDescriptorStoreMax=0"),
              std::string::npos)
        << h.seen();
    h.send("restart");
    EXPECT_NE(h.waitFor("started ").find("fds=0"), std::string::npos) << h.seen();
    EXPECT_EQ(nextCount(h), "1") << h.seen();
}

TEST(FdstoreHarness, ListenSocketComesFirstAndAcceptsConnections) {
    char tmpl[] = "/tmp/ibvx-fdh-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    std::string path = std::string(tmpl) + "/s";
    {
        Harness h({"--fdstore-max", "4", "--listen", path, "--listen-name", "ibvx.listen"});
        EXPECT_NE(h.waitFor("started ").find("fds=1"), std::string::npos) << h.seen();
        EXPECT_NE(h.waitFor("status-text ").find("count=1 names=ibvx.listen"), std::string::npos) << h.seen();
        h.send("restart");
        EXPECT_NE(h.waitFor("started ").find("fds=2"), std::string::npos) << h.seen();
        EXPECT_NE(h.waitFor("status-text ").find("count=2 names=ibvx.listen,counter"), std::string::npos)
            << h.seen();
        // The harness holds the socket like a .socket unit: a client connects (into the backlog).
        int c = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
        EXPECT_EQ(::connect(c, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0) << std::strerror(errno);
        ::close(c);
    }
    ::unlink(path.c_str());
    ::rmdir(tmpl);
}

TEST(FdstoreHarness, UnknownCommandIsReported) {
    Harness h({});
    h.send("reboot");
    EXPECT_NE(h.waitFor("error ").find("unknown command 'reboot'"), std::string::npos) << h.seen();
}

}  // namespace
