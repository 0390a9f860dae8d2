#!/usr/bin/python3
"""Device memory through the face, as a pyverbs program (softnda SPEC.md §17): the device's
region (max_dm_size) fills up with ENOMEM and is given back by frees; copies to and from an
allocation, and one past its end refused; a zero-based MR on it (one without
IBV_ACCESS_ZERO_BASED refused) as the target of an RDMA WRITE, the source of an RDMA READ and the
local buffer of a WRITE, every byte checked.

    ibv-extend-run -- pyverbs_dm.py DEVICE

Exit status 0 and "OK" on success; a message or a Python traceback otherwise.
(pyverbs closes a DM's MRs before freeing it, so free_dm's EBUSY is not reachable from here: the
broker's and softnda's unit tests check it.)
"""
import errno
import sys

import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.device import DM, AllocDmAttr
from pyverbs.mr import DMMR, MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

from pyverbs_kit import connect, open_context, poll_one

LEN = 4096
DM_ACCESS = (e.IBV_ACCESS_ZERO_BASED | e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
             e.IBV_ACCESS_REMOTE_READ)


def refused(what, code, fn):
    try:
        fn()
    except PyverbsRDMAError as err:
        if err.error_code != code:
            sys.exit(f"{what}: errno {err.error_code}, expected {code}")
        return
    sys.exit(f"{what}: succeeded")


def fill_the_region(ctx, size):
    quarter = size // 4
    held = [DM(ctx, AllocDmAttr(length=quarter)) for _ in range(4)]
    refused("an allocation past the region", errno.ENOMEM, lambda: DM(ctx, AllocDmAttr(length=64)))
    held.pop().close()
    held.append(DM(ctx, AllocDmAttr(length=quarter)))  # the freed range is there again
    refused("an allocation larger than max_dm_size", errno.EINVAL,
            lambda: DM(ctx, AllocDmAttr(length=size + 1)))
    for dm in held:
        dm.close()


def copies(dm):
    if dm.copy_from_dm(0, LEN) != bytes(LEN):
        sys.exit("a new allocation is not zeroed")
    pattern = bytes((i * 7 + 3) % 256 for i in range(LEN - 8))
    dm.copy_to_dm(8, pattern, len(pattern))
    if dm.copy_from_dm(8, len(pattern)) != pattern:
        sys.exit("copy_from_dm did not read what copy_to_dm wrote")
    refused("a copy past the allocation", errno.EINVAL, lambda: dm.copy_to_dm(LEN - 4, bytes(8), 8))
    # Whole 32-bit words only (mlx5's rule, which consumers test against).
    refused("a copy at an unaligned offset", errno.EINVAL, lambda: dm.copy_to_dm(5, bytes(8), 8))
    refused("a copy of an unaligned length", errno.EINVAL, lambda: dm.copy_from_dm(4, 6))
    dm.copy_to_dm(0, bytes(LEN), LEN)


def main(name):
    ctx, port = open_context(name)
    with ctx:
        size = ctx.query_device_ex().max_dm_size
        if size < 4 * LEN:
            sys.exit(f"max_dm_size is {size}")
        fill_the_region(ctx, size)

        pd = PD(ctx)
        dm = DM(ctx, AllocDmAttr(length=LEN))
        copies(dm)
        refused("a DM MR that is not zero-based", errno.EINVAL,
                lambda: DMMR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE, dm, 0))
        dmmr = DMMR(pd, LEN, DM_ACCESS, dm, 0)

        cq = CQ(ctx, 16)
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)
        a, b = QP(pd, init), QP(pd, init)
        connect(a, b, port.lid)
        connect(b, a, port.lid)
        local = MR(pd, LEN, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ)

        # RDMA WRITE of 1000 bytes to zero-based address 128 of the DM MR.
        payload = bytes((i * 13 + 1) % 256 for i in range(1000))
        local.write(payload, len(payload))
        wr = SendWR(wr_id=1, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(local.buf, 1000, local.lkey)])
        wr.set_wr_rdma(dmmr.rkey, 128)
        a.post_send(wr)
        poll_one(cq, "RDMA WRITE to device memory")
        expect = bytes(128) + payload + bytes(LEN - 128 - 1000)
        got = dm.copy_from_dm(0, LEN)
        if got != expect:
            first = next(i for i in range(LEN) if got[i] != expect[i])
            sys.exit(f"RDMA WRITE to device memory: byte {first} is {got[first]}, expected {expect[first]}")

        # RDMA READ of the whole DM MR into the local MR.
        marks = bytes((i * 5 + 9) % 256 for i in range(LEN))
        dm.copy_to_dm(0, marks, LEN)
        local.write(bytes(LEN), LEN)
        wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_READ, num_sge=1, sg=[SGE(local.buf, LEN, local.lkey)])
        wr.set_wr_rdma(dmmr.rkey, 0)
        a.post_send(wr)
        poll_one(cq, "RDMA READ from device memory")
        if local.read(LEN, 0) != marks:
            sys.exit("RDMA READ from device memory: the data differs")

        # The DM MR as the local buffer of a WRITE into the local MR (zero-based address 256).
        local.write(bytes(LEN), LEN)
        wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(256, 512, dmmr.lkey)])
        wr.set_wr_rdma(local.rkey, local.buf)
        a.post_send(wr)
        poll_one(cq, "RDMA WRITE from device memory")
        if local.read(512, 0) != marks[256:768] or local.read(LEN - 512, 512) != bytes(LEN - 512):
            sys.exit("RDMA WRITE from device memory: the data differs")

        for obj in (a, b, cq, local, dmmr, dm, pd):
            obj.close()
    print("OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "softnda0")
