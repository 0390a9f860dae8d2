#include "providers/loader/create_rules.h"

#include <cstring>
#include <map>
#include <mutex>

#include "providers/loader/loader.h"

namespace ibvx::loader {
namespace {

RuleError checkLimit(uint64_t value, uint32_t max, const char *what) {
    if (max != 0 && value > max) {
        return std::string(what) + " " + std::to_string(value) + " exceeds the device's limit " +
               std::to_string(max);
    }
    return std::nullopt;
}

// The first failing check of a list, in order.
RuleError firstOf(std::initializer_list<RuleError> checks) {
    for (const RuleError &e : checks) {
        if (e) {
            return e;
        }
    }
    return std::nullopt;
}

}  // namespace

RuleError checkDmaMode(int mode) {
    if (mode == QU_BUF_DMA_MODE_DEFAULT || mode == QU_BUF_DMA_MODE_INDEP_UB) {
        return std::nullopt;
    }
    return std::string("invalid dma_mode");
}

RuleError checkCqRequest(uint32_t cqe) {
    if (cqe == 0) {
        return std::string("cqe must be > 0");
    }
    return std::nullopt;
}

RuleError checkQpType(ibv_qp_type type) {
    // An XRC initiator is made like the others; a target needs its domain (create_xrc_tgt_qp).
    if (type == IBV_QPT_RC || type == IBV_QPT_UC || type == IBV_QPT_UD || type == IBV_QPT_XRC_SEND) {
        return std::nullopt;
    }
    return std::string("invalid qp_type");
}

RuleError checkSrqRequest(uint32_t max_wr) {
    if (max_wr == 0) {
        return std::string("max_wr must be > 0");
    }
    return std::nullopt;
}

RuleError checkCqLimits(uint32_t cqe, const QueueLimits &limits) {
    return checkLimit(cqe, limits.max_cqe, "cqe");
}

RuleError checkQpLimits(const ibv_qp_cap &cap, const QueueLimits &limits) {
    return firstOf({checkLimit(cap.max_send_wr, limits.max_qp_wr, "max_send_wr"),
                    checkLimit(cap.max_recv_wr, limits.max_qp_wr, "max_recv_wr"),
                    checkLimit(cap.max_send_sge, limits.max_sge, "max_send_sge"),
                    checkLimit(cap.max_recv_sge, limits.max_sge, "max_recv_sge"),
                    checkLimit(cap.max_inline_data, limits.max_inline_data, "max_inline_data")});
}

RuleError checkSrqLimits(uint32_t max_wr, uint32_t max_sge, const QueueLimits &limits) {
    return firstOf(
        {checkLimit(max_wr, limits.max_srq_wr, "max_wr"), checkLimit(max_sge, limits.max_sge, "max_sge")});
}

const QueueLimits *knownQueueLimits(const ibv_device *dev) {
    // Never destroyed (atexit handlers may create); entries never removed, so pointers stay valid.
    static auto *mu = new std::mutex;
    static auto *known = new std::map<const ibv_device *, std::optional<QueueLimits>>;
    {
        std::lock_guard lock(*mu);
        auto it = known->find(dev);
        if (it != known->end()) {
            return it->second ? &*it->second : nullptr;
        }
    }
    // Provider code runs outside our lock.
    std::optional<QueueLimits> limits;
    if (findVdevProvider(dev) != nullptr) {
        for (const VdevDevice &d : queryDevices()) {
            if (std::strncmp(d.attr.name, dev->name, sizeof(d.attr.name)) == 0) {
                limits = QueueLimits{d.attr.max_qp_wr, d.attr.max_cqe, d.attr.max_srq_wr, d.attr.max_sge,
                                     d.attr.max_inline_data};
                break;
            }
        }
    }
    std::lock_guard lock(*mu);
    auto &slot = known->emplace(dev, limits).first->second;
    return slot ? &*slot : nullptr;
}

}  // namespace ibvx::loader
