#include <absl/synchronization/mutex.h>

#include "daemon/app/run.h"

int main(int argc, char **argv) {
    // Debian builds Abseil without NDEBUG, so absl::Mutex, which every gRPC lock is, keeps a
    // global lock-order graph (and a stack trace per new edge) for deadlock detection on every
    // acquisition: a debugging aid that cost a null call's p50 ~15 us of ~90 and the broker ~4 us
    // of CPU a call (docs/BENCHMARKS.md, "Abseil's deadlock detector"). The broker's own locks
    // are std::mutex.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    return ibvx::daemon::runDaemon(argc, argv);
}
