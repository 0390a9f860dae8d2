// Multicast on softnda (SPEC.md §11.3): UD QPs join groups by (MGID, MLID); the engine delivers
// a datagram sent to an MLID to every QP of the device that joined a group with that MLID. On an
// Ethernet device groups are MGIDs, and the device's socket joins their IP groups (§18).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"
#include "providers/softnda/src/wire.h"

namespace softnda {
namespace {

bool ethernet(const Device &dev) {
    return dev.netdev != nullptr;
}

McastKey keyOf(const Device &dev, const McastGroup &g) {
    return mcastKey(ethernet(dev), g.gid, g.lid);
}

// Whether qp has a membership with key (several MGIDs may share an MLID on InfiniBand).
bool hasKey(const Device &dev, const Qp &qp, const McastKey &key) {
    return std::any_of(qp.mcast.begin(), qp.mcast.end(),
                       [&](const McastGroup &g) { return keyOf(dev, g) == key; });
}

// Only a UD QP joins, and only a multicast GID names a group: on InfiniBand with a multicast LID;
// on Ethernet, where the LID means nothing, an IPv6 multicast MGID or an IPv4-mapped one of
// 224.0.0.0/4 (RoCEv2 over IPv4), as the kernel checks a RoCE attach.
bool validGroup(const Device &dev, ibv_qp_type type, const ibv_gid &gid, uint16_t lid) {
    if (type != IBV_QPT_UD) {
        return false;
    }
    return ethernet(dev) ? isMulticastGid(gid) : gid.raw[0] == 0xff && isMulticastLid(lid);
}

// Whether the device has room for qp to join a group with key (the caller holds ctl).
bool roomFor(const Device &dev, const Qp &qp, const McastKey &key) {
    if (qp.mcast.size() >= kMaxQpGroups || dev.mcast_attached >= kMaxMcastTotalAttach) {
        return false;
    }
    if (hasKey(dev, qp, key)) {
        return true;  // already a member of that MLID: only a new MGID on it
    }
    auto it = dev.mcast.find(key);
    return it != dev.mcast.end() ? it->second.size() < kMaxMcastQpAttach : dev.mcast.size() < kMaxMcastGroups;
}

// Makes qp a member of g; the caller holds ctl and checked roomFor. Takes the gate: the engine
// reads the members during its passes.
void join(Device *dev, Qp *qp, const McastGroup &g) {
    const McastKey key = keyOf(*dev, g);
    dev->gate.lock();
    if (!hasKey(*dev, *qp, key)) {
        dev->mcast[key].push_back(qp);
    }
    qp->mcast.push_back(g);
    dev->gate.unlock();
    dev->mcast_attached++;
}

// The caller holds ctl and the gate.
void leaveKey(Device *dev, Qp *qp, const McastKey &key) {
    auto it = dev->mcast.find(key);
    if (it == dev->mcast.end()) {
        return;
    }
    std::erase(it->second, qp);
    if (it->second.empty()) {
        dev->mcast.erase(it);
    }
}

// The caller holds ctl: qp leaves its membership g.
void leave(Device *dev, Qp *qp, const McastGroup *g) {
    const McastKey key = keyOf(*dev, *g);
    dev->gate.lock();
    qp->mcast.erase(g);
    if (!hasKey(*dev, *qp, key)) {
        leaveKey(dev, qp, key);
    }
    dev->gate.unlock();
    dev->mcast_attached--;
}

// The socket of an Ethernet device, which joins the IP multicast groups of its QPs' MGIDs
// (SPEC.md §18); null on InfiniBand and while the device has none (its groups reach this host's
// QPs alone).
WireSocket *wireOf(const Device &dev) {
    return ethernet(dev) && dev.engine ? dev.engine->wire() : nullptr;
}

// The socket leaves the group of key once no QP of the device is a member (the caller holds ctl).
void leaveWireGroup(Device *dev, const McastKey &key) {
    if (WireSocket *wire = wireOf(*dev); wire != nullptr && dev->mcast.count(key) == 0) {
        ibv_gid gid;
        std::memcpy(gid.raw, key.data(), key.size());
        wire->leaveGroup(gid);
    }
}

Qp *udQpOf(ibv_qp_extend *ext) {
    Qp *qp = ext != nullptr ? asQp(ext->qp) : nullptr;
    return qp != nullptr && &qp->ext == ext ? qp : nullptr;
}

// Whether a and b are one membership: the same MGID and MLID, or on Ethernet the same MGID.
bool sameMembership(const Device &dev, const McastGroup &a, const McastGroup &b) {
    return keyOf(dev, a) == keyOf(dev, b) && std::memcmp(a.gid.raw, b.gid.raw, sizeof(a.gid.raw)) == 0;
}

// qp's membership that (gid, lid) names.
McastGroup *findGroup(const Device &dev, Qp *qp, const ibv_gid &gid, uint16_t lid) {
    const McastGroup want{gid, lid};
    auto g = std::find_if(qp->mcast.begin(), qp->mcast.end(),
                          [&](const McastGroup &m) { return sameMembership(dev, m, want); });
    return g != qp->mcast.end() ? g : nullptr;
}

}  // namespace

int attachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid) {
    Qp *qp = udQpOf(ext);
    if (qp == nullptr || gid == nullptr) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    if (!validGroup(*dev, qp->init.qp_type, *gid, lid)) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (findGroup(*dev, qp, *gid, lid) != nullptr) {
        return 0;  // joined already: the kernel answers success and changes nothing
    }
    const McastKey key = mcastKey(ethernet(*dev), *gid, lid);
    if (!roomFor(*dev, *qp, key)) {
        return -ENOMEM;
    }
    // The first member on this device makes the socket join the group's IP multicast group;
    // when it cannot, nothing changes.
    WireSocket *wire = wireOf(*dev);
    if (wire != nullptr && dev->mcast.count(key) == 0) {
        if (int rc = wire->joinGroup(*gid); rc != 0) {
            return rc;
        }
    }
    join(dev, qp, McastGroup{*gid, ethernet(*dev) ? uint16_t{0} : lid});
    return 0;
}

int detachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid) {
    Qp *qp = udQpOf(ext);
    if (qp == nullptr || gid == nullptr) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    McastGroup *g = findGroup(*dev, qp, *gid, lid);
    if (g == nullptr) {
        return -EINVAL;
    }
    const McastKey key = keyOf(*dev, *g);
    leave(dev, qp, g);
    leaveWireGroup(dev, key);
    return 0;
}

void leaveAllGroups(Qp *qp) {
    Device *dev = qp->ctx->dev;
    for (const McastGroup &g : qp->mcast) {
        const McastKey key = keyOf(*dev, g);
        leaveKey(dev, qp, key);
        leaveWireGroup(dev, key);
    }
    dev->mcast_attached -= static_cast<uint32_t>(qp->mcast.size());
    qp->mcast.clear();
}

int checkImportedGroups(const Device &dev, ibv_qp_type type, const std::vector<McastGroup> &groups) {
    if (groups.size() > kMaxQpGroups) {
        return -EINVAL;
    }
    std::vector<McastKey> new_keys;
    for (size_t i = 0; i < groups.size(); ++i) {
        const McastGroup &g = groups[i];
        const McastKey key = keyOf(dev, g);
        if (!validGroup(dev, type, g.gid, g.lid) ||
            std::any_of(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(i),
                        [&](const McastGroup &m) { return sameMembership(dev, m, g); })) {
            return -EINVAL;
        }
        if (std::find(new_keys.begin(), new_keys.end(), key) != new_keys.end()) {
            continue;
        }
        new_keys.push_back(key);
        auto it = dev.mcast.find(key);
        if (it != dev.mcast.end() && it->second.size() >= kMaxMcastQpAttach) {
            return -ENOMEM;
        }
    }
    const auto fresh = std::count_if(new_keys.begin(), new_keys.end(),
                                     [&](const McastKey &key) { return dev.mcast.count(key) == 0; });
    if (dev.mcast.size() + static_cast<size_t>(fresh) > kMaxMcastGroups ||
        dev.mcast_attached + groups.size() > kMaxMcastTotalAttach) {
        return -ENOMEM;
    }
    return 0;
}

void joinImportedGroups(Qp *qp, const std::vector<McastGroup> &groups) {
    Device *dev = qp->ctx->dev;
    WireSocket *wire = wireOf(*dev);
    for (const McastGroup &g : groups) {
        // A successor's socket joins the IP groups again; one it cannot join reaches this
        // host's members alone (the blob was joined, so the import does not fail for it).
        if (wire != nullptr && dev->mcast.count(keyOf(*dev, g)) == 0) {
            (void)wire->joinGroup(g.gid);
        }
        join(dev, qp, g);
    }
}

}  // namespace softnda
