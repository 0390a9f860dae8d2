/*
 * The RC loopback plumbing the verbs test programs share (verbs-behaviour, restart-tenant): one
 * place that knows how a softnda RC pair is brought to RTS through the standard verbs. Header
 * only, C, for programs linked against the system libibverbs. Each program defines rc_prog (its
 * name, for messages) before including it. Static inline: a program uses what it needs.
 */
#ifndef IBVX_TESTS_RC_HELPERS_H
#define IBVX_TESTS_RC_HELPERS_H

#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static inline void fail(const char *step, const char *why) {
    fprintf(stderr, "%s: %s: %s\n", rc_prog, step, why);
    exit(1);
}

static const int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

/* A completion within `seconds` (1), or none (0): a deadline by the clock, not by a number of
 * polls, since a broker restart (a crash and a RestartSec=, say) pauses completions for a while
 * and polls are cheap. Spins, resting 50 us every 4096 empty polls; a failing ibv_poll_cq ends
 * the program. */
static inline int poll_wc_within(struct ibv_cq *cq, struct ibv_wc *wc, int seconds, const char *step) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned long i = 1;; ++i) {
        int n = ibv_poll_cq(cq, 1, wc);
        if (n < 0) {
            fail(step, "ibv_poll_cq failed");
        }
        if (n == 1) {
            return 1;
        }
        if ((i & 0xfff) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > seconds) {
                return 0;
            }
            struct timespec rest = {0, 50 * 1000};
            nanosleep(&rest, NULL);
        }
    }
}

/* A completion, or the program fails after 30 s without one. */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq, const char *step) {
    struct ibv_wc wc;
    if (!poll_wc_within(cq, &wc, 30, step)) {
        fail(step, "no completion in 30 s");
    }
    return wc;
}

static inline void to_init(struct ibv_qp *qp) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = kAccess;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
        fail("INIT", "refused");
    }
}

static inline void to_rts(struct ibv_qp *qp, uint32_t dest, uint16_t lid) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_2048;
    a.dest_qp_num = dest;
    a.rq_psn = 77;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
        fail("RTR", "refused");
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 77;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        fail("RTS", "refused");
    }
}

/* An RC QP of 8 work requests and 1 SGE each way, completing sends on scq and receives on rcq. */
static inline struct ibv_qp *rc_qp_cqs_or_null(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = scq;
    ia.recv_cq = rcq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 8;
    ia.cap.max_recv_wr = 8;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    return ibv_create_qp(pd, &ia);
}

static inline struct ibv_qp *rc_qp_or_null(struct ibv_pd *pd, struct ibv_cq *cq) {
    return rc_qp_cqs_or_null(pd, cq, cq);
}

static inline struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq) {
    struct ibv_qp *qp = rc_qp_or_null(pd, cq);
    if (qp == NULL) {
        fail("ibv_create_qp", strerror(errno));
    }
    return qp;
}

/* A UD QP from RESET to RTS on port 1 with Q_Key qkey; fails the program when refused. */
static inline void ud_to_rts(struct ibv_qp *qp, uint32_t qkey) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0) {
        fail("UD INIT", "refused");
    }
    a.qp_state = IBV_QPS_RTR;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE) != 0) {
        fail("UD RTR", "refused");
    }
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0) {
        fail("UD RTS", "refused");
    }
}

/* A UD QP in RTS on port 1 with Q_Key qkey, depth work requests each way; fails the program when
 * the device refuses it. */
static inline struct ibv_qp *ud_qp_rts(struct ibv_pd *pd, struct ibv_cq *cq, uint32_t depth, uint32_t qkey) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_UD;
    ia.cap.max_send_wr = depth;
    ia.cap.max_recv_wr = depth;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    struct ibv_qp *qp = ibv_create_qp(pd, &ia);
    if (qp == NULL) {
        fail("ibv_create_qp UD", strerror(errno));
    }
    ud_to_rts(qp, qkey);
    return qp;
}

/* The device called name, opened; fails the program when there is none. */
static inline struct ibv_context *open_named(const char *name) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    struct ibv_context *ctx = NULL;
    for (int i = 0; list != NULL && i < n; ++i) {
        if (strcmp(ibv_get_device_name(list[i]), name) == 0) {
            ctx = ibv_open_device(list[i]);
        }
    }
    if (ctx == NULL) {
        fail("ibv_open_device", "no such device");
    }
    ibv_free_device_list(list);
    return ctx;
}

#endif
