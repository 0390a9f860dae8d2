// XRC target QPs other sessions may open (ibv_open_qp, softnda SPEC.md §14): the kernel keeps a
// domain's targets by number (the xrcd's tgt_qps, ib_open_qp) and counts the handles on each
// (usecnt); the real QP goes with the last handle. Here every target a session makes (or a
// restore adopts) is entered under (domain, QP number) with one handle, its creator's QpObject;
// each OpenQp adds one. The driver's target stays its creator's object: its ring and record are
// in the creator's session memory, made through the creator's context, so when the creator lets
// go first the broker keeps that QpObject hidden (and an ended creator's session parked, with its
// context and memory) until the last handle goes (Broker::finishTargets, broker_open_qp.cpp).
//
// Threading: mu_ guards the table and every target's handle count. A leaf: never held across a
// driver call or while taking a session's mutex, so it nests inside Session::mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <ibv_extend.h>

#include "daemon/core/xrcd_domains.h"

namespace ibvx::daemon {

// One driver target and who may reach it.
struct SharedTarget {
    const XrcdDomain *domain = nullptr;
    uint32_t qp_num = 0;
    ibv_qp_extend *qp = nullptr;  // the driver's, owned by the creator's QpObject
    uint64_t creator_session = 0;
    uint64_t creator_handle = 0;
    uint32_t handles = 0;  // XrcTargets::mu_
    // The creator let go while others held it (its QpObject hidden, its session maybe parked):
    // no restart can make the target again, so the openers' sessions are not carried either
    // (QpObject::restartDropReason). Read by other sessions' restart plans, hence atomic.
    std::atomic<bool> creator_released{false};
};

// Where the driver's target lives once its last handle went: the creator's QpObject, which the
// broker destroys (Broker::finishTargets).
struct TargetOwner {
    uint64_t session = 0;
    uint64_t handle = 0;
};

class XrcTargets {
  public:
    // A new target, with its creator's handle.
    std::shared_ptr<SharedTarget> add(const XrcdDomain *domain, uint32_t qp_num, ibv_qp_extend *qp,
                                      TargetOwner creator);
    // One more handle on the domain's target qp_num; nullptr when the domain has none by that
    // number (or its last handle went: a target is never opened again).
    std::shared_ptr<SharedTarget> open(const XrcdDomain *domain, uint32_t qp_num);
    // A handle lets go; returns how many are left. At 0 the target leaves the table.
    uint32_t release(const std::shared_ptr<SharedTarget> &target);
    // Handles left (0: the last one went).
    uint32_t handles(const SharedTarget &target);

  private:
    std::mutex mu_;
    std::map<std::pair<const XrcdDomain *, uint32_t>, std::shared_ptr<SharedTarget>> by_number_;
};

}  // namespace ibvx::daemon
