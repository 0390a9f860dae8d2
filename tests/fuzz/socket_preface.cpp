// Fuzz target: the broker socket's preface demux and the fd-channel attach handshake
// (daemon/edge/server.cpp BrokerServer::handshake, then the session's channel reader): the first
// bytes any local process can send the privileged broker.
//
// The real BrokerServer serves a Unix socket in a private temporary directory. Each input is
// one connection: byte 0 holds flags, the rest is written as the connection's bytes.
//   flags & 1  when the bytes are at least an AttachRequest long, bytes 8..23 are replaced by the
//              token of a live session of this process, so inputs reach a successful attach
//              and the fd-channel frames behind it;
//   flags & 2  close right after writing instead of shutting down the write side and reading
//              the answer to the end;
//   flags & 4  (without 2) keep the write side open and wait: the server must give up on a
//              client that stops talking (the handshake timeout, 50 ms here).
//
// Invariants: the server never crashes; it always finishes with the connection (EOF within a
// few seconds, i.e. the handshake timeout works); whatever it answers to a connection that
// does not start like HTTP/2 is nothing or exactly one AttachReply ("IBVX", status >= 0), with
// status 0 only for the live token; afterwards it still attaches a fresh session, and its
// sessions and open fds are back where they were.

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fd_channel.h"
#include "daemon/core/broker.h"
#include "daemon/core/device.h"
#include "daemon/edge/server.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using namespace ibvx::daemon;  // NOLINT: the harness touches most of the daemon's names
using ibvx::UniqueFd;

constexpr char kHttp2Start[] = "PRI ";
constexpr auto kAnswerWithin = std::chrono::seconds(5);

class Harness {
  public:
    Harness() {
        spdlog::set_level(spdlog::level::off);
        char tmpl[] = "/tmp/ibvx.XXXXXX";
        FUZZ_CHECK(::mkdtemp(tmpl) != nullptr, "mkdtemp: %s", std::strerror(errno));
        dir_ = tmpl;
        path_ = dir_ + "/s";
        UniqueFd listen_fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        FUZZ_CHECK(listen_fd.valid(), "socket: %s", std::strerror(errno));
        sockaddr_un addr = address();
        FUZZ_CHECK(::bind(listen_fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0,
                   "bind: %s", std::strerror(errno));
        FUZZ_CHECK(::listen(listen_fd.get(), 64) == 0, "listen: %s", std::strerror(errno));

        broker_ = std::make_unique<Broker>(Broker::Options{}, &devices_);
        ServerOptions opt;
        opt.handshake_timeout = std::chrono::milliseconds(50);  // silent clients end fast
        auto server = BrokerServer::create(*broker_, opt);
        FUZZ_CHECK(server.isOk(), "BrokerServer::create: %s", server.status().toString().c_str());
        server_ = std::move(server).value();
        auto st = server_->start(std::move(listen_fd));
        FUZZ_CHECK(st.isOk(), "BrokerServer::start: %s", st.toString().c_str());
        // Under qemu-user the server's threads were still opening and closing descriptors when
        // the first input took its baseline (12 before, 11 after, on CI's arm64 run).
        (void)ibvx::fuzz::settledFdCount();
    }

    ~Harness() {
        server_->shutdown(std::chrono::milliseconds(0));
        server_.reset();
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
    }

    Broker &broker() { return *broker_; }

    sockaddr_un address() const {
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path_.c_str());
        return addr;
    }

    UniqueFd connect() const {
        UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
        FUZZ_CHECK(fd.valid(), "socket: %s", std::strerror(errno));
        sockaddr_un addr = address();
        FUZZ_CHECK(::connect(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0, "connect: %s",
                   std::strerror(errno));
        return fd;
    }

    std::shared_ptr<Session> newSession() {
        PeerIdentity peer;
        peer.creds = {::getpid(), ::getuid(), ::getgid()};
        auto s = broker_->hello(peer, {4, 2, 0}, "fuzz");
        FUZZ_CHECK(s.isOk(), "hello: %s", s.status().toString().c_str());
        return *s;
    }

  private:
    std::string dir_, path_;
    DeviceRegistry devices_;
    std::unique_ptr<Broker> broker_;
    std::unique_ptr<BrokerServer> server_;
};

void writeAll(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0) {
            return;  // the server may close first (a refused preface): that is its right
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

bool attachAccepted(const std::vector<uint8_t> &answer) {
    ibvx::AttachReply rep;
    if (answer.size() < sizeof(rep)) {
        return false;
    }
    std::memcpy(&rep, answer.data(), sizeof(rep));
    return std::memcmp(rep.magic, ibvx::kPrefaceMagic, 4) == 0 && rep.status == 0;
}

// Reads until EOF; fails the input when the server keeps the connection past the deadline. An
// accepted attach is the one case where an open connection is right (it is the session's fd
// channel now): with until_attached, reading stops there.
std::vector<uint8_t> readAnswer(int fd, bool until_attached) {
    std::vector<uint8_t> got;
    const auto deadline = std::chrono::steady_clock::now() + kAnswerWithin;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        FUZZ_CHECK(left.count() > 0, "the server kept the connection open for %lld s",
                   static_cast<long long>(kAnswerWithin.count()));
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
            continue;
        }
        uint8_t buf[4096];
        ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return got;  // EOF or reset: the server is done with us
        }
        got.insert(got.end(), buf, buf + n);
        if (until_attached && attachAccepted(got)) {
            return got;
        }
    }
}

// A new session attaches its fd channel and gets status 0: the server still works. A loaded
// machine may stall this client past the 50 ms handshake timeout, so a few tries are allowed.
void checkStillServes(Harness &h) {
    int r = 0;
    for (int attempt = 0; attempt < 5; ++attempt) {
        auto s = h.newSession();
        UniqueFd fd = h.connect();
        r = ibvx::attachClient(fd.get(), s->token(), 5000);
        fd.reset();  // EOF on the channel ends the session in the server's loop
        if (r == 0) {
            return;
        }
        h.broker().endSession(s);  // never attached: nobody else will end it before the timeout
    }
    FUZZ_CHECK(r == 0, "a fresh session cannot attach after this input: %d (%s)", r, std::strerror(-r));
}

// The server closes connections in its own thread: give it a moment to catch up.
template <typename Fn>
bool eventually(Fn &&done) {
    for (int i = 0; i < 200; ++i) {
        if (done()) {
            return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return done();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) {
        return 0;
    }
    Harness &h = ibvx::fuzz::processFixture<Harness>();
    const size_t sessions_before = h.broker().sessionCount();
    const int fds_before = ibvx::fuzz::countOpenFds();
    const uint8_t flags = data[0];
    std::vector<uint8_t> bytes(data + 1, data + size);
    {
        std::shared_ptr<Session> live = h.newSession();
        bool live_token = false;
        if ((flags & 1) != 0 && bytes.size() >= sizeof(ibvx::AttachRequest)) {
            std::memcpy(bytes.data() + offsetof(ibvx::AttachRequest, token), live->token().data(),
                        ibvx::kSessionTokenSize);
            live_token = true;
        }
        UniqueFd fd = h.connect();
        writeAll(fd.get(), bytes.data(), bytes.size());
        if ((flags & 2) == 0) {
            if ((flags & 4) == 0) {
                ::shutdown(fd.get(), SHUT_WR);
            }
            std::vector<uint8_t> answer = readAnswer(fd.get(), (flags & 4) != 0);
            const bool http2 = bytes.size() >= 1 &&
                               std::memcmp(bytes.data(), kHttp2Start, std::min<size_t>(bytes.size(), 4)) == 0;
            if (!http2) {
                FUZZ_CHECK(answer.empty() || answer.size() == sizeof(ibvx::AttachReply),
                           "answered %zu bytes to a non-HTTP/2 preface", answer.size());
                if (!answer.empty()) {
                    ibvx::AttachReply rep;
                    std::memcpy(&rep, answer.data(), sizeof(rep));
                    FUZZ_CHECK(std::memcmp(rep.magic, ibvx::kPrefaceMagic, 4) == 0,
                               "reply without IBVX magic");
                    FUZZ_CHECK(rep.status >= 0, "negative status %d in an AttachReply", rep.status);
                    FUZZ_CHECK(rep.status != 0 || live_token, "attach succeeded without a live token");
                }
            }
        }
        fd.reset();
        // The server's loop ends the sessions it attached (it sees our EOF) and must be the one
        // to: it still polls their channel. A fresh attach going through is also a barrier:
        // the loop has handled our connection's bytes by then, so a session it did not attach
        // never will be, and ending it here is what the attach timeout would do later.
        checkStillServes(h);
        if (!live->attached()) {
            h.broker().endSession(live);
        }
    }
    FUZZ_CHECK(eventually([&] { return h.broker().sessionCount() == sessions_before; }),
               "%zu sessions before, %zu after", sessions_before, h.broker().sessionCount());
    FUZZ_CHECK(eventually([&] { return ibvx::fuzz::countOpenFds() == fds_before; }),
               "fd leak: %d open before, %d after", fds_before, ibvx::fuzz::countOpenFds());
    return 0;
}
