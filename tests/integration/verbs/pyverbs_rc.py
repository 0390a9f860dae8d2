#!/usr/bin/python3
"""An ordinary pyverbs program (Debian's python3-pyverbs), run unmodified through ibv-extend-run:
device list, context, PD, MRs, a CQ, two RC QPs taken to RTS and connected to each other, then
an RDMA WRITE and a SEND/RECV between them, every completion and every byte checked.

    ibv-extend-run -- pyverbs_rc.py DEVICE

Exit status 0 and "OK" on success; a Python traceback otherwise.
"""
import sys

import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import AHAttr
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

ACCESS = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
LEN = 4096


def poll_one(cq, what):
    for _ in range(10_000_000):
        n, wcs = cq.poll()
        if n:
            wc = wcs[0]
            if wc.status != e.IBV_WC_SUCCESS:
                sys.exit(f"{what}: completion status {wc.status}")
            return wc
    sys.exit(f"{what}: no completion")


def connect(qp, peer, lid):
    attr = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    attr.qp_access_flags = ACCESS
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


def main(name):
    names = [dev.name.decode() for dev in d.get_device_list()]
    if name not in names:
        sys.exit(f"{name} is not in the device list {names}")
    with d.Context(name=name) as ctx:
        port = ctx.query_port(1)
        if port.state != e.IBV_PORT_ACTIVE:
            sys.exit("port 1 is not active")
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
