/*
 * XRC through the standard verbs alone (softnda SPEC.md §14; linked against the system
 * libibverbs, run through ibv-extend-run so the face serves it), the bad requests first:
 *  - ibv_open_xrcd with fd -1 and no O_CREAT, or an unknown oflag, fails with EINVAL;
 *  - an XRC target QP without a domain fails with EINVAL; ibv_open_qp of a number no target of
 *    the domain has, or of another type, fails with EINVAL;
 *  - ibv_get_srq_num of a basic SRQ fails with EINVAL; an XRC SRQ has a non-zero number;
 *  - ibv_close_xrcd of a domain an XRC SRQ or target uses answers EBUSY;
 *  - an initiator connected to a target of its own in this process (a target answers only the
 *    initiator it is connected to) delivers a SEND into the XRC SRQ it names (the receive completes on the
 * SRQ's CQ with the target's QP number), with xrc_remote_srq_num in ibv_post_send and with
 * ibv_wr_set_xrc_srqn;
 *  - a number no XRC SRQ of the target's domain has completes IBV_WC_REM_INV_REQ_ERR;
 *  - everything is destroyed again, the domain last, and the context closes.
 *
 *   xrc-behaviour DEVICE      exit 0 and "OK", or 1 with "xrc-behaviour: <step>: <why>"
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rc_prog = "xrc-behaviour";
#include "rc_helpers.h"
#include "xrc_helpers.h"

static struct ibv_qp *xrc_qp(struct ibv_context *ctx, enum ibv_qp_type type, struct ibv_pd *pd,
                             struct ibv_cq *cq, struct ibv_xrcd *xrcd, int wr_api) {
    struct ibv_qp_init_attr_ex ia;
    memset(&ia, 0, sizeof(ia));
    ia.qp_type = type;
    if (type == IBV_QPT_XRC_SEND) {
        ia.comp_mask = IBV_QP_INIT_ATTR_PD | (wr_api ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0);
        ia.pd = pd;
        ia.send_cq = cq;
        ia.cap.max_send_wr = 8;
        ia.cap.max_send_sge = 1;
        ia.send_ops_flags = IBV_QP_EX_WITH_SEND;
    } else if (xrcd != NULL) {
        ia.comp_mask = IBV_QP_INIT_ATTR_XRCD;
        ia.xrcd = xrcd;
    }
    errno = 0;
    return ibv_create_qp_ex(ctx, &ia);
}

/* One signalled SEND of 8 bytes from the initiator to SRQ number srqn, posted the classic way
 * or through the ibv_wr_* API; its completion's status. */
static enum ibv_wc_status send_to(struct ibv_qp *ini, struct ibv_cq *cq, struct ibv_mr *mr, uint32_t srqn,
                                  int wr_api) {
    struct ibv_sge sge = {(uintptr_t)mr->addr, 8, mr->lkey};
    if (wr_api) {
        struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(ini);
        ibv_wr_start(qx);
        qx->wr_id = 7;
        qx->wr_flags = IBV_SEND_SIGNALED;
        ibv_wr_send(qx);
        ibv_wr_set_xrc_srqn(qx, srqn);
        ibv_wr_set_sge(qx, sge.lkey, sge.addr, sge.length);
        if (ibv_wr_complete(qx) != 0) {
            fail("ibv_wr_complete", "refused");
        }
    } else {
        post_xrc_send(ini, mr, mr->addr, 8, srqn, 7);
    }
    return wait_wc(cq, "the initiator's completion").status;
}

int main(int argc, char **argv) {
    struct ibv_context *ctx = open_named(argc > 1 ? argv[1] : "softnda0");
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    if (open_xrcd(ctx, -1, 0) != NULL || errno != EINVAL) {
        fail("ibv_open_xrcd(fd -1, no O_CREAT)", "not refused with EINVAL");
    }
    if (open_xrcd(ctx, -1, O_CREAT | O_APPEND) != NULL || errno != EINVAL) {
        fail("ibv_open_xrcd(O_APPEND)", "not refused with EINVAL");
    }
    struct ibv_xrcd *xrcd = open_xrcd(ctx, -1, O_CREAT);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *send_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    struct ibv_cq *recv_cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    char *buf = calloc(1, 4096);
    struct ibv_mr *mr = pd != NULL && buf != NULL ? ibv_reg_mr(pd, buf, 4096, kAccess) : NULL;
    if (xrcd == NULL || send_cq == NULL || recv_cq == NULL || mr == NULL) {
        fail("domain, PD, CQs, MR", strerror(errno));
    }

    if (xrc_qp(ctx, IBV_QPT_XRC_RECV, NULL, NULL, NULL, 0) != NULL || errno != EINVAL) {
        fail("a target QP without a domain", "not refused with EINVAL");
    }
    struct ibv_qp_open_attr oa;
    memset(&oa, 0, sizeof(oa));
    oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    oa.xrcd = xrcd;
    oa.qp_type = IBV_QPT_XRC_RECV;
    errno = 0;
    if (ibv_open_qp(ctx, &oa) != NULL || errno != EINVAL) {
        fail("ibv_open_qp of QP number 0", "not refused with EINVAL");
    }
    oa.qp_type = IBV_QPT_RC;
    errno = 0;
    if (ibv_open_qp(ctx, &oa) != NULL || errno != EINVAL) {
        fail("ibv_open_qp of an RC QP", "not refused with EINVAL");
    }

    struct ibv_srq_init_attr_ex sa;
    memset(&sa, 0, sizeof(sa));
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    sa.srq_type = IBV_SRQT_BASIC;
    sa.pd = pd;
    sa.attr.max_wr = 4;
    sa.attr.max_sge = 1;
    struct ibv_srq *basic = ibv_create_srq_ex(ctx, &sa);
    uint32_t num = 0;
    if (basic == NULL || ibv_get_srq_num(basic, &num) != EINVAL) {
        fail("ibv_get_srq_num of a basic SRQ", "not EINVAL");
    }
    sa.comp_mask =
        IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    sa.srq_type = IBV_SRQT_XRC;
    sa.xrcd = xrcd;
    sa.cq = recv_cq;
    struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
    if (srq == NULL || ibv_get_srq_num(srq, &num) != 0 || num == 0) {
        fail("an XRC SRQ and its number", strerror(errno));
    }
    if (ibv_close_xrcd(xrcd) != EBUSY) {
        fail("ibv_close_xrcd under an XRC SRQ", "not EBUSY");
    }

    /* Pairs: [0] posts with xrc.remote_srqn, [1] with ibv_wr_set_xrc_srqn, [2] names no SRQ. */
    struct ibv_qp *inis[3], *tgts[3];
    for (int i = 0; i < 3; ++i) {
        tgts[i] = xrc_qp(ctx, IBV_QPT_XRC_RECV, NULL, NULL, xrcd, 0);
        inis[i] = xrc_qp(ctx, IBV_QPT_XRC_SEND, pd, send_cq, NULL, i == 1);
        if (tgts[i] == NULL || inis[i] == NULL) {
            fail("target and initiator QPs", strerror(errno));
        }
        to_init(inis[i]);
        to_init(tgts[i]);
        to_rts(inis[i], tgts[i]->qp_num, port.lid);
        to_rts(tgts[i], inis[i]->qp_num, port.lid);
    }

    for (int wr_api = 0; wr_api < 2; ++wr_api) {
        struct ibv_sge rs = {(uintptr_t)buf + 64, 8, mr->lkey};
        struct ibv_recv_wr rw, *rbad = NULL;
        memset(&rw, 0, sizeof(rw));
        rw.wr_id = 9;
        rw.sg_list = &rs;
        rw.num_sge = 1;
        if (ibv_post_srq_recv(srq, &rw, &rbad) != 0) {
            fail("ibv_post_srq_recv", "refused");
        }
        memcpy(buf, "xrc-sent", 8);
        if (send_to(inis[wr_api], send_cq, mr, num, wr_api) != IBV_WC_SUCCESS) {
            fail(wr_api ? "SEND by ibv_wr_set_xrc_srqn" : "SEND by xrc.remote_srqn", "not IBV_WC_SUCCESS");
        }
        struct ibv_wc wc = wait_wc(recv_cq, "the XRC SRQ's receive");
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 9 || wc.byte_len != 8 ||
            wc.qp_num != tgts[wr_api]->qp_num || memcmp(buf + 64, "xrc-sent", 8) != 0) {
            fail("the XRC SRQ's receive", "not the SEND, or not on the target");
        }
        memset(buf + 64, 0, 8);
    }
    if (send_to(inis[2], send_cq, mr, num + 1000, 0) != IBV_WC_REM_INV_REQ_ERR) {
        fail("an unknown SRQ number", "not IBV_WC_REM_INV_REQ_ERR");
    }

    for (int i = 0; i < 3; ++i) {
        if (ibv_destroy_qp(inis[i]) != 0) {
            fail("ibv_destroy_qp (initiator)", strerror(errno));
        }
    }
    if (ibv_close_xrcd(xrcd) != EBUSY) {
        fail("ibv_close_xrcd under a target", "not EBUSY");
    }
    for (int i = 0; i < 3; ++i) {
        if (ibv_destroy_qp(tgts[i]) != 0) {
            fail("ibv_destroy_qp (target)", strerror(errno));
        }
    }
    if (ibv_destroy_srq(srq) != 0 || ibv_destroy_srq(basic) != 0) {
        fail("ibv_destroy_srq", strerror(errno));
    }
    if (ibv_close_xrcd(xrcd) != 0) {
        fail("ibv_close_xrcd", "refused once nothing uses it");
    }
    ibv_dereg_mr(mr);
    ibv_destroy_cq(send_cq);
    ibv_destroy_cq(recv_cq);
    ibv_dealloc_pd(pd);
    if (ibv_close_device(ctx) != 0) {
        fail("ibv_close_device", strerror(errno));
    }
    free(buf);
    printf("OK\n");
    return 0;
}
