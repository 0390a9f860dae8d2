// softnda internals: the objects of the emulated NIC and who may touch what.
//
// Locking (outermost first):
//   Registry::mu     configuration, the device list, open-context count.
//   Device::ctl      serialises control operations on one device (create/destroy/modify/reg).
//                    Held while calling the caller's ibv_extend_ops (alloc, db_mmap, ...), so
//                    those callbacks may call export_mmio / softnda_ub_resolve, which only take
//                    leaf locks (Device::pages_mu, mmioMutex()).
//   Device::gate     engine passes hold it shared; a control operation takes it exclusive only
//                    for the short moment it publishes or unpublishes an object the engine can
//                    reach (tables, doorbell slot owners, QP attributes). So everything the
//                    engine reads without a lock is stable during a pass.
//   Qp::rq_lock      the responder side of a QP: its RQ consumption, rq_psn, RQ flush.
//   Srq::lock, Cq::lock  consumption of an SRQ / production of CQEs (several engine threads).
// Event fds (Cq::event_fd, Context::async_fd; SPEC.md §9) change only with the gate held
// exclusively and are written to only by engine passes (gate shared), so the engine never writes
// to an fd that was closed or reused: the old one is closed after the gate is released.
// QP state is an atomic: the engine moves a QP to ERR from any thread; only the thread that owns
// the QP's SQ doorbell page executes or flushes its SQ (page p belongs to thread p mod n).
#pragma once

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/c_abi.h"
#include "common/cpu.h"
#include "common/unique_fd.h"
#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"
#include "providers/softnda/src/engine_limits.h"
#include "providers/softnda/src/wire.h"

namespace softnda {

struct Config {
    uint32_t devices = 1;
    uint32_t max_pd = 65536;
    uint32_t max_mr = 1u << 20;
    uint32_t max_qp = 1u << 17;
    uint32_t max_cq = 1u << 17;
    uint32_t max_srq = 1u << 16;
    uint32_t max_qp_wr = 1u << 15;
    uint32_t max_cqe = 1u << 22;
    uint32_t max_srq_wr = 1u << 15;
    uint32_t max_sge = kEngineMaxSge;
    uint32_t max_inline_data = kEngineMaxInline;
    uint32_t max_msg_sz = 1u << 31;
    uint64_t max_mr_size = 1ull << 40;
    uint32_t phys_port_cnt = 1;
    uint32_t engine_threads = 1;
    uint32_t spin_us = 50;
    uint32_t sleep_us = 1000;
    uint32_t futex_waitv = 1;       // 0: sleep as on a kernel without futex_waitv (see engine.cc)
    uint64_t dm_size = 256 * 1024;  // the device-memory region (SPEC.md §17)
    // Host interfaces, one device each (the Ethernet personality, SPEC.md §19); empty: `devices`
    // loopback devices of the InfiniBand personality.
    std::vector<std::string> netdevs;
    // RoCEv2 to other hosts from an Ethernet device (SPEC.md §18): the UDP port, and the fault
    // hook tests use in place of netem.
    uint32_t wire_port = roce::kUdpPort;
    WireFaults wire_faults;
};

// Applies one key=value; -EINVAL for an unknown key or a value out of range, -ENODEV for a
// netdev that names no interface of the host.
int configSet(Config &cfg, const std::string &key, const std::string &value);
// Applies every SOFTNDA_<KEY> variable (ignored when privileges differ, via secure_getenv).
void configFromEnv(Config &cfg);

// Engine-side view of queue memory (pointers into the caller's allocation).
struct Ring {
    uint8_t *buf = nullptr;
    uint32_t cnt = 0;
    uint32_t stride = 0;
    uint32_t *pi = nullptr;  // doorbell record word 0
    uint32_t *ci = nullptr;  // doorbell record word 16 (offset 64)
    uint32_t ci_local = 0;   // the engine's CI (the truth; *ci mirrors it)
    // buf is also the allocation (freed with ops->free): ring then doorbell record, one block.
    void place(uint8_t *mem, uint32_t entries, uint32_t entry_size) {
        const size_t ring_bytes = static_cast<size_t>(entries) * entry_size;
        buf = mem;
        cnt = entries;
        stride = entry_size;
        pi = reinterpret_cast<uint32_t *>(mem + ring_bytes);
        ci = reinterpret_cast<uint32_t *>(mem + ring_bytes + SOFTNDA_DBR_CI_OFFSET);
    }
};

enum class SlotKind : uint8_t { Free, Sq, Rq, Srq, Cq };

struct Context;
struct DbPage {
    uint8_t *va = nullptr;  // the engine's mapping of the page
    uint32_t page_no = 0;   // device-wide number (UB_RES offset / 4096)
    Context *ctx = nullptr;
    uint64_t file_off = 0;  // offset in ctx->bar_fd
    uint64_t used = 0;      // control path (Device::ctl)
    SlotKind kind[SOFTNDA_DB_REGS_PER_PAGE] = {};
    void *owner[SOFTNDA_DB_REGS_PER_PAGE] = {};
    uint32_t last_seen[SOFTNDA_DB_REGS_PER_PAGE] = {};  // owning engine thread only
    ibvx::UniqueMapping mapping;                        // va's page, unmapped with the DbPage
    uint64_t *summary() const { return reinterpret_cast<uint64_t *>(va); }
    uint32_t *wakeSeq() const { return reinterpret_cast<uint32_t *>(va + SOFTNDA_DB_WAKE_OFFSET); }
    uint32_t *sleeping() const { return reinterpret_cast<uint32_t *>(va + SOFTNDA_DB_SLEEPING_OFFSET); }
    uint32_t *reg(unsigned i) const {
        return reinterpret_cast<uint32_t *>(va + SOFTNDA_DB_REGS_OFFSET + i * SOFTNDA_DB_REG_STRIDE);
    }
};

// One doorbell register handed to a queue, and how it was mapped for the creator. The
// doorbell_map_desc given to db_mmap is not kept (40 bytes a queue): slotDesc() rebuilds the
// same one from the page, the index and the mode for db_unmap.
struct DbSlot {
    DbPage *page = nullptr;
    void *mapped = nullptr;  // what db_mmap returned
    uint8_t index = 0;
    bool ub_res = false;  // mapped as DB_MAP_MODE_UB_RES (else DB_MAP_MODE_HOST_VA)
};

struct Device;

// A memory window's binding as the engine last set it (SPEC.md §16), where a broker's successor
// finds it: the engine changes bindings between control operations, so no blob can carry them.
struct MwBinding {
    uint32_t key;     // the current rkey
    uint32_t lkey;    // the MR's key; 0: not bound
    uint32_t access;  // IBV_ACCESS_REMOTE_*
    uint32_t qpn;     // a type 2 window's QP
    uint64_t addr, len;
    uint32_t by_qpn;   // the WQE that set it: its QP and 1 + its index (its exec word, §10);
    uint32_t by_exec;  // 0 and 0 for the control path
};
// Two copies and which one holds: a writer fills the other copy, then flips `current`, so a
// process killed mid-write leaves the last whole binding (SPEC.md §16, "Restart").
struct MwRecord {
    uint32_t current;  // 0 or 1
    uint32_t resv;
    MwBinding copy[2];
    uint8_t pad[40];
};
static_assert(sizeof(MwRecord) == 128, "records pack a page evenly");
uint32_t mwRecordsPerPage();  // records in a page of the window file (the host's page size)

// A wire responder's saved atomic results (SPEC.md §18 "Restart"): the engine executes an
// atomic between control operations, so no blob can carry its result; a successor answers the
// atomic's retransmission from here. Two records per QP, eight results each; magic and qpn say
// whose they are (a QP's SQ record, which names them, is memory its tenant can write).
constexpr uint32_t kAtomicRecordMagic = 0x41544f4d;  // "MOTA"
struct AtomicRecord {
    uint32_t magic;
    uint32_t qpn;
    uint32_t next;  // the first record's: the slot the next result takes (0..15)
    uint32_t resv;
    uint32_t psn1[8];  // 1 + the PSN of the request whose result the slot holds; 0: none
    uint64_t orig[8];  // the value the atomic found
    uint8_t pad[16];
};
static_assert(sizeof(AtomicRecord) == sizeof(MwRecord), "one record size in the file");

struct Mw;
// A context's records: its memory windows' bindings and its wire responders' atomic results. A
// memfd of their own (tenants map the BAR file, never this one), grown a page at a time, each
// page mapped on its own so a record never moves under the engine threads that write it.
// Device::ctl.
struct WindowFile {
    ibvx::UniqueFd fd;
    std::vector<ibvx::UniqueMapping> pages;
    std::vector<const void *> owners;  // by record index: the Mw or Qp that has it; nullptr: free
    void *slot(uint32_t i) const {
        return static_cast<MwRecord *>(pages[i / mwRecordsPerPage()].get()) + i % mwRecordsPerPage();
    }
    MwRecord *record(uint32_t i) const { return static_cast<MwRecord *>(slot(i)); }
};

struct Context {
    ibv_context ib{};  // first: the ibv_context * handed out points here
    uint64_t magic = 0;
    Device *dev = nullptr;
    int bar_fd = -1;
    uint32_t bar_pages = 0;
    std::vector<DbPage *> pages;  // Device::ctl
    uint32_t objects = 0;         // PDs, MRs, CQs, SRQs, QPs alive (Device::ctl)
    int async_fd = -1;            // our dup of set_async_event_fd's eventfd (see the lock list)
    WindowFile windows;           // its windows' bindings and atomic results (mw_record.cc)
};

struct Pd {
    ibv_pd ib{};
    uint64_t magic = 0;
    Context *ctx = nullptr;
    uint32_t refs = 0;  // MRs, QPs, SRQs using it (Device::ctl)
};

struct Dm;

struct Mr {
    ibv_mr ib{};
    uint64_t magic = 0;
    Pd *pd = nullptr;
    Dm *dm = nullptr;         // a region on device memory (SPEC.md §17): addr is inside dm->mem
    uint8_t *addr = nullptr;  // where the bytes are in this process
    uint64_t iova = 0;        // how work requests address them
    uint64_t len = 0;
    int access = 0;
    uint32_t key = 0;
    // Memory windows bound to it (SPEC.md §16): engine threads bind and invalidate (atomic
    // updates); dereg and rereg answer EBUSY while it is not 0 (read with the gate exclusive).
    uint32_t windows = 0;
    // Host address of [iova, iova+n) when that range lies inside the MR, else nullptr.
    uint8_t *translate(uint64_t va, uint64_t n) const {
        if (va < iova || n > len || va - iova > len - n) {
            return nullptr;
        }
        return addr + (va - iova);
    }
};

struct SpinLock {
    std::atomic<bool> locked{false};
    void lock() {
        while (locked.exchange(true, std::memory_order_acquire)) {
            while (locked.load(std::memory_order_relaxed)) {
                ibvx_cpu_relax();
            }
        }
    }
    void unlock() { locked.store(false, std::memory_order_release); }
};

struct Cq {
    ibv_cq ib{};
    ibv_cq_extend ext{};
    uint64_t magic = 0;
    Context *ctx = nullptr;
    ibv_extend_ops *ops = nullptr;
    Ring ring;  // pi/ci roles reversed: engine produces
    uint32_t *state = nullptr;
    uint32_t *arm = nullptr;     // record offset 8: SW arms, the engine disarms (SPEC.md §9)
    uint32_t *events = nullptr;  // record offset 12: completion events raised
    int event_fd = -1;           // our dup of set_cq_event_fd's eventfd (see the lock list)
    DbSlot db;
    uint32_t refs = 0;
    SpinLock lock;       // guards ring.ci_local (engine's PI here) and error
    bool error = false;  // overflowed
};

// A memory window (SPEC.md §16; mw.cc). Its rkey is kMwKeyBit | slot << 8 | a key byte the
// binder picks. The binding is written by the engine thread that executes a bind or an
// invalidation and read by every responder: `lock` guards it. Everything else is fixed at
// allocation (Device::ctl).
struct Mw {
    ibv_mw ib{};  // first: the ibv_mw * handed out points here
    uint64_t magic = 0;
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    ibv_mw_type type = IBV_MW_TYPE_1;
    uint32_t slot = 0;
    SpinLock lock;
    uint32_t key = 0;   // the current rkey
    Mr *mr = nullptr;   // bound to (nullptr: not bound, every access through it fails)
    uint64_t addr = 0;  // the window: [addr, addr+len) of the MR's iova range
    uint64_t len = 0;
    int access = 0;           // IBV_ACCESS_REMOTE_*
    uint32_t qpn = 0;         // a type 2 window's QP (the one that bound it)
    MwRecord *rec = nullptr;  // where the binding is written for a successor (ctx->windows)
    uint32_t rec_index = 0;
    bool restored = false;  // imported: the record's binding is taken up at set_paused(0)
};
constexpr uint32_t kMwKeyBit = 0x80000000u;  // an rkey with it names a window, without an MR
inline bool isMwKey(uint32_t key) {
    return (key & kMwKeyBit) != 0;
}

// An XRC domain (SPEC.md §14): the device's, whichever context opened it; SRQs and target QPs
// of any context may belong to it, and it outlives the context that opened it (a broker shares
// one domain among processes, any of which may go first), so it is not counted in that
// context's objects. refs: those SRQs and QPs (Device::ctl).
struct Xrcd {
    ibv_xrcd ib{};  // first: the ibv_xrcd * handed out points here (ib.context: the opener's, may be closed)
    uint64_t magic = 0;
    Device *dev = nullptr;
    uint32_t refs = 0;
};

struct Srq {
    ibv_srq ib{};
    ibv_srq_extend ext{};
    uint64_t magic = 0;
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    ibv_extend_ops *ops = nullptr;
    Ring ring;
    uint32_t *limit = nullptr;
    uint32_t *limit_events = nullptr;
    uint32_t max_sge = 0;
    DbSlot db;
    uint32_t refs = 0;
    SpinLock lock;
    // An XRC SRQ (xrcd set): its number, and the CQ its receives complete on.
    Xrcd *xrcd = nullptr;
    Cq *cq = nullptr;
    uint32_t srqn = 0;
    // The receives messages still arriving over the wire hold, by ring index (lock): the CI in
    // the record stays at the oldest, so the producer cannot reuse a slot a successor may still
    // read the receive from (SPEC.md §10, §18).
    std::vector<uint32_t> held;
    // Stores the receives taken (kSrqTakenWord) and the CI the producer may see: ci_local, or
    // the oldest held index (lock held).
    void publishCi();
};

// The big V2/V3 extended attributes. Few QPs ever set them and they are 480 bytes, more than a
// third of a QP, so a QP holds them apart, allocated by the first modify_qp_extend that sets
// one; until then they read as zeros (and the hyroce feature as not set).
// A receive WQE copied out of its ring (the engine's; bounded by kEngineMaxSge).
struct RecvCopy {
    uint64_t wr_id;
    uint32_t num_sge;
    softnda_sge sge[kEngineMaxSge];
    uint32_t index = 0;  // its slot's ring index (an SRQ's: what a held receive records)
};

struct Qp;
struct Srq;

// A same-host message in progress at its requester: what it started as (a rewrite of the WQE
// under it ends it), how far it got, its responder, and the receive it fills (SEND and WRITE
// with immediate). Only the engine thread that owns the requester's SQ touches it.
struct ChunkedMessage {
    bool active = false;
    uint32_t index = 0;  // the requester's sq.ci_local
    uint8_t opcode = 0;
    uint64_t total = 0;
    uint64_t done = 0;
    Qp *peer = nullptr;
    Srq *srq = nullptr;
    bool has_recv = false;
    RecvCopy recv{};
};

struct QpExtAttrs {
    ibv_hyroce_feature feature{};
    bool feature_set = false;
    ibv_mpath_config mpath{};
    ibv_ar_config ar{};
    ibv_sack_config sack{};
};

// Standard and extended QP attributes, written by control operations under the gate (`ext`:
// under Device::ctl, which every control operation holds; the engine never reads it).
struct QpAttrs {
    uint32_t dest_qpn = 0;
    uint32_t sq_psn = 0;
    uint32_t rq_psn = 0;
    int access = 0;
    uint8_t port = 1;
    uint16_t pkey_index = 0;
    uint32_t path_mtu = IBV_MTU_1024;
    uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 0;
    uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0;
    uint32_t qkey = 0;  // UD (SPEC.md §11.1); also in the SQ record, word kSqQkeyWord
    ibv_ah_attr ah{};
    // extended (V2/V3)
    uint32_t udp_src_port = 0;
    uint32_t lb_mode = 0;
    uint32_t lag_port = 0;
    std::unique_ptr<QpExtAttrs> ext;
};

// A multicast group a UD QP joined (SPEC.md §11.3): its MGID and MLID.
struct McastGroup {
    ibv_gid gid{};
    uint16_t lid = 0;
};
// What tells a device's multicast groups apart (SPEC.md §11.3): the MLID on an InfiniBand port,
// as a switch routes by it, and the MGID on an Ethernet one, which has no LIDs (the kernel
// ignores the LID of a RoCE attach). The MGID's bytes, or the MLID in the last two.
using McastKey = std::array<uint8_t, 16>;
inline McastKey mcastKey(bool ethernet, const ibv_gid &gid, uint16_t lid) {
    McastKey k{};
    if (ethernet) {
        std::memcpy(k.data(), gid.raw, k.size());
    } else {
        k[14] = static_cast<uint8_t>(lid >> 8);
        k[15] = static_cast<uint8_t>(lid);
    }
    return k;
}

// The groups a UD QP joined, in joining order. Most QPs join none, so the list is allocated by
// the first join: a pointer in every QP instead of a vector (issue 25: bytes per QP).
class McastGroups {
  public:
    McastGroup *begin() { return list_ != nullptr ? list_->data() : nullptr; }
    McastGroup *end() { return begin() + size(); }
    const McastGroup *begin() const { return list_ != nullptr ? list_->data() : nullptr; }
    const McastGroup *end() const { return begin() + size(); }
    size_t size() const { return list_ != nullptr ? list_->size() : 0; }
    bool empty() const { return size() == 0; }
    const McastGroup &front() const { return list_->front(); }
    const McastGroup &operator[](size_t i) const { return (*list_)[i]; }
    void push_back(const McastGroup &g) {
        if (list_ == nullptr) {
            list_ = std::make_unique<std::vector<McastGroup>>();
        }
        list_->push_back(g);
    }
    void erase(const McastGroup *g) { list_->erase(list_->begin() + (g - list_->data())); }
    void clear() { list_.reset(); }

  private:
    std::unique_ptr<std::vector<McastGroup>> list_;
};

// What a QP was created with that the engine and query_qp read (the rest of ibv_qp_init_attr,
// its context and queues, is in the ibv_qp): 28 bytes instead of the whole attr's 64.
struct QpInit {
    ibv_qp_cap cap{};
    ibv_qp_type qp_type = IBV_QPT_RC;  // RC, UC, UD, XRC_SEND or XRC_RECV
    int sq_sig_all = 0;
};

struct Qp {
    ibv_qp ib{};
    ibv_qp_extend ext{};
    uint64_t magic = 0;
    Context *ctx = nullptr;
    Pd *pd = nullptr;
    Cq *scq = nullptr;
    Cq *rcq = nullptr;
    Srq *srq = nullptr;
    ibv_extend_ops *ops = nullptr;
    QpInit init;
    uint32_t qpn = 0;
    // An XRC target QP's domain (SPEC.md §14; it has no PD, no CQs and no receive queue).
    Xrcd *xrcd = nullptr;
    // Where a send WQE's data segment starts: after the header, and the XRC segment on an XRC
    // initiator QP.
    uint32_t wqe_data = SOFTNDA_WQE_HEADER_SIZE;
    // What the transport allows (SPEC.md §11), set by buildQp so the engine's shape and length
    // checks cost the same for every transport: opcodes up to max_opcode, messages up to max_msg.
    uint8_t max_opcode = SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
    uint32_t max_msg = 0;
    std::atomic<int> state{IBV_QPS_RESET};
    QpAttrs attrs;
    Ring sq;
    Ring rq;
    uint32_t *fatal_events = nullptr;  // SQ record offset 8 (SPEC.md §9)
    uint32_t rq_max_sge = 0;
    DbSlot sq_db;
    DbSlot rq_db;
    // requester side: only the engine thread owning sq_db.page
    uint32_t sq_psn = 0;
    bool rnr_waiting = false;     // on the engine thread's waiting list (an RNR or a peer wait)
    bool waits_for_peer = false;  // which: no responder answered (else an RNR NAK)
    uint32_t rnr_used = 0;
    uint64_t rnr_deadline_ns = 0;
    Qp *peer = nullptr;
    uint64_t peer_epoch = 0;
    // The head WQE when it is a same-host message moved a chunk per visit (engine.cc,
    // respondInChunks), so no WQE holds the device gate for longer than one chunk.
    ChunkedMessage chunked;
    // responder side: rq_lock
    std::mutex rq_lock;
    uint32_t rq_psn = 0;
    // Set by import when the records say the process died inside this QP's head WQE or just
    // after one (SPEC.md §10): the owner thread settles it against the peer on its first visit.
    bool recover_head = false;
    bool recover_psn = false;
    // The SQ record's engine-private words (SPEC.md §10), as u32 indexes from dbr_pi.
    uint32_t *recWord(unsigned w) const { return sq.pi + w; }
    // Its saved atomic results' records in its context's file (none: nullptr), Device::ctl;
    // written by the responder under rq_lock.
    AtomicRecord *atomic_recs[2] = {nullptr, nullptr};
    uint32_t atomic_rec_index[2] = {0, 0};  // theirs in the file (the SQ record's copy is the tenant's too)
    // The multicast groups a UD QP joined, in joining order (ctl + gate).
    McastGroups mcast;
    // Whether the QP has a receive queue of its own: not with an SRQ, and never on XRC QPs.
    bool hasRq() const { return rq.buf != nullptr; }
    // The transport's state when the QP is connected to another host (SPEC.md §18), else null.
    std::unique_ptr<WireQp> wire;
    // A requester whose acknowledgements come over the wire: RC, or an XRC initiator.
    bool reliableOnWire() const {
        return wire && (init.qp_type == IBV_QPT_RC || init.qp_type == IBV_QPT_XRC_SEND);
    }
};

// Per engine thread counters: one writer (its thread), read by softnda_query_counters.
struct Counters {
    std::atomic<uint64_t> wqes{0}, bytes{0}, doorbells{0}, cqes{0}, errors{0}, flushed{0}, rnr_naks{0},
        cq_overflows{0}, dropped_cqes{0}, srq_limit_events{0}, passes{0}, sleeps{0}, wakeups{0}, sweeps{0},
        wire_tx{0}, wire_rx{0}, wire_retransmits{0}, wire_seq_naks{0}, wire_bad_icrc{0}, wire_malformed{0},
        wire_fault_drops{0};
};
inline void bump(std::atomic<uint64_t> &c, uint64_t n = 1) {
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// Lets control operations in between engine passes without starving (see the lock list above).
struct Gate {
    std::shared_mutex mu;
    std::atomic<int> writers{0};
    void enterShared() {
        while (writers.load(std::memory_order_acquire) != 0) {
            std::this_thread::yield();
        }
        mu.lock_shared();
    }
    void leaveShared() { mu.unlock_shared(); }
    void lock() {
        writers.fetch_add(1, std::memory_order_acq_rel);
        mu.lock();
    }
    void unlock() {
        mu.unlock();
        writers.fetch_sub(1, std::memory_order_acq_rel);
    }
};

class Engine;
struct Netdev;

struct Device {
    ibv_device ib{};
    uint64_t magic = 0;
    std::string name;
    uint32_t index = 0;
    uint64_t guid = 0;
    Config cfg;
    ibv_extend_vdev_attr attr{};
    std::shared_ptr<Netdev> netdev;  // the interface of an Ethernet device (SPEC.md §19), else null

    std::mutex ctl;
    Gate gate;

    std::mutex pages_mu;          // leaf: guards pages for softnda_ub_resolve
    std::vector<DbPage *> pages;  // by page_no (nullptr once freed); also ctl + gate
    std::vector<uint32_t> free_page_nos;

    std::vector<Mr *> mrs;  // by key >> 8; ctl + gate
    std::vector<uint32_t> free_mr_slots;
    uint32_t mr_generation = 0;  // ctl
    std::vector<Mw *> mws;       // by slot (rkey bits 8-30); ctl + gate
    std::vector<uint32_t> free_mw_slots;
    uint32_t n_mw = 0;                       // ctl
    std::unordered_map<uint32_t, Qp *> qps;  // by QPN; ctl + gate
    uint32_t next_qpn = 1;
    uint64_t qp_epoch = 1;  // bumped when a QP goes away, invalidating cached peers (gate)
    std::unordered_map<uint32_t, Srq *> xrc_srqs;  // XRC SRQs by SRQ number; ctl + gate
    // The UD QPs that joined a multicast group, by the group's key (mcastKey: the MLID on an
    // InfiniBand port, the MGID on an Ethernet one), each once (SPEC.md §11.3); ctl + gate.
    std::map<McastKey, std::vector<Qp *>> mcast;
    uint32_t mcast_attached = 0;  // group memberships of all QPs (ctl)
    // The device-memory region (SPEC.md §17): the ranges allocations hold, offset -> length (ctl).
    std::map<uint64_t, uint64_t> dm_used;
    uint32_t next_srqn = 1;

    uint32_t n_pd = 0, n_mr = 0, n_qp = 0, n_cq = 0, n_srq = 0;  // ctl
    uint32_t open_contexts = 0;                                  // Registry::mu

    std::unique_ptr<Engine> engine;  // while a context is open
    // set_paused (SPEC.md §10): engine passes start only while it is false (read inside the gate).
    std::atomic<bool> paused{false};
    Counters retired;  // counters of stopped engines

    Mr *lookupMr(uint32_t key) const {
        uint32_t idx = key >> 8;
        if (idx >= mrs.size()) {
            return nullptr;
        }
        Mr *mr = mrs[idx];
        return mr != nullptr && mr->key == key ? mr : nullptr;
    }
};

// The LID of a port (SPEC.md §8): unique on the host; LID 0 is invalid and LIDs from 0xc000 are
// multicast.
inline uint16_t portLid(const Device &dev, uint8_t port) {
    return static_cast<uint16_t>(1 + (dev.index * dev.cfg.phys_port_cnt + (port - 1u)) % 0xbffe);
}
// The port of dev whose LID is lid, or 0 when none is.
inline uint8_t portOfLid(const Device &dev, uint16_t lid) {
    for (uint32_t port = 1; port <= dev.cfg.phys_port_cnt; ++port) {
        if (portLid(dev, static_cast<uint8_t>(port)) == lid) {
            return static_cast<uint8_t>(port);
        }
    }
    return 0;
}
// The UD message limit: one packet of the port's MTU (SPEC.md §8, §11.1).
constexpr uint32_t kUdMtu = 4096;

// Multicast (SPEC.md §11.3): LIDs 0xc000-0xfffe (0xffff is the permissive LID), the QPN a
// datagram to a group names, and the device's limits (ibv_device_attr's max_mcast_*).
inline bool isMulticastLid(uint16_t lid) {
    return lid >= 0xc000 && lid != 0xffff;
}
constexpr uint32_t kMcastQpn = 0xffffff;
// Whether gid names a multicast group as the kernel's rdma_is_multicast_addr has it: an IPv6
// multicast address (ff00::/8), or an IPv4-mapped one of 224.0.0.0/4 (RoCEv2 over IPv4).
inline bool isMulticastGid(const ibv_gid &gid) {
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return gid.raw[0] == 0xff ||
           (std::memcmp(gid.raw, mapped, sizeof(mapped)) == 0 && (gid.raw[12] & 0xf0) == 0xe0);
}
constexpr uint32_t kMaxMcastGroups = 1024;       // MLIDs with members on one device
constexpr uint32_t kMaxMcastQpAttach = 64;       // QPs in one group
constexpr uint32_t kMaxMcastTotalAttach = 4096;  // memberships on one device
constexpr uint32_t kMaxQpGroups = 16;            // groups one QP joins (its restart blob holds them)

// The access flags softnda knows (MRs and QPs).
constexpr int kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                             IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;
// What a window may allow (SPEC.md §16).
constexpr int kMwAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Every entry of a C ops table is wrapped (common/c_abi.h): nothing thrown inside crosses into a
// C caller; it becomes the reference's ENOMEM convention instead.
using ibvx::CEntry;
using ibvx::failNull;

constexpr uint64_t kMagicDevice = 0x736f66746e646130ull;
constexpr uint64_t kMagicContext = 0x736f66746e646131ull;
constexpr uint64_t kMagicPd = 0x736f66746e646132ull;
constexpr uint64_t kMagicMr = 0x736f66746e646133ull;
constexpr uint64_t kMagicCq = 0x736f66746e646134ull;
constexpr uint64_t kMagicSrq = 0x736f66746e646135ull;
constexpr uint64_t kMagicQp = 0x736f66746e646136ull;
constexpr uint64_t kMagicXrcd = 0x736f66746e646137ull;
constexpr uint64_t kMagicMw = 0x736f66746e646138ull;
constexpr uint64_t kGuidHigh = 0x0000736f66746e64ull;  // "softnd": the UB GUID's high half

// ---- identity.cc ----
// SPEC.md §8. The vendor ID is an IEEE identifier with the locally administered bit set, which
// IEEE never assigns to a company: softnda claims no real vendor's hardware.
constexpr uint32_t kVendorId = 0x02a0c0;
constexpr uint32_t kVendorPartId = 0x5d0a;  // "softnda", model 1
constexpr uint32_t kHwVer = 1;              // the SPEC.md revision the engine implements
constexpr const char *kFwVer = "1.0.0";     // major.minor.sub, as tools that parse fw_ver expect
// 24 bits drawn from the host's machine ID (host name when it has none); the same on every call.
uint32_t hostGuidBits();
// Node GUID of device index: vendor ID (24 bits), host bits (24), index (8), and a zero byte
// that port GUIDs fill with the port number (SPEC.md §8).
uint64_t deviceGuid(uint32_t index);

// ---- device.cc ----
// Distance between two doorbell pages in a context's BAR file. The pages are 4 KiB (SPEC.md
// §1.2, and the reference's db_mmap contract), but a mapping's file offset must be a multiple of
// the system page size: on a 16 or 64 KiB page system each doorbell page starts a system page of
// its own, and the rest of that system page is unused.
uint64_t dbPageStride();
Context *asContext(ibv_context *ib);
Pd *asPd(ibv_pd *ib);
Qp *asQp(ibv_qp *ib);
Cq *asCq(ibv_cq *ib);
Srq *asSrq(ibv_srq *ib);
Mr *asMr(ibv_mr *ib);
// A domain may outlive the context its ib.context names (struct Xrcd), so it is found in the
// registry's set of live domains rather than through its context.
Xrcd *asXrcd(ibv_xrcd *ib);
void registerXrcd(Xrcd *x);    // buildXrcd
void unregisterXrcd(Xrcd *x);  // closeXrcd, before it is freed

// A queue's allocation: the ring, then its 128 B doorbell record (SPEC.md §1).
inline constexpr size_t kRecordSize = 128;
// SGEs a send WQE / a receive WQE of `stride` bytes holds (SPEC.md §2).
constexpr uint32_t sendSgeCap(uint32_t stride, uint32_t data = SOFTNDA_WQE_HEADER_SIZE) {
    return (stride - data) / SOFTNDA_SGE_SIZE;
}
// A receive WQE's SGEs, never more than the engine holds: a 512 B entry has room for 31, but the
// device reports and executes at most kEngineMaxSge.
constexpr uint32_t recvSgeRoom(uint32_t stride) {
    return (stride - SOFTNDA_RECV_HEADER_SIZE) / SOFTNDA_SGE_SIZE;
}
constexpr uint32_t recvSgeCap(uint32_t stride) {
    return recvSgeRoom(stride) < kEngineMaxSge ? recvSgeRoom(stride) : kEngineMaxSge;
}

// Queue memory (driver.cc): the smallest power of two >= v; one allocation through ops holding
// the ring then its 128 B doorbell record, zeroed (SPEC.md §1), 0 or -errno; its release.
uint32_t pow2Ceil(uint32_t v);
int allocRing(ibv_extend_ops *ops, uint32_t cnt, uint32_t stride, Ring *r);
void freeRing(ibv_extend_ops *ops, Ring *r);

// The queue_info a create, an import or a resize hands back for a ring and its doorbell.
void fillQueueInfo(queue_info *qi, const Ring &r, const DbSlot &db);
// ibv_resize_cq (resize.cc, SPEC.md §12): 0 or -errno.
int resizeCq(ibv_cq_extend *ext, uint32_t cqe);
// ibv_rereg_mr (rereg.cc, SPEC.md §13): 0 or -errno, the MR unchanged on failure.
inline constexpr int kReregFlags =
    IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
int reregMr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
// mcast.cc (SPEC.md §11.3): the vdev entries, and what destroy and import do with a QP's groups.
int attachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid);
int detachMcast(ibv_qp_extend *ext, const ibv_gid *gid, uint16_t lid);
// The caller holds Device::ctl and the gate exclusively.
void leaveAllGroups(Qp *qp);
// An imported QP's groups (its blob's): whether a QP of that type may be in all of them and the
// device has room (0, -EINVAL or -ENOMEM); then, once the QP is built, its joining. The caller
// holds Device::ctl across both.
int checkImportedGroups(const Device &dev, ibv_qp_type type, const std::vector<McastGroup> &groups);
void joinImportedGroups(Qp *qp, const std::vector<McastGroup> &groups);
// What reg_mr and rereg_mr check (vdev.cc): known access bits and the IB rule that remote write
// and atomic need local write; a non-empty range of mapped memory within max_mr_size. 0 or -errno.
int checkMrAccess(int access);
int checkMrRange(const Device *dev, const void *addr, size_t length, uint64_t iova);

// Where an object's state comes from: made now by a create, or found again by an import where
// an earlier process left it (restart.cc, SPEC.md §10).
enum class Origin : uint8_t { Created, Imported };

// Takes a free doorbell register of ctx (growing its BAR), zeroes it and maps it through
// ops->db_mmap; the engine does not see it until publishDbSlot. Caller holds dev->ctl. -errno
// on failure, leaving nothing behind.
int reserveDbSlot(Context *ctx, ibv_extend_ops *ops, int dma_type, DbSlot *out);
// Hands a reserved (or imported) register to the engine as the doorbell of owner (caller holds
// dev->ctl; takes the gate). An imported one is looked at by the first pass after the resume,
// since it may have been rung while no engine ran.
void publishDbSlot(Device *dev, DbSlot *slot, SlotKind kind, void *owner, Origin origin);
// Unpublishes the register, unmaps it through ops->db_unmap and frees it (caller holds ctl;
// takes the gate). Nothing for a slot never reserved.
void releaseDbSlot(Context *ctx, ibv_extend_ops *ops, DbSlot *slot);
// The doorbell_map_desc the slot was mapped with.
doorbell_map_desc slotDesc(const DbSlot &slot);

int vdevConfigure(const char *key, const char *value);
int vdevQueryDevices(ibv_extend_vdev_attr *attrs, int max);
ibv_context *vdevOpenDevice(const char *name);
int vdevCloseDevice(ibv_context *context);
int vdevIsOwnDevice(const ibv_device *dev);
int vdevExportMmio(const void *addr, int *fd, uint64_t *offset);

// ---- construction (objects.cc) ----
// Create (driver.cc, vdev.cc) and import (restart.cc) build every object with the same function.
// The caller makes the object, puts into it what its origin provides (queue memory and doorbell
// registers, QPN, MR key and range, attributes, event fds: made new, or found where an earlier
// process left them) and hands it over; the build sets everything derived from that, reads back
// what the engine keeps in queue memory (cursors, PSNs, the QP state: SPEC.md §10; a new queue's
// zeroed memory reads as the initial state), makes the object reachable and counts it. Caller
// holds Device::ctl. They do not fail (short of memory).

// Whether a caller's ibv_extend_ops has every callback a queue needs.
bool opsComplete(const ibv_extend_ops *o);
// What a QP hangs on, checked: softnda objects of ctx (srq may be NULL).
// An XRC initiator has no recv_cq; an XRC target has only its domain (xrcd).
struct QpParents {
    Pd *pd = nullptr;
    Cq *scq = nullptr;
    Cq *rcq = nullptr;
    Srq *srq = nullptr;
    Xrcd *xrcd = nullptr;
};
bool qpParents(Context *ctx, ibv_qp_type type, ibv_pd *pd, ibv_cq *scq, ibv_cq *rcq, ibv_srq *srq,
               QpParents *out);
// The QP state word of an SQ record (SPEC.md §10).
uint32_t recordedQpState(const Ring &sq);

ibv_pd *buildPd(Context *ctx, uint32_t handle);
// mr: addr, iova, len, access and key set, the key's slot in Device::mrs reserved.
ibv_mr *buildMr(std::unique_ptr<Mr> mr, Pd *pd, uint32_t handle);
// cq: ring and db set (and event_fd, when one comes with it).
ibv_cq_extend *buildCq(std::unique_ptr<Cq> cq, Context *ctx, ibv_extend_ops *ops, void *cq_context,
                       uint32_t handle, Origin origin);
// srq: ring, db and max_sge set (and, for an XRC SRQ, xrcd, cq and srqn).
// xrcd: made (or imported) by open_xrcd on ctx's device; not counted in ctx (it may outlive it).
ibv_xrcd *buildXrcd(Context *ctx);
ibv_srq_extend *buildSrq(std::unique_ptr<Srq> srq, Context *ctx, Pd *pd, ibv_extend_ops *ops,
                         void *srq_context, uint32_t handle, Origin origin);
// qp: qpn, sq and sq_db set, and rq, rq_db and rq_max_sge unless it uses an SRQ (and attrs, when
// they come with it). init: as granted (its CQ and SRQ pointers are the parents').
ibv_qp_extend *buildQp(std::unique_ptr<Qp> qp, Context *ctx, const QpParents &parents, ibv_extend_ops *ops,
                       const ibv_qp_init_attr &init, uint32_t handle, Origin origin);

// Takes slot idx of a device table (Device::mrs, Device::mws) for an imported object (caller
// holds Device::ctl): false when an object of this process has it. New objects must not collide:
// the slot leaves the free list, and slots below it that this process never used join it.
template <typename T>
bool claimSlot(std::vector<T *> &table, std::vector<uint32_t> &free_slots, uint32_t idx, Gate &gate) {
    auto free_it = std::find(free_slots.begin(), free_slots.end(), idx);
    if (idx < table.size() && (table[idx] != nullptr || free_it == free_slots.end())) {
        return false;
    }
    std::lock_guard<Gate> g(gate);
    if (idx < table.size()) {
        free_slots.erase(free_it);
    } else {
        for (auto i = static_cast<uint32_t>(table.size()); i < idx; ++i) {
            free_slots.push_back(i);
        }
        table.resize(idx + 1, nullptr);
    }
    return true;
}

// ---- memory windows (mw.cc; SPEC.md §16, vdev ABI V9) ----
ibv_mw *allocMw(ibv_pd *pd, ibv_mw_type type);
int deallocMw(ibv_mw *mw);
Mw *asMw(ibv_mw *ib);
// The engine's side, in a pass (gate shared). A BIND_MW or LOCAL_INV WQE of qp: its completion
// status (IBV_WC_MW_BIND_ERR / IBV_WC_LOC_QP_OP_ERR when refused).
uint8_t executeBindMw(Device *dev, Qp *qp, const softnda_wqe &h);
uint8_t executeLocalInv(Device *dev, Qp *qp, uint32_t rkey);
// A destroyed QP's type 2 windows become free, so a later QP of the same number (QPNs wrap)
// reaches nothing through them. The caller holds Device::ctl and the gate exclusively.
void invalidateWindowsOf(Device *dev, uint32_t qpn);
// A SEND_WITH_INV's invalidation at the responder QP responder: true when rkey names a type 2
// window bound through that QP; with apply, the window is then invalid.
bool invalidateRemote(Device *dev, const Qp *responder, uint32_t rkey, bool apply);
// The host address of [va, va+n) through the window rkey names, when it is bound, its PD is pd,
// its QP (type 2) is responder's, and it allows `need`; else nullptr.
uint8_t *translateMw(const Device *dev, const Pd *pd, const Qp *responder, uint32_t rkey, uint64_t va,
                     uint64_t n, int need);
// After an import (SPEC.md §10): whether the head WQE h of qp, a BIND_MW or LOCAL_INV the old
// process started, took effect there (its window's record says this WQE wrote it, as it asked).
bool windowWqeApplied(const Device *dev, const Qp *qp, const softnda_wqe &h);
// An imported window (restart.cc): the one of rkey (as allocated) and type (a valid one: the
// caller checks it), in its slot, on record
// rec_index of pd's context; its binding is read from the record at set_paused(0). Caller holds
// Device::ctl. NULL + EINVAL for a slot or record this process uses, or a bad type or key.
ibv_mw *restoreMw(Pd *pd, ibv_mw_type type, uint32_t rkey, uint32_t rec_index);
// Window records (mw_record.cc). A free record of ctx for mw, the file grown when full; false
// (errno) when the file cannot grow. Caller holds Device::ctl.
bool takeWindowRecord(Context *ctx, Mw *mw);
void releaseWindowRecord(Context *ctx, Mw *mw);
// Writes mw's binding into its record (caller holds mw->lock, or no pass runs).
void persistBinding(Mw *mw, uint32_t by_qpn, uint32_t by_exec);
// The current copy of a record.
MwBinding currentBinding(const MwRecord *rec);
// A wire responder's saved atomic results (SPEC.md §18 "Restart"), Device::ctl held: two
// records for a new RC QP or XRC target of an Ethernet device (none when the file cannot grow:
// its results are then kept in memory only), named in its SQ record (kSqAtomicRecWord); an
// imported QP takes up the records its SQ record names when they are free and its own.
void takeAtomicRecords(Qp *qp);
void adoptAtomicRecords(Qp *qp);
void releaseAtomicRecords(Qp *qp);
// The responder (rq_lock held): the result of the atomic at psn, in slot (0..15); next is the
// slot the one after takes. A slot is emptied before it is written, so a process killed halfway
// leaves the slot empty, never another PSN's result.
void persistAtomic(Qp *qp, uint32_t slot, uint32_t psn, uint64_t orig, uint32_t next);
// What the records hold: the PSN (+1; 0: none) and result of each slot, and the next slot; false
// when qp has none. And all of it forgotten (a reset: the PSNs of a new connection).
struct SavedAtomic {
    uint32_t psn1;
    uint64_t orig;
};
bool savedAtomics(const Qp *qp, SavedAtomic (&out)[kSavedAtomics], uint32_t *next);
void clearAtomicRecords(Qp *qp);
// An imported context's window file, mapped into out (which owns fd on success): false (errno)
// for a file that cannot be one (not a regular file, a size that is not whole pages, or more
// records than any device has windows) or a mapping that fails.
bool openWindowFile(int fd, WindowFile *out);
// The windows an import made take up their records' bindings, once every MR is back: a binding
// that fails a bind's checks is dropped (the window comes back unbound). Caller holds ctl.
void restoreWindowBindings(Device *dev);
// ---- device memory (dm.cc; SPEC.md §17, vdev ABI V10) ----
// An allocation of the device's region. ib first: the ibv_dm * handed out points here.
struct Dm {
    ibv_dm ib{};
    uint64_t magic = 0;
    Context *ctx = nullptr;
    ibv_extend_ops *ops = nullptr;  // the creator's: mem is freed with ops->free
    uint8_t *mem = nullptr;         // the bytes (ops->alloc of len)
    uint64_t offset = 0;            // the range of the region it holds: [offset, offset + len)
    uint64_t len = 0;               // the length asked for, rounded up to kDmUnit
    uint64_t asked = 0;             // the length asked for: copies and regions stay inside it
    uint32_t mrs = 0;               // regions registered on it (ctl)
};
constexpr uint64_t kDmUnit = 64;
constexpr uint32_t kDmMaxLogAlign = 12;
constexpr uint64_t kMagicDm = 0x736f66746e646138ull;
Dm *asDm(ibv_dm *ib);
ibv_dm *allocDm(ibv_context *context, const ibv_alloc_dm_attr *attr, ibv_extend_ops *ops);
int freeDm(ibv_dm *dm);
ibv_mr *regDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access);
int dmMemory(ibv_dm *dm, void **addr, uint64_t *length);
// A DM again (restart.cc): the same range of the region over relocated memory; -errno
// (-EEXIST: the range is taken). Caller holds Device::ctl.
ibv_dm *buildImportedDm(Context *ctx, ibv_extend_ops *ops, uint8_t *mem, uint64_t offset, uint64_t len,
                        uint64_t asked, int *err);
// Takes a free MR slot and gives mr its key (vdev.cc; caller holds Device::ctl).
void assignMrKey(Device *dev, Mr *mr);

// ---- XRC (driver.cc; SPEC.md §14, vdev ABI V6) ----
ibv_xrcd *openXrcd(ibv_context *context);
int closeXrcd(ibv_xrcd *xrcd);
ibv_srq_extend *createXrcSrq(ibv_context *context, ibv_srq_init_attr_extend *a, ibv_xrcd *xrcd, ibv_cq *cq);
ibv_qp_extend *createXrcTgtQp(ibv_context *context, ibv_qp_init_attr_extend *a, ibv_xrcd *xrcd);
int getSrqNum(ibv_srq *srq, uint32_t *srq_num);
// Where a send WQE's data segment starts on a QP of this type (SPEC.md §2.1, §14).
constexpr uint32_t wqeDataOffset(ibv_qp_type type) {
    return type == IBV_QPT_XRC_SEND ? SOFTNDA_WQE_HEADER_SIZE + SOFTNDA_XRC_SEG_SIZE
                                    : SOFTNDA_WQE_HEADER_SIZE;
}

// ---- engine.cc ----
class Engine {
  public:
    Engine(Device *dev, uint32_t threads);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    // Page membership changes (caller holds the gate exclusively).
    void addPage(DbPage *page);
    void removePage(DbPage *page);
    // A QP is going away (gate held exclusively): forget it in RNR lists.
    void forgetQp(Qp *qp);
    // Makes the thread owning page look at register `slot` soon (e.g. a QP moved to ERR).
    void poke(DbPage *page, unsigned slot);

    void addCounters(softnda_counters *out) const;
    // After set_paused(0): every thread does a full scan and a sweep before anything else.
    void resume();

    // An Ethernet device's RoCEv2 socket (SPEC.md §18); null, with wireError() saying why (-errno),
    // when it could not be bound, or on an InfiniBand device.
    WireSocket *wire() const { return wire_.get(); }
    int wireError() const { return wire_error_; }

    class Thread;

  private:
    std::unique_ptr<WireSocket> wire_;
    int wire_error_ = -EHOSTUNREACH;
    std::vector<std::unique_ptr<Thread>> threads_;
    std::unique_ptr<Thread> receiver_;  // the wire's: every packet the socket receives
};

void addCounters(const Counters &c, softnda_counters *out);

// Whether the kernel (or the emulator) implements futex_waitv; probed once.
bool haveFutexWaitv();

// An error moves qp to ERR (any engine thread, in a pass): the first such move raises the fatal
// event (SPEC.md §9; a QP already in ERR, e.g. by modify_qp, raises nothing). True when this call
// made the move.
bool enterQpError(Qp *qp);
// enterQpError, then gets its SQ/RQ flushed by its owner thread.
void setQpError(Device *dev, Qp *qp);

// ---- events (SPEC.md §9; engine.cc) ----
// Doorbell-record words of §1.1, as u32 indexes from dbr_pi.
constexpr unsigned kCqStateWord = 1;          // CQ offset 4: overflow (§6.3)
constexpr unsigned kCqArmWord = 2;            // CQ offset 8
constexpr unsigned kCqEventsWord = 3;         // CQ offset 12
constexpr unsigned kSqFatalEventsWord = 2;    // SQ offset 8
constexpr unsigned kSrqLimitWord = 1;         // SRQ offset 4 (§5.3)
constexpr unsigned kSrqLimitEventsWord = 17;  // SRQ offset 68
constexpr unsigned kSrqTakenWord = 18;        // SRQ offset 72: receives the engine took (§10)
// Engine-private words of the SQ record (SPEC.md §10), in the CI cache line the engine writes.
constexpr unsigned kSqPsnWord = 18;    // SQ offset 72: the requester's next PSN
constexpr unsigned kRqPsnWord = 19;    // SQ offset 76: the responder's expected PSN
constexpr unsigned kQpStateWord = 20;  // SQ offset 80: the QP state (enum ibv_qp_state)
constexpr unsigned kSqExecWord = 21;   // SQ offset 84: 1 + index of the WQE last started
constexpr unsigned kSqQkeyWord = 22;   // SQ offset 88: a UD QP's Q_Key (§11.1)
// An SRQ receive a message arriving over the wire holds (§10, §18): 1 while it does, the
// receive's index in its SRQ, and that SRQ's number when it is an XRC SRQ (an XRC target's).
constexpr unsigned kSqHeldWord = 23;       // SQ offset 92
constexpr unsigned kSqHeldIndexWord = 24;  // SQ offset 96
constexpr unsigned kSqHeldSrqnWord = 25;   // SQ offset 100
// A wire responder's saved atomic results (§18): 1 + the index of each of its two records in
// its context's record file, 0 for none.
constexpr unsigned kSqAtomicRecWord = 26;  // SQ offsets 104 and 108
// CQ arm values: the next completion / the next solicited or error completion.
constexpr uint32_t kCqArmNext = 1;
constexpr uint32_t kCqArmSolicited = 2;
// Adds 1 to an eventfd (nothing for -1). The engine's one system call for events; never blocks
// the engine (a counter at its maximum, EAGAIN, is impossible in practice and ignored).
void signalEventFd(int fd);
// Replaces *slot (Cq::event_fd or Context::async_fd) with a dup of fd, or detaches (fd = -1),
// under dev->gate; the old dup is closed. -EINVAL when fd is not an eventfd, -EBADF for a bad fd.
// Caller holds dev->ctl.
int swapEventFd(Device *dev, int *slot, int fd);

// ---- restart (SPEC.md §10; restart.cc, device.cc) ----
// set_paused: 0 or -ENODEV.
int vdevSetPaused(const char *device, int paused);
int vdevExportObject(ibv_extend_vdev_obj kind, const void *object, ibv_extend_vdev_state *out);
void *vdevImportObject(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in,
                       const ibv_extend_vdev_import *env);
// A context again, over its old BAR (bar_fd, whose page i holds device page page_nos[i]); takes
// bar_fd and async_fd on success. NULL + errno (EBUSY: the device is not paused).
ibv_context *importContext(const char *name, int bar_fd, int async_fd, const uint32_t *page_nos, uint32_t n);
// Whether a device is paused (caller holds dev->ctl or nothing; a hint for import's EBUSY).
inline bool devicePaused(const Device *dev) {
    return dev->paused.load(std::memory_order_acquire);
}

}  // namespace softnda
