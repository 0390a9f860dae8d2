// The log side of the audit trail of object creates and destroys (docs/operations.md, "Reading
// the audit trail"). The trail is complete elsewhere: every event is an Admin Watch event
// (OBJECT_CREATE / OBJECT_DESTROY, `ibv-extendctl watch`) and is counted here (GetStats, the
// Prometheus ibv_extend_audit_* counters). The log gets one "audit:" line per event only within a
// per-session budget, so one tenant's churn cannot set the journal's rate: past the budget its
// events are counted, and the session's next line once the budget refills (or the "session N
// ended" line) says how many were not written. Formatting a line is thus off the reply path of
// all but a session's first few calls each second.
//
// Threading: every method may be called from any thread (a session's calls, its teardown on the
// event loop); mu_ guards the budgets and is held only around the table.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "daemon/core/objects.h"

namespace ibvx::daemon {

class Session;

class AuditLog {
  public:
    // Lines one session may write in a second; beyond it they are counted only.
    static constexpr uint32_t kLinesPerSessionPerSecond = 20;

    enum class Action { kCreate, kDestroy };
    using Clock = std::function<std::chrono::steady_clock::time_point()>;

    // clock: the budget's time (tests); steady_clock by default.
    explicit AuditLog(Clock clock = {}) : clock_(std::move(clock)) {}

    struct Counters {
        uint64_t creates = 0;           // object create events
        uint64_t destroys = 0;          // object destroy events (calls and teardowns)
        uint64_t lines = 0;             // "audit:" lines written
        uint64_t lines_suppressed = 0;  // events over a session's budget, not written as lines
    };

    // Counts the event and writes its line when the session's budget allows.
    void object(const Session &s, Action action, ObjectKind kind, uint64_t handle);
    // The session ended: forgets its budget; returns its events not written as lines since its
    // last line (for the "session ended" line).
    uint64_t sessionEnded(uint64_t session);

    Counters counters() const;

  private:
    struct Budget {
        std::chrono::steady_clock::time_point window{};
        uint32_t used = 0;
        uint64_t suppressed = 0;  // since the session's last line
    };
    // The number of suppressed events to report with a line about to be written, or -1 when the
    // session's budget is spent (the event is then counted as suppressed).
    int64_t admit(uint64_t session);

    Clock clock_;
    mutable std::mutex mu_;
    std::unordered_map<uint64_t, Budget> budgets_;
    std::atomic<uint64_t> creates_{0}, destroys_{0}, lines_{0}, suppressed_{0};
};

}  // namespace ibvx::daemon
