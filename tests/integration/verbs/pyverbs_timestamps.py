#!/usr/bin/python3
"""Completion timestamps through the face, as a pyverbs program: the device announces its clock
(hca_core_clock, completion_timestamp_mask) and ibv_query_rt_values_ex reads it; a CQ made with
ibv_create_cq_ex and both timestamp flags gives every completion a device-clock time between the
clock read before the work and after its completion, never decreasing, and a wall-clock time
between the host's before and after; the standard fields still read right beside them; a
completion field the face does not serve (CVLAN) is refused with EOPNOTSUPP.

    ibv-extend-run -- pyverbs_timestamps.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
"""
import errno
import sys
import time

import pyverbs.enums as e
from pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from pyverbs_kit import ACCESS, connect, open_context

LEN = 64
COUNT = 50
TIMES = e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK
STANDARD = e.IBV_WC_EX_WITH_BYTE_LEN | e.IBV_WC_EX_WITH_QP_NUM | e.IBV_WC_EX_WITH_SRC_QP


def raw_clock(ctx):
    sec, nsec = ctx.query_rt_values_ex()
    return sec * 10**9 + nsec if sec else nsec  # rdma-core's providers put the raw ticks in nsec


def poll_ex(cq, what):
    """One completion of a CQEX: (opcode, byte_len, qp_num, completion ts, wallclock ns)."""
    for _ in range(10_000_000):
        if cq.start_poll(PollCqAttr()) == 0:
            if cq.status != e.IBV_WC_SUCCESS:
                sys.exit(f"{what}: completion status {cq.status}")
            got = (cq.wr_id, cq.read_opcode(), cq.read_byte_len(), cq.read_qp_num(), cq.read_timestamp(),
                   cq.read_completion_wallclock_ns())
            cq.end_poll()
            return got
    sys.exit(f"{what}: no completion")


def main(name):
    ctx, port = open_context(name)
    with ctx:
        attr = ctx.query_device_ex()
        if attr.hca_core_clock == 0 or attr.completion_timestamp_mask == 0:
            sys.exit(f"no device clock: hca_core_clock {attr.hca_core_clock} "
                     f"mask {attr.completion_timestamp_mask:#x}")
        t0 = raw_clock(ctx)
        t1 = raw_clock(ctx)
        if t1 < t0:
            sys.exit(f"the raw clock went back: {t0} then {t1}")

        try:
            CQEX(ctx, CqInitAttrEx(cqe=8, wc_flags=e.IBV_WC_EX_WITH_CVLAN))
            sys.exit("a CQ with CVLAN was made")
        except PyverbsRDMAError as err:
            if err.error_code != errno.EOPNOTSUPP:
                sys.exit(f"CVLAN: errno {err.error_code}, expected EOPNOTSUPP")

        pd = PD(ctx)
        cq = CQEX(ctx, CqInitAttrEx(cqe=2 * COUNT, wc_flags=TIMES | STANDARD))
        cap = QPCap(max_send_wr=COUNT, max_recv_wr=COUNT, max_send_sge=1, max_recv_sge=1)
        a = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
        b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
        connect(a, b, port.lid)
        connect(b, a, port.lid)
        src, dst = MR(pd, LEN, ACCESS), MR(pd, LEN * COUNT, ACCESS)

        clock_before, wall_before = raw_clock(ctx), time.time_ns()
        for i in range(COUNT):
            b.post_recv(RecvWR(wr_id=1000 + i, num_sge=1, sg=[SGE(dst.buf + i * LEN, LEN, dst.lkey)]))
        for i in range(COUNT):
            a.post_send(SendWR(wr_id=i, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(src.buf, LEN, src.lkey)]))
        got = [poll_ex(cq, f"completion {n}") for n in range(2 * COUNT)]
        clock_after, wall_after = raw_clock(ctx), time.time_ns()

        last = 0
        for wr_id, opcode, byte_len, qp_num, ts, wall in got:
            if not clock_before <= ts <= clock_after:
                sys.exit(f"wr {wr_id}: time {ts} outside [{clock_before}, {clock_after}]")
            if ts < last:
                sys.exit(f"wr {wr_id}: time {ts} before the previous completion's {last}")
            last = ts
            if not wall_before <= wall <= wall_after:
                sys.exit(f"wr {wr_id}: wall clock {wall} outside [{wall_before}, {wall_after}]")
            receive = wr_id >= 1000
            want = (e.IBV_WC_RECV, LEN, b.qp_num) if receive else (e.IBV_WC_SEND, None, a.qp_num)
            if opcode != want[0] or qp_num != want[2] or (receive and byte_len != LEN):
                sys.exit(f"wr {wr_id}: opcode {opcode} byte_len {byte_len} qp {qp_num}, expected {want}")
        if sorted(g[0] for g in got) != list(range(COUNT)) + list(range(1000, 1000 + COUNT)):
            sys.exit("not every work request completed once")
        for obj in (src, dst, a, b, cq, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
