// The virtual-device verbs softnda must provide itself (ibv_extend_vdev.h): PD, MR and the
// standard QP state machine, the standard queries and the event fds.
#include <sys/mman.h>
#include <unistd.h>

#include <endian.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <span>
#include <utility>

#include "providers/softnda/src/netdev.h"
#include "providers/softnda/src/softnda_internal.h"

namespace softnda {

int checkMrAccess(int access) {
    if ((access & ~kKnownAccess) != 0) {
        return -EINVAL;
    }
    // IB rule: remote write and atomic access need local write.
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
        (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
        return -EINVAL;
    }
    return 0;
}

int checkMrRange(const Device *dev, const void *addr, size_t length, uint64_t iova) {
    if (addr == nullptr || length == 0 ||
        reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr) ||
        iova + length < iova || length > dev->cfg.max_mr_size) {
        return -EINVAL;
    }
    // The engine dereferences the range: refuse what is not mapped now (msync reports holes).
    uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    uintptr_t lo = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
    uintptr_t hi = (reinterpret_cast<uintptr_t>(addr) + length + page - 1) & ~(page - 1);
    if (msync(reinterpret_cast<void *>(lo), hi - lo, MS_ASYNC) < 0) {
        return -EFAULT;
    }
    return 0;
}

void assignMrKey(Device *dev, Mr *mr) {
    uint32_t idx;
    if (!dev->free_mr_slots.empty()) {
        idx = dev->free_mr_slots.back();
        dev->free_mr_slots.pop_back();
    } else {
        idx = static_cast<uint32_t>(dev->mrs.size());
        dev->gate.lock();
        dev->mrs.push_back(nullptr);
        dev->gate.unlock();
    }
    // The low byte changes on every registration so a stale key into a reused slot misses.
    mr->key = (idx << 8) | (++dev->mr_generation & 0xff);
}

namespace {

ibv_pd *allocPd(ibv_context *context) {
    Context *ctx = asContext(context);
    if (ctx == nullptr) {
        return failNull<ibv_pd>(EINVAL);
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_pd >= dev->cfg.max_pd) {
        return failNull<ibv_pd>(ENOMEM);
    }
    return buildPd(ctx, dev->n_pd);
}

int deallocPd(ibv_pd *ib) {
    Pd *pd = asPd(ib);
    if (pd == nullptr) {
        return -EINVAL;
    }
    Device *dev = pd->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (pd->refs != 0) {
        return -EBUSY;
    }
    dev->n_pd--;
    pd->ctx->objects--;
    pd->magic = 0;
    delete pd;
    return 0;
}

ibv_mr *regMr(ibv_pd *ib, void *addr, size_t length, uint64_t iova, int access) {
    Pd *pd = asPd(ib);
    if (pd == nullptr) {
        return failNull<ibv_mr>(EINVAL);
    }
    Device *dev = pd->ctx->dev;
    if (int rc = checkMrAccess(access); rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    if (int rc = checkMrRange(dev, addr, length, iova); rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_mr >= dev->cfg.max_mr) {
        return failNull<ibv_mr>(ENOMEM);
    }
    auto mr = std::make_unique<Mr>();
    mr->addr = static_cast<uint8_t *>(addr);
    mr->iova = iova;
    mr->len = length;
    mr->access = access;
    assignMrKey(dev, mr.get());
    const uint32_t handle = mr->key >> 8;
    return buildMr(std::move(mr), pd, handle);
}

int deregMr(ibv_mr *ib) {
    Mr *mr = asMr(ib);
    if (mr == nullptr) {
        return -EINVAL;
    }
    Device *dev = mr->pd->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    uint32_t idx = mr->key >> 8;
    dev->gate.lock();
    // Engine passes bind windows: their count is stable only with the gate held (SPEC.md §16).
    if (__atomic_load_n(&mr->windows, __ATOMIC_RELAXED) != 0) {
        dev->gate.unlock();
        return -EBUSY;
    }
    dev->mrs[idx] = nullptr;
    dev->gate.unlock();
    dev->free_mr_slots.push_back(idx);
    mr->pd->refs--;
    if (mr->dm != nullptr) {
        mr->dm->mrs--;
    }
    dev->n_mr--;
    mr->pd->ctx->objects--;
    mr->magic = 0;
    delete mr;
    return 0;
}

// The transitions of each transport: the attributes each one requires and allows (IBA table 91,
// the kernel's ib_modify_qp_is_ok).
struct Transition {
    ibv_qp_state cur;
    ibv_qp_state next;
    int required;
    int optional;
};

constexpr int kRtsOptional =
    IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER;
const Transition kRcTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0,
     kRtsOptional | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
         IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PKEY_INDEX | IBV_QP_PORT},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, kRtsOptional},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

// UC: RC without its reliability attributes (SPEC.md §11.2).
constexpr int kUcRtsOptional =
    IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE;
const Transition kUcTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, kUcRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, kUcRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0, kUcRtsOptional | IBV_QP_AV | IBV_QP_PKEY_INDEX | IBV_QP_PORT},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, kUcRtsOptional},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

// UD: a Q_Key and no peer (SPEC.md §11.1).
const Transition kUdTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY},
    {IBV_QPS_INIT, IBV_QPS_RTR, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_SQD, 0, IBV_QP_PKEY_INDEX | IBV_QP_QKEY},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_QKEY},
};

// XRC (SPEC.md §14, the kernel's table): an initiator is RC's requester, whose RTR needs no
// responder attributes (it has no receive side; they are accepted and ignored, as programs
// written for RC pass them); a target is RC's responder, whose RTS needs only TIMEOUT and SQ_PSN.
const Transition kXrcIniTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER},
    {IBV_QPS_RTR, IBV_QPS_RTS,
     IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
     kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, kRtsOptional},
    {IBV_QPS_RTS, IBV_QPS_SQD, 0, IBV_QP_EN_SQD_ASYNC_NOTIFY},
    {IBV_QPS_SQD, IBV_QPS_RTS, 0, kRtsOptional},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};
const Transition kXrcTgtTransitions[] = {
    {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0},
    {IBV_QPS_INIT, IBV_QPS_INIT, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS},
    {IBV_QPS_INIT, IBV_QPS_RTR,
     IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
         IBV_QP_MIN_RNR_TIMER,
     IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX},
    {IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_SQ_PSN | IBV_QP_TIMEOUT,
     kRtsOptional | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC},
    {IBV_QPS_RTS, IBV_QPS_RTS, 0, kRtsOptional},
    {IBV_QPS_SQE, IBV_QPS_RTS, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS},
};

// 0 when mask is acceptable for cur -> next on a QP of this type, else -EINVAL.
int checkTransition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, int mask) {
    int extra = mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
        return extra == 0 ? 0 : -EINVAL;
    }
    std::span<const Transition> table = kRcTransitions;
    if (type == IBV_QPT_UC) {
        table = kUcTransitions;
    } else if (type == IBV_QPT_UD) {
        table = kUdTransitions;
    } else if (type == IBV_QPT_XRC_SEND) {
        table = kXrcIniTransitions;
    } else if (type == IBV_QPT_XRC_RECV) {
        table = kXrcTgtTransitions;
    }
    for (const Transition &t : table) {
        if (t.cur == cur && t.next == next) {
            if ((mask & t.required) != t.required || (extra & ~(t.required | t.optional)) != 0) {
                return -EINVAL;
            }
            return 0;
        }
    }
    return -EINVAL;
}

// Enum fields come from the caller: read them as integers before trusting their range.
template <typename Enum>
int raw(const Enum &field) {
    int v;
    static_assert(sizeof(v) == sizeof(field));
    std::memcpy(&v, &field, sizeof(v));
    return v;
}

// The state modify_qp moves a QP in state cur to, or -EINVAL when the QP state table or softnda
// refuses the transition or one of its attributes (-EPERM for a privileged Q_Key: SPEC.md §11.1).
int modifyTarget(ibv_qp_type type, int cur, const ibv_qp_attr &attr, int mask, uint32_t phys_port_cnt) {
    if ((mask & IBV_QP_CUR_STATE) && raw(attr.cur_qp_state) != cur) {
        return -EINVAL;
    }
    int next = (mask & IBV_QP_STATE) ? raw(attr.qp_state) : cur;
    if (next < IBV_QPS_RESET || next > IBV_QPS_ERR ||
        ((mask & IBV_QP_PATH_MTU) &&
         (raw(attr.path_mtu) < IBV_MTU_256 || raw(attr.path_mtu) > IBV_MTU_4096))) {
        return -EINVAL;
    }
    if (checkTransition(type, static_cast<ibv_qp_state>(cur), static_cast<ibv_qp_state>(next), mask) != 0) {
        return -EINVAL;
    }
    if ((mask & IBV_QP_QKEY) && (attr.qkey & SOFTNDA_QKEY_PRIVILEGED) != 0) {
        return -EPERM;
    }
    if (((mask & IBV_QP_PORT) && (attr.port_num < 1 || attr.port_num > phys_port_cnt)) ||
        ((mask & IBV_QP_PKEY_INDEX) && attr.pkey_index != 0) ||
        ((mask & IBV_QP_DEST_QPN) && attr.dest_qp_num > 0xffffff) ||
        ((mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > 7) ||
        ((mask & IBV_QP_RNR_RETRY) && attr.rnr_retry > 7) ||
        ((mask & IBV_QP_ACCESS_FLAGS) && (attr.qp_access_flags & ~kKnownAccess) != 0)) {
        return -EINVAL;
    }
    return next;
}

// Stores the attributes mask names (caller holds the gate exclusively). The live PSNs are in
// queue memory too (SPEC.md §10), so a successor process reads them.
void applyAttrs(Qp *qp, const ibv_qp_attr &attr, int mask) {
    QpAttrs &q = qp->attrs;
    if (mask & IBV_QP_ACCESS_FLAGS) {
        q.access = static_cast<int>(attr.qp_access_flags);
    }
    if (mask & IBV_QP_PORT) {
        q.port = attr.port_num;
    }
    if (mask & IBV_QP_PKEY_INDEX) {
        q.pkey_index = attr.pkey_index;
    }
    if (mask & IBV_QP_AV) {
        q.ah = attr.ah_attr;
    }
    if (mask & IBV_QP_PATH_MTU) {
        q.path_mtu = attr.path_mtu;
    }
    if (mask & IBV_QP_DEST_QPN) {
        q.dest_qpn = attr.dest_qp_num;
    }
    if (mask & IBV_QP_RQ_PSN) {
        q.rq_psn = attr.rq_psn & 0xffffff;
        qp->rq_psn = q.rq_psn;
        __atomic_store_n(qp->recWord(kRqPsnWord), qp->rq_psn, __ATOMIC_RELEASE);
    }
    if (mask & IBV_QP_SQ_PSN) {
        q.sq_psn = attr.sq_psn & 0xffffff;
        qp->sq_psn = q.sq_psn;
        __atomic_store_n(qp->recWord(kSqPsnWord), qp->sq_psn, __ATOMIC_RELEASE);
    }
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) {
        q.max_dest_rd_atomic = attr.max_dest_rd_atomic;
    }
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC) {
        q.max_rd_atomic = attr.max_rd_atomic;
    }
    if (mask & IBV_QP_MIN_RNR_TIMER) {
        q.min_rnr_timer = attr.min_rnr_timer;
    }
    if (mask & IBV_QP_QKEY) {
        q.qkey = attr.qkey;
        __atomic_store_n(qp->recWord(kSqQkeyWord), q.qkey, __ATOMIC_RELEASE);
    }
    if (mask & IBV_QP_TIMEOUT) {
        q.timeout = attr.timeout;
    }
    if (mask & IBV_QP_RETRY_CNT) {
        q.retry_cnt = attr.retry_cnt;
    }
    if (mask & IBV_QP_RNR_RETRY) {
        q.rnr_retry = attr.rnr_retry;
    }
}

// A move to RESET (caller holds the gate exclusively): outstanding WQEs are discarded without
// completions (SPEC.md §6.2), and the attributes but the destination and the PSNs start over.
void resetQp(Device *dev, Qp *qp) {
    qp->sq.ci_local = __atomic_load_n(qp->sq.pi, __ATOMIC_ACQUIRE);
    __atomic_store_n(qp->sq.ci, qp->sq.ci_local, __ATOMIC_RELEASE);
    if (qp->hasRq()) {
        qp->rq.ci_local = __atomic_load_n(qp->rq.pi, __ATOMIC_ACQUIRE);
        __atomic_store_n(qp->rq.ci, qp->rq.ci_local, __ATOMIC_RELEASE);
    }
    qp->rnr_waiting = false;
    qp->chunked.active = false;  // a message in progress goes with the rest of the SQ
    if (dev->engine) {
        dev->engine->forgetQp(qp);
    }
    resetWire(qp);
    uint32_t keep_qpn = qp->attrs.dest_qpn;
    qp->attrs = QpAttrs{};
    qp->attrs.dest_qpn = keep_qpn;
    qp->sq_psn = 0;
    qp->rq_psn = 0;
    qp->recover_head = false;
    qp->recover_psn = false;
    __atomic_store_n(qp->recWord(kSqPsnWord), 0u, __ATOMIC_RELEASE);
    __atomic_store_n(qp->recWord(kRqPsnWord), 0u, __ATOMIC_RELEASE);
    __atomic_store_n(qp->recWord(kSqExecWord), qp->sq.ci_local, __ATOMIC_RELEASE);
    __atomic_store_n(qp->recWord(kSqQkeyWord), 0u, __ATOMIC_RELEASE);
}

// A connected QP's path on an Ethernet port (SPEC.md §19): RoCE addresses by GID, so the AV
// must carry a GRH whose source is a GID of the port. A destination GID of this device is a
// queue of this host; any other is another host, reached over RoCEv2 (SPEC.md §18) by an RC, UC
// or XRC QP between two IPv4 GIDs or two IPv6 ones, and refused otherwise (-EHOSTUNREACH), or when
// the device's socket could not be bound (its error, e.g. -EADDRINUSE).
int checkRocePath(Device *dev, const Qp &qp, const ibv_ah_attr &ah) {
    if (!ah.is_global) {
        return -EINVAL;
    }
    Netdev &nd = *dev->netdev;
    nd.refresh();
    std::lock_guard<std::mutex> lk(nd.mu);
    std::optional<ibv_gid> sgid = nd.table.at(ah.grh.sgid_index);
    if (!sgid) {
        return -EINVAL;
    }
    if (nd.table.contains(ah.grh.dgid)) {
        return 0;
    }
    if (!wireConnectable(qp.init.qp_type) || !wirePath(*sgid, ah.grh.dgid, true)) {
        return -EHOSTUNREACH;
    }
    if (!dev->engine || dev->engine->wire() == nullptr) {
        return dev->engine ? dev->engine->wireError() : -EHOSTUNREACH;
    }
    // An IPv6 path on a host whose socket could only be IPv4.
    return dev->engine->wire()->ipv6() || wirePath(*sgid, ah.grh.dgid, false) ? 0 : -EHOSTUNREACH;
}

int modifyQp(ibv_qp *ib, ibv_qp_attr *attr, int mask) {
    Qp *qp = asQp(ib);
    if (qp == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    int target = modifyTarget(qp->init.qp_type, qp->state.load(std::memory_order_acquire), *attr, mask,
                              dev->cfg.phys_port_cnt);
    if (target < 0) {
        return target;
    }
    if (dev->netdev && (mask & IBV_QP_AV) != 0) {
        if (int rc = checkRocePath(dev, *qp, attr->ah_attr); rc < 0) {
            return rc;
        }
    }
    auto next = static_cast<ibv_qp_state>(target);
    dev->gate.lock();
    applyAttrs(qp, *attr, mask);
    if (dev->netdev && (mask & IBV_QP_AV) != 0) {
        bindWire(dev, qp);
    }
    if (next == IBV_QPS_RESET) {
        resetQp(dev, qp);
    }
    qp->state.store(next, std::memory_order_release);
    __atomic_store_n(qp->recWord(kQpStateWord), static_cast<uint32_t>(next), __ATOMIC_RELEASE);
    dev->gate.unlock();
    qp->ib.state = next;
    // WQEs posted before RTS (or during SQD) run now; ERR needs its flush.
    if ((next == IBV_QPS_RTS || next == IBV_QPS_ERR) && dev->engine) {
        dev->engine->poke(qp->sq_db.page, qp->sq_db.index);
    }
    return 0;
}

int queryQp(ibv_qp *ib, ibv_qp_attr *attr, int mask, ibv_qp_init_attr *init) {
    (void)mask;  // everything is cheap to report
    Qp *qp = asQp(ib);
    if (qp == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    Device *dev = qp->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    const QpAttrs &q = qp->attrs;
    std::memset(attr, 0, sizeof(*attr));
    auto state = static_cast<ibv_qp_state>(qp->state.load(std::memory_order_acquire));
    attr->qp_state = state;
    attr->cur_qp_state = state;
    attr->path_mtu = static_cast<ibv_mtu>(q.path_mtu);
    attr->qp_access_flags = static_cast<unsigned>(q.access);
    attr->pkey_index = q.pkey_index;
    attr->port_num = q.port;
    attr->ah_attr = q.ah;
    attr->dest_qp_num = q.dest_qpn;
    attr->qkey = q.qkey;
    // The live PSNs (what the next WQE uses), from the words the engine keeps (SPEC.md §10).
    attr->rq_psn = __atomic_load_n(qp->recWord(kRqPsnWord), __ATOMIC_ACQUIRE);
    attr->sq_psn = __atomic_load_n(qp->recWord(kSqPsnWord), __ATOMIC_ACQUIRE);
    attr->max_rd_atomic = q.max_rd_atomic;
    attr->max_dest_rd_atomic = q.max_dest_rd_atomic;
    attr->min_rnr_timer = q.min_rnr_timer;
    attr->timeout = q.timeout;
    attr->retry_cnt = q.retry_cnt;
    attr->rnr_retry = q.rnr_retry;
    attr->sq_draining = 0;
    attr->cap = qp->init.cap;
    if (init != nullptr) {
        *init = ibv_qp_init_attr{};
        init->qp_context = qp->ib.qp_context;
        init->send_cq = qp->ib.send_cq;
        init->recv_cq = qp->ib.recv_cq;
        init->srq = qp->ib.srq;
        init->cap = qp->init.cap;
        init->qp_type = qp->init.qp_type;
        init->sq_sig_all = qp->init.sq_sig_all;
    }
    qp->ib.state = state;
    return 0;
}

// The engine counters of softnda_query_counters, by the names an operator sees.
int vdevQueryCounters(const char *device, void (*emit)(void *, const char *, uint64_t), void *arg) {
    if (emit == nullptr) {
        return -EINVAL;
    }
    softnda_counters c{};
    if (int rc = softnda_query_counters(device, &c); rc < 0) {
        return rc;
    }
    const std::pair<const char *, uint64_t> counters[] = {{"wqes_executed", c.wqes_executed},
                                                          {"bytes", c.bytes},
                                                          {"doorbells", c.doorbells},
                                                          {"cqes", c.cqes},
                                                          {"errors", c.errors},
                                                          {"flushed", c.flushed},
                                                          {"rnr_naks", c.rnr_naks},
                                                          {"cq_overflows", c.cq_overflows},
                                                          {"dropped_cqes", c.dropped_cqes},
                                                          {"srq_limit_events", c.srq_limit_events},
                                                          {"passes", c.passes},
                                                          {"sleeps", c.sleeps},
                                                          {"wakeups_by_hint", c.wakeups_by_hint},
                                                          {"sweeps", c.sweeps},
                                                          {"wire_tx_packets", c.wire_tx_packets},
                                                          {"wire_rx_packets", c.wire_rx_packets},
                                                          {"wire_retransmits", c.wire_retransmits},
                                                          {"wire_seq_naks", c.wire_seq_naks},
                                                          {"wire_bad_icrc", c.wire_bad_icrc},
                                                          {"wire_malformed", c.wire_malformed},
                                                          {"wire_fault_drops", c.wire_fault_drops},
                                                          {"wire_socket_errno", c.wire_socket_errno},
                                                          {"wire_source_ports", c.wire_source_ports}};
    for (const auto &[name, value] : counters) {
        emit(arg, name, value);
    }
    return 0;
}

// ---- the standard queries (vdev ABI V3; SPEC.md §8) ----------------------------------------

// The engine executes READs and atomics one at a time, so any depth is honoured; this is the depth
// announced (what perftest and rdma-core's tools ask for by default fits).
constexpr int kMaxRdAtomic = 16;
static_assert(kMaxRdAtomic <= static_cast<int>(kSavedAtomics), "every outstanding atomic's result is kept");

int queryDevice(ibv_context *context, ibv_device_attr *attr) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    const Device &dev = *ctx->dev;
    const Config &c = dev.cfg;
    std::memset(attr, 0, sizeof(*attr));
    snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%s", kFwVer);
    attr->node_guid = htobe64(dev.guid);
    attr->sys_image_guid = htobe64(dev.guid);
    attr->vendor_id = kVendorId;
    attr->vendor_part_id = kVendorPartId;
    attr->hw_ver = kHwVer;
    attr->max_mr_size = c.max_mr_size;
    attr->page_size_cap = ~(static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) - 1);
    attr->max_qp = static_cast<int>(c.max_qp);
    attr->max_qp_wr = static_cast<int>(c.max_qp_wr);
    // Memory windows of both types (SPEC.md §16); MEM_MGT_EXTENSIONS: local invalidation and
    // SEND_WITH_INV (softnda has no fast-registration MRs).
    attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_MEM_WINDOW |
                             IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_MEM_MGT_EXTENSIONS;
    attr->max_mw = static_cast<int>(c.max_mr);
    attr->max_sge = static_cast<int>(c.max_sge);
    attr->max_sge_rd = static_cast<int>(c.max_sge);
    attr->max_cq = static_cast<int>(c.max_cq);
    attr->max_cqe = static_cast<int>(c.max_cqe);
    attr->max_mr = static_cast<int>(c.max_mr);
    attr->max_pd = static_cast<int>(c.max_pd);
    attr->max_qp_rd_atom = kMaxRdAtomic;
    attr->max_qp_init_rd_atom = kMaxRdAtomic;
    attr->max_res_rd_atom = kMaxRdAtomic;
    attr->atomic_cap = IBV_ATOMIC_HCA;  // the engine executes each atomic alone (SPEC.md §5)
    attr->max_srq = static_cast<int>(c.max_srq);
    attr->max_srq_wr = static_cast<int>(c.max_srq_wr);
    attr->max_srq_sge = static_cast<int>(c.max_sge);
    attr->max_pkeys = 1;
    attr->max_mcast_grp = static_cast<int>(kMaxMcastGroups);
    attr->max_mcast_qp_attach = static_cast<int>(kMaxMcastQpAttach);
    attr->max_total_mcast_qp_attach = static_cast<int>(kMaxMcastTotalAttach);
    attr->local_ca_ack_delay = 0;
    attr->phys_port_cnt = static_cast<uint8_t>(c.phys_port_cnt);
    return 0;
}

bool validPort(const Context &ctx, uint8_t port) {
    return port >= 1 && port <= ctx.dev->cfg.phys_port_cnt;
}

// An Ethernet port (SPEC.md §19): the interface's link and MTU as last read, no LID, the RoCEv2
// GID table. The interface is read again here, so a port query sees its addresses as they are.
void queryEthernetPort(Netdev &nd, ibv_port_attr *attr) {
    nd.refresh();
    std::lock_guard<std::mutex> lk(nd.mu);
    const bool up = nd.view.present && nd.view.running;
    attr->state = up ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
    attr->phys_state = up ? 5 : 3;  // LinkUp, Disabled
    attr->active_mtu = roceActiveMtu(nd.view.mtu);
    attr->gid_tbl_len = kRoceGidSlots;
    attr->lid = 0;
    attr->sm_lid = 0;
    attr->port_cap_flags = IBV_PORT_IP_BASED_GIDS;  // as the kernel sets for a RoCE port
    attr->link_layer = IBV_LINK_LAYER_ETHERNET;
}

int queryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || attr == nullptr || !validPort(*ctx, port)) {
        return -EINVAL;
    }
    const Device &dev = *ctx->dev;
    std::memset(attr, 0, sizeof(*attr));
    attr->state = IBV_PORT_ACTIVE;
    attr->max_mtu = IBV_MTU_4096;
    attr->active_mtu = IBV_MTU_4096;
    attr->gid_tbl_len = 1;
    attr->max_msg_sz = dev.cfg.max_msg_sz;
    attr->pkey_tbl_len = 1;
    attr->lid = portLid(dev, port);
    attr->sm_lid = attr->lid;
    attr->max_vl_num = 1;     // VL0
    attr->active_width = 2;   // 4X
    attr->active_speed = 32;  // EDR
    attr->phys_state = 5;     // LinkUp
    attr->link_layer = IBV_LINK_LAYER_INFINIBAND;
    if (dev.netdev) {
        queryEthernetPort(*dev.netdev, attr);
    }
    return 0;
}

// A slot of an Ethernet port's GID table as last read (read once first if never read);
// -ENODATA for an empty slot, as the kernel answers.
int queryRoceGid(Netdev &nd, uint8_t port, uint32_t index, ibv_gid_entry *entry) {
    if (index >= kRoceGidSlots) {
        return -EINVAL;
    }
    bool read;
    {
        std::lock_guard<std::mutex> lk(nd.mu);
        read = nd.read_once;
    }
    if (!read) {
        nd.refresh();
    }
    std::lock_guard<std::mutex> lk(nd.mu);
    std::optional<ibv_gid> gid = nd.table.at(index);
    if (!gid) {
        return -ENODATA;
    }
    std::memset(entry, 0, sizeof(*entry));
    entry->gid = *gid;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = IBV_GID_TYPE_ROCE_V2;
    entry->ndev_ifindex = nd.view.ifindex;
    return 0;
}

int queryGid(ibv_context *context, uint8_t port, uint32_t index, ibv_gid_entry *entry) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || entry == nullptr || !validPort(*ctx, port)) {
        return -EINVAL;
    }
    if (ctx->dev->netdev) {
        return queryRoceGid(*ctx->dev->netdev, port, index, entry);
    }
    if (index != 0) {
        return -EINVAL;
    }
    std::memset(entry, 0, sizeof(*entry));
    // The IB link-local GID: fe80::/64 and the port GUID (the node GUID plus the port number).
    entry->gid.global.subnet_prefix = htobe64(0xfe80000000000000ull);
    entry->gid.global.interface_id = htobe64(ctx->dev->guid + port);
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = IBV_GID_TYPE_IB;
    return 0;
}

// ---- event fds (vdev ABI V3; SPEC.md §9) ---------------------------------------------------

int setCqEventFd(ibv_cq *ib, int fd) {
    Cq *cq = asCq(ib);
    if (cq == nullptr) {
        return -EINVAL;
    }
    Device *dev = cq->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    return swapEventFd(dev, &cq->event_fd, fd);
}

int setAsyncEventFd(ibv_context *context, int fd) {
    Context *ctx = asContext(context);
    if (ctx == nullptr) {
        return -EINVAL;
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    return swapEventFd(dev, &ctx->async_fd, fd);
}

}  // namespace
}  // namespace softnda

extern "C" const struct ibv_extend_vdev_ops softnda_vdev_ops = {
    .abi = IBV_EXTEND_VDEV_ABI_V10,
    .provider = SOFTNDA_PROVIDER_NAME,
    .configure = softnda::CEntry<softnda::vdevConfigure>::call,
    .query_devices = softnda::CEntry<softnda::vdevQueryDevices>::call,
    .open_device = softnda::CEntry<softnda::vdevOpenDevice>::call,
    .close_device = softnda::CEntry<softnda::vdevCloseDevice>::call,
    .is_own_device = softnda::CEntry<softnda::vdevIsOwnDevice>::call,
    .alloc_pd = softnda::CEntry<softnda::allocPd>::call,
    .dealloc_pd = softnda::CEntry<softnda::deallocPd>::call,
    .reg_mr = softnda::CEntry<softnda::regMr>::call,
    .dereg_mr = softnda::CEntry<softnda::deregMr>::call,
    .modify_qp = softnda::CEntry<softnda::modifyQp>::call,
    .query_qp = softnda::CEntry<softnda::queryQp>::call,
    .export_mmio = softnda::CEntry<softnda::vdevExportMmio>::call,
    .query_counters = softnda::CEntry<softnda::vdevQueryCounters>::call,
    .query_device = softnda::CEntry<softnda::queryDevice>::call,
    .query_port = softnda::CEntry<softnda::queryPort>::call,
    .query_gid = softnda::CEntry<softnda::queryGid>::call,
    .set_cq_event_fd = softnda::CEntry<softnda::setCqEventFd>::call,
    .set_async_event_fd = softnda::CEntry<softnda::setAsyncEventFd>::call,
    // ABI V4: restart with live queues (SPEC.md §10).
    .export_object = softnda::CEntry<softnda::vdevExportObject>::call,
    .import_object = softnda::CEntry<softnda::vdevImportObject>::call,
    .set_paused = softnda::CEntry<softnda::vdevSetPaused>::call,
    // ABI V5: calls on different contexts run in parallel (the locks of softnda_internal.h); a
    // RESET -> INIT stores attributes only, refused exactly as modifyTarget() does.
    .guarantees = IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS | IBV_EXTEND_GUARANTEE_PLAIN_INIT,
    // ABI V6: XRC (SPEC.md §14).
    .open_xrcd = softnda::CEntry<softnda::openXrcd>::call,
    .close_xrcd = softnda::CEntry<softnda::closeXrcd>::call,
    .create_xrc_srq = softnda::CEntry<softnda::createXrcSrq>::call,
    .create_xrc_tgt_qp = softnda::CEntry<softnda::createXrcTgtQp>::call,
    .get_srq_num = softnda::CEntry<softnda::getSrqNum>::call,
    // ABI V7: resizing a CQ (SPEC.md §12), re-registering an MR (§13).
    .resize_cq = softnda::CEntry<softnda::resizeCq>::call,
    .rereg_mr = softnda::CEntry<softnda::reregMr>::call,
    // ABI V8: multicast (SPEC.md §11.3).
    .attach_mcast = softnda::CEntry<softnda::attachMcast>::call,
    .detach_mcast = softnda::CEntry<softnda::detachMcast>::call,
    // ABI V9: memory windows (SPEC.md §16).
    .alloc_mw = softnda::CEntry<softnda::allocMw>::call,
    .dealloc_mw = softnda::CEntry<softnda::deallocMw>::call,
    // ABI V10: device memory (SPEC.md §17).
    .alloc_dm = softnda::CEntry<softnda::allocDm>::call,
    .free_dm = softnda::CEntry<softnda::freeDm>::call,
    .reg_dm_mr = softnda::CEntry<softnda::regDmMr>::call,
    .dm_memory = softnda::CEntry<softnda::dmMemory>::call,
};
