// Writes a capture of RoCEv2 frames made by roce_wire.h, one per opcode of RC, UC, UD and XRC, with
// payloads of every pad, for decoders we did not write to judge (roce_wire_check.sh); each
// packet twice, over IPv4 and then over IPv6, as a host's UDP socket sends them:
//  - Ethernet, IPv4 (DF, identification 0), UDP with no checksum (RoCEv2 allows 0 over IPv4);
//  - Ethernet, IPv6 (a flow label of its own per flow, as Linux picks one), UDP with its
//    checksum, which IPv6 requires (RFC 8200 §8.1);
// both to port 4791 with the source port as flow entropy, then the packet and its ICRC.
//
//   roce_pcap OUT.pcap EXPECT.txt
// EXPECT.txt: one line per frame, "opcode psn dest_qp payload_length ip_version", decimal.
#include <cstdio>
#include <cstring>
#include <vector>

#include "providers/softnda/src/roce_wire.h"

namespace {

using namespace softnda::roce;

constexpr size_t kEthLen = 14;
constexpr uint8_t kUdpProtocol = 17;

void put16(uint8_t *p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}

// The Internet checksum (RFC 1071): the ones' complement sum of big-endian 16-bit words, an odd
// last byte padded with zero. sum carries a partial sum from before.
uint32_t onesSum(uint32_t sum, const uint8_t *p, size_t n) {
    for (size_t i = 0; i + 1 < n; i += 2) {
        sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
    }
    if (n % 2 != 0) {
        sum += static_cast<uint32_t>(p[n - 1] << 8);
    }
    return sum;
}
uint16_t checksum(uint32_t sum) {
    while (sum >> 16) {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    return static_cast<uint16_t>(~sum);
}

// An IPv4 header with its checksum.
void ipv4Header(uint8_t *ip, size_t udp_length) {
    ip[0] = 0x45;
    put16(ip + 2, static_cast<uint32_t>(kIpv4Len + udp_length));
    put16(ip + 6, 0x4000);  // DF
    ip[8] = 64;
    ip[9] = kUdpProtocol;
    const uint8_t addrs[8] = {10, 77, 0, 1, 10, 77, 0, 2};
    std::memcpy(ip + 12, addrs, 8);
    put16(ip + 10, checksum(onesSum(0, ip, kIpv4Len)));
}

// An IPv6 header from fd00:201:9::1 to fd00:201:9::2; traffic class 0, hop limit 64.
void ipv6Header(uint8_t *ip, size_t udp_length, uint32_t flow_label) {
    ip[0] = 0x60;                                           // version; traffic class, high nibble
    ip[1] = static_cast<uint8_t>(flow_label >> 16 & 0x0f);  // traffic class, low nibble; flow label
    put16(ip + 2, flow_label);
    put16(ip + 4, static_cast<uint32_t>(udp_length));
    ip[6] = kUdpProtocol;
    ip[7] = 64;
    const uint8_t prefix[6] = {0xfd, 0x00, 0x02, 0x01, 0x00, 0x09};
    std::memcpy(ip + 8, prefix, 6);
    ip[23] = 1;
    std::memcpy(ip + 24, prefix, 6);
    ip[39] = 2;
}

// The UDP checksum over IPv6's pseudo-header (RFC 8200 §8.1): source, destination, the UDP
// length and the next header, then the UDP header and payload; 0 goes out as 0xffff.
uint16_t udpChecksumIpv6(const uint8_t *ip, const uint8_t *udp, size_t udp_length) {
    uint32_t sum = onesSum(0, ip + 8, 32);
    sum += static_cast<uint32_t>(udp_length >> 16) + static_cast<uint32_t>(udp_length & 0xffff);
    sum += kUdpProtocol;
    sum = onesSum(sum, udp, udp_length);
    const uint16_t c = checksum(sum);
    return c == 0 ? 0xffff : c;
}

std::vector<uint8_t> frame(const Packet &p, uint16_t sport, bool ipv6) {
    const size_t roce = encodedLength(p);
    const size_t ip_len = ipv6 ? kIpv6Len : kIpv4Len;
    const size_t udp_length = kUdpLen + roce;
    std::vector<uint8_t> f(kEthLen + ip_len + udp_length);
    uint8_t *eth = f.data();
    const uint8_t macs[12] = {0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1};
    std::memcpy(eth, macs, 12);
    put16(eth + 12, ipv6 ? 0x86dd : 0x0800);
    uint8_t *ip = eth + kEthLen;
    if (ipv6) {
        ipv6Header(ip, udp_length, 0x10000u | sport);
    } else {
        ipv4Header(ip, udp_length);
    }
    uint8_t *udp = ip + ip_len;
    put16(udp, sport);
    put16(udp + 2, kUdpPort);
    put16(udp + 4, static_cast<uint32_t>(udp_length));
    std::span<uint8_t> body(udp + kUdpLen, roce);
    encode(p, body);
    const std::span<const uint8_t> ip_header(ip, ip_len), udp_header(udp, kUdpLen);
    if (ipv6) {
        // The ICRC first: the UDP checksum covers it (and the ICRC masks the checksum).
        fillIcrcIpv6(ip_header, udp_header, body);
        put16(udp + 6, udpChecksumIpv6(ip, udp, udp_length));
    } else {
        fillIcrcIpv4(ip_header, udp_header, body);
    }
    return f;
}

void write32(FILE *f, uint32_t v) {
    fwrite(&v, 4, 1, f);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: roce_pcap OUT.pcap EXPECT.txt\n");
        return 2;
    }
    FILE *pcap = fopen(argv[1], "wb");
    FILE *expect = fopen(argv[2], "w");
    if (pcap == nullptr || expect == nullptr) {
        perror("roce_pcap");
        return 1;
    }
    // pcap's global header (host byte order, as libpcap writes it): v2.4, Ethernet.
    write32(pcap, 0xa1b2c3d4);
    const uint16_t version[2] = {2, 4};
    fwrite(version, 2, 2, pcap);
    write32(pcap, 0);
    write32(pcap, 0);
    write32(pcap, 65535);
    write32(pcap, 1);
    const uint8_t bytes[7] = {0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76};
    std::vector<Packet> packets;
    for (int t : {kRc, kUc, kUd, kXrc}) {
        for (int op = 0; op < 32; ++op) {
            const auto opcode = static_cast<uint8_t>(t | op);
            const Layout l = layoutOf(opcode);
            if (!l.valid) {
                continue;
            }
            const auto n = static_cast<uint32_t>(packets.size());
            Packet p;
            p.bth.opcode = opcode;
            p.bth.dest_qp = 0x100 + n;
            p.bth.psn = 0xfff000 + n;  // PSNs near the 24-bit wrap
            p.bth.ack_req = (t == kRc || t == kXrc) && l.payload;
            p.xrc_srqn = 0x31 + n;
            p.deth_qkey = 0x11111111;
            p.deth_src_qp = 0x42;
            p.reth_va = 0x7f0000001000ull + n;
            p.reth_rkey = 0x1234;
            p.reth_len = 4096;
            p.atomic_va = 0x7f0000002000ull;
            p.atomic_rkey = 0x5678;
            p.atomic_swap_add = 5;
            p.atomic_compare = 9;
            p.aeth_msn = n;
            p.atomic_orig = 77;
            p.imm = 0xdeadbeef;
            p.ieth_rkey = 0x80000101;
            p.payload = l.payload ? std::span<const uint8_t>(bytes, n % 8 == 7 ? 0 : n % 8)
                                  : std::span<const uint8_t>();
            packets.push_back(p);
        }
    }
    uint32_t frames = 0;
    for (bool ipv6 : {false, true}) {
        for (size_t i = 0; i < packets.size(); ++i) {
            const Packet &p = packets[i];
            const std::vector<uint8_t> f = frame(p, static_cast<uint16_t>(0xc000 + i), ipv6);
            write32(pcap, frames);  // seconds
            write32(pcap, 0);
            write32(pcap, static_cast<uint32_t>(f.size()));
            write32(pcap, static_cast<uint32_t>(f.size()));
            fwrite(f.data(), 1, f.size(), pcap);
            fprintf(expect, "%u %u %u %zu %d\n", p.bth.opcode, p.bth.psn, p.bth.dest_qp, p.payload.size(),
                    ipv6 ? 6 : 4);
            ++frames;
        }
    }
    const bool ok = fclose(pcap) == 0 && fclose(expect) == 0;
    printf("roce_pcap: %u frames, %zu opcodes over IPv4 and IPv6\n", frames, packets.size());
    return ok ? 0 : 1;
}
