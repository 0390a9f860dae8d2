"""What the pyverbs programs of these tests share: opening the device, a loopback RC pair, polling,
and the line-by-line meeting of the two-host programs with the test. Plain pyverbs (Debian's
python3-pyverbs); nothing here knows about the face."""
import os
import sys
import time

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import AHAttr
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ


def open_context(name):
    """The device's context, after checking it is listed and its port 1 is active."""
    names = [dev.name.decode() for dev in d.get_device_list()]
    if name not in names:
        sys.exit(f"{name} is not in the device list {names}")
    ctx = d.Context(name=name)
    port = ctx.query_port(1)
    if port.state != e.IBV_PORT_ACTIVE:
        sys.exit("port 1 is not active")
    return ctx, port


def poll_one(cq, what):
    for _ in range(10_000_000):
        n, wcs = cq.poll()
        if n:
            wc = wcs[0]
            if wc.status != e.IBV_WC_SUCCESS:
                sys.exit(f"{what}: completion status {wc.status}")
            return wc
    sys.exit(f"{what}: no completion")


def connect(qp, peer, lid, access=ACCESS):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = access
    qp.to_init(attr)
    attr = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = peer.qp_num
    attr.ah_attr = AHAttr(dlid=lid, port_num=1)
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = 12
    qp.to_rtr(attr)
    attr.qp_state = e.IBV_QPS_RTS
    attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic = 14, 7, 7, 1
    qp.to_rts(attr)


# ---- the two-host programs (pyverbs_wire.py, pyverbs_ud_wire.py): one process per host, meeting
# through the test on stdin and stdout ----

def fail(what):
    """Exits non-zero, the program's name before what was wrong."""
    sys.exit(f"{os.path.basename(sys.argv[0]).removesuffix('.py')}: {what}")


def line():
    """The test's next line, as words."""
    got = sys.stdin.readline()
    if not got:
        fail("the test closed stdin")
    return got.split()


def say(*words):
    print(*words, flush=True)


def poll(cq, count, what, deadline=60.0):
    """count completions, in the order they come, each checked for success; a failure when none
    comes for deadline seconds (the peer is gone: not a performance bound; None waits for ever)."""
    wcs, last = [], time.monotonic()
    while len(wcs) < count:
        n, got = cq.poll(count - len(wcs))
        if n:
            last = time.monotonic()
            for wc in got[:n]:
                if wc.status != e.IBV_WC_SUCCESS:
                    fail(f"{what}: work request {wc.wr_id} completed with status {wc.status}")
                wcs.append(wc)
        elif deadline is not None and time.monotonic() - last > deadline:
            fail(f"{what}: {len(wcs)} of {count} completions")
    return wcs


def queue_pair(name, qp_type, n, slot):
    """The listed device's context, a PD, one CQ, a QP of qp_type (in RESET) with room for n work
    requests of one SGE each way, and an MR of n slots for local writes."""
    if name not in [dev.name.decode() for dev in d.get_device_list()]:
        fail(f"{name} is not listed")
    ctx = d.Context(name=name)
    pd = PD(ctx)
    cq = CQ(ctx, 2 * n + 8)
    cap = QPCap(max_send_wr=n + 4, max_recv_wr=n + 4, max_send_sge=1, max_recv_sge=1)
    qp = QP(pd, QPInitAttr(qp_type=qp_type, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
    return ctx, pd, cq, qp, MR(pd, n * slot, e.IBV_ACCESS_LOCAL_WRITE)


def meet(ctx, qp, gid_index):
    """Says "ADDR qpn gid" (this QP and GID) and returns the peer's (qpn, gid, our gid)."""
    gid = str(ctx.query_gid(1, gid_index))
    say("ADDR", qp.qp_num, gid)
    peer = line()
    if len(peer) != 3 or peer[0] != "ADDR":
        fail(f"expected ADDR qpn gid, got {peer}")
    return int(peer[1]), peer[2], gid
