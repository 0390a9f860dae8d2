// RoCEv2's wire format (IBTA Vol. 1 ch. 9 and the RoCEv2 annex A17; softnda SPEC.md §18): the
// Base Transport Header, the extension headers an opcode carries, the payload with its pad, and
// the invariant CRC. Encoding and parsing only: no state, no socket. Byte order on the wire is
// big-endian for every header field; the ICRC alone is little-endian, as rxe and NICs send it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softnda::roce {

inline constexpr uint16_t kUdpPort = 4791;  // IANA's port for RoCEv2
inline constexpr size_t kBthLen = 12, kRethLen = 16, kAethLen = 4, kAtomicEthLen = 28, kAtomicAckLen = 8,
                        kImmLen = 4, kIethLen = 4, kDethLen = 8, kXrcEthLen = 4, kIcrcLen = 4;
inline constexpr size_t kIpv4Len = 20, kIpv6Len = 40, kUdpLen = 8;

// The transport in an opcode's top three bits.
inline constexpr uint8_t kRc = 0x00, kUc = 0x20, kUd = 0x60, kXrc = 0xa0;

// The operation in an opcode's low five bits (IBTA Table 38).
enum Op : uint8_t {
    kSendFirst = 0x00,
    kSendMiddle = 0x01,
    kSendLast = 0x02,
    kSendLastImm = 0x03,
    kSendOnly = 0x04,
    kSendOnlyImm = 0x05,
    kWriteFirst = 0x06,
    kWriteMiddle = 0x07,
    kWriteLast = 0x08,
    kWriteLastImm = 0x09,
    kWriteOnly = 0x0a,
    kWriteOnlyImm = 0x0b,
    kReadRequest = 0x0c,
    kReadResponseFirst = 0x0d,
    kReadResponseMiddle = 0x0e,
    kReadResponseLast = 0x0f,
    kReadResponseOnly = 0x10,
    kAcknowledge = 0x11,
    kAtomicAcknowledge = 0x12,
    kCompareSwap = 0x13,
    kFetchAdd = 0x14,
    kSendLastInv = 0x16,
    kSendOnlyInv = 0x17,
};

// What follows an opcode's BTH, in wire order: XRCETH (an XRC request's), DETH, RETH, AtomicETH,
// AETH, AtomicAckETH, ImmDt, IETH, then the payload. valid is false for an opcode the transport
// does not have.
struct Layout {
    bool valid = false;
    bool xrceth = false, deth = false, reth = false, atomic_eth = false, aeth = false, atomic_ack = false,
         imm = false, ieth = false, payload = false;
    size_t headers() const;  // their bytes after the BTH
};
Layout layoutOf(uint8_t opcode);

struct Bth {
    uint8_t opcode = 0;
    bool solicited = false;
    bool migreq = false;
    uint8_t pad = 0;  // bytes after the payload to make it a multiple of 4 (set by encode)
    uint16_t pkey = 0xffff;
    uint32_t dest_qp = 0;  // 24 bits
    bool ack_req = false;
    uint32_t psn = 0;  // 24 bits
};

// One packet: the fields of the headers its opcode carries (the others are ignored) and its
// payload.
struct Packet {
    Bth bth;
    uint32_t xrc_srqn = 0;                                            // XRCETH: 24 bits
    uint32_t deth_qkey = 0, deth_src_qp = 0;                          // DETH (UD)
    uint64_t reth_va = 0;                                             // RETH
    uint32_t reth_rkey = 0, reth_len = 0;                             //
    uint64_t atomic_va = 0, atomic_swap_add = 0, atomic_compare = 0;  // AtomicETH
    uint32_t atomic_rkey = 0;                                         //
    uint8_t aeth_syndrome = 0;                                        // AETH
    uint32_t aeth_msn = 0;                                            // 24 bits
    uint64_t atomic_orig = 0;                                         // AtomicAckETH
    uint32_t imm = 0;                                                 // ImmDt (big-endian on the wire)
    uint32_t ieth_rkey = 0;                                           // IETH
    std::span<const uint8_t> payload;
};

// The bytes encode writes for p: BTH, headers, payload, pad and ICRC; 0 for an invalid opcode or
// a payload on an opcode that carries none.
size_t encodedLength(const Packet &p);
// Writes p into out (the UDP payload), the ICRC left zero (fillIcrcIpv4 sets it once the IP and
// UDP headers are known); sets the BTH pad count. The length written, or 0 as encodedLength
// says, or when out is too small.
size_t encode(const Packet &p, std::span<uint8_t> out);
// Parses a UDP payload; false when it cannot be a packet: an unknown opcode, a transport header
// version other than 0, fewer bytes than its headers and ICRC, a pad count larger than the
// payload, or a payload on an opcode that carries none. p->payload points into in. The ICRC is
// not checked here (icrcIpv4).
bool decode(std::span<const uint8_t> in, Packet *p);

// The invariant CRC of a RoCEv2 packet over IPv4 (annex A17.3.3, rxe_icrc.c): CRC-32 over eight
// bytes of 0xff (the absent LRH), the IPv4 header with TOS, TTL and checksum all ones, the UDP
// header with its checksum all ones, the BTH with its FECN, BECN and reserved bits all ones, and
// the rest of the packet up to the ICRC.
uint32_t icrcIpv4(std::span<const uint8_t> ip_header, std::span<const uint8_t> udp_header,
                  std::span<const uint8_t> packet_without_icrc);
// Computes and stores the ICRC in the last four bytes of packet (the whole UDP payload).
void fillIcrcIpv4(std::span<const uint8_t> ip_header, std::span<const uint8_t> udp_header,
                  std::span<uint8_t> packet);
// The same over IPv6 (rxe_icrc.c): the IPv6 header with traffic class, flow label and hop limit
// all ones in place of the IPv4 header.
uint32_t icrcIpv6(std::span<const uint8_t> ip6_header, std::span<const uint8_t> udp_header,
                  std::span<const uint8_t> packet_without_icrc);
void fillIcrcIpv6(std::span<const uint8_t> ip6_header, std::span<const uint8_t> udp_header,
                  std::span<uint8_t> packet);
// Stores icrc in the last four bytes of packet, little-endian as it goes on the wire.
void storeIcrc(uint32_t icrc, std::span<uint8_t> packet);
// The ICRC a packet carries in its last four bytes.
uint32_t carriedIcrc(std::span<const uint8_t> packet);

}  // namespace softnda::roce
