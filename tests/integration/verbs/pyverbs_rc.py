#!/usr/bin/python3
"""An ordinary pyverbs program (Debian's python3-pyverbs), run unmodified through ibv-extend-run:
device list, context, PD, MRs, a CQ, two RC QPs taken to RTS and connected to each other, then
an RDMA WRITE and a SEND/RECV between them, every completion and every byte checked.

    ibv-extend-run -- pyverbs_rc.py DEVICE

Exit status 0 and "OK" on success; a Python traceback otherwise.
"""
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from pyverbs_kit import ACCESS, connect, open_context, poll_one

LEN = 4096


def main(name):
    ctx, port = open_context(name)
    with ctx:
        pd = PD(ctx)
        cq = CQ(ctx, 32)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
        a, b = QP(pd, init), QP(pd, init)
        connect(a, b, port.lid)
        connect(b, a, port.lid)
        src, dst = MR(pd, LEN, ACCESS), MR(pd, LEN, ACCESS)
        payload = bytes((i * 7 + 3) % 256 for i in range(LEN))
        src.write(payload, LEN)

        # RDMA WRITE a -> b's MR
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(src.buf, LEN, src.lkey)])
        wr.set_wr_rdma(dst.rkey, dst.buf)
        a.post_send(wr)
        wc = poll_one(cq, "RDMA WRITE")
        if wc.wr_id != 1 or wc.opcode != e.IBV_WC_RDMA_WRITE or dst.read(LEN, 0) != payload:
            sys.exit("RDMA WRITE: wrong completion or data")

        # SEND a -> a receive on b
        back = MR(pd, LEN, ACCESS)
        b.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(back.buf, LEN, back.lkey)]))
        a.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(src.buf, LEN, src.lkey)]))
        seen = {}
        for _ in range(2):
            wc = poll_one(cq, "SEND/RECV")
            seen[wc.wr_id] = wc
        if set(seen) != {2, 7} or seen[7].opcode != e.IBV_WC_RECV or seen[7].byte_len != LEN:
            sys.exit(f"SEND/RECV: wrong completions {sorted(seen)}")
        if seen[7].qp_num != b.qp_num or back.read(LEN, 0) != payload:
            sys.exit("SEND/RECV: wrong QP or data")
        for obj in (back, dst, src, a, b, cq, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
