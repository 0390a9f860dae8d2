#!/usr/bin/python3
"""Parent domains through the face, as a pyverbs program (Debian's pyverbs 44 has no thread
domain class; verbs-behaviour covers those): a parent domain of a PD, a CQ created naming it
(IBV_CQ_INIT_ATTR_MASK_PD), a QP, an SRQ and MRs made under it, an RDMA WRITE and a SEND into the
SRQ between a QP of the parent domain and one of the PD; a parent domain with Python allocators
(IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) is refused with EOPNOTSUPP.

    ibv-extend-run -- pyverbs_domains.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
"""
import errno
import sys

import pyverbs.enums as e
from pyverbs.cq import CQEX, CqInitAttrEx, PollCqAttr
from pyverbs.mr import MR
from pyverbs.pd import PD, ParentDomain, ParentDomainContext, ParentDomainInitAttr
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from pyverbs_kit import ACCESS, connect, open_context

LEN = 1024


def poll_one(cq, what):
    """The wr_id of the next completion of a CQEX (its poll API), checked successful."""
    for _ in range(10_000_000):
        if cq.start_poll(PollCqAttr()) == 0:
            wr_id, status = cq.wr_id, cq.status
            cq.end_poll()
            if status != e.IBV_WC_SUCCESS:
                sys.exit(f"{what}: completion status {status}")
            return wr_id
    sys.exit(f"{what}: no completion")


def main(name):
    ctx, port = open_context(name)
    with ctx:
        pd = PD(ctx)
        try:
            allocators = ParentDomainContext(pd, lambda *a: e.IBV_ALLOCATOR_USE_DEFAULT, lambda *a: None)
            ParentDomain(ctx, attr=ParentDomainInitAttr(pd=pd, pd_context=allocators))
            sys.exit("a parent domain with allocators was made")
        except PyverbsRDMAError as err:
            if err.error_code != errno.EOPNOTSUPP:
                sys.exit(f"a parent domain with allocators: errno {err.error_code}, expected EOPNOTSUPP")
        parent = ParentDomain(ctx, attr=ParentDomainInitAttr(pd=pd))
        cq = CQEX(ctx, CqInitAttrEx(cqe=32, parent_domain=parent, comp_mask=e.IBV_CQ_INIT_ATTR_MASK_PD))
        srq = SRQ(parent, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
        cap = QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)
        a = QP(parent, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1))
        b = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq, cap=cap, sq_sig_all=1))
        connect(a, b, port.lid)
        connect(b, a, port.lid)
        src, dst = MR(parent, LEN, ACCESS), MR(parent, LEN, ACCESS)
        payload = bytes((i * 11 + 5) % 256 for i in range(LEN))
        src.write(payload, LEN)

        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(src.buf, LEN, src.lkey)])
        wr.set_wr_rdma(dst.rkey, dst.buf)
        a.post_send(wr)
        if poll_one(cq, "RDMA WRITE") != 1 or dst.read(LEN, 0) != payload:
            sys.exit("RDMA WRITE under a parent domain: wrong completion or data")

        back = MR(parent, LEN, ACCESS)
        srq.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(back.buf, LEN, back.lkey)]))
        a.post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(src.buf, LEN, src.lkey)]))
        seen = {poll_one(cq, "SEND/RECV") for _ in range(2)}
        if seen != {2, 7} or back.read(LEN, 0) != payload:
            sys.exit(f"SEND into the parent domain's SRQ: completions {sorted(seen)} or data wrong")
        for obj in (back, src, dst, a, b, srq, cq, parent, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
