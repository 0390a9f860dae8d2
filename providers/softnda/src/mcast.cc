// Multicast on softnda (SPEC.md §11.3): UD QPs join groups by (MGID, MLID); the engine delivers
// a datagram sent to an MLID to every QP of the device that joined a group with that MLID.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

bool sameGroup(const McastGroup &g, const ibv_gid &gid, uint16_t lid) {
    return g.lid == lid && std::memcmp(g.gid.raw, gid.raw, sizeof(gid.raw)) == 0;
}

bool hasLid(const Qp &qp, uint16_t lid) {
    return std::any_of(qp.mcast.begin(), qp.mcast.end(), [lid](const McastGroup &g) { return g.lid == lid; });
}

// Only a UD QP joins, and only a multicast GID and LID name a group.
bool validGroup(ibv_qp_type type, const ibv_gid &gid, uint16_t lid) {
    return type == IBV_QPT_UD && gid.raw[0] == 0xff && isMulticastLid(lid);
}

// Whether the device has room for qp to join a group with MLID lid (the caller holds ctl).
bool roomFor(const Device &dev, const Qp &qp, uint16_t lid) {
    if (qp.mcast.size() >= kMaxQpGroups || dev.mcast_attached >= kMaxMcastTotalAttach) {
        return false;
    }
    if (hasLid(qp, lid)) {
        return true;  // already a member of that MLID: only a new MGID on it
    }
    auto it = dev.mcast.find(lid);
    return it != dev.mcast.end() ? it->second.size() < kMaxMcastQpAttach : dev.mcast.size() < kMaxMcastGroups;
}

// Makes qp a member of (gid, lid); the caller holds ctl and checked roomFor. Takes the gate: the
// engine reads the members during its passes.
void join(Device *dev, Qp *qp, const ibv_gid &gid, uint16_t lid) {
    dev->gate.lock();
    if (!hasLid(*qp, lid)) {
        dev->mcast[lid].push_back(qp);
    }
    qp->mcast.push_back(McastGroup{gid, lid});
    dev->gate.unlock();
    dev->mcast_attached++;
}

// The caller holds ctl and the gate.
void leaveLid(Device *dev, Qp *qp, uint16_t lid) {
    auto it = dev->mcast.find(lid);
    if (it == dev->mcast.end()) {
        return;
    }
    std::erase(it->second, qp);
    if (it->second.empty()) {
        dev->mcast.erase(it);
    }
}

Qp *udQpOf(ibv_qp_extend *ext) {
    Qp *qp = ext != nullptr ? asQp(ext->qp) : nullptr;
    return qp != nullptr && &qp->ext == ext ? qp : nullptr;
}

}  // namespace

int attachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid) {
    Qp *qp = udQpOf(ext);
    if (qp == nullptr || gid == nullptr) {
        return -EINVAL;
    }
    if (!validGroup(qp->init.qp_type, *gid, lid)) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (std::any_of(qp->mcast.begin(), qp->mcast.end(),
                    [&](const McastGroup &g) { return sameGroup(g, *gid, lid); })) {
        return 0;  // joined already: the kernel answers success and changes nothing
    }
    if (!roomFor(*dev, *qp, lid)) {
        return -ENOMEM;
    }
    join(dev, qp, *gid, lid);
    return 0;
}

int detachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid) {
    Qp *qp = udQpOf(ext);
    if (qp == nullptr || gid == nullptr) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    auto g = std::find_if(qp->mcast.begin(), qp->mcast.end(),
                          [&](const McastGroup &m) { return sameGroup(m, *gid, lid); });
    if (g == qp->mcast.end()) {
        return -EINVAL;
    }
    dev->gate.lock();
    qp->mcast.erase(g);
    if (!hasLid(*qp, lid)) {
        leaveLid(dev, qp, lid);
    }
    dev->gate.unlock();
    dev->mcast_attached--;
    return 0;
}

void leaveAllGroups(Qp *qp) {
    Device *dev = qp->ctx->dev;
    for (const McastGroup &g : qp->mcast) {
        leaveLid(dev, qp, g.lid);
    }
    dev->mcast_attached -= static_cast<uint32_t>(qp->mcast.size());
    qp->mcast.clear();
}

int checkImportedGroups(const Device &dev, ibv_qp_type type, const std::vector<McastGroup> &groups) {
    if (groups.size() > kMaxQpGroups) {
        return -EINVAL;
    }
    std::vector<uint16_t> new_lids;
    for (size_t i = 0; i < groups.size(); ++i) {
        const McastGroup &g = groups[i];
        if (!validGroup(type, g.gid, g.lid) ||
            std::any_of(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(i),
                        [&](const McastGroup &m) { return sameGroup(m, g.gid, g.lid); })) {
            return -EINVAL;
        }
        if (std::find(new_lids.begin(), new_lids.end(), g.lid) != new_lids.end()) {
            continue;
        }
        new_lids.push_back(g.lid);
        auto it = dev.mcast.find(g.lid);
        if (it != dev.mcast.end() && it->second.size() >= kMaxMcastQpAttach) {
            return -ENOMEM;
        }
    }
    const auto fresh = std::count_if(new_lids.begin(), new_lids.end(),
                                     [&](uint16_t lid) { return dev.mcast.count(lid) == 0; });
    if (dev.mcast.size() + static_cast<size_t>(fresh) > kMaxMcastGroups ||
        dev.mcast_attached + groups.size() > kMaxMcastTotalAttach) {
        return -ENOMEM;
    }
    return 0;
}

void joinImportedGroups(Qp *qp, const std::vector<McastGroup> &groups) {
    for (const McastGroup &g : groups) {
        join(qp->ctx->dev, qp, g.gid, g.lid);
    }
}

}  // namespace softnda
