/*
 * A tenant of the chaos soak (chaos_soak_test.cpp): an RC loopback pair on a brokered device
 * running a seeded random mix of RDMA WRITE, RDMA READ, SEND/RECV, fetch-and-add and
 * compare-and-swap, every completion's status, wr_id and length checked and every byte checked
 * at its destination; between them it churns CQs, MRs and QPs and forks children that open the
 * device and register memory. Through the standard verbs (linked against the system libibverbs,
 * run through ibv-extend-run), like restart-tenant.
 *
 *   chaos-tenant DEVICE SEED [fork]
 * ("fork": also fork a child now and then, see fork_child)
 *
 * stdout: "ready\n" once the pair is up; when stdin reaches EOF, "done ops=N writes=W reads=R
 * sends=S atomics=A churn=C forks=F failed=X win_atomic=.. win_recv=.. win_cqe=..\n". Exit 0
 * when nothing failed. The win_* figures count what softnda SPEC.md §10 says a kill may do
 * ("What remains"), each seen and checked to be exactly that window's effect:
 *   win_atomic  an atomic applied twice (the value is one more add, or the swap's, beyond);
 *   win_recv    a receive consumed without a completion, the message in the next receive;
 *   win_cqe     a completion lost while its effect is there (the WQE ran once).
 * fork_no_session counts forked children whose session could not open (ENOTCONN) although the
 * open is retried across a restart until IBV_EXTEND_TIMEOUT_MS (docs/restart.md): restarts back
 * to back for that long; not a lost operation.
 * Anything else (a wrong status, a wrong byte, an effect missing) is a failure, on stderr.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *rc_prog = "chaos-tenant";
#include "../verbs/rc_helpers.h"

enum { kBuf = 4096, kRecvSlots = 4, kRecvSize = 256, kCqeWaitS = 20, kChildWaitS = 30 };

static uint64_t rng_state;
static uint64_t next_rand(void) { /* xorshift64*: the run is the seed's */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static uint64_t failed, win_atomic, win_recv, win_cqe, fork_no_session;

#define FAILURE(...)                                   \
    do {                                               \
        ++failed;                                      \
        fprintf(stderr, "chaos-tenant: " __VA_ARGS__); \
        fputc('\n', stderr);                           \
    } while (0)

static int stdin_closed(void) {
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) {
        return 0;
    }
    char c;
    return read(0, &c, 1) <= 0;
}

/* A completion within kCqeWaitS seconds (1), or none (0): a broker crash and restart pause
 * completions for a while. */
static int poll_wc(struct ibv_cq *cq, struct ibv_wc *wc) {
    return poll_wc_within(cq, wc, kCqeWaitS, "ibv_poll_cq");
}

struct pair {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *scq, *rcq;
    struct ibv_qp *a, *b; /* a sends, b receives */
    uint8_t *local, *remote, *rbuf;
    struct ibv_mr *lmr, *rmr, *bmr;
    uint64_t recv_posted, recv_expected; /* receive sequence numbers: posted up to, next due */
};

static void post_recv(struct pair *p) {
    uint64_t seq = p->recv_posted++;
    struct ibv_sge sge = {(uintptr_t)(p->rbuf + (seq % kRecvSlots) * kRecvSize), kRecvSize, p->bmr->lkey};
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = seq;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_recv(p->b, &wr, &bad) != 0) {
        fail("ibv_post_recv", strerror(errno));
    }
}

/* Posts one signalled WR on a and returns whether its completion came (checked: status, wr_id). */
static int run_wr(struct pair *p, struct ibv_send_wr *wr, const char *what, uint64_t id) {
    struct ibv_send_wr *bad = NULL;
    wr->wr_id = id;
    wr->send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(p->a, wr, &bad) != 0) {
        fail("ibv_post_send", strerror(errno));
    }
    struct ibv_wc wc;
    if (!poll_wc(p->scq, &wc)) {
        return 0;
    }
    if (wc.status != IBV_WC_SUCCESS || wc.wr_id != id) {
        FAILURE("%s %llu: status %s, wr_id %llu", what, (unsigned long long)id, ibv_wc_status_str(wc.status),
                (unsigned long long)wc.wr_id);
    }
    return 1;
}

static void fill(uint8_t *buf, size_t len, uint64_t id) {
    for (size_t i = 0; i < len; ++i) {
        buf[i] = (uint8_t)(id * 131 + i * 7 + 1);
    }
}

static int matches(const volatile uint8_t *buf, size_t len, uint64_t id) {
    for (size_t i = 0; i < len; ++i) {
        if (buf[i] != (uint8_t)(id * 131 + i * 7 + 1)) {
            return 0;
        }
    }
    return 1;
}

/* WRITE (read == 0) or READ of a random length at a random offset, the bytes checked. */
static void transfer(struct pair *p, uint64_t id, int read) {
    size_t len = 1 + next_rand() % (kBuf / 2), off = next_rand() % (kBuf / 2 - 64);
    uint8_t *from = read ? p->remote + off : p->local, *to = read ? p->local : p->remote + off;
    fill(from, len, id);
    memset(to, 0, len);
    struct ibv_sge sge = {(uintptr_t)p->local, (uint32_t)len, p->lmr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = (uintptr_t)(p->remote + off);
    wr.wr.rdma.rkey = p->rmr->rkey;
    int completed = run_wr(p, &wr, read ? "READ" : "WRITE", id);
    if (!matches(to, len, id)) {
        FAILURE("%s %llu: %zu bytes at offset %zu not as sent (completion %s)", read ? "READ" : "WRITE",
                (unsigned long long)id, len, off, completed ? "seen" : "missing");
    } else if (!completed) {
        ++win_cqe;
    }
}

/* SEND of a random length; the receive's completion and bytes checked. Two receives are kept
 * posted, so a receive consumed without a completion (§10) leaves one for the message. */
static void send_recv(struct pair *p, uint64_t id) {
    size_t len = 1 + next_rand() % kRecvSize;
    fill(p->local, len, id);
    struct ibv_sge sge = {(uintptr_t)p->local, (uint32_t)len, p->lmr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    int sent = run_wr(p, &wr, "SEND", id);
    struct ibv_wc wc;
    if (!poll_wc(p->rcq, &wc)) {
        /* The receive's CQE lost after the commit point: the message is in its buffer. */
        const uint8_t *slot = p->rbuf + (p->recv_expected % kRecvSlots) * kRecvSize;
        if (matches(slot, len, id)) {
            ++win_cqe;
            ++p->recv_expected;
            post_recv(p);
        } else {
            FAILURE("SEND %llu: no receive completion and no message (send completion %s)",
                    (unsigned long long)id, sent ? "seen" : "missing");
        }
        return;
    }
    if (wc.status != IBV_WC_SUCCESS || wc.byte_len != len || wc.wr_id < p->recv_expected ||
        wc.wr_id >= p->recv_posted) {
        FAILURE("SEND %llu: receive status %s, byte_len %u of %zu, wr_id %llu (due %llu)",
                (unsigned long long)id, ibv_wc_status_str(wc.status), wc.byte_len, len,
                (unsigned long long)wc.wr_id, (unsigned long long)p->recv_expected);
        return;
    }
    /* A receive skipped: consumed without a completion, the message delivered into the next. */
    while (p->recv_expected < wc.wr_id) {
        ++win_recv;
        ++p->recv_expected;
        post_recv(p);
    }
    if (!matches(p->rbuf + (wc.wr_id % kRecvSlots) * kRecvSize, len, id)) {
        FAILURE("SEND %llu: received bytes not as sent", (unsigned long long)id);
    }
    if (!sent) {
        ++win_cqe;
    }
    ++p->recv_expected;
    post_recv(p);
}

/* Fetch-and-add or compare-and-swap on the remote counter, whose value the tenant tracks. */
static void atomic_op(struct pair *p, uint64_t id, uint64_t *expected) {
    volatile uint64_t *counter = (volatile uint64_t *)(p->remote + kBuf - 8);
    volatile uint64_t *old = (volatile uint64_t *)(p->local + kBuf - 8);
    int cas = (next_rand() & 1) != 0;
    uint64_t arg = cas ? next_rand() : 1 + next_rand() % 1000;
    uint64_t want = cas ? arg : *expected + arg;
    *old = ~*expected;
    struct ibv_sge sge = {(uintptr_t)old, 8, p->lmr->lkey};
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.wr.atomic.remote_addr = (uintptr_t)counter;
    wr.wr.atomic.rkey = p->rmr->rkey;
    wr.wr.atomic.compare_add = cas ? *expected : arg;
    wr.wr.atomic.swap = cas ? arg : 0;
    int completed = run_wr(p, &wr, cas ? "CMP_SWP" : "FETCH_ADD", id);
    uint64_t now = *counter, got = *old;
    if (now == want && (got == *expected || !completed)) {
        if (!completed) {
            ++win_cqe;
        }
    } else if (completed && !cas && got == *expected + arg && now == *expected + 2 * arg) {
        ++win_atomic; /* applied, then applied again by the successor: it returns the first result */
    } else if (completed && cas && got == arg && now == arg) {
        ++win_atomic; /* swapped, then compared again by the successor: it fails against its own swap */
    } else {
        FAILURE("%s %llu: counter %llu, returned %llu; expected %llu then %llu (completion %s)",
                cas ? "CMP_SWP" : "FETCH_ADD", (unsigned long long)id, (unsigned long long)now,
                (unsigned long long)got, (unsigned long long)*expected, (unsigned long long)want,
                completed ? "seen" : "missing");
    }
    *expected = now;
}

/* Control-path churn: a CQ, an MR of fresh memory, or a QP, made and destroyed. */
static void churn(struct pair *p) {
    switch (next_rand() % 3) {
        case 0: {
            struct ibv_cq *cq = ibv_create_cq(p->ctx, 16, NULL, NULL, 0);
            if (cq == NULL || ibv_destroy_cq(cq) != 0) {
                FAILURE("churn CQ: %s", strerror(errno));
            }
            break;
        }
        case 1: {
            size_t len = 4096 * (1 + next_rand() % 8);
            void *buf = malloc(len);
            struct ibv_mr *mr = buf != NULL ? ibv_reg_mr(p->pd, buf, len, kAccess) : NULL;
            if (mr == NULL || ibv_dereg_mr(mr) != 0) {
                FAILURE("churn MR of %zu bytes: %s", len, strerror(errno));
            }
            free(buf);
            break;
        }
        default: {
            struct ibv_qp *qp = rc_qp_or_null(p->pd, p->scq);
            if (qp == NULL || ibv_destroy_qp(qp) != 0) {
                FAILURE("churn QP: %s", strerror(errno));
            }
        }
    }
}

/* Waits up to kChildWaitS for the forked child, which takes well under a second (each of its
 * calls retries across restarts for 10 s at most). One still there hangs: a failure, reported
 * with where each of its threads sleeps, and it is killed, so the tenant still ends with a
 * "done" line the soak reads. */
static int wait_child(pid_t pid, int *status) {
    for (int waited_ms = 0; waited_ms < kChildWaitS * 1000; waited_ms += 10) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) {
            return 1;
        }
        if (r < 0 && errno != EINTR) {
            FAILURE("forked child: waitpid: %s", strerror(errno));
            return 0;
        }
        struct timespec ten_ms = {0, 10 * 1000 * 1000};
        nanosleep(&ten_ms, NULL);
    }
    FAILURE("forked child %d hangs after %d s; its threads wait in:", (int)pid, (int)kChildWaitS);
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "grep -H . /proc/%d/task/*/wchan /proc/%d/task/*/comm >&2", (int)pid,
             (int)pid);
    if (system(cmd) != 0) {
        fprintf(stderr, "chaos-tenant: (its /proc entries could not be read)\n");
    }
    kill(pid, SIGKILL);
    waitpid(pid, status, 0);
    return 0;
}

/* A child that opens the device (a session of its own) and registers memory, then exits. */
static void fork_child(const char *device) {
    pid_t pid = fork();
    if (pid == 0) {
        int n = 0;
        struct ibv_device **list = ibv_get_device_list(&n);
        if (list == NULL) {
            /* No session: restarts outlasted the open's retries (counted, not a failure: see
             * docs/restart.md, "The tenant's side"). */
            _exit(errno == ENOTCONN ? 2 : 1);
        }
        ibv_free_device_list(list);
        struct ibv_context *ctx = open_named(device);
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        uint8_t *buf = malloc(3 * 4096);
        struct ibv_mr *mr = pd != NULL && buf != NULL ? ibv_reg_mr(pd, buf, 3 * 4096, kAccess) : NULL;
        int ok = mr != NULL && ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0 && ibv_close_device(ctx) == 0;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    if (pid > 0 && !wait_child(pid, &status)) {
        return;
    }
    if (pid < 0 || !WIFEXITED(status) || WEXITSTATUS(status) > 2) {
        FAILURE("forked child registering memory: status %d", status);
    } else if (WEXITSTATUS(status) == 2) {
        ++fork_no_session;
    } else if (WEXITSTATUS(status) != 0) {
        FAILURE("forked child registering memory: exit %d", WEXITSTATUS(status));
    }
}

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "softnda0";
    rng_state = (argc > 2 ? strtoull(argv[2], NULL, 10) : 1) * 0x9E3779B97F4A7C15ull | 1;
    const int forks_too = argc > 3 && strcmp(argv[3], "fork") == 0;
    struct pair p;
    memset(&p, 0, sizeof(p));
    p.ctx = open_named(device);
    struct ibv_port_attr port;
    if (ibv_query_port(p.ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    p.pd = ibv_alloc_pd(p.ctx);
    p.scq = p.pd != NULL ? ibv_create_cq(p.ctx, 64, NULL, NULL, 0) : NULL;
    p.rcq = p.scq != NULL ? ibv_create_cq(p.ctx, 64, NULL, NULL, 0) : NULL;
    if (p.rcq == NULL) {
        fail("PD, CQs", strerror(errno));
    }
    p.a = rc_qp(p.pd, p.scq);
    p.b = rc_qp(p.pd, p.rcq);
    const int access = kAccess | IBV_ACCESS_REMOTE_ATOMIC;
    for (struct ibv_qp **q = &p.a; q <= &p.b; ++q) {
        to_init(*q);
        struct ibv_qp_attr attr;
        memset(&attr, 0, sizeof(attr));
        attr.qp_access_flags = access; /* INIT to INIT: atomics too (rc_helpers leave them out) */
        if (ibv_modify_qp(*q, &attr, IBV_QP_ACCESS_FLAGS) != 0) {
            fail("INIT with atomics", "refused");
        }
    }
    to_rts(p.a, p.b->qp_num, port.lid);
    to_rts(p.b, p.a->qp_num, port.lid);
    p.local = aligned_alloc(4096, kBuf);
    p.remote = aligned_alloc(4096, kBuf);
    /* C11: aligned_alloc's size is a multiple of its alignment (ASan refuses 1024 at 4096). */
    p.rbuf = aligned_alloc(4096, (kRecvSlots * kRecvSize + 4095) / 4096 * 4096);
    p.lmr = ibv_reg_mr(p.pd, p.local, kBuf, access);
    p.rmr = ibv_reg_mr(p.pd, p.remote, kBuf, access);
    p.bmr = ibv_reg_mr(p.pd, p.rbuf, kRecvSlots * kRecvSize, access);
    if (p.lmr == NULL || p.rmr == NULL || p.bmr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    memset(p.remote, 0, kBuf);
    post_recv(&p);
    post_recv(&p);
    printf("ready\n");
    fflush(stdout);

    uint64_t ops = 0, writes = 0, reads = 0, sends = 0, atomics = 0, churns = 0, forks = 0, counter = 0;
    for (uint64_t id = 1;; ++id) {
        if ((id & 15) == 0 && stdin_closed()) {
            break;
        }
        uint64_t r = next_rand() % 1000;
        if (r < 300) {
            transfer(&p, id, 0);
            ++writes;
        } else if (r < 550) {
            transfer(&p, id, 1);
            ++reads;
        } else if (r < 800) {
            send_recv(&p, id);
            ++sends;
        } else if (r < 950) {
            atomic_op(&p, id, &counter);
            ++atomics;
        } else if (r < 998 || !forks_too) {
            churn(&p);
            ++churns;
            continue;
        } else {
            fork_child(device);
            ++forks;
            continue;
        }
        ++ops;
    }
    printf(
        "done ops=%llu writes=%llu reads=%llu sends=%llu atomics=%llu churn=%llu forks=%llu failed=%llu "
        "win_atomic=%llu win_recv=%llu win_cqe=%llu fork_no_session=%llu\n",
        (unsigned long long)ops, (unsigned long long)writes, (unsigned long long)reads,
        (unsigned long long)sends, (unsigned long long)atomics, (unsigned long long)churns,
        (unsigned long long)forks, (unsigned long long)failed, (unsigned long long)win_atomic,
        (unsigned long long)win_recv, (unsigned long long)win_cqe, (unsigned long long)fork_no_session);
    fflush(stdout);
    ibv_destroy_qp(p.a);
    ibv_destroy_qp(p.b);
    ibv_dereg_mr(p.lmr);
    ibv_dereg_mr(p.rmr);
    ibv_dereg_mr(p.bmr);
    ibv_destroy_cq(p.scq);
    ibv_destroy_cq(p.rcq);
    ibv_dealloc_pd(p.pd);
    ibv_close_device(p.ctx);
    return failed == 0 ? 0 : 1;
}
