#include "tests/integration/client/stand_in_broker.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include <grpcpp/server_posix.h>

#include "common/unix_socket.h"

namespace ibvx::test {
namespace {

// The whole attach request, which may come in pieces; false if the client closed or went silent.
bool readAttachRequest(int fd, AttachRequest *req) {
    size_t got = 0;
    while (got < sizeof(*req)) {
        pollfd pfd{fd, POLLIN, 0};
        if (poll(&pfd, 1, 5000) <= 0) {
            return false;
        }
        ssize_t n = recv(fd, reinterpret_cast<char *>(req) + got, sizeof(*req) - got, 0);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN) {
                continue;
            }
            return false;
        }
        got += static_cast<size_t>(n);
    }
    return true;
}

// The attach handshake, then the client's frames until EOF; a kFdTransfer's fd is kept for the
// session's calls to take.
void serveFdChannel(StandInHooks &hooks, UniqueFd sock) {
    const int fd = sock.get();
    AttachRequest req{};
    if (!readAttachRequest(fd, &req)) {
        return;
    }
    SessionToken token;
    std::memcpy(token.data(), req.token, token.size());
    if (hooks.dropAttach(token)) {
        return;
    }
    std::shared_ptr<StandInSession> s = hooks.sessionByToken(token);
    AttachReply rep{{'I', 'B', 'V', 'X'}, s != nullptr ? 0 : ENOENT};
    if (s == nullptr) {
        (void)send(fd, &rep, sizeof(rep), MSG_NOSIGNAL);
        return;
    }
    UniqueFd reader(fcntl(fd, F_DUPFD_CLOEXEC, 0));
    // The channel belongs to the session before the client hears it is attached, as in the real
    // broker: its next call may need a region sent on it at once.
    {
        std::lock_guard lock(s->mu);
        s->fd_channel = std::move(sock);
    }
    if (!reader || send(fd, &rep, sizeof(rep), MSG_NOSIGNAL) != sizeof(rep)) {
        return;
    }
    for (;;) {
        Frame f;
        if (recvFrame(reader.get(), &f, -1) <= 0) {
            return;
        }
        if (f.type == FrameType::kFdTransfer && f.fd.valid()) {
            std::lock_guard lock(s->mu);
            s->xfers[f.id] = std::move(f.fd);
            s->xfer_arrived.notify_all();
        }
    }
}

// A new connection, by its first four bytes (peeked, on its own thread: a slow client must not
// hold the accept loop).
void serveConnection(grpc::Server &server, StandInHooks &hooks, UniqueFd fd) {
    char magic[4];
    for (int tries = 0; tries < 500; ++tries) {
        ssize_t n = recv(fd.get(), magic, sizeof(magic), MSG_PEEK);
        if (n == sizeof(magic)) {
            if (std::memcmp(magic, kPrefaceMagic, sizeof(magic)) == 0) {
                serveFdChannel(hooks, std::move(fd));
            } else {
                hooks.grpcConnectionOpened(fd.get());
                grpc::AddInsecureChannelFromFd(&server, fd.release());
            }
            return;
        }
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            return;
        }
        usleep(2000);
    }
}

UniqueFd listenOn(const char *path) {
    auto addr = unixAddress(path);
    if (!addr.isOk()) {
        fprintf(stderr, "%s\n", addr.status().toString().c_str());
        return UniqueFd();
    }
    UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    unlink(path);
    if (!sock || bind(sock.get(), addr->get(), addr->len) < 0 || listen(sock.get(), 64) < 0) {
        perror("bind/listen");
        return UniqueFd();
    }
    return sock;
}

}  // namespace

grpc::Status wireError(grpc::StatusCode code, int err, const std::string &message) {
    pb::ErrorDetail d;
    d.set_errno_value(err);
    return grpc::Status(code, message, d.SerializeAsString());
}

uint64_t randomHandle() {
    static std::mt19937_64 rng{std::random_device{}()};
    static std::mutex mu;
    std::lock_guard lock(mu);
    uint64_t h = 0;
    while (h == 0) {
        h = rng();
    }
    return h;
}

void describeFakeDevice(pb::DeviceInfo *d) {
    d->set_name(kFakeDevice);
    d->set_provider("fake");
    d->set_ext_cap(3);
    d->set_driver_version(3);
    d->set_phys_port_cnt(1);
    d->set_max_qp(64);
    d->set_max_cq(64);
    d->set_max_qp_wr(1024);
    d->set_max_mr_size(1 << 20);
    d->set_virtual_device(true);
}

UniqueFd StandInSession::takeXfer(std::unique_lock<std::mutex> &lock, uint64_t id,
                                  std::chrono::milliseconds wait) {
    if (!xfer_arrived.wait_for(lock, wait, [&] { return xfers.count(id) != 0; })) {
        return UniqueFd();
    }
    UniqueFd fd = std::move(xfers[id]);
    xfers.erase(id);
    return fd;
}

SessionToken newSessionToken() {
    SessionToken token;
    for (auto &b : token) {
        b = static_cast<uint8_t>(randomHandle());
    }
    return token;
}

void answerHello(const SessionToken &token, pb::HelloResponse *resp) {
    resp->mutable_broker_version()->set_major(4);
    resp->mutable_broker_version()->set_minor(2);
    resp->set_session_token(std::string(reinterpret_cast<const char *>(token.data()), token.size()));
    resp->set_attach_timeout_ms(5000);
    resp->mutable_identity()->set_pid(0);
}

std::string sessionMetadata(const grpc::ServerContext &ctx) {
    auto it = ctx.client_metadata().find("ibvx-session");
    return it == ctx.client_metadata().end() ? std::string()
                                             : std::string(it->second.data(), it->second.size());
}

int serveStandIn(const char *socket_path, grpc::Service &service, StandInHooks &hooks) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service);
    builder.SetMaxReceiveMessageSize(64 * 1024);  // the real broker's limit
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    UniqueFd listening = listenOn(socket_path);
    if (server == nullptr || !listening) {
        return 1;
    }
    for (;;) {
        // Never blocked in accept(), and asked once a connection is there: a pause must hold
        // back the reconnect that follows it (the pause starts before the connections close).
        pollfd pfd{listening.get(), POLLIN, 0};
        if (poll(&pfd, 1, 10) <= 0) {
            continue;
        }
        if (!hooks.accepting()) {
            usleep(10000);
            continue;
        }
        UniqueFd fd(accept4(listening.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (fd) {
            std::thread(serveConnection, std::ref(*server), std::ref(hooks), std::move(fd)).detach();
        }
    }
}

}  // namespace ibvx::test
