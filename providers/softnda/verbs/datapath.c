/*
 * datapath.c - softnda's standard-verbs data path (include/ibv_extend_datapath.h), run in the
 * tenant's process. ibv_send_wr / ibv_recv_wr become SPEC.md §2 WQEs through the device-side
 * helpers of softnda_device.h, and CQEs (§3) become ibv_wc. Nothing here calls the driver or the
 * kernel: a doorbell is a store, and softnda_doorbell_ring makes its futex wake only while the
 * engine sleeps (§4 step 5, §7), so a work request costs no system call.
 *
 * Locking, as rdma-core's mlx5 and rxe providers do it: a QP has one spinlock for its SQ and one
 * for its RQ, an SRQ and a CQ one each; the lock guards the softnda_sq / softnda_rq / softnda_cq
 * handle (the helpers' producer state) and is held while one chain is written or CQEs are taken.
 * A spinlock, not a mutex, because a contended mutex would make the futex system call this path
 * promises not to make. CQ arming and the event counters (§9) are single atomic words: no lock.
 *
 * Conventions are the libibverbs ones: post_* return 0 or an errno and set *bad_wr to the first
 * work request not posted; the work requests before it are posted and rung.
 *
 * When the device is gone for good (the appended qp_fatal, cq_fatal, srq_fatal; a broker session
 * that ended), this library plays the device's last part itself: it writes the WR_FLUSH_ERR CQEs the
 * engine would have written for a QP in ERR (SPEC.md §6.2, the CQE publication order of §4), under
 * the same locks the tenant's post and poll take, and refuses every later post.
 */
/* Spinlocks, posix_memalign and the endian.h conversions are POSIX/BSD: visible in strict C too. */
#define _DEFAULT_SOURCE

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ibv_extend_datapath.h>

#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_verbs.h"

/* An ibv_sge is a SPEC.md §2 SGE bit for bit, so a work request's SGE list is copied into the
 * WQE as it is. */
_Static_assert(sizeof(struct ibv_sge) == sizeof(struct softnda_sge), "SGE size");
_Static_assert(offsetof(struct ibv_sge, addr) == offsetof(struct softnda_sge, addr), "SGE addr");
_Static_assert(offsetof(struct ibv_sge, length) == offsetof(struct softnda_sge, length), "SGE length");
_Static_assert(offsetof(struct ibv_sge, lkey) == offsetof(struct softnda_sge, lkey), "SGE lkey");

/* The largest send WQE is 512 bytes (SPEC.md §2.1), so inline data never exceeds this. */
#define SD_MAX_INLINE (512u - SOFTNDA_WQE_HEADER_SIZE)
/* CQEs taken from the ring per softnda_cq_poll call. */
#define SD_POLL_BATCH 16
#define SD_CACHE_LINE 64

/* Words of the doorbell records beyond the helpers' (SPEC.md §1.1), as offsets in u32. */
#define SD_CQ_ARM_WORD 2          /* CQ record offset 8 */
#define SD_CQ_EVENTS_WORD 3       /* CQ record offset 12 */
#define SD_SQ_FATAL_EVENTS_WORD 2 /* SQ record offset 8 */

/* §9 arm values. */
#define SD_ARM_NEXT 1u
#define SD_ARM_SOLICITED 2u

struct sd_cq {
    pthread_spinlock_t lock;
    struct softnda_cq cq; /* guarded by lock */
    /* Into the record: moved by cq_resize, so read with an atomic load of the pointer. */
    uint32_t *arm;
    uint32_t *events; /* written here only once the device is gone (cq_fatal) */
    int fatal;        /* 0, or the errno req_notify_cq answers (atomic: against arming) */
};

struct sd_recv_queue {
    _Alignas(SD_CACHE_LINE) pthread_spinlock_t lock;
    struct softnda_rq rq; /* guarded by lock */
    uint32_t max_wr;
    uint32_t max_sge;
    int fatal; /* guarded by lock: 0, or the errno every post answers once the device is gone */
};

struct sd_qp {
    /* The SQ and the RQ are posted from different threads: each on cache lines of its own. */
    _Alignas(SD_CACHE_LINE) pthread_spinlock_t sq_lock;
    struct softnda_sq sq; /* guarded by sq_lock */
    uint32_t max_send_wr;
    uint32_t max_send_sge;
    uint32_t max_inline;
    int sq_sig_all;
    int sq_fatal; /* guarded by sq_lock: 0, or the errno every post answers once the device is gone */
    enum ibv_qp_type qp_type;
    uint8_t max_opcode; /* the last SPEC.md §2.1 opcode the transport executes */
    uint32_t qp_num;
    const uint32_t *fatal_events;
    int has_rq; /* 0 with an SRQ: post_recv is then EINVAL */
    struct sd_recv_queue rq;
};

struct sd_srq {
    struct sd_recv_queue rq;
};

static uint32_t min_u32(uint32_t a, uint32_t b) {
    return a < b ? a : b;
}

static void *alloc_state(size_t size) {
    void *p = NULL;
    if (posix_memalign(&p, SD_CACHE_LINE, size) != 0) {
        errno = ENOMEM;
        return NULL;
    }
    memset(p, 0, size);
    return p;
}

/* "Full" counts every WQE written and not finished, those of the chain being posted included.
 * The engine's CI is read again only when the cached one says full (softnda_sq_space does the
 * same for the ring). */
static int queue_full(uint32_t pi, uint32_t *ci_cached, const uint32_t *dbr_ci, uint32_t max_wr) {
    if (pi - *ci_cached < max_wr) {
        return 0;
    }
    *ci_cached = __atomic_load_n(dbr_ci, __ATOMIC_ACQUIRE);
    return pi - *ci_cached >= max_wr;
}

/* ---- CQ -------------------------------------------------------------------------------- */

static void *sd_cq_open(const struct ibv_cq_extend *ext, int cqe) {
    if (ext == NULL || cqe < 0) {
        errno = EINVAL;
        return NULL;
    }
    struct softnda_cq probe;
    struct softnda_doorbell db;
    /* A softnda CQ has 32-byte CQEs, or 64 with timestamps (§15), and a register in a doorbell
     * page (§1.2). */
    if (softnda_cq_init(&probe, &ext->cq_info) != 0 ||
        softnda_doorbell_init(&db, &ext->cq_info.db_hw_va) != 0) {
        errno = EINVAL;
        return NULL;
    }
    struct sd_cq *cq = alloc_state(sizeof(*cq));
    if (cq == NULL) {
        return NULL;
    }
    cq->cq = probe;
    cq->arm = cq->cq.dbr_pi + SD_CQ_ARM_WORD;
    cq->events = cq->cq.dbr_pi + SD_CQ_EVENTS_WORD;
    pthread_spin_init(&cq->lock, PTHREAD_PROCESS_PRIVATE);
    return cq;
}

static void sd_cq_close(void *cqv) {
    struct sd_cq *cq = cqv;
    if (cq != NULL) {
        pthread_spin_destroy(&cq->lock);
        free(cq);
    }
}

static void cqe_to_wc(const struct softnda_cqe *c, struct ibv_wc *wc) {
    wc->wr_id = c->wr_id;
    wc->status = (enum ibv_wc_status)c->status;
    wc->opcode = (enum ibv_wc_opcode)c->opcode;
    wc->vendor_err = 0;
    wc->byte_len = c->byte_len;
    if ((c->flags & SOFTNDA_CQE_WITH_IMM) != 0) {
        /* The CQE carries the immediate as the number the sender meant (§3, little-endian like
         * every field); ibv_wc carries it in network order. */
        wc->imm_data = htobe32(c->imm_data);
        wc->wc_flags = IBV_WC_WITH_IMM;
    } else if ((c->flags & SOFTNDA_CQE_WITH_INV) != 0) {
        /* The rkey a SEND_WITH_INV invalidated (§16), in host order as libibverbs reports it. */
        wc->invalidated_rkey = c->imm_data;
        wc->wc_flags = IBV_WC_WITH_INV;
    } else {
        wc->imm_data = 0;
        wc->wc_flags = 0;
    }
    wc->qp_num = c->qp_num;
    wc->src_qp = c->src_qp;
    /* A UD receive has a GRH at the head of its buffer and the sender's LID (SPEC.md §3, §11.1);
     * one SL and one P_Key. On an Ethernet port sl says what the GRH room holds, as mlx5 reports
     * it and UCX reads it (SPEC.md §18): bit 3 RoCEv2 (UDP), bits 0-2 the L3 header, 2 IPv4 and
     * 1 IPv6. */
    if ((c->flags & SOFTNDA_CQE_GRH) != 0) {
        wc->wc_flags |= IBV_WC_GRH;
    }
    wc->pkey_index = 0;
    wc->slid = softnda_cqe_slid(c);
    wc->sl = (c->flags & SOFTNDA_CQE_ROCE_IPV4) != 0   ? 0x8 | 0x2
             : (c->flags & SOFTNDA_CQE_ROCE_IPV6) != 0 ? 0x8 | 0x1
                                                       : 0;
    wc->dlid_path_bits = 0;
}

/* poll_cq, and with times != NULL poll_cq_times. */
static int poll_cq(struct sd_cq *cq, int num_entries, struct ibv_wc *wc,
                   struct ibv_extend_datapath_wc_times *times) {
    if (num_entries < 0) {
        return -EINVAL;
    }
    struct softnda_cqe batch[SD_POLL_BATCH];
    struct softnda_cqe_times batch_times[SD_POLL_BATCH];
    int total = 0;
    pthread_spin_lock(&cq->lock);
    while (total < num_entries) {
        int want = num_entries - total < SD_POLL_BATCH ? num_entries - total : SD_POLL_BATCH;
        int got = softnda_cq_poll_times(&cq->cq, batch, times != NULL ? batch_times : NULL, want);
        if (got <= 0) {
            /* An overflowed CQ (§6.3) reports -EOVERFLOW once nothing valid is left. */
            if (got < 0 && total == 0) {
                total = got;
            }
            break;
        }
        for (int i = 0; i < got; ++i) {
            cqe_to_wc(&batch[i], &wc[total + i]);
            if (times != NULL) {
                times[total + i].completion = batch_times[i].completion;
                times[total + i].wallclock_ns = batch_times[i].wallclock;
            }
        }
        total += got;
        if (got < want) {
            break;
        }
    }
    pthread_spin_unlock(&cq->lock);
    return total;
}

static int sd_poll_cq(void *cqv, int num_entries, struct ibv_wc *wc) {
    return poll_cq(cqv, num_entries, wc, NULL);
}

static int sd_poll_cq_times(void *cqv, int num_entries, struct ibv_wc *wc,
                            struct ibv_extend_datapath_wc_times *times) {
    return poll_cq(cqv, num_entries, wc, times);
}

/* The device clock (SPEC.md §15): CLOCK_MONOTONIC in ns, a 1 GHz counter of 64 bits. */
static int sd_clock_info(uint64_t *khz, uint64_t *mask) {
    *khz = 1000000u;
    *mask = UINT64_MAX;
    return 0;
}

static int sd_read_clock(uint64_t *ticks) {
    *ticks = softnda_clock_ns(SOFTNDA_CLOCK_DEVICE);
    return 0;
}

static uint32_t *sd_cq_arm(struct sd_cq *cq) {
    return __atomic_load_n(&cq->arm, __ATOMIC_ACQUIRE);
}
static uint32_t *sd_cq_events_word(struct sd_cq *cq) {
    return __atomic_load_n(&cq->events, __ATOMIC_ACQUIRE);
}

static int sd_req_notify_cq(void *cqv, int solicited_only) {
    struct sd_cq *cq = cqv;
    /* Sequentially consistent, with the fatal load after it, against cq_fatal's store of fatal
     * and exchange of arm: either this call sees fatal, or cq_fatal sees the arming and raises
     * the event; a waiter is never left armed on a device that is gone. */
    if (solicited_only) {
        /* As the IB CQ arming rules say, a CQ already armed for the next completion stays so: a
         * solicited-only request only arms a disarmed CQ. */
        uint32_t expected = 0;
        __atomic_compare_exchange_n(sd_cq_arm(cq), &expected, SD_ARM_SOLICITED, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
    } else {
        __atomic_store_n(sd_cq_arm(cq), SD_ARM_NEXT, __ATOMIC_SEQ_CST);
    }
    return __atomic_load_n(&cq->fatal, __ATOMIC_SEQ_CST);
}

/* Publishes one CQE as the engine does (SPEC.md §4, "CQE publication"): body, then owner with
 * release, then the CQ's PI with release. Only once the device is gone (the device is then no
 * producer of this CQ any more); the caller holds cq->lock. A CQE whose owner store the device
 * made without its PI store counts as written (SPEC.md §10). -EOVERFLOW, with the CQ in its error
 * state, when it is full (§6.3). */
static int cq_publish(struct sd_cq *cq, const struct softnda_cqe *cqe) {
    struct softnda_cq *q = &cq->cq;
    uint32_t pi = __atomic_load_n(q->dbr_pi, __ATOMIC_ACQUIRE);
    if ((int32_t)(q->ci - pi) > 0) {
        pi = q->ci; /* CQEs polled by their owner word whose PI store the device never made */
    }
    for (;;) {
        if (pi - q->ci >= q->entry_cnt) {
            __atomic_store_n(q->dbr_pi + 1, 1u, __ATOMIC_RELEASE);
            return -EOVERFLOW;
        }
        uint8_t *entry = q->buf + (size_t)(pi & (q->entry_cnt - 1)) * q->entry_size;
        struct softnda_cqe *slot = (struct softnda_cqe *)entry;
        uint32_t phase = ((pi >> q->log_cnt) & 1u) ^ 1u;
        if ((__atomic_load_n(&slot->owner, __ATOMIC_ACQUIRE) & 1u) == phase) {
            ++pi; /* written by the device, its PI store lost */
            continue;
        }
        slot->wr_id = cqe->wr_id;
        slot->byte_len = cqe->byte_len;
        slot->imm_data = cqe->imm_data;
        slot->qp_num = cqe->qp_num;
        slot->src_qp = cqe->src_qp;
        slot->opcode = cqe->opcode;
        slot->status = cqe->status;
        slot->flags = cqe->flags;
        slot->resv = 0;
        if (q->entry_size == SOFTNDA_CQE_TS_SIZE) {
            softnda_cqe_times_now((struct softnda_cqe_times *)(entry + SOFTNDA_CQE_SIZE));
        }
        __atomic_store_n(&slot->owner, phase, __ATOMIC_RELEASE);
        __atomic_store_n(q->dbr_pi, pi + 1, __ATOMIC_RELEASE);
        return 0;
    }
}

/* One WR_FLUSH_ERR completion (byte_len 0, as the engine flushes). */
static int flush_cqe(struct sd_cq *cq, uint64_t wr_id, uint8_t opcode, uint32_t qp_num) {
    struct softnda_cqe c;
    memset(&c, 0, sizeof(c));
    c.wr_id = wr_id;
    c.opcode = opcode;
    c.status = IBV_WC_WR_FLUSH_ERR;
    c.qp_num = qp_num;
    pthread_spin_lock(&cq->lock);
    int rc = cq_publish(cq, &c);
    pthread_spin_unlock(&cq->lock);
    return rc;
}

static int sd_cq_fatal(void *cqv, int err) {
    struct sd_cq *cq = cqv;
    __atomic_store_n(&cq->fatal, err, __ATOMIC_SEQ_CST);
    /* The engine's side of §9 for the flushed completions: an armed CQ raises one event (error
     * completions qualify for a solicited-only arming too). */
    if (__atomic_exchange_n(sd_cq_arm(cq), 0u, __ATOMIC_SEQ_CST) == 0) {
        return 0;
    }
    __atomic_fetch_add(sd_cq_events_word(cq), 1u, __ATOMIC_RELEASE);
    return 1;
}

/* The CQ's overflow state (SPEC.md §6.3), a word only the device writes. */
static uint32_t sd_cq_error(void *cqv) {
    struct sd_cq *cq = cqv;
    pthread_spin_lock(&cq->lock); /* cq_resize moves the record */
    uint32_t state = softnda_cq_state(&cq->cq);
    pthread_spin_unlock(&cq->lock);
    return state;
}

/* The device keeps every waiting CQE and the consumer index across the move (SPEC.md §12):
 * the ring is read again from the new queue_info, the events and arm words with it. */
static int sd_cq_resize(void *cqv, const struct ibv_cq_extend *ext, int (*resize)(void *arg), void *arg) {
    struct sd_cq *cq = cqv;
    pthread_spin_lock(&cq->lock);
    int rc = resize(arg);
    if (rc == 0) {
        struct softnda_cq fresh;
        if (softnda_cq_init(&fresh, &ext->cq_info) == 0) {
            cq->cq = fresh;
            __atomic_store_n(&cq->arm, cq->cq.dbr_pi + SD_CQ_ARM_WORD, __ATOMIC_RELEASE);
            __atomic_store_n(&cq->events, cq->cq.dbr_pi + SD_CQ_EVENTS_WORD, __ATOMIC_RELEASE);
        } else {
            rc = EIO;
        }
    }
    pthread_spin_unlock(&cq->lock);
    return rc;
}

static uint32_t sd_cq_events(void *cqv) {
    struct sd_cq *cq = cqv;
    return __atomic_load_n(sd_cq_events_word(cq), __ATOMIC_ACQUIRE);
}

/* ---- Receive queues (RQ and SRQ) -------------------------------------------------------- */

static int recv_queue_init(struct sd_recv_queue *q, const struct queue_info *qi, uint32_t max_wr,
                           uint32_t max_sge) {
    if (softnda_rq_init(&q->rq, qi) != 0) {
        return EINVAL;
    }
    q->max_wr = min_u32(max_wr, q->rq.entry_cnt);
    q->max_sge = min_u32(max_sge, q->rq.max_sge);
    pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE);
    return 0;
}

static int post_recv_chain(struct sd_recv_queue *q, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    int err = 0;
    uint32_t start;
    pthread_spin_lock(&q->lock);
    if (q->fatal != 0 && wr != NULL) {
        *bad_wr = wr;
        err = q->fatal;
        wr = NULL;
    }
    start = q->rq.pi;
    for (; wr != NULL; wr = wr->next) {
        if (queue_full(q->rq.pi, &q->rq.ci_cached, q->rq.dbr_ci, q->max_wr)) {
            err = ENOMEM;
        } else if (wr->num_sge < 0 || (uint32_t)wr->num_sge > q->max_sge) {
            err = EINVAL;
        } else if (softnda_rq_post(&q->rq, wr->wr_id, (const struct softnda_sge *)wr->sg_list,
                                   (uint32_t)wr->num_sge) != 0) {
            err = ENOMEM; /* the ring itself is full: max_wr never exceeds it, so not reached */
        }
        if (err != 0) {
            *bad_wr = wr;
            break;
        }
    }
    if (q->rq.pi != start) {
        softnda_rq_doorbell(&q->rq);
    }
    pthread_spin_unlock(&q->lock);
    return err;
}

/* ---- QP --------------------------------------------------------------------------------- */

static void *sd_qp_open(const struct ibv_extend_datapath_qp_attr *attr) {
    if (attr == NULL || attr->qp == NULL) {
        errno = EINVAL;
        return NULL;
    }
    /* The transports softnda executes (SPEC.md §5, §11, §14). An XRC initiator's WQEs carry
     * the XRC segment; neither XRC QP has a receive queue (a target's granted depths are 0, so
     * every post to it is refused). */
    const int xrc = attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV;
    if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD && !xrc) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct sd_qp *qp = alloc_state(sizeof(*qp));
    if (qp == NULL) {
        return NULL;
    }
    int sq_rc = attr->qp_type == IBV_QPT_XRC_SEND ? softnda_sq_init_xrc(&qp->sq, &attr->qp->sq_info)
                                                  : softnda_sq_init(&qp->sq, &attr->qp->sq_info);
    if (sq_rc != 0) {
        free(qp);
        errno = EINVAL;
        return NULL;
    }
    qp->has_rq = !attr->has_srq && !xrc;
    if (qp->has_rq &&
        recv_queue_init(&qp->rq, &attr->qp->rq_info, attr->cap.max_recv_wr, attr->cap.max_recv_sge) != 0) {
        free(qp);
        errno = EINVAL;
        return NULL;
    }
    /* The granted caps, never beyond what the ring and its WQE size hold. */
    qp->max_send_wr = min_u32(attr->cap.max_send_wr, qp->sq.entry_cnt);
    qp->max_send_sge = min_u32(attr->cap.max_send_sge, qp->sq.max_sge);
    qp->max_inline = min_u32(min_u32(attr->cap.max_inline_data, qp->sq.max_inline), SD_MAX_INLINE);
    qp->sq_sig_all = attr->sq_sig_all;
    qp->qp_type = attr->qp_type;
    qp->max_opcode = attr->qp_type == IBV_QPT_UD   ? SOFTNDA_OP_SEND_WITH_IMM
                     : attr->qp_type == IBV_QPT_UC ? SOFTNDA_OP_RDMA_WRITE_WITH_IMM
                                                   : SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
    qp->qp_num = attr->qp->qp != NULL ? attr->qp->qp->qp_num : 0;
    qp->fatal_events = qp->sq.dbr_pi + SD_SQ_FATAL_EVENTS_WORD;
    pthread_spin_init(&qp->sq_lock, PTHREAD_PROCESS_PRIVATE);
    return qp;
}

static void sd_qp_close(void *qpv) {
    struct sd_qp *qp = qpv;
    if (qp != NULL) {
        pthread_spin_destroy(&qp->sq_lock);
        if (qp->has_rq) {
            pthread_spin_destroy(&qp->rq.lock);
        }
        free(qp);
    }
}

/* The SPEC.md §2.1 opcode of a libibverbs one; 0 (NOP, never a verbs opcode) when softnda does not
 * execute it (TSO, driver opcodes). */
static uint8_t wqe_opcode(enum ibv_wr_opcode op) {
    switch (op) {
        case IBV_WR_SEND:
            return SOFTNDA_OP_SEND;
        case IBV_WR_SEND_WITH_IMM:
            return SOFTNDA_OP_SEND_WITH_IMM;
        case IBV_WR_RDMA_WRITE:
            return SOFTNDA_OP_RDMA_WRITE;
        case IBV_WR_RDMA_WRITE_WITH_IMM:
            return SOFTNDA_OP_RDMA_WRITE_WITH_IMM;
        case IBV_WR_RDMA_READ:
            return SOFTNDA_OP_RDMA_READ;
        case IBV_WR_ATOMIC_CMP_AND_SWP:
            return SOFTNDA_OP_ATOMIC_CMP_AND_SWP;
        case IBV_WR_ATOMIC_FETCH_AND_ADD:
            return SOFTNDA_OP_ATOMIC_FETCH_AND_ADD;
        case IBV_WR_BIND_MW:
            return SOFTNDA_OP_BIND_MW;
        case IBV_WR_LOCAL_INV:
            return SOFTNDA_OP_LOCAL_INV;
        case IBV_WR_SEND_WITH_INV:
            return SOFTNDA_OP_SEND_WITH_INV;
        default:
            return SOFTNDA_OP_NOP;
    }
}

/* Whether the QP's transport executes op (SPEC.md §11, §16): memory-window binds and local
 * invalidations on all but UD, SEND_WITH_INV on RC and XRC initiators. */
static int op_allowed(const struct sd_qp *qp, uint8_t op) {
    switch (op) {
        case SOFTNDA_OP_NOP:
            return 0;
        case SOFTNDA_OP_BIND_MW:
        case SOFTNDA_OP_LOCAL_INV:
            return qp->qp_type != IBV_QPT_UD;
        case SOFTNDA_OP_SEND_WITH_INV:
            return qp->qp_type == IBV_QPT_RC || qp->qp_type == IBV_QPT_XRC_SEND;
        default:
            return op <= qp->max_opcode;
    }
}

/* Writes one send WQE (not yet published): 0, ENOMEM (SQ full) or EINVAL (a bad request). */
static int write_send_wqe(struct sd_qp *qp, const struct ibv_send_wr *wr) {
    if (queue_full(qp->sq.pi, &qp->sq.ci_cached, qp->sq.dbr_ci, qp->max_send_wr)) {
        return ENOMEM;
    }
    uint8_t op = wqe_opcode(wr->opcode);
    /* UD sends SEND and SEND_WITH_IMM only, UC no READ or atomics (SPEC.md §11): refused at the
     * post, as rdma-core providers refuse them, rather than as an error completion. */
    if (!op_allowed(qp, op) || wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->max_send_sge) {
        return EINVAL;
    }
    struct softnda_send_wr w;
    memset(&w, 0, sizeof(w));
    w.wr_id = wr->wr_id;
    w.opcode = op;
    if ((wr->send_flags & IBV_SEND_SIGNALED) != 0 || qp->sq_sig_all) {
        w.flags |= SOFTNDA_WQE_SIGNALED;
    }
    if ((wr->send_flags & IBV_SEND_FENCE) != 0) {
        w.flags |= SOFTNDA_WQE_FENCE;
    }
    if ((wr->send_flags & IBV_SEND_SOLICITED) != 0) {
        w.flags |= SOFTNDA_WQE_SOLICITED;
    }
    if (qp->qp_type == IBV_QPT_XRC_SEND) {
        w.remote_srqn = wr->qp_type.xrc.remote_srqn; /* the SRQ at the target (SPEC.md §14) */
    }
    int may_inline = 0;
    int has_data = 1;
    switch (op) {
        case SOFTNDA_OP_BIND_MW: {
            /* The window by its current rkey, its new one, and what it covers (SPEC.md §16). */
            const struct ibv_mw_bind_info *b = &wr->bind_mw.bind_info;
            /* A zero-based window is refused here, as mlx5 refuses it at post time. Local
             * write, which consumers often pass (rdma-core's own tests do), means nothing for a
             * window: only the MR's local write matters (checked by the engine), so it is not
             * carried. Any other bit goes to the engine, which refuses it (MW_BIND_ERR). */
            const uint32_t access = b->mw_access_flags & ~(unsigned)IBV_ACCESS_LOCAL_WRITE;
            if (wr->bind_mw.mw == NULL || (b->mw_access_flags & IBV_ACCESS_ZERO_BASED) != 0) {
                return EINVAL;
            }
            softnda_send_wr_set_bind(&w, wr->bind_mw.mw->rkey, wr->bind_mw.rkey,
                                     b->mr != NULL ? b->mr->lkey : 0, b->addr, b->length, access);
            has_data = 0;
            break;
        }
        case SOFTNDA_OP_LOCAL_INV:
            w.rkey = wr->invalidate_rkey;
            has_data = 0;
            break;
        case SOFTNDA_OP_SEND_WITH_INV:
            may_inline = 1;
            w.imm_data = wr->invalidate_rkey; /* an rkey, host order: no byte swap */
            break;
        case SOFTNDA_OP_SEND:
        case SOFTNDA_OP_SEND_WITH_IMM:
            may_inline = 1;
            if (qp->qp_type == IBV_QPT_UD) {
                /* The destination from the address handle the face made (SPEC.md §2.1). */
                const struct ibv_extend_datapath_ah *ah = (const struct ibv_extend_datapath_ah *)wr->wr.ud.ah;
                if (ah == NULL) {
                    return EINVAL;
                }
                softnda_send_wr_set_ud(&w, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey, ah->attr.dlid);
                if (ah->attr.is_global) {
                    softnda_send_wr_set_ud_grh(&w, ah->attr.grh.sgid_index, ah->attr.grh.dgid.raw);
                    softnda_send_wr_set_ud_route(&w, ah->attr.grh.traffic_class, ah->attr.grh.hop_limit);
                }
            }
            break;
        case SOFTNDA_OP_RDMA_WRITE:
        case SOFTNDA_OP_RDMA_WRITE_WITH_IMM:
            may_inline = 1;
            w.remote_addr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
            break;
        case SOFTNDA_OP_RDMA_READ:
            w.remote_addr = wr->wr.rdma.remote_addr;
            w.rkey = wr->wr.rdma.rkey;
            break;
        default: /* the two atomics */
            w.remote_addr = wr->wr.atomic.remote_addr;
            w.rkey = wr->wr.atomic.rkey;
            w.compare_add = wr->wr.atomic.compare_add;
            if (op == SOFTNDA_OP_ATOMIC_CMP_AND_SWP) {
                w.swap = wr->wr.atomic.swap;
            }
            break;
    }
    if (op == SOFTNDA_OP_SEND_WITH_IMM || op == SOFTNDA_OP_RDMA_WRITE_WITH_IMM) {
        /* ibv_send_wr carries the immediate in network order; the WQE carries the number (§2.1,
         * little-endian like every field), so device-side peers see the same value. */
        w.imm_data = be32toh(wr->imm_data);
    }
    /* IBV_SEND_INLINE means something only where data is sent; a READ or an atomic names buffers
     * the device writes, so there the flag is ignored, as mlx5 does. */
    uint8_t inline_buf[SD_MAX_INLINE];
    if (!has_data) {
        w.num_sge = 0; /* a bind or an invalidation carries no data (its sg_list is ignored) */
    } else if (may_inline && (wr->send_flags & IBV_SEND_INLINE) != 0) {
        uint64_t len = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
            len += wr->sg_list[i].length;
        }
        if (len > qp->max_inline) {
            return EINVAL;
        }
        /* Inline data is read now, from the caller's own memory: no lkey is involved. */
        uint32_t off = 0;
        for (int i = 0; i < wr->num_sge; ++i) {
            memcpy(inline_buf + off, (const void *)(uintptr_t)wr->sg_list[i].addr, wr->sg_list[i].length);
            off += wr->sg_list[i].length;
        }
        w.inline_data = inline_buf;
        w.inline_len = off;
    } else {
        w.sg_list = (const struct softnda_sge *)wr->sg_list;
        w.num_sge = (uint32_t)wr->num_sge;
    }
    int rc = softnda_sq_post(&qp->sq, &w);
    return rc == 0 ? 0 : (rc == -ENOSPC ? ENOMEM : EINVAL);
}

static int sd_post_send(void *qpv, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
    struct sd_qp *qp = qpv;
    int err = 0;
    pthread_spin_lock(&qp->sq_lock);
    if (qp->sq_fatal != 0 && wr != NULL) {
        *bad_wr = wr;
        err = qp->sq_fatal;
        wr = NULL;
    }
    uint32_t start = qp->sq.pi;
    for (; wr != NULL; wr = wr->next) {
        err = write_send_wqe(qp, wr);
        if (err != 0) {
            *bad_wr = wr;
            break;
        }
    }
    /* One doorbell for the whole chain (§4: steps 4-5 once per batch), also for the requests
     * before a bad one. */
    if (qp->sq.pi != start) {
        softnda_sq_doorbell(&qp->sq);
    }
    pthread_spin_unlock(&qp->sq_lock);
    return err;
}

static int sd_post_recv(void *qpv, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    struct sd_qp *qp = qpv;
    if (!qp->has_rq) {
        /* Receives of a QP with an SRQ go to the SRQ. */
        *bad_wr = wr;
        return EINVAL;
    }
    return post_recv_chain(&qp->rq, wr, bad_wr);
}

static int sd_qp_fatal(void *qpv, void *send_cqv, void *recv_cqv, int err) {
    struct sd_qp *qp = qpv;
    int flushed = 0;
    /* The SQ: every WQE from the device's CI to what was posted, in order; then the queue is
     * empty (ci = pi), as after the engine's flush. */
    pthread_spin_lock(&qp->sq_lock);
    qp->sq_fatal = err;
    for (uint32_t i = __atomic_load_n(qp->sq.dbr_ci, __ATOMIC_ACQUIRE); i != qp->sq.pi; ++i) {
        const struct softnda_wqe *w =
            (const struct softnda_wqe *)(qp->sq.buf +
                                         (size_t)(i & (qp->sq.entry_cnt - 1)) * qp->sq.entry_size);
        if (send_cqv != NULL &&
            flush_cqe(send_cqv, w->wr_id, softnda_send_wc_opcode(w->opcode), qp->qp_num) == 0) {
            ++flushed;
        }
    }
    __atomic_store_n(qp->sq.dbr_ci, qp->sq.pi, __ATOMIC_RELEASE);
    qp->sq.ci_cached = qp->sq.pi;
    pthread_spin_unlock(&qp->sq_lock);
    if (!qp->has_rq) {
        return flushed; /* an SRQ's receives are the SRQ's (§6.2) */
    }
    struct sd_recv_queue *rq = &qp->rq;
    pthread_spin_lock(&rq->lock);
    rq->fatal = err;
    for (uint32_t i = __atomic_load_n(rq->rq.dbr_ci, __ATOMIC_ACQUIRE); i != rq->rq.pi; ++i) {
        const struct softnda_recv_wqe *w =
            (const struct softnda_recv_wqe *)(rq->rq.buf +
                                              (size_t)(i & (rq->rq.entry_cnt - 1)) * rq->rq.entry_size);
        if (recv_cqv != NULL && flush_cqe(recv_cqv, w->wr_id, IBV_WC_RECV, qp->qp_num) == 0) {
            ++flushed;
        }
    }
    __atomic_store_n(rq->rq.dbr_ci, rq->rq.pi, __ATOMIC_RELEASE);
    rq->rq.ci_cached = rq->rq.pi;
    pthread_spin_unlock(&rq->lock);
    return flushed;
}

/* Removes from cq the completions of QP qpn the consumer has not polled (receive completions
 * stay with keep_recv), as mlx5's CQ clean does: what the engine has written, [ci, end), is
 * compacted towards end and the consumer index moves past the slots freed. The engine writes only
 * at its producer index, at or beyond end, and never reads a CQE back, so only the poll lock is
 * needed. Each moved entry takes the phase of the slot it lands in (SPEC.md §6). */
static void cq_clean(struct sd_cq *cq, uint32_t qpn, int keep_recv) {
    pthread_spin_lock(&cq->lock);
    struct softnda_cq *q = &cq->cq;
    uint32_t written = 0;
    while (written < q->entry_cnt) {
        const uint32_t i = q->ci + written;
        const struct softnda_cqe *e =
            (const struct softnda_cqe *)(q->buf + (size_t)(i & (q->entry_cnt - 1)) * q->entry_size);
        if ((__atomic_load_n(&e->owner, __ATOMIC_ACQUIRE) & 1u) != (((i >> q->log_cnt) & 1u) ^ 1u)) {
            break;
        }
        ++written;
    }
    uint32_t freed = 0;
    for (uint32_t k = written; k > 0; --k) {
        const uint32_t i = q->ci + k - 1;
        uint8_t *from = q->buf + (size_t)(i & (q->entry_cnt - 1)) * q->entry_size;
        const struct softnda_cqe *e = (const struct softnda_cqe *)from;
        if (e->qp_num == qpn && !(keep_recv && e->opcode >= IBV_WC_RECV)) {
            ++freed;
        } else if (freed > 0) {
            const uint32_t to_index = i + freed;
            uint8_t *to = q->buf + (size_t)(to_index & (q->entry_cnt - 1)) * q->entry_size;
            const uint32_t owner = (e->owner & ~1u) | (((to_index >> q->log_cnt) & 1u) ^ 1u);
            memcpy(to, from, q->entry_size);
            __atomic_store_n(&((struct softnda_cqe *)to)->owner, owner, __ATOMIC_RELEASE);
        }
    }
    if (freed > 0) {
        q->ci += freed;
        __atomic_store_n(q->dbr_ci, q->ci, __ATOMIC_RELEASE);
    }
    pthread_spin_unlock(&cq->lock);
}

static void sd_qp_reset(void *qpv, void *send_cqv, void *recv_cqv) {
    const struct sd_qp *qp = qpv;
    if (send_cqv != NULL) {
        cq_clean(send_cqv, qp->qp_num, !qp->has_rq);
    }
    if (recv_cqv != NULL && recv_cqv != send_cqv) {
        cq_clean(recv_cqv, qp->qp_num, !qp->has_rq);
    }
}

static uint32_t sd_qp_fatal_events(void *qpv) {
    struct sd_qp *qp = qpv;
    return __atomic_load_n(qp->fatal_events, __ATOMIC_ACQUIRE);
}

/* ---- SRQ -------------------------------------------------------------------------------- */

static void *sd_srq_open(const struct ibv_srq_extend *ext, const struct ibv_srq_attr *attr) {
    if (ext == NULL) {
        errno = EINVAL;
        return NULL;
    }
    struct sd_srq *srq = alloc_state(sizeof(*srq));
    if (srq == NULL) {
        return NULL;
    }
    /* Without the granted attributes, the ring's own capacity. */
    uint32_t max_wr = attr != NULL ? attr->max_wr : UINT32_MAX;
    uint32_t max_sge = attr != NULL ? attr->max_sge : UINT32_MAX;
    if (recv_queue_init(&srq->rq, &ext->srq_info, max_wr, max_sge) != 0) {
        free(srq);
        errno = EINVAL;
        return NULL;
    }
    return srq;
}

static void sd_srq_close(void *srqv) {
    struct sd_srq *srq = srqv;
    if (srq != NULL) {
        pthread_spin_destroy(&srq->rq.lock);
        free(srq);
    }
}

static int sd_post_srq_recv(void *srqv, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    struct sd_srq *srq = srqv;
    return post_recv_chain(&srq->rq, wr, bad_wr);
}

static void sd_srq_fatal(void *srqv, int err) {
    struct sd_srq *srq = srqv;
    pthread_spin_lock(&srq->rq.lock);
    srq->rq.fatal = err;
    pthread_spin_unlock(&srq->rq.lock);
}

static uint32_t sd_srq_limit_events(void *srqv) {
    struct sd_srq *srq = srqv;
    return softnda_srq_limit_events(&srq->rq.rq);
}

int softnda_verbs_modify_srq(void *srqv, const struct ibv_srq_attr *attr, int attr_mask) {
    struct sd_srq *srq = srqv;
    if (srq == NULL || attr == NULL || attr_mask == 0) {
        return EINVAL;
    }
    /* An SRQ is never resized; the limit is the one thing software sets (§5.3). */
    if ((attr_mask & ~IBV_SRQ_LIMIT) != 0 || attr->srq_limit > srq->rq.max_wr) {
        return EINVAL;
    }
    softnda_srq_arm(&srq->rq.rq, attr->srq_limit);
    return 0;
}

int softnda_verbs_query_srq(void *srqv, struct ibv_srq_attr *attr) {
    struct sd_srq *srq = srqv;
    if (srq == NULL || attr == NULL) {
        return EINVAL;
    }
    attr->max_wr = srq->rq.max_wr;
    attr->max_sge = srq->rq.max_sge;
    attr->srq_limit = softnda_srq_limit(&srq->rq.rq);
    return 0;
}

__attribute__((visibility("default"))) const struct ibv_extend_datapath_ops ibv_extend_datapath = {
    .abi = IBV_EXTEND_DATAPATH_ABI_V1,
    .provider = SOFTNDA_PROVIDER_NAME,
    .cq_open = sd_cq_open,
    .cq_close = sd_cq_close,
    .qp_open = sd_qp_open,
    .qp_close = sd_qp_close,
    .srq_open = sd_srq_open,
    .srq_close = sd_srq_close,
    .post_send = sd_post_send,
    .post_recv = sd_post_recv,
    .post_srq_recv = sd_post_srq_recv,
    .poll_cq = sd_poll_cq,
    .req_notify_cq = sd_req_notify_cq,
    .cq_events = sd_cq_events,
    .qp_fatal_events = sd_qp_fatal_events,
    .srq_limit_events = sd_srq_limit_events,
    .modify_srq = softnda_verbs_modify_srq,
    .query_srq = softnda_verbs_query_srq,
    .qp_fatal = sd_qp_fatal,
    .cq_fatal = sd_cq_fatal,
    .srq_fatal = sd_srq_fatal,
    .cq_error = sd_cq_error,
    .cq_resize = sd_cq_resize,
    .clock_info = sd_clock_info,
    .read_clock = sd_read_clock,
    .poll_cq_times = sd_poll_cq_times,
    .qp_reset = sd_qp_reset,
};
/* The table above is complete to its end (IBV_EXTEND_DATAPATH_SIZE_SYMBOL). */
__attribute__((visibility("default"))) const uint32_t ibv_extend_datapath_size =
    sizeof(struct ibv_extend_datapath_ops);
