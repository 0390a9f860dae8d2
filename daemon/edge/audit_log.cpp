#include "daemon/edge/audit_log.h"

#include <spdlog/spdlog.h>

#include "daemon/core/session.h"

namespace ibvx::daemon {

int64_t AuditLog::admit(uint64_t session) {
    std::lock_guard lock(mu_);
    Budget &b = budgets_[session];
    auto now = clock_ ? clock_() : std::chrono::steady_clock::now();
    if (now - b.window >= std::chrono::seconds(1)) {
        b.window = now;
        b.used = 0;
    }
    if (b.used >= kLinesPerSessionPerSecond) {
        ++b.suppressed;
        return -1;
    }
    ++b.used;
    uint64_t suppressed = b.suppressed;
    b.suppressed = 0;
    return static_cast<int64_t>(suppressed);
}

void AuditLog::object(const Session &s, Action action, ObjectKind kind, uint64_t handle) {
    (action == Action::kCreate ? creates_ : destroys_).fetch_add(1, std::memory_order_relaxed);
    if (!spdlog::should_log(spdlog::level::info)) {
        return;  // no line would be written: the budget is not spent either
    }
    int64_t suppressed = admit(s.id());
    if (suppressed < 0) {
        suppressed_.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    lines_.fetch_add(1, std::memory_order_relaxed);
    const PeerIdentity &id = s.identity();
    const char *what = action == Action::kCreate ? "create" : "destroy";
    if (suppressed == 0) {
        spdlog::info("audit: {} {} {:016x} session {} pid {} uid {} gid {} cgroup '{}'", what, kindName(kind),
                     handle, s.id(), id.creds.pid, id.creds.uid, id.creds.gid, id.cgroup);
        return;
    }
    spdlog::info(
        "audit: {} {} {:016x} session {} pid {} uid {} gid {} cgroup '{}' ({} earlier event(s) of this "
        "session over its {} lines/s not logged: see ibv-extendctl watch and ibv_extend_audit_*)",
        what, kindName(kind), handle, s.id(), id.creds.pid, id.creds.uid, id.creds.gid, id.cgroup, suppressed,
        kLinesPerSessionPerSecond);
}

uint64_t AuditLog::sessionEnded(uint64_t session) {
    std::lock_guard lock(mu_);
    auto it = budgets_.find(session);
    if (it == budgets_.end()) {
        return 0;
    }
    uint64_t suppressed = it->second.suppressed;
    budgets_.erase(it);
    return suppressed;
}

AuditLog::Counters AuditLog::counters() const {
    Counters c;
    c.creates = creates_.load(std::memory_order_relaxed);
    c.destroys = destroys_.load(std::memory_order_relaxed);
    c.lines = lines_.load(std::memory_order_relaxed);
    c.lines_suppressed = suppressed_.load(std::memory_order_relaxed);
    return c;
}

}  // namespace ibvx::daemon
