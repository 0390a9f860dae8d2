// The broker the brokered scenarios talk to: an ibv-extendd the tool starts on a temp socket
// (with a softnda configuration matching the direct scenarios), or one already running
// (--socket). Also the broker-side counters the figures need: Admin/GetStats (RPC counter,
// sessions, objects) and the daemon's memory from /proc.
//
// Threading: one thread uses a BrokerHarness at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace grpc {
class Channel;
}

namespace ibvx::perf {

struct BrokerStats {
    uint64_t total_calls = 0;  // Broker-service calls since start (Admin calls not counted)
    uint32_t sessions = 0;
    uint64_t objects = 0;
    uint64_t arena_bytes = 0;
    // softnda engines' wakeups_by_hint, summed over devices: each one is a tenant's futex().
    uint64_t engine_wakeups = 0;
    uint64_t stored_reply_bytes = 0;  // heap bytes of every session's stored replies
};

class BrokerHarness {
  public:
    // daemon: path of ibv-extendd ("" = next to this executable, then <build>/daemon/).
    // socket: use a running broker instead ("" = start one). engine_threads/spin_us go to
    // the started broker's [softnda] table, and softnda_extra (TOML lines) after them.
    // netns: a network namespace fd the started broker runs in (-1 = this process's).
    BrokerHarness(const std::string &daemon, const std::string &socket, uint32_t engine_threads,
                  uint32_t spin_us, int netns = -1, const std::string &softnda_extra = {});
    ~BrokerHarness();
    BrokerHarness(const BrokerHarness &) = delete;
    BrokerHarness &operator=(const BrokerHarness &) = delete;

    const std::string &socket() const { return socket_; }
    // The broker's pid (ours, or from the socket's peer credentials for --socket).
    pid_t pid() const { return pid_; }
    // Throws when the Admin call fails.
    BrokerStats stats();
    // A field of /proc/<broker>/status in KiB ("RssAnon", "VmRSS", ...); -1 when unreadable.
    long statusKiB(const char *field) const;
    // Memory held by the broker's memfds whose name starts with prefix ("ibvx-state-": the
    // restart state files, which are shmem and not in RssAnon): allocated blocks, in bytes;
    // -1 when /proc/<pid>/fd cannot be read (another user's broker).
    long long memfdBytes(const std::string &prefix) const;
    // When this tool runs SCHED_FIFO: gives the started broker's softnda engine threads the same
    // policy and priority, so the brokered fast path spins under the scheduler the direct one
    // does. Returns how many threads were raised.
    int raiseEngineThreads() const;
    // CPU time the broker has used (user + system, all threads; /proc/<broker>/stat); ns, or -1.
    double cpuNs() const;
    // One grpc.health.v1.Health/Check round trip on a dedicated channel; ns, or throws.
    uint64_t healthCheckNs();
    // The daemon's log (started broker only).
    std::string log() const;
    // Admin.Restart, then waits until the restarted broker serves (GetStatus counts it); returns
    // GetStatus.last_restart_took_ms. Throws on failure. Started broker only.
    uint64_t restart();
    bool owned() const { return own_; }

  private:
    struct Rpc;
    std::string dir_;
    std::string socket_;
    pid_t pid_ = -1;
    bool own_ = false;
    std::unique_ptr<Rpc> rpc_;
};

// A channel of its own to the broker at `socket`, for health checks.
std::shared_ptr<grpc::Channel> healthChannel(const std::string &socket);
// One grpc.health.v1.Health/Check round trip (the null RPC); ns, or throws.
uint64_t healthCheckNs(grpc::Channel *channel);

// Directory holding this executable (for finding ibv-extendd and re-executing workers).
std::string selfExe();

}  // namespace ibvx::perf
