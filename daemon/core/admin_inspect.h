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
#include "daemon/core/object_snapshot.h"
#include "daemon/core/objects.h"
#include "daemon/core/session.h"

namespace ibvx::daemon {

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
