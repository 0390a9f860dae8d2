// What the Admin service sees of one object (SessionInspector::objects, Object::snapshot).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ibvx::daemon {

// Append only: a restart's state carries the kind by this value.
enum class ObjectKind { kContext, kPd, kMr, kCq, kQp, kSrq, kAh, kXrcd, kMw, kDm };

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
    // An XRC target's: the handles on its driver target (the kernel's usecnt; 0: no target),
    // whether this is an OpenQp handle on another's, and whether its creator let go of it
    // while others held it (kept, hidden from the creator, until the last handle goes).
    uint32_t qp_target_handles = 0;
    bool qp_opened = false;
    bool qp_released = false;
    // kCq (and every queue: what its rings cost the tenant's queue_bytes quota)
    uint32_t cqe = 0;
    uint64_t queue_bytes = 0;
    // kSrq
    uint32_t srq_entries = 0;
    uint32_t srq_entry_size = 0;
    uint32_t srq_num = 0;  // an XRC SRQ's number (0: a basic SRQ)
    // kMr
    uint64_t mr_length = 0;
    uint32_t lkey = 0, rkey = 0;
    // kAh
    ibv_ah_attr ah{};
};

}  // namespace ibvx::daemon
