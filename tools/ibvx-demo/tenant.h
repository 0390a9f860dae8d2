// One tenant of the brokered demo (and of the client integration tests): a context, PD, CQ, RC QP
// and a registered buffer created through libibv_extend.so, and the data path driven through the
// softnda device-side helpers on the mapped queues only (no broker call after connect()).
//
// Threading: a Tenant is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>
#include <softnda_device.h>

namespace ibvx::demo {

// What a peer needs to reach this tenant's QP and buffer (sent over a pipe or socket).
struct PeerInfo {
    uint32_t qp_num;
    uint32_t rkey;
    uint64_t addr;    // the buffer's address in its owner's process (= the MR's iova)
    uint64_t length;  // bytes
};

class Tenant {
  public:
    Tenant() = default;
    Tenant(const Tenant &) = delete;
    Tenant &operator=(const Tenant &) = delete;
    ~Tenant() { tearDown(); }

    // Opens `device` and creates PD, CQ, QP and an MR over a buffer of `buf_size` bytes.
    // 0 or a negative errno; error() says which step failed.
    int setUp(const char *device, size_t buf_size);
    // RESET -> INIT -> RTR (to peer.qp_num) -> RTS through ibvx_modify_qp().
    int connect(const PeerInfo &peer);
    // Destroys everything setUp() created; the first failing call's negative errno, or 0.
    int tearDown();

    PeerInfo local() const;
    uint8_t *buf() const { return buf_; }
    size_t bufSize() const { return buf_size_; }
    // Objects created through the broker (context, PD, CQ, QP, MR).
    int objects() const { return 5; }
    const std::string &error() const { return error_; }
    ibv_qp *qp() const { return qp_ != nullptr ? qp_->qp : nullptr; }

    // ---- fast path: loads and stores on the mapped queues, nothing else ----
    // One signaled WQE, waited for. Returns the CQE status (0 = IBV_WC_SUCCESS), -ENOSPC when the
    // SQ is full, -ETIMEDOUT when no completion came within timeout_ms.
    int write(const PeerInfo &peer, size_t local_off, size_t remote_off, uint32_t len, int timeout_ms = 5000);
    int read(const PeerInfo &peer, size_t local_off, size_t remote_off, uint32_t len, int timeout_ms = 5000);
    int send(size_t local_off, uint32_t len, int timeout_ms = 5000);
    // Posts one receive of [off, off+len) without waiting.
    int postRecv(size_t off, uint32_t len, uint64_t wr_id);
    // Waits for the next completion not consumed by a send-side call (a QP connected to itself
    // sees its receive completions interleaved with its own); fills *cqe. 0, or -ETIMEDOUT /
    // -EOVERFLOW.
    int waitCompletion(softnda_cqe *cqe, int timeout_ms = 5000);

  private:
    int fail(int rc, const char *step);
    int postAndWait(uint8_t opcode, const PeerInfo *peer, size_t local_off, size_t remote_off, uint32_t len,
                    int timeout_ms);

    ibv_context_extend *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
    ibv_cq_extend *cq_ = nullptr;
    ibv_qp_extend *qp_ = nullptr;
    ibv_mr *mr_ = nullptr;
    uint8_t *buf_ = nullptr;
    size_t buf_size_ = 0;
    softnda_sq sq_{};
    softnda_rq rq_{};
    softnda_cq cqh_{};
    int pollOne(softnda_cqe *cqe, int timeout_ms);

    uint64_t next_wr_id_ = 1;
    std::deque<softnda_cqe> stash_;  // completions polled while waiting for another one
    std::string error_;
};

// Deterministic bytes for a (seed, offset): what a sender writes and a receiver checks.
void fillPattern(uint8_t *p, size_t n, uint32_t seed);
// Offset of the first byte that differs from the pattern, or n when all match.
size_t checkPattern(const uint8_t *p, size_t n, uint32_t seed);

}  // namespace ibvx::demo
