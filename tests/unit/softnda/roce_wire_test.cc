// RoCEv2's wire format (roce_wire.h, SPEC.md §18): every opcode of RC, UC, UD and XRC encodes and
// parses back field for field with payloads of every pad; what cannot be a packet is refused; the
// ICRC covers what the annex says and masks what it says. The check against decoders we did not
// write (scapy's ICRC, Wireshark's dissector) is roce_wire_check.sh over roce_pcap's capture.
#include "providers/softnda/src/roce_wire.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

namespace softnda::roce {
namespace {

// Every opcode a transport has.
std::vector<uint8_t> validOpcodes() {
    std::vector<uint8_t> out;
    for (int t : {kRc, kUc, kUd, kXrc}) {
        for (int op = 0; op < 32; ++op) {
            if (layoutOf(static_cast<uint8_t>(t | op)).valid) {
                out.push_back(static_cast<uint8_t>(t | op));
            }
        }
    }
    return out;
}

Packet sample(uint8_t opcode, std::span<const uint8_t> payload) {
    Packet p;
    p.bth = Bth{opcode, true, true, 0, 0x8001, 0xabcdef, true, 0x123456};
    p.xrc_srqn = 0x0a0b0c;
    p.deth_qkey = 0x11111111;
    p.deth_src_qp = 0x222222;
    p.reth_va = 0x0102030405060708;
    p.reth_rkey = 0x33333333;
    p.reth_len = 0x44444444;
    p.atomic_va = 0x1112131415161718;
    p.atomic_rkey = 0x55555555;
    p.atomic_swap_add = 0x2122232425262728;
    p.atomic_compare = 0x3132333435363738;
    p.aeth_syndrome = 0x1f;
    p.aeth_msn = 0x654321;
    p.atomic_orig = 0x4142434445464748;
    p.imm = 0x66666666;
    p.ieth_rkey = 0x77777777;
    p.payload = layoutOf(opcode).payload ? payload : std::span<const uint8_t>();
    return p;
}

TEST(RoceWire, TheTransportsHaveTheirOpcodes) {
    // RC: Table 38 less the reserved 0x15; UC: SENDs and WRITEs; UD: SEND_ONLY (with immediate);
    // XRC: RC's.
    EXPECT_EQ(validOpcodes().size(), 23u + 12u + 2u + 23u);
    EXPECT_FALSE(layoutOf(kRc | 0x15).valid);
    EXPECT_FALSE(layoutOf(kUc | kReadRequest).valid);
    EXPECT_FALSE(layoutOf(kUc | kFetchAdd).valid);
    EXPECT_FALSE(layoutOf(kUd | kSendFirst).valid);
    EXPECT_FALSE(layoutOf(0x40 | kSendOnly).valid);  // RD
    EXPECT_EQ(layoutOf(kRc | kWriteOnlyImm).headers(), kRethLen + kImmLen);
    EXPECT_EQ(layoutOf(kRc | kAtomicAcknowledge).headers(), kAethLen + kAtomicAckLen);
    EXPECT_EQ(layoutOf(kUd | kSendOnlyImm).headers(), kDethLen + kImmLen);
    EXPECT_EQ(layoutOf(kRc | kCompareSwap).headers(), kAtomicEthLen);
    EXPECT_EQ(layoutOf(kRc | kSendOnlyInv).headers(), kIethLen);
    // An XRC request names the SRQ (XRCETH) before RC's headers; the responses are RC's.
    EXPECT_EQ(layoutOf(kXrc | kWriteOnlyImm).headers(), kXrcEthLen + kRethLen + kImmLen);
    EXPECT_EQ(layoutOf(kXrc | kFetchAdd).headers(), kXrcEthLen + kAtomicEthLen);
    EXPECT_EQ(layoutOf(kXrc | kSendMiddle).headers(), kXrcEthLen);
    EXPECT_EQ(layoutOf(kXrc | kReadResponseMiddle).headers(), 0u);
    EXPECT_EQ(layoutOf(kXrc | kAtomicAcknowledge).headers(), kAethLen + kAtomicAckLen);
    EXPECT_FALSE(layoutOf(kXrc | 0x15).valid);
}

TEST(RoceWire, EveryOpcodeRoundTripsWithEveryPad) {
    const std::array<uint8_t, 7> bytes = {1, 2, 3, 4, 5, 6, 7};
    for (uint8_t opcode : validOpcodes()) {
        for (size_t n = 0; n < bytes.size(); ++n) {
            SCOPED_TRACE(testing::Message() << "opcode 0x" << std::hex << int{opcode} << std::dec << ", " << n
                                            << " payload bytes");
            const Packet p = sample(opcode, std::span(bytes).first(n));
            std::vector<uint8_t> wire(encodedLength(p));
            ASSERT_FALSE(wire.empty());
            ASSERT_EQ(encode(p, wire), wire.size());
            EXPECT_EQ(wire.size() % 4, 0u) << "padded to four bytes";
            Packet q;
            ASSERT_TRUE(decode(wire, &q));
            const Layout l = layoutOf(opcode);
            EXPECT_EQ(q.bth.opcode, opcode);
            EXPECT_EQ(q.bth.solicited, p.bth.solicited);
            EXPECT_EQ(q.bth.migreq, p.bth.migreq);
            EXPECT_EQ(q.bth.pad, (4 - p.payload.size() % 4) % 4);
            EXPECT_EQ(q.bth.pkey, p.bth.pkey);
            EXPECT_EQ(q.bth.dest_qp, p.bth.dest_qp);
            EXPECT_EQ(q.bth.ack_req, p.bth.ack_req);
            EXPECT_EQ(q.bth.psn, p.bth.psn);
            EXPECT_EQ(std::vector<uint8_t>(q.payload.begin(), q.payload.end()),
                      std::vector<uint8_t>(p.payload.begin(), p.payload.end()));
            if (l.xrceth) {
                EXPECT_EQ(q.xrc_srqn, p.xrc_srqn);
            }
            if (l.deth) {
                EXPECT_EQ(q.deth_qkey, p.deth_qkey);
                EXPECT_EQ(q.deth_src_qp, p.deth_src_qp);
            }
            if (l.reth) {
                EXPECT_EQ(q.reth_va, p.reth_va);
                EXPECT_EQ(q.reth_rkey, p.reth_rkey);
                EXPECT_EQ(q.reth_len, p.reth_len);
            }
            if (l.atomic_eth) {
                EXPECT_EQ(q.atomic_va, p.atomic_va);
                EXPECT_EQ(q.atomic_rkey, p.atomic_rkey);
                EXPECT_EQ(q.atomic_swap_add, p.atomic_swap_add);
                EXPECT_EQ(q.atomic_compare, p.atomic_compare);
            }
            if (l.aeth) {
                EXPECT_EQ(q.aeth_syndrome, p.aeth_syndrome);
                EXPECT_EQ(q.aeth_msn, p.aeth_msn);
            }
            if (l.atomic_ack) {
                EXPECT_EQ(q.atomic_orig, p.atomic_orig);
            }
            if (l.imm) {
                EXPECT_EQ(q.imm, p.imm);
            }
            if (l.ieth) {
                EXPECT_EQ(q.ieth_rkey, p.ieth_rkey);
            }
        }
    }
}

// The BTH as the annex lays it out, byte for byte: an RC RDMA WRITE ONLY of 5 bytes.
TEST(RoceWire, TheBthIsLaidOutAsTheAnnexSays) {
    const std::array<uint8_t, 5> bytes = {0xa, 0xb, 0xc, 0xd, 0xe};
    Packet p = sample(kRc | kWriteOnly, bytes);
    std::vector<uint8_t> wire(encodedLength(p));
    ASSERT_EQ(encode(p, wire), 12u + 16u + 5u + 3u + 4u);
    const std::vector<uint8_t> bth(wire.begin(), wire.begin() + 12);
    // opcode; SE, M, pad 3, TVer 0; P_Key; reserved byte; dest QP; A; PSN.
    EXPECT_EQ(bth,
              (std::vector<uint8_t>{0x0a, 0xf0, 0x80, 0x01, 0x00, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56}));
    EXPECT_EQ(wire[12], 0x01);  // RETH's VA, big-endian
    EXPECT_EQ(wire[19], 0x08);
    EXPECT_EQ(wire[28], 0x0a);  // the payload
    EXPECT_EQ(wire[33], 0x00);  // the pad
}

// An XRC SEND FIRST: the XRCETH (a reserved byte, then the SRQ number) right after the BTH.
TEST(RoceWire, TheXrcEthFollowsTheBth) {
    const std::array<uint8_t, 4> bytes = {0xa, 0xb, 0xc, 0xd};
    Packet p = sample(kXrc | kSendFirst, bytes);
    std::vector<uint8_t> wire(encodedLength(p));
    ASSERT_EQ(encode(p, wire), 12u + 4u + 4u + 4u);
    EXPECT_EQ(wire[0], 0xa0);
    EXPECT_EQ(std::vector<uint8_t>(wire.begin() + 12, wire.begin() + 20),
              (std::vector<uint8_t>{0x00, 0x0a, 0x0b, 0x0c, 0xa, 0xb, 0xc, 0xd}));
}

TEST(RoceWire, WhatCannotBeAPacketIsRefused) {
    const std::array<uint8_t, 4> bytes = {1, 2, 3, 4};
    Packet p = sample(kRc | kSendOnly, bytes);
    std::vector<uint8_t> wire(encodedLength(p));
    ASSERT_EQ(encode(p, wire), wire.size());
    Packet q;
    for (size_t n = 0; n < kBthLen + kIcrcLen; ++n) {
        EXPECT_FALSE(decode(std::span(wire).first(n), &q)) << n << " bytes";
    }
    auto bad = wire;
    bad[0] = kRc | 0x15;  // reserved
    EXPECT_FALSE(decode(bad, &q));
    bad = wire;
    bad[1] |= 0x01;  // transport header version 1
    EXPECT_FALSE(decode(bad, &q));
    bad = wire;
    bad[1] = static_cast<uint8_t>((bad[1] & 0xcf) | 3 << 4);  // a pad of 3 is fine on 4 bytes
    EXPECT_TRUE(decode(bad, &q));
    EXPECT_EQ(q.payload.size(), 1u);
    // An acknowledgement carries no payload: two bytes more than its AETH cannot be one.
    Packet ack = sample(kRc | kAcknowledge, {});
    std::vector<uint8_t> a(encodedLength(ack) + 4);
    ASSERT_EQ(encode(ack, a), a.size() - 4);
    EXPECT_TRUE(decode(std::span(a).first(a.size() - 4), &q));
    EXPECT_FALSE(decode(a, &q));
    // A pad longer than the payload.
    Packet empty = sample(kRc | kSendOnly, {});
    std::vector<uint8_t> e(encodedLength(empty));
    ASSERT_EQ(encode(empty, e), e.size());
    e[1] |= 2 << 4;
    EXPECT_FALSE(decode(e, &q));
    // encode: no payload where the opcode carries none, no room.
    ack.payload = bytes;
    EXPECT_EQ(encodedLength(ack), 0u);
    std::vector<uint8_t> small(wire.size() - 1);
    EXPECT_EQ(encode(p, small), 0u);
}

// The ICRC covers the packet and the invariant header fields; it masks what routers change.
// A known answer, so that every build's CRC (isa-l picks a version per CPU: PCLMULQDQ, PMULL, or
// none under an emulator) is checked against one we did not compute: scapy's RoCE layer gives
// this packet (IPv4 10.0.0.1 -> 10.0.0.2, DF, TTL 64; UDP 49152 -> 4791; SEND ONLY to QP 0x11,
// MigReq, AckReq, PSN 0x102; payload "RoCEv2!\0") the ICRC bytes ed 71 db c3, and Python's
// zlib.crc32 of the masked pseudo-packet is 0xc3db71ed.
// A packet's last four bytes, where its ICRC goes (little-endian).
std::array<uint8_t, 4> lastFour(std::span<const uint8_t> packet) {
    std::array<uint8_t, 4> b{};
    std::memcpy(b.data(), packet.data() + packet.size() - b.size(), b.size());
    return b;
}

TEST(RoceWire, TheIcrcOfAKnownPacketIsScapys) {
    const std::array<uint8_t, kIpv4Len> ip = {0x45, 0x00, 0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11,
                                              0x00, 0x00, 10,   0,    0,    1,    10,   0,    0,    2};
    const std::array<uint8_t, kUdpLen> udp = {0xc0, 0x00, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00};
    std::array<uint8_t, kBthLen + 8 + kIcrcLen> packet = {0x04, 0x40, 0xff, 0xff, 0x00, 0x00, 0x00,
                                                          0x11, 0x80, 0x00, 0x01, 0x02, 'R',  'o',
                                                          'C',  'E',  'v',  '2',  '!',  0x00};
    EXPECT_EQ(icrcIpv4(ip, udp, std::span<const uint8_t>(packet).first(packet.size() - kIcrcLen)),
              0xc3db71edu);
    fillIcrcIpv4(ip, udp, packet);
    EXPECT_EQ(lastFour(packet), (std::array<uint8_t, 4>{0xed, 0x71, 0xdb, 0xc3}));
}

// The same over IPv6, a known answer from scapy 2.6's own regression test (test/contrib/roce.uts,
// "RoCE over IPv6"; Debian 12's scapy 2.5 has no ICRC over IPv6): IPv6 2022::1023 -> 2023::1024,
// traffic class 0xe2, flow label 0x1face, hop limit 255; UDP 49152 -> 4791; UC SEND ONLY to QP
// 211, MigReq, pad 2, PSN 13571856; its 20 bytes of payload. scapy gives the ICRC bytes
// 3e 5b 74 3b, and Python's zlib.crc32 of the masked pseudo-packet is 0x3b745b3e.
TEST(RoceWire, TheIcrcOfAKnownIpv6PacketIsScapys) {
    const std::array<uint8_t, kIpv6Len> ip = {
        0x6e, 0x21, 0xfa, 0xce, 0x00, 0x2c, 0x11, 0xff,                                // version to hop limit
        0x20, 0x22, 0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0x10, 0x23,  // source
        0x20, 0x23, 0,    0,    0,    0,    0,    0,    0, 0, 0, 0, 0, 0, 0x10, 0x24};  // destination
    const std::array<uint8_t, kUdpLen> udp = {0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xe7, 0xc5};
    std::array<uint8_t, kBthLen + 20 + kIcrcLen> packet = {
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, 0x46, 0x30, 0x81, 0x8b,
        0xe2, 0x89, 0x35, 0xd9, 0x0e, 0x9a, 0x95, 0x50, 0x54, 0x01, 0xbe, 0x88, 0x5e, 0x50, 0x00, 0x00};
    EXPECT_EQ(icrcIpv6(ip, udp, std::span<const uint8_t>(packet).first(packet.size() - kIcrcLen)),
              0x3b745b3eu);
    fillIcrcIpv6(ip, udp, packet);
    EXPECT_EQ(lastFour(packet), (std::array<uint8_t, 4>{0x3e, 0x5b, 0x74, 0x3b}));
    EXPECT_EQ(carriedIcrc(packet), 0x3b745b3eu);
}

using IcrcFn = uint32_t (*)(std::span<const uint8_t>, std::span<const uint8_t>, std::span<const uint8_t>);
using FillIcrcFn = void (*)(std::span<const uint8_t>, std::span<const uint8_t>, std::span<uint8_t>);

// ip_masked holds, for each byte of the IP header ip, the bits the ICRC does not cover (those the
// annex sets to ones in its pseudo-header). They, the UDP checksum and the BTH's FECN, BECN and
// reserved bits may take any value; every other bit of the IP header, the UDP header and the
// packet changes the ICRC. Each byte is tried alone, so none hides behind another.
void expectIcrcCoversInvariantFieldsOnly(std::span<const uint8_t> ip, std::span<const uint8_t> ip_masked,
                                         IcrcFn icrc, FillIcrcFn fill) {
    ASSERT_EQ(ip.size(), ip_masked.size());
    const std::array<uint8_t, 8> bytes = {1, 2, 3, 4, 5, 6, 7, 8};
    Packet p = sample(kRc | kSendOnly, bytes);
    std::vector<uint8_t> wire(encodedLength(p));
    ASSERT_EQ(encode(p, wire), wire.size());
    const std::array<uint8_t, kUdpLen> udp = {
        0xc0, 0x00, 0x12, 0xb7, 0, static_cast<uint8_t>(kUdpLen + wire.size()), 0, 0};
    fill(ip, udp, wire);
    const uint32_t sent = carriedIcrc(wire);
    const std::vector<uint8_t> body(wire.begin(), wire.end() - kIcrcLen);
    EXPECT_EQ(icrc(ip, udp, body), sent);

    std::vector<uint8_t> ip_varied(ip.begin(), ip.end());
    for (size_t at = 0; at < ip.size(); ++at) {
        ip_varied[at] ^= ip_masked[at];
        if (ip_masked[at] != 0) {
            auto one = std::vector<uint8_t>(ip.begin(), ip.end());
            one[at] ^= ip_masked[at];
            EXPECT_EQ(icrc(one, udp, body), sent) << "masked bits of IP byte " << at;
        }
        const auto covered = static_cast<uint8_t>(~ip_masked[at]);
        if (covered != 0) {
            auto one = std::vector<uint8_t>(ip.begin(), ip.end());
            one[at] ^= covered;
            EXPECT_NE(icrc(one, udp, body), sent) << "covered bits of IP byte " << at;
        }
    }
    auto udp_varied = udp;
    udp_varied[6] = 0x12;
    udp_varied[7] = 0x34;
    auto body_varied = body;
    body_varied[4] = 0xc0;
    EXPECT_EQ(icrc(ip_varied, udp_varied, body_varied), sent) << "every masked field at once";

    for (size_t at = 0; at < 6; ++at) {
        auto one = udp;
        one[at] ^= 0xff;
        EXPECT_NE(icrc(ip, one, body), sent) << "UDP byte " << at;
    }
    for (size_t at = 0; at < body.size(); ++at) {
        auto one = body;
        one[at] ^= 0xff;
        if (at == 4) {
            EXPECT_EQ(icrc(ip, udp, one), sent) << "the BTH's FECN, BECN and reserved bits";
        } else {
            EXPECT_NE(icrc(ip, udp, one), sent) << "packet byte " << at;
        }
    }
}

// Masked: TOS, TTL and the header checksum, which routers change.
TEST(RoceWire, TheIcrcCoversTheInvariantFieldsOnly) {
    const std::array<uint8_t, kIpv4Len> ip = {0x45, 0x00, 0,  52, 0x00, 0x00, 0x40, 0x00, 64, 17,
                                              0,    0,    10, 0,  0,    1,    10,   0,    0,  2};
    std::array<uint8_t, kIpv4Len> masked{};
    masked[1] = masked[8] = masked[10] = masked[11] = 0xff;
    expectIcrcCoversInvariantFieldsOnly(ip, masked, icrcIpv4, fillIcrcIpv4);
}

// Masked: the traffic class, the flow label (which Linux picks per flow) and the hop limit; the
// version, payload length, next header and both addresses are covered.
TEST(RoceWire, TheIpv6IcrcCoversTheInvariantFieldsOnly) {
    const std::array<uint8_t, kIpv6Len> ip = {
        0x62, 0x89, 0xe3, 0xa5, 0x00, 32,   17, 64,                           // version to hop limit
        0xfd, 0x00, 0x02, 0x01, 0x00, 0x09, 0,  0,  0, 0, 0, 0, 0, 0, 0, 1,   // fd00:201:9::1
        0xfd, 0x00, 0x02, 0x01, 0x00, 0x09, 0,  0,  0, 0, 0, 0, 0, 0, 0, 2};  // fd00:201:9::2
    std::array<uint8_t, kIpv6Len> masked{};
    masked[0] = 0x0f;
    masked[1] = masked[2] = masked[3] = masked[7] = 0xff;
    expectIcrcCoversInvariantFieldsOnly(ip, masked, icrcIpv6, fillIcrcIpv6);
}

// A header of the wrong size (an IPv4 header given as IPv6, one byte short or long) or a packet
// shorter than a BTH has no ICRC: 0.
TEST(RoceWire, HeadersOfTheWrongSizeHaveNoIcrc) {
    std::array<uint8_t, kIpv6Len + 1> ip{};
    ip[0] = 0x60;
    const std::array<uint8_t, kUdpLen + 1> udp = {0xc0, 0x00, 0x12, 0xb7, 0x00, 0x18};
    const std::array<uint8_t, kBthLen> bth = {0x04, 0x40, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 1, 2};
    const auto ip_of = [&](size_t n) { return std::span<const uint8_t>(ip).first(n); };
    const auto udp8 = std::span<const uint8_t>(udp).first(kUdpLen);
    ASSERT_NE(icrcIpv4(ip_of(kIpv4Len), udp8, bth), 0u);
    ASSERT_NE(icrcIpv6(ip_of(kIpv6Len), udp8, bth), 0u);
    for (size_t n : {size_t{0}, kIpv4Len - 1, kIpv4Len + 1, kIpv6Len}) {
        EXPECT_EQ(icrcIpv4(ip_of(n), udp8, bth), 0u) << n << "-byte IPv4 header";
    }
    for (size_t n : {size_t{0}, kIpv4Len, kIpv6Len - 1, kIpv6Len + 1}) {
        EXPECT_EQ(icrcIpv6(ip_of(n), udp8, bth), 0u) << n << "-byte IPv6 header";
    }
    for (size_t n : {kUdpLen - 1, kUdpLen + 1}) {
        const auto u = std::span<const uint8_t>(udp).first(n);
        EXPECT_EQ(icrcIpv4(ip_of(kIpv4Len), u, bth), 0u) << n << "-byte UDP header";
        EXPECT_EQ(icrcIpv6(ip_of(kIpv6Len), u, bth), 0u) << n << "-byte UDP header";
    }
    const auto short_bth = std::span<const uint8_t>(bth).first(kBthLen - 1);
    EXPECT_EQ(icrcIpv4(ip_of(kIpv4Len), udp8, short_bth), 0u);
    EXPECT_EQ(icrcIpv6(ip_of(kIpv6Len), udp8, short_bth), 0u);
}

}  // namespace
}  // namespace softnda::roce
