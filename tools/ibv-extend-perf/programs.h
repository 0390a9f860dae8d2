// Programs nobody here wrote (ucx_perftest, mpirun, perftest, ibv_rc_pingpong, ip), run as children
// of the tool with their stdout and stderr in one pipe, read when they are finished.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace ibvx::perf {

class Program {
  public:
    // env entries go before this process's environment (getenv() takes the first of a name).
    // netns: an open /run/netns/<name> (or any network namespace fd) the child enters before it
    // execs, so it runs on that namespace's interfaces; -1 = this process's.
    explicit Program(const std::vector<std::string> &argv, const std::vector<std::string> &env = {},
                     int netns = -1);
    ~Program();  // SIGKILLs and reaps a child still running
    Program(const Program &) = delete;
    Program &operator=(const Program &) = delete;

    // Its output once it exited (SIGKILL at the deadline); throws unless it exited 0.
    std::string finish(std::chrono::milliseconds limit);
    // The same, but never throws: *status is waitpid's status (a deadline kill shows as SIGKILL).
    std::string finish(std::chrono::milliseconds limit, int *status);
    // Whether it has not exited yet (it is not reaped: finish() still reads its output).
    bool running() const;
    const std::string &name() const { return name_; }

  private:
    pid_t pid_ = -1;
    UniqueFd out_;
    std::string name_;
};

// The calling thread (and the threads and programs it starts meanwhile) runs SCHED_OTHER while
// this lives, whatever --sched-fifo gave it: the programs of a section that runs tenants spin
// as SCHED_OTHER tenants do, and a SCHED_FIFO thread of the tool would outrank them (and the
// brokers) on the same cores.
class SchedOtherScope {
  public:
    SchedOtherScope();
    ~SchedOtherScope();
    SchedOtherScope(const SchedOtherScope &) = delete;
    SchedOtherScope &operator=(const SchedOtherScope &) = delete;

  private:
    int policy_;
    sched_param param_{};
};

// One of ours installed beside this tool (bin/), else the build tree's (`built`).
std::string ourProgram(const char *name, const char *built);

// argv run as a tenant of the broker at `socket`: ibv-extend-run --socket S --sandbox=on -- argv.
std::vector<std::string> tenant(const std::string &socket, std::vector<std::string> argv);

}  // namespace ibvx::perf
