#!/usr/bin/python3
"""Checks a capture with scapy's RoCE layer (scapy.contrib.roce, not ours): every frame dissects as
a BTH on UDP 4791 and the ICRC it carries is the one scapy computes.

    roce_wire_check.py CAPTURE.pcap EXPECT.txt
        roce_pcap's frames: each also with the opcode, PSN and destination QP EXPECT.txt says it sent.
    roce_wire_check.py --capture CAPTURE.pcap [OPCODES]
        real traffic (tcpdump); each opcode of the comma-separated OPCODES must appear in it.
"""
import sys

from scapy.all import UDP, raw, rdpcap
from scapy.contrib.roce import BTH


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
    bad = 0
    seen = {}
    for i, (frame, sent) in enumerate(zip(frames, expected), start=1):
        if BTH not in frame or UDP not in frame or frame[UDP].dport != 4791:
            print(f"scapy: frame {i} has no BTH on UDP 4791: {frame.summary()}")
            bad += 1
            continue
        bth = frame[BTH]
        seen[bth.opcode] = seen.get(bth.opcode, 0) + 1
        carried = raw(frame)[-4:]
        computed = bth.compute_icrc(None)
        if carried != computed:
            print(f"scapy: frame {i} (opcode {bth.opcode:#04x}): ICRC {carried.hex()} sent, "
                  f"{computed.hex()} computed")
            bad += 1
        if sent is not None and (bth.opcode, bth.psn, bth.dqpn) != sent[:3]:
            opcode, psn, dqpn = sent[:3]
            print(f"scapy: frame {i}: opcode/psn/dqpn {bth.opcode:#x}/{bth.psn:#x}/{bth.dqpn:#x}, "
                  f"sent {opcode:#x}/{psn:#x}/{dqpn:#x}")
            bad += 1
    print(f"scapy: {len(frames)} frames, {len(frames) - bad} with the ICRC and BTH as sent; by opcode: "
          + " ".join(f"{op:#04x}:{n}" for op, n in sorted(seen.items())))
    missing = sorted(needed - set(seen))
    if missing:
        print("scapy: no frame of opcode " + ", ".join(f"{op:#04x}" for op in missing))
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main())
