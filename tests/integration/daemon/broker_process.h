// The real ibv-extendd as a child process on a short temp socket.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ibvx::test {

struct BrokerOptions {
    std::string config;             // TOML text written next to the socket, passed with --config
    std::vector<std::string> env;   // extra "NAME=value" entries for the daemon
    bool clean_env = false;         // start from an empty environment (as `env -i`), then env
    int activated_fd = -1;          // a listening socket handed over as systemd does (fd 3)
    std::string activated_path;     // where activated_fd is bound (what clients connect to)
    int netns_fd = -1;              // a network namespace (an open nsfs file) to run in; -1: ours
    bool dies_with_parent = false;  // PR_SET_PDEATHSIG: SIGKILL when the thread that started it ends
};

class BrokerProcess {
  public:
    // config: TOML text written next to the socket and passed with --config ("" = none).
    explicit BrokerProcess(const std::string &config = "");
    explicit BrokerProcess(const BrokerOptions &options);
    ~BrokerProcess();
    BrokerProcess(const BrokerProcess &) = delete;
    BrokerProcess &operator=(const BrokerProcess &) = delete;

    bool started() const { return started_; }
    pid_t pid() const { return pid_; }
    const std::string &socket() const { return socket_; }
    const std::string &dir() const { return dir_; }
    std::string log() const;

    // SIGTERM, then waits up to timeout_ms. Returns the exit code, 128+signal, or -1 on timeout
    // (the process is then killed).
    int terminate(int timeout_ms = 10000);

    // Open fds and resident set size (KiB) of the broker, from /proc.
    int fdCount() const;
    long rssKiB() const;
    // "fd -> target" for each open fd, for saying which fd a count check found.
    std::vector<std::string> fdTargets() const;

  private:
    void start(const BrokerOptions &options);

    std::string dir_;
    std::string socket_;
    pid_t pid_ = -1;
    bool started_ = false;
    bool reaped_ = false;
};

// A free TCP port on localhost, for tenant pairs that meet over TCP (ibv_rc_pingpong's server and
// client) next to a broker; tests run in parallel, so a fixed port would collide. 18515 (the
// verbs tools' default) when none can be had.
int freeLoopbackPort();

}  // namespace ibvx::test
