// RoCEv2 to other hosts (SPEC.md §18): the broker's UDP socket, and the RC requester and
// responder that speak the IBTA transport over it, as rdma_rxe does (rxe_req.c, rxe_resp.c,
// rxe_comp.c). The engine thread that owns a QP's SQ starts and retransmits its messages; the
// device's wire thread receives every packet, answers requests and records acknowledgements.
#include "providers/softnda/src/wire.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "providers/softnda/src/engine_thread.h"
#include "providers/softnda/src/netdev.h"

namespace softnda {
namespace {

// Linux's IPv6 flow label options (linux/in6.h, stable UAPI), which glibc's netinet/in.h lacks
// and which linux/in6.h leaves out when netinet/in.h came first.
constexpr int kIpv6FlowInfo = 11;      // IPV6_FLOWINFO: the flow label of what arrives, as a message
constexpr int kIpv6FlowInfoSend = 33;  // IPV6_FLOWINFO_SEND: sin6_flowinfo's label goes out
constexpr uint32_t kFlowLabelMask = 0x000fffff;

constexpr size_t kMaxFrame = 4096 + 128;  // the largest path MTU's packet, headers included
constexpr size_t kRxBatch = 32;
constexpr size_t kTxBatch = 32;

// AETH syndromes (IBTA 9.7.5.2.1): the top bits say ACK, RNR NAK or NAK.
constexpr uint8_t kAckSyndrome = 0x1f;  // ACK with "invalid" credits: no end-to-end flow control
constexpr uint8_t kRnrNak = 0x20;
constexpr uint8_t kNak = 0x60;
constexpr uint8_t kNakPsnSeq = 0x60, kNakInvReq = 0x61, kNakRemAccess = 0x62, kNakRemOp = 0x63;

// A datagram's header for sendmmsg/recvmmsg: one buffer, one peer address, room for control
// messages.
msghdr oneBufferMsg(void *addr, socklen_t addr_len, iovec *iov, void *ctl, size_t ctl_len) {
    msghdr h{};
    h.msg_name = addr;
    h.msg_namelen = addr_len;
    h.msg_iov = iov;
    h.msg_iovlen = 1;
    h.msg_control = ctl;
    h.msg_controllen = ctl_len;
    return h;
}

uint32_t psnAdd(uint32_t a, uint32_t n) {
    return (a + n) & kPsnMask;
}
// a - b in the 24-bit PSN space.
uint32_t psnDiff(uint32_t a, uint32_t b) {
    return (a - b) & kPsnMask;
}
// Whether a comes before b (within half the PSN space).
bool psnBefore(uint32_t a, uint32_t b) {
    uint32_t d = psnDiff(b, a);
    return d != 0 && d < 0x800000;
}

uint8_t nakOf(uint8_t status) {
    switch (status) {
        case IBV_WC_REM_ACCESS_ERR:
            return kNakRemAccess;
        case IBV_WC_REM_OP_ERR:
            return kNakRemOp;
        default:
            return kNakInvReq;
    }
}

uint8_t statusOfNak(uint8_t syndrome) {
    switch (syndrome) {
        case kNakRemAccess:
            return IBV_WC_REM_ACCESS_ERR;
        case kNakRemOp:
            return IBV_WC_REM_OP_ERR;
        default:
            return IBV_WC_REM_INV_REQ_ERR;
    }
}

// The UDP header of a datagram of udp_payload bytes, its checksum 0 (the ICRC masks it).
void udpHeader(uint16_t sport, uint16_t dport, size_t udp_payload, uint8_t udp[roce::kUdpLen]) {
    const size_t udp_len = roce::kUdpLen + udp_payload;
    udp[0] = static_cast<uint8_t>(sport >> 8);
    udp[1] = static_cast<uint8_t>(sport);
    udp[2] = static_cast<uint8_t>(dport >> 8);
    udp[3] = static_cast<uint8_t>(dport);
    udp[4] = static_cast<uint8_t>(udp_len >> 8);
    udp[5] = static_cast<uint8_t>(udp_len);
    udp[6] = udp[7] = 0;
}

// The IPv4 header the kernel writes for a UDP datagram of udp_payload bytes from this socket: DF
// set (IP_PMTUDISC_DO) and, the socket being unconnected, identification 0 (ip_select_ident).
// The ICRC covers it, TOS, TTL and the checksum masked; TOS and TTL here are 0.
void ipv4Header(uint32_t src, uint32_t dst, size_t udp_payload, uint8_t ip[roce::kIpv4Len]) {
    const size_t ip_len = roce::kIpv4Len + roce::kUdpLen + udp_payload;
    std::memset(ip, 0, roce::kIpv4Len);
    ip[0] = 0x45;
    ip[2] = static_cast<uint8_t>(ip_len >> 8);
    ip[3] = static_cast<uint8_t>(ip_len);
    ip[6] = 0x40;  // DF
    ip[9] = IPPROTO_UDP;
    std::memcpy(ip + 12, &src, 4);
    std::memcpy(ip + 16, &dst, 4);
}

// The IPv6 header of such a datagram: no extension header, next header UDP; traffic class, flow
// label and hop limit 0 here (the ICRC masks them).
void ipv6Header(const ibv_gid &src, const ibv_gid &dst, size_t udp_payload, uint8_t ip6[roce::kIpv6Len]) {
    const size_t payload_len = roce::kUdpLen + udp_payload;
    std::memset(ip6, 0, roce::kIpv6Len);
    ip6[0] = 0x60;
    ip6[4] = static_cast<uint8_t>(payload_len >> 8);
    ip6[5] = static_cast<uint8_t>(payload_len);
    ip6[6] = IPPROTO_UDP;
    std::memcpy(ip6 + 8, src.raw, sizeof(src.raw));
    std::memcpy(ip6 + 24, dst.raw, sizeof(dst.raw));
}

// The ICRC of a RoCE packet (the whole UDP payload, its ICRC last) from src to dst, over the
// headers the kernel writes for it: IPv4 between IPv4-mapped GIDs, IPv6 otherwise.
uint32_t wireIcrc(const ibv_gid &src, const ibv_gid &dst, uint16_t sport, uint16_t dport,
                  std::span<const uint8_t> packet) {
    uint8_t udp[roce::kUdpLen];
    udpHeader(sport, dport, packet.size(), udp);
    const auto body = packet.first(packet.size() - roce::kIcrcLen);
    uint32_t s4 = 0, d4 = 0;
    if (ipv4OfGid(src, &s4) && ipv4OfGid(dst, &d4)) {
        uint8_t ip[roce::kIpv4Len];
        ipv4Header(s4, d4, packet.size(), ip);
        return roce::icrcIpv4(ip, udp, body);
    }
    uint8_t ip6[roce::kIpv6Len];
    ipv6Header(src, dst, packet.size(), ip6);
    return roce::icrcIpv6(ip6, udp, body);
}

// The GRH a UD receive on a RoCE device gets, as rdma_rxe writes it (rxe_resp.c): for a packet
// between IPv4 GIDs, 20 zero bytes and then the packet's IPv4 header (its TOS, TTL and checksum
// as they arrived); between IPv6 GIDs, the IPv6 header (next header UDP; traffic class, flow label
// and hop limit as they arrived). udp_payload is the
// RoCE packet's length. Returns which it wrote, as the CQE says it (SOFTNDA_CQE_ROCE_IPV4 or _IPV6).
uint8_t roceGrh(uint8_t grh[SOFTNDA_GRH_SIZE], const ibv_gid &sgid, const ibv_gid &dgid, size_t udp_payload,
                uint8_t tos, uint8_t ttl, uint32_t flow) {
    std::memset(grh, 0, SOFTNDA_GRH_SIZE);
    uint32_t src = 0, dst = 0;
    if (ipv4OfGid(sgid, &src) && ipv4OfGid(dgid, &dst)) {
        uint8_t *ip = grh + SOFTNDA_GRH_SIZE - roce::kIpv4Len;
        ipv4Header(src, dst, udp_payload, ip);
        ip[1] = tos;
        ip[8] = ttl;
        uint32_t sum = 0;
        for (size_t i = 0; i < roce::kIpv4Len; i += 2) {
            sum += static_cast<uint32_t>(ip[i] << 8 | ip[i + 1]);
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = ~((sum & 0xffff) + (sum >> 16)) & 0xffff;
        ip[10] = static_cast<uint8_t>(sum >> 8);
        ip[11] = static_cast<uint8_t>(sum);
        return SOFTNDA_CQE_ROCE_IPV4;
    }
    ipv6Header(sgid, dgid, udp_payload, grh);
    grh[0] = static_cast<uint8_t>(0x60 | tos >> 4);
    grh[1] = static_cast<uint8_t>(tos << 4 | (flow >> 16 & 0xf));
    grh[2] = static_cast<uint8_t>(flow >> 8);
    grh[3] = static_cast<uint8_t>(flow);
    grh[7] = ttl;
    return SOFTNDA_CQE_ROCE_IPV6;
}

// The TTL of a packet whose hop limit is 0: Linux's default (net.ipv4.ip_default_ttl).
constexpr uint8_t kDefaultTtl = 64;

}  // namespace

int parseWireFaults(const std::string &value, WireFaults *out) {
    WireFaults f;
    bool seen[4] = {};
    std::stringstream ss(value);
    std::string item;
    while (std::getline(ss, item, ',')) {
        if (item.empty() && value.empty()) {
            break;
        }
        auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
            return -EINVAL;
        }
        const std::string key = item.substr(0, eq), num = item.substr(eq + 1);
        const char *keys[] = {"drop", "dup", "reorder", "seed"};
        int k = 0;
        while (k < 4 && key != keys[k]) {
            ++k;
        }
        if (k == 4 || seen[k]) {
            return -EINVAL;
        }
        seen[k] = true;
        char *end = nullptr;
        errno = 0;
        if (k == 3) {
            if (num.find_first_not_of("0123456789") != std::string::npos || num.size() > 19) {
                return -EINVAL;
            }
            f.seed = std::strtoull(num.c_str(), &end, 10);
            continue;
        }
        double p = std::strtod(num.c_str(), &end);
        if (errno != 0 || end == nullptr || *end != '\0' || !(p >= 0 && p < 1)) {
            return -EINVAL;
        }
        (k == 0 ? f.drop : k == 1 ? f.dup : f.reorder) = p;
    }
    *out = f;
    return 0;
}

bool ipv4OfGid(const ibv_gid &gid, uint32_t *ip_be) {
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(gid.raw, prefix, sizeof(prefix)) != 0) {
        return false;
    }
    std::memcpy(ip_be, gid.raw + 12, 4);
    return true;
}

bool wirePath(const ibv_gid &sgid, const ibv_gid &dgid, bool ipv6) {
    uint32_t v4 = 0;
    const bool s4 = ipv4OfGid(sgid, &v4), d4 = ipv4OfGid(dgid, &v4);
    return s4 == d4 && (s4 || ipv6);
}

uint16_t roceSourcePort(uint32_t flow_label, uint32_t qpn) {
    if (flow_label == 0) {
        // rdma_calc_flow_label: the QP numbers' hash; rxe folds the QP number alone.
        uint64_t v = uint64_t{qpn} * 0x9e3779b97f4a7c15ull;
        flow_label = static_cast<uint32_t>(v >> 44) & 0xfffff;
    }
    uint32_t low = flow_label & 0x3fff, high = flow_label & 0xfc000;
    low ^= high >> 14;
    return static_cast<uint16_t>(low | 0xc000);
}

// ---------------------------------------------------------------------------------------------
// The socket

WireSocket::WireSocket(int fd, int family, uint32_t ifindex, uint16_t port, const WireFaults &faults)
    : fd_(fd),
      family_(family),
      ifindex_(ifindex),
      port_(port),
      faults_(faults),
      rng_(faults.seed),
      rx_buf_(kRxBatch * kMaxFrame),
      sources_(new std::atomic<int>[65536]) {
    for (size_t i = 0; i < 65536; ++i) {
        sources_[i].store(kUnopened, std::memory_order_relaxed);
    }
}

WireSocket::~WireSocket() {
    for (size_t i = 0; i < 65536; ++i) {
        if (int fd = sources_[i].load(std::memory_order_relaxed); fd >= 0) {
            ::close(fd);
        }
    }
    ::close(fd_);
}

namespace {

// A UDP socket of family bound to port on ifname (SO_BINDTODEVICE: a broker per network
// namespace, or per interface, has its own; an unbound socket may take the device since Linux 5.7
// without CAP_NET_RAW), sending DF (as rxe sends; the ICRC covers the flag) with the address
// vector's flow label (IPV6_FLOWINFO_SEND; no automatic one, so a flow label of 0 goes out as 0),
// and with larger buffers where the host allows them. The fd, or -errno.
int wireSocket(int family, const std::string &ifname, uint16_t port) {
    int fd = ::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return -errno;
    }
    int one = 1, zero = 0;
    int pmtu = IP_PMTUDISC_DO, pmtu6 = IPV6_PMTUDISC_DO;
    int buf = 4 << 20;
    // No multicast loop: a group's members on this host have their copies through shared memory
    // (SPEC.md §11.3), so one looped back would arrive twice.
    bool ok = ::setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, ifname.c_str(),
                           static_cast<socklen_t>(ifname.size())) == 0 &&
              ::setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof(pmtu)) == 0 &&
              ::setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof(zero)) == 0;
    if (ok && family == AF_INET6) {
        ok = ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero)) == 0 &&
             ::setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu6, sizeof(pmtu6)) == 0 &&
             ::setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &zero, sizeof(zero)) == 0;
        // Where the flow label options are refused (ENOPROTOOPT: qemu-user does not emulate
        // them) packets go with the kernel's label, which is harmless: the ICRC masks the label,
        // and no receiver checks it.
        (void)::setsockopt(fd, IPPROTO_IPV6, kIpv6FlowInfoSend, &one, sizeof(one));
        (void)::setsockopt(fd, IPPROTO_IPV6, IPV6_AUTOFLOWLABEL, &zero, sizeof(zero));
    }
    if (!ok) {
        int e = errno;
        ::close(fd);
        return -e;
    }
    (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
    sockaddr_in6 sa6{};
    sockaddr_in sa{};
    int rc = 0;
    if (family == AF_INET6) {
        sa6.sin6_family = AF_INET6;
        sa6.sin6_port = htons(port);
        sa6.sin6_addr = in6addr_any;
        rc = ::bind(fd, reinterpret_cast<sockaddr *>(&sa6), sizeof(sa6));
    } else {
        sa.sin_family = AF_INET;
        sa.sin_port = htons(port);
        sa.sin_addr.s_addr = htonl(INADDR_ANY);
        rc = ::bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa));
    }
    if (rc < 0) {
        int e = errno;
        ::close(fd);
        return -e;
    }
    return fd;
}

}  // namespace

int WireSocket::open(const std::string &ifname, uint16_t port, const WireFaults &faults,
                     std::unique_ptr<WireSocket> *out) {
    // One IPv6 socket for both families (IPv4 arrives and leaves IPv4-mapped), so one thread
    // receives everything; an IPv4 one where the host has no IPv6.
    int family = AF_INET6;
    int fd = wireSocket(AF_INET6, ifname, port);
    if (fd == -EAFNOSUPPORT) {
        family = AF_INET;
        fd = wireSocket(AF_INET, ifname, port);
    }
    if (fd < 0) {
        return fd;
    }
    // IP_RECVTOS and IP_RECVTTL (IPV6_RECVTCLASS, IPV6_RECVHOPLIMIT and IPV6_FLOWINFO): a UD
    // receive's GRH holds the packet's IP header (SPEC.md §18). IPV6_RECVPKTINFO (IP_PKTINFO on
    // an IPv4 socket): the destination address the ICRC covers; an IPv6 socket gives it
    // IPv4-mapped for an IPv4 packet too, so asking IP_PKTINFO there would only add a second copy
    // to every packet.
    int one = 1;
    if ((family == AF_INET && ::setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) < 0) ||
        ::setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)) < 0 ||
        ::setsockopt(fd, IPPROTO_IP, IP_RECVTTL, &one, sizeof(one)) < 0 ||
        (family == AF_INET6 && (::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof(one)) < 0 ||
                                ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one)) < 0 ||
                                ::setsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof(one)) < 0))) {
        int e = errno;
        ::close(fd);
        return -e;
    }
    // The flow labels: sent and received where the host takes both options (wireSocket).
    int flowinfo_send = 0;
    socklen_t len = sizeof(flowinfo_send);
    const bool flow_labels =
        family == AF_INET6 && ::getsockopt(fd, IPPROTO_IPV6, kIpv6FlowInfoSend, &flowinfo_send, &len) == 0 &&
        flowinfo_send != 0 && ::setsockopt(fd, IPPROTO_IPV6, kIpv6FlowInfo, &one, sizeof(one)) == 0;
    out->reset(new WireSocket(fd, family, if_nametoindex(ifname.c_str()), port, faults));
    (*out)->ifname_ = ifname;
    (*out)->flow_labels_ = flow_labels;
    return 0;
}

WireSocket::Sender WireSocket::sender(uint16_t sport) {
    if (sport == 0 || sport == port_) {
        return Sender{fd_, port_};
    }
    int fd = sources_[sport].load(std::memory_order_acquire);
    if (fd == kUnopened) {
        std::lock_guard<std::mutex> lk(sources_mu_);
        fd = sources_[sport].load(std::memory_order_relaxed);
        if (fd == kUnopened) {
            fd = source_ports.load(std::memory_order_relaxed) < kMaxSourcePorts
                     ? wireSocket(family_, ifname_, sport)
                     : -ENFILE;
            if (fd >= 0) {
                // Send-only: nothing sent to this port is wanted (RoCEv2 peers answer to 4791),
                // so a filter that accepts nothing keeps its receive queue empty.
                sock_filter none{BPF_RET | BPF_K, 0, 0, 0};
                sock_fprog prog{1, &none};
                (void)::setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof(prog));
                source_ports.fetch_add(1, std::memory_order_relaxed);  // written under sources_mu_ only
            } else {
                fd = kRefused;  // EADDRINUSE (another socket has it), or past kMaxSourcePorts
            }
            sources_[sport].store(fd, std::memory_order_release);
        }
    }
    return fd == kRefused ? Sender{fd_, port_} : Sender{fd, sport};
}

void WireSocket::stop() {
    ::shutdown(fd_, SHUT_RD);  // wakes the receiving thread: its recvmmsg returns 0
}

namespace {

// Joins (or leaves) fd's membership of the IP multicast group of MGID gid on ifindex.
int groupMembership(int fd, int family, uint32_t ifindex, const ibv_gid &gid, bool join) {
    uint32_t v4 = 0;
    int rc = 0;
    if (ipv4OfGid(gid, &v4)) {
        ip_mreqn m{};
        m.imr_multiaddr.s_addr = v4;
        m.imr_ifindex = static_cast<int>(ifindex);
        rc = ::setsockopt(fd, IPPROTO_IP, join ? IP_ADD_MEMBERSHIP : IP_DROP_MEMBERSHIP, &m, sizeof(m));
    } else if (family != AF_INET6) {
        return -EAFNOSUPPORT;
    } else {
        ipv6_mreq m{};
        std::memcpy(&m.ipv6mr_multiaddr, gid.raw, sizeof(gid.raw));
        m.ipv6mr_interface = ifindex;
        rc = ::setsockopt(fd, IPPROTO_IPV6, join ? IPV6_JOIN_GROUP : IPV6_LEAVE_GROUP, &m, sizeof(m));
    }
    return rc == 0 ? 0 : -errno;
}

}  // namespace

int WireSocket::joinGroup(const ibv_gid &gid) {
    int rc = groupMembership(fd_, family_, ifindex_, gid, true);
    return rc == -EADDRINUSE ? 0 : rc;  // a member already
}

void WireSocket::leaveGroup(const ibv_gid &gid) {
    (void)groupMembership(fd_, family_, ifindex_, gid, false);  // EADDRNOTAVAIL: not a member
}

void WireSocket::send(std::span<const WireOut> out) {
    uint8_t bufs[kTxBatch][kMaxFrame];
    const uint8_t *ptrs[kTxBatch + 2];
    size_t lens[kTxBatch + 2];
    const WireOut *to[kTxBatch + 2];
    size_t i = 0;
    while (i < out.size()) {
        size_t n = 0;
        for (; n < kTxBatch && i < out.size(); ++i) {
            const WireOut &o = out[i];
            if (!ipv6() && !wirePath(o.src, o.dst, false)) {
                continue;  // an IPv6 path (a QP a restart brought from a host with IPv6): no way out
            }
            size_t len = roce::encode(o.pkt, std::span<uint8_t>(bufs[n], kMaxFrame));
            // The source port the packet leaves from is the one its ICRC covers.
            const std::span<uint8_t> packet(bufs[n], len);
            roce::storeIcrc(wireIcrc(o.src, o.dst, sender(o.sport).port, port_, packet), packet);
            ptrs[n] = bufs[n];
            lens[n] = len;
            to[n] = &o;
            ++n;
        }
        transmit(ptrs, lens, to, n);
    }
}

// Sends n encoded packets, through the fault hook when one is configured.
void WireSocket::transmit(const uint8_t *const *bufs, const size_t *lens, const WireOut *const *to,
                          size_t n) {
    const uint8_t *pb[kTxBatch * 2 + 1];
    size_t pl[kTxBatch * 2 + 1];
    const WireOut *pt[kTxBatch * 2 + 1];
    size_t m = 0;
    std::vector<uint8_t> release;  // a packet held back by an earlier reorder, sent after this one
    WireOut release_to;
    std::unique_lock<std::mutex> lk(fault_mu_, std::defer_lock);
    if (faults_.any()) {
        lk.lock();
    }
    for (size_t i = 0; i < n; ++i) {
        if (faults_.any()) {
            std::uniform_real_distribution<double> u(0, 1);
            if (u(rng_) < faults_.drop) {
                fault_drops.fetch_add(1, std::memory_order_relaxed);
                continue;
            }
            if (held_.empty() && u(rng_) < faults_.reorder) {
                held_.assign(bufs[i], bufs[i] + lens[i]);
                held_to_ = *to[i];
                continue;
            }
            pb[m] = bufs[i];
            pl[m] = lens[i];
            pt[m++] = to[i];
            if (u(rng_) < faults_.dup) {
                pb[m] = bufs[i];
                pl[m] = lens[i];
                pt[m++] = to[i];
            }
            if (!held_.empty() && release.empty()) {
                release.swap(held_);
                release_to = held_to_;
                pb[m] = release.data();
                pl[m] = release.size();
                pt[m++] = &release_to;
            }
            continue;
        }
        pb[m] = bufs[i];
        pl[m] = lens[i];
        pt[m++] = to[i];
    }
    mmsghdr msgs[kTxBatch * 2 + 1];
    int fds[kTxBatch * 2 + 1];
    iovec iov[kTxBatch * 2 + 1];
    sockaddr_in6 dst[kTxBatch * 2 + 1];
    alignas(cmsghdr)
        uint8_t ctl[kTxBatch * 2 + 1][CMSG_SPACE(sizeof(in6_pktinfo)) + 2 * CMSG_SPACE(sizeof(int))];
    for (size_t k = 0; k < m; ++k) {
        const WireOut &o = *pt[k];
        fds[k] = sender(o.sport).fd;
        iov[k] = iovec{const_cast<uint8_t *>(pb[k]), pl[k]};
        uint32_t v4 = 0;
        const bool ipv4 = ipv4OfGid(o.dst, &v4);
        size_t used = 0;
        // Control messages placed by hand: CMSG_NXTHDR would read the next one's length from the
        // buffer.
        auto add = [&](int level, int type, const void *data, size_t len) {
            auto *c = reinterpret_cast<cmsghdr *>(ctl[k] + used);
            c->cmsg_level = level;
            c->cmsg_type = type;
            c->cmsg_len = CMSG_LEN(len);
            std::memcpy(CMSG_DATA(c), data, len);
            used += CMSG_SPACE(len);
        };
        msghdr &h = msgs[k].msg_hdr;
        dst[k] = sockaddr_in6{};
        if (family_ == AF_INET) {
            auto *sa = reinterpret_cast<sockaddr_in *>(&dst[k]);
            sa->sin_family = AF_INET;
            sa->sin_port = htons(port_);
            sa->sin_addr.s_addr = v4;
            h = oneBufferMsg(sa, sizeof(sockaddr_in), &iov[k], ctl[k], sizeof(ctl[k]));
        } else {
            dst[k].sin6_family = AF_INET6;
            dst[k].sin6_port = htons(port_);
            std::memcpy(&dst[k].sin6_addr, o.dst.raw, sizeof(o.dst.raw));
            // A link-local destination, or a link-local multicast group, is reached on this
            // interface.
            if (IN6_IS_ADDR_LINKLOCAL(&dst[k].sin6_addr) || IN6_IS_ADDR_MC_LINKLOCAL(&dst[k].sin6_addr)) {
                dst[k].sin6_scope_id = ifindex_;
            }
            if (!ipv4 && flow_labels_) {
                dst[k].sin6_flowinfo = htonl(o.flow & kFlowLabelMask);
            }
            h = oneBufferMsg(&dst[k], sizeof(sockaddr_in6), &iov[k], ctl[k], sizeof(ctl[k]));
        }
        // The source address the ICRC was computed with, whatever the route would pick.
        if (family_ == AF_INET) {
            in_pktinfo pi{};
            ipv4OfGid(o.src, &pi.ipi_spec_dst.s_addr);
            add(IPPROTO_IP, IP_PKTINFO, &pi, sizeof(pi));
        } else {
            in6_pktinfo pi{};  // an IPv4-mapped source for an IPv4 packet, as the kernel takes it
            std::memcpy(&pi.ipi6_addr, o.src.raw, sizeof(o.src.raw));
            add(IPPROTO_IPV6, IPV6_PKTINFO, &pi, sizeof(pi));
        }
        // The GRH's traffic class and hop limit, per packet (the socket is every QP's); the
        // defaults (0, and the host's TTL) need no message. The ICRC masks both fields.
        const int tos = o.tos, ttl = o.ttl;
        if (tos != 0) {
            add(ipv4 ? IPPROTO_IP : IPPROTO_IPV6, ipv4 ? IP_TOS : IPV6_TCLASS, &tos, sizeof(tos));
        }
        if (ttl != 0) {
            add(ipv4 ? IPPROTO_IP : IPPROTO_IPV6, ipv4 ? IP_TTL : IPV6_HOPLIMIT, &ttl, sizeof(ttl));
        }
        h.msg_controllen = used;
        msgs[k].msg_len = 0;
    }
    // Sent with the fault lock held, so the hook's order is the wire's order: each run of packets
    // from one source port in one call.
    size_t done = 0;
    while (done < m) {
        size_t run = 1;
        while (done + run < m && fds[done + run] == fds[done]) {
            ++run;
        }
        int rc = ::sendmmsg(fds[done], msgs + done, static_cast<unsigned>(run), 0);
        if (rc < 0) {
            auto *to6 = static_cast<sockaddr_in6 *>(msgs[done].msg_hdr.msg_name);
            if (errno == EINTR) {
                continue;
            }
            if (errno == EINVAL && family_ == AF_INET6 && to6->sin6_flowinfo != 0) {
                // A flow label the kernel refuses (some socket in the namespace leased labels
                // exclusively, and this one is not leased): sent without it.
                to6->sin6_flowinfo = 0;
                continue;
            }
            // ENOBUFS, EAGAIN, a route gone: the packets are lost, which the transport repairs.
            done++;
            continue;
        }
        done += static_cast<size_t>(rc);
    }
    sent.fetch_add(m, std::memory_order_relaxed);
}

size_t WireSocket::receive(std::span<WireFrame> frames) {
    const size_t want = std::min(frames.size(), kRxBatch);
    mmsghdr msgs[kRxBatch];
    iovec iov[kRxBatch];
    sockaddr_in6 src[kRxBatch];
    // IPv6 packets bring IPV6_PKTINFO, TCLASS, HOPLIMIT and, when not 0, FLOWINFO; IPv4 ones
    // IPV6_PKTINFO (IP_PKTINFO on an IPv4 socket), TOS and TTL.
    alignas(cmsghdr) uint8_t ctl[kRxBatch][CMSG_SPACE(sizeof(in6_pktinfo)) + 3 * CMSG_SPACE(sizeof(int))];
    for (size_t i = 0; i < want; ++i) {
        iov[i] = iovec{rx_buf_.data() + i * kMaxFrame, kMaxFrame};
        msgs[i].msg_hdr = oneBufferMsg(&src[i], sizeof(src[i]), &iov[i], ctl[i], sizeof(ctl[i]));
    }
    // Blocks for the first packet only, then takes what else is queued.
    int rc = ::recvmmsg(fd_, msgs, static_cast<unsigned>(want), MSG_WAITFORONE, nullptr);
    if (rc <= 0) {
        return 0;
    }
    size_t n = 0;
    for (int i = 0; i < rc; ++i) {
        const msghdr &h = msgs[i].msg_hdr;
        if ((h.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || msgs[i].msg_len == 0) {
            malformed.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        WireFrame &f = frames[n];
        f.data = rx_buf_.data() + static_cast<size_t>(i) * kMaxFrame;
        f.len = msgs[i].msg_len;
        if (src[i].sin6_family == AF_INET6) {
            std::memcpy(f.src.raw, &src[i].sin6_addr, sizeof(f.src.raw));
            f.sport = ntohs(src[i].sin6_port);
        } else {
            const auto *sa = reinterpret_cast<const sockaddr_in *>(&src[i]);
            f.src = ipv4Gid(sa->sin_addr.s_addr);
            f.sport = ntohs(sa->sin_port);
        }
        f.dport = port_;
        f.dst = ibv_gid{};
        f.tos = 0;
        f.ttl = 0;
        f.flow = 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(const_cast<msghdr *>(&h)); c != nullptr;
             c = CMSG_NXTHDR(const_cast<msghdr *>(&h), c)) {
            int value = 0;
            if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
                in_pktinfo pi;
                std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
                f.dst = ipv4Gid(pi.ipi_addr.s_addr);
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO) {
                in6_pktinfo pi;
                std::memcpy(&pi, CMSG_DATA(c), sizeof(pi));
                std::memcpy(f.dst.raw, &pi.ipi6_addr, sizeof(f.dst.raw));
            } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) {
                f.tos = *CMSG_DATA(c);  // one byte
            } else if ((c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TTL) ||
                       (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_HOPLIMIT)) {
                std::memcpy(&value, CMSG_DATA(c), sizeof(value));
                f.ttl = static_cast<uint8_t>(value);
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS) {
                std::memcpy(&value, CMSG_DATA(c), sizeof(value));
                f.tos = static_cast<uint8_t>(value);
            } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == kIpv6FlowInfo) {
                uint32_t flowinfo = 0;  // network order: traffic class and flow label
                std::memcpy(&flowinfo, CMSG_DATA(c), sizeof(flowinfo));
                f.flow = ntohl(flowinfo) & kFlowLabelMask;
            }
        }
        ++n;
    }
    received.fetch_add(n, std::memory_order_relaxed);
    return n;
}

// ---------------------------------------------------------------------------------------------
// QPs

void bindWire(Device *dev, Qp *qp) {
    // Without a wire, a receive held for a message of the old path would never be let go (gate
    // held exclusively: no responder runs).
    auto unbind = [qp] {
        releaseSrqRecv(qp);
        qp->wire.reset();
    };
    const ibv_ah_attr &ah = qp->attrs.ah;
    const ibv_qp_type type = qp->init.qp_type;
    if (!dev->netdev || !ah.is_global || !wireConnectable(type)) {
        unbind();
        return;
    }
    Netdev &nd = *dev->netdev;
    std::optional<ibv_gid> sgid;
    {
        std::lock_guard<std::mutex> lk(nd.mu);
        if (nd.table.contains(ah.grh.dgid)) {
            unbind();  // a queue of this host: shared memory, no wire
            return;
        }
        sgid = nd.table.at(ah.grh.sgid_index);
    }
    if (!sgid || !wirePath(*sgid, ah.grh.dgid, true)) {
        unbind();  // checkRocePath refused it; an imported QP whose address went away
        return;
    }
    if (!qp->wire) {
        qp->wire.reset(new WireQp);
    }
    qp->wire->src = *sgid;
    qp->wire->dst = ah.grh.dgid;
    qp->wire->transport = type == IBV_QPT_UC ? roce::kUc : type == IBV_QPT_RC ? roce::kRc : roce::kXrc;
    qp->wire->tos = ah.grh.traffic_class;
    qp->wire->ttl = ah.grh.hop_limit;
    qp->wire->flow = ah.grh.flow_label & kFlowLabelMask;
    qp->wire->sport = qp->attrs.udp_src_port != 0 ? static_cast<uint16_t>(qp->attrs.udp_src_port)
                                                  : roceSourcePort(ah.grh.flow_label, qp->qpn);
}

namespace {

// The receive the message in progress fills (and completes at its end).
void keepRecv(WireQp &wq, const RecvCopy &r) {
    wq.in_recv = true;
    wq.recv_wr_id = r.wr_id;
    wq.recv_num_sge = r.num_sge;
    std::memcpy(wq.recv_sge, r.sge, std::min(r.num_sge, kEngineMaxSge) * sizeof(softnda_sge));
}

// The SRQ a receive qp holds came from: its own, or at an XRC target the XRC SRQ of its domain
// the record names (nullptr when there is none any more).
Srq *heldSrq(const Qp *qp) {
    if (qp->init.qp_type != IBV_QPT_XRC_RECV) {
        return qp->srq;
    }
    const auto &srqs = qp->ctx->dev->xrc_srqs;
    auto it = srqs.find(__atomic_load_n(qp->recWord(kSqHeldSrqnWord), __ATOMIC_ACQUIRE));
    return it != srqs.end() && it->second->xrcd == qp->xrcd ? it->second : nullptr;
}

}  // namespace

void holdSrqRecv(Qp *qp, const Srq &srq, uint32_t index) {
    __atomic_store_n(qp->recWord(kSqHeldIndexWord), index, __ATOMIC_RELAXED);
    __atomic_store_n(qp->recWord(kSqHeldSrqnWord), srq.srqn, __ATOMIC_RELAXED);
    __atomic_store_n(qp->recWord(kSqHeldWord), 1u, __ATOMIC_RELEASE);
}

void releaseSrqRecv(Qp *qp) {
    if (__atomic_load_n(qp->recWord(kSqHeldWord), __ATOMIC_ACQUIRE) == 0) {
        return;
    }
    const uint32_t index = __atomic_load_n(qp->recWord(kSqHeldIndexWord), __ATOMIC_RELAXED);
    Srq *srq = heldSrq(qp);
    // The record first: a successor must never take up a receive whose slot the CI has passed
    // (a cut between the two leaves the CI behind, which the next take moves on).
    __atomic_store_n(qp->recWord(kSqHeldWord), 0u, __ATOMIC_RELEASE);
    if (srq != nullptr) {
        std::lock_guard<SpinLock> lk(srq->lock);
        auto it = std::find(srq->held.begin(), srq->held.end(), index);
        if (it != srq->held.end()) {
            srq->held.erase(it);
            srq->publishCi();
        }
    }
}

void reholdSrqRecv(Qp *qp) {
    if (__atomic_load_n(qp->recWord(kSqHeldWord), __ATOMIC_ACQUIRE) == 0) {
        return;
    }
    const uint32_t index = __atomic_load_n(qp->recWord(kSqHeldIndexWord), __ATOMIC_RELAXED);
    Srq *srq = heldSrq(qp);
    bool kept = false;
    if (srq != nullptr && qp->wire) {
        std::lock_guard<SpinLock> lk(srq->lock);
        Ring &ring = srq->ring;
        const uint32_t ci = __atomic_load_n(ring.ci, __ATOMIC_ACQUIRE);
        // Taken (before the taken count) and not passed by the CI: the slot is as the take left it.
        if (index - ci < ring.ci_local - ci) {
            RecvCopy r;
            readRecvSlot(ring, index, srq->max_sge, &r);
            keepRecv(*qp->wire, r);
            qp->wire->in_srqn = srq->srqn;
            if (std::find(srq->held.begin(), srq->held.end(), index) == srq->held.end()) {
                srq->held.push_back(index);
            }
            srq->publishCi();
            kept = true;
        }
    }
    if (!kept) {
        __atomic_store_n(qp->recWord(kSqHeldWord), 0u, __ATOMIC_RELEASE);
    }
}

void resetWire(Qp *qp) {
    if (!qp->wire) {
        std::lock_guard<std::mutex> lk(qp->rq_lock);
        releaseSrqRecv(qp);
        clearAtomicRecords(qp);  // results of a wire it had before (re-addressed to this host)
        return;
    }
    WireQp &wq = *qp->wire;
    {
        std::lock_guard<std::mutex> lk(wq.mu);
        wq.head = 0;
        wq.count = 0;
        wq.blocked = false;
        wq.resend = false;
        wq.rnr_until_ns = 0;
    }
    // Under rq_lock, as the responder takes and holds receives (wireRequest).
    std::lock_guard<std::mutex> lk(qp->rq_lock);
    releaseSrqRecv(qp);
    wq.in_kind = 0;
    wq.in_recv = false;
    wq.nak_sent = false;
    // A new connection's PSNs start anew: an old result must not answer one of its requests.
    std::fill(std::begin(wq.atomics), std::end(wq.atomics), WireQp::AtomicResult{});
    wq.atomic_next = 0;
    clearAtomicRecords(qp);
}

void restoreSavedAtomics(Qp *qp) {
    SavedAtomic saved[kSavedAtomics];
    uint32_t next = 0;
    if (!qp->wire || !savedAtomics(qp, saved, &next)) {
        return;
    }
    WireQp &wq = *qp->wire;
    for (uint32_t slot = 0; slot < kSavedAtomics; ++slot) {
        wq.atomics[slot] =
            WireQp::AtomicResult{saved[slot].psn1 != 0, (saved[slot].psn1 - 1) & kPsnMask, saved[slot].orig};
    }
    wq.atomic_next = next;
}

// ---------------------------------------------------------------------------------------------
// The requester (the SQ's engine thread)

namespace {

// len bytes of the segments from offset off, at dst.
void gatherAt(const Segment *seg, uint32_t n, uint64_t off, uint64_t len, uint8_t *dst) {
    for (uint32_t i = 0; i < n && len > 0; ++i) {
        if (off >= seg[i].len) {
            off -= seg[i].len;
            continue;
        }
        uint64_t k = std::min<uint64_t>(seg[i].len - off, len);
        std::memcpy(dst, seg[i].addr + off, k);
        dst += k;
        len -= k;
        off = 0;
    }
}

// len bytes from src into the segments from offset off.
void scatterAt(const Segment *seg, uint32_t n, uint64_t off, const uint8_t *src, uint64_t len) {
    for (uint32_t i = 0; i < n && len > 0; ++i) {
        if (off >= seg[i].len) {
            off -= seg[i].len;
            continue;
        }
        uint64_t k = std::min<uint64_t>(seg[i].len - off, len);
        std::memcpy(seg[i].addr + off, src, k);
        src += k;
        len -= k;
        off = 0;
    }
}

uint32_t packetsOf(uint64_t len, uint32_t mtu) {
    return len == 0 ? 1 : static_cast<uint32_t>((len + mtu - 1) / mtu);
}

// The local ACK timeout (4.096 us * 2^timeout). 0, "wait for ever" to the IBTA, retransmits at
// the default of 14 (67 ms) here and still counts retry_cnt: a lost packet must be sent again.
uint64_t ackTimeoutNs(uint8_t timeout) {
    return uint64_t{4096} << std::min<uint8_t>(timeout == 0 ? 14 : timeout, 31);
}

}  // namespace

namespace {

bool needsResponse(uint8_t opcode) {
    return opcode == SOFTNDA_OP_RDMA_READ || isAtomic(opcode);
}

bool localOnly(uint8_t opcode) {
    return opcode == SOFTNDA_OP_BIND_MW || opcode == SOFTNDA_OP_LOCAL_INV || opcode == SOFTNDA_OP_NOP;
}

uint32_t pathMtu(const Qp &qp) {
    return 128u << std::clamp<uint32_t>(qp.attrs.path_mtu, IBV_MTU_256, IBV_MTU_4096);
}

// A packet of wq's connection: its addresses, and the BTH's opcode (op in the connection's
// transport), destination QP and PSN.
WireOut packetTo(const WireQp &wq, uint8_t op, uint32_t dest_qpn, uint32_t psn) {
    WireOut o;
    o.src = wq.src;
    o.dst = wq.dst;
    o.sport = wq.sport;
    o.flow = wq.flow;
    o.tos = wq.tos;
    o.ttl = wq.ttl;
    o.pkt.bth.opcode = static_cast<uint8_t>(wq.transport | op);
    o.pkt.bth.dest_qp = dest_qpn;
    o.pkt.bth.psn = psn;
    return o;
}

}  // namespace

// The requester of a QP connected to another host (SPEC.md §18), in place of processSq's loop:
// the acknowledged messages complete in SQ order, new WQEs start while the window has room, and
// the timers send again from the first packet not known to have arrived (go-back-N, as rxe).
bool Engine::Thread::wireProcessSq(Qp *qp, uint32_t pi) {
    WireQp &wq = *qp->wire;
    std::unique_lock<std::mutex> lk(wq.mu);
    if (wq.count == 0) {
        // Nothing on the wire: start from CI (after a RESET, an import or a flush).
        wq.sent = qp->sq.ci_local;
        wq.send_psn = qp->sq_psn;
        wq.blocked = false;
    }
    bool did = false;
    if (wq.count > 0) {
        const uint64_t now = nowNs();
        bool again = false;
        if (wq.rnr_until_ns != 0) {
            if (now >= wq.rnr_until_ns) {
                wq.rnr_until_ns = 0;
                again = true;
            }
        } else if (wq.resend) {
            again = true;
        } else if (now >= wq.deadline_ns) {
            if (wq.retries >= qp->attrs.retry_cnt) {
                for (uint32_t i = 0; i < wq.count; ++i) {
                    if (!wq.at(i).done) {
                        wq.at(i).done = true;
                        wq.at(i).status = IBV_WC_RETRY_EXC_ERR;
                        break;
                    }
                }
            } else {
                wq.retries++;
                again = true;
            }
        }
        if (again) {
            wq.resend = false;
            wq.retransmits++;
            bump(ctr_.wire_retransmits);
            for (uint32_t i = 0; i < wq.count; ++i) {
                WireMsg &m = wq.at(i);
                if (!m.done && m.first_psn != m.next_psn) {
                    wireTransmit(qp, wq, m, psnAdd(m.first_psn, m.progress));
                }
            }
            wq.deadline_ns = now + ackTimeoutNs(qp->attrs.timeout);
        }
    }
    for (bool more = true; more;) {
        more = wireRetire(qp, wq);
        if (wq.count == 0 && qp->state.load(std::memory_order_acquire) == IBV_QPS_ERR) {
            lk.unlock();
            endRnrWait(qp);
            flushQp(qp, pi);  // a failed WQE moved the QP to ERR: the rest are flushed
            return true;
        }
        more = wireStart(qp, wq, pi) || more;
        did = did || more;
    }
    if (wq.count > 0) {
        startWait(qp, false, 0);  // revisited each pass: its timers, and the wire thread's pokes
    } else {
        endRnrWait(qp);
    }
    return did;
}

// Completes the finished messages at the head of the window, in order (wq.mu held). A failed
// one moves the QP to ERR and empties the window. True when any completed.
bool Engine::Thread::wireRetire(Qp *qp, WireQp &wq) {
    bool any = false;
    while (wq.count > 0 && wq.at(0).done) {
        const WireMsg m = wq.at(0);
        wq.head = (wq.head + 1) % kWireWindow;
        wq.count--;
        qp->sq_psn = m.next_psn;
        any = true;
        if (!completeWqe(qp, m.hdr,
                         ExecResult{m.status, m.status == IBV_WC_SUCCESS ? m.byte_len : 0u, Outcome::Done})) {
            if (m.status != IBV_WC_SUCCESS) {
                bump(ctr_.errors);
            }
            enterQpError(qp);  // a CQ overflow, if the WQE itself succeeded
            wq.count = 0;
            wq.head = 0;
            return true;
        }
        if (wq.count > 0) {
            wq.deadline_ns = nowNs() + ackTimeoutNs(qp->attrs.timeout);
            wq.retries = 0;
        }
    }
    return any;
}

// Starts the WQEs after the window's while it has room and the QP is in RTS (wq.mu held): each is
// checked (SPEC.md §5.1 steps 2-4) and sent; one that fails its checks completes in error, in
// order, and nothing after it starts. READs and atomics in flight stay within max_rd_atomic. A
// local operation (bind, invalidate, NOP) runs once the window is empty, so it keeps its place.
bool Engine::Thread::wireStart(Qp *qp, WireQp &wq, uint32_t pi) {
    if (qp->state.load(std::memory_order_acquire) != IBV_QPS_RTS) {
        return false;
    }
    bool any = false;
    while (!wq.blocked && wq.sent != pi && wq.count < kWireWindow) {
        WqeCopy w;
        fetchWqeAt(*qp, wq.sent, &w);
        WireMsg m;
        m.hdr = w.hdr;
        m.index = wq.sent;
        m.first_psn = m.next_psn = wq.send_psn;
        const uint8_t op = w.hdr.opcode;
        if (localOnly(op)) {
            if (wq.count > 0) {
                break;
            }
            ExecResult r = execute(qp, w);
            m.done = true;
            m.status = r.status;
        } else {
            Segment local[kEngineMaxSge];
            uint32_t nlocal = 0;
            uint8_t st = gatherLocal(qp, w, local, &nlocal, &m.total);
            if (st != IBV_WC_SUCCESS) {
                m.done = true;
                m.status = st;
                wq.blocked = true;
            } else {
                if (needsResponse(op)) {
                    uint32_t reads = 0;
                    for (uint32_t i = 0; i < wq.count; ++i) {
                        reads += !wq.at(i).done && needsResponse(wq.at(i).hdr.opcode) ? 1 : 0;
                    }
                    if (reads >= std::max<uint32_t>(1, qp->attrs.max_rd_atomic)) {
                        break;
                    }
                }
                const uint32_t n = isAtomic(op) ? 1 : packetsOf(m.total, pathMtu(*qp));
                m.next_psn = psnAdd(m.first_psn, n);
                m.byte_len = needsResponse(op) ? static_cast<uint32_t>(m.total) : 0;
                if (wq.count == 0) {
                    wq.deadline_ns = nowNs() + ackTimeoutNs(qp->attrs.timeout);
                    wq.retries = 0;
                    wq.rnr_retries = 0;
                }
            }
        }
        wq.at(wq.count) = m;
        wq.count++;
        wq.sent++;
        wq.send_psn = m.next_psn;
        any = true;
        if (!m.done) {
            wireTransmit(qp, wq, wq.at(wq.count - 1), m.first_psn);
        }
        if (m.done && m.status != IBV_WC_SUCCESS) {
            break;
        }
    }
    return any;
}

// Sends message m from PSN from on (wq.mu held): each SEND or WRITE packet with its share of the
// payload, a READ request for what has not come back, or the atomic. The last packet asks for
// the acknowledgement (ACK coalescing: one per message). Its WQE is read again from its slot,
// and its local SGEs checked again: an MR deregistered while it was on the wire fails it.
void Engine::Thread::wireTransmit(Qp *qp, WireQp &wq, const WireMsg &m, uint32_t from_psn) {
    if (wire_ == nullptr) {
        // A QP imported with its path to another host while this engine has no socket: nothing
        // leaves, and its timers end its WQEs with RETRY_EXC_ERR as a dead link would.
        return;
    }
    WqeCopy w;
    fetchWqeAt(*qp, m.index, &w);
    const softnda_wqe &h = w.hdr;
    Segment local[kEngineMaxSge];
    uint32_t nlocal = 0;
    uint64_t total = 0;
    if (gatherLocal(qp, w, local, &nlocal, &total) != IBV_WC_SUCCESS || total != m.total) {
        for (uint32_t i = 0; i < wq.count; ++i) {
            if (&wq.at(i) == &m) {
                wq.at(i).done = true;
                wq.at(i).status = IBV_WC_LOC_PROT_ERR;
            }
        }
        return;
    }
    const uint32_t qpn = qp->attrs.dest_qpn;
    const uint32_t mtu = pathMtu(*qp);
    const bool uc = qp->init.qp_type == IBV_QPT_UC;
    auto base = [&](uint8_t op, uint32_t psn) {
        WireOut o = packetTo(wq, op, qpn, psn);
        o.pkt.xrc_srqn = w.xrc_srqn;  // an XRC initiator's: the target's SRQ (XRCETH)
        return o;
    };
    const uint32_t done = psnDiff(from_psn, m.first_psn);
    if (h.opcode == SOFTNDA_OP_RDMA_READ) {
        WireOut o = base(roce::kReadRequest, from_psn);
        const uint64_t off = std::min<uint64_t>(uint64_t{done} * mtu, total);
        o.pkt.reth_va = h.remote_addr + off;
        o.pkt.reth_rkey = h.rkey;
        o.pkt.reth_len = static_cast<uint32_t>(total - off);
        o.pkt.bth.ack_req = true;
        wire_->send(std::span<const WireOut>(&o, 1));
        return;
    }
    if (isAtomic(h.opcode)) {
        const bool cas = h.opcode == SOFTNDA_OP_ATOMIC_CMP_AND_SWP;
        WireOut o = base(cas ? roce::kCompareSwap : roce::kFetchAdd, m.first_psn);
        o.pkt.atomic_va = h.remote_addr;
        o.pkt.atomic_rkey = h.rkey;
        o.pkt.atomic_swap_add = cas ? h.swap : h.compare_add;
        o.pkt.atomic_compare = cas ? h.compare_add : 0;
        o.pkt.bth.ack_req = true;
        wire_->send(std::span<const WireOut>(&o, 1));
        return;
    }
    const bool write = h.opcode == SOFTNDA_OP_RDMA_WRITE || h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
    const bool imm = h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM || h.opcode == SOFTNDA_OP_SEND_WITH_IMM;
    const bool inv = h.opcode == SOFTNDA_OP_SEND_WITH_INV;
    const uint32_t n = packetsOf(total, mtu);
    if (tx_buf_.size() < kTxBatch * size_t{4096}) {
        tx_buf_.resize(kTxBatch * size_t{4096});
    }
    WireOut out[kTxBatch];
    size_t k_out = 0;
    for (uint32_t k = done; k < n; ++k) {
        const uint64_t off = uint64_t{k} * mtu;
        const uint64_t len = std::min<uint64_t>(total - std::min(off, total), mtu);
        const bool first = k == 0, last = k + 1 == n;
        uint8_t op;
        if (write) {
            op = first && last ? (imm ? roce::kWriteOnlyImm : roce::kWriteOnly)
                 : first       ? roce::kWriteFirst
                 : last        ? (imm ? roce::kWriteLastImm : roce::kWriteLast)
                               : roce::kWriteMiddle;
        } else {
            op = first && last ? (imm   ? roce::kSendOnlyImm
                                  : inv ? roce::kSendOnlyInv
                                        : roce::kSendOnly)
                 : first       ? roce::kSendFirst
                 : last        ? (imm   ? roce::kSendLastImm
                                  : inv ? roce::kSendLastInv
                                        : roce::kSendLast)
                               : roce::kSendMiddle;
        }
        WireOut &o = out[k_out];
        o = base(op, psnAdd(m.first_psn, k));
        uint8_t *payload = tx_buf_.data() + k_out * size_t{4096};
        gatherAt(local, nlocal, off, len, payload);
        o.pkt.payload = std::span<const uint8_t>(payload, len);
        if (write && first) {
            o.pkt.reth_va = h.remote_addr;
            o.pkt.reth_rkey = h.rkey;
            o.pkt.reth_len = static_cast<uint32_t>(total);
        }
        if (last) {
            // ImmDt carries the verbs' big-endian immediate as its bytes; IETH the rkey.
            o.pkt.imm = ntohl(h.imm_data);
            o.pkt.ieth_rkey = h.imm_data;
            o.pkt.bth.solicited = (h.flags & SOFTNDA_WQE_SOLICITED) != 0;
            o.pkt.bth.ack_req = !uc;  // UC has no acknowledgement
        }
        if (++k_out == kTxBatch || last) {
            wire_->send(std::span<const WireOut>(out, k_out));
            k_out = 0;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The wire thread: every packet the socket receives

void Engine::Thread::runWire() {
    WireFrame frames[kRxBatch];
    while (!stop_.load(std::memory_order_acquire)) {
        size_t n = wire_->receive(frames);
        if (n == 0) {
            continue;
        }
        dev_->gate.enterShared();
        // While paused (a restart's snapshot), packets are dropped: the peers retransmit them.
        if (!dev_->paused.load(std::memory_order_acquire)) {
            for (size_t i = 0; i < n; ++i) {
                wireFrame(frames[i]);
            }
        }
        dev_->gate.leaveShared();
    }
}

void Engine::Thread::wireFrame(const WireFrame &f) {
    std::span<const uint8_t> bytes(f.data, f.len);
    roce::Packet p;
    const bool decoded = roce::decode(bytes, &p);
    const auto transport = static_cast<uint8_t>(p.bth.opcode & 0xe0);
    if (!decoded || (transport != roce::kRc && transport != roce::kUc && transport != roce::kUd &&
                     transport != roce::kXrc)) {
        wire_->malformed.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    if (wireIcrc(f.src, f.dst, f.sport, f.dport, bytes) != roce::carriedIcrc(bytes)) {
        wire_->bad_icrc.fetch_add(1, std::memory_order_relaxed);  // dropped, as rxe drops it
        return;
    }
    if (transport == roce::kUd) {
        wireDatagram(f, p);
        return;
    }
    auto it = dev_->qps.find(p.bth.dest_qp);
    if (it == dev_->qps.end()) {
        return;  // no such QP: silently dropped (IBTA 9.6.1.1), the requester's retries run out
    }
    Qp *qp = it->second;
    const bool uc = transport == roce::kUc;
    if (!qp->wire || std::memcmp(qp->wire->dst.raw, f.src.raw, sizeof(f.src.raw)) != 0 ||
        transport != qp->wire->transport) {
        return;  // a QP not connected to the sender, or of another transport
    }
    // An XRC initiator takes the responses, its target the requests (SPEC.md §14, §18).
    const uint8_t op = p.bth.opcode & 0x1f;
    const bool response = !uc && op >= roce::kReadResponseFirst && op <= roce::kAtomicAcknowledge;
    if (transport == roce::kXrc && response != (qp->init.qp_type == IBV_QPT_XRC_SEND)) {
        return;
    }
    if (response) {
        wireReply(qp, *qp->wire, p);
    } else {
        wireRequest(qp, *qp->wire, p, uc);
    }
}

namespace {

// Who takes a request at qp (rq_lock held): its own receive queue, SRQ and CQ; at an XRC target
// the SRQ the XRCETH names, which must be of the target's XRC domain, and that SRQ's CQ and PD
// (SPEC.md §14). False when there is no such SRQ.
bool wireResponder(const Device *dev, Qp *qp, const roce::Packet &p, Responder *out) {
    if (qp->init.qp_type != IBV_QPT_XRC_RECV) {
        *out = responderOf(qp);
        return true;
    }
    auto it = dev->xrc_srqs.find(p.xrc_srqn);
    if (it == dev->xrc_srqs.end() || it->second->xrcd != qp->xrcd) {
        return false;
    }
    Srq *srq = it->second;
    *out = Responder{qp, srq, srq->cq, srq->pd};
    return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// UD on an Ethernet device (SPEC.md §18): a datagram addressed by GID, to a QP of this host or
// over the wire to another, one packet (SEND ONLY, with DETH) each

// A UD SEND whose address handle has a GRH, on the engine thread that owns the SQ. Its source GID
// must still be in the port's table and the message within the port's MTU (else LOC_LEN_ERR, as
// for any UD message past the MTU); a destination GID of this device is a QP here, one of
// another host of the source GID's family (IPv4-mapped or IPv6) is reached over the socket, and
// anything else is dropped (nothing routes UD to it), the sender completing SUCCESS as UD always
// does.
ExecResult Engine::Thread::roceDatagram(Qp *qp, const softnda_wqe &h, const Segment *local, uint32_t nlocal,
                                        uint64_t total, uint32_t qkey, uint32_t dest_qpn) {
    ibv_gid dgid;
    std::memcpy(dgid.raw, &h.compare_add, 8);
    std::memcpy(dgid.raw + 8, &h.swap, 8);
    const uint32_t sgid_index = (h.rkey >> SOFTNDA_UD_SGID_SHIFT) & 0xff;
    const auto hop_limit = static_cast<uint8_t>(h.remote_addr >> 24);  // softnda_send_wr_set_ud_route
    Netdev &nd = *dev_->netdev;
    std::optional<ibv_gid> sgid;
    bool here = false;
    uint32_t mtu = 0;
    {
        std::lock_guard<std::mutex> lk(nd.mu);
        sgid = nd.table.at(sgid_index);
        here = nd.table.contains(dgid);
        mtu = 128u << roceActiveMtu(nd.view.mtu);
    }
    if (total > mtu) {
        return ExecResult{IBV_WC_LOC_LEN_ERR, 0, Outcome::Done};
    }
    if (!sgid) {
        return ExecResult{};
    }
    const bool imm = h.opcode == SOFTNDA_OP_SEND_WITH_IMM;
    WireOut o;
    o.pkt.bth.opcode = static_cast<uint8_t>(roce::kUd | (imm ? roce::kSendOnlyImm : roce::kSendOnly));
    o.pkt.bth.solicited = (h.flags & SOFTNDA_WQE_SOLICITED) != 0;
    o.pkt.bth.dest_qp = dest_qpn;
    o.pkt.bth.psn = qp->sq_psn;
    o.pkt.deth_qkey = qkey;
    o.pkt.deth_src_qp = qp->qpn;
    o.pkt.imm = ntohl(h.imm_data);  // ImmDt carries the verbs' big-endian immediate as its bytes
    o.tos = h.tclass;
    o.ttl = hop_limit;
    // The QP's own source port, as rxe gives a UD QP (the WQE carries no flow label).
    o.sport = roceSourcePort(0, qp->qpn);
    // A copy for a QP of this host: behind the header the packet would carry through the host's
    // own IP stack, as rxe's does (the packet: its headers and ICRC, encodedLength of no payload,
    // the payload and its pad).
    auto deliverHere = [&](Qp *member, uint8_t ttl) {
        const size_t len = roce::encodedLength(o.pkt) + total + (4 - total % 4) % 4;
        uint8_t grh[SOFTNDA_GRH_SIZE];
        const uint8_t l3 = roceGrh(grh, *sgid, dgid, len, o.tos, ttl, 0);
        deliverDatagram(
            Datagram{grh, local, nlocal, total, qkey, qp->qpn, 0, imm, o.pkt.bth.solicited, h.imm_data, l3},
            member);
    };
    if (isMulticastGid(dgid)) {
        // A group (SPEC.md §11.3, §18): only the multicast QPN reaches it. Its members here have
        // their copies through shared memory (the sender too when it is one, as a NIC loops
        // multicast back), and one packet to the group's IP address reaches those of other hosts.
        if (dest_qpn != kMcastQpn) {
            return ExecResult{};
        }
        auto group = dev_->mcast.find(mcastKey(true, dgid, 0));
        if (group != dev_->mcast.end()) {
            for (Qp *member : group->second) {
                if (member->attrs.port == qp->attrs.port) {
                    deliverHere(member, hop_limit != 0 ? hop_limit : 1);  // a multicast TTL's default
                }
            }
        }
    } else if (here) {
        auto it = dev_->qps.find(dest_qpn);
        if (it != dev_->qps.end() && it->second->attrs.port == qp->attrs.port) {
            deliverHere(it->second, hop_limit != 0 ? hop_limit : kDefaultTtl);
        }
        return ExecResult{};
    }
    if (wire_ == nullptr || !wirePath(*sgid, dgid, wire_->ipv6())) {
        return ExecResult{};
    }
    o.src = *sgid;
    o.dst = dgid;
    if (tx_buf_.size() < kTxBatch * size_t{4096}) {
        tx_buf_.resize(kTxBatch * size_t{4096});
    }
    gatherAt(local, nlocal, 0, total, tx_buf_.data());
    o.pkt.payload = std::span<const uint8_t>(tx_buf_.data(), total);
    wire_->send(std::span<const WireOut>(&o, 1));
    return ExecResult{};
}

// A UD packet from the wire (on the wire thread): into the QP its BTH names, as a datagram of
// this host would go (Q_Key, state, a receive), behind a GRH holding the packet's IP header.
// A packet to a multicast group's IP address (SPEC.md §18) goes to every QP of the device that
// joined the group, when it names the multicast QPN.
void Engine::Thread::wireDatagram(const WireFrame &f, const roce::Packet &p) {
    const uint8_t op = p.bth.opcode & 0x1f;
    if (op != roce::kSendOnly && op != roce::kSendOnlyImm) {
        return;  // UD has SEND ONLY alone
    }
    uint8_t grh[SOFTNDA_GRH_SIZE];
    const uint8_t l3 = roceGrh(grh, f.src, f.dst, f.len, f.tos, f.ttl, f.flow);
    Segment payload{const_cast<uint8_t *>(p.payload.data()), static_cast<uint32_t>(p.payload.size())};
    const Datagram d{grh,
                     &payload,
                     1,
                     p.payload.size(),
                     p.deth_qkey,
                     p.deth_src_qp,
                     0,
                     op == roce::kSendOnlyImm,
                     p.bth.solicited,
                     htonl(p.imm),
                     l3};
    if (isMulticastGid(f.dst)) {
        auto group =
            p.bth.dest_qp == kMcastQpn ? dev_->mcast.find(mcastKey(true, f.dst, 0)) : dev_->mcast.end();
        if (group != dev_->mcast.end()) {
            for (Qp *member : group->second) {
                deliverDatagram(d, member);
            }
        }
        return;
    }
    auto it = dev_->qps.find(p.bth.dest_qp);
    if (it != dev_->qps.end()) {
        deliverDatagram(d, it->second);  // no such QP: dropped, as UD drops
    }
}

// A UC message to another host (SPEC.md §18), on the engine thread that owns the SQ: its packets
// go out at once, from sq_psn, with no acknowledgement asked; the WQE completes SUCCESS whatever
// becomes of them, as on one host (§11.2).
ExecResult Engine::Thread::wireUnconnected(Qp *qp, uint64_t total) {
    WireQp &wq = *qp->wire;
    WireMsg m;
    m.index = qp->sq.ci_local;
    m.first_psn = qp->sq_psn;
    m.total = total;
    {
        std::lock_guard<std::mutex> lk(wq.mu);
        wireTransmit(qp, wq, m, m.first_psn);
    }
    qp->sq_psn = psnAdd(qp->sq_psn, packetsOf(total, pathMtu(*qp)));
    return ExecResult{};
}

// ---------------------------------------------------------------------------------------------
// The requester's half on the wire thread: acknowledgements, READ responses, atomic results

void Engine::Thread::wireReply(Qp *qp, WireQp &wq, const roce::Packet &p) {
    const uint8_t op = p.bth.opcode & 0x1f;
    const uint32_t psn = p.bth.psn;
    bool wake = false;
    {
        std::lock_guard<std::mutex> lk(wq.mu);
        if (wq.count == 0) {
            return;  // late or repeated: nothing waits for it
        }
        auto finish = [&](WireMsg &m, uint8_t status, uint32_t byte_len) {
            m.done = true;
            m.status = status;
            m.byte_len = byte_len;
            if (status == IBV_WC_SUCCESS) {
                // rnr_retry counts the RNR NAKs of one message: an acknowledged one starts it
                // again (as rxe's completer does). Here, not at retirement on the engine thread:
                // the next message's RNR NAK can come in the same batch as this ACK.
                wq.rnr_retries = 0;
            }
            wake = true;
        };
        auto contains = [](const WireMsg &m, uint32_t q) {
            return !psnBefore(q, m.first_psn) && psnBefore(q, m.next_psn);
        };
        // Everything before PSN upto arrived (an ACK, a NAK or a response says so): SENDs and
        // WRITEs before it are done, the one it falls in has arrived up to it, and a READ or
        // atomic before it whose answer did not come lost it on the way back: asked again.
        auto arrivedBefore = [&](uint32_t upto) {
            for (uint32_t i = 0; i < wq.count; ++i) {
                WireMsg &m = wq.at(i);
                if (m.done || m.first_psn == m.next_psn) {
                    continue;
                }
                if (!psnBefore(m.first_psn, upto)) {
                    break;
                }
                if (needsResponse(m.hdr.opcode)) {
                    if (wq.rerequested != psnAdd(m.first_psn, m.progress)) {
                        wq.rerequested = psnAdd(m.first_psn, m.progress);
                        wq.resend = true;
                        wake = true;
                    }
                    break;
                }
                if (!psnBefore(upto, m.next_psn)) {
                    finish(m, IBV_WC_SUCCESS, 0);
                } else {
                    m.progress = std::max(m.progress, psnDiff(upto, m.first_psn));
                    break;
                }
            }
        };
        WireMsg *in = nullptr;
        for (uint32_t i = 0; i < wq.count && in == nullptr; ++i) {
            if (!wq.at(i).done && contains(wq.at(i), psn)) {
                in = &wq.at(i);
            }
        }
        const uint8_t kind = p.aeth_syndrome & 0xe0;
        const bool has_aeth = roce::layoutOf(p.bth.opcode).aeth;
        if (has_aeth && kind == kRnrNak) {
            // Receiver not ready: from this PSN again after the responder's timer, while
            // rnr_retry lasts (7: for ever).
            arrivedBefore(psn);
            if (in != nullptr && !in->done) {
                in->progress = psnDiff(psn, in->first_psn);
                if (qp->attrs.rnr_retry != 7 && wq.rnr_retries >= qp->attrs.rnr_retry) {
                    finish(*in, IBV_WC_RNR_RETRY_EXC_ERR, 0);
                } else {
                    wq.rnr_retries++;
                    wq.rnr_until_ns = nowNs() + rnrTimerNs(p.aeth_syndrome & 0x1f);
                    wake = true;
                }
            }
        } else if (has_aeth && kind == kNak) {
            arrivedBefore(psn);
            if (p.aeth_syndrome == kNakPsnSeq) {
                // The responder expects psn: resend from there (go-back-N).
                if (in != nullptr) {
                    in->progress = psnDiff(psn, in->first_psn);
                }
                wq.resend = true;
                wake = true;
            } else if (in != nullptr) {
                finish(*in, statusOfNak(p.aeth_syndrome), 0);
            }
        } else if (op == roce::kAcknowledge) {
            if (has_aeth && kind == 0) {
                arrivedBefore(psnAdd(psn, 1));
            }
        } else if (op == roce::kAtomicAcknowledge) {
            if (in != nullptr && isAtomic(in->hdr.opcode) && psn == in->first_psn) {
                arrivedBefore(psn);
                WqeCopy w;
                fetchWqeAt(*qp, in->index, &w);
                Segment seg[kEngineMaxSge];
                if (!checkLocal(qp->pd, w.sge, w.hdr.num_sge, true, seg)) {
                    finish(*in, IBV_WC_LOC_PROT_ERR, 0);
                } else {
                    uint64_t orig = p.atomic_orig;
                    scatterAt(seg, w.hdr.num_sge, 0, reinterpret_cast<const uint8_t *>(&orig), 8);
                    bump(ctr_.bytes, 8);
                    finish(*in, IBV_WC_SUCCESS, 8);
                }
            }
        } else if (in != nullptr && in->hdr.opcode == SOFTNDA_OP_RDMA_READ) {
            const uint32_t expect_psn = psnAdd(in->first_psn, in->progress);
            if (psn == expect_psn) {
                arrivedBefore(in->first_psn);
                const uint32_t mtu = pathMtu(*qp);
                const uint64_t off = uint64_t{in->progress} * mtu;
                const bool last = op == roce::kReadResponseLast || op == roce::kReadResponseOnly;
                const uint64_t expect = std::min<uint64_t>(in->total - std::min(off, in->total), mtu);
                WqeCopy w;
                fetchWqeAt(*qp, in->index, &w);
                Segment seg[kEngineMaxSge];
                if (p.payload.size() != expect || last != (psnAdd(psn, 1) == in->next_psn)) {
                    finish(*in, IBV_WC_BAD_RESP_ERR, 0);
                } else if (!checkLocal(qp->pd, w.sge, w.hdr.num_sge, true, seg)) {
                    finish(*in, IBV_WC_LOC_PROT_ERR, 0);
                } else {
                    scatterAt(seg, w.hdr.num_sge, off, p.payload.data(), p.payload.size());
                    bump(ctr_.bytes, p.payload.size());
                    in->progress++;
                    if (last) {
                        finish(*in, IBV_WC_SUCCESS, static_cast<uint32_t>(in->total));
                    }
                }
            } else if (psnBefore(expect_psn, psn) && wq.rerequested != expect_psn) {
                // A response after a gap: the ones before it were lost. Asked for again at
                // once, once per gap, instead of after the ACK timeout.
                wq.rerequested = expect_psn;
                wq.resend = true;
                wake = true;
            }
        }
        if (wake) {
            wq.retries = 0;  // the responder answered: the transport retries count again
        }
    }
    if (wake) {
        // The SQ's engine thread completes the WQEs (or sends again) on its next pass.
        engine_->poke(qp->sq_db.page, qp->sq_db.index);
    }
}

// ---------------------------------------------------------------------------------------------
// The responder

void Engine::Thread::wireAck(const WireQp &wq, uint32_t dest_qpn, uint8_t syndrome, uint32_t psn) {
    WireOut o = packetTo(wq, roce::kAcknowledge, dest_qpn, psn);
    o.pkt.aeth_syndrome = syndrome;
    o.pkt.aeth_msn = wq.msn;
    wire_->send(std::span<const WireOut>(&o, 1));
}

// The responder, RC or UC (uc). UC has no acknowledgement and no retry (SPEC.md §11.2, §18): a
// FIRST or ONLY packet starts a message whatever its PSN (the responder resynchronises), a packet
// out of sequence drops the message in progress, and what RC answers with a NAK (no receive, a
// bad rkey, an invalid request) drops the message silently; only a receive's own error (too
// short, a bad SGE) completes it in error and moves the QP to ERR, as on one host.
void Engine::Thread::wireRequest(Qp *qp, WireQp &wq, const roce::Packet &p, bool uc) {
    int st = qp->state.load(std::memory_order_acquire);
    if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD) {
        return;  // not ready: dropped, the requester retries
    }
    const uint32_t dest = qp->attrs.dest_qpn;
    std::lock_guard<std::mutex> lk(qp->rq_lock);
    const uint32_t psn = p.bth.psn;
    const uint8_t op = p.bth.opcode & 0x1f;
    if (uc) {
        const bool starts = op == roce::kSendFirst || op == roce::kSendOnly || op == roce::kSendOnlyImm ||
                            op == roce::kWriteFirst || op == roce::kWriteOnly || op == roce::kWriteOnlyImm;
        if (starts) {
            wq.in_kind = 0;  // a message in progress lost its end: dropped
            qp->rq_psn = psn;
        } else if (psn != qp->rq_psn || wq.in_kind == 0) {
            wq.in_kind = 0;  // a packet lost inside the message: the rest of it is dropped
            return;
        }
    }
    const uint32_t epsn = qp->rq_psn;
    if (psn != epsn) {
        if (psnBefore(epsn, psn)) {
            // A gap: one sequence NAK names the PSN expected, until it comes.
            if (!wq.nak_sent) {
                wq.nak_sent = true;
                bump(ctr_.wire_seq_naks);
                wireAck(wq, dest, kNakPsnSeq, epsn);
            }
            return;
        }
        wireDuplicate(qp, wq, p);
        return;
    }
    wq.nak_sent = false;
    // A NAK and the responder in ERR (RC); the message dropped (UC), and the QP in ERR only when
    // a receive completed in error (recv_error).
    auto fail = [&](uint8_t status, bool recv_error = false) {
        wq.in_kind = 0;
        if (!uc) {
            wireAck(wq, dest, nakOf(status), psn);
            if (wq.in_recv) {
                releaseSrqRecv(qp);  // the QP goes to ERR: the receive is not completed
                wq.in_recv = false;
            }
        }
        if (!uc || recv_error) {
            responderError(qp, status);
        }
    };
    Responder rp;
    if (!wireResponder(dev_, qp, p, &rp)) {
        return fail(IBV_WC_REM_INV_REQ_ERR);  // an XRC SRQ not of the target's domain
    }
    const bool send_op = op <= roce::kSendOnlyImm || op == roce::kSendLastInv || op == roce::kSendOnlyInv;
    const bool write_op = op >= roce::kWriteFirst && op <= roce::kWriteOnlyImm;
    const bool first = op == roce::kSendFirst || op == roce::kSendOnly || op == roce::kSendOnlyImm ||
                       op == roce::kSendOnlyInv || op == roce::kWriteFirst || op == roce::kWriteOnly ||
                       op == roce::kWriteOnlyImm;
    const bool last = !(op == roce::kSendFirst || op == roce::kSendMiddle || op == roce::kWriteFirst ||
                        op == roce::kWriteMiddle);
    if (send_op || write_op) {
        const uint8_t kind = send_op ? 1 : 2;
        // A FIRST or ONLY starts a message; MIDDLE and LAST continue the one in progress.
        if (first != (wq.in_kind == 0) || (!first && wq.in_kind != kind)) {
            return fail(IBV_WC_REM_INV_REQ_ERR);
        }
        if (!last && p.payload.size() != (128u << qp->attrs.path_mtu)) {
            return fail(IBV_WC_REM_INV_REQ_ERR);  // only the last packet may be short
        }
        const bool imm = op == roce::kSendLastImm || op == roce::kSendOnlyImm || op == roce::kWriteLastImm ||
                         op == roce::kWriteOnlyImm;
        const bool inv = op == roce::kSendLastInv || op == roce::kSendOnlyInv;
        if (inv && !invalidateRemote(dev_, qp, p.ieth_rkey, false)) {
            return fail(IBV_WC_REM_INV_REQ_ERR);
        }
        if (first) {
            wq.in_kind = kind;
            wq.in_off = 0;
            // A receive still held serves this message: UC's from a message it dropped (as rxe
            // reuses its WQE), or one a restart cut (reholdSrqRecv) whose retransmission this is.
            if (write_op) {
                wq.in_va = p.reth_va;
                wq.in_rkey = p.reth_rkey;
                wq.in_len = p.reth_len;
            }
            wq.in_srqn = p.xrc_srqn;
        } else if (p.xrc_srqn != wq.in_srqn) {
            return fail(IBV_WC_REM_INV_REQ_ERR);  // XRC: every packet of a message names its SRQ
        }
        // The receive a SEND fills or a WRITE's immediate completes, taken by the packet that
        // needs it first: none posted is an RNR NAK, and the same packet comes again.
        if ((send_op || imm) && !wq.in_recv) {
            // Held while the message goes on past this packet: a restart then keeps the receive
            // for the message's retransmission instead of losing it (SPEC.md §10, §18).
            RecvCopy r;
            if (!takeRecv(rp, &r, !last)) {
                if (first || uc) {
                    wq.in_kind = 0;
                }
                if (uc) {
                    return;  // no receive: the message is dropped
                }
                bump(ctr_.rnr_naks);
                wireAck(wq, dest, static_cast<uint8_t>(kRnrNak | (qp->attrs.min_rnr_timer & 0x1f)), psn);
                return;
            }
            if (!last && rp.srq != nullptr) {
                holdSrqRecv(qp, *rp.srq, r.index);
            }
            keepRecv(wq, r);
        }
        RecvCopy r{wq.recv_wr_id, wq.recv_num_sge, {}};
        std::memcpy(r.sge, wq.recv_sge, sizeof(r.sge));
        const uint64_t len = p.payload.size();
        if (write_op) {
            if (wq.in_off + len > wq.in_len || (last && wq.in_off + len != wq.in_len)) {
                return fail(IBV_WC_REM_INV_REQ_ERR);
            }
            softnda_wqe h{};
            h.opcode = imm ? SOFTNDA_OP_RDMA_WRITE_WITH_IMM : SOFTNDA_OP_RDMA_WRITE;
            h.rkey = wq.in_rkey;
            h.remote_addr = wq.in_va + wq.in_off;
            uint8_t status = IBV_WC_SUCCESS;
            // A zero-length WRITE's rkey is not checked, only the QP's access (C9-88).
            uint8_t *remote = checkRkey(dev_, rp, h, last && first ? wq.in_len : len, &status);
            if (remote == nullptr) {
                return fail(status);
            }
            std::memcpy(remote, p.payload.data(), len);
        } else {
            Segment dst[kEngineMaxSge];
            uint32_t cap = rp.srq != nullptr ? rp.srq->max_sge : qp->rq_max_sge;
            uint8_t status = IBV_WC_SUCCESS;
            uint64_t room = 0;
            if (r.num_sge > cap) {
                status = IBV_WC_LOC_QP_OP_ERR;
            } else if (!checkLocal(rp.pd, r.sge, r.num_sge, true, dst)) {
                status = IBV_WC_LOC_PROT_ERR;
            } else {
                for (uint32_t i = 0; i < r.num_sge; ++i) {
                    room += dst[i].len;
                }
                if (wq.in_off + len > room) {
                    status = IBV_WC_LOC_LEN_ERR;
                }
            }
            if (status != IBV_WC_SUCCESS) {
                releaseSrqRecv(qp);
                wq.in_recv = false;
                completeRecv(rp, r, status, 0, IBV_WC_RECV, 0, 0, dest);
                return fail(status == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR, true);
            }
            scatterAt(dst, r.num_sge, wq.in_off, p.payload.data(), len);
        }
        bump(ctr_.bytes, len);
        wq.in_off += len;
        qp->rq_psn = psnAdd(qp->rq_psn, 1);
        if (last) {
            wq.msn = psnAdd(wq.msn, 1);
            // A plain WRITE completes no receive, and leaves one UC holds from a dropped message.
            const bool completes = send_op || imm;
            if (wq.in_recv && (completes || !uc)) {
                // Let go before the commit point: a successor never serves a message it had
                // completed again (a cut between the two loses the receive instead).
                releaseSrqRecv(qp);
            }
            __atomic_store_n(qp->recWord(kRqPsnWord), qp->rq_psn, __ATOMIC_RELEASE);
            if (inv) {
                (void)invalidateRemote(dev_, qp, p.ieth_rkey, true);
            }
            if (wq.in_recv && completes) {
                uint8_t flags =
                    static_cast<uint8_t>((imm ? SOFTNDA_CQE_WITH_IMM : 0) | (inv ? SOFTNDA_CQE_WITH_INV : 0) |
                                         (send_op && p.bth.solicited ? SOFTNDA_CQE_SOLICITED : 0));
                uint32_t imm_data = inv ? p.ieth_rkey : htonl(p.imm);
                completeRecv(rp, r, IBV_WC_SUCCESS, static_cast<uint32_t>(wq.in_off),
                             send_op ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM,
                             imm   ? imm_data
                             : inv ? imm_data
                                   : 0,
                             flags, dest);
            }
            wq.in_kind = 0;
            if (completes || !uc) {
                wq.in_recv = false;
            }
        }
        if (p.bth.ack_req && !uc) {
            wireAck(wq, dest, kAckSyndrome, psn);
        }
        return;
    }
    if (wq.in_kind != 0) {
        return fail(IBV_WC_REM_INV_REQ_ERR);  // a new request inside a message
    }
    if (op == roce::kReadRequest) {
        uint32_t n = 0;
        if (!wireRead(qp, wq, p, rp, &n)) {
            return;
        }
        qp->rq_psn = psnAdd(qp->rq_psn, n);
        wq.msn = psnAdd(wq.msn, 1);
        __atomic_store_n(qp->recWord(kRqPsnWord), qp->rq_psn, __ATOMIC_RELEASE);
        return;
    }
    if (op == roce::kCompareSwap || op == roce::kFetchAdd) {
        softnda_wqe h{};
        h.opcode = op == roce::kCompareSwap ? SOFTNDA_OP_ATOMIC_CMP_AND_SWP : SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
        h.rkey = p.atomic_rkey;
        h.remote_addr = p.atomic_va;
        uint8_t status = IBV_WC_SUCCESS;
        auto *word = reinterpret_cast<uint64_t *>(checkRkey(dev_, rp, h, 8, &status));
        if (word == nullptr) {
            return fail(status);
        }
        uint64_t orig;
        if (op == roce::kCompareSwap) {
            orig = p.atomic_compare;
            __atomic_compare_exchange_n(word, &orig, p.atomic_swap_add, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
        } else {
            orig = __atomic_fetch_add(word, p.atomic_swap_add, __ATOMIC_SEQ_CST);
        }
        bump(ctr_.bytes, 8);
        const uint32_t slot = wq.atomic_next++ % kSavedAtomics;
        wq.atomics[slot] = WireQp::AtomicResult{true, psn, orig};
        // Before the expected PSN moves past it: a successor that expects the next PSN answers
        // this one's retransmission from the record.
        persistAtomic(qp, slot, psn, orig, wq.atomic_next % kSavedAtomics);
        qp->rq_psn = psnAdd(qp->rq_psn, 1);
        wq.msn = psnAdd(wq.msn, 1);
        __atomic_store_n(qp->recWord(kRqPsnWord), qp->rq_psn, __ATOMIC_RELEASE);
        wireAtomicAck(wq, dest, psn, orig);
        return;
    }
    fail(IBV_WC_REM_INV_REQ_ERR);  // an opcode RC's responder does not take
}

void Engine::Thread::wireAtomicAck(const WireQp &wq, uint32_t dest_qpn, uint32_t psn, uint64_t orig) {
    WireOut o = packetTo(wq, roce::kAtomicAcknowledge, dest_qpn, psn);
    o.pkt.aeth_syndrome = kAckSyndrome;
    o.pkt.aeth_msn = wq.msn;
    o.pkt.atomic_orig = orig;
    wire_->send(std::span<const WireOut>(&o, 1));
}

// A READ request's responses, from its PSN (qp->rq_lock held); *n how many PSNs they take. False
// when the request was refused (a NAK went, and the QP is in ERR).
bool Engine::Thread::wireRead(Qp *qp, WireQp &wq, const roce::Packet &p, const Responder &rp, uint32_t *n) {
    const uint32_t dest = qp->attrs.dest_qpn;
    const uint32_t mtu = 128u << qp->attrs.path_mtu;
    softnda_wqe h{};
    h.opcode = SOFTNDA_OP_RDMA_READ;
    h.rkey = p.reth_rkey;
    h.remote_addr = p.reth_va;
    uint8_t status = IBV_WC_SUCCESS;
    const uint8_t *remote = checkRkey(dev_, rp, h, p.reth_len, &status);
    if (remote == nullptr) {
        wireAck(wq, dest, nakOf(status), p.bth.psn);
        responderError(qp, status);
        return false;
    }
    *n = packetsOf(p.reth_len, mtu);
    WireOut out[kTxBatch];
    size_t m = 0;
    for (uint32_t k = 0; k < *n; ++k) {
        const uint64_t off = uint64_t{k} * mtu;
        const uint64_t len = std::min<uint64_t>(p.reth_len - std::min<uint64_t>(off, p.reth_len), mtu);
        const bool first = k == 0, last = k + 1 == *n;
        WireOut &o = out[m];
        const uint8_t op = first && last ? roce::kReadResponseOnly
                           : first       ? roce::kReadResponseFirst
                           : last        ? roce::kReadResponseLast
                                         : roce::kReadResponseMiddle;
        o = packetTo(wq, op, dest, psnAdd(p.bth.psn, k));
        o.pkt.aeth_syndrome = kAckSyndrome;
        o.pkt.aeth_msn = last ? psnAdd(wq.msn, 1) : wq.msn;
        o.pkt.payload = std::span<const uint8_t>(remote + off, len);
        if (++m == kTxBatch || last) {
            wire_->send(std::span<const WireOut>(out, m));
            m = 0;
        }
    }
    bump(ctr_.bytes, p.reth_len);
    return true;
}

// A request with a PSN already taken (qp->rq_lock held): its acknowledgement was lost, or the
// requester went back further than needed. Nothing executes twice: a SEND or WRITE is
// acknowledged again, a READ read again, an atomic answered from its saved result.
void Engine::Thread::wireDuplicate(Qp *qp, WireQp &wq, const roce::Packet &p) {
    const uint32_t dest = qp->attrs.dest_qpn;
    const uint8_t op = p.bth.opcode & 0x1f;
    if (op == roce::kReadRequest) {
        uint32_t n = 0;
        Responder rp;
        if (wireResponder(dev_, qp, p, &rp)) {
            (void)wireRead(qp, wq, p, rp, &n);
        }
        return;
    }
    if (op == roce::kCompareSwap || op == roce::kFetchAdd) {
        for (const WireQp::AtomicResult &a : wq.atomics) {
            if (a.valid && a.psn == p.bth.psn) {
                wireAtomicAck(wq, dest, a.psn, a.orig);
                return;
            }
        }
        return;  // older than the saved results: dropped (the requester cannot still want it)
    }
    if (p.bth.ack_req) {
        wireAck(wq, dest, kAckSyndrome, psnAdd(qp->rq_psn, kPsnMask));  // everything before ePSN
    }
}

}  // namespace softnda
