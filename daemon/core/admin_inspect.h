// Read-only views of sessions and their objects for the Admin service. Takes each session's
// mutex (the same one its calls hold), so a snapshot never sees an object half-created, and a
// listing waits for at most one call per session.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/mapping.h"
#include "daemon/core/objects.h"
#include "daemon/core/session.h"

namespace ibvx::daemon {

struct ObjectSnapshot {
    uint64_t handle = 0;
    ObjectKind kind = ObjectKind::kContext;
    std::string device;
    uint32_t users = 0;
    std::vector<uint64_t> uses;
    // kQp
    uint32_t qp_num = 0;
    ibv_qp_state qp_state = IBV_QPS_RESET;
    ibv_qp_type qp_type = IBV_QPT_RC;
    ibv_qp_cap qp_cap{};
    bool qp_has_srq = false;
    // kCq
    uint32_t cqe = 0;
    uint64_t queue_bytes = 0;
    // kSrq
    uint32_t srq_entries = 0;
    uint32_t srq_entry_size = 0;
    // kMr
    uint64_t mr_length = 0;
    uint32_t lkey = 0, rkey = 0;
};

class SessionInspector {
  public:
    // Every object of s, sorted by kind (context first) then handle. Empty once s has ended.
    static std::vector<ObjectSnapshot> objects(Session &s);
};

const char *qpStateName(ibv_qp_state state);
const char *qpTypeName(ibv_qp_type type);

// Queue memory (arenas, driver allocations, doorbell pages) of every session together, and of
// one session: what the Admin service reports, without reaching into the mapping manager.
MemoryStats memoryTotals();
MemoryStats memoryOf(Session &s);

}  // namespace ibvx::daemon
