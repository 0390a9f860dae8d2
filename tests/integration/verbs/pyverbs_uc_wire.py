#!/usr/bin/python3
"""UC between two hosts under the engine's injected loss, duplication and reordering (softnda
SPEC.md §18): a UC message that loses a packet is dropped whole, and what does arrive is whole,
in order and never twice. Plain pyverbs (Debian's python3-pyverbs), one process on each host.

    ibv-extend-run -- pyverbs_uc_wire.py DEVICE GID_INDEX server|client N

The two sides meet through the test, line by line, as pyverbs_wire.py's do: each prints
"ADDR qpn gid" and reads the peer's; the server posts N receives and prints "READY"; the client,
given a line, sends N SENDs of 3000 bytes (three packets at a 1024-byte MTU: FIRST, MIDDLE,
LAST), each carrying its index and a pattern of it, and prints "DONE". The server, given a line,
takes what arrived until nothing more comes for a second, and checks that every receive holds one
whole message (length, index, pattern), that the indices only grow (nothing twice, nothing out of
order), and reports "GOT k" (how many of the N arrived) before "OK". The test judges k: with the
faults in place some must be missing, or the case proved nothing.
"""
import struct
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.qp import QPAttr
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs_kit import fail, line, meet, poll, queue_pair, say

LENGTH = 3000
SLOT = 4096
PSN = {"server": 0xFFFFF0, "client": 0xFFFFC0}  # both cross the 24-bit wrap
QUIET = 1.0  # seconds with no receive after the client is done: the rest was dropped


def message(i):
    body = bytes(((i * 131 + j * 7) >> (j % 3)) & 0xFF for j in range(LENGTH - 4))
    return struct.pack("<I", i) + body


def main(name, gid_index, role, n):
    ctx, pd, cq, qp, buf = queue_pair(name, e.IBV_QPT_UC, n, SLOT)
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
    qp.to_init(attr)
    peer_qpn, peer_gid, _ = meet(ctx, qp, gid_index)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = peer_qpn
    attr.rq_psn = PSN["client" if role == "server" else "server"]
    attr.ah_attr = AHAttr(gr=GlobalRoute(dgid=GID(peer_gid), sgid_index=gid_index, hop_limit=64),
                          is_global=1, port_num=1)
    qp.to_rtr(attr)
    attr.qp_state = e.IBV_QPS_RTS
    attr.sq_psn = PSN[role]
    qp.to_rts(attr)

    if role == "server":
        for i in range(n):
            qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(buf.buf + i * SLOT, SLOT, buf.lkey)]))
        say("READY")
        line()
        wcs, last = [], time.monotonic()
        while time.monotonic() - last < QUIET:
            got_n, got = cq.poll(n)
            for wc in got[:got_n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    fail(f"receive {wc.wr_id}: status {wc.status}")
                wcs.append(wc)
                last = time.monotonic()
        previous = -1
        for k, wc in enumerate(wcs):
            if wc.wr_id != k or wc.opcode != e.IBV_WC_RECV or wc.byte_len != LENGTH:
                fail(f"receive {k}: wr_id {wc.wr_id}, opcode {wc.opcode}, {wc.byte_len} bytes")
            got = buf.read(LENGTH, k * SLOT)
            (index,) = struct.unpack("<I", got[:4])
            if index <= previous or index >= n:
                fail(f"receive {k}: message {index} after message {previous}")
            if got != message(index):
                fail(f"receive {k}: message {index} is not whole")
            previous = index
        say("GOT", len(wcs))
    else:
        line()
        for i in range(n):
            buf.write(message(i), LENGTH, i * SLOT)
            wr = SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(buf.buf + i * SLOT, LENGTH, buf.lkey)])
            qp.post_send(wr)
            poll(cq, 1, f"send {i}")  # UC completes every send SUCCESS, whatever became of it
        say("DONE")
    say("OK")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[3] not in ("server", "client"):
        fail("usage: pyverbs_uc_wire.py DEVICE GID_INDEX server|client N")
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
