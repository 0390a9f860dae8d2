#include "daemon/core/admin_inspect.h"

#include <algorithm>
#include <mutex>

namespace ibvx::daemon {
const char *qpStateName(ibv_qp_state state) {
    switch (state) {
        case IBV_QPS_RESET:
            return "RESET";
        case IBV_QPS_INIT:
            return "INIT";
        case IBV_QPS_RTR:
            return "RTR";
        case IBV_QPS_RTS:
            return "RTS";
        case IBV_QPS_SQD:
            return "SQD";
        case IBV_QPS_SQE:
            return "SQE";
        case IBV_QPS_ERR:
            return "ERR";
        default:
            return "UNKNOWN";
    }
}

const char *qpTypeName(ibv_qp_type type) {
    switch (type) {
        case IBV_QPT_RC:
            return "RC";
        case IBV_QPT_UC:
            return "UC";
        case IBV_QPT_UD:
            return "UD";
        default:
            return "OTHER";
    }
}

std::vector<ObjectSnapshot> SessionInspector::objects(Session &s) {
    std::vector<ObjectSnapshot> out;
    auto held = s.hold();
    if (s.ended()) {
        return out;
    }
    for (const Object *obj : s.objectsParentsFirst()) {
        ObjectSnapshot o;
        o.handle = obj->handle;
        o.kind = obj->kind;
        o.users = obj->users;
        for (const Object *u : obj->uses) {
            o.uses.push_back(u->handle);
        }
        o.queue_bytes = obj->queue_bytes;
        obj->snapshot(o);
        out.push_back(std::move(o));
    }
    std::sort(out.begin(), out.end(), [](const ObjectSnapshot &a, const ObjectSnapshot &b) {
        if (a.kind != b.kind) {
            return static_cast<int>(a.kind) < static_cast<int>(b.kind);
        }
        return a.handle < b.handle;
    });
    return out;
}

MemoryStats memoryTotals() {
    return MappingManager::instance().totals();
}

MemoryStats memoryOf(Session &s) {
    return MappingManager::instance().stats(s.memory());
}

}  // namespace ibvx::daemon
