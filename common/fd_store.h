// The broker's side of systemd's file descriptor store (sd_notify(3), sd_listen_fds(3), systemd's
// docs/FILE_DESCRIPTOR_STORE.md) and of the same convention across its own exec (docs/restart.md):
// fds handed to the service manager by name, and fds received at start as LISTEN_FDS /
// LISTEN_FDNAMES. An FdStore holds no mutable state and every message is one datagram, so calls
// from several threads need no lock (the manager applies each message whole).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx {

// What systemd 252 accepts: a name of printable ASCII without ':' (the LISTEN_FDNAMES separator),
// at most 255 characters; a datagram carries at most 253 fds (SCM_MAX_FD - 2).
inline constexpr size_t kFdNameMax = 255;
inline constexpr size_t kFdsPerNotify = 253;

// INVALID_ARGUMENT naming what is wrong with `name`, or OK. An empty name is refused too: an fd
// stored without a name cannot be told apart from others when it comes back.
Status checkFdName(const std::string &name);

class FdStore {
  public:
    // enabled: the daemon runs with --fd-store under systemd (NOTIFY_SOCKET set). When disabled,
    // every call checks its arguments and sends nothing.
    explicit FdStore(bool enabled) : enabled_(enabled) {}
    bool enabled() const { return enabled_; }

    // FDSTORE=1 + FDNAME=name with fd (sd_pid_notify_with_fds). The manager keeps its own copy:
    // the caller still owns fd. FAILED_PRECONDITION when NOTIFY_SOCKET is not set.
    Status add(const std::string &name, int fd);
    // All of them, as few messages as the protocol allows: one FDNAME names every fd of its
    // message, so consecutive entries with the same name share a message (up to 253 fds), and a
    // new name starts a new one. Every name is checked before anything is sent.
    Status addBatch(const std::vector<std::pair<std::string, int>> &fds);
    // FDSTOREREMOVE=1 + FDNAME=name: the manager closes every stored fd of that name.
    Status remove(const std::string &name);

  private:
    bool enabled_;
};

// The fds passed at start (sd_listen_fds_with_names): LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID
// are unset, the fds are marked FD_CLOEXEC and owned by the result, in the order they came. An
// fd without a name in LISTEN_FDNAMES is called "unknown" (libsystemd's rule). Empty when the
// process was started without fds (or LISTEN_PID names another process).
StatusOr<std::vector<std::pair<std::string, UniqueFd>>> listenFdsWithNames();

// Prepares this process to exec with `fds` in the LISTEN_FDS convention: the i-th fd ends up as
// fd 3 + i without FD_CLOEXEC (the given fds may sit anywhere, 3..3+n-1 included, in any order:
// each is first copied above the highest of them and of the target range), every other copy
// made here is closed, the given fds themselves are marked FD_CLOEXEC when they lie outside the
// target range, and LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID=getpid() are set (exec keeps the
// pid). With no fds the three variables are unset. Whatever occupied 3..3+n-1 before is replaced.
// Not async-signal-safe (setenv, allocation): call it in the process that execs itself, or in
// the child of a single-threaded parent. On failure the fd table is partly rearranged: do not
// exec then, report and exit.
Status prepareExecFds(const std::vector<std::pair<std::string, int>> &fds);

}  // namespace ibvx
