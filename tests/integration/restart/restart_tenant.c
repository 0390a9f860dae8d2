/*
 * A tenant that must not notice broker restarts: an RC loopback pair on a brokered device, a
 * continuous verified RDMA WRITE loop (every completion checked, every value checked at the
 * target) into a CQ resized before it starts and an MR re-registered onto other memory and
 * another PD before it starts (ibv_rereg_mr), a UD address handle made before and destroyed
 * after the restarts (the broker keeps it), device memory (ibv_alloc_dm) holding a pattern copied
 * in before the restarts and checked after them, with a zero-based MR on it that every 16th
 * iteration WRITEs into (checked with ibv_memcpy_from_dm), two memory windows (type 1 bound with
 * ibv_bind_mw, type 2 with a BIND_MW work request) bound once before the restarts, which every
 * 16th iteration WRITEs through (their bindings live only in the driver's window records), and a
 * control call (create + destroy a QP) every 20 ms, through the standard verbs (linked against the system
 * libibverbs; run through ibv-extend-run so the face serves it).
 *
 *   restart-tenant DEVICE [windows]
 *
 * "windows" (the chaos soak): a WRITE whose completion never comes while its value is at the
 * target is softnda SPEC.md §10's lost-CQE window (a kill -9 between the WQE's ci store and its
 * CQE), counted in win_cqe instead of failing. Without it, any missing completion fails.
 *
 * stdout: "ready qpn=A,B\n" once the pair is up, then, when stdin reaches EOF (the test closes
 * it), "done wrs=N failed=F max_gap_us=G control=C control_failed=X max_control_us=M win_cqe=W\n". Exit 0
 * when nothing failed. max_gap_us is the longest time between two completions: the stall a restart causes.
 * "gap" lines ("gap us=G at_wr=N") report each gap over 20 ms as it happens.
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *rc_prog = "restart-tenant";
#include "../verbs/rc_helpers.h"

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Binds mw to [addr, addr+len) of mr through qp (type 1: ibv_bind_mw; type 2: a BIND_MW work
 * request with the next key), waits for its completion, and returns the window's new rkey. */
static uint32_t bind_window(struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mw *mw, struct ibv_mr *mr,
                            void *addr, size_t len) {
    struct ibv_mw_bind_info info = {.mr = mr,
                                    .addr = (uintptr_t)addr,
                                    .length = len,
                                    .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    uint32_t rkey = ibv_inc_rkey(mw->rkey);
    if (mw->type == IBV_MW_TYPE_1) {
        struct ibv_mw_bind bind = {.wr_id = 1, .send_flags = IBV_SEND_SIGNALED, .bind_info = info};
        if (ibv_bind_mw(qp, mw, &bind) != 0) {
            fail("ibv_bind_mw", strerror(errno));
        }
        rkey = mw->rkey;
    } else {
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = 2;
        wr.opcode = IBV_WR_BIND_MW;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.bind_mw.mw = mw;
        wr.bind_mw.rkey = rkey;
        wr.bind_mw.bind_info = info;
        if (ibv_post_send(qp, &wr, &bad) != 0) {
            fail("BIND_MW", strerror(errno));
        }
    }
    struct ibv_wc wc;
    if (!poll_wc_within(cq, &wc, 30, "BIND_MW") || wc.status != IBV_WC_SUCCESS ||
        wc.opcode != IBV_WC_BIND_MW) {
        fail("binding a memory window", "no successful completion");
    }
    return rkey;
}

static int stdin_closed(void) {
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) {
        return 0;
    }
    char c;
    return read(0, &c, 1) <= 0;
}

int main(int argc, char **argv) {
    struct ibv_context *ctx = open_named(argc > 1 ? argv[1] : "softnda0");
    const int count_windows = argc > 2 && strcmp(argv[2], "windows") == 0;
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = pd != NULL ? ibv_create_cq(ctx, 64, NULL, NULL, 0) : NULL;
    if (cq == NULL) {
        fail("PD, CQ", strerror(errno));
    }
    /* A CQ with a completion channel: its create carries an fd (an eventfd) to the broker. */
    struct ibv_comp_channel *channel = ibv_create_comp_channel(ctx);
    struct ibv_cq *event_cq = channel != NULL ? ibv_create_cq(ctx, 4, NULL, channel, 0) : NULL;
    if (event_cq == NULL) {
        fail("a CQ with a completion channel", strerror(errno));
    }
    /* The loop's completions arrive in a resized CQ: each restart must bring back its new ring. */
    if (ibv_resize_cq(cq, 256) != 0 || cq->cqe < 256) {
        fail("ibv_resize_cq", strerror(errno));
    }
    struct ibv_qp *a = rc_qp(pd, cq), *b = rc_qp(pd, cq);
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, port.lid);
    to_rts(b, a->qp_num, port.lid);
    uint64_t *src = calloc(1, 64), *first = calloc(1, 64), *dst = calloc(1, 4096);
    struct ibv_pd *other_pd = ibv_alloc_pd(ctx);
    struct ibv_mr *smr = ibv_reg_mr(pd, src, 64, kAccess);
    struct ibv_mr *dmr = other_pd != NULL ? ibv_reg_mr(other_pd, first, 64, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (smr == NULL || dmr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    /* The loop WRITEs into a re-registered MR: each restart must bring back its new memory, its keys,
     * access and PD (the QPs'; under other_pd, still allocated, every WRITE would fail). */
    if (ibv_rereg_mr(dmr,
                     IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS,
                     pd, dst, 4096, kAccess | IBV_ACCESS_MW_BIND) != 0) {
        fail("ibv_rereg_mr", strerror(errno));
    }
    struct ibv_ah_attr ah_attr = {.dlid = port.lid, .port_num = 1};
    struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
    if (ah == NULL) {
        fail("ibv_create_ah", strerror(errno));
    }
    /* Device memory (softnda SPEC.md §17): its bytes and its MR must come back with each restart. */
    struct ibv_alloc_dm_attr dm_attr = {.length = 4096};
    struct ibv_dm *dm = ibv_alloc_dm(ctx, &dm_attr);
    uint8_t pattern[64], seen[64];
    for (unsigned k = 0; k < sizeof(pattern); ++k) {
        pattern[k] = (uint8_t)(k * 7 + 1);
    }
    if (dm == NULL || ibv_memcpy_to_dm(dm, 0, pattern, sizeof(pattern)) != 0) {
        fail("ibv_alloc_dm", strerror(errno));
    }
    struct ibv_mr *dm_mr = ibv_reg_dm_mr(pd, dm, 0, 4096, kAccess | IBV_ACCESS_ZERO_BASED);
    if (dm_mr == NULL) {
        fail("ibv_reg_dm_mr", strerror(errno));
    }
    /* Memory windows onto dst (softnda SPEC.md §16), bound by the data path: the type 2 window
     * through b, the responder of a's WRITEs, the only QP that may use it. */
    struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
    if (mw1 == NULL || mw2 == NULL) {
        fail("ibv_alloc_mw", strerror(errno));
    }
    uint64_t *const at_mw[2] = {dst + 256, dst + 320}; /* bytes 2048 and 2560 of dst */
    const uint32_t mw_rkey[2] = {bind_window(a, cq, mw1, dmr, at_mw[0], 512),
                                 bind_window(b, cq, mw2, dmr, at_mw[1], 512)};
    printf("ready qpn=%u,%u\n", a->qp_num, b->qp_num);
    fflush(stdout);

    uint64_t wrs = 0, failed = 0, control = 0, control_failed = 0, max_gap = 0, max_control = 0, win_cqe = 0;
    uint64_t last = now_us(), last_control = last;
    for (uint64_t i = 1;; ++i) {
        if ((i & 63) == 0 && stdin_closed()) {
            break;
        }
        *src = i;
        struct ibv_sge sge = {(uintptr_t)src, 8, smr->lkey};
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = (uintptr_t)dst;
        wr.wr.rdma.rkey = dmr->rkey;
        if (ibv_post_send(a, &wr, &bad) != 0) {
            fail("ibv_post_send", strerror(errno));
        }
        struct ibv_wc wc;
        const int completed = poll_wc_within(cq, &wc, 30, "WRITE");
        if (!completed && !(count_windows && __atomic_load_n(dst, __ATOMIC_ACQUIRE) == i)) {
            fail("WRITE", "no completion in 30 s");
        }
        uint64_t t = now_us();
        if (t - last > max_gap) {
            max_gap = t - last;
        }
        if (t - last > 20000) {
            printf("gap us=%llu at_wr=%llu\n", (unsigned long long)(t - last), (unsigned long long)i);
            fflush(stdout);
        }
        last = t;
        ++wrs;
        if (!completed) {
            ++win_cqe;  // the WRITE ran once; its CQE is what the window loses
            fprintf(stderr, "restart-tenant: WR %llu: CQE lost, the value at the target (SPEC.md §10)\n",
                    (unsigned long long)i);
            continue;
        }
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != i || __atomic_load_n(dst, __ATOMIC_ACQUIRE) != i) {
            ++failed;
            fprintf(stderr, "restart-tenant: WR %llu: status %s, wr_id %llu, target %llu\n",
                    (unsigned long long)i, ibv_wc_status_str(wc.status), (unsigned long long)wc.wr_id,
                    (unsigned long long)*dst);
        }
        if ((i & 15) == 0) {  // the same WRITE into device memory, zero-based address 64
            wr.wr.rdma.remote_addr = 64;
            wr.wr.rdma.rkey = dm_mr->rkey;
            if (ibv_post_send(a, &wr, &bad) != 0) {
                fail("ibv_post_send", strerror(errno));
            }
            const int dm_completed = poll_wc_within(cq, &wc, 30, "WRITE to device memory");
            uint64_t in_dm = 0;
            const int dm_read = ibv_memcpy_from_dm(&in_dm, dm, 64, 8) == 0;
            if (!dm_completed && count_windows && dm_read && in_dm == i) {
                ++win_cqe;
                fprintf(
                    stderr,
                    "restart-tenant: WR %llu into device memory: CQE lost, the value there (SPEC.md §10)\n",
                    (unsigned long long)i);
            } else if (!dm_completed) {
                fail("WRITE to device memory", "no completion in 30 s");
            } else if (wc.status != IBV_WC_SUCCESS || !dm_read || in_dm != i) {
                ++failed;
                fprintf(stderr, "restart-tenant: WR %llu into device memory: status %s, DM holds %llu\n",
                        (unsigned long long)i, ibv_wc_status_str(wc.status), (unsigned long long)in_dm);
            }
            last = now_us();
        }
        if ((i & 15) == 8) {  // the same WRITE through each window, 8 bytes into it
            for (int k = 0; k < 2; ++k) {
                wr.wr.rdma.remote_addr = (uintptr_t)(at_mw[k] + 1);
                wr.wr.rdma.rkey = mw_rkey[k];
                if (ibv_post_send(a, &wr, &bad) != 0) {
                    fail("ibv_post_send", strerror(errno));
                }
                const int mw_completed = poll_wc_within(cq, &wc, 30, "WRITE through a window");
                const uint64_t there = __atomic_load_n(at_mw[k] + 1, __ATOMIC_ACQUIRE);
                if (!mw_completed && count_windows && there == i) {
                    ++win_cqe;
                    fprintf(stderr,
                            "restart-tenant: WR %llu through window %d: CQE lost, the value there (SPEC.md "
                            "§10)\n",
                            (unsigned long long)i, k + 1);
                } else if (!mw_completed) {
                    fail("WRITE through a window", "no completion in 30 s");
                } else if (wc.status != IBV_WC_SUCCESS || there != i) {
                    ++failed;
                    fprintf(stderr, "restart-tenant: WR %llu through window %d: status %s, target %llu\n",
                            (unsigned long long)i, k + 1, ibv_wc_status_str(wc.status),
                            (unsigned long long)there);
                }
            }
            last = now_us();
        }
        if (t - last_control >= 20000) {
            last_control = t;
            ++control;
            struct ibv_qp *extra = rc_qp_or_null(pd, cq);
            if (extra == NULL || ibv_destroy_qp(extra) != 0) {
                ++control_failed;
                fprintf(stderr, "restart-tenant: control call %llu failed: %s\n", (unsigned long long)control,
                        strerror(errno));
            }
            last = now_us();  // the control call's own time is not a completion gap
            if (last - t > max_control) {
                max_control = last - t;
            }
        }
    }
    /* The pattern copied into device memory before the restarts is still there. */
    if (ibv_memcpy_from_dm(seen, dm, 0, sizeof(seen)) != 0 || memcmp(seen, pattern, sizeof(seen)) != 0) {
        fprintf(stderr, "restart-tenant: device memory lost its contents\n");
        ++failed;
    }
    /* The AH made before the restarts is destroyed by the broker that serves now. */
    if (ibv_destroy_ah(ah) != 0) {
        fprintf(stderr, "restart-tenant: ibv_destroy_ah after the restarts: %s\n", strerror(errno));
        ++control_failed;
    }
    printf(
        "done wrs=%llu failed=%llu max_gap_us=%llu control=%llu control_failed=%llu max_control_us=%llu "
        "win_cqe=%llu\n",
        (unsigned long long)wrs, (unsigned long long)failed, (unsigned long long)max_gap,
        (unsigned long long)control, (unsigned long long)control_failed, (unsigned long long)max_control,
        (unsigned long long)win_cqe);
    fflush(stdout);
    ibv_dealloc_mw(mw1);
    ibv_dealloc_mw(mw2);
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_dereg_mr(smr);
    ibv_dereg_mr(dmr);
    ibv_dereg_mr(dm_mr);
    ibv_free_dm(dm);
    ibv_dealloc_pd(other_pd);
    ibv_destroy_cq(cq);
    ibv_destroy_cq(event_cq);
    ibv_destroy_comp_channel(channel);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    return failed == 0 && control_failed == 0 ? 0 : 1;
}
