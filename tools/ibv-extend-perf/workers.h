// Tenant processes of the brokered scenarios: this executable re-executed with --worker, one
// broker session each (libibv_extend.so in broker mode). The parent drives them with single
// bytes on a pipe (their stdin) and they answer with single bytes (their stdout):
//   churn <ms> <file>: context, PD, CQ; 'R'; waits 'G'; creates and destroys QPs for <ms>,
//                      writing every call's latency (uint64 ns) to <file>, then the process's
//                      CPU time over the loop (uint64 ns); 'D'.
//   churn <ms> <file> null: the same with grpc.health.v1.Health/Check calls (the null RPC),
//                      without a broker session.
//   churn <ms> <file> held <n>: the same creates and destroys while the session holds <n>
//                      other QPs, made before 'R' (what a call costs in a session of that size).
//   hold <n>:          context, PD, CQ; 'S'; waits 'C'; creates <n> QPs; 'R'; exits on 'Q' or EOF.
//   bringup:           context, PD, CQ, QP in RTS, registered buffer; 'R'; exits on 'Q' or EOF
//                      (the reclaim scenario SIGKILLs it instead).
// A worker that fails writes 'F' and exits 1.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ibvx::perf {

struct Worker {
    pid_t pid = -1;
    int to = -1;    // the worker's stdin
    int from = -1;  // the worker's stdout
};

// The argv that starts one of our programs (the broker, a worker): argv itself, or, when
// IBV_EXTEND_PERF_EMULATOR names an emulator, that emulator followed by argv. A cross-built tool
// runs under qemu-user, and without a binfmt_misc handler the kernel cannot start another
// aarch64 program by itself (docs/arm64.md).
std::vector<std::string> emulatedArgv(std::vector<std::string> argv);

// Starts this executable as a worker, SCHED_OTHER whatever the tool runs at.
Worker spawnWorker(const std::vector<std::string> &args);
bool sendByte(const Worker &w, char c);
// The next byte from the worker, or 0 on EOF/timeout.
char readByte(const Worker &w, int timeout_ms);
// Closes the pipes and reaps the process (SIGKILL after timeout_ms).
void reapWorker(Worker &w, int timeout_ms = 10000);

// main() of a worker; args are what follows --worker.
int workerMain(const std::vector<std::string> &args);

}  // namespace ibvx::perf
