#include "daemon/core/xrc_targets.h"

namespace ibvx::daemon {

std::shared_ptr<SharedTarget> XrcTargets::add(const XrcdDomain *domain, uint32_t qp_num, ibv_qp_extend *qp,
                                              TargetOwner creator) {
    auto t = std::make_shared<SharedTarget>();
    t->domain = domain;
    t->qp_num = qp_num;
    t->qp = qp;
    t->creator_session = creator.session;
    t->creator_handle = creator.handle;
    t->handles = 1;
    std::lock_guard lock(mu_);
    by_number_[{domain, qp_num}] = t;  // a number the driver reused belongs to the new target
    return t;
}

std::shared_ptr<SharedTarget> XrcTargets::open(const XrcdDomain *domain, uint32_t qp_num) {
    std::lock_guard lock(mu_);
    auto it = by_number_.find({domain, qp_num});
    if (it == by_number_.end()) {
        return nullptr;
    }
    ++it->second->handles;
    return it->second;
}

uint32_t XrcTargets::release(const std::shared_ptr<SharedTarget> &target) {
    std::lock_guard lock(mu_);
    if (target->handles == 0) {
        return 0;
    }
    if (--target->handles == 0) {
        auto it = by_number_.find({target->domain, target->qp_num});
        if (it != by_number_.end() && it->second == target) {
            by_number_.erase(it);
        }
    }
    return target->handles;
}

uint32_t XrcTargets::handles(const SharedTarget &target) {
    std::lock_guard lock(mu_);
    return target.handles;
}

}  // namespace ibvx::daemon
