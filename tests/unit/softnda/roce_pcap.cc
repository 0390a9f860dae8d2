// Writes a capture of RoCEv2 frames made by roce_wire.h, one per opcode of RC, UC and UD, with
// payloads of every pad, for decoders we did not write to judge (roce_wire_check.sh): Ethernet,
// IPv4 (DF, identification 0, as a Linux UDP socket sends one), UDP to port 4791 with the source
// port as flow entropy and no checksum (RoCEv2 allows 0), the packet and its ICRC.
//
//   roce_pcap OUT.pcap EXPECT.txt
// EXPECT.txt: one line per frame, "opcode psn dest_qp payload_length", decimal.
#include <cstdio>
#include <cstring>
#include <vector>

#include "providers/softnda/src/roce_wire.h"

namespace {

using namespace softnda::roce;

void put16(uint8_t *p, uint32_t v) {
    p[0] = static_cast<uint8_t>(v >> 8);
    p[1] = static_cast<uint8_t>(v);
}

// The IPv4 header checksum (RFC 791): ones' complement of the ones' complement sum.
uint16_t ipChecksum(const uint8_t *h) {
    uint32_t sum = 0;
    for (size_t i = 0; i < kIpv4Len; i += 2) {
        sum += static_cast<uint32_t>(h[i] << 8 | h[i + 1]);
    }
    while (sum >> 16) {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    return static_cast<uint16_t>(~sum);
}

std::vector<uint8_t> frame(const Packet &p, uint16_t sport) {
    const size_t roce = encodedLength(p);
    std::vector<uint8_t> f(14 + kIpv4Len + kUdpLen + roce);
    uint8_t *eth = f.data();
    const uint8_t macs[12] = {0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1};
    std::memcpy(eth, macs, 12);
    put16(eth + 12, 0x0800);
    uint8_t *ip = eth + 14;
    ip[0] = 0x45;
    put16(ip + 2, static_cast<uint32_t>(kIpv4Len + kUdpLen + roce));
    put16(ip + 6, 0x4000);  // DF
    ip[8] = 64;
    ip[9] = 17;
    const uint8_t addrs[8] = {10, 77, 0, 1, 10, 77, 0, 2};
    std::memcpy(ip + 12, addrs, 8);
    put16(ip + 10, ipChecksum(ip));
    uint8_t *udp = ip + kIpv4Len;
    put16(udp, sport);
    put16(udp + 2, kUdpPort);
    put16(udp + 4, static_cast<uint32_t>(kUdpLen + roce));
    std::span<uint8_t> body(udp + kUdpLen, roce);
    encode(p, body);
    fillIcrcIpv4(std::span<const uint8_t>(ip, kIpv4Len), std::span<const uint8_t>(udp, kUdpLen), body);
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
    uint32_t n = 0;
    for (int t : {kRc, kUc, kUd}) {
        for (int op = 0; op < 32; ++op) {
            const auto opcode = static_cast<uint8_t>(t | op);
            const Layout l = layoutOf(opcode);
            if (!l.valid) {
                continue;
            }
            Packet p;
            p.bth.opcode = opcode;
            p.bth.dest_qp = 0x100 + n;
            p.bth.psn = 0xfff000 + n;  // PSNs near the 24-bit wrap
            p.bth.ack_req = t == kRc && l.payload;
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
            const std::vector<uint8_t> f = frame(p, static_cast<uint16_t>(0xc000 + n));
            write32(pcap, n);  // seconds
            write32(pcap, 0);
            write32(pcap, static_cast<uint32_t>(f.size()));
            write32(pcap, static_cast<uint32_t>(f.size()));
            fwrite(f.data(), 1, f.size(), pcap);
            fprintf(expect, "%u %u %u %zu\n", opcode, p.bth.psn, p.bth.dest_qp, p.payload.size());
            ++n;
        }
    }
    const bool ok = fclose(pcap) == 0 && fclose(expect) == 0;
    printf("roce_pcap: %u frames\n", n);
    return ok ? 0 : 1;
}
