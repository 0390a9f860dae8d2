#!/usr/bin/python3
"""Exactly once, in order, every byte checked: an RC connection between two hosts (RoCEv2, softnda
SPEC.md §18), meant to run under the engine's injected loss, duplication and reordering
(roce_hosts_test.cpp). Plain pyverbs (Debian's python3-pyverbs), one process on each host.

    ibv-extend-run -- pyverbs_wire.py DEVICE GID_INDEX server|client N [rnr|atomics]

The two sides meet through the test, line by line on stdin and stdout (no socket of their own):
each prints "ADDR qpn psn gid rkey addr atomic_rkey atomic_addr" and reads the peer's; the server
prints "READY" once its QP is ready to receive, and the client waits for a line before it starts.
The client then, with up to WINDOW work requests of a phase outstanding:
  - N RDMA WRITEs of distinct patterns, each over several MTU-sized packets with a pad, into
    the server's slots; then N RDMA READs of the slots back, compared with what it wrote;
  - N fetch-adds of 1 on one remote counter: the values returned must be 0, 1, ..., N-1 in
    order, and the counter ends at N (a repeated fetch-add would overshoot);
  - N compare-and-swaps k -> k+1 on a second counter, each returning k (a repeated one would
    fail its compare and return k+1), then READs both counters back;
  - N SENDs (odd ones with immediate data) of distinct patterns into the server's receives.
It prints "DONE"; the server, given a line, checks its receives (order, lengths, immediates,
bytes), its slots and both counters. Each side prints "OK" at the end, or exits non-zero with
what was wrong.

Each side's address handle has a traffic class, hop limit and flow label of its own (ROUTE),
which its packets' IP headers must carry (IPv4 TOS and TTL, IPv6 traffic class, hop limit and flow
label), the flow label folded into the UDP source port as the kernel folds it: a capture of the
run shows them (roce_hosts_test's expectCaptureDecodesAsRoce).

With "rnr" (both sides) only the SENDs run, into a ring of one receive the server posts again as
each completes, so nearly every SEND meets an empty ring once and is answered RNR; the server's
RNR timer is 163.84 ms (min_rnr_timer 28: at 81.92 ms a tenant descheduled under a loaded
ctest -j2 once missed it), ample for that repost, and the client's rnr_retry is 1.
Each SEND is then retried once, so all must complete: the retry count is per message (it starts
again at every acknowledged one), not spent across the stream.

With "atomics" (both sides) only the fetch-adds, the compare-swaps and the counters' READ run:
the case where the responder's broker restarts while they do, and must answer an atomic sent
again from the result it saved, never executing it twice.
"""
import struct
import sys

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR
from pyverbs_kit import fail, line, poll, say

ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
          | e.IBV_ACCESS_REMOTE_ATOMIC)
SLOT = 4096
WRITE_LEN = 3001  # three packets at a 1024-byte MTU, the last with a 3-byte pad
SEND_LEN = 2050   # three packets, a 2-byte pad
# PSNs a little before the 24-bit wrap: every phase crosses it.
PSN = {"server": 0xFFFFF0, "client": 0xFFFFE0}
WINDOW = 32       # work requests outstanding at most, and the server's receives posted
# Each side's GRH traffic class (DSCP 10 and 18, ECN bits clear), hop limit and flow label.
ROUTE = {"server": (0x28, 9, 0x12345), "client": (0x48, 17, 0xABCDE)}


def pattern(kind, i, length):
    seed = (kind * 0x9E3779B1 + i * 0x85EBCA6B) & 0xFFFFFFFF
    return bytes(((seed >> (8 * (j % 4))) + j * 7 + (j >> 8)) & 0xFF for j in range(length))


def in_order(wcs, first, opcode, what):
    ids = [wc.wr_id for wc in wcs]
    if ids != list(range(first, first + len(wcs))):
        fail(f"{what}: completions out of order: {ids}")
    for wc in wcs:
        if wc.opcode != opcode:
            fail(f"{what}: completion opcode {wc.opcode}, expected {opcode}")


def connect(qp, gid_index, me, peer, mtu, rd_atomic, rnr, timeout):
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=mtu)
    attr.dest_qp_num = peer["qpn"]
    attr.rq_psn = peer["psn"]
    tclass, hop_limit, flow_label = ROUTE[me]
    gr = GlobalRoute(dgid=GID(peer["gid"]), sgid_index=gid_index, hop_limit=hop_limit, traffic_class=tclass,
                     flow_label=flow_label)
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
    attr.max_dest_rd_atomic = rd_atomic
    attr.min_rnr_timer = 28 if rnr else 12  # 163.84 ms / 0.64 ms
    qp.to_rtr(attr)
    attr.qp_state = e.IBV_QPS_RTS
    attr.sq_psn = PSN[me]
    attr.timeout, attr.retry_cnt, attr.max_rd_atomic = timeout, 7, rd_atomic
    attr.rnr_retry = 1 if rnr else 7  # 7: for ever
    qp.to_rts(attr)


def main(name, gid_index, role, n, mode):
    rnr = mode == "rnr"
    if name not in [dev.name.decode() for dev in d.get_device_list()]:
        fail(f"{name} is not listed")
    ctx = d.Context(name=name)
    port = ctx.query_port(1)
    rd_atomic = max(1, min(16, ctx.query_device().max_qp_rd_atom))
    ring = 1 if rnr else min(n, WINDOW)
    pd = PD(ctx)
    cq = CQ(ctx, 2 * WINDOW + 8)
    cap = QPCap(max_send_wr=WINDOW + 4, max_recv_wr=WINDOW + 4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
    slots = MR(pd, n * SLOT, ACCESS)     # server: written; client: the source
    back = MR(pd, n * SLOT, ACCESS)      # server: the receive ring; client: READ back
    words = MR(pd, max(16, 8 * n), ACCESS)  # server: the two counters; client: atomics' results
    words.write(bytes(max(16, 8 * n)), max(16, 8 * n))

    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = ACCESS
    qp.to_init(attr)

    def post_recv(i):
        qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(back.buf + (i % ring) * SLOT, SLOT, back.lkey)]))

    if role == "server":  # receives can be posted from INIT on
        for i in range(ring):
            post_recv(i)
    gid = str(ctx.query_gid(1, gid_index))
    say("ADDR", qp.qp_num, PSN[role], gid, slots.rkey, slots.buf, words.rkey, words.buf)
    words_in = line()
    if words_in[0] != "ADDR" or len(words_in) != 8:
        fail(f"expected the peer's ADDR line, got {words_in}")
    peer = dict(qpn=int(words_in[1]), psn=int(words_in[2]), gid=words_in[3], rkey=int(words_in[4]),
                addr=int(words_in[5]), atomic_rkey=int(words_in[6]), atomic_addr=int(words_in[7]))
    # 67.1 ms a try (4.096 us << 14), seven retries: ~0.47 s. The atomics run across the
    # responder's broker restarts, 134.2 ms (<< 15): ~0.94 s, so that a restart slowed by a
    # loaded ctest -j2 (one took longer than 0.47 s) is not taken for a dead peer.
    timeout = 15 if mode == "atomics" else 14
    connect(qp, gid_index, role, peer, port.active_mtu, rd_atomic, rnr, timeout)

    if role == "server":
        say("READY")
        # The SENDs come last, after the client's other phases: no deadline here (the test ends
        # a server whose client failed). Each receive is checked, then its buffer posted again;
        # a SEND finding the ring empty is answered RNR and retried (rnr_retry 7: for ever).
        for i in range(n if mode != "atomics" else 0):
            wc = poll(cq, 1, "receives", deadline=None)[0]
            in_order([wc], i, e.IBV_WC_RECV, "receives")
            if wc.byte_len != SEND_LEN:
                fail(f"receive {i}: {wc.byte_len} bytes, sent {SEND_LEN}")
            has_imm = bool(wc.wc_flags & e.IBV_WC_WITH_IMM)
            if has_imm != (i % 2 == 1) or (has_imm and wc.imm_data != i):
                fail(f"receive {i}: immediate {has_imm} {wc.imm_data}")
            if back.read(SEND_LEN, (i % ring) * SLOT) != pattern(3, i, SEND_LEN):
                fail(f"receive {i}: the bytes differ from what was sent")
            if i + ring < n:
                post_recv(i + ring)
        line()  # the client is done
        if rnr:
            say("OK")
            return
        for i in range(n if mode != "atomics" else 0):
            if slots.read(WRITE_LEN, i * SLOT) != pattern(1, i, WRITE_LEN):
                fail(f"slot {i}: the bytes differ from what was written")
        adds, swaps = struct.unpack("<QQ", words.read(16, 0))
        if (adds, swaps) != (n, n):
            fail(f"counters {adds} and {swaps} after {n} fetch-adds and {n} compare-swaps")
        say("OK")
        return

    line()  # the server is ready
    wr_id = 0

    def phase(what, count, opcode, setup):
        """count work requests, WINDOW at most outstanding; setup(i) gives the i-th one's
        (send opcode, local address, length, lkey, remote setup, immediate)."""
        nonlocal wr_id
        first, posted, done = wr_id, 0, []
        while len(done) < count:
            while posted < count and posted - len(done) < WINDOW:
                op, local, length, lkey, remote, imm = setup(posted)
                wr = SendWR(wr_id=wr_id, opcode=op, num_sge=1, sg=[SGE(local, length, lkey)])
                if imm is not None:
                    wr.imm_data = imm
                remote(wr)
                qp.post_send(wr)
                wr_id += 1
                posted += 1
            done += poll(cq, 1, what)
        in_order(done, first, opcode, what)

    def at_slot(i):
        return lambda wr: wr.set_wr_rdma(peer["rkey"], peer["addr"] + i * SLOT)

    if not mode:  # (with rnr, the SENDs alone; with atomics, the atomics alone)
        for i in range(n):
            slots.write(pattern(1, i, WRITE_LEN), WRITE_LEN, i * SLOT)
        phase("RDMA WRITE", n, e.IBV_WC_RDMA_WRITE,
              lambda i: (e.IBV_WR_RDMA_WRITE, slots.buf + i * SLOT, WRITE_LEN, slots.lkey, at_slot(i), None))
        phase("RDMA READ", n, e.IBV_WC_RDMA_READ,
              lambda i: (e.IBV_WR_RDMA_READ, back.buf + i * SLOT, WRITE_LEN, back.lkey, at_slot(i), None))
        for i in range(n):
            if back.read(WRITE_LEN, i * SLOT) != pattern(1, i, WRITE_LEN):
                fail(f"RDMA READ {i}: the bytes differ from what was written")

    if not rnr:
        adds = lambda wr: wr.set_wr_atomic(peer["atomic_rkey"], peer["atomic_addr"], 1, 0)
        phase("fetch-add", n, e.IBV_WC_FETCH_ADD,
              lambda i: (e.IBV_WR_ATOMIC_FETCH_AND_ADD, words.buf + 8 * i, 8, words.lkey, adds, None))
        got = list(struct.unpack(f"<{n}Q", words.read(8 * n, 0)))
        if got != list(range(n)):
            fail(f"fetch-add returned {got}, expected 0..{n - 1} in order")

        def swap(i):
            return lambda wr: wr.set_wr_atomic(peer["atomic_rkey"], peer["atomic_addr"] + 8, i, i + 1)
        phase("compare-swap", n, e.IBV_WC_COMP_SWAP,
              lambda i: (e.IBV_WR_ATOMIC_CMP_AND_SWP, words.buf + 8 * i, 8, words.lkey, swap(i), None))
        got = list(struct.unpack(f"<{n}Q", words.read(8 * n, 0)))
        if got != list(range(n)):
            fail(f"compare-swap returned {got}, expected 0..{n - 1} in order")

        counters = lambda wr: wr.set_wr_rdma(peer["atomic_rkey"], peer["atomic_addr"])
        phase("counters' READ", 1, e.IBV_WC_RDMA_READ,
              lambda i: (e.IBV_WR_RDMA_READ, words.buf, 16, words.lkey, counters, None))
        if struct.unpack("<QQ", words.read(16, 0)) != (n, n):
            fail(f"counters read back as {struct.unpack('<QQ', words.read(16, 0))}, expected {n}, {n}")

    if mode != "atomics":
        for i in range(n):
            slots.write(pattern(3, i, SEND_LEN), SEND_LEN, i * SLOT)
        phase("SEND", n, e.IBV_WC_SEND,
              lambda i: (e.IBV_WR_SEND_WITH_IMM if i % 2 else e.IBV_WR_SEND, slots.buf + i * SLOT, SEND_LEN,
                         slots.lkey, lambda wr: None, i if i % 2 else None))
    say("DONE")
    say("OK")


if __name__ == "__main__":
    if (len(sys.argv) not in (5, 6) or sys.argv[3] not in ("server", "client")
            or sys.argv[5:] not in ([], ["rnr"], ["atomics"])):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), (sys.argv[5:] or [""])[0])
