// A softnda device state built from fuzz records, shared by the engine and wire targets
// (softnda_engine.cpp, softnda_wire.cpp; docs/fuzzing.md). The records are the tenant's side of
// the device: objects made through the ops tables, then raw bytes written into queue memory and
// doorbells rung exactly as a tenant (or a hostile one) can, with nothing checked on the way.
//
// Records: `u8 op, u16 len (LE), bytes[len]`; a record's fields are read in order, and fields past
// its end read as zeros, so every byte string is an input. Each target maps ops to the World's
// handlers below and adds its own (a connection's peer, packets).
//
// Names: device-assigned numbers (MR keys, QPNs, XRC SRQ numbers) differ from run to run, so the
// key, QPN and SRQN fields of what is written are renamed: a small selector value names an object
// of this input (see Names), any other value is kept as a forged one, except that a forged value
// that happens to equal a real one is moved off it. Replays therefore behave the same in any
// process, and mutated inputs keep naming real objects.
//
// Queue memory comes from the heap through posix_memalign (not memfds), so AddressSanitizer sees
// an engine read or write past a ring or its doorbell record; MR buffers are exact heap blocks for
// the same reason. Doorbells are the memfd arena's mappings of softnda's register pages.
#pragma once

#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/unit/softnda/memfd_ops.h"

namespace ibvx::fuzz::softnda_world {

// ---- input -------------------------------------------------------------------------------

// Little-endian fields of one record; past its end every field reads 0.
class Fields {
  public:
    explicit Fields(std::span<const uint8_t> b) : b_(b) {}
    uint8_t u8() {
        const uint8_t v = off_ < b_.size() ? b_[off_] : 0;
        off_++;
        return v;
    }
    uint16_t u16() { return static_cast<uint16_t>(u8() | u8() << 8); }
    uint32_t u32() { return u16() | static_cast<uint32_t>(u16()) << 16; }
    uint64_t u64() { return u32() | static_cast<uint64_t>(u32()) << 32; }
    // The bytes after the fields read so far.
    std::span<const uint8_t> rest() const {
        return off_ < b_.size() ? b_.subspan(off_) : std::span<const uint8_t>();
    }

  private:
    std::span<const uint8_t> b_;
    size_t off_ = 0;
};

// Calls f(op, Fields) for each record, at most max_records of them.
template <typename F>
void forEachRecord(std::span<const uint8_t> in, size_t max_records, F &&f) {
    size_t at = 0;
    for (size_t n = 0; n < max_records && at < in.size(); ++n) {
        const uint8_t op = in[at];
        const size_t len = at + 2 < in.size() ? (in[at + 1] | in[at + 2] << 8) : 0;
        at = std::min(in.size(), at + 3);
        const size_t take = std::min(len, in.size() - at);
        Fields fields(in.subspan(at, take));
        f(op, fields);
        at += take;
    }
}

// ---- memory ------------------------------------------------------------------------------

// The queue-memory callbacks: heap blocks (64-byte aligned, as softnda asks), counted so each
// input can check it gave everything back; doorbells through the memfd arena.
class HeapQueueMemory {
  public:
    static ibv_extend_ops *ops() {
        static ibv_extend_ops o = {alloc,
                                   release,
                                   [](void *d, int v, size_t n) { std::memset(d, v, n); },
                                   copy,
                                   softnda_test::MemfdArena::dbMmap,
                                   softnda_test::MemfdArena::dbUnmap};
        return &o;
    }
    static size_t live() { return live_.load(); }

  private:
    static void *alloc(size_t size) {
        void *p = nullptr;
        if (posix_memalign(&p, 64, size == 0 ? 1 : size) != 0) {
            return nullptr;
        }
        live_++;
        return p;
    }
    static void release(void *p) {
        if (p != nullptr) {
            live_--;
            std::free(p);
        }
    }
    static int copy(void *dst, size_t dst_max, void *src, size_t n, uint32_t) {
        if (n > dst_max) {
            return -1;
        }
        std::memcpy(dst, src, n);
        return 0;
    }
    static inline std::atomic<size_t> live_{0};
};

// ---- queues as the tenant sees them ------------------------------------------------------

// A ring, its doorbell record and its register, written raw. pi is where the next entry goes;
// the record's PI changes only when the queue is rung, together with something the engine
// notices (a summary bit, or a register value it has not seen), so the engine always comes to
// look at what was published.
struct RawQueue {
    uint8_t *buf = nullptr;
    uint32_t cnt = 0, stride = 0;
    uint32_t *pi_rec = nullptr, *ci_rec = nullptr;
    softnda_doorbell db{};
    bool has_db = false;
    uint32_t pi = 0;                      // the harness's producer index (published or not)
    uint32_t published = 0;               // what the record's PI holds
    std::vector<uint32_t> reg_values{0};  // every value the register has held (0 when new)

    bool init(const queue_info &qi) {
        if (qi.qbuf.base == 0 || qi.qbuf.entry_cnt == 0 || qi.dbr_pi_va.iov_base == nullptr) {
            return false;
        }
        buf = reinterpret_cast<uint8_t *>(static_cast<uintptr_t>(qi.qbuf.base));
        cnt = qi.qbuf.entry_cnt;
        stride = qi.qbuf.entry_size;
        pi_rec = static_cast<uint32_t *>(qi.dbr_pi_va.iov_base);
        ci_rec = static_cast<uint32_t *>(qi.dbr_ci_va.iov_base);
        has_db = softnda_doorbell_init(&db, &qi.db_hw_va) == 0;
        pi = published = __atomic_load_n(pi_rec, __ATOMIC_ACQUIRE);
        return true;
    }
    uint8_t *slot(uint32_t i) const { return buf + static_cast<size_t>(i & (cnt - 1)) * stride; }
    uint32_t ci() const { return __atomic_load_n(ci_rec, __ATOMIC_ACQUIRE); }
    bool summaryPending() const { return has_db && __atomic_load_n(db.ring_summary, __ATOMIC_ACQUIRE) != 0; }

    // mode % 4: 0 the device-side helper's ring (register = PI, summary bit, wake); 1 the summary
    // bit alone; 2 a bare register store, no summary bit (the engine's sweep after a sleep finds
    // it); 3 any register value and the summary bit.
    void ring(uint8_t mode, uint32_t value) {
        __atomic_store_n(pi_rec, pi, __ATOMIC_RELEASE);
        published = pi;
        if (!has_db) {
            return;
        }
        switch (mode % 4) {
            case 0:
                softnda_doorbell_ring(&db, pi);
                reg_values.push_back(pi);
                break;
            case 1:
                markAndWake();
                break;
            case 2: {
                // Seen only if it differs from whatever the engine saw last: a value never held.
                while (std::find(reg_values.begin(), reg_values.end(), value) != reg_values.end()) {
                    value = value * 2654435761u + 1;
                }
                __atomic_store_n(db.reg, value, __ATOMIC_RELEASE);
                reg_values.push_back(value);
                break;
            }
            default:
                __atomic_store_n(db.reg, value, __ATOMIC_RELEASE);
                reg_values.push_back(value);
                markAndWake();
                break;
        }
    }

  private:
    void markAndWake() {
        __atomic_fetch_or(db.ring_summary, db.bit, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(db.engine_sleeping, __ATOMIC_SEQ_CST) != 0) {
            __atomic_fetch_add(db.wake_seq, 1, __ATOMIC_SEQ_CST);
            syscall(SYS_futex, db.wake_seq, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
        }
    }
};

// ---- names -------------------------------------------------------------------------------

// Selector values and what they name (Names::key, qpn, srqn).
inline constexpr uint32_t kMrSelFirst = 1, kMrSelLast = 16;     // MR keys
inline constexpr uint32_t kMwSelFirst = 17, kMwSelLast = 32;    // memory windows' rkeys
inline constexpr uint32_t kMwNextFirst = 33, kMwNextLast = 48;  // a window's next rkey (a bind's)
inline constexpr uint32_t kObjSelFirst = 1, kObjSelLast = 16;   // QPNs and XRC SRQ numbers
inline constexpr uint32_t kForgedFlip = 0x00800000;             // moves a forged value off a real one

inline uint32_t nextKey(uint32_t rkey) {
    return (rkey & ~0xffu) | ((rkey + 1) & 0xffu);
}

struct Names {
    std::vector<uint32_t> mr_keys, mw_keys, qpns, srqns;
    std::vector<uint32_t> reserved_qpns;  // a target's own QPs, never named by an input

    uint32_t key(uint32_t v) const {
        if (v >= kMrSelFirst && v <= kMrSelLast && !mr_keys.empty()) {
            return mr_keys[(v - kMrSelFirst) % mr_keys.size()];
        }
        if (v >= kMwSelFirst && v <= kMwSelLast && !mw_keys.empty()) {
            return mw_keys[(v - kMwSelFirst) % mw_keys.size()];
        }
        if (v >= kMwNextFirst && v <= kMwNextLast && !mw_keys.empty()) {
            return nextKey(mw_keys[(v - kMwNextFirst) % mw_keys.size()]);
        }
        return forged(v, mr_keys, mw_keys, 0xffffffffu);
    }
    uint32_t qpn(uint32_t v) const {
        v &= 0xffffff;
        if (v >= kObjSelFirst && v <= kObjSelLast && !qpns.empty()) {
            return qpns[(v - kObjSelFirst) % qpns.size()];
        }
        if (v == 0xffffff) {
            return v;  // the multicast QPN
        }
        return forged(v, qpns, reserved_qpns, 0xffffff);
    }
    uint32_t srqn(uint32_t v) const {
        v &= 0xffffff;
        if (v >= kObjSelFirst && v <= kObjSelLast && !srqns.empty()) {
            return srqns[(v - kObjSelFirst) % srqns.size()];
        }
        return forged(v, srqns, {}, 0xffffff);
    }

  private:
    static uint32_t forged(uint32_t v, const std::vector<uint32_t> &a, const std::vector<uint32_t> &b,
                           uint32_t mask) {
        auto real = [&](uint32_t x) {
            return std::find(a.begin(), a.end(), x) != a.end() || std::find(b.begin(), b.end(), x) != b.end();
        };
        for (uint32_t i = 0; i < 64 && real(v); ++i) {
            v = ((v ^ kForgedFlip) + i) & mask;
        }
        return v;
    }
};

inline uint32_t loadLe32(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}
inline void storeLe32(uint8_t *p, uint32_t v) {
    std::memcpy(p, &v, sizeof(v));
}

// ---- the world ---------------------------------------------------------------------------

// What an input's objects hang on: an open context of softnda0 and two PDs (an MR or QP of the
// second PD is one the first may not touch).
struct Env {
    ibv_context *ctx = nullptr;
    ibv_context_extend *ext = nullptr;
    ibv_pd *pd[2] = {nullptr, nullptr};
    int event_fd = -1;  // the context's async eventfd, also the engine barrier's
};

// Makes the files a context creates on first use (its doorbell BAR with its first queue, its
// window records with its first memory window), so that an input's fd count compares like with
// like from the first input on.
inline void warmUp(const Env &env) {
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = 2;
    a.ops = HeapQueueMemory::ops();
    ibv_cq_extend *cq = env.ext->ops->create_cq(env.ctx, &a);
    FUZZ_CHECK(cq != nullptr, "create_cq: %s", std::strerror(errno));
    ibv_mw *mw = softnda_vdev_ops.alloc_mw(env.pd[0], IBV_MW_TYPE_2);
    FUZZ_CHECK(mw != nullptr, "alloc_mw: %s", std::strerror(errno));
    FUZZ_CHECK(softnda_vdev_ops.dealloc_mw(mw) == 0, "dealloc_mw");
    FUZZ_CHECK(env.ext->ops->destroy_cq(cq) == 0, "destroy_cq");
}

// Access flags as records carry them (MRs and QPs): bits 0-5 LOCAL_WRITE, REMOTE_WRITE,
// REMOTE_READ, REMOTE_ATOMIC, MW_BIND, RELAXED_ORDERING, bit 6 one softnda does not know.
inline int accessOf(uint8_t bits) {
    static constexpr int kBits[] = {IBV_ACCESS_LOCAL_WRITE,
                                    IBV_ACCESS_REMOTE_WRITE,
                                    IBV_ACCESS_REMOTE_READ,
                                    IBV_ACCESS_REMOTE_ATOMIC,
                                    IBV_ACCESS_MW_BIND,
                                    IBV_ACCESS_RELAXED_ORDERING,
                                    1 << 29};
    int access = 0;
    for (size_t i = 0; i < std::size(kBits); ++i) {
        if (bits & (1u << i)) {
            access |= kBits[i];
        }
    }
    return access;
}

// How a QP is brought up (World::bringUp).
struct Conn {
    uint32_t dest_qpn = 0;
    uint32_t sq_psn = 0, rq_psn = 0;
    int access = 0;
    uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 1;
    uint8_t max_rd_atomic = 1, max_dest_rd_atomic = 1;
    ibv_mtu mtu = IBV_MTU_1024;
    uint32_t qkey = 0;
    ibv_qp_state target = IBV_QPS_RTS;
    ibv_ah_attr ah{};  // port 1 and, on a RoCE port, the GRH
};

// A CONNECT record's common part: `u8 qp, u32 dest, u8 state, u32 sq_psn, u32 rq_psn, u8 access,
// u8 timeout, u8 retry_cnt, u8 rnr_retry, u8 min_rnr_timer, u8 max_rd_atomic,
// u8 max_dest_rd_atomic, u8 mtu, u32 qkey` (a target's own fields may follow). state % 5: RTS, RTR,
// INIT, SQD, ERR. An RNR wait always ends (no rnr_retry 7, which retries for ever, and an RNR
// timer of 10-40 us, where 0 would be 655 ms); timeout and dest are the target's to interpret.
struct ConnectRecord {
    uint8_t qp = 0;
    uint32_t dest = 0;
    Conn conn;
};
inline ConnectRecord readConnect(Fields &f) {
    static constexpr ibv_qp_state kTargets[] = {IBV_QPS_RTS, IBV_QPS_RTR, IBV_QPS_INIT, IBV_QPS_SQD,
                                                IBV_QPS_ERR};
    ConnectRecord r;
    r.qp = f.u8();
    r.dest = f.u32();
    Conn &c = r.conn;
    c.target = kTargets[f.u8() % std::size(kTargets)];
    c.sq_psn = f.u32();
    c.rq_psn = f.u32();
    c.access = accessOf(f.u8());
    c.timeout = f.u8();
    c.retry_cnt = f.u8() % 8;
    c.rnr_retry = f.u8() % 7;
    c.min_rnr_timer = static_cast<uint8_t>(1 + f.u8() % 4);
    c.max_rd_atomic = f.u8();
    c.max_dest_rd_atomic = f.u8();
    c.mtu = static_cast<ibv_mtu>(1 + f.u8() % 5);
    c.qkey = f.u32();
    c.ah.port_num = 1;
    return r;
}

// Whether SOFTNDA_FUZZ_TRACE asks for what each input did (World::trace, traceCounters).
inline bool tracing() {
    static const bool on = std::getenv("SOFTNDA_FUZZ_TRACE") != nullptr;
    return on;
}

// Caps: objects per input. Sizes: every allocation an input can ask for stays small.
inline constexpr size_t kMaxMrs = 8, kMaxMws = 4, kMaxCqs = 4, kMaxSrqs = 3, kMaxQps = 8;
inline constexpr uint32_t kMaxMrBytes = 64 * 1024;
inline constexpr uint32_t kMaxDepth = 300;  // WRs of a queue and CQEs of a CQ, before rounding up

class World {
  public:
    struct Mr {
        ibv_mr *mr = nullptr;
        std::unique_ptr<uint8_t[]> buf;
    };
    struct Cq {
        ibv_cq_extend *ext = nullptr;
        softnda_cq cq{};
        RawQueue raw;  // its doorbell record: the arm word
    };
    struct Srq {
        ibv_srq_extend *ext = nullptr;
        RawQueue raw;
        uint32_t srqn = 0;
    };
    struct Qp {
        ibv_qp_extend *ext = nullptr;
        ibv_qp_type type = IBV_QPT_RC;
        RawQueue sq, rq;
        bool has_rq = false;
        uint32_t data = SOFTNDA_WQE_HEADER_SIZE;  // where a WQE's data segment starts
        bool up = false;                          // bringUp ran (from RESET)
    };

    explicit World(const Env &env) : env_(env) {}
    World(const World &) = delete;
    World &operator=(const World &) = delete;

    Names &names() { return names_; }
    std::vector<Qp> &qps() { return qps_; }
    std::vector<Mr> &mrs() { return mrs_; }
    std::vector<Cq> &cqs() { return cqs_; }

    // MR: u32 size, u8 access (accessOf), u8 flags (1: second PD, 2: iova = the buffer's
    // address), u64 iova. The buffer is the exact length (1 .. 64 KiB), filled with a pattern.
    void addMr(Fields &f) {
        const uint32_t size = 1 + f.u32() % kMaxMrBytes;
        const int access = accessOf(f.u8());
        const uint8_t flags = f.u8();
        uint64_t iova = f.u64();
        if (mrs_.size() >= kMaxMrs) {
            return;
        }
        Mr m;
        m.buf.reset(new uint8_t[size]);
        for (uint32_t i = 0; i < size; ++i) {
            m.buf[i] = static_cast<uint8_t>(i * 7 + 0x5a);
        }
        if (flags & 2) {
            iova = reinterpret_cast<uintptr_t>(m.buf.get());
        }
        m.mr = softnda_vdev_ops.reg_mr(env_.pd[flags & 1], m.buf.get(), size, iova, access);
        if (m.mr != nullptr) {
            names_.mr_keys.push_back(m.mr->lkey);
            mrs_.push_back(std::move(m));
        }
    }

    // MW: u8 type (odd: 2, even: 1), u8 pd.
    void addMw(Fields &f) {
        const ibv_mw_type type = (f.u8() & 1) ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1;
        const uint8_t pd = f.u8() & 1;
        if (mws_.size() >= kMaxMws) {
            return;
        }
        if (ibv_mw *mw = softnda_vdev_ops.alloc_mw(env_.pd[pd], type); mw != nullptr) {
            mws_.push_back(mw);
            names_.mw_keys.push_back(mw->rkey);
        }
    }

    // CQ: u16 cqe, u8 flags (1: 64-byte CQEs with timestamps, 2: an eventfd for its events).
    void addCq(Fields &f) {
        const uint32_t cqe = f.u16() % kMaxDepth;
        const uint8_t flags = f.u8();
        if (cqs_.size() >= kMaxCqs) {
            return;
        }
        ibv_cq_init_attr_extend a{};
        a.attr.cqe = cqe;
        a.attr.wc_flags = (flags & 1) ? IBV_WC_EX_WITH_COMPLETION_TIMESTAMP : 0;
        a.ops = HeapQueueMemory::ops();
        Cq c;
        c.ext = env_.ext->ops->create_cq(env_.ctx, &a);
        if (c.ext == nullptr) {
            return;
        }
        FUZZ_CHECK(softnda_cq_init(&c.cq, &c.ext->cq_info) == 0, "a CQ softnda made is not one by SPEC.md");
        c.raw.init(c.ext->cq_info);
        if (flags & 2) {
            (void)softnda_vdev_ops.set_cq_event_fd(c.ext->cq, env_.event_fd);
        }
        cqs_.push_back(std::move(c));
    }

    // SRQ: u16 max_wr, u8 max_sge, u8 flags (1: second PD, 2: an XRC SRQ of the input's domain),
    // u8 cq (an XRC SRQ's), u32 limit.
    void addSrq(Fields &f) {
        ibv_srq_init_attr_extend a{};
        a.attr.attr.max_wr = f.u16() % kMaxDepth;
        a.attr.attr.max_sge = f.u8() % 33;
        const uint8_t flags = f.u8();
        const uint8_t cq = f.u8();
        a.attr.attr.srq_limit = f.u32();
        a.pd = env_.pd[flags & 1];
        a.ops = HeapQueueMemory::ops();
        if (srqs_.size() >= kMaxSrqs) {
            return;
        }
        Srq s;
        if (flags & 2) {
            if (cqs_.empty() || xrcd() == nullptr) {
                return;
            }
            s.ext = softnda_vdev_ops.create_xrc_srq(env_.ctx, &a, xrcd_, cqs_[cq % cqs_.size()].ext->cq);
            if (s.ext != nullptr) {
                (void)softnda_vdev_ops.get_srq_num(s.ext->srq, &s.srqn);
                names_.srqns.push_back(s.srqn);
            }
        } else {
            s.ext = env_.ext->ops->create_srq(env_.ctx, &a);
        }
        if (s.ext != nullptr) {
            s.raw.init(s.ext->srq_info);
            srqs_.push_back(std::move(s));
        }
    }

    // QP: u8 type (% 5: RC, UC, UD, XRC initiator, XRC target), u8 send CQ, u8 recv CQ, u8 srq
    // (0: none, n: the (n-1)-th), u16 send_wr, u16 recv_wr, u8 send_sge, u8 recv_sge, u16 inline,
    // u8 flags (1: sq_sig_all, 2: second PD). Caps go a little past the device's limits, so
    // refusals are exercised too; the QP starts in RESET.
    void addQp(Fields &f) {
        static constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND,
                                                 IBV_QPT_XRC_RECV};
        const ibv_qp_type type = kTypes[f.u8() % std::size(kTypes)];
        const uint8_t scq = f.u8(), rcq = f.u8(), srq = f.u8();
        ibv_qp_init_attr_extend a{};
        a.attr.qp_type = type;
        a.attr.cap.max_send_wr = f.u16() % kMaxDepth;
        a.attr.cap.max_recv_wr = f.u16() % kMaxDepth;
        a.attr.cap.max_send_sge = f.u8() % 33;
        a.attr.cap.max_recv_sge = f.u8() % 33;
        a.attr.cap.max_inline_data = f.u16() % 600;
        const uint8_t flags = f.u8();
        a.attr.sq_sig_all = flags & 1;
        a.pd = env_.pd[(flags >> 1) & 1];
        a.ops = HeapQueueMemory::ops();
        if (qps_.size() >= kMaxQps) {
            return;
        }
        Qp q;
        q.type = type;
        if (type == IBV_QPT_XRC_RECV) {
            if (xrcd() == nullptr) {
                return;
            }
            q.ext = softnda_vdev_ops.create_xrc_tgt_qp(env_.ctx, &a, xrcd_);
        } else {
            if (cqs_.empty()) {
                return;
            }
            a.attr.send_cq = cqs_[scq % cqs_.size()].ext->cq;
            if (type != IBV_QPT_XRC_SEND) {
                a.attr.recv_cq = cqs_[rcq % cqs_.size()].ext->cq;
                if (srq != 0 && !srqs_.empty()) {
                    a.attr.srq = srqs_[(srq - 1) % srqs_.size()].ext->srq;
                }
            }
            q.ext = env_.ext->ops->create_qp(env_.ctx, &a);
        }
        if (q.ext == nullptr) {
            return;
        }
        q.sq.init(q.ext->sq_info);
        q.has_rq = q.rq.init(q.ext->rq_info);
        if (type == IBV_QPT_XRC_SEND) {
            q.data = SOFTNDA_WQE_HEADER_SIZE + SOFTNDA_XRC_SEG_SIZE;
        }
        names_.qpns.push_back(q.ext->qp->qp_num);
        qps_.push_back(std::move(q));
    }

    // The IB state steps RESET -> INIT -> RTR -> RTS (or SQD) with the attributes each transport
    // requires (SPEC.md §11, §14), stopping at c.target or at the first step refused; ERR from
    // wherever it got. Only from RESET: a QP brought up stays up until a reset.
    void bringUp(size_t index, const Conn &c) {
        Qp &q = qps_[index];
        if (q.up) {
            return;
        }
        q.up = true;
        ibv_qp *qp = q.ext->qp;
        const bool ud = q.type == IBV_QPT_UD;
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = static_cast<unsigned>(c.access);
        a.qkey = c.qkey;
        int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
        if (softnda_vdev_ops.modify_qp(qp, &a, mask) != 0 || c.target == IBV_QPS_INIT) {
            return finish(qp, c);
        }
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTR;
        mask = IBV_QP_STATE;
        if (!ud) {
            a.path_mtu = c.mtu;
            a.dest_qp_num = c.dest_qpn & 0xffffff;
            a.rq_psn = c.rq_psn;
            a.ah_attr = c.ah;
            a.max_dest_rd_atomic = c.max_dest_rd_atomic;
            a.min_rnr_timer = c.min_rnr_timer;
            mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if (q.type != IBV_QPT_UC) {
                mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
            }
        }
        if (softnda_vdev_ops.modify_qp(qp, &a, mask) != 0 || c.target == IBV_QPS_RTR) {
            return finish(qp, c);
        }
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTS;
        a.sq_psn = c.sq_psn;
        a.timeout = c.timeout;
        a.retry_cnt = c.retry_cnt;
        a.rnr_retry = c.rnr_retry;
        a.max_rd_atomic = c.max_rd_atomic;
        mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if (q.type == IBV_QPT_RC || q.type == IBV_QPT_XRC_SEND) {
            mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        } else if (q.type == IBV_QPT_XRC_RECV) {
            mask |= IBV_QP_TIMEOUT;
        }
        if (softnda_vdev_ops.modify_qp(qp, &a, mask) != 0) {
            return finish(qp, c);
        }
        finish(qp, c);
    }

    // WQE (`u8 qp, bytes`) / RECV (`u8 queue, bytes`, queue bit 7: an SRQ): the bytes go into the
    // slot at the queue's producer index (at most a slot's worth; the rest of the slot keeps what
    // it had), renamed, and the index moves on. Nothing is published until the queue is rung.
    void writeWqe(Fields &f) {
        const uint8_t sel = f.u8();
        if (qps_.empty()) {
            return;
        }
        Qp &q = qps_[sel % qps_.size()];
        if (q.sq.cnt == 0 || q.sq.stride <= SOFTNDA_WQE_HEADER_SIZE) {
            return;
        }
        uint8_t *slot = q.sq.slot(q.sq.pi);
        writeSlot(slot, q.sq.stride, f.rest());
        renameSendWqe(q, slot);
        q.sq.pi++;
    }
    void writeRecv(Fields &f) {
        RawQueue *rq = recvQueue(f.u8());
        if (rq == nullptr || rq->stride < SOFTNDA_RECV_HEADER_SIZE) {
            return;
        }
        uint8_t *slot = rq->slot(rq->pi);
        writeSlot(slot, rq->stride, f.rest());
        renameRecv(*rq, slot);
        rq->pi++;
    }

    // PI: `u8 queue, u32 delta`: the producer index jumps (past unwritten slots, or by more than
    // the ring: a doorbell overflow, SPEC.md §6.4). Queue selectors as anyQueue.
    void movePi(Fields &f) {
        RawQueue *q = anyQueue(f.u8());
        const uint32_t delta = f.u32();
        if (q != nullptr) {
            q->pi += delta;
        }
    }

    // RING: `u8 queue, u8 mode, u32 value`: publishes the producer index and rings (RawQueue::ring).
    void ring(Fields &f) {
        RawQueue *q = anyQueue(f.u8());
        const uint8_t mode = f.u8();
        const uint32_t value = f.u32();
        if (q != nullptr) {
            q->ring(mode, value);
        }
    }

    // FILL: `u8 queue, bytes`: the bytes repeated over the whole ring, as garbage a PI jump runs
    // into (each slot renamed as a written one is).
    void fill(Fields &f) {
        const uint8_t sel = f.u8();
        RawQueue *q = anyQueue(sel);
        std::span<const uint8_t> b = f.rest();
        if (q == nullptr || b.empty()) {
            return;
        }
        const size_t n = static_cast<size_t>(q->cnt) * q->stride;
        for (size_t i = 0; i < n; ++i) {
            q->buf[i] = b[i % b.size()];
        }
        for (uint32_t i = 0; i < q->cnt; ++i) {
            if ((sel & 0xc0) == 0) {
                renameSendWqe(qps_[(sel & 0x3f) % qps_.size()], q->slot(i));
            } else {
                renameRecv(*q, q->slot(i));
            }
        }
    }

    // ARM: `u8 target, u32 value`: bit 7 set, an SRQ's limit word (SPEC.md §5.3); else a CQ's arm
    // word (§9).
    void arm(Fields &f) {
        const uint8_t sel = f.u8();
        const uint32_t value = f.u32();
        if ((sel & 0x80) != 0 && !srqs_.empty()) {
            __atomic_store_n(srqs_[(sel & 0x3f) % srqs_.size()].raw.pi_rec + 1, value, __ATOMIC_RELEASE);
        } else if ((sel & 0x80) == 0 && !cqs_.empty()) {
            __atomic_store_n(cqs_[(sel & 0x3f) % cqs_.size()].raw.pi_rec + 2, value, __ATOMIC_RELEASE);
        }
    }

    // STATE: `u8 qp, u8 what` (% 4): ERR, SQD, back to RTS (from SQD), RESET (the QP can be
    // brought up again).
    void setState(Fields &f) {
        const uint8_t sel = f.u8();
        const uint8_t what = f.u8() % 4;
        if (qps_.empty()) {
            return;
        }
        Qp &q = qps_[sel % qps_.size()];
        static constexpr ibv_qp_state kTo[] = {IBV_QPS_ERR, IBV_QPS_SQD, IBV_QPS_RTS, IBV_QPS_RESET};
        ibv_qp_attr a{};
        a.qp_state = kTo[what];
        if (softnda_vdev_ops.modify_qp(q.ext->qp, &a, IBV_QP_STATE) == 0 && kTo[what] == IBV_QPS_RESET) {
            q.up = false;
        }
    }

    // POLL: `u8 cq, u8 n`: takes up to n CQEs (frees their slots for the engine).
    void poll(Fields &f) {
        const uint8_t sel = f.u8();
        const int n = f.u8();
        if (cqs_.empty()) {
            return;
        }
        softnda_cqe out[64];
        (void)softnda_cq_poll(&cqs_[sel % cqs_.size()].cq, out, std::min(n, 64));
    }

    // DESTROY: `u8 kind, u8 index`: kind % 4 a QP, SRQ, CQ or MR goes away now, while the engine
    // may be working on it (a tenant may do that); a refusal (EBUSY: still in use) keeps it.
    void destroyNow(Fields &f) {
        const uint8_t kind = f.u8() % 4;
        const uint8_t sel = f.u8();
        switch (kind) {
            case 0:
                if (!qps_.empty() && destroyQp(qps_[sel % qps_.size()]) == 0) {
                    qps_.erase(qps_.begin() + sel % qps_.size());
                }
                break;
            case 1:
                if (!srqs_.empty() && env_.ext->ops->destroy_srq(srqs_[sel % srqs_.size()].ext) == 0) {
                    srqs_.erase(srqs_.begin() + sel % srqs_.size());
                }
                break;
            case 2:
                if (!cqs_.empty() && env_.ext->ops->destroy_cq(cqs_[sel % cqs_.size()].ext) == 0) {
                    cqs_.erase(cqs_.begin() + sel % cqs_.size());
                }
                break;
            default:
                if (!mrs_.empty() && softnda_vdev_ops.dereg_mr(mrs_[sel % mrs_.size()].mr) == 0) {
                    mrs_.erase(mrs_.begin() + sel % mrs_.size());  // the buffer after the MR
                }
                break;
        }
        // Names stay: a destroyed object's number is a stale one now, which is worth sending.
    }

    // Whether each queue the engine must finish has finished: the SQ of every QP in RTS or ERR
    // empty (CI at the published PI; a QP waiting on RNR or its peer is not), and the RQ of every
    // QP in ERR flushed; and no ring notice pending. Then an engine pass that was running when
    // this looked has ended too (barrier()).
    bool queuesDone() {
        for (Qp &q : qps_) {
            ibv_qp_attr a{};
            ibv_qp_init_attr ia{};
            if (softnda_vdev_ops.query_qp(q.ext->qp, &a, IBV_QP_STATE, &ia) != 0) {
                return false;
            }
            if (a.qp_state == IBV_QPS_RTS || a.qp_state == IBV_QPS_ERR) {
                if (q.sq.cnt != 0 && q.sq.ci() != q.sq.published) {
                    return false;
                }
            }
            if (a.qp_state == IBV_QPS_ERR && q.has_rq && q.rq.ci() != q.rq.published) {
                return false;
            }
        }
        return !ringsPending();
    }
    bool ringsPending() const {
        for (const Qp &q : qps_) {
            if (q.sq.summaryPending() || (q.has_rq && q.rq.summaryPending())) {
                return true;
            }
        }
        for (const Srq &s : srqs_) {
            if (s.raw.summaryPending()) {
                return true;
            }
        }
        return false;
    }

    // Waits (at most `limit`) until the engine has nothing left of this input: queuesDone(), then
    // a barrier, then queuesDone() again. False when it never came.
    bool settle(std::chrono::milliseconds limit) {
        const auto deadline = std::chrono::steady_clock::now() + limit;
        for (unsigned spins = 0;; ++spins) {
            if (queuesDone()) {
                barrier();
                if (queuesDone()) {
                    return true;
                }
            }
            if (std::chrono::steady_clock::now() > deadline) {
                return false;
            }
            pause(spins);
        }
    }

    // Every engine pass that started before this call has ended: a control operation that takes
    // the device's gate exclusively (the async eventfd set again) waits for them.
    void barrier() {
        FUZZ_CHECK(softnda_vdev_ops.set_async_event_fd(env_.ctx, env_.event_fd) == 0, "barrier");
    }

    static void pause(unsigned spins) {
        if (spins < 16) {
            sched_yield();
        } else {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    // Prints the CQEs still in each CQ (taking them) and the QPs' states: what an input did, for
    // checking that a seed reaches the path it is meant for (SOFTNDA_FUZZ_TRACE=1).
    void trace() {
        for (size_t i = 0; i < cqs_.size(); ++i) {
            softnda_cqe c;
            while (softnda_cq_poll(&cqs_[i].cq, &c, 1) == 1) {
                std::fprintf(
                    stderr,
                    "  cq %zu: wr_id %llu status %u opcode %u byte_len %u qp %u src_qp %u flags %#x\n", i,
                    static_cast<unsigned long long>(c.wr_id), c.status, c.opcode, c.byte_len, c.qp_num,
                    c.src_qp, c.flags);
            }
        }
        for (const Qp &q : qps_) {
            ibv_qp_attr a{};
            ibv_qp_init_attr ia{};
            (void)softnda_vdev_ops.query_qp(q.ext->qp, &a, IBV_QP_STATE, &ia);
            std::fprintf(stderr, "  qp %u: type %d state %d sq %u/%u rq %u/%u\n", q.ext->qp->qp_num, q.type,
                         a.qp_state, q.sq.cnt ? q.sq.ci() : 0, q.sq.published, q.has_rq ? q.rq.ci() : 0,
                         q.rq.published);
        }
    }

    // Takes everything apart in dependency order; each destroy must succeed.
    void teardown() {
        for (ibv_mw *mw : mws_) {
            FUZZ_CHECK(softnda_vdev_ops.dealloc_mw(mw) == 0, "dealloc_mw");
        }
        mws_.clear();
        for (auto it = qps_.rbegin(); it != qps_.rend(); ++it) {
            const int rc = destroyQp(*it);
            FUZZ_CHECK(rc == 0, "destroy_qp: %d", rc);
        }
        qps_.clear();
        for (Srq &s : srqs_) {
            const int rc = env_.ext->ops->destroy_srq(s.ext);
            FUZZ_CHECK(rc == 0, "destroy_srq: %d", rc);
        }
        srqs_.clear();
        for (Cq &c : cqs_) {
            const int rc = env_.ext->ops->destroy_cq(c.ext);
            FUZZ_CHECK(rc == 0, "destroy_cq: %d", rc);
        }
        cqs_.clear();
        for (Mr &m : mrs_) {
            const int rc = softnda_vdev_ops.dereg_mr(m.mr);
            FUZZ_CHECK(rc == 0, "dereg_mr: %d", rc);
        }
        mrs_.clear();
        if (xrcd_ != nullptr) {
            FUZZ_CHECK(softnda_vdev_ops.close_xrcd(xrcd_) == 0, "close_xrcd");
            xrcd_ = nullptr;
        }
    }

  private:
    ibv_xrcd *xrcd() {
        if (xrcd_ == nullptr) {
            xrcd_ = softnda_vdev_ops.open_xrcd(env_.ctx);
        }
        return xrcd_;
    }

    void finish(ibv_qp *qp, const Conn &c) {
        if (c.target == IBV_QPS_SQD || c.target == IBV_QPS_ERR) {
            ibv_qp_attr a{};
            a.qp_state = c.target;
            (void)softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE);
        }
    }

    int destroyQp(Qp &q) { return env_.ext->ops->destroy_qp(q.ext); }

    static void writeSlot(uint8_t *slot, uint32_t stride, std::span<const uint8_t> b) {
        if (!b.empty()) {  // an empty span's data() may be null, which memcpy must not get
            std::memcpy(slot, b.data(), std::min<size_t>(b.size(), stride));
        }
    }

    // A send WQE's names (SPEC.md §2.1): its rkey (a UD WQE's is the destination LID, and its
    // remote_addr names the destination QP instead), a SEND_WITH_INV's rkey in imm_data, a
    // BIND_MW's window and MR keys in swap, an XRC initiator's SRQ number, and the SGE lkeys
    // (not inline bytes).
    void renameSendWqe(const Qp &q, uint8_t *slot) const {
        const uint8_t opcode = slot[0];
        const uint8_t flags = slot[1];
        if (q.type == IBV_QPT_UD) {
            const uint32_t lo = loadLe32(slot + 16);
            storeLe32(slot + 16, (lo & 0xff000000u) | names_.qpn(lo));
        } else {
            storeLe32(slot + 24, names_.key(loadLe32(slot + 24)));
        }
        if (opcode == SOFTNDA_OP_SEND_WITH_INV) {
            storeLe32(slot + 4, names_.key(loadLe32(slot + 4)));
        }
        if (opcode == SOFTNDA_OP_BIND_MW) {
            storeLe32(slot + 40, names_.key(loadLe32(slot + 40)));
            storeLe32(slot + 44, names_.key(loadLe32(slot + 44)));
        }
        if (q.type == IBV_QPT_XRC_SEND) {
            const uint32_t w = loadLe32(slot + SOFTNDA_WQE_HEADER_SIZE);
            storeLe32(slot + SOFTNDA_WQE_HEADER_SIZE, (w & 0xff000000u) | names_.srqn(w));
        }
        if ((flags & SOFTNDA_WQE_INLINE) == 0) {
            for (uint32_t off = q.data + 12; off + 4 <= q.sq.stride; off += SOFTNDA_SGE_SIZE) {
                storeLe32(slot + off, names_.key(loadLe32(slot + off)));
            }
        }
    }

    // A receive entry's names: its SGE lkeys (SPEC.md §2.2).
    void renameRecv(const RawQueue &rq, uint8_t *slot) const {
        for (uint32_t off = SOFTNDA_RECV_HEADER_SIZE + 12; off + 4 <= rq.stride; off += SOFTNDA_SGE_SIZE) {
            storeLe32(slot + off, names_.key(loadLe32(slot + off)));
        }
    }

    // Queue selectors: bit 7 an SRQ, else bit 6 a QP's RQ, else a QP's SQ; the low six bits pick
    // one (modulo how many there are).
    RawQueue *anyQueue(uint8_t sel) {
        if ((sel & 0xc0) == 0) {
            if (qps_.empty()) {
                return nullptr;
            }
            RawQueue &sq = qps_[(sel & 0x3f) % qps_.size()].sq;
            return sq.cnt != 0 ? &sq : nullptr;
        }
        return recvQueue(sel);
    }
    RawQueue *recvQueue(uint8_t sel) {
        if ((sel & 0x80) != 0) {
            return srqs_.empty() ? nullptr : &srqs_[(sel & 0x3f) % srqs_.size()].raw;
        }
        if (qps_.empty()) {
            return nullptr;
        }
        Qp &q = qps_[(sel & 0x3f) % qps_.size()];
        return q.has_rq ? &q.rq : nullptr;
    }

    Env env_;
    Names names_;
    std::vector<Mr> mrs_;
    std::vector<ibv_mw *> mws_;
    std::vector<Cq> cqs_;
    std::vector<Srq> srqs_;
    std::vector<Qp> qps_;
    ibv_xrcd *xrcd_ = nullptr;
};

// The engine's counters of softnda0.
inline softnda_counters deviceCounters() {
    softnda_counters c{};
    FUZZ_CHECK(softnda_query_counters("softnda0", &c) == 0, "softnda_query_counters");
    return c;
}

// What the device counted since `before`, for SOFTNDA_FUZZ_TRACE.
inline void traceCounters(const softnda_counters &before) {
    const softnda_counters now = deviceCounters();
    std::fprintf(
        stderr,
        "  counted: wqes %llu bytes %llu cqes %llu errors %llu flushed %llu rnr_naks %llu cq_overflows %llu "
        "wire tx %llu rx %llu retransmits %llu seq_naks %llu bad_icrc %llu malformed %llu\n",
        static_cast<unsigned long long>(now.wqes_executed - before.wqes_executed),
        static_cast<unsigned long long>(now.bytes - before.bytes),
        static_cast<unsigned long long>(now.cqes - before.cqes),
        static_cast<unsigned long long>(now.errors - before.errors),
        static_cast<unsigned long long>(now.flushed - before.flushed),
        static_cast<unsigned long long>(now.rnr_naks - before.rnr_naks),
        static_cast<unsigned long long>(now.cq_overflows - before.cq_overflows),
        static_cast<unsigned long long>(now.wire_tx_packets - before.wire_tx_packets),
        static_cast<unsigned long long>(now.wire_rx_packets - before.wire_rx_packets),
        static_cast<unsigned long long>(now.wire_retransmits - before.wire_retransmits),
        static_cast<unsigned long long>(now.wire_seq_naks - before.wire_seq_naks),
        static_cast<unsigned long long>(now.wire_bad_icrc - before.wire_bad_icrc),
        static_cast<unsigned long long>(now.wire_malformed - before.wire_malformed));
}

}  // namespace ibvx::fuzz::softnda_world
