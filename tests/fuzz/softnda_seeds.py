#!/usr/bin/env python3
"""Writes the seed corpora of the softnda_engine and softnda_wire fuzz targets.

The records are those of tests/fuzz/softnda_world.h (`u8 op, u16 len, bytes`), with each target's
op numbers (softnda_engine.cpp, softnda_wire.cpp). Run it again after changing a record's layout:

    tests/fuzz/softnda_seeds.py tests/fuzz/corpus

Seeds named here are rewritten; other files in the corpus directories (minimised reproducers of
fixed bugs) are left alone.
"""
import os
import struct
import sys

# SPEC.md §2 opcodes and WQE flags.
NOP, SEND, SEND_IMM, WRITE, WRITE_IMM, READ, CAS, FAA, BIND_MW, LOCAL_INV, SEND_INV = range(11)
SIGNALED, FENCE, INLINE, SOLICITED = 1, 2, 4, 8
RC, UC, UD, XRC_INI, XRC_TGT = range(5)
RTS, RTR, INIT, SQD, ERR = range(5)  # CONNECT's target states
TO_ERR, TO_SQD, TO_RTS, TO_RESET = range(4)  # STATE's moves
# MR and QP access bits as the records take them.
LW, RW, RR, RA, MWB = 1, 2, 4, 8, 16
ALL = LW | RW | RR | RA

SRQ = 0x80  # queue selector bits
RQ = 0x40


def rec(op, body):
    return bytes([op]) + struct.pack('<H', len(body)) + body


class Records:
    """One target's record builders; ops maps record names to op numbers."""

    def __init__(self, ops):
        self.ops = ops
        self.out = b''

    def add(self, name, body):
        self.out += rec(self.ops[name], body)
        return self

    def mr(self, size, access, iova, pd=0):
        return self.add('MR', struct.pack('<IBBQ', size - 1, access, pd, iova))

    def mw(self, type2=True, pd=0):
        return self.add('MW', struct.pack('<BB', 1 if type2 else 0, pd))

    def cq(self, cqe=64, flags=0):
        return self.add('CQ', struct.pack('<HB', cqe, flags))

    def srq(self, max_wr=16, max_sge=2, xrc=False, cq=0, limit=0, pd=0):
        return self.add('SRQ', struct.pack('<HBBBI', max_wr, max_sge, (2 if xrc else 0) | pd, cq, limit))

    def qp(self, kind, scq=0, rcq=0, srq=0, send_wr=16, recv_wr=16, send_sge=4, recv_sge=4, inline=64,
           flags=0):
        return self.add('QP', struct.pack('<BBBBHHBBHB', kind, scq, rcq, srq, send_wr, recv_wr, send_sge,
                                          recv_sge, inline, flags))

    def wqe(self, qp, opcode, flags=SIGNALED, sges=(), inline=None, imm=0, wr_id=1, remote_addr=0, rkey=0,
            compare_add=0, swap=0, xrc_srqn=None, num_sge=None):
        data = b''
        if xrc_srqn is not None:
            data += struct.pack('<I12x', xrc_srqn)
        if inline is not None:
            flags |= INLINE
            data += inline
            n, ilen = 0, len(inline)
        else:
            data += b''.join(struct.pack('<QII', *s) for s in sges)
            n, ilen = len(sges), 0
        if num_sge is not None:
            n = num_sge
        hdr = struct.pack('<BBBBIQQIIQQ', opcode, flags, n, 0, imm, wr_id, remote_addr, rkey, ilen, compare_add,
                          swap)
        return self.add('WQE', bytes([qp]) + hdr + data)

    def recv(self, queue, sges, wr_id=100, num_sge=None):
        n = len(sges) if num_sge is None else num_sge
        body = struct.pack('<QII', wr_id, n, 0) + b''.join(struct.pack('<QII', *s) for s in sges)
        return self.add('RECV', bytes([queue]) + body)

    def pi(self, queue, delta):
        return self.add('PI', struct.pack('<BI', queue, delta))

    def ring(self, queue, mode=0, value=0):
        return self.add('RING', struct.pack('<BBI', queue, mode, value))

    def fill(self, queue, pattern):
        return self.add('FILL', bytes([queue]) + pattern)

    def arm(self, target, value):
        return self.add('ARM', struct.pack('<BI', target, value))

    def state(self, qp, what):
        return self.add('STATE', struct.pack('<BB', qp, what))

    def poll(self, cq, n):
        return self.add('POLL', struct.pack('<BB', cq, n))

    def settle(self):
        return self.add('SETTLE', b'')

    def destroy(self, kind, index):
        return self.add('DESTROY', struct.pack('<BB', kind, index))


# ---- softnda_engine ---------------------------------------------------------------------------

ENGINE_OPS = dict(MR=0, MW=1, CQ=2, SRQ=3, QP=4, CONNECT=5, WQE=6, RECV=7, PI=8, RING=9, FILL=10, ARM=11,
                  STATE=12, POLL=13, SETTLE=14, DESTROY=15)

SRC, DST = 0x100000, 0x200000  # the iovas of the two MRs most seeds register (selectors 1 and 2)


class Engine(Records):
    def __init__(self):
        super().__init__(ENGINE_OPS)

    def connect(self, qp, dest, state=RTS, sq_psn=0, rq_psn=0, access=ALL, timeout=2, retry=3, rnr_retry=3,
                min_rnr=0, rd=4, dest_rd=4, mtu=4, qkey=0x1111):
        return self.add('CONNECT', struct.pack('<BIBIIBBBBBBBBI', qp, dest, state, sq_psn, rq_psn, access, timeout,
                                               retry, rnr_retry, min_rnr, rd, dest_rd, mtu, qkey))

    def two_mrs(self):
        return self.mr(4096, LW, SRC).mr(4096, ALL, DST)

    def pair(self, kind=RC, **caps):
        """Two QPs of one kind on CQ 0, connected to each other in RTS (selectors 1 and 2)."""
        self.cq(64)
        self.qp(kind, **caps).qp(kind, **caps)
        return self.connect(0, 2).connect(1, 1)


def engine_seeds():
    s = {}
    e = Engine().two_mrs().pair()
    e.recv(RQ | 1, [(DST, 256, 2)], wr_id=7).ring(RQ | 1)
    e.wqe(0, SEND, sges=[(SRC, 64, 1)], wr_id=1)
    e.wqe(0, WRITE, sges=[(SRC, 128, 1)], remote_addr=DST + 512, rkey=2, wr_id=2)
    e.wqe(0, READ, sges=[(SRC + 1024, 64, 1)], remote_addr=DST, rkey=2, wr_id=3)
    e.wqe(0, CAS, sges=[(SRC + 2048, 8, 1)], remote_addr=DST + 1024, rkey=2, compare_add=0, swap=7, wr_id=4)
    e.wqe(0, FAA, sges=[(SRC + 2056, 8, 1)], remote_addr=DST + 1032, rkey=2, compare_add=5, wr_id=5)
    s['rc_send_write_read_atomics'] = e.ring(0).poll(0, 16).out

    e = Engine().two_mrs().pair()
    e.recv(RQ | 1, [(DST, 64, 2), (DST + 64, 64, 2)]).recv(RQ | 1, [(DST + 256, 256, 2)], wr_id=8).ring(RQ | 1)
    e.wqe(0, SEND_IMM, flags=SIGNALED | SOLICITED, inline=b'inline payload!!', imm=0x1234)
    e.wqe(0, WRITE_IMM, sges=[(SRC, 32, 1), (SRC + 100, 32, 1)], remote_addr=DST + 1024, rkey=2, imm=9)
    s['rc_inline_imm_two_sges'] = e.ring(0).out

    e = Engine().two_mrs().pair(UC)
    e.recv(RQ | 1, [(DST, 128, 2)]).ring(RQ | 1)
    e.wqe(0, SEND, sges=[(SRC, 100, 1)]).wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST + 2048, rkey=2)
    e.wqe(0, READ, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2)  # not a UC operation
    s['uc_send_write'] = e.ring(0).out

    e = Engine().two_mrs().cq(64)
    e.qp(UD).qp(UD).connect(0, 0, qkey=0x11).connect(1, 0, qkey=0x11)
    e.recv(RQ | 1, [(DST, 1024, 2)]).ring(RQ | 1)
    # remote_addr: the destination QPN (selector 2) and its Q_Key; rkey: the destination LID (port 1's).
    e.wqe(0, SEND_IMM, sges=[(SRC, 200, 1)], remote_addr=2 | 0x11 << 32, rkey=1, imm=3)
    e.wqe(0, SEND, sges=[(SRC, 10, 1)], remote_addr=2 | 0x80000000 << 32, rkey=1)  # its own Q_Key
    e.wqe(0, SEND, sges=[(SRC, 10, 1)], remote_addr=0xffffff | 0x11 << 32, rkey=0xc001)  # a multicast LID
    s['ud_datagrams'] = e.ring(0).out

    e = Engine().two_mrs().cq(64).cq(64)
    e.srq(16, 2, xrc=True, cq=1).qp(XRC_INI, send_sge=2, inline=32).qp(XRC_TGT)
    e.connect(0, 2).connect(1, 1)
    e.recv(SRQ | 0, [(DST, 512, 2)]).recv(SRQ | 0, [(DST + 512, 512, 2)], wr_id=101).ring(SRQ | 0)
    e.wqe(0, SEND, sges=[(SRC, 64, 1)], xrc_srqn=1)
    e.wqe(0, WRITE, sges=[(SRC, 64, 1)], remote_addr=DST + 1024, rkey=2, xrc_srqn=1)
    e.wqe(0, SEND, inline=b'xrc inline', xrc_srqn=1)
    e.wqe(0, SEND, sges=[(SRC, 8, 1)], xrc_srqn=0x777)  # no such SRQ: an invalid request
    s['xrc_send_write'] = e.ring(0).out

    # The largest WQEs and receive entries the device grants (a 1 KiB XRC WQE, 512 B receive
    # entries): small WQEs in them, so only the counts in the slots need to grow.
    e = Engine().two_mrs().cq(64).cq(64)
    e.srq(16, 29, xrc=True, cq=1).qp(XRC_INI, send_sge=29, inline=464).qp(XRC_TGT)
    e.qp(RC, send_sge=29, recv_sge=29, inline=464).qp(RC, send_sge=29, recv_sge=29, inline=464)
    e.connect(0, 2).connect(1, 1).connect(2, 4).connect(3, 3)
    e.recv(SRQ | 0, [(DST + 64 * i, 64, 2) for i in range(4)]).ring(SRQ | 0)
    e.recv(RQ | 3, [(DST + 1024, 16, 2)] * 20).ring(RQ | 3)
    e.wqe(0, SEND, inline=bytes(range(200)), xrc_srqn=1)
    e.wqe(2, SEND, sges=[(SRC + 16 * i, 16, 1) for i in range(20)])
    s['largest_caps'] = e.ring(0).ring(2).out

    e = Engine().two_mrs().cq(64, flags=2).srq(8, 2, limit=0)
    e.qp(RC).qp(RC, srq=1).connect(0, 2).connect(1, 1)
    e.recv(SRQ | 0, [(DST, 64, 2)]).recv(SRQ | 0, [(DST + 64, 64, 2)], wr_id=101).ring(SRQ | 0)
    e.arm(SRQ | 0, 2).arm(0, 1)
    e.wqe(0, SEND, sges=[(SRC, 64, 1)]).wqe(0, SEND, sges=[(SRC, 64, 1)])
    s['srq_limit_and_arm'] = e.ring(0).out

    e = Engine().two_mrs().pair()
    e.wqe(0, SEND, sges=[(SRC, 8, 1)])  # no receive posted: RNR, retried, then RNR_RETRY_EXC_ERR
    s['rnr_exhausted'] = e.ring(0).out

    e = Engine().two_mrs().pair()
    e.recv(RQ | 1, [(DST, 64, 99)]).ring(RQ | 1)  # a forged lkey in the receive
    e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=0x12345678)  # a forged rkey
    e.wqe(0, SEND, sges=[(SRC, 8, 1)]).wqe(0, SEND, sges=[(SRC, 8, 1)], wr_id=3)  # flushed
    s['forged_keys_and_flush'] = e.ring(0).out

    e = Engine().two_mrs().pair(send_wr=4)
    e.wqe(0, NOP).pi(0, 100).ring(0)  # PI more than a ring ahead: overflow, the QP to ERR
    s['sq_overflow'] = e.out

    e = Engine().two_mrs().pair()
    e.recv(RQ | 1, [(DST, 64, 2)]).ring(RQ | 1, mode=2, value=77)
    e.wqe(0, SEND, sges=[(SRC, 8, 1)]).ring(0, mode=2, value=5)  # a bare register store
    e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2).ring(0, mode=1)  # the summary bit alone
    e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2).ring(0, mode=3, value=0xffffffff)
    s['ring_modes'] = e.out

    e = Engine().two_mrs().pair(send_wr=8)
    e.fill(0, struct.pack('<BBBB', WRITE, SIGNALED, 1, 0) + bytes(4) + b'\x11' * 8 + struct.pack('<Q', DST) +
           struct.pack('<II', 2, 0) + bytes(16) + struct.pack('<QII', SRC, 8, 1))
    s['garbage_ring_jump'] = e.pi(0, 5).ring(0).out

    e = Engine().mr(4096, LW, SRC).mr(4096, ALL | MWB, DST).cq(64)
    e.qp(RC).qp(RC).connect(0, 2, access=ALL | MWB).connect(1, 1, access=ALL | MWB).mw(True).mw(False)
    # BIND_MW (SPEC.md §16): imm = access, remote_addr and compare_add the range, rkey the window's
    # next key (33: window 1's), swap = the window's current rkey (17) | the MR's key (2) << 32.
    e.wqe(1, BIND_MW, imm=RW | RR, remote_addr=DST, rkey=33, compare_add=256, swap=17 | 2 << 32).ring(1)
    e.settle().wqe(0, WRITE, sges=[(SRC, 16, 1)], remote_addr=DST + 8, rkey=33)
    e.recv(RQ | 1, [(DST + 512, 64, 2)]).ring(RQ | 1)
    e.wqe(0, SEND_INV, sges=[(SRC, 8, 1)], imm=33).ring(0).settle()
    e.wqe(1, LOCAL_INV, rkey=33)  # already invalidated by the SEND_WITH_INV
    s['memory_windows'] = e.ring(1).out

    e = Engine().two_mrs().cq(2)
    e.qp(RC).qp(RC).connect(0, 2).connect(1, 1)
    for i in range(6):
        e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST + 8 * i, rkey=2, wr_id=i)
    s['cq_overflow'] = e.ring(0).out

    e = Engine().two_mrs().pair()
    e.wqe(0, SEND, sges=[(SRC, 8, 1)]).ring(0).destroy(0, 1).destroy(3, 0).destroy(2, 0)
    s['destroy_while_running'] = e.out

    e = Engine().two_mrs().pair()
    e.state(0, TO_SQD).wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2).ring(0)
    e.state(0, TO_RTS).settle().state(0, TO_RESET).state(1, TO_RESET)
    e.connect(0, 2, sq_psn=5, rq_psn=9).connect(1, 1, sq_psn=9, rq_psn=5)
    e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2).ring(0)
    s['sqd_reset_reconnect'] = e.out

    e = Engine().two_mrs().cq(64).qp(RC).qp(RC).connect(0, 2, sq_psn=1, rq_psn=0).connect(1, 1)
    e.wqe(0, WRITE, sges=[(SRC, 8, 1)], remote_addr=DST, rkey=2)  # PSNs differ: retried, then RETRY_EXC_ERR
    s['psn_mismatch'] = e.ring(0).out

    e = Engine().two_mrs().cq(64).qp(RC).qp(UD).connect(0, 2).connect(1, 0)
    e.wqe(0, SEND, sges=[(SRC, 8, 1)]).ring(0)  # connected to a UD QP: nobody answers
    e.qp(RC, send_sge=32).qp(UD, inline=500).srq(0, 32)  # refused caps
    s['mismatched_peer_and_refused_caps'] = e.out

    # Reproducers of the engine's copies overrunning their arrays (issue 46's first findings):
    # counts and lengths a tenant writes, bounded by the slot's room rather than by the copy's.
    e = Engine().two_mrs().cq(64).cq(64).srq(16, 2, xrc=True, cq=1)
    e.qp(XRC_INI, send_sge=2, inline=464).qp(XRC_TGT).connect(0, 2).connect(1, 1)  # 1 KiB WQEs
    e.recv(SRQ | 0, [(DST, 2048, 2)]).ring(SRQ | 0)
    e.wqe(0, SEND, inline=bytes(range(256)) * 3 + bytes(192), xrc_srqn=1)  # 960 inline bytes
    s['repro_xrc_inline_960'] = e.ring(0).out

    e = Engine().two_mrs().cq(64).cq(64).srq(16, 2, xrc=True, cq=1)
    e.qp(XRC_INI, send_sge=29, inline=0).qp(XRC_TGT).connect(0, 2).connect(1, 1)  # room for 60 SGEs
    e.wqe(0, SEND, sges=[(SRC, 8, 1)] * 60, xrc_srqn=1)
    s['repro_xrc_60_sges'] = e.ring(0).out

    e = Engine().two_mrs().cq(64).srq(16, 29)  # 512-byte receive entries: room for 31 SGEs
    e.qp(RC).qp(RC, recv_sge=29).qp(RC).qp(RC, srq=1)
    e.connect(0, 2).connect(1, 1).connect(2, 4).connect(3, 3)
    e.recv(RQ | 1, [(DST + 8 * i, 8, 2) for i in range(31)]).ring(RQ | 1)
    e.recv(SRQ | 0, [(DST + 8 * i, 8, 2) for i in range(31)]).ring(SRQ | 0)
    e.wqe(0, SEND, sges=[(SRC, 8, 1)]).wqe(2, SEND, sges=[(SRC, 8, 1)])
    s['repro_recv_31_sges'] = e.ring(0).ring(2).out
    return s


# ---- softnda_wire ----------------------------------------------------------------------------

WIRE_OPS = dict(MR=0, CQ=1, SRQ=2, QP=3, CONNECT=4, WQE=5, RECV=6, RING=7, PKT=8, SYNC=9, STATE=10, POLL=11,
                PI=12, MW=13, ARM=14, DESTROY=15)

# RoCEv2 (IBTA Table 38, roce_wire.h): transports and operations.
T_RC, T_UC, T_UD, T_XRC = 0x00, 0x20, 0x60, 0xa0
(SEND_FIRST, SEND_MIDDLE, SEND_LAST, SEND_LAST_IMM, SEND_ONLY, SEND_ONLY_IMM, WRITE_FIRST, WRITE_MIDDLE,
 WRITE_LAST, WRITE_LAST_IMM, WRITE_ONLY, WRITE_ONLY_IMM, READ_REQUEST, READ_RESP_FIRST, READ_RESP_MIDDLE,
 READ_RESP_LAST, READ_RESP_ONLY, ACK, ATOMIC_ACK, CMP_SWAP, FETCH_ADD) = range(0x15)
SEND_LAST_INV, SEND_ONLY_INV = 0x16, 0x17
NAK_RNR, NAK_SEQ, NAK_INV_REQ, NAK_REM_ACCESS, NAK_REM_OP = 0x20, 0x60, 0x61, 0x62, 0x63
ICRC_GOOD, ICRC_BAD, ICRC_RAW = 0, 1, 2
FROM_STRANGER = 4
REMOTE_QPN = 0x77  # the QP of the other host the seeds' QPs connect to


def bth(opcode, dest, psn, se=False, ack_req=False, pad=0, tver=0, pkey=0xffff):
    return (bytes([opcode, (0x80 if se else 0) | pad << 4 | tver]) + pkey.to_bytes(2, 'big') + b'\0' +
            dest.to_bytes(3, 'big') + bytes([0x80 if ack_req else 0]) + (psn & 0xffffff).to_bytes(3, 'big'))


def packet(opcode, dest, psn, headers=b'', payload=b'', **kw):
    """A UDP payload: BTH, extension headers, payload, pad and room for the ICRC (the harness fills it)."""
    pad = (4 - len(payload) % 4) % 4
    return bth(opcode, dest, psn, pad=pad, **kw) + headers + payload + bytes(pad) + bytes(4)


def reth(va, rkey, length):
    return va.to_bytes(8, 'big') + rkey.to_bytes(4, 'big') + length.to_bytes(4, 'big')


def aeth(syndrome=0, msn=0):
    return bytes([syndrome]) + msn.to_bytes(3, 'big')


def atomic_eth(va, rkey, swap_add, compare=0):
    return va.to_bytes(8, 'big') + rkey.to_bytes(4, 'big') + swap_add.to_bytes(8, 'big') + compare.to_bytes(8, 'big')


def deth(qkey, src_qp):
    return qkey.to_bytes(4, 'big') + b'\0' + src_qp.to_bytes(3, 'big')


def be32(v):
    return v.to_bytes(4, 'big')


def xrceth(srqn):
    return b'\0' + srqn.to_bytes(3, 'big')


class Wire(Records):
    def __init__(self):
        super().__init__(WIRE_OPS)

    def connect(self, qp, remote=REMOTE_QPN, state=RTS, sq_psn=100, rq_psn=500, access=ALL, timeout=0, retry=3,
                rnr_retry=3, min_rnr=0, rd=4, dest_rd=4, mtu=4, qkey=0x1234, local=False):
        return self.add('CONNECT', struct.pack('<BIBIIBBBBBBBBIB', qp, remote, state, sq_psn, rq_psn, access,
                                               timeout, retry, rnr_retry, min_rnr, rd, dest_rd, mtu, qkey,
                                               1 if local else 0))

    def pkt(self, data, flags=ICRC_GOOD):
        return self.add('PKT', bytes([flags]) + data)

    def sync(self):
        return self.add('SYNC', b'')

    def responder(self, kind=RC, mtu=4, **caps):
        """MRs 1 (SRC) and 2 (DST), CQ 0, one QP (selector 1) connected to the other host, expecting
        PSN 500, with two receives of 1 KiB posted."""
        self.mr(4096, LW, SRC).mr(8192, ALL, DST).cq(64).qp(kind, **caps)
        self.connect(0, mtu=mtu)
        if kind != XRC_TGT:
            self.recv(RQ | 0, [(DST, 1024, 2)], wr_id=10).recv(RQ | 0, [(DST + 1024, 1024, 2)], wr_id=11)
            self.ring(RQ | 0)
        return self


def wire_seeds():
    s = {}
    w = Wire().responder()
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'a send from the other host', ack_req=True))
    w.pkt(packet(T_RC | WRITE_ONLY, 1, 501, reth(DST + 4096, 2, 32), b'w' * 32, ack_req=True))
    w.pkt(packet(T_RC | READ_REQUEST, 1, 502, reth(DST, 2, 100), ack_req=True))
    w.pkt(packet(T_RC | CMP_SWAP, 1, 503, atomic_eth(DST + 4096, 2, 5, 0x7777777777777777), ack_req=True))
    w.pkt(packet(T_RC | FETCH_ADD, 1, 504, atomic_eth(DST + 4104, 2, 3), ack_req=True))
    w.pkt(packet(T_RC | SEND_ONLY_IMM, 1, 505, be32(0xabcd), b'imm', se=True, ack_req=True))
    # Repeats: acknowledged again, read again, the atomic answered from its saved result.
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'again', ack_req=True))
    w.pkt(packet(T_RC | READ_REQUEST, 1, 502, reth(DST, 2, 100), ack_req=True))
    w.pkt(packet(T_RC | CMP_SWAP, 1, 503, atomic_eth(DST + 4096, 2, 5, 0), ack_req=True))
    w.pkt(packet(T_RC | SEND_ONLY, 1, 600, payload=b'ahead', ack_req=True))  # a gap: one sequence NAK
    s['rc_responder_ops'] = w.out

    w = Wire().responder(mtu=0)  # 256-byte packets
    w.pkt(packet(T_RC | SEND_FIRST, 1, 500, payload=b'1' * 256))
    w.pkt(packet(T_RC | SEND_MIDDLE, 1, 501, payload=b'2' * 256))
    w.pkt(packet(T_RC | SEND_LAST_IMM, 1, 502, be32(7), b'3' * 100, ack_req=True))
    w.pkt(packet(T_RC | WRITE_FIRST, 1, 503, reth(DST + 2048, 2, 600), b'4' * 256))
    w.pkt(packet(T_RC | WRITE_MIDDLE, 1, 504, payload=b'5' * 256))
    w.pkt(packet(T_RC | WRITE_LAST_IMM, 1, 505, be32(8), b'6' * 88, ack_req=True))
    w.pkt(packet(T_RC | READ_REQUEST, 1, 506, reth(DST, 2, 700), ack_req=True))  # three responses
    w.pkt(packet(T_RC | WRITE_ONLY, 1, 509, reth(DST, 2, 0), ack_req=True))  # zero length: no rkey check
    s['rc_responder_multi_packet'] = w.out

    w = Wire().responder()
    w.pkt(packet(T_RC | SEND_MIDDLE, 1, 500, payload=b'x' * 64))  # no FIRST: an invalid request, QP to ERR
    w.pkt(packet(T_RC | SEND_ONLY, 1, 501, payload=b'too late'))
    s['rc_responder_invalid_request'] = w.out

    w = Wire().responder()
    w.pkt(packet(T_RC | WRITE_ONLY, 1, 500, reth(DST, 0x12345678, 8), b'x' * 8, ack_req=True))  # a forged rkey
    s['rc_responder_bad_rkey'] = w.out

    w = Wire().mr(4096, LW, SRC).mr(8192, ALL, DST).cq(64).qp(RC).connect(0)
    w.wqe(0, SEND, sges=[(SRC, 64, 1)], wr_id=1)                                   # PSN 100
    w.wqe(0, WRITE, sges=[(SRC, 64, 1)], remote_addr=0x9000, rkey=0x4242, wr_id=2)  # PSN 101
    w.wqe(0, READ, sges=[(SRC + 1024, 64, 1)], remote_addr=0x9000, rkey=0x4242, wr_id=3)  # PSN 102
    w.wqe(0, CAS, sges=[(SRC + 2048, 8, 1)], remote_addr=0x9000, rkey=0x4242, compare_add=1, swap=2, wr_id=4)
    w.ring(0)
    w.pkt(packet(T_RC | ACK, 1, 101, aeth(0, 2)))  # everything up to 101
    w.pkt(packet(T_RC | READ_RESP_ONLY, 1, 102, aeth(0, 3), b'r' * 64))
    w.pkt(packet(T_RC | ATOMIC_ACK, 1, 103, aeth(0, 4) + (0x1122334455667788).to_bytes(8, 'big')))
    w.pkt(packet(T_RC | ACK, 1, 103, aeth(0, 4)))  # late: nothing waits for it
    s['rc_requester_completes'] = w.out

    w = Wire().mr(4096, LW, SRC).cq(64).qp(RC).connect(0, rnr_retry=1, mtu=0)
    w.wqe(0, SEND, sges=[(SRC, 600, 1)], wr_id=1).ring(0)  # PSNs 100-102 at 256 bytes a packet
    w.pkt(packet(T_RC | ACK, 1, 100, aeth(NAK_RNR | 1, 0)))   # receiver not ready: again after 10 us
    w.sync()
    w.pkt(packet(T_RC | ACK, 1, 101, aeth(NAK_SEQ, 0)))       # go back to 101
    w.sync()
    w.pkt(packet(T_RC | ACK, 1, 101, aeth(NAK_REM_ACCESS, 0)))  # the message fails
    s['rc_requester_naks'] = w.out

    w = Wire().mr(4096, LW, SRC).cq(64).qp(RC).connect(0, mtu=0)
    w.wqe(0, READ, sges=[(SRC, 600, 1)], remote_addr=0x9000, rkey=0x4242).ring(0)  # PSNs 100-102
    w.pkt(packet(T_RC | READ_RESP_FIRST, 1, 100, aeth(0, 0), b'1' * 256))
    w.pkt(packet(T_RC | READ_RESP_MIDDLE, 1, 101, payload=b'2' * 256))
    w.pkt(packet(T_RC | READ_RESP_LAST, 1, 102, aeth(0, 1), b'3' * 88))
    s['rc_requester_read_responses'] = w.out

    w = Wire().responder(UC, mtu=0)
    w.pkt(packet(T_UC | SEND_FIRST, 1, 77, payload=b'1' * 256))
    w.pkt(packet(T_UC | SEND_LAST, 1, 78, payload=b'2' * 10))
    w.pkt(packet(T_UC | WRITE_ONLY_IMM, 1, 90, reth(DST + 4096, 2, 16), be32(3) + b'u' * 16))
    w.pkt(packet(T_UC | SEND_FIRST, 1, 91, payload=b'1' * 256))
    w.pkt(packet(T_UC | SEND_LAST, 1, 93, payload=b'lost one'))  # a gap: the message is dropped
    s['uc_responder'] = w.out

    w = Wire().mr(4096, LW, SRC).mr(8192, ALL, DST).cq(64).qp(UD).connect(0, qkey=0x1234)
    w.recv(RQ | 0, [(DST, 1024, 2)], wr_id=1).recv(RQ | 0, [(DST + 1024, 1024, 2)], wr_id=2).ring(RQ | 0)
    w.pkt(packet(T_UD | SEND_ONLY, 1, 0, deth(0x1234, 9), b'datagram'))
    w.pkt(packet(T_UD | SEND_ONLY_IMM, 1, 0, deth(0x1234, 9) + be32(5), b'imm', se=True), FROM_STRANGER)
    w.pkt(packet(T_UD | SEND_ONLY, 1, 0, deth(0x4321, 9), b'wrong qkey'))
    w.pkt(packet(T_UD | SEND_FIRST, 1, 0, deth(0x1234, 9), b'not UD'))
    s['ud_datagrams'] = w.out

    w = Wire().mr(4096, LW, SRC).mr(8192, ALL, DST).cq(64).cq(64).srq(16, 2, xrc=True, cq=1)
    w.qp(XRC_TGT).connect(0)
    w.recv(SRQ | 0, [(DST, 1024, 2)]).ring(SRQ | 0)
    w.pkt(packet(T_XRC | SEND_ONLY, 1, 500, xrceth(1), b'to the srq', ack_req=True))
    w.pkt(packet(T_XRC | WRITE_ONLY, 1, 501, xrceth(1) + reth(DST + 2048, 2, 8), b'x' * 8, ack_req=True))
    w.pkt(packet(T_XRC | SEND_ONLY, 1, 502, xrceth(0x555), b'no such srq', ack_req=True))
    s['xrc_target'] = w.out

    w = Wire().mr(4096, LW, SRC).cq(64).qp(XRC_INI).connect(0)
    w.wqe(0, SEND, sges=[(SRC, 64, 1)], xrc_srqn=0x321).ring(0)
    w.pkt(packet(T_XRC | ACK, 1, 100, aeth(0, 1)))
    s['xrc_initiator_ack'] = w.out

    w = Wire().responder()
    w.pkt(b'')  # an empty datagram
    w.pkt(b'\x04\x00\xff', ICRC_RAW)  # shorter than a BTH
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'bad icrc'), ICRC_BAD)
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'raw icrc'), ICRC_RAW)
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'tver', tver=1))
    w.pkt(packet(0x80 | SEND_ONLY, 1, 500, payload=b'RD'))  # a transport softnda does not serve
    w.pkt(bth(T_RC | SEND_ONLY, 1, 500, pad=3) + bytes(4))  # a pad longer than the payload
    w.pkt(packet(T_RC | WRITE_ONLY, 1, 500, reth(DST, 2, 8))[:20])  # cut inside the RETH
    w.pkt(packet(T_RC | SEND_ONLY, 1, 500, payload=b'from nobody'), FROM_STRANGER)
    w.pkt(packet(T_RC | SEND_ONLY, 0x999, 500, payload=b'no such qp'))
    w.pkt(packet(T_UC | SEND_ONLY, 1, 500, payload=b'wrong transport'))
    s['malformed_frames'] = w.out
    return s


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus')
    for target, seeds in (('softnda_engine', engine_seeds()), ('softnda_wire', wire_seeds())):
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, name), 'wb') as f:
                f.write(data)
        print(f'{target}: {len(seeds)} seeds in {d}')


if __name__ == '__main__':
    main()
