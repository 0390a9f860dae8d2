#!/usr/bin/python3
"""ibv_rereg_mr through the face, as a pyverbs program (softnda SPEC.md §13). The MR a peer
WRITEs into is re-registered three ways: its access (a refused change first: nothing changes, the
MR stays usable), its PD (to a second PD and back) and its memory (to a heap buffer of the
program's own). Every success keeps the keys, as on a kernel provider, so the rkey the peer
holds meets the MR as it now is: a WRITE lands once remote write is granted, fails with
IBV_WC_REM_ACCESS_ERR under another PD and once remote write is taken away, and lands at the new
memory after a translation, never at the old.

    ibv-extend-run -- pyverbs_rereg.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
"""
import ctypes
import errno
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.mem_alloc import free, posix_memalign
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

from pyverbs_kit import connect, open_context

LEN = 4096
REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE


def completion(cq, what):
    for _ in range(10_000_000):
        n, wcs = cq.poll()
        if n:
            return wcs[0]
    sys.exit(f"{what}: no completion")


class Pair:
    """a WRITEs from src into b's memory, named by an rkey and an address."""

    def __init__(self, ctx, pd, lid):
        self.cq = CQ(ctx, 64)
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap, sq_sig_all=1)
        self.a, self.b = QP(pd, init), QP(pd, init)
        self.lid = lid
        self.src = MR(pd, LEN, REMOTE)
        self.round = 0
        self.restate()

    def restate(self):
        """Both QPs from whatever state (ERR after a refused WRITE) to RTS again, the CQ drained."""
        for qp in (self.a, self.b):
            qp.modify(QPAttr(qp_state=e.IBV_QPS_RESET), e.IBV_QP_STATE)
        connect(self.a, self.b, self.lid)
        connect(self.b, self.a, self.lid)
        while self.cq.poll()[0]:
            pass

    def write(self, rkey, addr):
        """A WRITE of a new pattern; its completion status and the pattern."""
        self.round += 1
        payload = bytes((i * 13 + self.round) % 256 for i in range(LEN))
        self.src.write(payload, LEN)
        wr = SendWR(wr_id=self.round, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(self.src.buf, LEN, self.src.lkey)])
        wr.set_wr_rdma(rkey, addr)
        self.a.post_send(wr)
        wc = completion(self.cq, "RDMA WRITE")
        if wc.wr_id != self.round:
            sys.exit(f"RDMA WRITE: completion of wr_id {wc.wr_id}, expected {self.round}")
        return wc.status, payload

    def lands(self, rkey, addr, what):
        status, payload = self.write(rkey, addr)
        if status != e.IBV_WC_SUCCESS:
            sys.exit(f"{what}: WRITE: status {status}")
        if ctypes.string_at(addr, LEN) != payload:
            sys.exit(f"{what}: WRITE: the data did not land at {addr:#x}")

    def refused(self, rkey, addr, what, owned=True):
        """owned: addr is still the MR's memory (pyverbs frees its own buffer at a translation)."""
        before = ctypes.string_at(addr, LEN) if owned else None
        status, _ = self.write(rkey, addr)
        if status != e.IBV_WC_REM_ACCESS_ERR:
            sys.exit(f"{what}: WRITE: status {status}, expected REM_ACCESS_ERR")
        if owned and ctypes.string_at(addr, LEN) != before:
            sys.exit(f"{what}: a refused WRITE changed the memory")
        self.restate()


def rereg(mr, what, **kwargs):
    """Re-registers mr, checking that its keys stay."""
    old = (mr.lkey, mr.rkey)
    mr.rereg(**kwargs)
    if (mr.lkey, mr.rkey) != old:
        sys.exit(f"{what}: the keys changed from ({old[0]:#x}, {old[1]:#x}) to ({mr.lkey:#x}, {mr.rkey:#x})")


def main(name):
    ctx, port = open_context(name)
    with ctx:
        pd, pd2 = PD(ctx), PD(ctx)
        p = Pair(ctx, pd, port.lid)
        dst = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE)
        addr = dst.buf

        # A refused change (remote write without local write) changes nothing: same keys, usable.
        keys = (dst.lkey, dst.rkey)
        try:
            dst.rereg(flags=e.IBV_REREG_MR_CHANGE_ACCESS, access=e.IBV_ACCESS_REMOTE_WRITE)
            sys.exit("rereg with remote write alone succeeded")
        except PyverbsRDMAError as err:
            if err.error_code != errno.EINVAL:
                sys.exit(f"rereg with remote write alone: errno {err.error_code}, expected EINVAL")
        if (dst.lkey, dst.rkey) != keys:
            sys.exit("a refused rereg changed the keys")
        p.refused(dst.rkey, addr, "no remote write yet")  # the access did not change either

        # Access: remote write granted; the rkey the peer holds now writes.
        rereg(dst, "access", flags=e.IBV_REREG_MR_CHANGE_ACCESS, access=REMOTE)
        p.lands(dst.rkey, addr, "access")

        # PD: under pd2 the responder (on pd) cannot use it; back on pd it lands again.
        rereg(dst, "PD", flags=e.IBV_REREG_MR_CHANGE_PD, pd=pd2)
        p.refused(dst.rkey, addr, "MR of another PD")
        rereg(dst, "PD back", flags=e.IBV_REREG_MR_CHANGE_PD, pd=pd)
        p.lands(dst.rkey, addr, "PD back")

        # Translation: ordinary heap memory of the program's own.
        heap = posix_memalign(LEN)
        ctypes.memset(heap, 0, LEN)
        rereg(dst, "translation", flags=e.IBV_REREG_MR_CHANGE_TRANSLATION, addr=heap, length=LEN)
        p.lands(dst.rkey, heap, "translation")
        p.refused(dst.rkey, addr, "translation, the old memory", owned=False)
        p.lands(dst.rkey, heap, "translation, again")

        # Access taken away again: the same rkey is refused.
        rereg(dst, "access taken away", flags=e.IBV_REREG_MR_CHANGE_ACCESS, access=e.IBV_ACCESS_LOCAL_WRITE)
        p.refused(dst.rkey, heap, "remote write taken away")

        for obj in (dst, p.src, p.a, p.b, p.cq, pd2, pd):
            obj.close()
        free(heap)
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
