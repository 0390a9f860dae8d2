// The Ethernet personality's view of a host interface and its RoCEv2 GID table (netdev.h).
#include "providers/softnda/src/netdev.h"

#include <ifaddrs.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "common/unique_fd.h"

namespace softnda {
namespace {

bool sameGid(const ibv_gid &a, const ibv_gid &b) {
    return std::memcmp(a.raw, b.raw, sizeof(a.raw)) == 0;
}

uint32_t interfaceMtu(const std::string &name) {
    // Any socket answers the interface ioctls (dev_ioctl); AF_UNIX needs no privilege and is
    // allowed where the broker's unit restricts address families.
    ibvx::UniqueFd s(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (s.get() < 0) {
        return 0;
    }
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, name.c_str(), std::min(name.size(), sizeof(ifr.ifr_name) - 1));
    if (::ioctl(s.get(), SIOCGIFMTU, &ifr) < 0) {
        return 0;
    }
    return static_cast<uint32_t>(ifr.ifr_mtu);
}

}  // namespace

NetdevView readNetdev(const std::string &name) {
    NetdevView v;
    v.ifindex = ::if_nametoindex(name.c_str());
    if (v.ifindex == 0) {
        return v;
    }
    ifaddrs *list = nullptr;
    if (::getifaddrs(&list) < 0) {
        return v;
    }
    v.present = true;
    v.mtu = interfaceMtu(name);
    std::vector<ibv_gid> v6;
    for (ifaddrs *a = list; a != nullptr; a = a->ifa_next) {
        if (a->ifa_addr == nullptr || name != a->ifa_name) {
            continue;
        }
        switch (a->ifa_addr->sa_family) {
            case AF_PACKET: {
                const auto *ll = reinterpret_cast<const sockaddr_ll *>(a->ifa_addr);
                v.running = (a->ifa_flags & IFF_RUNNING) != 0;
                if (ll->sll_halen == 6) {
                    std::array<uint8_t, 6> mac;
                    std::memcpy(mac.data(), ll->sll_addr, mac.size());
                    v.mac = mac;
                }
                break;
            }
            case AF_INET:
                v.addrs.push_back(
                    ipv4Gid(reinterpret_cast<const sockaddr_in *>(a->ifa_addr)->sin_addr.s_addr));
                break;
            case AF_INET6: {
                ibv_gid g;
                std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6 *>(a->ifa_addr)->sin6_addr,
                            sizeof(g.raw));
                v6.push_back(g);
                break;
            }
            default:
                break;
        }
    }
    ::freeifaddrs(list);
    // The kernel enumerates an interface's IPv4 addresses before its IPv6 ones (add_netdev_ips).
    v.addrs.insert(v.addrs.end(), v6.begin(), v6.end());
    return v;
}

ibv_mtu roceActiveMtu(uint32_t netdev_mtu) {
    constexpr uint32_t kRxeMaxHdrLength = 80;
    if (netdev_mtu < kRxeMaxHdrLength + 256) {
        return IBV_MTU_256;
    }
    const uint32_t room = netdev_mtu - kRxeMaxHdrLength;
    for (ibv_mtu m : {IBV_MTU_4096, IBV_MTU_2048, IBV_MTU_1024, IBV_MTU_512}) {
        if (room >= (128u << m)) {  // enum ibv_mtu n is 128 << n bytes
            return m;
        }
    }
    return IBV_MTU_256;
}

ibv_gid defaultRoceGid(const std::array<uint8_t, 6> &mac) {
    ibv_gid g{};
    g.raw[0] = 0xfe;
    g.raw[1] = 0x80;
    g.raw[8] = mac[0] ^ 0x02;  // the universal/local bit, inverted (RFC 4291 appendix A)
    g.raw[9] = mac[1];
    g.raw[10] = mac[2];
    g.raw[11] = 0xff;
    g.raw[12] = 0xfe;
    g.raw[13] = mac[3];
    g.raw[14] = mac[4];
    g.raw[15] = mac[5];
    return g;
}

ibv_gid ipv4Gid(uint32_t addr_be) {
    ibv_gid g{};
    g.raw[10] = 0xff;
    g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], &addr_be, 4);
    return g;
}

bool RoceGidTable::update(const NetdevView &view) {
    bool changed = false;
    auto set = [&](uint32_t i, const std::optional<ibv_gid> &g) {
        const bool same = slots_[i].has_value() == g.has_value() && (!g || sameGid(*slots_[i], *g));
        if (!same) {
            slots_[i] = g;
            changed = true;
        }
    };
    std::optional<ibv_gid> def;
    if (view.present && view.mac) {
        def = defaultRoceGid(*view.mac);
    }
    set(0, def);
    // Addresses that went away free their slots; those that stay keep theirs.
    std::vector<ibv_gid> wanted;
    for (const ibv_gid &a : view.present ? view.addrs : std::vector<ibv_gid>{}) {
        const bool dup =
            std::any_of(wanted.begin(), wanted.end(), [&](const ibv_gid &w) { return sameGid(w, a); });
        if (!dup && !(def && sameGid(*def, a))) {
            wanted.push_back(a);
        }
    }
    for (uint32_t i = 1; i < kRoceGidSlots; ++i) {
        if (slots_[i] && std::none_of(wanted.begin(), wanted.end(),
                                      [&](const ibv_gid &w) { return sameGid(w, *slots_[i]); })) {
            set(i, std::nullopt);
        }
    }
    for (const ibv_gid &a : wanted) {
        if (contains(a)) {
            continue;
        }
        // A table that is full leaves the address out, as the kernel's cache does (-ENOSPC).
        for (uint32_t i = 1; i < kRoceGidSlots; ++i) {
            if (!slots_[i]) {
                set(i, a);
                break;
            }
        }
    }
    return changed;
}

std::optional<ibv_gid> RoceGidTable::at(uint32_t index) const {
    return index < kRoceGidSlots ? slots_[index] : std::nullopt;
}

bool RoceGidTable::contains(const ibv_gid &gid) const {
    return std::any_of(slots_.begin(), slots_.end(),
                       [&](const std::optional<ibv_gid> &s) { return s && sameGid(*s, gid); });
}

bool Netdev::refresh() {
    NetdevView fresh = readNetdev(name);
    std::lock_guard<std::mutex> lk(mu);
    view = std::move(fresh);
    read_once = true;
    return table.update(view);
}

int parseNetdevList(const std::string &value, std::vector<std::string> *names) {
    std::vector<std::string> out;
    std::set<std::string> seen;
    size_t at = 0;
    while (at <= value.size()) {
        size_t comma = value.find(',', at);
        if (comma == std::string::npos) {
            comma = value.size();
        }
        std::string name = value.substr(at, comma - at);
        name.erase(0, name.find_first_not_of(" \t"));
        name.erase(name.find_last_not_of(" \t") + 1);
        if (name.empty() || name.size() >= IFNAMSIZ || name.find('/') != std::string::npos ||
            !seen.insert(name).second) {
            return -EINVAL;
        }
        if (::if_nametoindex(name.c_str()) == 0) {
            return -ENODEV;
        }
        out.push_back(name);
        at = comma + 1;
    }
    *names = std::move(out);
    return 0;
}

}  // namespace softnda
