/*
 * No NULL op: every function pointer the face hands a program is set, in every table a consumer
 * calls through (verbs_context, the context ops, ibv_cq_ex, ibv_qp_ex of each QP type and each
 * send_ops_flags), and the slots the face does not serve answer as rdma-core's dummy ops do
 * (EOPNOTSUPP), called straight through the table. Then the UD post path of ibv_qp_ex, which a
 * NULL wr_set_ud_addr used to crash: ibv_wr_send, ibv_wr_send_imm and a zero-length send, each
 * with ibv_wr_set_ud_addr, between two UD QPs, payload and immediate checked; and on a QP moved
 * back to RESET, ibv_wr_complete answers EINVAL.
 *
 * Each table is walked as an array of pointers over exactly the span of its function pointers
 * (checked against the struct's layout, so a field added to <infiniband/verbs.h> that the walk
 * does not cover fails the build's static checks, not a consumer).
 *
 *   verbs-slots DEVICE      exit 0 and "OK", or 1 with "verbs-slots: <step>: <why>"
 */
#include <endian.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rc_prog = "verbs-slots";
#include "rc_helpers.h"

/* Pointers from first to end (offsets in the struct) must all be set. */
static void expect_slots(const void *table, size_t first, size_t end, const char *what) {
    const char *base = (const char *)table;
    for (size_t off = first; off < end; off += sizeof(void *)) {
        void *slot;
        memcpy(&slot, base + off, sizeof(slot));
        if (slot == NULL) {
            char why[96];
            snprintf(why, sizeof(why), "the slot at offset %zu is NULL", off);
            fail(what, why);
        }
    }
}

/* Every verbs_context entry (priv is data, not an op: it is skipped) and every context op. */
static void walk_context(struct ibv_context *ctx) {
    struct verbs_context *v = verbs_get_ctx(ctx);
    if (v == NULL) {
        fail("verbs_get_ctx", "not an extended context");
    }
    _Static_assert(offsetof(struct verbs_context, query_port) == 0, "verbs_context starts with query_port");
    _Static_assert(offsetof(struct verbs_context, query_device_ex) ==
                       offsetof(struct verbs_context, priv) + sizeof(void *),
                   "priv is the only data between the ops");
    _Static_assert(offsetof(struct verbs_context, _ABI_placeholder3) ==
                       offsetof(struct verbs_context, close_xrcd) + sizeof(void *),
                   "close_xrcd is the last op");
    /* The context's struct starts at sz's end: verbs_get_ctx found v by it. */
    expect_slots(v, 0, offsetof(struct verbs_context, priv), "verbs_context");
    expect_slots(v, offsetof(struct verbs_context, query_device_ex),
                 offsetof(struct verbs_context, _ABI_placeholder3), "verbs_context");
    if ((void *)v->ABI_placeholder1 != (void *)v->ibv_create_flow ||
        (void *)v->ABI_placeholder2 != (void *)v->ibv_destroy_flow) {
        fail("verbs_context",
             "ABI_placeholder1/2 are not the flow entries (libibverbs 1.1.8 programs call them)");
    }
    _Static_assert(sizeof(struct ibv_context_ops) % sizeof(void *) == 0, "ibv_context_ops is all pointers");
    expect_slots(&ctx->ops, 0, sizeof(ctx->ops), "ibv_context_ops");

    /* The refused ones answer, called through the table as a consumer without the inline
     * wrappers would. */
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (pd == NULL) {
        fail("ibv_alloc_pd", strerror(errno));
    }
    errno = 0;
    if (v->create_wq(ctx, &(struct ibv_wq_init_attr){0}) != NULL || errno != EOPNOTSUPP) {
        fail("verbs_context.create_wq", "not refused with EOPNOTSUPP");
    }
    errno = 0;
    if (v->create_counters(ctx, &(struct ibv_counters_init_attr){0}) != NULL || errno != EOPNOTSUPP) {
        fail("verbs_context.create_counters", "not refused with EOPNOTSUPP");
    }
    errno = 0;
    if (v->alloc_null_mr(pd) != NULL || errno != EOPNOTSUPP) {
        fail("verbs_context.alloc_null_mr", "not refused with EOPNOTSUPP");
    }
    if (v->advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, NULL, 0) != EOPNOTSUPP) {
        fail("verbs_context.advise_mr", "not refused with EOPNOTSUPP");
    }
    if (v->modify_cq(NULL, NULL) != EOPNOTSUPP) {
        fail("verbs_context.modify_cq", "not refused with EOPNOTSUPP");
    }
    struct ibv_ops_wr op;
    memset(&op, 0, sizeof(op));
    struct ibv_ops_wr *bad_op = NULL;
    if (v->post_srq_ops(NULL, &op, &bad_op) != EOPNOTSUPP || bad_op != &op) {
        fail("verbs_context.post_srq_ops", "not refused with EOPNOTSUPP and *bad_op");
    }
    errno = 0;
    if (ctx->ops._compat_alloc_pd() != NULL || errno != EOPNOTSUPP) {
        fail("ibv_context_ops._compat_alloc_pd", "not refused with EOPNOTSUPP");
    }
    /* The two compat ops libibverbs points at working verbs answer. */
    struct ibv_device_attr dattr;
    if (ctx->ops._compat_query_device(ctx, &dattr) != 0 || dattr.phys_port_cnt < 1) {
        fail("ibv_context_ops._compat_query_device", "does not answer");
    }
    struct ibv_port_attr pattr;
    if (ctx->ops._compat_query_port(ctx, 1, (struct _compat_ibv_port_attr *)&pattr) != 0 ||
        pattr.state != IBV_PORT_ACTIVE) {
        fail("ibv_context_ops._compat_query_port", "does not answer");
    }
    ibv_dealloc_pd(pd);
}

static void walk_cq_ex(struct ibv_context *ctx) {
    struct ibv_cq_init_attr_ex a;
    memset(&a, 0, sizeof(a));
    a.cqe = 8;
    a.wc_flags = IBV_WC_STANDARD_FLAGS;
    struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &a);
    if (cq == NULL) {
        fail("ibv_create_cq_ex", strerror(errno));
    }
    _Static_assert(sizeof(struct ibv_cq_ex) - offsetof(struct ibv_cq_ex, start_poll) == 18 * sizeof(void *),
                   "ibv_cq_ex ends with its 18 ops");
    expect_slots(cq, offsetof(struct ibv_cq_ex, start_poll), sizeof(*cq), "ibv_cq_ex");
    ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

/* An ibv_qp_ex of type with each served send operation alone, then all of them. */
static void walk_qp_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type type) {
    static const uint64_t ops[] = {IBV_QP_EX_WITH_RDMA_WRITE,
                                   IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM,
                                   IBV_QP_EX_WITH_SEND,
                                   IBV_QP_EX_WITH_SEND_WITH_IMM,
                                   IBV_QP_EX_WITH_RDMA_READ,
                                   IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
                                   IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
                                   IBV_QP_EX_WITH_LOCAL_INV,
                                   IBV_QP_EX_WITH_BIND_MW,
                                   IBV_QP_EX_WITH_SEND_WITH_INV,
                                   0 /* all of the above */};
    uint64_t all = 0;
    for (size_t i = 0; i + 1 < sizeof(ops) / sizeof(ops[0]); ++i) {
        all |= ops[i];
    }
    int walked = 0;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); ++i) {
        struct ibv_qp_init_attr_ex a;
        memset(&a, 0, sizeof(a));
        a.qp_type = type;
        a.send_cq = cq;
        a.recv_cq = type == IBV_QPT_XRC_SEND ? NULL : cq;
        a.cap.max_send_wr = 4;
        a.cap.max_recv_wr = type == IBV_QPT_XRC_SEND ? 0 : 4;
        a.cap.max_send_sge = 1;
        a.cap.max_recv_sge = type == IBV_QPT_XRC_SEND ? 0 : 1;
        a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        a.pd = pd;
        a.send_ops_flags = ops[i] != 0 ? ops[i] : all;
        struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
        if (qp == NULL) {
            if (errno == EOPNOTSUPP || errno == EINVAL) {
                continue; /* an operation this transport does not carry: refused, not half made */
            }
            fail("ibv_create_qp_ex", strerror(errno));
        }
        struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
        if (x == NULL) {
            fail("ibv_qp_to_qp_ex", "NULL for a QP made with send_ops_flags");
        }
        _Static_assert(
            sizeof(struct ibv_qp_ex) - offsetof(struct ibv_qp_ex, wr_atomic_cmp_swp) == 21 * sizeof(void *),
            "ibv_qp_ex ends with its 21 ops");
        expect_slots(x, offsetof(struct ibv_qp_ex, wr_atomic_cmp_swp), sizeof(*x), "ibv_qp_ex");
        ibv_destroy_qp(qp);
        ++walked;
    }
    if (walked < 2) {
        fail("ibv_create_qp_ex", "fewer than two send_ops_flags made a QP of this type");
    }
}

/* UD sends through ibv_wr_*: plain, with immediate, zero bytes; every byte and the immediate
 * checked at the receiver (behind the 40-byte GRH room). */
static void ud_sends(struct ibv_context *ctx, struct ibv_pd *pd) {
    enum { kQkey = 0x11111111, kLen = 256, kGrh = 40 };
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (cq == NULL) {
        fail("ibv_create_cq", strerror(errno));
    }
    struct ibv_qp *rx = ud_qp_rts(pd, cq, 8, kQkey);
    struct ibv_qp_init_attr_ex a;
    memset(&a, 0, sizeof(a));
    a.qp_type = IBV_QPT_UD;
    a.send_cq = cq;
    a.recv_cq = cq;
    a.cap.max_send_wr = 8;
    a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = pd;
    a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
    struct ibv_qp *tx = ibv_create_qp_ex(ctx, &a);
    if (tx == NULL) {
        fail("ibv_create_qp_ex UD", strerror(errno));
    }
    ud_to_rts(tx, kQkey);
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", strerror(errno));
    }
    struct ibv_ah_attr ah_attr;
    memset(&ah_attr, 0, sizeof(ah_attr));
    ah_attr.dlid = port.lid;
    ah_attr.port_num = 1;
    struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
    if (ah == NULL) {
        fail("ibv_create_ah", strerror(errno));
    }
    static char buf[2][kGrh + kLen];
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    if (mr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    struct ibv_qp_ex *x = ibv_qp_to_qp_ex(tx);
    const uint32_t lens[3] = {kLen, kLen, 0};
    for (int round = 0; round < 3; ++round) {
        memset(buf, 0, sizeof(buf));
        for (int i = 0; i < kLen; ++i) {
            buf[0][kGrh + i] = (char)(i * 7 + round);
        }
        struct ibv_sge rsge = {(uintptr_t)buf[1], kGrh + kLen, mr->lkey};
        struct ibv_recv_wr rwr = {.wr_id = 100 + round, .sg_list = &rsge, .num_sge = 1}, *bad_r;
        if (ibv_post_recv(rx, &rwr, &bad_r) != 0) {
            fail("ibv_post_recv", strerror(errno));
        }
        ibv_wr_start(x);
        x->wr_id = 200 + round;
        x->wr_flags = IBV_SEND_SIGNALED;
        if (round == 1) {
            ibv_wr_send_imm(x, htobe32(0xc0ffee));
        } else {
            ibv_wr_send(x);
        }
        ibv_wr_set_ud_addr(x, ah, rx->qp_num, kQkey);
        ibv_wr_set_sge(x, mr->lkey, (uintptr_t)&buf[0][kGrh], lens[round]);
        if (ibv_wr_complete(x) != 0) {
            fail("ibv_wr_complete UD", strerror(errno));
        }
        int got_send = 0, got_recv = 0;
        while (!got_send || !got_recv) {
            struct ibv_wc wc = wait_wc(cq, "UD send");
            if (wc.status != IBV_WC_SUCCESS) {
                fail("UD send", ibv_wc_status_str(wc.status));
            }
            if (wc.wr_id == (uint64_t)(200 + round)) {
                got_send = 1;
                continue;
            }
            if (wc.wr_id != (uint64_t)(100 + round) || wc.byte_len != kGrh + lens[round] ||
                wc.src_qp != tx->qp_num) {
                fail("UD receive", "wrong wr_id, length or source QP");
            }
            if (((wc.wc_flags & IBV_WC_WITH_IMM) != 0) != (round == 1) ||
                (round == 1 && wc.imm_data != htobe32(0xc0ffee))) {
                fail("UD receive", "immediate data not as sent");
            }
            if (memcmp(buf[0] + kGrh, buf[1] + kGrh, lens[round]) != 0) {
                fail("UD receive", "payload differs");
            }
            got_recv = 1;
        }
    }
    /* A QP moved back to RESET refuses the batch (EINVAL), as rdma-core's providers do. */
    struct ibv_qp_attr qa;
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    if (ibv_modify_qp(tx, &qa, IBV_QP_STATE) != 0) {
        fail("UD RESET", "refused");
    }
    ibv_wr_start(x);
    x->wr_id = 300;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send(x);
    ibv_wr_set_ud_addr(x, ah, rx->qp_num, kQkey);
    ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf[0], 8);
    int rc = ibv_wr_complete(x);
    if (rc != EINVAL) {
        fail("ibv_wr_complete in RESET", rc == 0 ? "accepted" : strerror(rc));
    }
    /* The operations the QP was not made with, and those the device lacks, fail the batch
     * instead of crashing. */
    ibv_wr_start(x);
    x->wr_send_tso(x, buf[0], 0, 0);
    if (ibv_wr_complete(x) != EOPNOTSUPP) {
        fail("wr_send_tso", "not refused with EOPNOTSUPP");
    }
    ibv_destroy_qp(tx);
    ibv_destroy_qp(rx);
    ibv_destroy_ah(ah);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: verbs-slots DEVICE\n");
        return 2;
    }
    struct ibv_context *ctx = open_named(argv[1]);
    walk_context(ctx);
    walk_cq_ex(ctx);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (pd == NULL || cq == NULL) {
        fail("ibv_alloc_pd/ibv_create_cq", strerror(errno));
    }
    const enum ibv_qp_type types[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); ++i) {
        walk_qp_ex(ctx, pd, cq, types[i]);
    }
    ud_sends(ctx, pd);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    printf("OK\n");
    return 0;
}
