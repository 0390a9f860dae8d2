// The extended verbs objects: ibv_create_cq_ex() with the basic ibv_cq_ex poll API over the data
// path's poll_cq, and ibv_create_qp_ex() with the ibv_wr_* post API over its post_send. Both
// objects are the standard verbs' CQ and QP (queues.cpp), with the extended struct filled in.
#include <cerrno>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

// ---- ibv_cq_ex's poll API, over the data path's poll_cq (one completion at a time) ----

ShadowCq *cqExShadow(ibv_cq_ex *cq) {
    return shadowOf<ShadowCq>(reinterpret_cast<ibv_cq *>(cq), offsetof(ShadowCq, cq));
}
// One completion with its times: faceCreateCqEx made a timed CQ only where the data path times.
int pollTimed(ShadowCq *s) {
    if (s->dp.state == nullptr) {
        return -EOPNOTSUPP;
    }
    return IBVX_DATAPATH_ENTRY(s->owner, poll_cq_times)(s->dp.state, 1, &s->ex_wc, &s->ex_times);
}
int exTake(ibv_cq_ex *cq) {
    ShadowCq *s = cqExShadow(cq);
    int n = s->timed ? pollTimed(s) : pollCq(&s->cq, 1, &s->ex_wc);
    if (n < 0) {
        return -n;
    }
    if (n == 0) {
        return ENOENT;
    }
    cq->wr_id = s->ex_wc.wr_id;
    cq->status = s->ex_wc.status;
    return 0;
}
int exStartPoll(ibv_cq_ex *cq, ibv_poll_cq_attr *attr) {
    return attr != nullptr && attr->comp_mask != 0 ? EINVAL : exTake(cq);
}
int exNextPoll(ibv_cq_ex *cq) {
    return exTake(cq);
}
void exEndPoll(ibv_cq_ex *) {}

// ibv_wc_read_*(): a field of the completion start_poll or next_poll took, as the type of the
// entry it is assigned to, deduced from that entry (ibv_cq_ex reads slid wider than ibv_wc has it).
template <auto Field, typename Value>
Value exRead(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.*Field;
}
// ibv_wc_read_completion_ts() and _wallclock_ns(): the times the data path polled with it.
template <auto Field>
uint64_t exReadTime(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_times.*Field;
}

// What ibv_create_cq_ex serves: the standard work-completion fields, and the completion's times
// where the driver's data path has a clock (SPEC.md §15 for softnda). Refused: CVLAN and
// FLOW_TAG (no Ethernet VLAN or flow steering on the face's devices), TM_INFO (no tag matching).
constexpr uint64_t kCqExWcFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                  IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                  IBV_WC_EX_WITH_DLID_PATH_BITS;
constexpr uint64_t kCqExTimes =
    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;

// The fields ibv_create_cq_ex refuses (kCqExWcFlags says why): a consumer that reads one it
// did not ask for gets zeros, as from a provider that fills none.
uint16_t exReadCvlan(ibv_cq_ex *) {
    return 0;
}
uint32_t exReadFlowTag(ibv_cq_ex *) {
    return 0;
}
void exReadTmInfo(ibv_cq_ex *, ibv_wc_tm_info *info) {
    *info = {};
}

void fillCqEx(ShadowCq *s) {
    ibv_cq_ex &x = s->cq_ex;
    x.start_poll = exStartPoll;
    x.next_poll = exNextPoll;
    x.end_poll = exEndPoll;
    x.read_opcode = exRead<&ibv_wc::opcode>;
    x.read_vendor_err = exRead<&ibv_wc::vendor_err>;
    x.read_byte_len = exRead<&ibv_wc::byte_len>;
    x.read_imm_data = exRead<&ibv_wc::imm_data>;
    x.read_qp_num = exRead<&ibv_wc::qp_num>;
    x.read_src_qp = exRead<&ibv_wc::src_qp>;
    x.read_wc_flags = exRead<&ibv_wc::wc_flags>;
    x.read_slid = exRead<&ibv_wc::slid>;
    x.read_sl = exRead<&ibv_wc::sl>;
    x.read_dlid_path_bits = exRead<&ibv_wc::dlid_path_bits>;
    x.read_completion_ts = exReadTime<&ibv_extend_datapath_wc_times::completion>;
    x.read_completion_wallclock_ns = exReadTime<&ibv_extend_datapath_wc_times::wallclock_ns>;
    x.read_cvlan = exReadCvlan;
    x.read_flow_tag = exReadFlowTag;
    x.read_tm_info = exReadTmInfo;
}

// ---- ibv_qp_ex's ibv_wr_* post API, over the data path's post_send ----------------------------

// The work requests between ibv_wr_start() and ibv_wr_complete(), posted as one chain (one
// doorbell). Inline data is copied when it is set, as providers copy it into the WQE.
struct WrBatch {
    std::deque<ibv_send_wr> wrs;
    std::deque<std::vector<ibv_sge>> sges;
    std::deque<std::string> inline_data;
    int error = 0;  // the first misuse (an SGE with no work request): wr_complete answers it
};

WrBatch *batchOf(ibv_qp_ex *qpx) {
    ShadowQp *s = shadowOf<ShadowQp>(&qpx->qp_base, offsetof(ShadowQp, qp));
    if (s->wr_batch.state == nullptr) {
        s->wr_batch.state = new WrBatch;
        s->wr_batch.close = [](void *b) { delete static_cast<WrBatch *>(b); };
    }
    return static_cast<WrBatch *>(s->wr_batch.state);
}

ibv_send_wr &addWr(ibv_qp_ex *qpx, ibv_wr_opcode opcode) {
    WrBatch *b = batchOf(qpx);
    ibv_send_wr &wr = b->wrs.emplace_back();
    wr.wr_id = qpx->wr_id;
    wr.send_flags = qpx->wr_flags;
    wr.opcode = opcode;
    return wr;
}

ibv_send_wr *lastWr(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    if (b->wrs.empty()) {
        b->error = EINVAL;
        return nullptr;
    }
    return &b->wrs.back();
}

void wrStart(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    b->wrs.clear();
    b->sges.clear();
    b->inline_data.clear();
    b->error = 0;
}
int wrComplete(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    int rc = b->error;
    if (rc == 0 && !b->wrs.empty()) {
        for (size_t i = 0; i + 1 < b->wrs.size(); ++i) {
            b->wrs[i].next = &b->wrs[i + 1];
        }
        b->wrs.back().next = nullptr;
        ibv_send_wr *bad = nullptr;
        rc = postSend(&qpx->qp_base, &b->wrs.front(), &bad);
    }
    wrStart(qpx);
    return rc;
}
void wrAbort(ibv_qp_ex *qpx) {
    wrStart(qpx);
}
void wrSend(ibv_qp_ex *qpx) {
    addWr(qpx, IBV_WR_SEND);
}
void wrSendImm(ibv_qp_ex *qpx, __be32 imm) {
    addWr(qpx, IBV_WR_SEND_WITH_IMM).imm_data = imm;
}
void wrSendInv(ibv_qp_ex *qpx, uint32_t invalidate_rkey) {
    addWr(qpx, IBV_WR_SEND_WITH_INV).invalidate_rkey = invalidate_rkey;
}
void wrLocalInv(ibv_qp_ex *qpx, uint32_t invalidate_rkey) {
    addWr(qpx, IBV_WR_LOCAL_INV).invalidate_rkey = invalidate_rkey;
}
// The bind info is copied now, as providers write it into the WQE; mw->rkey is not changed (the
// consumer keeps a type 2 window's rkey, as with ibv_post_send).
void wrBindMw(ibv_qp_ex *qpx, ibv_mw *mw, uint32_t rkey, const ibv_mw_bind_info *info) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_BIND_MW);
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = rkey;
    if (info != nullptr) {
        wr.bind_mw.bind_info = *info;
    }
}
void wrRdmaWrite(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_WRITE);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
}
void wrRdmaWriteImm(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_WRITE_WITH_IMM);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
    wr.imm_data = imm;
}
void wrRdmaRead(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_READ);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
}
void wrCmpSwp(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_ATOMIC_CMP_AND_SWP);
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.compare_add = compare;
    wr.wr.atomic.swap = swap;
}
void wrFetchAdd(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD);
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.compare_add = add;
}
void wrSetSgeList(ibv_qp_ex *qpx, size_t n, const ibv_sge *list) {
    ibv_send_wr *wr = lastWr(qpx);
    if (wr == nullptr) {
        return;
    }
    auto &sges = batchOf(qpx)->sges.emplace_back(list, list + n);
    wr->sg_list = sges.data();
    wr->num_sge = static_cast<int>(n);
}
void wrSetSge(ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
    ibv_sge sge{addr, length, lkey};
    wrSetSgeList(qpx, 1, &sge);
}
void wrSetInlineDataList(ibv_qp_ex *qpx, size_t n, const ibv_data_buf *bufs) {
    ibv_send_wr *wr = lastWr(qpx);
    if (wr == nullptr) {
        return;
    }
    WrBatch *b = batchOf(qpx);
    std::string &data = b->inline_data.emplace_back();
    for (size_t i = 0; i < n; ++i) {
        data.append(static_cast<const char *>(bufs[i].addr), bufs[i].length);
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(data.data()), static_cast<uint32_t>(data.size()), 0};
    wrSetSgeList(qpx, 1, &sge);
    wr->send_flags |= IBV_SEND_INLINE;
}
void wrSetXrcSrqn(ibv_qp_ex *qpx, uint32_t remote_srqn) {
    if (ibv_send_wr *wr = lastWr(qpx); wr != nullptr) {
        wr->qp_type.xrc.remote_srqn = remote_srqn;
    }
}
// A UD work request's destination (the data path reads the address handle the face made).
void wrSetUdAddr(ibv_qp_ex *qpx, ibv_ah *ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    if (ibv_send_wr *wr = lastWr(qpx); wr != nullptr) {
        wr->wr.ud.ah = ah;
        wr->wr.ud.remote_qpn = remote_qpn;
        wr->wr.ud.remote_qkey = remote_qkey;
    }
}
// Operations the face's devices do not have (TSO is an Ethernet offload of raw packet QPs; no
// softnda opcode is an atomic write). ibv_create_qp_ex refuses their send_ops_flags, so only a
// consumer calling a slot it did not ask for reaches these: the batch fails at wr_complete with
// EOPNOTSUPP, as a provider's slot for an unsupported operation would (the slots return void).
void refuseInBatch(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    if (b->error == 0) {
        b->error = EOPNOTSUPP;
    }
}
void wrSendTso(ibv_qp_ex *qpx, void *, uint16_t, uint16_t) {
    refuseInBatch(qpx);
}
void wrAtomicWrite(ibv_qp_ex *qpx, uint32_t, uint64_t, const void *) {
    refuseInBatch(qpx);
}
void wrSetInlineData(ibv_qp_ex *qpx, void *addr, size_t length) {
    ibv_data_buf buf{addr, length};
    wrSetInlineDataList(qpx, 1, &buf);
}

// The send operations the batch API serves (what ibv_post_send serves on softnda).
constexpr uint64_t kQpExSendOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                                  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_BIND_MW |
                                  IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_SEND_WITH_INV;

void fillQpEx(ShadowQp *s) {
    ibv_qp_ex &x = s->qp_ex;
    x.wr_start = wrStart;
    x.wr_complete = wrComplete;
    x.wr_abort = wrAbort;
    x.wr_send = wrSend;
    x.wr_send_imm = wrSendImm;
    x.wr_send_inv = wrSendInv;
    x.wr_local_inv = wrLocalInv;
    x.wr_bind_mw = wrBindMw;
    x.wr_rdma_write = wrRdmaWrite;
    x.wr_rdma_write_imm = wrRdmaWriteImm;
    x.wr_rdma_read = wrRdmaRead;
    x.wr_atomic_cmp_swp = wrCmpSwp;
    x.wr_atomic_fetch_add = wrFetchAdd;
    x.wr_set_sge = wrSetSge;
    x.wr_set_sge_list = wrSetSgeList;
    x.wr_set_inline_data = wrSetInlineData;
    x.wr_set_inline_data_list = wrSetInlineDataList;
    x.wr_set_xrc_srqn = wrSetXrcSrqn;  // read by the driver's data path on an XRC initiator only
    x.wr_set_ud_addr = wrSetUdAddr;    // read on a UD QP only, as ibv_post_send's wr.ud
    x.wr_send_tso = wrSendTso;
    x.wr_atomic_write = wrAtomicWrite;
    s->has_qp_ex = true;
}

}  // namespace

ibv_cq_ex *faceCreateCqEx(ibv_context *context, ibv_cq_init_attr_ex *attr) {
    const ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return failNull<ibv_cq_ex>(EINVAL);
    }
    // A parent domain (IBV_CQ_INIT_ATTR_MASK_PD) is checked as rdma-core's providers check it and
    // changes nothing else: a CQ has no PD, and the allocators it could carry are refused.
    if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) != 0 &&
        (!isParentDomain(attr->parent_domain) || attr->parent_domain->context != context)) {
        return failNull<ibv_cq_ex>(EINVAL);
    }
    const bool clock = IBVX_DATAPATH_ENTRY(c, poll_cq_times) != nullptr;
    const uint64_t served = kCqExWcFlags | (clock ? kCqExTimes : 0);
    if ((attr->wc_flags & ~served) != 0 || (attr->comp_mask & ~IBV_CQ_INIT_ATTR_MASK_PD) != 0) {
        warn("ibv_create_cq_ex: only the standard completion fields%s are served (wc_flags 0x%llx)",
             clock ? " and the completion times" : "", static_cast<unsigned long long>(attr->wc_flags));
        return failNull<ibv_cq_ex>(EOPNOTSUPP);
    }
    ibv_cq *cq = createCq(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                          static_cast<int>(attr->comp_vector), attr->wc_flags & kCqExTimes);
    if (cq == nullptr) {
        return nullptr;
    }
    ShadowCq *s = shadowOf<ShadowCq>(cq, offsetof(ShadowCq, cq));
    fillCqEx(s);
    s->timed = (attr->wc_flags & kCqExTimes) != 0;
    return &s->cq_ex;
}

ibv_qp *faceCreateQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr) {
    // CREATE_FLAGS is taken with no flag set (rdma-core's tests pass the mask with flags 0 to a
    // non-Mellanox device): nothing is asked for. Any flag is an mlx4/mlx5 feature, refused below.
    constexpr uint32_t kServed =
        IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    if (attr != nullptr && (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV)) {
        // An initiator may post through the ibv_wr_* API too (ibv_wr_set_xrc_srqn).
        const bool send_ops =
            attr->qp_type == IBV_QPT_XRC_SEND && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;
        if (send_ops && (attr->send_ops_flags & ~kQpExSendOps) != 0) {
            warn("ibv_create_qp_ex: only the standard send operations are served (send_ops_flags 0x%llx)",
                 static_cast<unsigned long long>(attr->send_ops_flags));
            return failNull<ibv_qp>(EOPNOTSUPP);
        }
        ibv_qp *qp = createXrcQpEx(context, attr);
        if (qp != nullptr && send_ops) {
            fillQpEx(shadowOf<ShadowQp>(qp, offsetof(ShadowQp, qp)));
        }
        return qp;
    }
    if (attr == nullptr || (attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr ||
        attr->pd->context != context) {
        return failNull<ibv_qp>(EINVAL);
    }
    if ((attr->comp_mask & ~kServed) != 0 ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0 && attr->create_flags != 0) ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 &&
         (attr->send_ops_flags & ~kQpExSendOps) != 0)) {
        warn(
            "ibv_create_qp_ex: only a PD and the standard send operations are served, no create flags "
            "(comp_mask 0x%x)",
            attr->comp_mask);
        return failNull<ibv_qp>(EOPNOTSUPP);
    }
    ibv_qp_init_attr a{};
    a.qp_context = attr->qp_context;
    a.send_cq = attr->send_cq;
    a.recv_cq = attr->recv_cq;
    a.srq = attr->srq;
    a.cap = attr->cap;
    a.qp_type = attr->qp_type;
    a.sq_sig_all = attr->sq_sig_all;
    ibv_qp *qp = ibvx_verbs_create_qp(attr->pd, &a);
    if (qp == nullptr) {
        return nullptr;
    }
    attr->cap = a.cap;
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0) {
        fillQpEx(shadowOf<ShadowQp>(qp, offsetof(ShadowQp, qp)));
    }
    return qp;
}

}  // namespace ibvx::client::verbs

using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

extern "C" {

ibv_qp_ex *ibvx_verbs_qp_to_qp_ex(ibv_qp *qp) {
    ShadowQp *s = liveQp(qp);
    if (s == nullptr) {
        return failNull<ibv_qp_ex>(EINVAL);
    }
    return s->has_qp_ex ? &s->qp_ex : failNull<ibv_qp_ex>(EOPNOTSUPP);
}

}  // extern "C"
