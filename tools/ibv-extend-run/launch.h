// Running the program in the sandbox (sandbox.h) with this process as its parent, so that a
// sandbox bwrap could not make is tried again and the program's end is this process's.
//
// bwrap copies every mount of the host into the sandbox and then remounts each one (nosuid); a
// mount removed in between (another container's network namespace, a pod's volume: a busy host
// adds and removes them all the time) fails that remount, and bwrap exits before the program ran.
// So bwrap runs the program behind bash, which first says "running" on a pipe: before that
// word, a failure is bwrap's and nothing ran (a transient one is tried again); after it, the
// status is the program's. bwrap's own complaints go to a pipe of this process until then, so a
// failure that is retried does not reach the program's stderr.
#pragma once

#include <string>
#include <vector>

namespace ibvx::run {

// Whether bwrap's complaint (its stderr) names a failure a second try may not meet: a mount that
// changed while bwrap copied the host's.
bool transientSandboxFailure(const std::string &said);

// Runs command (argv, null-terminated) under bwrap with args (sandboxArgs()), as a child, and
// returns what this process should exit with: the program's status as bwrap gives it (128 + the
// signal when one ended it). Signals sent to this process (kill(2), not a terminal's) go to the
// program. When bwrap cannot make the sandbox, after up to `attempts` tries of a transient
// failure, returns -1 with *why set to bwrap's complaint.
int runSandboxed(const std::vector<std::string> &args, char *const *command, int attempts, std::string *why);

}  // namespace ibvx::run
