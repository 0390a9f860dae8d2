/*
 * A tenant whose broker session ends while it only polls its queues (docs/verbs.md, "When the
 * session ends"). Linked against the system libibverbs, run through ibv-extend-run so the face
 * serves it, exactly as ibv_rc_pingpong meets an eviction.
 *
 *   session-end-tenant DEVICE evict
 *   session-end-tenant DEVICE restart GO_FILE
 *
 * Both modes bring up an RC loopback pair a <-> b: a has RECVS receives posted and SENDS SENDs to
 * b, which has no receive posted, so the SENDs wait on RNR (rnr_retry 7: forever) and every work
 * request of a stays outstanding. The recv CQ is armed on a completion channel that a second
 * thread waits on in ibv_get_cq_event(). Then "ready qpn=A,B" and the program only polls.
 *
 * evict: the test evicts the session. The program must see every outstanding work request
 * complete with IBV_WC_WR_FLUSH_ERR (right wr_ids, posting order, the unsignaled SEND too), the
 * channel waiter woken, IBV_EVENT_DEVICE_FATAL once on the async fd (then EIO), ibv_query_qp
 * answering ERR, and ibv_post_send, ibv_post_recv, ibv_req_notify_cq, ibv_get_cq_event and
 * ibv_modify_qp failing (post_*: *bad_wr set). One line per check; exit 0 only when all hold.
 *
 * restart: the test restarts the broker, then creates GO_FILE. Nothing may have happened: no
 * completion, no channel event, the async fd silent, the QPs in RTS. Then b posts receives and
 * the waiting SENDs complete with success, which wakes the channel waiter. Exit 0 only then.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *rc_prog = "session-end-tenant";
#include "../verbs/rc_helpers.h"

enum { RECVS = 4, SENDS = 3, RECV_WR_ID = 100, SEND_WR_ID = 200, PEER_RECV_WR_ID = 300 };

static struct ibv_comp_channel *channel;
static struct ibv_cq *recv_cq;
static int cq_event_rc = 1; /* 1: still waiting; 0: got recv_cq; -1: failed (errno in cq_event_errno) */
static int cq_event_errno;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void *wait_cq_event(void *arg) {
    (void)arg;
    struct ibv_cq *cq = NULL;
    void *cq_ctx = NULL;
    int rc = ibv_get_cq_event(channel, &cq, &cq_ctx);
    int err = errno;
    if (rc == 0) {
        ibv_ack_cq_events(cq, 1);
    }
    __atomic_store_n(&cq_event_errno, err, __ATOMIC_RELAXED);
    __atomic_store_n(&cq_event_rc, rc == 0 ? (cq == recv_cq ? 0 : -2) : -1, __ATOMIC_RELEASE);
    return NULL;
}

static int cq_event_state(void) {
    return __atomic_load_n(&cq_event_rc, __ATOMIC_ACQUIRE);
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq) {
    struct ibv_qp *qp = rc_qp_cqs_or_null(pd, scq, rcq);
    if (qp == NULL) {
        fail("ibv_create_qp", strerror(errno));
    }
    return qp;
}

static int post_recv(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, struct ibv_recv_wr **bad) {
    struct ibv_recv_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    *bad = NULL;
    int rc = ibv_post_recv(qp, &wr, bad);
    if (rc != 0 && *bad == &wr) {
        *bad = (struct ibv_recv_wr *)1; /* "was the request": the caller compares with 1 */
    }
    return rc;
}

static int post_send(struct ibv_qp *qp, uint64_t wr_id, struct ibv_sge *sge, int signaled, int *bad_ok) {
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    int rc = ibv_post_send(qp, &wr, &bad);
    *bad_ok = rc != 0 && bad == &wr;
    return rc;
}

/* Collects completions of both CQs into got[] (at most max) until `want` arrived or the
 * deadline passed; returns how many. */
static int poll_both(struct ibv_cq *scq, struct ibv_cq *rcq, struct ibv_wc *got, int max, int want,
                     uint64_t deadline_ms) {
    int n = 0;
    for (unsigned long i = 1; n < want; ++i) {
        struct ibv_cq *cqs[2] = {scq, rcq};
        for (int c = 0; c < 2 && n < max; ++c) {
            int r = ibv_poll_cq(cqs[c], max - n, got + n);
            if (r < 0) {
                fail("ibv_poll_cq", "failed");
            }
            n += r;
        }
        if ((i & 0x3ff) == 0 && now_ms() > deadline_ms) {
            break;
        }
    }
    return n;
}

static int check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "%s: check failed: %s\n", rc_prog, what);
    }
    return ok;
}

static int run_evict(struct ibv_context *ctx, struct ibv_cq *send_cq, struct ibv_qp *a, struct ibv_sge *sge) {
    int ok = 1;
    /* Only the data path: poll until every outstanding request of a completed. */
    struct ibv_wc wc[32];
    int n = poll_both(send_cq, recv_cq, wc, 32, SENDS + RECVS, now_ms() + 20000);
    int sends = 0, recvs = 0, statuses_ok = 1, order_ok = 1;
    for (int i = 0; i < n; ++i) {
        if (wc[i].status != IBV_WC_WR_FLUSH_ERR || wc[i].qp_num != a->qp_num) {
            statuses_ok = 0;
        }
        if (wc[i].wr_id >= SEND_WR_ID && wc[i].wr_id < SEND_WR_ID + SENDS) {
            order_ok &= wc[i].wr_id == (uint64_t)(SEND_WR_ID + sends);
            ++sends;
        } else if (wc[i].wr_id >= RECV_WR_ID && wc[i].wr_id < RECV_WR_ID + RECVS) {
            order_ok &= wc[i].wr_id == (uint64_t)(RECV_WR_ID + recvs) && wc[i].opcode == IBV_WC_RECV;
            ++recvs;
        } else {
            order_ok = 0;
        }
    }
    printf("flushed send=%d recv=%d status=%s order_ok=%d\n", sends, recvs,
           statuses_ok ? ibv_wc_status_str(IBV_WC_WR_FLUSH_ERR) : "other", order_ok);
    fflush(stdout);
    ok &= check(sends == SENDS && recvs == RECVS && statuses_ok && order_ok, "flushed completions");

    /* The waiter on the armed recv CQ's channel was woken with that CQ. */
    uint64_t deadline = now_ms() + 5000;
    while (cq_event_state() == 1 && now_ms() < deadline) {
        usleep(1000);
    }
    printf("cq_event rc=%d\n", cq_event_state());
    ok &= check(cq_event_state() == 0, "channel waiter woken for the armed CQ");

    /* The async fd fires: DEVICE_FATAL once, then EIO. */
    struct pollfd p = {ctx->async_fd, POLLIN, 0};
    int readable = poll(&p, 1, 5000);
    struct ibv_async_event ev;
    int rc = readable == 1 ? ibv_get_async_event(ctx, &ev) : -1;
    printf("async readable=%d event=%s\n", readable, rc == 0 ? ibv_event_type_str(ev.event_type) : "none");
    ok &= check(rc == 0 && ev.event_type == IBV_EVENT_DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL");
    if (rc == 0) {
        ibv_ack_async_event(&ev);
    }
    fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
    rc = ibv_get_async_event(ctx, &ev);
    int err = errno;
    printf("async_after rc=%d errno=%s\n", rc, rc != 0 ? strerrorname_np(err) : "0");
    ok &= check(rc == -1 && err == EIO, "no second event: EIO");

    /* The QP answers ERR. */
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    rc = ibv_query_qp(a, &attr, IBV_QP_STATE, &init);
    printf("query_qp rc=%d state=%s\n", rc, rc == 0 && attr.qp_state == IBV_QPS_ERR ? "ERR" : "other");
    ok &= check(rc == 0 && attr.qp_state == IBV_QPS_ERR && a->state == IBV_QPS_ERR, "QP in ERR");

    /* Later verbs fail. */
    int bad_ok = 0;
    rc = post_send(a, 999, sge, 1, &bad_ok);
    printf("post_send rc=%s bad_wr_ok=%d\n", rc != 0 ? strerrorname_np(rc) : "0", bad_ok);
    ok &= check(rc != 0 && bad_ok, "ibv_post_send fails with *bad_wr");
    struct ibv_recv_wr *rbad = NULL;
    rc = post_recv(a, 998, sge, &rbad);
    printf("post_recv rc=%s bad_wr_ok=%d\n", rc != 0 ? strerrorname_np(rc) : "0",
           rbad == (struct ibv_recv_wr *)1);
    ok &= check(rc != 0 && rbad == (struct ibv_recv_wr *)1, "ibv_post_recv fails with *bad_wr");
    rc = ibv_req_notify_cq(recv_cq, 0);
    printf("req_notify rc=%s\n", rc != 0 ? strerrorname_np(rc) : "0");
    ok &= check(rc != 0, "ibv_req_notify_cq fails");
    fcntl(channel->fd, F_SETFL, fcntl(channel->fd, F_GETFL) | O_NONBLOCK);
    struct ibv_cq *ecq = NULL;
    void *ectx = NULL;
    rc = ibv_get_cq_event(channel, &ecq, &ectx);
    err = errno;
    printf("get_cq_event rc=%d errno=%s\n", rc, rc != 0 ? strerrorname_np(err) : "0");
    ok &= check(rc == -1 && err == EIO, "ibv_get_cq_event: EIO");
    memset(&attr, 0, sizeof(attr));
    attr.qp_state = IBV_QPS_RESET;
    rc = ibv_modify_qp(a, &attr, IBV_QP_STATE);
    printf("modify_qp rc=%s\n", rc != 0 ? strerrorname_np(rc) : "0");
    ok &= check(rc != 0, "ibv_modify_qp fails");
    /* Nothing more arrives on the CQs. */
    ok &= check(poll_both(send_cq, recv_cq, wc, 32, 1, now_ms() + 100) == 0, "no further completion");
    return ok;
}

static int run_restart(struct ibv_context *ctx, struct ibv_cq *send_cq, struct ibv_qp *a, struct ibv_qp *b,
                       struct ibv_sge *sge, const char *go_file) {
    int ok = 1;
    struct ibv_wc wc[32];
    int n = 0;
    uint64_t deadline = now_ms() + 60000;
    /* Only the data path while the broker restarts; then 300 ms more, for anything late. */
    while (access(go_file, F_OK) != 0 && now_ms() < deadline) {
        n += poll_both(send_cq, recv_cq, wc + n, 32 - n, 1, now_ms() + 10);
    }
    ok &= check(access(go_file, F_OK) == 0, "the test said go");
    n += poll_both(send_cq, recv_cq, wc + n, 32 - n, 1, now_ms() + 300);
    struct pollfd p = {ctx->async_fd, POLLIN, 0};
    int readable = poll(&p, 1, 0);
    printf("after_restart completions=%d cq_event=%d async_readable=%d\n", n, cq_event_state(), readable);
    ok &= check(n == 0, "no completion across the restart");
    ok &= check(cq_event_state() == 1, "no channel event across the restart");
    ok &= check(readable == 0, "the async fd stays silent across the restart");
    struct ibv_qp_attr attr;
    struct ibv_qp_init_attr init;
    int rc = ibv_query_qp(a, &attr, IBV_QP_STATE, &init);
    printf("query_qp rc=%d state=%s\n", rc, rc == 0 && attr.qp_state == IBV_QPS_RTS ? "RTS" : "other");
    ok &= check(rc == 0 && attr.qp_state == IBV_QPS_RTS, "QP still in RTS");

    /* The queues still work: b's receives let a's waiting SENDs through. */
    for (int i = 0; i < SENDS; ++i) {
        struct ibv_recv_wr *bad = NULL;
        if (post_recv(b, PEER_RECV_WR_ID + i, sge, &bad) != 0) {
            fail("ibv_post_recv on b", "refused");
        }
    }
    n = poll_both(send_cq, recv_cq, wc, 32, 2 + SENDS, now_ms() + 20000); /* 2 signaled SENDs */
    int sends = 0, recvs = 0, good = 1;
    for (int i = 0; i < n; ++i) {
        good &= wc[i].status == IBV_WC_SUCCESS;
        if (wc[i].qp_num == a->qp_num) {
            ++sends;
        } else {
            ++recvs;
        }
    }
    uint64_t until = now_ms() + 5000;
    while (cq_event_state() == 1 && now_ms() < until) {
        usleep(1000);
    }
    printf("restart ok=%d sends=%d recvs=%d cq_event=%d\n", good, sends, recvs, cq_event_state());
    ok &= check(good && sends == 2 && recvs == SENDS, "the SENDs complete after the restart");
    ok &= check(cq_event_state() == 0, "the channel event of the real completions");
    return ok;
}

int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[2], "evict") != 0 && strcmp(argv[2], "restart") != 0) ||
        (strcmp(argv[2], "restart") == 0 && argc < 4)) {
        fprintf(stderr, "usage: %s DEVICE evict | DEVICE restart GO_FILE\n", rc_prog);
        return 2;
    }
    const int evict = strcmp(argv[2], "evict") == 0;
    struct ibv_context *ctx = open_named(argv[1]);
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    channel = pd != NULL ? ibv_create_comp_channel(ctx) : NULL;
    struct ibv_cq *send_cq = channel != NULL ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
    recv_cq = send_cq != NULL ? ibv_create_cq(ctx, 64, NULL, channel, 0) : NULL;
    if (recv_cq == NULL || ibv_req_notify_cq(recv_cq, 0) != 0) {
        fail("PD, channel, CQs", strerror(errno));
    }
    struct ibv_qp *a = make_qp(pd, send_cq, recv_cq), *b = make_qp(pd, send_cq, recv_cq);
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, port.lid);
    to_rts(b, a->qp_num, port.lid);
    char *buf = calloc(1, 4096);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, kAccess);
    if (mr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    struct ibv_sge sge = {(uintptr_t)buf, 64, mr->lkey};
    for (int i = 0; i < RECVS; ++i) {
        struct ibv_recv_wr *bad = NULL;
        if (post_recv(a, RECV_WR_ID + i, &sge, &bad) != 0) {
            fail("ibv_post_recv", "refused");
        }
    }
    for (int i = 0; i < SENDS; ++i) {
        int bad_ok = 0;
        if (post_send(a, SEND_WR_ID + i, &sge, i != 1, &bad_ok) != 0) { /* 201 unsignaled */
            fail("ibv_post_send", "refused");
        }
    }
    pthread_t waiter;
    if (pthread_create(&waiter, NULL, wait_cq_event, NULL) != 0) {
        fail("pthread_create", "refused");
    }
    printf("ready qpn=%u,%u\n", a->qp_num, b->qp_num);
    fflush(stdout);

    int ok = evict ? run_evict(ctx, send_cq, a, &sge) : run_restart(ctx, send_cq, a, b, &sge, argv[3]);
    if (cq_event_state() == 1) {
        /* Not woken (a failed check): the waiter blocks in read(); exit without it. */
        printf("done ok=%d\n", ok);
        fflush(stdout);
        _exit(ok ? 0 : 1);
    }
    pthread_join(waiter, NULL);

    /* Tearing down after the end never crashes (destroys free locally; their rc is not checked). */
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(send_cq);
    ibv_destroy_cq(recv_cq);
    ibv_destroy_comp_channel(channel);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(buf);
    printf("done ok=%d\n", ok);
    fflush(stdout);
    return ok ? 0 : 1;
}
