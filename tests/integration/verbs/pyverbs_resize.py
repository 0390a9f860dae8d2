#!/usr/bin/python3
"""ibv_resize_cq through the face, as a pyverbs program: completions waiting in a CQ survive a
grow, in order, after the CQ's indices went round its ring; a size below the waiting completions
is refused (EINVAL) and changes nothing; a shrink of an empty CQ works; traffic runs through the
resized CQ across its new ring's laps.

    ibv-extend-run -- pyverbs_resize.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
"""
import errno
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from pyverbs_kit import ACCESS, connect, open_context, poll_one

LEN = 64


class Pair:
    """a sends to b; a's completions go to scq (the CQ resized), b's to rcq."""

    def __init__(self, ctx, pd, scq, rcq, lid):
        cap = QPCap(max_send_wr=32, max_recv_wr=32, max_send_sge=1, max_recv_sge=1)
        self.a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=scq, rcq=rcq, cap=cap, sq_sig_all=1))
        self.b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=rcq, rcq=rcq, cap=cap, sq_sig_all=1))
        connect(self.a, self.b, lid)
        connect(self.b, self.a, lid)
        self.src, self.dst = MR(pd, LEN, ACCESS), MR(pd, LEN, ACCESS)
        self.rcq = rcq
        self.next_id = 0

    def send(self, n):
        """n SENDs, each received; returns their wr_ids. When it returns, the send completions
        of all but the last are in scq (the device finishes a request before the next)."""
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        for i in ids:
            self.b.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(self.dst.buf, LEN, self.dst.lkey)]))
        for i in ids:
            self.a.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1,
                                    sg=[SGE(self.src.buf, LEN, self.src.lkey)]))
        for i in ids:
            wc = poll_one(self.rcq, "RECV")
            if wc.wr_id != i or wc.opcode != e.IBV_WC_RECV:
                sys.exit(f"RECV: wr_id {wc.wr_id}, expected {i}")
        return ids

    def close(self):
        for obj in (self.src, self.dst, self.a, self.b):
            obj.close()


def expect_sends(cq, ids, what):
    for i in ids:
        wc = poll_one(cq, what)
        if wc.wr_id != i or wc.opcode != e.IBV_WC_SEND:
            sys.exit(f"{what}: wr_id {wc.wr_id} opcode {wc.opcode}, expected SEND {i}")
    n, _ = cq.poll()
    if n:
        sys.exit(f"{what}: a completion more than sent")


def main(name):
    ctx, port = open_context(name)
    with ctx:
        pd = PD(ctx)
        scq, rcq = CQ(ctx, 4), CQ(ctx, 64)
        p = Pair(ctx, pd, scq, rcq, port.lid)
        if scq.cqe != 4:
            sys.exit(f"CQ(4) has {scq.cqe} entries")
        expect_sends(scq, p.send(3), "first lap")
        waiting = p.send(4)  # CQEs 3..6: at least 3 written, and into the ring's second lap
        try:
            scq.resize(2)
            sys.exit("resize(2) with 3 or more completions waiting succeeded")
        except PyverbsRDMAError as err:
            if err.error_code != errno.EINVAL:
                sys.exit(f"resize(2) with completions waiting: errno {err.error_code}, expected EINVAL")
        if scq.cqe != 4:
            sys.exit(f"a refused resize changed the CQ to {scq.cqe} entries")
        scq.resize(16)
        if scq.cqe < 16:
            sys.exit(f"resize(16) gave {scq.cqe} entries")
        expect_sends(scq, waiting, "after the grow")
        for _ in range(4):  # 40 completions: round the new ring twice
            expect_sends(scq, p.send(10), "grown CQ")
        scq.resize(1)  # empty: any size down to 1
        if scq.cqe < 1 or scq.cqe >= 16:
            sys.exit(f"resize(1) gave {scq.cqe} entries")
        expect_sends(scq, p.send(1), "shrunk CQ")
        p.close()
        for obj in (scq, rcq, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
