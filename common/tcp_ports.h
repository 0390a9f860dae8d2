// Loopback TCP ports for a server and a client program run side by side (ucx_perftest's
// out-of-band exchange): one free now, and whether a server listens on it yet.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace ibvx {

// A TCP port nobody listens on now.
inline int freePort() {
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
inline bool listening(int port) {
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

}  // namespace ibvx
