// softnda's RoCEv2 transport to other hosts (SPEC.md §18): the broker's UDP socket, the seeded
// fault hook the tests use in place of netem, and the state a QP connected to another host
// keeps. The protocol itself (requester, responder, retransmission) is engine work: wire.cc
// holds those Engine::Thread members.
#pragma once

#include <infiniband/verbs.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/src/engine_limits.h"
#include "providers/softnda/src/roce_wire.h"

namespace softnda {

struct Device;
struct Qp;
struct Srq;

// A wire responder's saved atomic results per QP: the responder resources softnda reports
// (max_qp_rd_atom), so a repeated atomic still outstanding is always answered.
inline constexpr uint32_t kSavedAtomics = 16;

// Loss, duplication and reordering the socket applies to what it sends, each a probability per
// packet, drawn from a generator seeded with seed (provider option wire_faults, SPEC.md §18).
struct WireFaults {
    double drop = 0, dup = 0, reorder = 0;
    uint64_t seed = 1;
    bool any() const { return drop > 0 || dup > 0 || reorder > 0; }
};
// "drop=0.01,dup=0.005,reorder=0.01,seed=7", any subset, in any order; "" is none. -EINVAL for
// an unknown key, a repeated one, or a probability outside [0, 1).
int parseWireFaults(const std::string &value, WireFaults *out);

// One packet to send: its headers and payload, and where it goes. Addresses are GIDs: an IPv4
// address as its IPv4-mapped GID (::ffff:a.b.c.d), an IPv6 one as itself.
struct WireOut {
    ibv_gid src{}, dst{};
    uint16_t sport = 0;  // the UDP source port (RoCEv2's flow entropy); 0: the socket's own port
    uint32_t flow = 0;   // the IPv6 flow label (20 bits): the address handle's
    // The IP header's TOS and TTL (IPv6: traffic class and hop limit): the address handle's
    // traffic class and hop limit. A hop limit of 0 sends with the host's default TTL (the kernel
    // takes no TTL 0 from a socket).
    uint8_t tos = 0, ttl = 0;
    roce::Packet pkt;
};

// One packet received: the UDP payload, and the addresses its ICRC covers (as WireOut's).
struct WireFrame {
    uint8_t *data = nullptr;
    size_t len = 0;
    ibv_gid src{}, dst{};
    uint16_t sport = 0, dport = 0;
    uint8_t tos = 0, ttl = 0;  // the IP header's (IPv6: traffic class, hop limit), for a UD GRH
    uint32_t flow = 0;         // the IPv6 header's flow label (0 for IPv4), for a UD GRH
};

// The device's UDP socket: bound to port (4791) on the device's interface only, so a broker per
// network namespace, or per interface, each has its own. One IPv6 socket serves IPv4 too (its
// addresses IPv4-mapped); where the host has no IPv6 it is an IPv4 one. Sending is thread-safe.
// Packets leave from their flow's UDP source port: a send-only socket per port, opened on first
// use, up to kMaxSourcePorts of them; a port beyond those, or one that cannot be bound, sends from
// the receiving socket's port (SPEC.md §18).
class WireSocket {
  public:
    // -errno when the socket cannot be made or bound (EADDRINUSE: another RoCEv2 stack, rdma_rxe or
    // another broker, has the port on this interface).
    static int open(const std::string &ifname, uint16_t port, const WireFaults &faults,
                    std::unique_ptr<WireSocket> *out);
    ~WireSocket();
    WireSocket(const WireSocket &) = delete;
    WireSocket &operator=(const WireSocket &) = delete;

    uint16_t port() const { return port_; }
    // Whether it reaches IPv6 GIDs (false: the host has no IPv6).
    bool ipv6() const { return family_ == AF_INET6; }
    // Whether IPv6 packets carry their WireOut's flow label, and WireFrame's is the one that
    // arrived (false where the host refuses the flow label options: 0 then).
    bool flowLabels() const { return flow_labels_; }
    // Encodes and sends the packets (their ICRCs computed over the IP and UDP headers the kernel
    // writes), through the fault hook.
    void send(std::span<const WireOut> out);
    // Waits for packets; fills up to frames.size() of them (pointing into this socket's receive
    // buffers, valid until the next call) and returns how many, 0 when woken by stop() or a
    // timeout. Only one thread receives.
    size_t receive(std::span<WireFrame> frames);
    // Wakes the receiving thread for good.
    void stop();
    // Makes the socket a member of the IP multicast group of MGID gid on its interface (an
    // IPv4-mapped one by IP_ADD_MEMBERSHIP, an IPv6 one by IPV6_JOIN_GROUP): 0 or -errno
    // (ENOBUFS: past the host's net.ipv4.igmp_max_memberships; EAFNOSUPPORT: an IPv6 group on
    // an IPv4 socket). leaveGroup ends it.
    int joinGroup(const ibv_gid &gid);
    void leaveGroup(const ibv_gid &gid);

    std::atomic<uint64_t> sent{0}, received{0}, bad_icrc{0}, malformed{0}, fault_drops{0};
    // How many source ports have a socket of their own (at most kMaxSourcePorts).
    std::atomic<uint64_t> source_ports{0};

    static constexpr uint32_t kMaxSourcePorts = 256;

  private:
    // A socket packets leave from, and its port (the UDP source port their ICRC covers).
    struct Sender {
        int fd;
        uint16_t port;
    };

    WireSocket(int fd, int family, uint32_t ifindex, uint16_t port, const WireFaults &faults);
    // The socket for packets whose flow's source port is sport: the same answer every time.
    Sender sender(uint16_t sport);
    void transmit(const uint8_t *const *bufs, const size_t *lens, const WireOut *const *to, size_t n);

    int fd_;
    int family_;
    std::string ifname_;
    bool flow_labels_ = false;
    uint32_t ifindex_;  // the interface's, at open: a link-local destination's scope
    uint16_t port_;
    WireFaults faults_;
    std::mutex fault_mu_;  // leaf: rng_ and held_
    std::mt19937_64 rng_;
    std::vector<uint8_t> held_;  // a packet the reorder fault holds back until the next one
    WireOut held_to_;
    std::vector<uint8_t> rx_buf_;
    // The send-only socket of each UDP source port: kUnopened, kRefused (the receiving socket
    // sends for it), or its fd. Written under sources_mu_, once per port; read without it.
    static constexpr int kUnopened = -1, kRefused = -2;
    std::unique_ptr<std::atomic<int>[]> sources_;
    std::mutex sources_mu_;  // leaf: opening a source port's socket (and source_ports)
};

// The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), network order; false for any other.
bool ipv4OfGid(const ibv_gid &gid, uint32_t *ip_be);
// Whether a packet from sgid can go to dgid over the wire: both IPv4-mapped, or both IPv6 (not
// mapped) when the socket reaches IPv6 (ipv6). RoCEv2 has no packet between the two.
bool wirePath(const ibv_gid &sgid, const ibv_gid &dgid, bool ipv6);

// RoCEv2's UDP source port for a QP (rdma_flow_label_to_udp_sport of the GRH's flow label, or of
// the QP number when the flow label is 0, as rdma_rxe does): 0xc000 and up.
uint16_t roceSourcePort(uint32_t flow_label, uint32_t qpn);

// One message of a requester on the wire: its WQE, which stays in its SQ slot until its CI
// passes (SPEC.md §1.1), and its PSNs.
struct WireMsg {
    softnda_wqe hdr{};   // what its completion needs (wr_id, opcode, flags)
    uint32_t index = 0;  // its SQ index
    uint32_t first_psn = 0, next_psn = 0;
    // Packets known to have arrived (a sequence or RNR NAK inside it), or the READ responses taken.
    uint32_t progress = 0;
    uint64_t total = 0;
    bool done = false;
    uint8_t status = 0;
    uint32_t byte_len = 0;
};

// How many messages a requester keeps on the wire (rxe's window is larger; SPEC.md §18).
inline constexpr uint32_t kWireWindow = 16;

// A connected QP whose destination GID is on another host (SPEC.md §18): its path, and the state
// of each side of its transport. Requester fields are under mu (the SQ's engine thread starts,
// retires and retransmits; the wire thread records acknowledgements); responder fields are under
// the QP's rq_lock.
struct WireQp {
    ibv_gid src{}, dst{};   // as WireOut's
    uint8_t transport = 0;  // the opcodes' transport bits: roce::kRc, kUc or kXrc (both XRC ends)
    uint16_t sport = 0;
    uint32_t flow = 0;
    uint8_t tos = 0, ttl = 0;  // from the address vector's GRH, as WireOut's

    std::mutex mu;
    // The requester: messages [head, head + count) of window, oldest first, in SQ order from CI;
    // sent is the SQ index of the next WQE to start, send_psn its first PSN.
    WireMsg window[kWireWindow];
    uint32_t head = 0, count = 0;
    uint32_t sent = 0, send_psn = 0;
    bool blocked = false;      // a WQE failed its local checks: none after it starts
    bool resend = false;       // go back: a NAK or a gap asked for packets again
    uint32_t rerequested = 0;  // the PSN a gap last asked for again (once per gap)
    uint64_t deadline_ns = 0;  // the local ACK timeout of the oldest message
    uint64_t rnr_until_ns = 0;
    uint32_t retries = 0, rnr_retries = 0;
    uint64_t retransmits = 0;
    WireMsg &at(uint32_t i) { return window[(head + i) % kWireWindow]; }

    // The responder: the message in progress after a FIRST packet.
    uint32_t msn = 0;
    bool nak_sent = false;  // a sequence NAK is out; no other until the expected PSN comes
    uint8_t in_kind = 0;    // 0 none, 1 a SEND, 2 an RDMA WRITE
    uint64_t in_va = 0, in_len = 0, in_off = 0;
    uint32_t in_rkey = 0;
    uint32_t in_srqn = 0;  // the SRQ an XRC message's first packet named (0 on RC and UC)
    bool in_recv = false;
    uint64_t recv_wr_id = 0;
    uint32_t recv_num_sge = 0;
    softnda_sge recv_sge[kEngineMaxSge]{};
    // The results of the last atomics, by PSN: a repeated request is answered from here, never
    // executed twice (IBTA o9-28; the responder resources of max_dest_rd_atomic).
    struct AtomicResult {
        bool valid = false;
        uint32_t psn = 0;
        uint64_t orig = 0;
    };
    AtomicResult atomics[kSavedAtomics];  // a copy in the QP's records (persistAtomic)
    uint32_t atomic_next = 0;
};

// The QP types a connection to another host is made for: RC, UC, and both ends of XRC.
inline bool wireConnectable(ibv_qp_type t) {
    return t == IBV_QPT_RC || t == IBV_QPT_UC || t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV;
}

// Makes qp's wire state follow its address vector (gate held exclusively): a connected QP
// (wireConnectable) of an Ethernet device whose destination GID is not the device's own gets
// one, any other QP none.
void bindWire(Device *dev, Qp *qp);
// Forgets what qp's transport had in flight (a RESET or an ERR; gate held), its saved atomic
// results with it.
void resetWire(Qp *qp);
// An imported QP's wire takes up the atomic results its records saved (SPEC.md §18 "Restart").
void restoreSavedAtomics(Qp *qp);

// An SRQ receive a message still arriving over the wire holds (SPEC.md §10, §18): recorded in
// qp's SQ record (kSqHeldWord), so a successor serves the message's retransmission with it;
// let go (gate held) when the message ends, the QP is reset or destroyed; taken up again by an
// import (the device paused), or dropped when its SRQ no longer has it.
void holdSrqRecv(Qp *qp, const Srq &srq, uint32_t index);
void releaseSrqRecv(Qp *qp);
void reholdSrqRecv(Qp *qp);

}  // namespace softnda
