// RoCEv2's wire format (roce_wire.h; SPEC.md §18).
#include "providers/softnda/src/roce_wire.h"

#if SOFTNDA_HAVE_ISAL
#include <isa-l/crc.h>
#else
#include <zlib.h>
#endif

#include <array>
#include <cstring>

namespace softnda::roce {
namespace {

// Big-endian fields of n bytes at p.
void put(uint8_t *p, uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<uint8_t>(v >> (8 * (n - 1 - i)));
    }
}
uint64_t get(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
        v = v << 8 | p[i];
    }
    return v;
}

// The reflected CRC-32 of IEEE 802.3 (zlib's crc32(), chained the same way: c is the CRC so far, 0
// to start). isa-l's picks a carry-less-multiply version for the CPU (PCLMULQDQ, PMULL): about
// ten times zlib 1.2.13's, which was a fifth of the wire thread's time (docs/BENCHMARKS.md).
uint32_t crc(uint32_t c, std::span<const uint8_t> bytes) {
#if SOFTNDA_HAVE_ISAL
    return crc32_gzip_refl(c, bytes.data(), bytes.size());
#else
    return static_cast<uint32_t>(crc32_z(c, bytes.data(), bytes.size()));
#endif
}

}  // namespace

size_t Layout::headers() const {
    return (xrceth ? kXrcEthLen : 0) + (deth ? kDethLen : 0) + (reth ? kRethLen : 0) +
           (atomic_eth ? kAtomicEthLen : 0) + (aeth ? kAethLen : 0) + (atomic_ack ? kAtomicAckLen : 0) +
           (imm ? kImmLen : 0) + (ieth ? kIethLen : 0);
}

Layout layoutOf(uint8_t opcode) {
    const uint8_t transport = opcode & 0xe0;
    const uint8_t op = opcode & 0x1f;
    Layout l;
    if (transport == kUd) {
        // UD has SEND_ONLY and SEND_ONLY_WITH_IMMEDIATE, each behind a DETH.
        l.valid = op == kSendOnly || op == kSendOnlyImm;
        l.deth = l.payload = true;
        l.imm = op == kSendOnlyImm;
        return l;
    }
    if (transport != kRc && transport != kUc && transport != kXrc) {
        return l;  // RD and the rest: not served
    }
    // UC has the SENDs and the RDMA WRITEs; RC and XRC everything of Table 38 but the reserved
    // 0x15. An XRC request names the target's SRQ in an XRCETH right after the BTH; the
    // responses (READ responses and the acknowledgements) carry none.
    l.valid = transport != kUc ? (op <= kFetchAdd || op == kSendLastInv || op == kSendOnlyInv)
                               : op <= kWriteOnlyImm;
    l.xrceth = transport == kXrc && (op < kReadResponseFirst || op > kAtomicAcknowledge);
    switch (op) {
        case kWriteFirst:
        case kWriteOnly:
        case kWriteOnlyImm:
        case kReadRequest:
            l.reth = true;
            break;
        case kCompareSwap:
        case kFetchAdd:
            l.atomic_eth = true;
            break;
        case kReadResponseFirst:
        case kReadResponseLast:
        case kReadResponseOnly:
        case kAcknowledge:
            l.aeth = true;
            break;
        case kAtomicAcknowledge:
            l.aeth = l.atomic_ack = true;
            break;
        default:
            break;
    }
    l.imm = op == kSendLastImm || op == kSendOnlyImm || op == kWriteLastImm || op == kWriteOnlyImm;
    l.ieth = op == kSendLastInv || op == kSendOnlyInv;
    l.payload = op <= kWriteOnlyImm || (op >= kReadResponseFirst && op <= kReadResponseOnly) ||
                op == kSendLastInv || op == kSendOnlyInv;
    return l;
}

size_t encodedLength(const Packet &p) {
    const Layout l = layoutOf(p.bth.opcode);
    if (!l.valid || (!l.payload && !p.payload.empty())) {
        return 0;
    }
    const size_t pad = (4 - p.payload.size() % 4) % 4;
    return kBthLen + l.headers() + p.payload.size() + pad + kIcrcLen;
}

size_t encode(const Packet &p, std::span<uint8_t> out) {
    const size_t len = encodedLength(p);
    if (len == 0 || out.size() < len) {
        return 0;
    }
    const Layout l = layoutOf(p.bth.opcode);
    const auto pad = static_cast<uint8_t>((4 - p.payload.size() % 4) % 4);
    uint8_t *w = out.data();
    const Bth &b = p.bth;
    w[0] = b.opcode;
    w[1] = static_cast<uint8_t>((b.solicited ? 0x80 : 0) | (b.migreq ? 0x40 : 0) | pad << 4);  // TVer 0
    put(w + 2, b.pkey, 2);
    w[4] = 0;  // FECN, BECN, reserved
    put(w + 5, b.dest_qp & 0xffffff, 3);
    w[8] = b.ack_req ? 0x80 : 0;
    put(w + 9, b.psn & 0xffffff, 3);
    w += kBthLen;
    if (l.xrceth) {
        w[0] = 0;  // reserved
        put(w + 1, p.xrc_srqn & 0xffffff, 3);
        w += kXrcEthLen;
    }
    if (l.deth) {
        put(w, p.deth_qkey, 4);
        w[4] = 0;
        put(w + 5, p.deth_src_qp & 0xffffff, 3);
        w += kDethLen;
    }
    if (l.reth) {
        put(w, p.reth_va, 8);
        put(w + 8, p.reth_rkey, 4);
        put(w + 12, p.reth_len, 4);
        w += kRethLen;
    }
    if (l.atomic_eth) {
        put(w, p.atomic_va, 8);
        put(w + 8, p.atomic_rkey, 4);
        put(w + 12, p.atomic_swap_add, 8);
        put(w + 20, p.atomic_compare, 8);
        w += kAtomicEthLen;
    }
    if (l.aeth) {
        w[0] = p.aeth_syndrome;
        put(w + 1, p.aeth_msn & 0xffffff, 3);
        w += kAethLen;
    }
    if (l.atomic_ack) {
        put(w, p.atomic_orig, 8);
        w += kAtomicAckLen;
    }
    if (l.imm) {
        put(w, p.imm, 4);
        w += kImmLen;
    }
    if (l.ieth) {
        put(w, p.ieth_rkey, 4);
        w += kIethLen;
    }
    if (!p.payload.empty()) {
        std::memcpy(w, p.payload.data(), p.payload.size());
        w += p.payload.size();
    }
    std::memset(w, 0, pad + kIcrcLen);
    return len;
}

bool decode(std::span<const uint8_t> in, Packet *p) {
    if (in.size() < kBthLen + kIcrcLen) {
        return false;
    }
    const uint8_t *r = in.data();
    Packet out;
    Bth &b = out.bth;
    b.opcode = r[0];
    b.solicited = (r[1] & 0x80) != 0;
    b.migreq = (r[1] & 0x40) != 0;
    b.pad = (r[1] >> 4) & 3;
    const Layout l = layoutOf(b.opcode);
    if (!l.valid || (r[1] & 0x0f) != 0 || in.size() < kBthLen + l.headers() + kIcrcLen) {
        return false;
    }
    b.pkey = static_cast<uint16_t>(get(r + 2, 2));
    b.dest_qp = static_cast<uint32_t>(get(r + 5, 3));
    b.ack_req = (r[8] & 0x80) != 0;
    b.psn = static_cast<uint32_t>(get(r + 9, 3));
    r += kBthLen;
    if (l.xrceth) {
        out.xrc_srqn = static_cast<uint32_t>(get(r + 1, 3));
        r += kXrcEthLen;
    }
    if (l.deth) {
        out.deth_qkey = static_cast<uint32_t>(get(r, 4));
        out.deth_src_qp = static_cast<uint32_t>(get(r + 5, 3));
        r += kDethLen;
    }
    if (l.reth) {
        out.reth_va = get(r, 8);
        out.reth_rkey = static_cast<uint32_t>(get(r + 8, 4));
        out.reth_len = static_cast<uint32_t>(get(r + 12, 4));
        r += kRethLen;
    }
    if (l.atomic_eth) {
        out.atomic_va = get(r, 8);
        out.atomic_rkey = static_cast<uint32_t>(get(r + 8, 4));
        out.atomic_swap_add = get(r + 12, 8);
        out.atomic_compare = get(r + 20, 8);
        r += kAtomicEthLen;
    }
    if (l.aeth) {
        out.aeth_syndrome = r[0];
        out.aeth_msn = static_cast<uint32_t>(get(r + 1, 3));
        r += kAethLen;
    }
    if (l.atomic_ack) {
        out.atomic_orig = get(r, 8);
        r += kAtomicAckLen;
    }
    if (l.imm) {
        out.imm = static_cast<uint32_t>(get(r, 4));
        r += kImmLen;
    }
    if (l.ieth) {
        out.ieth_rkey = static_cast<uint32_t>(get(r, 4));
        r += kIethLen;
    }
    const size_t rest = in.size() - static_cast<size_t>(r - in.data()) - kIcrcLen;
    if (b.pad > rest || (!l.payload && rest != 0)) {
        return false;
    }
    out.payload = std::span<const uint8_t>(r, rest - b.pad);
    *p = out;
    return true;
}

namespace {

// CRC-32 over eight bytes of 0xff (the absent LRH), the IP header masked, the UDP header with its
// checksum all ones, the BTH with its FECN, BECN and reserved bits all ones, and the rest of the
// packet up to the ICRC. mask_ip sets the IP header's variant fields to ones.
template <size_t IpLen, typename Mask>
uint32_t icrcOver(std::span<const uint8_t> ip_header, std::span<const uint8_t> udp_header,
                  std::span<const uint8_t> packet_without_icrc, Mask mask_ip) {
    if (ip_header.size() != IpLen || udp_header.size() != kUdpLen || packet_without_icrc.size() < kBthLen) {
        return 0;
    }
    std::array<uint8_t, 8 + IpLen + kUdpLen + kBthLen> pseudo{};
    std::memset(pseudo.data(), 0xff, 8);
    uint8_t *ip = pseudo.data() + 8;
    std::memcpy(ip, ip_header.data(), IpLen);
    mask_ip(ip);
    uint8_t *udp = ip + IpLen;
    std::memcpy(udp, udp_header.data(), kUdpLen);
    udp[6] = udp[7] = 0xff;  // UDP checksum
    uint8_t *bth = udp + kUdpLen;
    std::memcpy(bth, packet_without_icrc.data(), kBthLen);
    bth[4] = 0xff;  // FECN, BECN, reserved
    uint32_t c = crc(0, pseudo);
    return crc(c, packet_without_icrc.subspan(kBthLen));
}

}  // namespace

void storeIcrc(uint32_t icrc, std::span<uint8_t> packet) {
    if (packet.size() < kIcrcLen) {
        return;
    }
    uint8_t *at = packet.data() + packet.size() - kIcrcLen;
    for (size_t i = 0; i < kIcrcLen; ++i) {
        at[i] = static_cast<uint8_t>(icrc >> (8 * i));  // little-endian on the wire
    }
}

uint32_t icrcIpv4(std::span<const uint8_t> ip_header, std::span<const uint8_t> udp_header,
                  std::span<const uint8_t> packet_without_icrc) {
    return icrcOver<kIpv4Len>(ip_header, udp_header, packet_without_icrc, [](uint8_t *ip) {
        ip[1] = 0xff;            // TOS
        ip[8] = 0xff;            // TTL
        ip[10] = ip[11] = 0xff;  // header checksum
    });
}

uint32_t icrcIpv6(std::span<const uint8_t> ip6_header, std::span<const uint8_t> udp_header,
                  std::span<const uint8_t> packet_without_icrc) {
    return icrcOver<kIpv6Len>(ip6_header, udp_header, packet_without_icrc, [](uint8_t *ip) {
        ip[0] |= 0x0f;                 // traffic class, high nibble
        ip[1] = ip[2] = ip[3] = 0xff;  // traffic class, low nibble, and flow label
        ip[7] = 0xff;                  // hop limit
    });
}

void fillIcrcIpv4(std::span<const uint8_t> ip_header, std::span<const uint8_t> udp_header,
                  std::span<uint8_t> packet) {
    if (packet.size() >= kBthLen + kIcrcLen) {
        storeIcrc(icrcIpv4(ip_header, udp_header, packet.first(packet.size() - kIcrcLen)), packet);
    }
}

void fillIcrcIpv6(std::span<const uint8_t> ip6_header, std::span<const uint8_t> udp_header,
                  std::span<uint8_t> packet) {
    if (packet.size() >= kBthLen + kIcrcLen) {
        storeIcrc(icrcIpv6(ip6_header, udp_header, packet.first(packet.size() - kIcrcLen)), packet);
    }
}

uint32_t carriedIcrc(std::span<const uint8_t> packet) {
    if (packet.size() < kIcrcLen) {
        return 0;
    }
    const uint8_t *at = packet.data() + packet.size() - kIcrcLen;
    return static_cast<uint32_t>(at[0]) | static_cast<uint32_t>(at[1]) << 8 |
           static_cast<uint32_t>(at[2]) << 16 | static_cast<uint32_t>(at[3]) << 24;
}

}  // namespace softnda::roce
