// Two "hosts" on this machine: two network namespaces joined by a veth pair, each end with one
// IPv4 address in 10.201.9.0/24 (nothing else is ever addressed), for the roce scenario.
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/unique_fd.h"

namespace ibvx::perf {

class NetnsPair {
  public:
    // nullptr, and *why says what failed, when the namespaces cannot be made here (no root, no
    // `ip`, a kernel or container that refuses namespaces). Names carry this process's pid, so
    // concurrent runs do not collide; nothing is made in this process's own namespace.
    static std::unique_ptr<NetnsPair> make(std::string *why);
    ~NetnsPair();  // deletes both namespaces, and with them the veth pair
    NetnsPair(const NetnsPair &) = delete;
    NetnsPair &operator=(const NetnsPair &) = delete;

    // side 0 ("host a") or 1 ("host b").
    const std::string &name(int side) const { return names_[side]; }
    int fd(int side) const { return fds_[side].get(); }
    static const char *ifname(int side) { return side == 0 ? "ibvxp0" : "ibvxp1"; }
    static const char *address(int side) { return side == 0 ? "10.201.9.1" : "10.201.9.2"; }
    int mtu() const { return 1500; }

  private:
    NetnsPair() = default;
    // Whether the end of `side` is RUNNING (carrier up) within limit.
    bool waitRunning(int side, std::chrono::milliseconds limit) const;
    std::string names_[2];
    UniqueFd fds_[2];
    bool made_[2] = {false, false};
};

// Puts the calling thread in a network namespace until destroyed (sockets made meanwhile stay in
// it for their whole life); throws when setns fails.
class InNetns {
  public:
    explicit InNetns(int ns_fd);
    ~InNetns();
    InNetns(const InNetns &) = delete;
    InNetns &operator=(const InNetns &) = delete;

  private:
    UniqueFd home_;
};

// Where iproute2's `ip` is, or "".
std::string ipProgram();

}  // namespace ibvx::perf
