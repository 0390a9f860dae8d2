#!/usr/bin/python3
"""Checks roce_pcap's capture with scapy's RoCE layer (scapy.contrib.roce, not ours): every frame
dissects as a BTH on UDP 4791 with the opcode, PSN and destination QP roce_pcap says it sent, and
the ICRC it carries is the one scapy computes.

    roce_wire_check.py CAPTURE.pcap EXPECT.txt
"""
import sys

from scapy.all import UDP, raw, rdpcap
from scapy.contrib.roce import BTH


def main():
    frames = rdpcap(sys.argv[1])
    expected = [tuple(int(x) for x in line.split()) for line in open(sys.argv[2])]
    if len(frames) != len(expected):
        print(f"scapy: {len(frames)} frames, {len(expected)} expected")
        return 1
    bad = 0
    for i, (frame, (opcode, psn, dqpn, _)) in enumerate(zip(frames, expected), start=1):
        if BTH not in frame or frame[UDP].dport != 4791:
            print(f"scapy: frame {i} has no BTH on UDP 4791: {frame.summary()}")
            bad += 1
            continue
        bth = frame[BTH]
        carried = raw(frame)[-4:]
        computed = bth.compute_icrc(None)
        if carried != computed:
            print(f"scapy: frame {i} (opcode {opcode:#04x}): ICRC {carried.hex()} sent, {computed.hex()} computed")
            bad += 1
        if (bth.opcode, bth.psn, bth.dqpn) != (opcode, psn, dqpn):
            print(f"scapy: frame {i}: opcode/psn/dqpn {bth.opcode:#x}/{bth.psn:#x}/{bth.dqpn:#x}, "
                  f"sent {opcode:#x}/{psn:#x}/{dqpn:#x}")
            bad += 1
    print(f"scapy: {len(frames)} frames, {len(frames) - bad} with the ICRC and BTH as sent")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
