// ConnectionRegistry::shutdownAll() at a handover: only the sockets handed to gRPC are shut,
// never what reused one's fd number after gRPC closed it (a session's fd channel, which the next
// broker process and systemd's fd store must find alive).
#include "daemon/edge/connections.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>

namespace ibvx::daemon {
namespace {

struct Pair {
    int fd[2] = {-1, -1};
    Pair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fd), 0); }
    ~Pair() {
        for (int f : fd) {
            if (f >= 0) {
                ::close(f);
            }
        }
    }
    // One byte from fd[0] reaches fd[1]: the socket was not shut down.
    bool open() const {
        char c = 'x';
        return ::send(fd[0], &c, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1 &&
               ::recv(fd[1], &c, 1, MSG_DONTWAIT) == 1;
    }
};

TEST(ConnectionRegistry, ShutdownAllShutsTheConnectionsHandedToGrpc) {
    ConnectionRegistry reg;
    Pair grpc_conn;
    reg.set(grpc_conn.fd[0], PeerIdentity{});
    reg.shutdownAll();
    char c;
    EXPECT_EQ(::recv(grpc_conn.fd[1], &c, 1, MSG_DONTWAIT), 0) << "the client must see EOF";
}

TEST(ConnectionRegistry, ShutdownAllLeavesASocketThatReusedAClosedConnectionsNumber) {
    ConnectionRegistry reg;
    int number = -1;
    {
        Pair grpc_conn;
        number = grpc_conn.fd[0];
        reg.set(number, PeerIdentity{});
    }              // gRPC closed it; the registry still names the number
    Pair channel;  // the next socket gets the number (the lowest free one, or made to)
    if (channel.fd[1] == number) {
        std::swap(channel.fd[0], channel.fd[1]);
    }
    if (channel.fd[0] != number) {
        ASSERT_EQ(::dup3(channel.fd[0], number, O_CLOEXEC), number);
        ::close(channel.fd[0]);
        channel.fd[0] = number;
    }
    reg.shutdownAll();
    EXPECT_TRUE(channel.open()) << "a session's fd channel was shut down through a stale entry";
}

}  // namespace
}  // namespace ibvx::daemon
