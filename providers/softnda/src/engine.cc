// The emulated hardware: engine threads that notice doorbells, execute SQ WQEs against
// registered memory and write CQEs, exactly as SPEC.md says.
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "common/event_signal.h"
#include "common/fd_kind.h"
#include "providers/softnda/src/engine_thread.h"
#include "providers/softnda/src/netdev.h"

namespace softnda {
namespace {

constexpr uint32_t kMaxWqesPerVisit = 1024;  // fairness between queues of one thread
// The engine is scheduled by bytes, not only by WQEs: a tenant's WQE may move 29 SGEs of 64 MiB,
// so a visit to one SQ ends once it has moved kMaxBytesPerVisit (after at least one WQE), and no
// visit takes a new WQE while a control operation waits for the device gate. What is left is
// marked rung and taken on the next pass, after every other rung queue had its visit (each pass
// visits them all, so none starves) and after the waiting control operation. A WQE also costs
// kWqeCost bytes, so a ring of empty ones is bounded the same way.
constexpr uint64_t kMaxBytesPerVisit = 1u << 20;
constexpr uint64_t kWqeCost = 64;
// A same-host message longer than this moves a chunk of it per visit (respondInChunks), the
// device gate given up between chunks, so no WQE holds the device from control operations for
// longer than one chunk's copy (a 2 GiB message otherwise takes ~0.25 s in one go).
constexpr uint64_t kChunkBytes = 1u << 20;
constexpr uint64_t kRnrIntervalNs = 100'000;  // how often the engine sleeps while RNR waits
// The RNR NAK timer of each min_rnr_timer code (IBA table 45), in 10 us units: 0 is 655.36 ms.
constexpr uint32_t kRnrTimer10us[32] = {65536, 1,    2,    3,    4,    6,     8,     12,    16,    24,   32,
                                        48,    64,   96,   128,  192,  256,   384,   512,   768,   1024, 1536,
                                        2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};
}  // namespace

uint64_t rnrTimerNs(uint8_t min_rnr_timer) {
    return uint64_t{kRnrTimer10us[min_rnr_timer & 31]} * 10'000;
}

namespace {
constexpr size_t kMaxSleepPages = FUTEX_WAITV_MAX - 1;  // one waiter is the private kick word
constexpr uint64_t kFullScanEvery = 8;

// The bytes at src, laid out over the segments in order (a READ's or an atomic's reply).
inline void scatterTo(const Segment *seg, uint32_t n, const uint8_t *src) {
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(seg[i].addr, src, seg[i].len);
        src += seg[i].len;
    }
}

// The segments' bytes in order, at dst (a WRITE's payload).
inline void gatherFrom(const Segment *seg, uint32_t n, uint8_t *dst) {
    for (uint32_t i = 0; i < n; ++i) {
        std::memcpy(dst, seg[i].addr, seg[i].len);
        dst += seg[i].len;
    }
}

// The bytes of the src segments, in order, laid out over the dst segments, which hold at least
// as many (a SEND's payload into a receive's buffers).
inline void scatterList(const Segment *src, uint32_t nsrc, const Segment *dst) {
    uint32_t di = 0;
    uint64_t doff = 0;
    for (uint32_t i = 0; i < nsrc; ++i) {
        uint64_t soff = 0;
        while (soff < src[i].len) {
            uint64_t n = std::min<uint64_t>(src[i].len - soff, dst[di].len - doff);
            std::memcpy(dst[di].addr + doff, src[i].addr + soff, n);
            soff += n;
            doff += n;
            if (doff == dst[di].len) {
                di++;
                doff = 0;
            }
        }
    }
}

// Where byte off of a message laid over seg falls: the segment's index and the offset in it.
void seekSegment(const Segment *seg, uint32_t nseg, uint64_t off, uint32_t *index, uint64_t *in) {
    uint32_t k = 0;
    while (k < nseg && off >= seg[k].len) {
        off -= seg[k].len;
        ++k;
    }
    *index = k;
    *in = off;
}

// Bytes [off, off + n) of the message laid over seg, into flat (or from it, into_segments).
void copyAt(const Segment *seg, uint32_t nseg, uint64_t off, uint8_t *flat, uint64_t n, bool into_segments) {
    uint32_t k;
    uint64_t in;
    seekSegment(seg, nseg, off, &k, &in);
    for (; n > 0 && k < nseg; ++k, in = 0) {
        const uint64_t step = std::min<uint64_t>(n, seg[k].len - in);
        if (into_segments) {
            std::memcpy(seg[k].addr + in, flat, step);
        } else {
            std::memcpy(flat, seg[k].addr + in, step);
        }
        flat += step;
        n -= step;
    }
}

// Bytes [off, off + n) of the message laid over src into the same bytes of the message laid over
// dst (a SEND's chunk into its receive's buffers).
void scatterRange(const Segment *src, uint32_t nsrc, const Segment *dst, uint32_t ndst, uint64_t off,
                  uint64_t n) {
    uint32_t si, di;
    uint64_t sin, din;
    seekSegment(src, nsrc, off, &si, &sin);
    seekSegment(dst, ndst, off, &di, &din);
    while (n > 0 && si < nsrc && di < ndst) {
        const uint64_t step = std::min({n, src[si].len - sin, dst[di].len - din});
        std::memcpy(dst[di].addr + din, src[si].addr + sin, step);
        n -= step;
        sin += step;
        din += step;
        if (sin == src[si].len) {
            ++si;
            sin = 0;
        }
        if (din == dst[di].len) {
            ++di;
            din = 0;
        }
    }
}

// GID 0 of a port (SPEC.md §8): fe80::<port GUID>, big-endian.
ibv_gid portGid(const Device &dev, uint8_t port) {
    ibv_gid gid{};
    const uint64_t prefix = 0xfe80000000000000ull;
    const uint64_t guid = dev.guid + port;
    for (int i = 0; i < 8; ++i) {
        gid.raw[i] = static_cast<uint8_t>(prefix >> (56 - 8 * i));
        gid.raw[8 + i] = static_cast<uint8_t>(guid >> (56 - 8 * i));
    }
    return gid;
}

// The 40-byte GRH softnda puts at the head of every UD receive (SPEC.md §11.1): IPv6 header
// fields, big-endian, with the sender's port GID and the destination GID (the receiver's port's,
// or a multicast group's, §11.3).
void fillGrh(uint8_t grh[SOFTNDA_GRH_SIZE], const Device &dev, uint8_t sport, const ibv_gid &dgid,
             uint32_t len) {
    std::memset(grh, 0, SOFTNDA_GRH_SIZE);
    grh[0] = 0x60;  // IP version 6, traffic class and flow label 0
    grh[4] = static_cast<uint8_t>(len >> 8);
    grh[5] = static_cast<uint8_t>(len);
    grh[6] = 0x1b;  // next header: IBA transport
    grh[7] = 1;     // hop limit
    const ibv_gid sgid = portGid(dev, sport);
    std::memcpy(grh + 8, sgid.raw, sizeof(sgid.raw));
    std::memcpy(grh + 24, dgid.raw, sizeof(dgid.raw));
}

// The MGID of the first group with MLID lid that qp joined (SPEC.md §11.3: groups on one MLID
// are not told apart).
const ibv_gid &groupGid(const Qp &qp, uint16_t lid) {
    for (const McastGroup &g : qp.mcast) {
        if (g.lid == lid) {
            return g.gid;
        }
    }
    return qp.mcast.front().gid;  // not reached: qp is a member of lid's list only while it has one
}

}  // namespace

// The head WQE of sq (or the one at index), copied out of the ring once (only what its SGE count
// or inline length says, bounded by the stride and by the copy's own arrays: an XRC initiator's
// 1 KiB entry has room for 960 inline bytes or 60 SGEs, which gatherLocal then refuses).
void fetchWqe(const Qp &qp, WqeCopy *w) {
    fetchWqeAt(qp, qp.sq.ci_local, w);
}

void fetchWqeAt(const Qp &qp, uint32_t index, WqeCopy *w) {
    const Ring &sq = qp.sq;
    const uint8_t *slot = sq.buf + static_cast<size_t>(index & (sq.cnt - 1)) * sq.stride;
    std::memcpy(&w->hdr, slot, sizeof(w->hdr));
    w->xrc_srqn = 0;
    if (qp.wqe_data > SOFTNDA_WQE_HEADER_SIZE) {  // the XRC segment (SPEC.md §14)
        std::memcpy(&w->xrc_srqn, slot + SOFTNDA_WQE_HEADER_SIZE, sizeof(w->xrc_srqn));
        w->xrc_srqn &= 0xffffff;
    }
    if (w->hdr.flags & SOFTNDA_WQE_INLINE) {
        std::memcpy(w->inline_data, slot + qp.wqe_data,
                    std::min<uint32_t>({w->hdr.inline_len, sq.stride - qp.wqe_data, kEngineMaxInline}));
    } else {
        std::memcpy(w->sge, slot + qp.wqe_data,
                    std::min<uint32_t>({w->hdr.num_sge, sendSgeCap(sq.stride, qp.wqe_data), kEngineMaxSge}) *
                        sizeof(softnda_sge));
    }
}

namespace {

// Whether the opcode addresses the responder's memory by rkey (WRITE, READ, atomics).
inline bool usesRkey(uint8_t opcode) {
    return opcode == SOFTNDA_OP_RDMA_WRITE || opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM ||
           opcode == SOFTNDA_OP_RDMA_READ || opcode == SOFTNDA_OP_ATOMIC_CMP_AND_SWP ||
           opcode == SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
}

// The receive completion a SEND or an RDMA WRITE with immediate makes at the responder (SPEC.md
// §3), held in *p until the request's commit point. The caller has taken p->r and, for
// SEND_WITH_INV, invalidated the window the receive then reports (imm_data).
inline void holdRecvCompletion(const softnda_wqe &h, uint64_t total, PendingRecv *p) {
    const bool send = !usesRkey(h.opcode);
    const bool imm = h.opcode == SOFTNDA_OP_SEND_WITH_IMM || h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
    p->set = true;
    p->byte_len = static_cast<uint32_t>(total);
    p->opcode = send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM;
    p->imm = h.imm_data;
    p->flags = static_cast<uint8_t>((imm ? SOFTNDA_CQE_WITH_IMM : 0) |
                                    (send && (h.flags & SOFTNDA_WQE_SOLICITED) ? SOFTNDA_CQE_SOLICITED : 0) |
                                    (h.opcode == SOFTNDA_OP_SEND_WITH_INV ? SOFTNDA_CQE_WITH_INV : 0));
}

}  // namespace

bool isAtomic(uint8_t opcode) {
    return opcode == SOFTNDA_OP_ATOMIC_CMP_AND_SWP || opcode == SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
}

// The responder's memory [remote_addr, +total) a WRITE, READ or atomic addresses, when its rkey,
// the peer's PD and both access flags allow the operation; else nullptr and *status. A WRITE or
// READ of zero bytes needs no rkey and no address (IBA C9-88): only the QP's access flags count.
uint8_t *checkRkey(const Device *dev, const Responder &rp, const softnda_wqe &h, uint64_t total,
                   uint8_t *status) {
    const Qp *peer = rp.qp;
    static uint8_t no_bytes;
    int need = IBV_ACCESS_REMOTE_WRITE;
    if (h.opcode == SOFTNDA_OP_RDMA_READ) {
        need = IBV_ACCESS_REMOTE_READ;
    } else if (isAtomic(h.opcode)) {
        need = IBV_ACCESS_REMOTE_ATOMIC;
        if (h.remote_addr % 8 != 0) {
            *status = IBV_WC_REM_INV_REQ_ERR;
            return nullptr;
        }
    }
    if (total == 0 && !isAtomic(h.opcode)) {
        // A zero-length WRITE or READ touches no memory, so its rkey and address are not
        // validated (IBTA C9-88, as rdma_rxe does): UCX's rc_verbs flushes with a zero-length
        // WRITE naming rkey 0. The responder QP must still allow the operation.
        if ((peer->attrs.access & need) == 0) {
            *status = IBV_WC_REM_ACCESS_ERR;
            return nullptr;
        }
        return &no_bytes;  // nothing is read or written there
    }
    // An rkey names an MR or a memory window (SPEC.md §16), whose own checks come on top.
    uint8_t *remote = nullptr;
    if (isMwKey(h.rkey)) {
        remote = translateMw(dev, rp.pd, peer, h.rkey, h.remote_addr, total, need);
    } else if (Mr *mr = dev->lookupMr(h.rkey); mr != nullptr && mr->pd == rp.pd && (mr->access & need) != 0) {
        remote = mr->translate(h.remote_addr, total);
    }
    if (remote == nullptr || (peer->attrs.access & need) == 0) {
        *status = IBV_WC_REM_ACCESS_ERR;
        return nullptr;
    }
    return remote;
}

namespace {

// SPEC.md §9: after a CQE is published, an armed CQ whose arming the CQE satisfies is disarmed
// (one arming, at most one event) and counts the event. True when the caller must signal it.
bool takeArm(Cq *cq, const softnda_cqe &c) {
    uint32_t arm = __atomic_load_n(cq->arm, __ATOMIC_ACQUIRE);
    while (arm != 0) {
        // 2 = solicited only: a receive that carries SOLICITED, or an error completion. Any other
        // non-zero value arms for the next completion, as kCqArmNext does.
        bool qualifies =
            arm != kCqArmSolicited || (c.flags & SOFTNDA_CQE_SOLICITED) != 0 || c.status != IBV_WC_SUCCESS;
        if (!qualifies) {
            return false;
        }
        // A failed exchange reloads arm: software re-armed in between (another mode, or 0).
        if (__atomic_compare_exchange_n(cq->arm, &arm, 0u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            __atomic_fetch_add(cq->events, 1u, __ATOMIC_RELEASE);
            return true;
        }
    }
    return false;
}

// *raise: the CQ's arming asks for a completion event; *overflowed: this CQE found the CQ full and
// put it in its error state (the context's async event is then due, SPEC.md §6.3).
bool publishCqe(Cq *cq, Counters &ctr, const softnda_cqe &in, bool *raise, bool *overflowed) {
    std::lock_guard<SpinLock> lk(cq->lock);
    if (cq->error) {
        bump(ctr.dropped_cqes);
        return false;
    }
    Ring &r = cq->ring;
    uint32_t ci = __atomic_load_n(r.ci, __ATOMIC_ACQUIRE);
    if (r.ci_local - ci >= r.cnt) {
        cq->error = true;
        __atomic_store_n(cq->state, 1u, __ATOMIC_RELEASE);
        bump(ctr.cq_overflows);
        bump(ctr.dropped_cqes);
        *overflowed = true;
        return false;
    }
    uint8_t *slot = r.buf + static_cast<size_t>(r.ci_local & (r.cnt - 1)) * r.stride;
    auto *e = reinterpret_cast<softnda_cqe *>(slot);
    e->wr_id = in.wr_id;
    e->byte_len = in.byte_len;
    e->imm_data = in.imm_data;
    e->qp_num = in.qp_num;
    e->src_qp = in.src_qp;
    e->opcode = in.opcode;
    e->status = in.status;
    e->flags = in.flags;
    e->resv = 0;
    if (r.stride == SOFTNDA_CQE_TS_SIZE) {
        // Taken under the CQ's lock, so times never decrease in CQE order (SPEC.md §15).
        softnda_cqe_times_now(reinterpret_cast<softnda_cqe_times *>(slot + SOFTNDA_CQE_SIZE));
    }
    uint32_t log = static_cast<uint32_t>(__builtin_ctz(r.cnt));
    // The owner word carries the phase and, for a UD receive, the sender's LID (SPEC.md §3).
    __atomic_store_n(&e->owner, (in.owner & ~1u) | (((r.ci_local >> log) & 1u) ^ 1u), __ATOMIC_RELEASE);
    r.ci_local++;
    __atomic_store_n(r.pi, r.ci_local, __ATOMIC_RELEASE);
    bump(ctr.cqes);
    *raise = takeArm(cq, in);
    return true;
}

}  // namespace

bool writeCqe(Cq *cq, Counters &ctr, const softnda_cqe &in) {
    bool raise = false;
    bool overflowed = false;
    bool written = publishCqe(cq, ctr, in, &raise, &overflowed);
    if (overflowed) {
        signalEventFd(cq->ctx->async_fd);  // outside the CQ's lock: a system call
    }
    if (raise) {
        signalEventFd(cq->event_fd);  // outside the CQ's lock: a system call
    }
    return written;
}

void addCounters(const Counters &c, softnda_counters *out) {
    auto get = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
    out->wqes_executed += get(c.wqes);
    out->bytes += get(c.bytes);
    out->doorbells += get(c.doorbells);
    out->cqes += get(c.cqes);
    out->errors += get(c.errors);
    out->flushed += get(c.flushed);
    out->rnr_naks += get(c.rnr_naks);
    out->cq_overflows += get(c.cq_overflows);
    out->dropped_cqes += get(c.dropped_cqes);
    out->srq_limit_events += get(c.srq_limit_events);
    out->passes += get(c.passes);
    out->sleeps += get(c.sleeps);
    out->wakeups_by_hint += get(c.wakeups);
    out->sweeps += get(c.sweeps);
    out->wire_tx_packets += get(c.wire_tx);
    out->wire_rx_packets += get(c.wire_rx);
    out->wire_retransmits += get(c.wire_retransmits);
    out->wire_seq_naks += get(c.wire_seq_naks);
    out->wire_bad_icrc += get(c.wire_bad_icrc);
    out->wire_malformed += get(c.wire_malformed);
    out->wire_fault_drops += get(c.wire_fault_drops);
}

bool haveFutexWaitv() {
    // nr_futexes = 0 is invalid: a kernel with the call says EINVAL, one without it ENOSYS.
    static const bool have = [] {
        long rc = syscall(SYS_futex_waitv, nullptr, 0u, 0u, nullptr, CLOCK_MONOTONIC);
        return !(rc < 0 && errno == ENOSYS);
    }();
    return have;
}

void signalEventFd(int fd) {
    // A tenant's descriptor: never a write that can block the engine (common/event_signal.h).
    (void)ibvx::signalEventFd(fd);
}

int swapEventFd(Device *dev, int *slot, int fd) {
    int dup = -1;
    if (fd != -1) {
        if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
            return -EBADF;
        }
        if (!ibvx::isEventFd(fd)) {
            return -EINVAL;  // the engine writes 8 bytes to it: a pipe could block the engine
        }
        dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) {
            return -errno;
        }
    }
    int old;
    {
        std::lock_guard<Gate> gate(dev->gate);  // no engine pass is writing to *slot now
        old = *slot;
        *slot = dup;
    }
    if (old >= 0) {
        ::close(old);
    }
    return 0;
}

bool enterQpError(Qp *qp) {
    if (qp->state.exchange(IBV_QPS_ERR, std::memory_order_acq_rel) == IBV_QPS_ERR) {
        return false;
    }
    // In queue memory first, so a successor process finds the QP in ERR (SPEC.md §10).
    if (qp->sq.pi != nullptr) {
        __atomic_store_n(qp->recWord(kQpStateWord), static_cast<uint32_t>(IBV_QPS_ERR), __ATOMIC_RELEASE);
    }
    if (qp->fatal_events != nullptr) {
        __atomic_fetch_add(qp->fatal_events, 1u, __ATOMIC_RELEASE);
    }
    signalEventFd(qp->ctx->async_fd);
    return true;
}

void setQpError(Device *dev, Qp *qp) {
    enterQpError(qp);
    if (dev->engine && qp->sq_db.page != nullptr) {
        dev->engine->poke(qp->sq_db.page, qp->sq_db.index);
    }
}

Engine::Engine(Device *dev, uint32_t threads) {
    if (dev->netdev) {
        // An Ethernet device reaches other hosts over RoCEv2 (SPEC.md §18). A socket that cannot
        // be bound leaves the device to its own host: connections to others are refused with
        // the reason (wireError).
        wire_error_ = WireSocket::open(dev->netdev->name, static_cast<uint16_t>(dev->cfg.wire_port),
                                       dev->cfg.wire_faults, &wire_);
    }
    for (uint32_t i = 0; i < threads; ++i) {
        threads_.push_back(std::make_unique<Thread>(dev, this, i, wire_.get(), false));
    }
    if (wire_) {
        receiver_ = std::make_unique<Thread>(dev, this, dev->index, wire_.get(), true);
    }
    for (DbPage *p : dev->pages) {
        if (p != nullptr) {
            addPage(p);
        }
    }
}

Engine::~Engine() {
    if (receiver_) {
        wire_->stop();
        receiver_.reset();
    }
    threads_.clear();
}

void Engine::addPage(DbPage *page) {
    threads_[page->page_no % threads_.size()]->addPage(page);
}
void Engine::removePage(DbPage *page) {
    threads_[page->page_no % threads_.size()]->removePage(page);
}
void Engine::forgetQp(Qp *qp) {
    for (auto &t : threads_) {
        t->forgetQp(qp);
    }
}
void Engine::poke(DbPage *page, unsigned slot) {
    __atomic_fetch_or(page->summary(), 1ull << slot, __ATOMIC_SEQ_CST);
    threads_[page->page_no % threads_.size()]->kick();
}
void Engine::resume() {
    for (auto &t : threads_) {
        t->resume();
    }
}
void Engine::addCounters(softnda_counters *out) const {
    for (auto &t : threads_) {
        softnda::addCounters(t->counters(), out);
    }
    if (receiver_) {
        // What the wire thread did as a responder (bytes, receives, RNR NAKs, errors).
        softnda::addCounters(receiver_->counters(), out);
    }
    if (wire_error_ < 0) {
        out->wire_socket_errno = static_cast<uint64_t>(-wire_error_);
    }
    if (wire_) {
        auto get = [](const std::atomic<uint64_t> &a) { return a.load(std::memory_order_relaxed); };
        out->wire_tx_packets += get(wire_->sent);
        out->wire_rx_packets += get(wire_->received);
        out->wire_bad_icrc += get(wire_->bad_icrc);
        out->wire_malformed += get(wire_->malformed);
        out->wire_fault_drops += get(wire_->fault_drops);
        out->wire_source_ports += get(wire_->source_ports);
    }
}

void Engine::Thread::run() {
    const uint64_t spin_ns = static_cast<uint64_t>(dev_->cfg.spin_us) * 1000;
    uint64_t idle_since = 0;
    uint32_t idle_passes = 0;
    bool timed_out = false;
    while (!stop_.load(std::memory_order_acquire)) {
        dev_->gate.enterShared();
        // Read inside the gate: set_paused(1) stores the flag, then takes the gate once, so a
        // pass either ends before it returns or sees the flag (SPEC.md §10).
        if (dev_->paused.load(std::memory_order_acquire)) {
            dev_->gate.leaveShared();
            waitWhilePaused();
            idle_passes = 0;
            timed_out = false;
            continue;
        }
        if (rescan_.exchange(false, std::memory_order_acq_rel)) {
            // Resumed: rings that happened while paused have no summary bit seen yet, or only
            // a register value (a bare store); look at everything once.
            sweep();
            full_scan_due_ = true;
        }
        bool did = pass();
        dev_->gate.leaveShared();
        if (did) {
            idle_passes = 0;
            timed_out = false;
            continue;
        }
        // A timeout whose sweep and pass found nothing goes straight back to sleep: spinning
        // spin_us after every sleep_us timeout kept an idle engine ~5% busy (50 of 1,050 us).
        // Only a wake or work earns the spin, since more doorbells are likely to follow.
        if (timed_out) {
            timed_out = sleep();
            continue;
        }
        // Reading the clock every pass would cost more than the pass itself.
        if (idle_passes++ % 64 == 0) {
            uint64_t now = nowNs();
            if (idle_passes == 1) {
                idle_since = now;
            } else if (now - idle_since >= spin_ns) {
                timed_out = sleep();
                idle_passes = 0;
                continue;
            }
        }
        ibvx_cpu_relax();
    }
}

void Engine::Thread::waitWhilePaused() {
    uint32_t seen = __atomic_load_n(&kick_word_, __ATOMIC_SEQ_CST);
    if (!dev_->paused.load(std::memory_order_acquire) || stop_.load(std::memory_order_acquire)) {
        return;
    }
    // resume() and stop kick; the timeout only bounds a lost kick.
    timespec rel{0, 10'000'000};
    syscall(SYS_futex, &kick_word_, FUTEX_WAIT_PRIVATE, seen, &rel, nullptr, 0);
}

bool Engine::Thread::takeRings(DbPage *page) {
    uint64_t *sum = page->summary();
    if (__atomic_load_n(sum, __ATOMIC_RELAXED) == 0) {
        return false;
    }
    uint64_t bits = __atomic_exchange_n(sum, 0ull, __ATOMIC_ACQUIRE);
    while (bits != 0) {
        unsigned slot = static_cast<unsigned>(__builtin_ctzll(bits));
        bits &= bits - 1;
        handleSlot(page, slot);
    }
    return true;
}

// Most passes look only at the recently rung ("hot") pages; a full scan of every page comes
// after a sleep and otherwise once per kFullScanEvery x (pages / hot pages) passes, so full scans
// stay about 1/kFullScanEvery of the engine's time however many idle QPs exist. A busy QP's ring
// is then noticed after a handful of loads; a ring on a cold page waits up to that many short
// passes (SPEC.md §7).
bool Engine::Thread::pass() {
    bump(ctr_.passes);
    bool did = false;
    uint64_t every = kFullScanEvery * std::max<uint64_t>(1, pages_.size() / std::max<size_t>(1, hot_.size()));
    if (full_scan_due_ || ++pass_no_ % every == 0) {
        full_scan_due_ = false;
        for (DbPage *page : pages_) {
            if (takeRings(page)) {
                touchHot(page);
                did = true;
            }
        }
    } else {
        for (size_t i = 0; i < hot_.size(); ++i) {
            did |= takeRings(hot_[i]);
        }
    }
    if (!rnr_.empty()) {
        // Copy: processSq may remove entries.
        std::vector<Qp *> waiting = rnr_;
        for (Qp *qp : waiting) {
            did |= processSq(qp);
        }
    }
    return did;
}

void Engine::Thread::touchHot(DbPage *p) {
    if (!hot_.empty() && hot_.front() == p) {
        return;
    }
    auto it = std::find(hot_.begin(), hot_.end(), p);
    if (it != hot_.end()) {
        hot_.erase(it);
    } else if (hot_.size() >= kMaxSleepPages) {
        hot_.pop_back();
    }
    hot_.insert(hot_.begin(), p);
}

bool Engine::Thread::handleSlot(DbPage *page, unsigned slot) {
    if (page->kind[slot] == SlotKind::Free) {
        return false;  // a stray bit (a stale or misbehaving ringer): nothing lives there
    }
    // Counted here, where a new register value is taken, not per summary bit: a sweep after a
    // sleep may take the ring before its bit is read, and the bit must not count it again.
    uint32_t v = __atomic_load_n(page->reg(slot), __ATOMIC_RELAXED);
    if (v != page->last_seen[slot]) {
        bump(ctr_.doorbells);
        page->last_seen[slot] = v;
    }
    switch (page->kind[slot]) {
        case SlotKind::Sq:
            return processSq(static_cast<Qp *>(page->owner[slot]));
        case SlotKind::Rq: {
            auto *qp = static_cast<Qp *>(page->owner[slot]);
            if (qp->state.load(std::memory_order_acquire) == IBV_QPS_ERR) {
                flushRq(qp);
            }
            return true;  // RNR waiters retry on their own threads' next pass
        }
        default:
            return false;
    }
}

// Full look at every register of this thread's pages: finds bare register stores (no summary
// bit) and anything a lost hint would have hidden. Runs after each sleep.
void Engine::Thread::sweep() {
    bump(ctr_.sweeps);
    for (DbPage *page : pages_) {
        for (unsigned i = 0; i < SOFTNDA_DB_REGS_PER_PAGE; ++i) {
            if (page->kind[i] == SlotKind::Free) {
                continue;
            }
            uint32_t v = __atomic_load_n(page->reg(i), __ATOMIC_ACQUIRE);
            if (v != page->last_seen[i]) {
                handleSlot(page, i);
            }
        }
    }
}

// Without futex_waitv (Linux before 5.16, qemu-user 7.2; or futex_waitv = 0) the engine can
// wait on one word only. It waits on its private kick word, so control operations and stop
// still wake it at once, and arms no page: a helper's wake hint then costs no system call and
// wakes nothing, and a doorbell rung during the sleep is found when the sleep ends (within
// sleep_us) by the pass and sweep that follow.
bool Engine::Thread::sleep() {
    futex_waitv waiters[FUTEX_WAITV_MAX];
    size_t n = 0;
    const bool waitv = dev_->cfg.futex_waitv != 0 && haveFutexWaitv();
    dev_->gate.enterShared();
    uint32_t kick_seen = __atomic_load_n(&kick_word_, __ATOMIC_SEQ_CST);
    waiters[n++] =
        futex_waitv{kick_seen, reinterpret_cast<uintptr_t>(&kick_word_), FUTEX_32 | FUTEX_PRIVATE_FLAG, 0};
    auto arm = [&](DbPage *p) {
        if (!waitv || n >= FUTEX_WAITV_MAX || __atomic_load_n(p->sleeping(), __ATOMIC_RELAXED) != 0) {
            return;
        }
        __atomic_store_n(p->sleeping(), 1u, __ATOMIC_SEQ_CST);
        // Read before the re-check below: a wake after this read changes the word, so the wait
        // returns at once (no lost wake-up).
        uint32_t seq = __atomic_load_n(p->wakeSeq(), __ATOMIC_SEQ_CST);
        waiters[n++] = futex_waitv{seq, reinterpret_cast<uintptr_t>(p->wakeSeq()), FUTEX_32, 0};
    };
    // Recently rung pages first, then the rest while the kernel's limit allows.
    for (DbPage *p : hot_) {
        arm(p);
    }
    for (DbPage *p : pages_) {
        arm(p);
    }
    // The seq_cst stores of engine_sleeping above and the seq_cst loads of the summaries below
    // pair with the helper's seq_cst OR then load (Dekker): one side always sees the other.
    bool rung = false;
    for (DbPage *p : pages_) {
        rung = rung || __atomic_load_n(p->summary(), __ATOMIC_SEQ_CST) != 0;
    }
    uint64_t sleep_ns = rnr_.empty() ? static_cast<uint64_t>(dev_->cfg.sleep_us) * 1000 : kRnrIntervalNs / 4;
    dev_->gate.leaveShared();
    int rc = 0;
    if (!rung && !stop_.load(std::memory_order_acquire)) {
        bump(ctr_.sleeps);
        if (waitv) {
            uint64_t deadline = nowNs() + sleep_ns;
            timespec ts{static_cast<time_t>(deadline / 1'000'000'000ull),
                        static_cast<long>(deadline % 1'000'000'000ull)};
            rc = static_cast<int>(
                syscall(SYS_futex_waitv, waiters, static_cast<unsigned>(n), 0u, &ts, CLOCK_MONOTONIC));
        } else {
            // 0 when kicked, like futex_waitv's index of the kick word: not a hint's wake-up.
            timespec rel{static_cast<time_t>(sleep_ns / 1'000'000'000ull),
                         static_cast<long>(sleep_ns % 1'000'000'000ull)};
            rc = static_cast<int>(
                syscall(SYS_futex, &kick_word_, FUTEX_WAIT_PRIVATE, kick_seen, &rel, nullptr, 0));
        }
    }
    dev_->gate.enterShared();
    // Clear through the current page list: a page may have gone away while we slept.
    for (DbPage *p : pages_) {
        if (__atomic_load_n(p->sleeping(), __ATOMIC_RELAXED) != 0) {
            __atomic_store_n(p->sleeping(), 0u, __ATOMIC_RELAXED);
        }
    }
    if (rc > 0) {
        bump(ctr_.wakeups);
    }
    bool timed_out = rc < 0 && errno == ETIMEDOUT;
    if (timed_out && !dev_->paused.load(std::memory_order_acquire)) {
        sweep();
    }
    full_scan_due_ = true;  // the page that woke us may be a cold one
    dev_->gate.leaveShared();
    return timed_out;
}

Qp *Engine::Thread::peerOf(Qp *qp) {
    if (qp->peer_epoch == dev_->qp_epoch && qp->peer != nullptr && qp->peer->qpn == qp->attrs.dest_qpn) {
        return qp->peer;
    }
    auto it = dev_->qps.find(qp->attrs.dest_qpn);
    qp->peer = it == dev_->qps.end() ? nullptr : it->second;
    qp->peer_epoch = dev_->qp_epoch;
    return qp->peer;
}

bool Engine::Thread::checkLocal(const Pd *pd, const softnda_sge *sges, uint32_t n, bool need_write,
                                Segment *out) {
    if (n > kEngineMaxSge) {  // a count re-read from a tenant's ring: out holds kEngineMaxSge
        return false;
    }
    for (uint32_t i = 0; i < n; ++i) {
        Mr *mr = dev_->lookupMr(sges[i].lkey);
        uint8_t *host = mr != nullptr ? mr->translate(sges[i].addr, sges[i].length) : nullptr;
        if (host == nullptr || mr->pd != pd || (need_write && (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0)) {
            return false;
        }
        out[i] = Segment{host, sges[i].length};
    }
    return true;
}

// A producer index more than a ring ahead of the consumer is a doorbell overflow (SPEC.md
// §6.4): the queue is discarded and, for an SQ or RQ, its QP moved to ERR. Bounding it here also
// bounds every loop over [ci, pi).
bool Engine::Thread::overflowed(Qp *qp, Ring &ring, uint32_t pi) {
    if (pi - ring.ci_local <= ring.cnt) {
        return false;
    }
    ring.ci_local = pi;
    __atomic_store_n(ring.ci, pi, __ATOMIC_RELEASE);
    if (qp != nullptr && &ring == &qp->sq) {
        __atomic_store_n(qp->recWord(kSqExecWord), pi, __ATOMIC_RELEASE);  // nothing in flight
    }
    bump(ctr_.errors);
    if (qp != nullptr) {
        setQpError(dev_, qp);
    }
    return true;
}

// Whether this pass should take no new WQE: a control operation waits for the gate this pass
// holds shared (Gate::lock counts it before it blocks).
bool Engine::Thread::yieldToOthers() const {
    return dev_->gate.writers.load(std::memory_order_relaxed) != 0;
}

// The bytes a WQE names (its inline data, or its SGEs' lengths as far as the copy holds them):
// what it costs the engine, whatever it turns out to do.
uint64_t wqeBytes(const WqeCopy &w) {
    if ((w.hdr.flags & SOFTNDA_WQE_INLINE) != 0) {
        return std::min(w.hdr.inline_len, kEngineMaxInline);
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < std::min<uint32_t>(w.hdr.num_sge, kEngineMaxSge); ++i) {
        total += w.sge[i].length;
    }
    return total;
}

// The requester's loop over the SQ (rdma_rxe's rxe_req.c, with the completer's part in
// completeWqe): each WQE from CI to PI in order, up to kMaxWqesPerVisit and kMaxBytesPerVisit,
// while the QP is in RTS and no control operation waits for the gate.
bool Engine::Thread::processSq(Qp *qp) {
    Ring &sq = qp->sq;
    uint32_t pi = __atomic_load_n(sq.pi, __ATOMIC_ACQUIRE);
    if (qp->scq == nullptr) {
        // An XRC target has no send queue (its SQ ring is the zero-depth one every QP has, SPEC.md
        // §1): whatever software put there is discarded without completions.
        sq.ci_local = pi;
        __atomic_store_n(sq.ci, pi, __ATOMIC_RELEASE);
        return false;
    }
    overflowed(qp, sq, pi);
    int state = qp->state.load(std::memory_order_acquire);
    if (state == IBV_QPS_ERR) {
        endRnrWait(qp);
        resetWire(qp);  // what was on the wire is flushed with the rest
        flushQp(qp, pi);
        return true;
    }
    if (qp->reliableOnWire()) {
        // A peer on another host (SPEC.md §18): nothing to settle with it, the head WQE goes
        // again with the PSNs it had.
        qp->recover_head = false;
        qp->recover_psn = false;
        return wireProcessSq(qp, pi);
    }
    if (state != IBV_QPS_RTS) {
        return false;
    }
    if (qp->recover_head || qp->recover_psn) {
        settle(qp, pi);
    }
    bool did = false;
    uint32_t budget = kMaxWqesPerVisit;
    uint64_t visit_bytes = 0;
    while (sq.ci_local != pi && budget-- > 0 && visit_bytes < kMaxBytesPerVisit && !yieldToOthers()) {
        // WQE ci_local starts (SPEC.md §10): a successor that finds this word one ahead of CI
        // asks the responder whether the WQE took effect before running it again.
        __atomic_store_n(qp->recWord(kSqExecWord), sq.ci_local + 1, __ATOMIC_RELEASE);
        WqeCopy w;
        fetchWqe(*qp, &w);
        visit_bytes += std::min(wqeBytes(w), kChunkBytes) + kWqeCost;  // a chunk at most
        ExecResult res = execute(qp, w);
        if (res.outcome == Outcome::Partial) {
            endRnrWait(qp);
            did = true;
            break;  // the rest of the message on the next pass, after every other queue's turn
        }
        if (res.outcome != Outcome::Done) {
            bool rnr = res.outcome == Outcome::RnrWait;
            if (rnr ? keepWaitingRnr(qp) : keepWaitingForPeer(qp)) {
                break;  // at the head of the SQ
            }
            res = ExecResult{static_cast<uint8_t>(rnr ? IBV_WC_RNR_RETRY_EXC_ERR : IBV_WC_RETRY_EXC_ERR), 0,
                             Outcome::Done};
        }
        endRnrWait(qp);
        did = true;
        if (!completeWqe(qp, w.hdr, res)) {
            if (res.status != IBV_WC_SUCCESS) {
                bump(ctr_.errors);
            }
            enterQpError(qp);  // a CQ overflow, if the WQE itself succeeded
            flushQp(qp, pi);
            break;
        }
    }
    __atomic_store_n(sq.ci, sq.ci_local, __ATOMIC_RELEASE);
    if (sq.ci_local != pi && !qp->rnr_waiting && qp->state.load(std::memory_order_relaxed) == IBV_QPS_RTS) {
        // Budget used up (the visit's, the pass's), or the gate wanted: come back on the next pass.
        __atomic_fetch_or(qp->sq_db.page->summary(), 1ull << qp->sq_db.index, __ATOMIC_RELAXED);
    }
    return did;
}

// The head WQE met an empty receive queue (an RNR NAK): true while its QP keeps waiting (on the
// thread's RNR list, retried each pass; rnr_retry 7 waits for ever), false once the retries
// are used up.
bool Engine::Thread::keepWaitingRnr(Qp *qp) {
    bump(ctr_.rnr_naks);
    uint64_t now = nowNs();
    // The responder's NAK carries its min_rnr_timer: each such period without a receive uses one
    // retry (SPEC.md §5.2). execute() found the peer this pass, so qp->peer is current.
    const uint64_t timer = rnrTimerNs(qp->peer != nullptr ? qp->peer->attrs.min_rnr_timer : 0);
    if (!qp->rnr_waiting || qp->waits_for_peer) {  // a new wait, or the responder answered now
        startWait(qp, false, now + timer);
        qp->rnr_used = 0;
    } else if (now >= qp->rnr_deadline_ns) {
        qp->rnr_used++;
        qp->rnr_deadline_ns = now + timer;
    }
    return qp->attrs.rnr_retry == 7 || qp->rnr_used < qp->attrs.rnr_retry;
}

// No responder answered the head WQE: true while its QP keeps retrying (on the thread's waiting
// list, like an RNR wait), false once a real NIC's transport retries would be used up: the
// first try and retry_cnt retries, each after the local ACK timeout, 4.096 us * 2^timeout. A
// timeout of 0, which the IBTA reads as "wait for ever", fails at once here: a QP left at its
// defaults must not hang its sender (SPEC.md §5.4).
bool Engine::Thread::keepWaitingForPeer(Qp *qp) {
    const uint8_t timeout = std::min<uint8_t>(qp->attrs.timeout, 31);
    if (timeout == 0) {
        return false;
    }
    uint64_t now = nowNs();
    if (!qp->rnr_waiting || !qp->waits_for_peer) {
        startWait(qp, true, now + (uint64_t{qp->attrs.retry_cnt} + 1) * (uint64_t{4096} << timeout));
    }
    return now < qp->rnr_deadline_ns;
}

void Engine::Thread::startWait(Qp *qp, bool for_peer, uint64_t deadline_ns) {
    if (!qp->rnr_waiting) {
        qp->rnr_waiting = true;
        rnr_.push_back(qp);
    }
    qp->waits_for_peer = for_peer;
    qp->rnr_deadline_ns = deadline_ns;
}

void Engine::Thread::endRnrWait(Qp *qp) {
    if (qp->rnr_waiting) {
        qp->rnr_waiting = false;
        forgetQp(qp);
    }
}

// The completer's part of a WQE that ran (rdma_rxe's rxe_comp.c): the SQ's CI and PSN, then the
// CQE when the WQE was signalled or failed. False when the QP must go to ERR: the WQE failed or
// its CQ overflowed.
bool Engine::Thread::completeWqe(Qp *qp, const softnda_wqe &h, const ExecResult &res) {
    Ring &sq = qp->sq;
    sq.ci_local++;
    bump(ctr_.wqes);
    bool ok = res.status == IBV_WC_SUCCESS;
    if (!ok) {
        // ERR before the error CQE: a consumer that polls the CQE and then queries the QP must
        // see ERR, as with a real NIC (the error completion is the transition's report).
        enterQpError(qp);
    }
    // CI per WQE, not per batch, and before the CQE: a CQE implies its ring slots are free
    // (SPEC.md §4), and a successor must not run a finished WQE again (§10). The PSN after CI:
    // its loss is what settle() repairs.
    __atomic_store_n(sq.ci, sq.ci_local, __ATOMIC_RELEASE);
    __atomic_store_n(qp->recWord(kSqPsnWord), qp->sq_psn, __ATOMIC_RELEASE);
    if (!ok || (h.flags & SOFTNDA_WQE_SIGNALED) || qp->init.sq_sig_all) {
        softnda_cqe c{};
        c.wr_id = h.wr_id;
        c.byte_len = res.byte_len;
        c.qp_num = qp->qpn;
        c.opcode = softnda_send_wc_opcode(h.opcode);
        c.status = res.status;
        if (!writeCqe(qp->scq, ctr_, c)) {
            ok = false;
        }
    }
    return ok;
}

// A QP in ERR completes what its SQ and its own RQ hold with flush errors (SPEC.md §6.2).
void Engine::Thread::flushQp(Qp *qp, uint32_t pi) {
    abandonChunked(qp);
    flushSq(qp, pi);
    flushRq(qp);
}

void Engine::Thread::flushSq(Qp *qp, uint32_t pi) {
    Ring &sq = qp->sq;
    while (sq.ci_local != pi) {
        const auto *w = reinterpret_cast<const softnda_wqe *>(
            sq.buf + static_cast<size_t>(sq.ci_local & (sq.cnt - 1)) * sq.stride);
        softnda_cqe c{};
        c.wr_id = w->wr_id;
        c.opcode = softnda_send_wc_opcode(w->opcode);
        c.status = IBV_WC_WR_FLUSH_ERR;
        c.qp_num = qp->qpn;
        sq.ci_local++;
        __atomic_store_n(sq.ci, sq.ci_local, __ATOMIC_RELEASE);
        bump(ctr_.flushed);
        writeCqe(qp->scq, ctr_, c);
    }
}

void Engine::Thread::flushRq(Qp *qp) {
    if (!qp->hasRq()) {
        return;
    }
    std::lock_guard<std::mutex> lk(qp->rq_lock);
    Ring &rq = qp->rq;
    uint32_t pi = __atomic_load_n(rq.pi, __ATOMIC_ACQUIRE);
    overflowed(qp, rq, pi);
    while (rq.ci_local != pi) {
        const auto *w = reinterpret_cast<const softnda_recv_wqe *>(
            rq.buf + static_cast<size_t>(rq.ci_local & (rq.cnt - 1)) * rq.stride);
        softnda_cqe c{};
        c.wr_id = w->wr_id;
        c.opcode = IBV_WC_RECV;
        c.status = IBV_WC_WR_FLUSH_ERR;
        c.qp_num = qp->qpn;
        rq.ci_local++;
        __atomic_store_n(rq.ci, rq.ci_local, __ATOMIC_RELEASE);
        bump(ctr_.flushed);
        writeCqe(qp->rcq, ctr_, c);
    }
}

// The local half of a send WQE's checks (SPEC.md §5.1 steps 2-4): its shape for the QP's
// transport, its length, and its local SGEs resolved to segments (inline data in place).
// IBV_WC_SUCCESS, or the completion status of the error.
uint8_t Engine::Thread::gatherLocal(Qp *qp, const WqeCopy &w, Segment *local, uint32_t *nlocal_out,
                                    uint64_t *total_out) {
    const softnda_wqe &h = w.hdr;
    const uint32_t sge_cap = sendSgeCap(qp->sq.stride, qp->wqe_data);
    const bool is_inline = (h.flags & SOFTNDA_WQE_INLINE) != 0;
    const uint8_t bad = IBV_WC_LOC_QP_OP_ERR;
    const bool send_inv = h.opcode == SOFTNDA_OP_SEND_WITH_INV &&
                          (qp->init.qp_type == IBV_QPT_RC || qp->init.qp_type == IBV_QPT_XRC_SEND);
    if (h.opcode > qp->max_opcode && !send_inv) {  // what the QP's transport executes (SPEC.md §11)
        return bad;
    }
    if (is_inline) {
        bool inline_ok = h.opcode == SOFTNDA_OP_SEND || h.opcode == SOFTNDA_OP_SEND_WITH_IMM || send_inv ||
                         h.opcode == SOFTNDA_OP_RDMA_WRITE || h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
        if (!inline_ok || h.inline_len > qp->sq.stride - qp->wqe_data ||
            h.inline_len > qp->init.cap.max_inline_data) {
            return bad;
        }
    } else if (h.num_sge > sge_cap || h.num_sge > qp->init.cap.max_send_sge) {
        return bad;
    }
    const bool atomic = isAtomic(h.opcode);
    uint64_t total = 0;
    uint32_t nlocal = 0;
    if (is_inline) {
        total = h.inline_len;
        if (total > 0) {
            local[0] = Segment{const_cast<uint8_t *>(w.inline_data), h.inline_len};
            nlocal = 1;
        }
    } else {
        for (uint32_t i = 0; i < h.num_sge; ++i) {
            total += w.sge[i].length;
        }
        nlocal = h.num_sge;
    }
    if (total > qp->max_msg || (atomic && total != 8)) {
        return IBV_WC_LOC_LEN_ERR;
    }
    bool writes_local = h.opcode == SOFTNDA_OP_RDMA_READ || atomic;
    if (!is_inline && !checkLocal(qp->pd, w.sge, h.num_sge, writes_local, local)) {
        return IBV_WC_LOC_PROT_ERR;
    }
    *nlocal_out = nlocal;
    *total_out = total;
    return IBV_WC_SUCCESS;
}

ExecResult Engine::Thread::execute(Qp *qp, const WqeCopy &w) {
    const softnda_wqe &h = w.hdr;
    ExecResult bad{IBV_WC_LOC_QP_OP_ERR, 0, Outcome::Done};
    if (h.opcode == SOFTNDA_OP_BIND_MW || h.opcode == SOFTNDA_OP_LOCAL_INV) {
        // Local memory-window operations (SPEC.md §16), on every transport but UD.
        if (qp->init.qp_type == IBV_QPT_UD) {
            return bad;
        }
        return ExecResult{
            h.opcode == SOFTNDA_OP_BIND_MW ? executeBindMw(dev_, qp, h) : executeLocalInv(dev_, qp, h.rkey),
            0, Outcome::Done};
    }
    if (h.opcode == SOFTNDA_OP_NOP) {
        return ExecResult{};
    }
    Segment local[kEngineMaxSge];
    uint32_t nlocal = 0;
    uint64_t total = 0;
    if (uint8_t st = gatherLocal(qp, w, local, &nlocal, &total); st != IBV_WC_SUCCESS) {
        return ExecResult{st, 0, Outcome::Done};
    }
    if (qp->init.qp_type == IBV_QPT_UD) {
        return sendDatagram(qp, h, local, nlocal, total);
    }
    if (qp->init.qp_type == IBV_QPT_UC) {
        return sendUnconnected(qp, w, local, nlocal, total);
    }
    // RC, and an XRC initiator, whose responder is an XRC target (SPEC.md §14).
    const ibv_qp_type peer_type = qp->init.qp_type == IBV_QPT_XRC_SEND ? IBV_QPT_XRC_RECV : IBV_QPT_RC;
    Qp *peer = peerOf(qp);
    if (peer == nullptr || peer->init.qp_type != peer_type) {
        return ExecResult{IBV_WC_RETRY_EXC_ERR, 0, Outcome::PeerWait};
    }
    std::lock_guard<std::mutex> lk(peer->rq_lock);
    int ps = peer->state.load(std::memory_order_acquire);
    if (ps != IBV_QPS_RTR && ps != IBV_QPS_RTS && ps != IBV_QPS_SQD) {
        return ExecResult{IBV_WC_RETRY_EXC_ERR, 0, Outcome::PeerWait};
    }
    if (peer->attrs.dest_qpn != qp->qpn || peer->rq_psn != qp->sq_psn) {
        // A QP connected elsewhere drops the request; an unexpected PSN draws a NAK or a
        // duplicate ACK: either way the requester retries until retry_cnt runs out (SPEC.md §5.1).
        return ExecResult{IBV_WC_RETRY_EXC_ERR, 0, Outcome::PeerWait};
    }
    Responder rp = responderOf(peer);
    if (peer_type == IBV_QPT_XRC_RECV) {
        if (ExecResult bad_srq = xrcTarget(peer, w.xrc_srqn, &rp); bad_srq.status != IBV_WC_SUCCESS) {
            return bad_srq;
        }
    }
    PendingRecv pending;
    const bool chunked = qp->chunked.active || (total > kChunkBytes && !isAtomic(h.opcode));
    ExecResult res = chunked ? respondInChunks(qp, rp, h, local, nlocal, total, &pending)
                             : respond(qp, rp, w, local, nlocal, total, &pending);
    if (res.outcome == Outcome::Done) {
        commit(qp, rp, pending);
    }
    return res;
}

// The XRC SRQ an initiator's request names at the target tgt (tgt->rq_lock held): it must exist
// and belong to the target's XRC domain; otherwise the target answers with an invalid-request NAK,
// which moves it to ERR (SPEC.md §14). The SRQ is device-wide: an SRQ of any context of the
// device, reachable while the gate is held.
ExecResult Engine::Thread::xrcTarget(Qp *tgt, uint32_t srqn, Responder *out) {
    auto it = dev_->xrc_srqs.find(srqn);
    if (it == dev_->xrc_srqs.end() || it->second->xrcd != tgt->xrcd) {
        return responderError(tgt, IBV_WC_REM_INV_REQ_ERR);
    }
    Srq *srq = it->second;
    *out = Responder{tgt, srq, srq->cq, srq->pd};
    return ExecResult{};
}

// A request the responder took (peer->rq_lock held): its PSNs move and its receive completes.
void Engine::Thread::commit(Qp *qp, const Responder &rp, const PendingRecv &pending) {
    Qp *peer = rp.qp;
    peer->rq_psn = (peer->rq_psn + 1) & kPsnMask;
    if (pending.set && rp.srq == nullptr) {
        // The receive's CI, held back since takeRecv: a request that dies before here has
        // consumed nothing a successor can see (SPEC.md §10).
        __atomic_store_n(peer->rq.ci, peer->rq.ci_local, __ATOMIC_RELEASE);
    }
    // The commit point of the WQE (SPEC.md §10): once this is in queue memory, a successor
    // never runs it again.
    __atomic_store_n(peer->recWord(kRqPsnWord), peer->rq_psn, __ATOMIC_RELEASE);
    qp->sq_psn = (qp->sq_psn + 1) & kPsnMask;
    if (pending.set) {
        completeRecv(rp, pending.r, IBV_WC_SUCCESS, pending.byte_len, pending.opcode, pending.imm,
                     pending.flags, qp->qpn);
    }
}

// A UD SEND (SPEC.md §11.1): one datagram to the QP the WQE names, behind a GRH. Whatever
// becomes of it, the sender completes SUCCESS: a datagram nobody takes is dropped. On an
// Ethernet device an address handle names its destination by GID (§18).
ExecResult Engine::Thread::sendDatagram(Qp *qp, const softnda_wqe &h, const Segment *local, uint32_t nlocal,
                                        uint64_t total) {
    qp->sq_psn = (qp->sq_psn + 1) & kPsnMask;
    const auto dest_qpn = static_cast<uint32_t>(h.remote_addr & 0xffffff);
    auto qkey = static_cast<uint32_t>(h.remote_addr >> 32);
    if ((qkey & SOFTNDA_QKEY_PRIVILEGED) != 0) {
        qkey = qp->attrs.qkey;  // "send my own Q_Key"
    }
    const auto dlid = static_cast<uint16_t>(h.rkey);
    if (dev_->netdev && (h.rkey & SOFTNDA_UD_GRH) != 0) {
        return roceDatagram(qp, h, local, nlocal, total, qkey, dest_qpn);
    }
    Datagram d{nullptr,
               local,
               nlocal,
               total,
               qkey,
               qp->qpn,
               portLid(*dev_, qp->attrs.port),
               h.opcode == SOFTNDA_OP_SEND_WITH_IMM,
               (h.flags & SOFTNDA_WQE_SOLICITED) != 0,
               h.imm_data};
    uint8_t grh[SOFTNDA_GRH_SIZE];
    d.grh = grh;
    if (isMulticastLid(dlid)) {
        // Every member of the MLID's groups gets its copy (SPEC.md §11.3), the sender too when
        // it joined; only the multicast QPN reaches a group.
        auto group =
            dest_qpn == kMcastQpn ? dev_->mcast.find(mcastKey(false, ibv_gid{}, dlid)) : dev_->mcast.end();
        if (group != dev_->mcast.end()) {
            for (Qp *member : group->second) {
                fillGrh(grh, *dev_, qp->attrs.port, groupGid(*member, dlid), static_cast<uint32_t>(total));
                deliverDatagram(d, member);
            }
        }
        return ExecResult{};
    }
    const uint8_t dport = portOfLid(*dev_, dlid);
    auto it = dport != 0 ? dev_->qps.find(dest_qpn) : dev_->qps.end();
    if (it != dev_->qps.end() && it->second->attrs.port == dport) {
        fillGrh(grh, *dev_, qp->attrs.port, portGid(*dev_, dport), static_cast<uint32_t>(total));
        deliverDatagram(d, it->second);
    }
    return ExecResult{};
}

// One datagram into peer, when it is a UD QP that can take it (its Q_Key, its state, a receive);
// otherwise it is dropped, and the sender never knows.
void Engine::Thread::deliverDatagram(const Datagram &d, Qp *peer) {
    if (peer->init.qp_type != IBV_QPT_UD || peer->attrs.qkey != d.qkey) {
        return;
    }
    std::lock_guard<std::mutex> lk(peer->rq_lock);
    int ps = peer->state.load(std::memory_order_acquire);
    RecvCopy r;
    const Responder rp = responderOf(peer);
    if ((ps != IBV_QPS_RTR && ps != IBV_QPS_RTS && ps != IBV_QPS_SQD) || !takeRecv(rp, &r)) {
        return;
    }
    Segment src[kEngineMaxSge + 1];  // the GRH, then the payload
    src[0] = Segment{const_cast<uint8_t *>(d.grh), SOFTNDA_GRH_SIZE};
    std::copy(d.payload, d.payload + d.nseg, src + 1);
    Segment dst[kEngineMaxSge];
    if (deliverInto(rp, r, src, d.nseg + 1, d.len + SOFTNDA_GRH_SIZE, d.src_qp, dst) != IBV_WC_SUCCESS) {
        return;  // the receive completed in error; the sender knows nothing of it
    }
    uint8_t flags = SOFTNDA_CQE_GRH | d.roce_l3;
    if (d.imm) {
        flags |= SOFTNDA_CQE_WITH_IMM;
    }
    if (d.solicited) {
        flags |= SOFTNDA_CQE_SOLICITED;
    }
    completeRecv(rp, r, IBV_WC_SUCCESS, static_cast<uint32_t>(d.len) + SOFTNDA_GRH_SIZE, IBV_WC_RECV,
                 d.imm_data, flags, d.src_qp, d.slid);
}

// A UC WQE (SPEC.md §11.2): delivered when the connected peer can take it, else dropped; no
// acknowledgement, so the sender completes SUCCESS either way and nothing waits.
ExecResult Engine::Thread::sendUnconnected(Qp *qp, const WqeCopy &w, const Segment *local, uint32_t nlocal,
                                           uint64_t total) {
    const softnda_wqe &h = w.hdr;
    if (qp->wire) {
        return wireUnconnected(qp, total);
    }
    Qp *peer = peerOf(qp);
    auto drop = [qp] {
        qp->sq_psn = (qp->sq_psn + 1) & kPsnMask;
        return ExecResult{};
    };
    if (peer == nullptr || peer->init.qp_type != IBV_QPT_UC) {
        return drop();
    }
    std::lock_guard<std::mutex> lk(peer->rq_lock);
    int ps = peer->state.load(std::memory_order_acquire);
    if ((ps != IBV_QPS_RTR && ps != IBV_QPS_RTS && ps != IBV_QPS_SQD) || peer->attrs.dest_qpn != qp->qpn) {
        return drop();
    }
    PendingRecv pending;
    const Responder rp = responderOf(peer);
    if (usesRkey(h.opcode)) {
        uint8_t status = IBV_WC_SUCCESS;
        uint8_t *remote = checkRkey(dev_, rp, h, total, &status);
        if (remote == nullptr ||
            writeDataIn(rp, h, remote, local, nlocal, total, &pending).outcome != Outcome::Done) {
            return drop();
        }
    } else {
        if (!takeRecv(rp, &pending.r)) {
            return drop();
        }
        Segment dst[kEngineMaxSge];
        if (deliverInto(rp, pending.r, local, nlocal, total, qp->qpn, dst) != IBV_WC_SUCCESS) {
            return drop();  // the receive completed in error at the responder
        }
        pending.set = true;
        pending.byte_len = static_cast<uint32_t>(total);
        pending.opcode = IBV_WC_RECV;
        pending.imm = h.imm_data;
        pending.flags =
            static_cast<uint8_t>((h.opcode == SOFTNDA_OP_SEND_WITH_IMM ? SOFTNDA_CQE_WITH_IMM : 0) |
                                 ((h.flags & SOFTNDA_WQE_SOLICITED) ? SOFTNDA_CQE_SOLICITED : 0));
    }
    peer->rq_psn = qp->sq_psn;  // a UC responder resynchronises on each new message
    commit(qp, rp, pending);
    return ExecResult{};
}

namespace {

// The WQE at the head of qp's SQ (at its CI).
softnda_wqe headWqe(const Qp &qp) {
    softnda_wqe h;
    std::memcpy(&h, qp.sq.buf + static_cast<size_t>(qp.sq.ci_local & (qp.sq.cnt - 1)) * qp.sq.stride,
                sizeof(h));
    return h;
}

}  // namespace

// After an import (SPEC.md §10): the old process died inside the head WQE (recover_head: its
// execution word is one ahead of CI) or between a WQE's CI and its PSN store (recover_psn). The
// responder's PSN tells which: one ahead of ours means the WQE took effect there. Then the head
// WQE is retired without running again (a signalled one gets its success CQE), or our PSN, whose
// store was lost, is taken from the peer.
void Engine::Thread::settle(Qp *qp, uint32_t pi) {
    bool head = qp->recover_head;
    qp->recover_head = false;
    qp->recover_psn = false;
    if (head && qp->sq.ci_local != pi && windowWqeApplied(dev_, qp, headWqe(*qp))) {
        retireHead(qp);  // a bind or invalidation its window's record shows done (SPEC.md §16)
        return;
    }
    if (qp->reliableOnWire()) {
        // The peer is on another host: the head WQE goes again with the PSNs it had, and the
        // responder's PSN check answers a repeat without executing it twice (SPEC.md §18).
        return;
    }
    if (qp->init.qp_type == IBV_QPT_UD || qp->wire) {
        // No responder to ask: a datagram, or a UC message to another host, is delivered at most
        // once (SPEC.md §11.1, §18).
        if (head && qp->sq.ci_local != pi) {
            qp->sq_psn = (qp->sq_psn + 1) & kPsnMask;
            retireHead(qp);
        }
        return;
    }
    Qp *peer = peerOf(qp);
    if (peer == nullptr) {
        return;
    }
    uint32_t r;
    {
        std::lock_guard<std::mutex> lk(peer->rq_lock);
        if (peer->attrs.dest_qpn != qp->qpn) {
            return;
        }
        r = peer->rq_psn;
    }
    if (r != ((qp->sq_psn + 1) & kPsnMask)) {
        return;  // it did not: the head WQE runs (again) as usual
    }
    qp->sq_psn = r;
    if (!head || qp->sq.ci_local == pi) {
        __atomic_store_n(qp->recWord(kSqPsnWord), qp->sq_psn, __ATOMIC_RELEASE);
        return;
    }
    retireHead(qp);
}

// The head WQE took effect before the process that ran it died: it completes without running
// again (CI, PSN, and its success CQE when it was signalled).
void Engine::Thread::retireHead(Qp *qp) {
    Ring &sq = qp->sq;
    const softnda_wqe h = headWqe(*qp);
    uint32_t byte_len = 0;
    if (isAtomic(h.opcode)) {
        byte_len = 8;
    } else if (h.opcode == SOFTNDA_OP_RDMA_READ) {
        const auto *sges = reinterpret_cast<const softnda_sge *>(
            sq.buf + static_cast<size_t>(sq.ci_local & (sq.cnt - 1)) * sq.stride + qp->wqe_data);
        uint32_t n = std::min<uint32_t>(h.num_sge, sendSgeCap(sq.stride, qp->wqe_data));
        for (uint32_t i = 0; i < n; ++i) {
            softnda_sge s;
            std::memcpy(&s, &sges[i], sizeof(s));
            byte_len += s.length;
        }
    }
    sq.ci_local++;
    bump(ctr_.wqes);
    __atomic_store_n(sq.ci, sq.ci_local, __ATOMIC_RELEASE);
    __atomic_store_n(qp->recWord(kSqPsnWord), qp->sq_psn, __ATOMIC_RELEASE);
    if ((h.flags & SOFTNDA_WQE_SIGNALED) || qp->init.sq_sig_all) {
        softnda_cqe c{};
        c.wr_id = h.wr_id;
        c.byte_len = byte_len;
        c.qp_num = qp->qpn;
        c.opcode = softnda_send_wc_opcode(h.opcode);
        c.status = IBV_WC_SUCCESS;
        writeCqe(qp->scq, ctr_, c);
    }
}

// The responder half of one WQE (rdma_rxe's rxe_resp.c): the rkey of a WRITE, READ or atomic
// checked, then the operation. peer->rq_lock is held.
ExecResult Engine::Thread::respond(Qp *qp, const Responder &peer, const WqeCopy &w, const Segment *local,
                                   uint32_t nlocal, uint64_t total, PendingRecv *pending) {
    const softnda_wqe &h = w.hdr;
    if (!usesRkey(h.opcode)) {
        return sendDataIn(qp, peer, h, local, nlocal, total, pending);
    }
    uint8_t status = IBV_WC_SUCCESS;
    uint8_t *remote = checkRkey(dev_, peer, h, total, &status);
    if (remote == nullptr) {
        return responderError(peer.qp, status);
    }
    switch (h.opcode) {
        case SOFTNDA_OP_RDMA_WRITE:
        case SOFTNDA_OP_RDMA_WRITE_WITH_IMM:
            return writeDataIn(peer, h, remote, local, nlocal, total, pending);
        case SOFTNDA_OP_RDMA_READ:
            return readReply(remote, local, nlocal, total);
        default:
            return atomicReply(h, remote, local, nlocal);
    }
}

// A request the responder refuses: the requester's completion status, and a responder that
// detected a remote access, invalid request or operation error moves to ERR (SPEC.md §6.2).
ExecResult Engine::Thread::responderError(Qp *peer, uint8_t status) {
    if (status == IBV_WC_REM_ACCESS_ERR || status == IBV_WC_REM_INV_REQ_ERR || status == IBV_WC_REM_OP_ERR) {
        setQpError(dev_, peer);
    }
    return ExecResult{status, 0, Outcome::Done};
}

ExecResult Engine::Thread::writeDataIn(const Responder &peer, const softnda_wqe &h, uint8_t *remote,
                                       const Segment *local, uint32_t nlocal, uint64_t total,
                                       PendingRecv *pending) {
    const bool with_imm = h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
    // taken in place: no copy on the fast path
    if (with_imm && !takeRecv(peer, &pending->r)) {
        return ExecResult{IBV_WC_SUCCESS, 0, Outcome::RnrWait};
    }
    gatherFrom(local, nlocal, remote);
    bump(ctr_.bytes, total);
    if (with_imm) {
        holdRecvCompletion(h, total, pending);
    }
    return ExecResult{};
}

ExecResult Engine::Thread::readReply(const uint8_t *remote, const Segment *local, uint32_t nlocal,
                                     uint64_t total) {
    scatterTo(local, nlocal, remote);
    bump(ctr_.bytes, total);
    return ExecResult{IBV_WC_SUCCESS, static_cast<uint32_t>(total), Outcome::Done};
}

// The atomic on the responder's 8 bytes, its original value into the requester's buffer.
ExecResult Engine::Thread::atomicReply(const softnda_wqe &h, uint8_t *remote, const Segment *local,
                                       uint32_t nlocal) {
    auto *word = reinterpret_cast<uint64_t *>(remote);
    uint64_t old;
    if (h.opcode == SOFTNDA_OP_ATOMIC_CMP_AND_SWP) {
        old = h.compare_add;
        __atomic_compare_exchange_n(word, &old, h.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    } else {
        old = __atomic_fetch_add(word, h.compare_add, __ATOMIC_SEQ_CST);
    }
    scatterTo(local, nlocal, reinterpret_cast<const uint8_t *>(&old));
    bump(ctr_.bytes, 8);
    return ExecResult{IBV_WC_SUCCESS, 8, Outcome::Done};
}

// A SEND into the next receive of the peer's RQ or SRQ. A receive that cannot take the message
// completes in error, and so does the request.
ExecResult Engine::Thread::sendDataIn(Qp *qp, const Responder &peer, const softnda_wqe &h,
                                      const Segment *local, uint32_t nlocal, uint64_t total,
                                      PendingRecv *pending) {
    RecvCopy &r = pending->r;
    const bool send_inv = h.opcode == SOFTNDA_OP_SEND_WITH_INV;
    // An rkey the responder may not invalidate is an invalid request, refused before a receive
    // is taken (SPEC.md §16).
    if (send_inv && !invalidateRemote(dev_, peer.qp, h.imm_data, false)) {
        return responderError(peer.qp, IBV_WC_REM_INV_REQ_ERR);
    }
    if (!takeRecv(peer, &r)) {
        return ExecResult{IBV_WC_SUCCESS, 0, Outcome::RnrWait};
    }
    Segment dst[kEngineMaxSge];
    switch (deliverInto(peer, r, local, nlocal, total, qp->qpn, dst)) {
        case IBV_WC_SUCCESS:
            break;
        case IBV_WC_LOC_LEN_ERR:
            return responderError(peer.qp, IBV_WC_REM_INV_REQ_ERR);
        default:
            return responderError(peer.qp, IBV_WC_REM_OP_ERR);
    }
    if (send_inv) {
        // The window checked above, now invalid: the receive reports its rkey (imm_data).
        (void)invalidateRemote(dev_, peer.qp, h.imm_data, true);
    }
    holdRecvCompletion(h, total, pending);
    return ExecResult{};
}

// A message's bytes into a receive the responder took (peer->rq_lock held). A receive that
// cannot take it completes in error (the returned status), which moves the responder to ERR.
uint8_t Engine::Thread::deliverInto(const Responder &peer, const RecvCopy &r, const Segment *src,
                                    uint32_t nsrc, uint64_t total, uint32_t src_qpn, Segment *dst) {
    if (uint8_t status = recvTarget(peer, r, total, dst); status != IBV_WC_SUCCESS) {
        completeRecv(peer, r, status, 0, IBV_WC_RECV, 0, 0, src_qpn);
        return status;
    }
    scatterList(src, nsrc, dst);
    bump(ctr_.bytes, total);
    return IBV_WC_SUCCESS;
}

// The buffers of a receive the responder took, checked for a message of total bytes:
// IBV_WC_SUCCESS with dst set, or the status the receive completes with.
uint8_t Engine::Thread::recvTarget(const Responder &peer, const RecvCopy &r, uint64_t total, Segment *dst) {
    uint32_t recv_cap = peer.srq != nullptr ? peer.srq->max_sge : peer.qp->rq_max_sge;
    if (r.num_sge > recv_cap) {
        return IBV_WC_LOC_QP_OP_ERR;
    }
    if (!checkLocal(peer.pd, r.sge, r.num_sge, true, dst)) {
        return IBV_WC_LOC_PROT_ERR;
    }
    uint64_t room = 0;
    for (uint32_t i = 0; i < r.num_sge; ++i) {
        room += dst[i].len;
    }
    return total > room ? IBV_WC_LOC_LEN_ERR : IBV_WC_SUCCESS;
}

// A same-host SEND, WRITE or READ longer than kChunkBytes, one chunk a call (peer->rq_lock held).
// Every chunk checks again what the message touches (the requester's SGEs in execute, the rkey,
// the receive's buffers), since the gate was given up since the last one: a region deregistered
// meanwhile fails the message as it would on a NIC. Partial until the last chunk, which
// completes as respond would.
ExecResult Engine::Thread::respondInChunks(Qp *qp, const Responder &peer, const softnda_wqe &h,
                                           const Segment *local, uint32_t nlocal, uint64_t total,
                                           PendingRecv *pending) {
    ChunkedMessage &c = qp->chunked;
    if (c.active && (c.index != qp->sq.ci_local || c.opcode != h.opcode || c.total != total ||
                     c.peer != peer.qp || c.srq != peer.srq)) {
        // The WQE was rewritten under the message, or the responder is another QP now (whose lock
        // is the one held: the old responder's receive is completed only if it is this one).
        endChunkedHere(qp, peer);
        return ExecResult{IBV_WC_LOC_QP_OP_ERR, 0, Outcome::Done};
    }
    if (!c.active) {
        if (ExecResult started = startChunked(qp, peer, h, total); !c.active) {
            return started;  // refused, or no receive yet (RNR)
        }
    }
    const uint64_t n = std::min(kChunkBytes, total - c.done);
    uint8_t status = IBV_WC_SUCCESS;
    if (usesRkey(h.opcode)) {
        uint8_t *remote = checkRkey(dev_, peer, h, total, &status);
        if (remote == nullptr) {
            endChunkedHere(qp, peer);
            return responderError(peer.qp, status);
        }
        copyAt(local, nlocal, c.done, remote + c.done, n, h.opcode == SOFTNDA_OP_RDMA_READ);
    } else {
        Segment dst[kEngineMaxSge];
        if (status = recvTarget(peer, c.recv, total, dst); status != IBV_WC_SUCCESS) {
            endChunkedHere(qp, peer);
            return responderError(peer.qp, IBV_WC_REM_OP_ERR);
        }
        scatterRange(local, nlocal, dst, c.recv.num_sge, c.done, n);
    }
    c.done += n;
    bump(ctr_.bytes, n);
    if (c.done < total) {
        return ExecResult{IBV_WC_SUCCESS, 0, Outcome::Partial};
    }
    c.active = false;
    if (h.opcode == SOFTNDA_OP_RDMA_READ) {
        return ExecResult{IBV_WC_SUCCESS, static_cast<uint32_t>(total), Outcome::Done};
    }
    if (c.has_recv) {
        if (h.opcode == SOFTNDA_OP_SEND_WITH_INV) {
            (void)invalidateRemote(dev_, peer.qp, h.imm_data, true);
        }
        pending->r = c.recv;
        holdRecvCompletion(h, total, pending);
    }
    return ExecResult{};
}

// The first chunk's checks, and the receive a SEND or a WRITE with immediate fills, as respond
// makes them. Sets qp->chunked active, or answers what respond would have.
ExecResult Engine::Thread::startChunked(Qp *qp, const Responder &peer, const softnda_wqe &h, uint64_t total) {
    ChunkedMessage &c = qp->chunked;
    const bool send = !usesRkey(h.opcode);
    if (!send) {
        uint8_t status = IBV_WC_SUCCESS;
        if (checkRkey(dev_, peer, h, total, &status) == nullptr) {
            return responderError(peer.qp, status);
        }
    }
    if (h.opcode == SOFTNDA_OP_SEND_WITH_INV && !invalidateRemote(dev_, peer.qp, h.imm_data, false)) {
        return responderError(peer.qp, IBV_WC_REM_INV_REQ_ERR);
    }
    RecvCopy r{};
    const bool needs_recv = send || h.opcode == SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
    if (needs_recv && !takeRecv(peer, &r)) {
        return ExecResult{IBV_WC_SUCCESS, 0, Outcome::RnrWait};
    }
    if (send) {
        Segment dst[kEngineMaxSge];
        if (uint8_t status = recvTarget(peer, r, total, dst); status != IBV_WC_SUCCESS) {
            completeRecv(peer, r, status, 0, IBV_WC_RECV, 0, 0, qp->qpn);
            return responderError(peer.qp,
                                  status == IBV_WC_LOC_LEN_ERR ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_REM_OP_ERR);
        }
    }
    c = ChunkedMessage{true, qp->sq.ci_local, h.opcode, total, 0, peer.qp, peer.srq, needs_recv, r};
    return ExecResult{};
}

// Ends qp's message in progress short from inside execute, where peer's rq_lock is held: its
// receive completes with a flush error when peer is the responder it came from.
void Engine::Thread::endChunkedHere(Qp *qp, const Responder &peer) {
    ChunkedMessage &c = qp->chunked;
    const bool here = c.active && c.has_recv && c.peer == peer.qp && c.srq == peer.srq;
    c.active = false;
    if (here) {
        completeRecv(peer, c.recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, qp->qpn);
    }
}

// Ends qp's message in progress short: the receive it was filling, when its QP is still the one
// it came from, completes with a flush error (the responder then goes to ERR, as after any
// receive that failed). The responder's rq_lock must not be held: it is taken here.
void Engine::Thread::abandonChunked(Qp *qp) {
    ChunkedMessage &c = qp->chunked;
    if (!c.active) {
        return;
    }
    c.active = false;
    if (!c.has_recv) {
        return;
    }
    // Alive only while the device still knows them: a destroyed responder took its receive
    // with it. Found by pointer, never dereferenced before.
    bool peer_alive = false;
    for (const auto &[qpn, q] : dev_->qps) {
        peer_alive = peer_alive || q == c.peer;
    }
    if (!peer_alive) {
        return;
    }
    Responder rp = responderOf(c.peer);
    if (c.srq != nullptr && c.srq != rp.srq) {  // an XRC target's SRQ, found by number
        bool srq_alive = false;
        for (const auto &[srqn, s] : dev_->xrc_srqs) {
            srq_alive = srq_alive || s == c.srq;
        }
        if (!srq_alive) {
            return;
        }
        rp = Responder{c.peer, c.srq, c.srq->cq, c.srq->pd};
    }
    std::lock_guard<std::mutex> lk(c.peer->rq_lock);
    completeRecv(rp, c.recv, IBV_WC_WR_FLUSH_ERR, 0, IBV_WC_RECV, 0, 0, qp->qpn);
}

void readRecvSlot(const Ring &ring, uint32_t index, uint32_t cap, RecvCopy *out) {
    const uint8_t *slot = ring.buf + static_cast<size_t>(index & (ring.cnt - 1)) * ring.stride;
    std::memcpy(&out->wr_id, slot, 8);
    std::memcpy(&out->num_sge, slot + 8, 4);
    std::memcpy(out->sge, slot + SOFTNDA_RECV_HEADER_SIZE,
                std::min<uint32_t>({out->num_sge, cap, kEngineMaxSge}) * sizeof(softnda_sge));
}

bool Engine::Thread::takeRecv(const Responder &peer, RecvCopy *out, bool hold) {
    auto copy = [out](const Ring &ring, uint32_t cap) { readRecvSlot(ring, ring.ci_local, cap, out); };
    if (Srq *srq = peer.srq; srq != nullptr) {
        bool limit_reached = false;
        {
            std::lock_guard<SpinLock> lk(srq->lock);
            Ring &ring = srq->ring;
            uint32_t pi = __atomic_load_n(ring.pi, __ATOMIC_ACQUIRE);
            if (ring.ci_local == pi) {
                return false;
            }
            if (overflowed(nullptr, ring, pi)) {
                srq->held.clear();  // the queue is discarded, held receives with it
                srq->publishCi();
                return false;
            }
            copy(ring, srq->max_sge);
            out->index = ring.ci_local;
            ring.ci_local++;
            if (hold) {
                srq->held.push_back(out->index);
            }
            srq->publishCi();
            uint32_t limit = __atomic_load_n(srq->limit, __ATOMIC_ACQUIRE);
            if (limit != 0 && pi - ring.ci_local < limit) {
                __atomic_store_n(srq->limit, 0u, __ATOMIC_RELAXED);
                __atomic_fetch_add(srq->limit_events, 1u, __ATOMIC_RELEASE);
                bump(ctr_.srq_limit_events);
                limit_reached = true;
            }
        }
        if (limit_reached) {
            signalEventFd(srq->ctx->async_fd);  // SPEC.md §9, outside the SRQ's lock
        }
        return true;
    }
    Ring &ring = peer.qp->rq;
    uint32_t pi = __atomic_load_n(ring.pi, __ATOMIC_ACQUIRE);
    if (ring.ci_local == pi || overflowed(peer.qp, ring, pi)) {
        return false;
    }
    copy(ring, peer.qp->rq_max_sge);
    // CI in the record waits for the request's commit (execute) or its error completion
    // (completeRecv): SPEC.md §10. peer->rq_lock is held throughout.
    ring.ci_local++;
    return true;
}

void Engine::Thread::completeRecv(const Responder &rp, const RecvCopy &r, uint8_t status, uint32_t byte_len,
                                  uint8_t opcode, uint32_t imm, uint8_t flags, uint32_t src, uint16_t slid) {
    Qp *peer = rp.qp;
    softnda_cqe c{};
    c.owner = static_cast<uint32_t>(slid) << SOFTNDA_CQE_SLID_SHIFT;
    c.wr_id = r.wr_id;
    c.byte_len = byte_len;
    c.imm_data = imm;
    c.qp_num = peer->qpn;
    c.src_qp = src;
    c.opcode = opcode;
    c.status = status;
    c.flags = flags;
    if (rp.srq == nullptr) {
        __atomic_store_n(peer->rq.ci, peer->rq.ci_local, __ATOMIC_RELEASE);  // CI before the CQE (§4)
    }
    if (status != IBV_WC_SUCCESS) {
        bump(ctr_.errors);
        setQpError(dev_, peer);  // before the CQE, as in processSq
    }
    if (!writeCqe(rp.rcq, ctr_, c) && status == IBV_WC_SUCCESS) {
        setQpError(dev_, peer);
    }
}

}  // namespace softnda
