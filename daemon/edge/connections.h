// Kernel credentials of every connection handed to gRPC, by fd number. gRPC names a connection
// injected with AddInsecureChannelFromFd "fd:N" in ServerContext::peer(); fd numbers are reused
// after a close, so the entry is overwritten by the next connection handed over with that
// number, and a call is bound to its session by token *and* these credentials.
// Threading: one mutex guards the map.
#pragma once

#include <sys/socket.h>
#include <sys/stat.h>

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "daemon/core/identity.h"

namespace ibvx::daemon {

class ConnectionRegistry {
  public:
    void set(int fd, PeerIdentity identity) {
        Entry e{std::move(identity), socketInode(fd)};
        std::lock_guard lock(mu_);
        by_fd_[fd] = std::move(e);
    }
    // The identity of the connection gRPC calls `peer` ("fd:N"); nullopt when unknown.
    std::optional<PeerIdentity> lookup(const std::string &peer) {
        if (peer.rfind("fd:", 0) != 0) {
            return std::nullopt;
        }
        int fd = 0;
        for (size_t i = 3; i < peer.size(); ++i) {
            if (peer[i] < '0' || peer[i] > '9' || fd > 1 << 24) {
                return std::nullopt;
            }
            fd = fd * 10 + (peer[i] - '0');
        }
        if (peer.size() == 3) {
            return std::nullopt;
        }
        std::lock_guard lock(mu_);
        auto it = by_fd_.find(fd);
        if (it == by_fd_.end()) {
            return std::nullopt;
        }
        return it->second.identity;
    }

    // At shutdown, once no call is in flight: EOF on every connection handed to gRPC, so the
    // server does not wait out its deadline for idle clients to hang up. An entry may name an fd
    // gRPC already closed and the number reused, by a session's fd channel say: shutdown() acts
    // on the socket, not the fd, so it would end that channel for the tenant and for every copy
    // (systemd's fd store, the next process). Only the socket the entry was made for is shut.
    void shutdownAll() {
        std::lock_guard lock(mu_);
        for (auto &[fd, e] : by_fd_) {
            if (e.inode != 0 && socketInode(fd) == e.inode) {
                (void)::shutdown(fd, SHUT_RDWR);
            }
        }
    }

  private:
    struct Entry {
        PeerIdentity identity;
        ino_t inode = 0;  // of the socket handed to gRPC (sockfs numbers inodes from a counter)
    };
    static ino_t socketInode(int fd) {
        struct stat st {};
        return ::fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) ? st.st_ino : 0;
    }

    std::mutex mu_;
    std::unordered_map<int, Entry> by_fd_;
};

}  // namespace ibvx::daemon
