#include "daemon/core/admin_inspect.h"

#include <algorithm>
#include <mutex>

#include "daemon/core/device.h"

namespace ibvx::daemon {
namespace {

std::string deviceOf(const ContextObject *ctx) {
    return ctx != nullptr && ctx->device != nullptr ? ctx->device->info.name : std::string();
}

}  // namespace

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
    std::lock_guard lock(s.mu_);
    if (s.ended_) {
        return out;
    }
    out.reserve(s.objects_.size());
    for (const auto &[handle, obj] : s.objects_) {
        ObjectSnapshot o;
        o.handle = handle;
        o.kind = obj->kind;
        o.users = obj->users;
        for (const Object *u : obj->uses) {
            o.uses.push_back(u->handle);
        }
        switch (obj->kind) {
            case ObjectKind::kContext:
                o.device = deviceOf(static_cast<const ContextObject *>(obj.get()));
                break;
            case ObjectKind::kPd:
                o.device = deviceOf(static_cast<const PdObject *>(obj.get())->context);
                break;
            case ObjectKind::kMr: {
                auto *mr = static_cast<const MrObject *>(obj.get());
                o.device = mr->pd != nullptr ? deviceOf(mr->pd->context) : std::string();
                o.mr_length = mr->length;
                if (mr->mr != nullptr) {
                    o.lkey = mr->mr->lkey;
                    o.rkey = mr->mr->rkey;
                }
                break;
            }
            case ObjectKind::kCq: {
                auto *cq = static_cast<const CqObject *>(obj.get());
                o.device = deviceOf(cq->context);
                o.queue_bytes = cq->queue_bytes;
                if (cq->cq != nullptr && cq->cq->cq != nullptr) {
                    o.cqe = static_cast<uint32_t>(cq->cq->cq->cqe);
                } else if (cq->cq != nullptr) {
                    o.cqe = cq->cq->cq_info.qbuf.entry_cnt;
                }
                break;
            }
            case ObjectKind::kSrq: {
                auto *srq = static_cast<const SrqObject *>(obj.get());
                o.device = deviceOf(srq->context);
                if (srq->srq != nullptr) {
                    o.srq_entries = srq->srq->srq_info.qbuf.entry_cnt;
                    o.srq_entry_size = srq->srq->srq_info.qbuf.entry_size;
                }
                break;
            }
            case ObjectKind::kQp: {
                auto *qp = static_cast<const QpObject *>(obj.get());
                o.device = deviceOf(qp->context);
                o.qp_type = qp->qp_type;
                o.qp_cap = qp->cap;
                o.qp_has_srq = qp->has_srq;
                if (qp->qp != nullptr && qp->qp->qp != nullptr) {
                    o.qp_num = qp->qp->qp->qp_num;
                    o.qp_state = qp->qp->qp->state;
                }
                break;
            }
        }
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
