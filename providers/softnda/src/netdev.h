// softnda's Ethernet personality (SPEC.md §19): a device bound to a host network interface is a
// RoCE device. Its port follows the interface (link state, MTU) and its GID table holds RoCEv2
// GIDs made from the interface's MAC and addresses, the way the kernel's GID cache fills a RoCE
// port's table (drivers/infiniband/core/roce_gid_mgmt.c, cache.c) for rdma_rxe.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace softnda {

// GID table slots of an Ethernet port: fixed, so a GID keeps its index while it exists.
constexpr uint32_t kRoceGidSlots = 16;

// What one look at an interface found.
struct NetdevView {
    bool present = false;  // the interface exists (by name, in the broker's network namespace)
    uint32_t ifindex = 0;
    uint32_t mtu = 0;
    bool running = false;  // IFF_RUNNING: the kernel's operstate is up
    std::optional<std::array<uint8_t, 6>> mac;
    std::vector<ibv_gid> addrs;  // IPv4 (mapped) first, then IPv6, each in the kernel's order
};

// The host's view of interface name (getifaddrs, and SIOCGIFMTU on a socket of no family's
// privilege).
NetdevView readNetdev(const std::string &name);

// The active path MTU of a RoCE port over an interface of this MTU, by rdma_rxe's rule
// (rxe_param.h eth_mtu_int_to_enum, rxe_set_mtu): the largest IB MTU that fits in the netdev MTU
// less RXE_MAX_HDR_LENGTH (80 bytes of Ethernet, IP, UDP and IB headers), at most 4096, and 256
// when nothing fits.
ibv_mtu roceActiveMtu(uint32_t netdev_mtu);

// The kernel's default RoCE GID (make_default_gid): fe80::/64 with the MAC's modified EUI-64.
ibv_gid defaultRoceGid(const std::array<uint8_t, 6> &mac);
// An IPv4 address (network order) as a GID: the IPv4-mapped IPv6 address ::ffff:a.b.c.d.
ibv_gid ipv4Gid(uint32_t addr_be);

// The slots of one Ethernet port. Slot 0 is reserved for the default GID (the kernel reserves
// the default GIDs' slots); an address takes the first free slot from 1 and keeps it until it
// goes away, which leaves the slot empty (ENODATA) for the next new address. An address equal to
// a GID already present (the EUI-64 link-local address is the default GID) takes no slot.
class RoceGidTable {
  public:
    // Makes the table what view says; true when any slot changed.
    bool update(const NetdevView &view);
    std::optional<ibv_gid> at(uint32_t index) const;
    bool contains(const ibv_gid &gid) const;

  private:
    std::array<std::optional<ibv_gid>, kRoceGidSlots> slots_{};
};

// The netdev a device is bound to and what was last seen of it. Re-read on each port query and
// before a connection is checked (SPEC.md §19 says why not netlink); the slots stay stable
// between reads.
struct Netdev {
    std::string name;

    std::mutex mu;  // leaf: view and table
    NetdevView view;
    RoceGidTable table;
    bool read_once = false;

    // Re-reads the interface; true when the GID table changed.
    bool refresh();
};

// Splits a netdev option value ("veth0,veth1") into names; -EINVAL for an empty item, a name too
// long for an interface or a repeated one, -ENODEV for a name no interface has.
int parseNetdevList(const std::string &value, std::vector<std::string> *names);

}  // namespace softnda
