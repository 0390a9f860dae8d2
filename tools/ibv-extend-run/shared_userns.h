// One user namespace per user that all of that user's sandboxes join (bwrap --userns FD).
//
// Why: an unprivileged bwrap makes each sandbox in a user namespace of its own, and the kernel lets
// a process read another's memory with process_vm_readv(2) (UCX's "cma" transport, which Open MPI
// and UCP pick by default between processes of one host) only when both are in the same user
// namespace or the reader holds CAP_SYS_PTRACE over the other's. Two ranks of one job, each in its
// own sandbox, would get EPERM where outside any sandbox they would not. Sandboxes that share one
// namespace keep what the same uid allows outside them, and no more: every one of them is that
// user's own process.
//
// How: a small holder process ("ibvx-userns", a child of the first ibv-extend-run, detached) makes
// the namespace, mapping the user's uid and gid to themselves, and stays while any sandbox it
// served may still start another: each ibv-extend-run holds a shared flock(2) on users.lock, and the
// descriptor passes through bwrap to the program, so the lock lasts as long as the program keeps it.
// The holder takes the lock exclusively once nobody holds it and exits. The registry directory is
// $XDG_RUNTIME_DIR/ibv-extend-run or /tmp/ibv-extend-run-<uid>, mode 0700 and the user's own, or it
// is not used.
//
// Root does not need this (CAP_SYS_PTRACE) and does not use it.
#pragma once

#include <string>

namespace ibvx::run {

// The user namespace to run the sandbox in: an open descriptor (not close-on-exec, for bwrap
// --userns) of the user's shared namespace, made if there is none yet, with users.lock held
// shared on another inherited descriptor. -1 with *why set when it cannot be had; the sandbox then
// makes a namespace of its own as before.
int sharedUserns(std::string *why);

}  // namespace ibvx::run
