#!/usr/bin/python3
"""UD datagrams between two hosts (RoCEv2, softnda SPEC.md §18): what each receive holds, checked
byte by byte, as a RoCE device must deliver it. Plain pyverbs (Debian's python3-pyverbs), one
process on each host.

    ibv-extend-run -- pyverbs_ud_wire.py DEVICE GID_INDEX server|client N

The two sides meet through the test, line by line, as pyverbs_wire.py's do: each prints
"ADDR qpn gid" and reads the peer's; the server prints "READY" once its receives are posted, and
the client, given a line, sends N datagrams of distinct lengths and patterns (odd ones with
immediate data) through an address handle with the server's GID, then prints "DONE". The server
checks each receive:
  - its completion: opcode RECV, the GRH flag, byte_len 40 + the length, the client's QP as
    src_qp, the immediate data where sent;
  - its first 40 bytes, as the RoCEv2 annex (A17.4.5.2) and rdma_rxe lay them out for an IPv4
    packet: 20 bytes of zero, then the packet's IPv4 header (version 4, protocol UDP, a valid
    header checksum, the client's address as source and the server's as destination, and the
    client's address handle's traffic class and hop limit as TOS and TTL); between IPv6 GIDs, the
    packet's IPv6 header (next header UDP, its payload length, the two GIDs, the traffic class
    and hop limit);
  - the payload after them.
A datagram is unreliable, so the client waits for the server's receives to be posted and sends
few enough for them all; one lost on this veth is a failure. Both sides may be on one host (the
same device): the datagrams then stay in shared memory, behind the header they would have had.
Each side prints "OK" at the end, or exits non-zero with what was wrong.
"""
import ipaddress
import struct
import sys

import pyverbs.enums as e
from pyverbs.addr import GID, AH, AHAttr, GlobalRoute
from pyverbs.qp import QPAttr
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs_kit import fail, line, meet, poll, queue_pair, say

QKEY = 0x1EE7
GRH = 40
SLOT = 1024 + GRH
TCLASS, HOP_LIMIT = 0x48, 17  # the client's address handle: DSCP 18, ECN bits clear


def length(i):
    return 1 + (i * 37) % 1000  # within a 1024-byte MTU


def pattern(i, n):
    return bytes((i * 31 + j * 7 + (j >> 8)) & 0xFF for j in range(n))


def check_grh(grh, src_gid, dst_gid, length, i):
    src, dst = ipaddress.IPv6Address(src_gid), ipaddress.IPv6Address(dst_gid)
    # UDP, BTH, DETH, ImmDt (odd ones), payload, pad, ICRC.
    udp = 8 + 12 + 8 + (4 if i % 2 else 0) + length + (4 - length % 4) % 4 + 4
    if src.ipv4_mapped is None:
        check_ipv6_grh(grh, src, dst, udp, i)
        return
    src, dst = src.ipv4_mapped.packed, dst.ipv4_mapped.packed
    if grh[:20] != bytes(20):
        fail(f"datagram {i}: the GRH's first 20 bytes are not zero: {grh[:20].hex()}")
    ip = grh[20:]
    version_ihl, tos, total, _ident, _frag, ttl, proto, _csum, saddr, daddr = struct.unpack(
        "!BBHHHBBH4s4s", ip)
    if version_ihl != 0x45 or proto != 17:
        fail(f"datagram {i}: not an IPv4 header of UDP: {ip.hex()}")
    want = 20 + udp
    if total != want:
        fail(f"datagram {i}: IPv4 total length {total}, expected {want}")
    words = struct.unpack("!10H", ip)
    if (sum(words) + (sum(words) >> 16)) & 0xFFFF != 0xFFFF:
        fail(f"datagram {i}: IPv4 header checksum does not add up: {ip.hex()}")
    if saddr != src or daddr != dst:
        fail(f"datagram {i}: IPv4 {saddr.hex()} -> {daddr.hex()}, expected {src.hex()} -> {dst.hex()}")
    # Between two hosts on one link nothing routes the packet, so its TTL arrives as sent.
    if tos != TCLASS or ttl != HOP_LIMIT:
        fail(f"datagram {i}: IPv4 TOS {tos:#x} TTL {ttl}, expected the address handle's {TCLASS:#x} and "
             f"{HOP_LIMIT}")


def check_ipv6_grh(grh, src, dst, udp, i):
    """The whole 40 bytes are the packet's IPv6 header. Its flow label is the one it arrived with:
    0, a UD datagram's (its work request carries no flow label)."""
    word, payload_len, next_header, hop_limit = struct.unpack("!IHBB", grh[:8])
    version, tclass, flow = word >> 28, (word >> 20) & 0xFF, word & 0xFFFFF
    if flow != 0:
        fail(f"datagram {i}: IPv6 flow label {flow:#x}, expected the datagram's 0")
    if version != 6 or next_header != 17 or payload_len != udp:
        fail(f"datagram {i}: not the IPv6 header of its UDP datagram ({udp} bytes): {grh.hex()}")
    saddr, daddr = ipaddress.IPv6Address(grh[8:24]), ipaddress.IPv6Address(grh[24:40])
    if saddr != src or daddr != dst:
        fail(f"datagram {i}: IPv6 {saddr} -> {daddr}, expected {src} -> {dst}")
    if tclass != TCLASS or hop_limit != HOP_LIMIT:
        fail(f"datagram {i}: IPv6 traffic class {tclass:#x} hop limit {hop_limit}, expected the address "
             f"handle's {TCLASS:#x} and {HOP_LIMIT}")


def main(name, gid_index, role, n):
    ctx, pd, cq, qp, buf = queue_pair(name, e.IBV_QPT_UD, n, SLOT)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qkey = QKEY
    qp.to_init(attr)
    qp.to_rtr(QPAttr(qp_state=e.IBV_QPS_RTR))
    attr = QPAttr(qp_state=e.IBV_QPS_RTS)
    attr.sq_psn = 0
    qp.to_rts(attr)
    peer_qpn, peer_gid, gid = meet(ctx, qp, gid_index)

    if role == "server":
        for i in range(n):
            sge = SGE(buf.buf + i * SLOT, SLOT, buf.lkey)
            qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[sge]))
        say("READY")
        wcs = poll(cq, n, "receive")
        for i, wc in enumerate(sorted(wcs, key=lambda w: w.wr_id)):
            # A datagram takes the next receive: the i-th sent lands in the i-th posted.
            if wc.opcode != e.IBV_WC_RECV or not wc.wc_flags & e.IBV_WC_GRH:
                fail(f"receive {i}: opcode {wc.opcode}, flags {wc.wc_flags:#x}")
            if wc.byte_len != GRH + length(i) or wc.src_qp != peer_qpn:
                fail(f"receive {i}: byte_len {wc.byte_len}, src_qp {wc.src_qp}; expected "
                     f"{GRH + length(i)} from {peer_qpn}")
            if (i % 2 == 1) != bool(wc.wc_flags & e.IBV_WC_WITH_IMM) or (i % 2 and wc.imm_data != 0x1000 + i):
                fail(f"receive {i}: immediate flags {wc.wc_flags:#x} data {wc.imm_data:#x}")
            got = buf.read(GRH + length(i), i * SLOT)
            check_grh(got[:GRH], peer_gid, gid, length(i), i)
            if got[GRH:] != pattern(i, length(i)):
                fail(f"receive {i}: payload differs")
        line()
    else:
        line()
        route = GlobalRoute(dgid=GID(peer_gid), sgid_index=gid_index, hop_limit=HOP_LIMIT, traffic_class=TCLASS)
        ah = AH(pd, attr=AHAttr(gr=route, is_global=1, port_num=1))
        for i in range(n):
            buf.write(pattern(i, length(i)), length(i), i * SLOT)
            sge = SGE(buf.buf + i * SLOT, length(i), buf.lkey)
            opcode = e.IBV_WR_SEND_WITH_IMM if i % 2 else e.IBV_WR_SEND
            wr = SendWR(wr_id=i, opcode=opcode, num_sge=1, sg=[sge])
            if i % 2:
                wr.imm_data = 0x1000 + i
            wr.set_wr_ud(ah, peer_qpn, QKEY)
            qp.post_send(wr)
            poll(cq, 1, f"send {i}")
        say("DONE")
    say("OK")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[3] not in ("server", "client"):
        fail("usage: pyverbs_ud_wire.py DEVICE GID_INDEX server|client N")
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
