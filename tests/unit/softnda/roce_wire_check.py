#!/usr/bin/python3
"""Checks a capture with scapy's RoCE layer (scapy.contrib.roce, not ours): every frame dissects as
a BTH on UDP 4791 over IPv4 or IPv6, and the ICRC it carries is the one scapy computes.

scapy computes the ICRC over IPv6 from 2.6.0 on. An older one (Debian 12 has 2.5.0) computes
none, so there the IPv6 frames' ICRCs go unchecked and the output says so; roce_wire_test's
TheIcrcOfAKnownIpv6PacketIsScapys checks icrcIpv6 against scapy 2.6's own example instead.
PYTHONPATH may name a newer scapy.

    roce_wire_check.py CAPTURE.pcap EXPECT.txt
        roce_pcap's frames: each also with the opcode, PSN, destination QP and IP version EXPECT.txt
        says it sent.
    roce_wire_check.py --capture CAPTURE.pcap [OPCODES]
        real traffic (tcpdump); each opcode of the comma-separated OPCODES must appear in it.
"""
import logging
import sys

import scapy
from scapy.all import IP, UDP, raw, rdpcap
from scapy.contrib.roce import BTH
from scapy.error import log_runtime
from scapy.layers.inet6 import IPv6


def computes_icrc_over_ipv6():
    """Whether this scapy's BTH.compute_icrc knows IPv6: older ones warn and give zeros."""
    probe = IPv6(raw(IPv6(src="fd00::1", dst="fd00::2") / UDP(sport=49152, dport=4791) / BTH(icrc=0)))
    level = log_runtime.level
    log_runtime.setLevel(logging.ERROR)
    try:
        return probe[BTH].compute_icrc(None) != BTH.pack_icrc(0)
    finally:
        log_runtime.setLevel(level)


def main():
    capture = sys.argv[1] == "--capture"
    frames = rdpcap(sys.argv[2] if capture else sys.argv[1])
    if capture:
        expected = [None] * len(frames)
        needed = {int(x, 0) for x in sys.argv[3].split(",") if x} if len(sys.argv) > 3 else set()
    else:
        expected = [tuple(int(x) for x in line.split()) for line in open(sys.argv[2])]
        needed = set()
    if len(frames) != len(expected) or not frames:
        print(f"scapy: {len(frames)} frames, {len(expected)} expected")
        return 1
    ipv6_icrc = computes_icrc_over_ipv6()
    bad = set()
    seen = {}
    by_version = {4: 0, 6: 0}
    icrc_checked = 0
    for i, (frame, sent) in enumerate(zip(frames, expected), start=1):
        version = 6 if IPv6 in frame else 4 if IP in frame else None
        if version is None or BTH not in frame or UDP not in frame or frame[UDP].dport != 4791:
            print(f"scapy: frame {i} has no BTH on UDP 4791 over IPv4 or IPv6: {frame.summary()}")
            bad.add(i)
            continue
        by_version[version] += 1
        bth = frame[BTH]
        seen[bth.opcode] = seen.get(bth.opcode, 0) + 1
        if version == 4 or ipv6_icrc:
            icrc_checked += 1
            carried = raw(frame)[-4:]
            computed = bth.compute_icrc(None)
            if carried != computed:
                print(f"scapy: frame {i} (opcode {bth.opcode:#04x}, IPv{version}): ICRC {carried.hex()} "
                      f"sent, {computed.hex()} computed")
                bad.add(i)
        if sent is not None and ((bth.opcode, bth.psn, bth.dqpn), version) != (sent[:3], sent[4]):
            opcode, psn, dqpn = sent[:3]
            print(f"scapy: frame {i}: opcode/psn/dqpn {bth.opcode:#x}/{bth.psn:#x}/{bth.dqpn:#x} "
                  f"over IPv{version}, sent {opcode:#x}/{psn:#x}/{dqpn:#x} over IPv{sent[4]}")
            bad.add(i)
    print(f"scapy: {len(frames)} frames ({by_version[4]} over IPv4, {by_version[6]} over IPv6), "
          f"{len(frames) - len(bad)} right, {icrc_checked} ICRCs compared; by opcode: "
          + " ".join(f"{op:#04x}:{n}" for op, n in sorted(seen.items())))
    if by_version[6] and not ipv6_icrc:
        print(f"scapy: NOT CHECKED: the ICRCs of the {by_version[6]} IPv6 frames: scapy "
              f"{scapy.__version__} computes no ICRC over IPv6 (2.6.0 and later do; PYTHONPATH may name one)")
    missing = sorted(needed - set(seen))
    if missing:
        print("scapy: no frame of opcode " + ", ".join(f"{op:#04x}" for op in missing))
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
