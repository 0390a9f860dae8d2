// The engine's inside, shared by its two halves: engine.cc (doorbells, the SQ loop, and the
// same-host transport through shared memory) and wire.cc (RoCEv2 to other hosts, SPEC.md §18).
// Private to the engine's files.
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {

inline constexpr uint32_t kPsnMask = 0xffffff;

inline uint64_t nowNs() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// A WQE copied out of the ring once, so a concurrent rewrite by software cannot change it
// between validation and use.
struct WqeCopy {
    softnda_wqe hdr;
    uint32_t xrc_srqn;  // an XRC initiator's WQE: the SRQ it names at the target
    softnda_sge sge[kEngineMaxSge];
    uint8_t inline_data[kEngineMaxInline];
};

// RnrWait: the responder had no receive (an RNR NAK); PeerWait: no responder answered (the
// destination QP does not exist or is not ready), which a real NIC retries until its transport
// retry counter runs out; Partial: a chunk of a large message moved, the rest on later visits.
// All keep the WQE at the head of its SQ.
enum class Outcome { Done, RnrWait, PeerWait, Partial };

struct ExecResult {
    uint8_t status = IBV_WC_SUCCESS;
    uint32_t byte_len = 0;
    Outcome outcome = Outcome::Done;
};

// A successful receive completion the responder writes only after the request's commit point
// (SPEC.md §10), so a request that dies before it leaves no receive completed.
struct PendingRecv {
    bool set = false;
    RecvCopy r;
    uint32_t byte_len;
    uint8_t opcode;
    uint32_t imm;
    uint8_t flags;
};

// A gather/scatter list already checked against its MRs.
struct Segment {
    uint8_t *addr;
    uint32_t len;
};

// A UD datagram on its way into a receive (SPEC.md §11.1): the GRH the receive gets first, the
// payload, and what its completion says.
struct Datagram {
    const uint8_t *grh;  // SOFTNDA_GRH_SIZE bytes
    const Segment *payload;
    uint32_t nseg;
    uint64_t len;
    uint32_t qkey, src_qp;
    uint16_t slid;
    bool imm, solicited;
    uint32_t imm_data;    // as the WQE and CQE carry it (SPEC.md §2.1)
    uint8_t roce_l3 = 0;  // SOFTNDA_CQE_ROCE_IPV4 or _IPV6 for a RoCEv2 GRH (§18), else 0
};

// Who takes a request at the responder: the responder QP (its state, PSNs, rq_lock and access
// flags), where the receive comes from and completes, and the PD its rkeys and receive lkeys
// must belong to. For most QPs that is the QP's own SRQ or RQ, CQ and PD; at an XRC target it is
// the XRC SRQ the request names, with that SRQ's CQ and PD (SPEC.md §14).
struct Responder {
    Qp *qp;
    Srq *srq;
    Cq *rcq;
    Pd *pd;
};
inline Responder responderOf(Qp *qp) {
    return Responder{qp, qp->srq, qp->rcq, qp->pd};
}

// What the engine's two halves both use (engine.cc).
uint64_t rnrTimerNs(uint8_t min_rnr_timer);
bool isAtomic(uint8_t opcode);
uint8_t *checkRkey(const Device *dev, const Responder &rp, const softnda_wqe &h, uint64_t total,
                   uint8_t *status);
bool writeCqe(Cq *cq, Counters &ctr, const softnda_cqe &in);
void fetchWqe(const Qp &qp, WqeCopy *w);
// The receive in ring's slot index (at most cap SGEs of it), into out.
void readRecvSlot(const Ring &ring, uint32_t index, uint32_t cap, RecvCopy *out);
void fetchWqeAt(const Qp &qp, uint32_t index, WqeCopy *w);
uint64_t wqeBytes(const WqeCopy &w);

class Engine::Thread {
  public:
    // An engine thread (receiver false), which sends through wire when the device has one; or the
    // device's wire thread, which receives every packet of wire (SPEC.md §18).
    Thread(Device *dev, Engine *engine, uint32_t id, WireSocket *wire, bool receiver)
        : dev_(dev), engine_(engine), wire_(wire), receiver_(receiver) {
        thread_ = std::thread([this] { receiver_ ? runWire() : run(); });
        // Named, so operators (top -H) and tools (a benchmark raising the emulated NIC's
        // priority) can tell the engine from the host process's own threads.
        char name[16];
        if (receiver) {
            snprintf(name, sizeof(name), "softnda-wire%u", id % 1000);
        } else {
            snprintf(name, sizeof(name), "softnda-eng%u", id % 1000);
        }
        pthread_setname_np(thread_.native_handle(), name);
    }
    ~Thread() {
        stop_.store(true, std::memory_order_release);
        kick();
        thread_.join();
    }

    void addPage(DbPage *p) { pages_.push_back(p); }
    void removePage(DbPage *p) {
        pages_.erase(std::remove(pages_.begin(), pages_.end(), p), pages_.end());
        hot_.erase(std::remove(hot_.begin(), hot_.end(), p), hot_.end());
    }
    void forgetQp(Qp *qp) { rnr_.erase(std::remove(rnr_.begin(), rnr_.end(), qp), rnr_.end()); }
    void kick() {
        __atomic_fetch_add(&kick_word_, 1u, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &kick_word_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
    const Counters &counters() const { return ctr_; }
    void resume() {
        rescan_.store(true, std::memory_order_release);
        kick();
    }

  private:
    void run();
    bool pass();
    bool handleSlot(DbPage *page, unsigned slot);
    bool takeRings(DbPage *page);
    bool processSq(Qp *qp);
    bool yieldToOthers() const;
    bool keepWaitingRnr(Qp *qp);
    bool keepWaitingForPeer(Qp *qp);
    void startWait(Qp *qp, bool for_peer, uint64_t deadline_ns);
    void endRnrWait(Qp *qp);
    bool completeWqe(Qp *qp, const softnda_wqe &h, const ExecResult &res);
    void flushQp(Qp *qp, uint32_t pi);
    void settle(Qp *qp, uint32_t pi);
    void waitWhilePaused();
    ExecResult execute(Qp *qp, const WqeCopy &w);
    ExecResult sendDatagram(Qp *qp, const softnda_wqe &h, const Segment *local, uint32_t nlocal,
                            uint64_t total);
    void deliverDatagram(const Datagram &d, Qp *peer);
    ExecResult sendUnconnected(Qp *qp, const WqeCopy &w, const Segment *local, uint32_t nlocal,
                               uint64_t total);
    void commit(Qp *qp, const Responder &peer, const PendingRecv &pending);
    ExecResult xrcTarget(Qp *tgt, uint32_t srqn, Responder *out);
    void retireHead(Qp *qp);
    uint8_t deliverInto(const Responder &peer, const RecvCopy &r, const Segment *src, uint32_t nsrc,
                        uint64_t total, uint32_t src_qpn, Segment *dst);
    ExecResult respond(Qp *qp, const Responder &peer, const WqeCopy &w, const Segment *local, uint32_t nlocal,
                       uint64_t total, PendingRecv *pending);
    ExecResult respondInChunks(Qp *qp, const Responder &peer, const softnda_wqe &h, const Segment *local,
                               uint32_t nlocal, uint64_t total, PendingRecv *pending);
    ExecResult startChunked(Qp *qp, const Responder &peer, const softnda_wqe &h, uint64_t total);
    void abandonChunked(Qp *qp);
    void endChunkedHere(Qp *qp, const Responder &peer);
    uint8_t recvTarget(const Responder &peer, const RecvCopy &r, uint64_t total, Segment *dst);
    ExecResult responderError(Qp *peer, uint8_t status);
    ExecResult writeDataIn(const Responder &peer, const softnda_wqe &h, uint8_t *remote, const Segment *local,
                           uint32_t nlocal, uint64_t total, PendingRecv *pending);
    ExecResult readReply(const uint8_t *remote, const Segment *local, uint32_t nlocal, uint64_t total);
    ExecResult atomicReply(const softnda_wqe &h, uint8_t *remote, const Segment *local, uint32_t nlocal);
    ExecResult sendDataIn(Qp *qp, const Responder &peer, const softnda_wqe &h, const Segment *local,
                          uint32_t nlocal, uint64_t total, PendingRecv *pending);
    // The next receive of the responder's RQ or SRQ; hold: an SRQ's stays held (Srq::held) until
    // releaseSrqRecv, for a message the wire has not brought whole.
    bool takeRecv(const Responder &peer, RecvCopy *out, bool hold = false);
    void completeRecv(const Responder &peer, const RecvCopy &r, uint8_t status, uint32_t byte_len,
                      uint8_t opcode, uint32_t imm, uint8_t flags, uint32_t src, uint16_t slid = 0);
    // wire.cc: RC to another host over RoCEv2 (SPEC.md §18)
    uint8_t gatherLocal(Qp *qp, const WqeCopy &w, Segment *local, uint32_t *nlocal, uint64_t *total);
    bool wireProcessSq(Qp *qp, uint32_t pi);
    bool wireRetire(Qp *qp, WireQp &wq);
    bool wireStart(Qp *qp, WireQp &wq, uint32_t pi);
    void wireTransmit(Qp *qp, WireQp &wq, const WireMsg &m, uint32_t from_psn);
    void runWire();
    void wireFrame(const WireFrame &f);
    ExecResult roceDatagram(Qp *qp, const softnda_wqe &h, const Segment *local, uint32_t nlocal,
                            uint64_t total, uint32_t qkey, uint32_t dest_qpn);
    void wireDatagram(const WireFrame &f, const roce::Packet &p);
    ExecResult wireUnconnected(Qp *qp, uint64_t total);
    void wireReply(Qp *qp, WireQp &wq, const roce::Packet &p);
    void wireRequest(Qp *qp, WireQp &wq, const roce::Packet &p, bool uc);
    void wireDuplicate(Qp *qp, WireQp &wq, const roce::Packet &p);
    bool wireRead(Qp *qp, WireQp &wq, const roce::Packet &p, const Responder &rp, uint32_t *n);
    void wireAck(const WireQp &wq, uint32_t dest_qpn, uint8_t syndrome, uint32_t psn);
    void wireAtomicAck(const WireQp &wq, uint32_t dest_qpn, uint32_t psn, uint64_t orig);
    void flushSq(Qp *qp, uint32_t pi);
    void flushRq(Qp *qp);
    bool overflowed(Qp *qp, Ring &ring, uint32_t pi);
    Qp *peerOf(Qp *qp);
    bool checkLocal(const Pd *pd, const softnda_sge *sges, uint32_t n, bool need_write, Segment *out);
    // True when the wait timed out: nobody rang a hint or kicked the engine.
    bool sleep();
    void sweep();
    void touchHot(DbPage *p);

    Device *dev_;
    Engine *engine_;
    WireSocket *wire_;
    bool receiver_;
    std::vector<uint8_t> tx_buf_;  // the payloads of the packets one send batch carries
    std::thread thread_;
    std::atomic<bool> stop_{false};
    uint32_t kick_word_ = 0;
    std::vector<DbPage *> pages_;  // gate (exclusive to change, shared to read)
    std::vector<DbPage *> hot_;    // most recently rung pages first, at most kMaxSleepPages
    std::vector<Qp *> rnr_;        // QPs whose head WQE waits for a receive or for its responder
    uint64_t pass_no_ = 0;
    bool full_scan_due_ = true;
    std::atomic<bool> rescan_{false};  // set by resume(): full scan and sweep first
    Counters ctr_;
};

}  // namespace softnda
