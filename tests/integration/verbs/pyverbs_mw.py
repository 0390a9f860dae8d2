#!/usr/bin/python3
"""Memory windows through the face, as a pyverbs program (softnda SPEC.md §16). A peer WRITEs and
READs a window onto part of an MR: a type 2 window bound with IBV_WR_BIND_MW, then invalidated
locally (IBV_WR_LOCAL_INV) and remotely (IBV_WR_SEND_WITH_INV, whose receive reports the rkey);
a type 1 window bound with ibv_bind_mw, which gives it a new rkey. Accesses outside a window,
beyond its access flags, or after its invalidation fail with IBV_WC_REM_ACCESS_ERR; binding an MR
without IBV_ACCESS_MW_BIND completes IBV_WC_MW_BIND_ERR.

    ibv-extend-run -- pyverbs_mw.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
"""
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.mr import MR, MW, MWBind, MWBindInfo
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from pyverbs_kit import connect, open_context

LEN = 4096
WIN_OFF, WIN_LEN = 1024, 1024
MSG = 64
REMOTE = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def completion(cq, what):
    for _ in range(10_000_000):
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    sys.exit(f"{what}: no completion")


class Pair:
    """a is the requester, b the responder whose memory the windows open onto (one CQ each)."""

    def __init__(self, ctx, pd, lid):
        self.acq, self.bcq = CQ(ctx, 64), CQ(ctx, 64)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        self.a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.acq, rcq=self.acq, cap=cap, sq_sig_all=1))
        self.b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.bcq, rcq=self.bcq, cap=cap, sq_sig_all=1))
        self.lid = lid
        self.src = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE)
        self.dst = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | REMOTE | e.IBV_ACCESS_MW_BIND)
        self.rbuf = MR(pd, MSG, e.IBV_ACCESS_LOCAL_WRITE)
        self.round = 0
        self.restate()

    def restate(self):
        """Both QPs from whatever state (ERR after a refused request) to RTS again, CQs drained."""
        for qp in (self.a, self.b):
            qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
        connect(self.a, self.b, self.lid)
        connect(self.b, self.a, self.lid)
        for cq in (self.acq, self.bcq):
            while cq.poll()[0]:
                pass

    def rdma(self, opcode, rkey, off, length=MSG):
        """A WRITE of a new pattern (or a READ) at dst + off; its completion status."""
        self.round += 1
        if opcode == e.IBV_WR_RDMA_WRITE:
            self.src.write(bytes((i * 7 + self.round) % 256 for i in range(length)), length)
        wr = SendWR(wr_id=self.round, opcode=opcode, num_sge=1, sg=[SGE(self.src.buf, length, self.src.lkey)])
        wr.set_wr_rdma(rkey, self.dst.buf + off)
        self.a.post_send(wr)
        wc = completion(self.acq, "RDMA")
        if wc.wr_id != self.round:
            sys.exit(f"RDMA: completion of wr_id {wc.wr_id}, expected {self.round}")
        return wc.status

    def works(self, opcode, rkey, off, what):
        status = self.rdma(opcode, rkey, off)
        if status != e.IBV_WC_SUCCESS:
            sys.exit(f"{what}: status {status}")
        if self.src.read(MSG, 0) != self.dst.read(MSG, off):
            sys.exit(f"{what}: the bytes at the window differ")

    def refused(self, opcode, rkey, off, what):
        before = self.dst.read(LEN, 0)
        status = self.rdma(opcode, rkey, off)
        if status != e.IBV_WC_REM_ACCESS_ERR:
            sys.exit(f"{what}: status {status}, expected REM_ACCESS_ERR")
        if self.dst.read(LEN, 0) != before:
            sys.exit(f"{what}: a refused access changed the memory")
        self.restate()

    def post_on_b(self, wr, opcode, what):
        """A local operation on b; its completion's status after checking its opcode."""
        self.b.post_send(wr)
        wc = completion(self.bcq, what)
        if wc.opcode != opcode:
            sys.exit(f"{what}: completion opcode {wc.opcode}, expected {opcode}")
        return wc.status

    def bind2(self, mw, mr, off, length, access, what):
        """IBV_WR_BIND_MW of a type 2 window on b; the window's new rkey."""
        wr = SendWR(wr_id=70, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
        wr.set_bind_wr(mw, MWBindInfo(mr, mr.buf + off, length, access))
        status = self.post_on_b(wr, e.IBV_WC_BIND_MW, what)
        if status != e.IBV_WC_SUCCESS:
            sys.exit(f"{what}: status {status}")
        return wr.rkey

    def local_inv(self, rkey, what):
        wr = SendWR(wr_id=71, opcode=e.IBV_WR_LOCAL_INV, imm_data=rkey)  # invalidate_rkey
        return self.post_on_b(wr, e.IBV_WC_LOCAL_INV, what)


def main(name):
    ctx, port = open_context(name)
    with ctx:
        caps = ctx.query_device().device_cap_flags
        for flag, label in ((e.IBV_DEVICE_MEM_WINDOW, "MEM_WINDOW"), (e.IBV_DEVICE_MEM_WINDOW_TYPE_2B, "TYPE_2B")):
            if not caps & flag:
                sys.exit(f"device_cap_flags {caps:#x} lacks {label}")
        pd = PD(ctx)
        p = Pair(ctx, pd, port.lid)

        # Type 2: bound on b, usable through b, inside the window, with its access only.
        mw2 = MW(pd, e.IBV_MW_TYPE_2)
        rkey = p.bind2(mw2, p.dst, WIN_OFF, WIN_LEN, REMOTE, "bind type 2")
        if rkey == mw2.rkey or rkey >> 8 != mw2.rkey >> 8:
            sys.exit(f"bind type 2: new rkey {rkey:#x} from {mw2.rkey:#x}")
        p.works(e.IBV_WR_RDMA_WRITE, rkey, WIN_OFF, "WRITE through the type 2 window")
        p.works(e.IBV_WR_RDMA_READ, rkey, WIN_OFF + WIN_LEN - MSG, "READ of the window's last bytes")
        p.refused(e.IBV_WR_RDMA_WRITE, rkey, 0, "WRITE below the window")
        p.refused(e.IBV_WR_RDMA_WRITE, rkey, WIN_OFF + WIN_LEN - MSG + 1, "WRITE past the window")

        # Local invalidation: then nothing passes; the window binds again, read-only now.
        if p.local_inv(rkey, "LOCAL_INV") != e.IBV_WC_SUCCESS:
            sys.exit("LOCAL_INV of the bound type 2 window failed")
        p.refused(e.IBV_WR_RDMA_WRITE, rkey, WIN_OFF, "WRITE after LOCAL_INV")
        rkey = p.bind2(mw2, p.dst, WIN_OFF, WIN_LEN, e.IBV_ACCESS_REMOTE_READ, "rebind read-only")
        p.works(e.IBV_WR_RDMA_READ, rkey, WIN_OFF, "READ through the read-only window")
        p.refused(e.IBV_WR_RDMA_WRITE, rkey, WIN_OFF, "WRITE through the read-only window")

        # Remote invalidation: a SEND_WITH_INV's receive reports the rkey; the window is gone.
        p.b.post_recv(RecvWR(wr_id=9, num_sge=1, sg=[SGE(p.rbuf.buf, MSG, p.rbuf.lkey)]))
        send = SendWR(wr_id=72, opcode=e.IBV_WR_SEND_WITH_INV, num_sge=1, sg=[SGE(p.src.buf, MSG, p.src.lkey)],
                      imm_data=rkey)
        p.a.post_send(send)
        wc = completion(p.acq, "SEND_WITH_INV")
        if wc.status != e.IBV_WC_SUCCESS:
            sys.exit(f"SEND_WITH_INV: status {wc.status}")
        wc = completion(p.bcq, "SEND_WITH_INV's receive")
        if wc.status != e.IBV_WC_SUCCESS or wc.opcode != e.IBV_WC_RECV or wc.byte_len != MSG:
            sys.exit(f"SEND_WITH_INV's receive: status {wc.status}, opcode {wc.opcode}, {wc.byte_len} bytes")
        if not wc.wc_flags & e.IBV_WC_WITH_INV or wc.wc_flags & e.IBV_WC_WITH_IMM:
            sys.exit(f"SEND_WITH_INV's receive: wc_flags {wc.wc_flags:#x}")
        if wc.imm_data != rkey:  # wc.invalidated_rkey shares imm_data's place
            sys.exit(f"SEND_WITH_INV's receive: invalidated rkey {wc.imm_data:#x}, expected {rkey:#x}")
        p.refused(e.IBV_WR_RDMA_READ, rkey, WIN_OFF, "READ after the remote invalidation")

        # Type 1: ibv_bind_mw gives the window a new rkey; a rebind moves it and the old one misses.
        mw1 = MW(pd, e.IBV_MW_TYPE_1)
        first = mw1.rkey
        p.b.bind_mw(mw1, MWBind(MWBindInfo(p.dst, p.dst.buf + WIN_OFF, WIN_LEN, REMOTE), e.IBV_SEND_SIGNALED))
        if completion(p.bcq, "ibv_bind_mw").status != e.IBV_WC_SUCCESS or mw1.rkey == first:
            sys.exit(f"ibv_bind_mw: rkey {mw1.rkey:#x} (was {first:#x})")
        p.works(e.IBV_WR_RDMA_WRITE, mw1.rkey, WIN_OFF, "WRITE through the type 1 window")
        bound = mw1.rkey
        p.b.bind_mw(mw1, MWBind(MWBindInfo(p.dst, p.dst.buf, WIN_LEN, REMOTE), e.IBV_SEND_SIGNALED))
        if completion(p.bcq, "ibv_bind_mw again").status != e.IBV_WC_SUCCESS:
            sys.exit("ibv_bind_mw again failed")
        p.works(e.IBV_WR_RDMA_WRITE, mw1.rkey, 0, "WRITE through the moved type 1 window")
        p.refused(e.IBV_WR_RDMA_WRITE, bound, WIN_OFF, "WRITE with the type 1 window's old rkey")

        # An MR without IBV_ACCESS_MW_BIND takes no window.
        plain = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | REMOTE)
        wr = SendWR(wr_id=73, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
        wr.set_bind_wr(mw2, MWBindInfo(plain, plain.buf, 64, REMOTE))
        status = p.post_on_b(wr, e.IBV_WC_BIND_MW, "bind to an MR without MW_BIND")
        if status != e.IBV_WC_MW_BIND_ERR:
            sys.exit(f"bind to an MR without MW_BIND: status {status}, expected MW_BIND_ERR")

        for obj in (mw1, mw2, plain, p.rbuf, p.dst, p.src, p.a, p.b, p.acq, p.bcq, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
