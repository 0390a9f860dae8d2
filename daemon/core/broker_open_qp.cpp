// ibv_open_qp: handles on an XRC target QP from any session that has its domain open, and the
// target's life until its last handle (softnda SPEC.md §14, docs/verbs.md). The kernel's model
// (drivers/infiniband/core/verbs.c: create_xrc_qp_user, ib_open_qp, __ib_destroy_shared_qp):
// the domain keeps its targets by number, every handle counts, the real QP goes with the last.
// Here the driver's target stays its creator's QpObject (its ring and record are in the
// creator's session memory, through the creator's context): when the creator lets go while
// others hold it, that QpObject is hidden and kept, with its context, and an ended creator's
// session is parked with its memory, until finishTargets() destroys the target.
#include <cstring>

#include "daemon/core/broker.h"
#include "daemon/core/driver_call.h"

namespace ibvx::daemon {

void Broker::enterTarget(Session &s, QpObject &qp, const XrcdObject &xrcd) {
    if (xrcd.domain == nullptr || qp.qp == nullptr || qp.qp->qp == nullptr) {
        return;  // cannot happen for a made or adopted target: nothing to open it by
    }
    qp.target =
        qp.device()->xrc_targets.add(xrcd.domain.get(), qp.qp->qp->qp_num, qp.qp, {s.id(), qp.handle});
}

StatusOr<QpResult> Broker::openQp(Session &s, const OpenQpArgs &args) {
    if (args.qp_type != IBV_QPT_XRC_RECV) {
        return invalidArgument("ibv_open_qp opens XRC target QPs (qp_type IBV_QPT_XRC_RECV) only");
    }
    ASSIGN_OR_RETURN(SessionLock lock, lockLive(s));
    RETURN_IF_ERROR(checkRoom(s));
    ASSIGN_OR_RETURN(ContextObject * ctx, lookup<ContextObject>(s, args.context));
    ASSIGN_OR_RETURN(XrcdObject * xrcd, lookup<XrcdObject>(s, args.xrcd));
    Device *dev = ctx->dev;
    if (xrcd->context->dev != dev || xrcd->domain == nullptr) {
        return invalidArgument("the XRC domain belongs to another device than the context");
    }
    ASSIGN_OR_RETURN(QuotaCharge quota, charge(s, {{Quota::kQps, 1}}));
    std::shared_ptr<SharedTarget> target = dev->xrc_targets.open(xrcd->domain.get(), args.qp_num);
    if (target == nullptr) {
        return invalidArgument("QP number " + std::to_string(args.qp_num) +
                               " is no XRC target QP of this XRC domain (ibv_open_qp)");
    }
    auto obj = std::make_unique<QpObject>();
    obj->quota = std::move(quota);
    obj->context = ctx;
    obj->qp = target->qp;
    obj->qp_type = IBV_QPT_XRC_RECV;
    obj->target = target;
    obj->opened = true;
    obj->uses = {ctx, xrcd};
    QpResult r;
    r.qp_num = target->qp_num;
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    Status queried = callDriver(s.memory(), dev, "query_qp failed", [&] {
        return dev->verbs.queryQp(target->qp->qp, &attr, IBV_QP_STATE, &init);
    });
    r.state = queried.isOk() ? attr.qp_state : target->qp->qp->state;
    // No queue memory: an opened target has nothing to post to, and its record is the creator's.
    ASSIGN_OR_RETURN(r.qp, publish(s, std::move(obj), {}));
    return r;
}

bool Broker::keepsTarget(Session &s, Object *obj) {
    if (obj->kind != ObjectKind::kQp) {
        return false;
    }
    auto *qp = static_cast<QpObject *>(obj);
    if (qp->target == nullptr) {
        return false;
    }
    XrcTargets &table = qp->device()->xrc_targets;
    if (qp->released) {
        return table.handles(*qp->target) != 0;  // hidden until the others went
    }
    const uint32_t left = table.release(qp->target);
    if (qp->opened) {
        if (left == 0) {  // the creator let go before: its hidden QpObject goes now
            std::lock_guard lock(targets_mu_);
            finished_targets_.push_back({qp->target->creator_session, qp->target->creator_handle});
        }
        return false;  // the handle goes; it destroys nothing in the driver
    }
    if (left == 0) {
        return false;  // the creator's was the last handle: the driver's target goes now
    }
    // Others hold the target: the creator's handle is hidden and kept for it. It no longer uses
    // this session's domain handle (every other handle holds the domain through its own), so
    // the tenant may close that; its context stays until the target goes.
    qp->released = true;
    qp->target->creator_released = true;
    ObjectUses kept;
    for (Object *u : qp->uses) {
        if (u->kind == ObjectKind::kXrcd) {
            --u->users;
            touchParent(s, u);
        } else {
            kept.push_back(u);
        }
    }
    qp->uses = kept;
    touch(s, qp);  // its record says from now on that a restart cannot carry it
    return true;
}

bool Broker::keepsContextForTargets(Session &s, ContextObject &ctx) {
    if (ctx.users == 0) {
        return false;
    }
    uint32_t hidden_users = 0;
    for (const auto &[handle, obj] : s.objects_) {
        if (obj->hidden() && obj->kind == ObjectKind::kQp &&
            static_cast<const QpObject &>(*obj).context == &ctx) {
            ++hidden_users;
        }
    }
    if (hidden_users != ctx.users) {
        return false;  // the tenant's own objects use it: EBUSY, as ever
    }
    ctx.released = true;
    touch(s, &ctx);
    return true;
}

std::shared_ptr<Session> Broker::sessionById(uint64_t id, bool *parked) {
    std::lock_guard lock(sessions_mu_);
    auto p = parked_.find(id);
    if (p != parked_.end()) {
        *parked = true;
        return p->second;
    }
    *parked = false;
    for (auto &[token, s] : by_token_) {
        if (s->id() == id) {
            return s;
        }
    }
    return nullptr;
}

TargetOwner Broker::creatorOf(const QpObject &qp) {
    if (!qp.opened || qp.target == nullptr) {
        return {};
    }
    return {qp.target->creator_session, qp.target->creator_handle};
}

void Broker::targetChanged(TargetOwner creator) {
    if (creator.session == 0) {
        return;
    }
    bool parked = false;
    std::shared_ptr<Session> s = sessionById(creator.session, &parked);
    if (s == nullptr || parked) {
        return;  // a creator that let go: no restart carries the target (restartDropReason)
    }
    {
        auto lock = lockLive(*s);
        if (!lock.isOk()) {
            return;
        }
        auto it = s->objects_.find(creator.handle);
        if (it == s->objects_.end() || it->second->hidden()) {
            return;
        }
        touch(*s, it->second.get());
    }
    // Before the handle's own reply: a crash after it and before this would restore the target
    // as it was while its opener was told it had changed. A commit that fails marks the
    // creator's log to be written whole at its next commit (RestartState::commit).
    (void)commit(*s, StoredReply{});
}

void Broker::finishTargets() {
    std::vector<TargetOwner> owners;
    {
        std::lock_guard lock(targets_mu_);
        owners.swap(finished_targets_);
    }
    for (const TargetOwner &owner : owners) {
        bool parked = false;
        std::shared_ptr<Session> s = sessionById(owner.session, &parked);
        if (s == nullptr) {
            continue;  // its teardown is over: it destroyed the target itself
        }
        std::lock_guard lock(s->mu_);
        auto it = s->objects_.find(owner.handle);
        if (it != s->objects_.end() && it->second->hidden()) {
            auto *qp = static_cast<QpObject *>(it->second.get());
            ContextObject *ctx = qp->context;
            // A driver that refuses leaves it hidden in a live session (its end tries again).
            if (!destroyLocked(*s, qp).isOk() && s->ended_ && s->objects_.count(owner.handle) != 0) {
                eraseLocked(*s, qp);
            }
            if (ctx->hidden() && ctx->users == 0) {
                (void)destroyLocked(*s, ctx);  // the tenant closed it already
            }
        }
        if (parked && s->ended_ && !teardownLocked(*s)) {
            MappingManager::instance().dropSession(s->memory_.get());
            std::lock_guard sessions(sessions_mu_);
            parked_.erase(s->id());
        }
    }
}

}  // namespace ibvx::daemon
