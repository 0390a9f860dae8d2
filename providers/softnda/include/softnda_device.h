/*
 * softnda_device.h - device-side helpers for softnda queues.
 *
 * Written only against providers/softnda/SPEC.md and struct queue_info, the way an NPU kernel
 * is written against a NIC's programming manual: post send and receive WQEs into a mapped
 * SQ/RQ/SRQ, ring its doorbell, poll a CQ. Nothing here calls the driver; the functions work
 * in any process that maps the queue memory and the doorbell page (at any address).
 *
 * Threading: one queue handle (softnda_sq, softnda_rq, softnda_cq) belongs to one thread at a
 * time, like a hardware queue's producer. Different handles may be used concurrently, also for
 * queues whose doorbell registers share a page (ring_summary is updated atomically).
 *
 * Header-only, plain C11; compiles on its own in C and C++.
 */
#ifndef SOFTNDA_DEVICE_H
#define SOFTNDA_DEVICE_H

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h> /* struct timespec; clock_gettime where POSIX is visible */
#include <unistd.h>

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

#if !defined(__cplusplus) && !defined(__USE_MISC)
/* Strict ISO C modes hide syscall(); the wake hint and the clocks below need it. */
extern long syscall(long number, ...);
#endif

/* ---- Formats (SPEC.md §2, §3) ------------------------------------------------------ */

enum softnda_opcode {
    SOFTNDA_OP_NOP = 0,
    SOFTNDA_OP_SEND = 1,
    SOFTNDA_OP_SEND_WITH_IMM = 2,
    SOFTNDA_OP_RDMA_WRITE = 3,
    SOFTNDA_OP_RDMA_WRITE_WITH_IMM = 4,
    SOFTNDA_OP_RDMA_READ = 5,
    SOFTNDA_OP_ATOMIC_CMP_AND_SWP = 6,
    SOFTNDA_OP_ATOMIC_FETCH_AND_ADD = 7,
    /* Memory windows (SPEC.md §16) */
    SOFTNDA_OP_BIND_MW = 8,
    SOFTNDA_OP_LOCAL_INV = 9,
    SOFTNDA_OP_SEND_WITH_INV = 10,
};

static inline uint32_t softnda_min_u32(uint32_t a, uint32_t b) {
    return a < b ? a : b;
}

/* The completion opcode (enum ibv_wc_opcode) of a send WQE's opcode: what a CQE for it carries,
 * success or error, flushed ones included (SPEC.md §3). */
static inline uint8_t softnda_send_wc_opcode(uint8_t op) {
    switch (op) {
        case SOFTNDA_OP_RDMA_WRITE:
        case SOFTNDA_OP_RDMA_WRITE_WITH_IMM:
            return IBV_WC_RDMA_WRITE;
        case SOFTNDA_OP_RDMA_READ:
            return IBV_WC_RDMA_READ;
        case SOFTNDA_OP_ATOMIC_CMP_AND_SWP:
            return IBV_WC_COMP_SWAP;
        case SOFTNDA_OP_ATOMIC_FETCH_AND_ADD:
            return IBV_WC_FETCH_ADD;
        case SOFTNDA_OP_BIND_MW:
            return IBV_WC_BIND_MW;
        case SOFTNDA_OP_LOCAL_INV:
            return IBV_WC_LOCAL_INV;
        default:
            return IBV_WC_SEND;
    }
}

enum softnda_wqe_flags {
    SOFTNDA_WQE_SIGNALED = 1 << 0,
    SOFTNDA_WQE_FENCE = 1 << 1,
    SOFTNDA_WQE_INLINE = 1 << 2,
    SOFTNDA_WQE_SOLICITED = 1 << 3,
};

enum softnda_cqe_flags {
    SOFTNDA_CQE_WITH_IMM = 1 << 0,
    SOFTNDA_CQE_SOLICITED = 1 << 1,
    SOFTNDA_CQE_GRH = 1 << 2,      /* a UD receive: its buffer starts with a 40-byte GRH (SPEC.md §11.1) */
    SOFTNDA_CQE_WITH_INV = 1 << 3, /* a SEND_WITH_INV's receive: imm_data is the rkey it invalidated (§16) */
    /* A UD receive on an Ethernet port: the packet was RoCEv2 over IPv4 or IPv6, and its GRH room
     * holds that header (§18). */
    SOFTNDA_CQE_ROCE_IPV4 = 1 << 4,
    SOFTNDA_CQE_ROCE_IPV6 = 1 << 5,
};

/* UD (SPEC.md §11.1): the GRH at the head of every receive buffer, the Q_Key bit that asks for
 * the sending QP's own Q_Key, and where a CQE carries the sender's LID. */
#define SOFTNDA_GRH_SIZE 40u
#define SOFTNDA_QKEY_PRIVILEGED 0x80000000u
#define SOFTNDA_CQE_SLID_SHIFT 16u
/* A UD WQE's rkey field (SPEC.md §2.1): the destination LID in bits 0-15; on an address handle
 * with a GRH, SOFTNDA_UD_GRH and the source GID index in bits 16-23, the destination GID in the
 * compare_add and swap fields (what a RoCE device addresses by, §18). */
#define SOFTNDA_UD_GRH 0x80000000u
#define SOFTNDA_UD_SGID_SHIFT 16u

#define SOFTNDA_WQE_HEADER_SIZE 48u
/* An XRC initiator's send WQE (SPEC.md §14): the XRC segment, u32 remote_srqn then 12 reserved
 * bytes, follows the header, and the data segment starts after it. */
#define SOFTNDA_XRC_SEG_SIZE 16u
#define SOFTNDA_RECV_HEADER_SIZE 16u
#define SOFTNDA_SGE_SIZE 16u
/* The most SGEs and inline bytes one WQE carries, whatever its entry's room (SPEC.md §2). */
#define SOFTNDA_MAX_SGE 29u
#define SOFTNDA_MAX_INLINE 464u

#define SOFTNDA_CQE_SIZE 32u
#define SOFTNDA_CQE_TS_SIZE 64u   /* a CQ with completion timestamps (SPEC.md §15) */
#define SOFTNDA_DBR_CI_OFFSET 64u /* dbr_ci_va - dbr_pi_va inside a doorbell record */
#define SOFTNDA_DB_PAGE_SIZE 4096u
#define SOFTNDA_DB_REGS_OFFSET 512u
#define SOFTNDA_DB_REG_STRIDE 8u
#define SOFTNDA_DB_REGS_PER_PAGE 64u
#define SOFTNDA_DB_WAKE_OFFSET 64u     /* u32 wake_seq */
#define SOFTNDA_DB_SLEEPING_OFFSET 68u /* u32 engine_sleeping */

struct softnda_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct softnda_wqe {
    uint8_t opcode;
    uint8_t flags;
    uint8_t num_sge;
    uint8_t tclass; /* a UD SEND with a GRH: its traffic class (SPEC.md §2.1); 0 otherwise */
    uint32_t imm_data;
    uint64_t wr_id;
    uint64_t remote_addr;
    uint32_t rkey;
    uint32_t inline_len;
    uint64_t compare_add;
    uint64_t swap;
    /* followed by the data segment (SGEs or inline bytes) up to entry_size */
};

struct softnda_recv_wqe {
    uint64_t wr_id;
    uint32_t num_sge;
    uint32_t resv;
    /* followed by num_sge struct softnda_sge */
};

struct softnda_cqe {
    uint64_t wr_id;
    uint32_t byte_len;
    uint32_t imm_data;
    uint32_t qp_num;
    uint32_t src_qp;
    uint8_t opcode; /* enum ibv_wc_opcode values */
    uint8_t status; /* enum ibv_wc_status values */
    uint8_t flags;  /* enum softnda_cqe_flags */
    uint8_t resv;
    uint32_t owner; /* bit0: phase */
};

/* The times of a 64-byte CQE (SPEC.md §15), at offset SOFTNDA_CQE_SIZE of its entry. */
struct softnda_cqe_times {
    uint64_t completion; /* the device clock: CLOCK_MONOTONIC, ns */
    uint64_t wallclock;  /* CLOCK_REALTIME at the same instant, ns since the Epoch */
    uint64_t resv[2];
};

/* ---- Doorbell (SPEC.md §1.2, §4) ------------------------------------------------------ */

struct softnda_doorbell {
    uint32_t *reg;          /* the register (db_hw_va) */
    uint64_t *ring_summary; /* word 0 of its page */
    uint32_t *wake_seq;
    uint32_t *engine_sleeping;
    uint64_t bit; /* 1 << slot */
};

static inline int softnda_doorbell_init(struct softnda_doorbell *db, const struct iov_addr_desc *hw) {
    uintptr_t reg = (uintptr_t)hw->iov_base;
    uintptr_t off = reg & (SOFTNDA_DB_PAGE_SIZE - 1);
    uint8_t *page = (uint8_t *)(reg - off);
    if (reg == 0 || off < SOFTNDA_DB_REGS_OFFSET ||
        (off - SOFTNDA_DB_REGS_OFFSET) % SOFTNDA_DB_REG_STRIDE != 0) {
        return -EINVAL;
    }
    db->reg = (uint32_t *)reg;
    db->ring_summary = (uint64_t *)page;
    db->wake_seq = (uint32_t *)(page + SOFTNDA_DB_WAKE_OFFSET);
    db->engine_sleeping = (uint32_t *)(page + SOFTNDA_DB_SLEEPING_OFFSET);
    db->bit = (uint64_t)1 << ((off - SOFTNDA_DB_REGS_OFFSET) / SOFTNDA_DB_REG_STRIDE);
    return 0;
}

/* Steps 4 and 5 of SPEC.md §4: store the register, mark it in the page summary, and wake a
 * sleeping engine (the only path that may make a system call, and only when it sleeps). */
static inline void softnda_doorbell_ring(const struct softnda_doorbell *db, uint32_t pi) {
    __atomic_store_n(db->reg, pi, __ATOMIC_RELEASE);
    __atomic_fetch_or(db->ring_summary, db->bit, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(db->engine_sleeping, __ATOMIC_SEQ_CST) != 0) {
        __atomic_fetch_add(db->wake_seq, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, db->wake_seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* ---- Send queue -------------------------------------------------------------------- */

struct softnda_sq {
    uint8_t *buf;
    uint32_t entry_cnt;
    uint32_t entry_size;
    uint32_t *dbr_pi;
    uint32_t *dbr_ci;
    uint32_t pi;        /* next index to write (not yet published when > *dbr_pi) */
    uint32_t ci_cached; /* last CI read from the engine */
    uint32_t max_sge;
    uint32_t max_inline;
    struct softnda_doorbell db;
    uint32_t data_offset; /* where a WQE's data segment starts: after the header (and XRC segment) */
};

static inline int softnda_is_pow2(uint32_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

static inline int softnda_sq_init(struct softnda_sq *sq, const struct queue_info *qi) {
    memset(sq, 0, sizeof(*sq));
    if (qi->qbuf.base == 0 || !softnda_is_pow2(qi->qbuf.entry_cnt) ||
        qi->qbuf.entry_size <= SOFTNDA_WQE_HEADER_SIZE || qi->dbr_pi_va.iov_base == NULL ||
        qi->dbr_ci_va.iov_base == NULL) {
        return -EINVAL;
    }
    sq->buf = (uint8_t *)(uintptr_t)qi->qbuf.base;
    sq->entry_cnt = qi->qbuf.entry_cnt;
    sq->entry_size = qi->qbuf.entry_size;
    sq->dbr_pi = (uint32_t *)qi->dbr_pi_va.iov_base;
    sq->dbr_ci = (uint32_t *)qi->dbr_ci_va.iov_base;
    sq->pi = __atomic_load_n(sq->dbr_pi, __ATOMIC_ACQUIRE);
    sq->ci_cached = __atomic_load_n(sq->dbr_ci, __ATOMIC_ACQUIRE);
    sq->data_offset = SOFTNDA_WQE_HEADER_SIZE;
    sq->max_sge =
        softnda_min_u32((sq->entry_size - SOFTNDA_WQE_HEADER_SIZE) / SOFTNDA_SGE_SIZE, SOFTNDA_MAX_SGE);
    sq->max_inline = softnda_min_u32(sq->entry_size - SOFTNDA_WQE_HEADER_SIZE, SOFTNDA_MAX_INLINE);
    return softnda_doorbell_init(&sq->db, &qi->db_hw_va);
}

/* The SQ of an XRC initiator QP (IBV_QPT_XRC_SEND): every WQE carries the XRC segment. */
static inline int softnda_sq_init_xrc(struct softnda_sq *sq, const struct queue_info *qi) {
    int rc = softnda_sq_init(sq, qi);
    if (rc != 0) {
        return rc;
    }
    if (sq->entry_size <= SOFTNDA_WQE_HEADER_SIZE + SOFTNDA_XRC_SEG_SIZE) {
        return -EINVAL;
    }
    sq->data_offset = SOFTNDA_WQE_HEADER_SIZE + SOFTNDA_XRC_SEG_SIZE;
    sq->max_sge = softnda_min_u32((sq->entry_size - sq->data_offset) / SOFTNDA_SGE_SIZE, SOFTNDA_MAX_SGE);
    sq->max_inline = softnda_min_u32(sq->entry_size - sq->data_offset, SOFTNDA_MAX_INLINE);
    return 0;
}

/* Free entries, refreshing the engine's CI only when the cached one says "full". */
static inline uint32_t softnda_sq_space(struct softnda_sq *sq, uint32_t want) {
    uint32_t space = sq->entry_cnt - (sq->pi - sq->ci_cached);
    if (space < want) {
        sq->ci_cached = __atomic_load_n(sq->dbr_ci, __ATOMIC_ACQUIRE);
        space = sq->entry_cnt - (sq->pi - sq->ci_cached);
    }
    return space;
}

/* A work request in the helper's terms (SPEC.md §2.1). */
struct softnda_send_wr {
    uint64_t wr_id;
    uint8_t opcode; /* enum softnda_opcode */
    uint8_t flags;  /* enum softnda_wqe_flags; INLINE is set from inline_data */
    uint32_t imm_data;
    uint64_t remote_addr;
    uint32_t rkey;
    uint64_t compare_add;
    uint64_t swap;
    const struct softnda_sge *sg_list;
    uint32_t num_sge;
    const void *inline_data; /* non-NULL: inline_len bytes are copied into the WQE */
    uint32_t inline_len;
    uint32_t remote_srqn; /* XRC initiator SQs only: the SRQ at the target that takes the message */
    uint8_t tclass;       /* UD with a GRH only: softnda_send_wr_set_ud_route() */
};

/* A UD SEND's destination (SPEC.md §2.1): remote_qpn and remote_qkey in the remote_addr field,
 * the destination LID in the rkey field. */
static inline void softnda_send_wr_set_ud(struct softnda_send_wr *wr, uint32_t remote_qpn,
                                          uint32_t remote_qkey, uint16_t dlid) {
    wr->remote_addr = (uint64_t)(remote_qpn & 0xffffffu) | ((uint64_t)remote_qkey << 32);
    wr->rkey = dlid;
}

/* A UD SEND's GRH (SPEC.md §2.1): the address handle's source GID index and destination GID,
 * after softnda_send_wr_set_ud. */
static inline void softnda_send_wr_set_ud_grh(struct softnda_send_wr *wr, uint8_t sgid_index,
                                              const uint8_t dgid[16]) {
    wr->rkey |= SOFTNDA_UD_GRH | ((uint32_t)sgid_index << SOFTNDA_UD_SGID_SHIFT);
    memcpy(&wr->compare_add, dgid, 8);
    memcpy(&wr->swap, dgid + 8, 8);
}

/* A UD SEND's GRH routing (SPEC.md §2.1): the address handle's traffic class and hop limit,
 * which a RoCE device writes into the packet's IP header (§18), after softnda_send_wr_set_ud_grh.
 * The hop limit goes in bits 24-31 of the remote_qpn word, the traffic class in the WQE's tclass
 * byte; a WQE without them (0) sends with TOS 0 and the host's default TTL. */
static inline void softnda_send_wr_set_ud_route(struct softnda_send_wr *wr, uint8_t traffic_class,
                                                uint8_t hop_limit) {
    wr->remote_addr = (wr->remote_addr & ~(uint64_t)0xff000000u) | ((uint64_t)hop_limit << 24);
    wr->tclass = traffic_class;
}

/* A BIND_MW's fields (SPEC.md §16): the window named by its current rkey mw_rkey takes the new
 * rkey new_rkey (same index, the consumer's key byte) over [addr, addr+length) of the MR with
 * lkey (lkey 0 and length 0: unbind a type 1 window), with access (IBV_ACCESS_REMOTE_*). */
static inline void softnda_send_wr_set_bind(struct softnda_send_wr *wr, uint32_t mw_rkey, uint32_t new_rkey,
                                            uint32_t lkey, uint64_t addr, uint64_t length, uint32_t access) {
    wr->opcode = SOFTNDA_OP_BIND_MW;
    wr->imm_data = access;
    wr->remote_addr = addr;
    wr->rkey = new_rkey;
    wr->compare_add = length;
    wr->swap = (uint64_t)mw_rkey | ((uint64_t)lkey << 32);
    wr->num_sge = 0;
    wr->inline_data = NULL;
}

/* Writes one WQE without publishing it: -ENOSPC when the SQ is full, -EINVAL when it does not
 * fit a WQE. Publish with softnda_sq_doorbell() (one doorbell may cover many WQEs). */
static inline int softnda_sq_post(struct softnda_sq *sq, const struct softnda_send_wr *wr) {
    if (softnda_sq_space(sq, 1) == 0) {
        return -ENOSPC;
    }
    uint8_t *slot = sq->buf + (size_t)(sq->pi & (sq->entry_cnt - 1)) * sq->entry_size;
    struct softnda_wqe *w = (struct softnda_wqe *)slot;
    uint8_t flags = wr->flags;
    if (wr->inline_data != NULL) {
        if (wr->inline_len > sq->max_inline) {
            return -EINVAL;
        }
        memcpy(slot + sq->data_offset, wr->inline_data, wr->inline_len);
        flags |= SOFTNDA_WQE_INLINE;
        w->num_sge = 0;
        w->inline_len = wr->inline_len;
    } else {
        if (wr->num_sge > sq->max_sge) {
            return -EINVAL;
        }
        if (wr->num_sge > 0) {
            memcpy(slot + sq->data_offset, wr->sg_list, (size_t)wr->num_sge * SOFTNDA_SGE_SIZE);
        }
        flags &= (uint8_t)~SOFTNDA_WQE_INLINE;
        w->num_sge = (uint8_t)wr->num_sge;
        w->inline_len = 0;
    }
    w->opcode = wr->opcode;
    w->flags = flags;
    w->tclass = wr->tclass;
    w->imm_data = wr->imm_data;
    w->wr_id = wr->wr_id;
    w->remote_addr = wr->remote_addr;
    w->rkey = wr->rkey;
    w->compare_add = wr->compare_add;
    w->swap = wr->swap;
    if (sq->data_offset > SOFTNDA_WQE_HEADER_SIZE) {
        uint32_t srqn = wr->remote_srqn & 0xffffffu;
        memcpy(slot + SOFTNDA_WQE_HEADER_SIZE, &srqn, sizeof(srqn));
    }
    sq->pi++;
    return 0;
}

/* Publishes every WQE written since the last doorbell and rings (SPEC.md §4 steps 3-5). */
static inline void softnda_sq_doorbell(struct softnda_sq *sq) {
    __atomic_store_n(sq->dbr_pi, sq->pi, __ATOMIC_RELEASE);
    softnda_doorbell_ring(&sq->db, sq->pi);
}

/* ---- Receive queues (RQ and SRQ) --------------------------------------------------- */

struct softnda_rq {
    uint8_t *buf;
    uint32_t entry_cnt;
    uint32_t entry_size;
    uint32_t *dbr_pi;
    uint32_t *dbr_ci;
    uint32_t pi;
    uint32_t ci_cached;
    uint32_t max_sge;
    struct softnda_doorbell db;
};

static inline int softnda_rq_init(struct softnda_rq *rq, const struct queue_info *qi) {
    memset(rq, 0, sizeof(*rq));
    if (qi->qbuf.base == 0 || !softnda_is_pow2(qi->qbuf.entry_cnt) ||
        qi->qbuf.entry_size < SOFTNDA_RECV_HEADER_SIZE + SOFTNDA_SGE_SIZE || qi->dbr_pi_va.iov_base == NULL ||
        qi->dbr_ci_va.iov_base == NULL) {
        return -EINVAL;
    }
    rq->buf = (uint8_t *)(uintptr_t)qi->qbuf.base;
    rq->entry_cnt = qi->qbuf.entry_cnt;
    rq->entry_size = qi->qbuf.entry_size;
    rq->dbr_pi = (uint32_t *)qi->dbr_pi_va.iov_base;
    rq->dbr_ci = (uint32_t *)qi->dbr_ci_va.iov_base;
    rq->pi = __atomic_load_n(rq->dbr_pi, __ATOMIC_ACQUIRE);
    rq->ci_cached = __atomic_load_n(rq->dbr_ci, __ATOMIC_ACQUIRE);
    rq->max_sge =
        softnda_min_u32((rq->entry_size - SOFTNDA_RECV_HEADER_SIZE) / SOFTNDA_SGE_SIZE, SOFTNDA_MAX_SGE);
    return softnda_doorbell_init(&rq->db, &qi->db_hw_va);
}

static inline int softnda_rq_post(struct softnda_rq *rq, uint64_t wr_id, const struct softnda_sge *sg_list,
                                  uint32_t num_sge) {
    if (num_sge > rq->max_sge) {
        return -EINVAL;
    }
    if (rq->entry_cnt - (rq->pi - rq->ci_cached) == 0) {
        rq->ci_cached = __atomic_load_n(rq->dbr_ci, __ATOMIC_ACQUIRE);
        if (rq->entry_cnt - (rq->pi - rq->ci_cached) == 0) {
            return -ENOSPC;
        }
    }
    uint8_t *slot = rq->buf + (size_t)(rq->pi & (rq->entry_cnt - 1)) * rq->entry_size;
    struct softnda_recv_wqe *w = (struct softnda_recv_wqe *)slot;
    w->wr_id = wr_id;
    w->num_sge = num_sge;
    w->resv = 0;
    if (num_sge > 0) {
        memcpy(slot + SOFTNDA_RECV_HEADER_SIZE, sg_list, (size_t)num_sge * SOFTNDA_SGE_SIZE);
    }
    rq->pi++;
    return 0;
}

static inline void softnda_rq_doorbell(struct softnda_rq *rq) {
    __atomic_store_n(rq->dbr_pi, rq->pi, __ATOMIC_RELEASE);
    softnda_doorbell_ring(&rq->db, rq->pi);
}

/* SRQ limit (SPEC.md §5.3): arm with a non-zero limit; read how many events fired. */
static inline void softnda_srq_arm(struct softnda_rq *srq, uint32_t limit) {
    __atomic_store_n(srq->dbr_pi + 1, limit, __ATOMIC_RELEASE);
}
static inline uint32_t softnda_srq_limit(const struct softnda_rq *srq) {
    return __atomic_load_n(srq->dbr_pi + 1, __ATOMIC_ACQUIRE);
}
static inline uint32_t softnda_srq_limit_events(const struct softnda_rq *srq) {
    return __atomic_load_n(srq->dbr_ci + 1, __ATOMIC_ACQUIRE);
}

/* ---- Completion queue ---------------------------------------------------------------- */

struct softnda_cq {
    uint8_t *buf;
    uint32_t entry_cnt;
    uint32_t log_cnt;
    uint32_t entry_size; /* SOFTNDA_CQE_SIZE, or SOFTNDA_CQE_TS_SIZE with timestamps */
    uint32_t *dbr_pi;    /* engine's PI; word 1 is the CQ state */
    uint32_t *dbr_ci;
    uint32_t ci;
};

static inline int softnda_cq_init(struct softnda_cq *cq, const struct queue_info *qi) {
    memset(cq, 0, sizeof(*cq));
    if (qi->qbuf.base == 0 || !softnda_is_pow2(qi->qbuf.entry_cnt) ||
        (qi->qbuf.entry_size != SOFTNDA_CQE_SIZE && qi->qbuf.entry_size != SOFTNDA_CQE_TS_SIZE) ||
        qi->dbr_pi_va.iov_base == NULL || qi->dbr_ci_va.iov_base == NULL) {
        return -EINVAL;
    }
    cq->buf = (uint8_t *)(uintptr_t)qi->qbuf.base;
    cq->entry_cnt = qi->qbuf.entry_cnt;
    cq->entry_size = qi->qbuf.entry_size;
    while ((1u << cq->log_cnt) < cq->entry_cnt) {
        cq->log_cnt++;
    }
    cq->dbr_pi = (uint32_t *)qi->dbr_pi_va.iov_base;
    cq->dbr_ci = (uint32_t *)qi->dbr_ci_va.iov_base;
    cq->ci = __atomic_load_n(cq->dbr_ci, __ATOMIC_ACQUIRE);
    return 0;
}

/* The sender's LID of a UD receive's CQE (SPEC.md §3; 0 for every other CQE). */
static inline uint16_t softnda_cqe_slid(const struct softnda_cqe *c) {
    return (uint16_t)(c->owner >> SOFTNDA_CQE_SLID_SHIFT);
}

/* Non-zero once the CQ overflowed (SPEC.md §6.3). */
static inline uint32_t softnda_cq_state(const struct softnda_cq *cq) {
    return __atomic_load_n(cq->dbr_pi + 1, __ATOMIC_ACQUIRE);
}

/* Copies up to max valid CQEs out, and with times != NULL each one's times (zeros on a CQ of
 * 32-byte entries), and returns their slots to the engine. Returns the number polled (0 when
 * none) or -EOVERFLOW when nothing is left and the CQ is in the error state. */
static inline int softnda_cq_poll_times(struct softnda_cq *cq, struct softnda_cqe *out,
                                        struct softnda_cqe_times *times, int max) {
    int n = 0;
    while (n < max) {
        const uint8_t *slot = cq->buf + (size_t)(cq->ci & (cq->entry_cnt - 1)) * cq->entry_size;
        const struct softnda_cqe *e = (const struct softnda_cqe *)slot;
        uint32_t want = ((cq->ci >> cq->log_cnt) & 1u) ^ 1u;
        if ((__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) & 1u) != want) {
            break;
        }
        out[n] = *e;
        if (times != NULL) {
            if (cq->entry_size == SOFTNDA_CQE_TS_SIZE) {
                memcpy(&times[n], slot + SOFTNDA_CQE_SIZE, sizeof(times[n]));
            } else {
                memset(&times[n], 0, sizeof(times[n]));
            }
        }
        n++;
        cq->ci++;
    }
    if (n > 0) {
        __atomic_store_n(cq->dbr_ci, cq->ci, __ATOMIC_RELEASE);
        return n;
    }
    return softnda_cq_state(cq) != 0 ? -EOVERFLOW : 0;
}

/* The clocks of SPEC.md §15, by their Linux clock ids (what CLOCK_MONOTONIC and CLOCK_REALTIME
 * are; strict ISO C modes do not declare those names). */
#define SOFTNDA_CLOCK_DEVICE 1 /* CLOCK_MONOTONIC */
#define SOFTNDA_CLOCK_WALL 0   /* CLOCK_REALTIME */

/* A clock's value now, in ns. With POSIX's clocks declared, clock_gettime (the vDSO: no system
 * call); in strict ISO C modes, the system call itself. */
static inline uint64_t softnda_clock_ns(int id) {
    struct timespec ts;
#ifdef CLOCK_MONOTONIC
    clock_gettime((clockid_t)id, &ts);
#else
    syscall(SYS_clock_gettime, id, &ts);
#endif
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The device clock and the wall clock now, as a CQE carries them (SPEC.md §15). */
static inline void softnda_cqe_times_now(struct softnda_cqe_times *t) {
    t->completion = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    t->wallclock = softnda_clock_ns(SOFTNDA_CLOCK_WALL);
    t->resv[0] = 0;
    t->resv[1] = 0;
}

/* softnda_cq_poll_times without the times. */
static inline int softnda_cq_poll(struct softnda_cq *cq, struct softnda_cqe *out, int max) {
    return softnda_cq_poll_times(cq, out, NULL, max);
}

#ifdef __cplusplus
}
#endif

#endif /* SOFTNDA_DEVICE_H */
