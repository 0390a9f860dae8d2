// The fd store's messages as a service manager receives them (a real AF_UNIX datagram socket as
// NOTIFY_SOCKET, fds by SCM_RIGHTS), and prepareExecFds across a real fork + exec of
// fd_store_exec_probe, which reads the fds back with listenFdsWithNames.
#include "common/fd_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace ibvx {
namespace {

struct Notify {
    std::string payload;
    std::vector<UniqueFd> fds;
};

// A datagram socket standing in for the service manager's, under a short temp dir.
class NotifySocketTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx-fds-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        path_ = dir_ + "/notify";
        sock_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        ASSERT_GE(sock_.get(), 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
        ASSERT_EQ(::bind(sock_.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0)
            << std::strerror(errno);
        ASSERT_EQ(::setenv("NOTIFY_SOCKET", path_.c_str(), 1), 0);
    }
    void TearDown() override {
        ::unsetenv("NOTIFY_SOCKET");
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
    }

    // The next message, or an empty payload when none is queued (every send is synchronous).
    Notify receive() {
        Notify n;
        char buf[4096];
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFdsPerNotify)];
        iovec iov{buf, sizeof(buf)};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        ssize_t len = ::recvmsg(sock_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (len < 0) {
            EXPECT_EQ(errno, EAGAIN) << std::strerror(errno);
            return n;
        }
        EXPECT_EQ(msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC), 0);
        n.payload.assign(buf, static_cast<size_t>(len));
        for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                const auto *fds = reinterpret_cast<const int *>(CMSG_DATA(c));
                for (size_t i = 0; i < count; ++i) {
                    n.fds.emplace_back(fds[i]);
                }
            }
        }
        return n;
    }

    std::string dir_, path_;
    UniqueFd sock_;
};

UniqueFd memfdWith(const std::string &content, unsigned flags = MFD_CLOEXEC) {
    UniqueFd fd(::memfd_create("fd-store-test", flags));
    EXPECT_GE(fd.get(), 0);
    EXPECT_EQ(::pwrite(fd.get(), content.data(), content.size(), 0), static_cast<ssize_t>(content.size()));
    return fd;
}

bool sameFile(int a, int b) {
    struct stat sa {
    }, sb{};
    return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

TEST_F(NotifySocketTest, AddSendsTheNameAndTheFdItself) {
    UniqueFd state = memfdWith("counter=1");
    FdStore store(true);
    ASSERT_TRUE(store.enabled());
    ASSERT_TRUE(store.add("ibvx.global", state.get()).isOk());
    Notify n = receive();
    EXPECT_EQ(n.payload, "FDSTORE=1\nFDNAME=ibvx.global");
    ASSERT_EQ(n.fds.size(), 1u);
    EXPECT_TRUE(sameFile(n.fds[0].get(), state.get()));
    EXPECT_EQ(receive().payload, "");
}

TEST_F(NotifySocketTest, BatchSharesAMessagePerNameAndAtMost253Fds) {
    UniqueFd chunk = memfdWith("chunk");
    UniqueFd other = memfdWith("other");
    std::vector<UniqueFd> copies;
    std::vector<std::pair<std::string, int>> batch;
    for (int i = 0; i < 300; ++i) {
        copies.emplace_back(::fcntl(chunk.get(), F_DUPFD_CLOEXEC, 0));
        batch.emplace_back("ibvx.s1.c", copies.back().get());
    }
    batch.emplace_back("ibvx.s1.state", other.get());
    batch.emplace_back("ibvx.s1.ch", other.get());
    ASSERT_TRUE(FdStore(true).addBatch(batch).isOk());

    Notify first = receive();
    EXPECT_EQ(first.payload, "FDSTORE=1\nFDNAME=ibvx.s1.c");
    EXPECT_EQ(first.fds.size(), kFdsPerNotify);
    Notify second = receive();
    EXPECT_EQ(second.payload, "FDSTORE=1\nFDNAME=ibvx.s1.c");
    EXPECT_EQ(second.fds.size(), 300u - kFdsPerNotify);
    for (const Notify *n : {&first, &second}) {
        for (const UniqueFd &fd : n->fds) {
            EXPECT_TRUE(sameFile(fd.get(), chunk.get()));
        }
    }
    Notify state = receive();
    EXPECT_EQ(state.payload, "FDSTORE=1\nFDNAME=ibvx.s1.state");
    ASSERT_EQ(state.fds.size(), 1u);
    EXPECT_TRUE(sameFile(state.fds[0].get(), other.get()));
    Notify ch = receive();
    EXPECT_EQ(ch.payload, "FDSTORE=1\nFDNAME=ibvx.s1.ch");
    EXPECT_EQ(ch.fds.size(), 1u);
    EXPECT_EQ(receive().payload, "");
}

TEST_F(NotifySocketTest, RemoveSendsFdstoreRemoveWithoutFds) {
    ASSERT_TRUE(FdStore(true).remove("ibvx.s7.m12").isOk());
    Notify n = receive();
    EXPECT_EQ(n.payload, "FDSTOREREMOVE=1\nFDNAME=ibvx.s7.m12");
    EXPECT_TRUE(n.fds.empty());
}

TEST_F(NotifySocketTest, BadNamesAndFdsAreRefusedAndNothingIsSent) {
    UniqueFd fd = memfdWith("x");
    FdStore store(true);
    for (const std::string &bad : {std::string(), std::string("a:b"), std::string(256, 'n'),
                                   std::string("tab\there"), std::string("caf\xc3\xa9")}) {
        Status st = store.add(bad, fd.get());
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
        EXPECT_FALSE(st.message().empty());
        EXPECT_EQ(store.remove(bad).code(), Code::kInvalidArgument) << bad;
    }
    EXPECT_TRUE(checkFdName(std::string(255, 'n')).isOk());
    // One bad entry anywhere in a batch: none of it goes out.
    EXPECT_EQ(store.addBatch({{"ok.1", fd.get()}, {"bad:2", fd.get()}}).code(), Code::kInvalidArgument);
    EXPECT_EQ(store.add("closed", 1000).code(), Code::kInvalidArgument);
    EXPECT_EQ(store.add("negative", -1).code(), Code::kInvalidArgument);
    EXPECT_EQ(receive().payload, "");
}

TEST_F(NotifySocketTest, DisabledStoreSendsNothing) {
    UniqueFd fd = memfdWith("x");
    FdStore store(false);
    EXPECT_FALSE(store.enabled());
    EXPECT_TRUE(store.add("ibvx.global", fd.get()).isOk());
    EXPECT_TRUE(store.remove("ibvx.global").isOk());
    EXPECT_EQ(store.add("bad:name", fd.get()).code(), Code::kInvalidArgument);
    EXPECT_EQ(receive().payload, "");
}

TEST(FdStore, WithoutNotifySocketAddIsAFailedPrecondition) {
    ::unsetenv("NOTIFY_SOCKET");
    UniqueFd fd = memfdWith("x");
    Status st = FdStore(true).add("ibvx.global", fd.get());
    EXPECT_EQ(st.code(), Code::kFailedPrecondition);
    EXPECT_NE(st.message().find("NOTIFY_SOCKET"), std::string::npos) << st.message();
}

// Runs fd_store_exec_probe in a child that first arranges its fds with `arrange` (which returns
// the list for prepareExecFds) and returns what the probe printed, or the child's failure.
template <typename Arrange>
std::string execProbe(Arrange arrange) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) < 0) {
        return "pipe failed";
    }
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(out[1], 1);  // dup2: fd 1 without FD_CLOEXEC
        // Nothing of the test process's may reach the probe: it lists every open fd.
        ::close_range(3, ~0U, 0);
        std::vector<std::pair<std::string, int>> fds = arrange();
        Status st = prepareExecFds(fds);
        if (!st.isOk()) {
            std::printf("prepare failed: %s\n", st.toString().c_str());
            std::fflush(stdout);
            ::_exit(1);
        }
        ::execl(FD_STORE_EXEC_PROBE, FD_STORE_EXEC_PROBE, static_cast<char *>(nullptr));
        ::_exit(127);
    }
    ::close(out[1]);
    std::string text;
    char buf[512];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) {
        text.append(buf, static_cast<size_t>(n));
    }
    ::close(out[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        text += "[child status " + std::to_string(status) + "]";
    }
    return text;
}

// Places a new memfd holding `content` at exactly `fd`, without FD_CLOEXEC.
int memfdAt(const std::string &content, int fd) {
    UniqueFd m = memfdWith(content, 0);
    if (m.get() != fd) {
        ::dup2(m.get(), fd);
    } else {
        return m.release();
    }
    return fd;
}

TEST(PrepareExecFds, FdsArriveFrom3InOrderWithNamesAndNothingElseCrosses) {
    std::string out = execProbe([] {
        // Sources inside the target range, swapped, and one far above: a naive move would
        // overwrite "beta" with "alpha" before moving it.
        int a = memfdAt("alpha", 4);
        int b = memfdAt("beta", 3);
        int g = memfdAt("gamma", 20);
        return std::vector<std::pair<std::string, int>>{{"ibvx.a", a}, {"ibvx.b", b}, {"ibvx.g", g}};
    });
    EXPECT_EQ(out,
              "fd 3 ibvx.a cloexec=0 content=alpha\n"
              "fd 4 ibvx.b cloexec=0 content=beta\n"
              "fd 5 ibvx.g cloexec=0 content=gamma\n"
              "env LISTEN_FDS=- LISTEN_FDNAMES=- LISTEN_PID=-\n"
              "open 0 1 2 3 4 5\n");
}

TEST(PrepareExecFds, NoFdsClearsTheVariables) {
    std::string out = execProbe([] {
        ::setenv("LISTEN_FDS", "2", 1);
        ::setenv("LISTEN_FDNAMES", "stale:stale", 1);
        ::setenv("LISTEN_PID", "1", 1);
        return std::vector<std::pair<std::string, int>>{};
    });
    EXPECT_EQ(out, "env LISTEN_FDS=- LISTEN_FDNAMES=- LISTEN_PID=-\nopen 0 1 2\n");
}

TEST(PrepareExecFds, BadNameOrFdChangesNothing) {
    ::unsetenv("LISTEN_FDS");
    UniqueFd fd = memfdWith("x");
    EXPECT_EQ(prepareExecFds({{"ok", fd.get()}, {"no:colon", fd.get()}}).code(), Code::kInvalidArgument);
    EXPECT_EQ(prepareExecFds({{"ok", -1}}).code(), Code::kInvalidArgument);
    EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);
    EXPECT_NE(::fcntl(fd.get(), F_GETFD), -1);
}

TEST(ListenFds, OtherProcessesFdsAreNotTaken) {
    ::setenv("LISTEN_PID", std::to_string(::getpid() + 1).c_str(), 1);
    ::setenv("LISTEN_FDS", "1", 1);
    ::setenv("LISTEN_FDNAMES", "x", 1);
    auto fds = listenFdsWithNames();
    ASSERT_TRUE(fds.isOk()) << fds.status().toString();
    EXPECT_TRUE(fds->empty());
    EXPECT_EQ(std::getenv("LISTEN_FDS"), nullptr);  // consumed either way
}

}  // namespace
}  // namespace ibvx
