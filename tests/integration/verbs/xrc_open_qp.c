/*
 * ibv_open_qp across two tenant processes (softnda SPEC.md §14, docs/verbs.md): a target QP one
 * process made, opened by another through the XRC domain they share by file, lives until its last
 * handle goes, the creator's included (the kernel's ib_open_qp and usecnt).
 *  - the creator (a copy of this program it starts) opens the file's domain with O_CREAT, makes a
 *    target in it and sends its number here;
 *  - this process (the opener) joins the domain by the file; ibv_open_qp of another type, or of a
 *    number no target of the domain has, fails with EINVAL; of the target's number it gives a
 *    handle, which moves the target to RTS, connected to an initiator of this process;
 *  - SENDs from the initiator land in this process's XRC SRQ through the target;
 *  - the creator sees the state the handle set (ibv_query_qp), destroys its own handle, closes its
 *    domain handle and its device, and ends;
 *  - the target still works: more SENDs land, the handle still queries;
 *  - the handle is destroyed, the last one: the target is gone, its number opens nothing (EINVAL).
 *
 *   xrc-open-qp DEVICE         exit 0 and "OK", or 1 with "xrc-open-qp: <step>: <why>"
 *   xrc-open-qp DEVICE --pause the same, but once the handle drove the target to RTS and the first
 *                              SENDs arrived, with both handles held, it prints "paused" and reads
 *                              stdin to its end (a test restarts the broker meanwhile); its last
 *                              line is then "done OK"
 *   (xrc-open-qp DEVICE --creator FILE TO_OPENER FROM_OPENER: the creator, started by the opener)
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *rc_prog = "xrc-open-qp";
#include "rc_helpers.h"
#include "xrc_helpers.h"

enum { kMessages = 16, kMsgSize = 128 };

static struct ibv_qp *open_qp(struct ibv_context *ctx, struct ibv_xrcd *xrcd, uint32_t qp_num,
                              enum ibv_qp_type type) {
    struct ibv_qp_open_attr oa;
    memset(&oa, 0, sizeof(oa));
    oa.comp_mask =
        IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE | IBV_QP_OPEN_ATTR_CONTEXT;
    oa.qp_num = qp_num;
    oa.xrcd = xrcd;
    oa.qp_type = type;
    oa.qp_context = xrcd;
    errno = 0;
    return ibv_open_qp(ctx, &oa);
}

static enum ibv_qp_state state_of(struct ibv_qp *qp) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0) {
        fail("ibv_query_qp", "refused");
    }
    if (ia.qp_type != IBV_QPT_XRC_RECV) {
        fail("ibv_query_qp", "not an XRC target");
    }
    return a.qp_state;
}

/* The creator: a target in the file's domain, which it lets go of once the opener connected it. */
static int creator(const char *device, const char *path, int to_opener, int from_opener) {
    struct ibv_context *ctx = open_named(device);
    int fd = open(path, O_RDONLY);
    struct ibv_xrcd *xrcd = fd >= 0 ? open_xrcd(ctx, fd, O_CREAT) : NULL;
    if (xrcd == NULL) {
        fail("creator: ibv_open_xrcd(O_CREAT)", strerror(errno));
    }
    struct ibv_qp *tgt = xrc_target(ctx, xrcd);
    if (tgt == NULL) {
        fail("creator: a target QP", strerror(errno));
    }
    write_u32(to_opener, tgt->qp_num);
    (void)read_u32(from_opener); /* the opener's handle moved the target to RTS */
    write_u32(to_opener, state_of(tgt) == IBV_QPS_RTS ? 1 : 0);
    if (ibv_destroy_qp(tgt) != 0) {
        fail("creator: ibv_destroy_qp of its target", "refused");
    }
    /* Its domain handle and context close although the broker keeps the target for the opener. */
    if (ibv_close_xrcd(xrcd) != 0 || ibv_close_device(ctx) != 0) {
        fail("creator: ibv_close_xrcd / ibv_close_device after letting go of the target", "refused");
    }
    return 0; /* and ends: its session goes, the target stays the opener's */
}

/* The byte j of message i. */
static uint8_t pattern(int i, int j) {
    return (uint8_t)(i * 29 + j * 3 + 5);
}

/* kMessages SENDs to SRQ srqn through the initiator, each received on recv_cq from target tgt_qpn,
 * every byte as sent. */
static void exchange(struct ibv_qp *ini, struct ibv_cq *send_cq, struct ibv_srq *srq, struct ibv_cq *recv_cq,
                     struct ibv_mr *mr, uint32_t srqn, uint32_t tgt_qpn, int base) {
    uint8_t *out = mr->addr, *in = out + (size_t)kMessages * kMsgSize;
    memset(in, 0, (size_t)kMessages * kMsgSize);
    for (int i = 0; i < kMessages; ++i) {
        post_srq_recv(srq, mr, in + (size_t)i * kMsgSize, kMsgSize, (uint64_t)i);
    }
    for (int i = 0; i < kMessages; ++i) {
        uint8_t *msg = out + (size_t)i * kMsgSize;
        for (int j = 0; j < kMsgSize; ++j) {
            msg[j] = pattern(base + i, j);
        }
        post_xrc_send(ini, mr, msg, kMsgSize, srqn, (uint64_t)i);
        if (wait_wc(send_cq, "a SEND's completion").status != IBV_WC_SUCCESS) {
            fail("a SEND through the opened target", "not IBV_WC_SUCCESS");
        }
        struct ibv_wc wc = wait_wc(recv_cq, "the SRQ's receive");
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)i || wc.byte_len != kMsgSize ||
            wc.qp_num != tgt_qpn) {
            fail("the SRQ's receive", "not the SEND, not in order, or not from the target");
        }
        if (memcmp(in + (size_t)i * kMsgSize, msg, kMsgSize) != 0) {
            fail("the SRQ's receive", "a byte differs from what was sent");
        }
    }
}

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "softnda0";
    if (argc == 6 && strcmp(argv[2], "--creator") == 0) {
        return creator(device, argv[3], atoi(argv[4]), atoi(argv[5]));
    }
    const int pause_for_test = argc == 3 && strcmp(argv[2], "--pause") == 0;
    char path[] = "/tmp/xrc-open-qp-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        fail("mkstemp", strerror(errno));
    }
    struct ibv_context *ctx = open_named(device);
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    int to_creator = -1, from_creator = -1;
    pid_t pid = start_other(argv[0], device, "--creator", path, &to_creator, &from_creator);
    const uint32_t tgt_qpn = read_u32(from_creator);
    struct ibv_xrcd *xrcd = open_xrcd(ctx, fd, 0);
    if (xrcd == NULL) {
        fail("ibv_open_xrcd of the creator's file", strerror(errno));
    }

    /* The refusals first: another type, a number that is no target of the domain. */
    if (open_qp(ctx, xrcd, tgt_qpn, IBV_QPT_RC) != NULL || errno != EINVAL) {
        fail("ibv_open_qp of an RC QP", "not refused with EINVAL");
    }
    if (open_qp(ctx, xrcd, tgt_qpn ^ 0x800000, IBV_QPT_XRC_RECV) != NULL || errno != EINVAL) {
        fail("ibv_open_qp of a number no target has", "not refused with EINVAL");
    }
    struct ibv_qp *tgt = open_qp(ctx, xrcd, tgt_qpn, IBV_QPT_XRC_RECV);
    if (tgt == NULL) {
        fail("ibv_open_qp of the creator's target", strerror(errno));
    }
    if (tgt->qp_num != tgt_qpn || tgt->qp_type != IBV_QPT_XRC_RECV || tgt->qp_context != xrcd ||
        state_of(tgt) != IBV_QPS_RESET) {
        fail("ibv_open_qp", "the handle is not the creator's new target");
    }

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *send_cq = ibv_create_cq(ctx, kMessages, NULL, NULL, 0);
    struct ibv_cq *recv_cq = ibv_create_cq(ctx, kMessages, NULL, NULL, 0);
    void *buf = calloc(2 * kMessages, kMsgSize);
    struct ibv_mr *mr =
        pd != NULL && buf != NULL ? ibv_reg_mr(pd, buf, 2 * kMessages * kMsgSize, kAccess) : NULL;
    if (send_cq == NULL || recv_cq == NULL || mr == NULL) {
        fail("PD, CQs and MR", strerror(errno));
    }
    uint32_t srqn = 0;
    struct ibv_srq *srq =
        xrc_srq(ctx, pd, xrcd, recv_cq, kMessages, &srqn, "an XRC SRQ in the shared domain");
    struct ibv_qp *ini = xrc_initiator(ctx, pd, send_cq, kMessages);
    if (ini == NULL) {
        fail("an initiator", strerror(errno));
    }
    /* The handle moves the creator's target: connected to this process's initiator. */
    to_init(ini);
    to_init(tgt);
    to_rts(ini, tgt_qpn, port.lid);
    to_rts(tgt, ini->qp_num, port.lid);
    exchange(ini, send_cq, srq, recv_cq, mr, srqn, tgt_qpn, 0);
    if (pause_for_test) {
        printf("paused\n");
        fflush(stdout);
        char c;
        while (read(0, &c, 1) > 0) {
        }
        exchange(ini, send_cq, srq, recv_cq, mr, srqn, tgt_qpn, 500);
    }

    /* The creator sees the state the handle set, lets go of its handle and ends. */
    write_u32(to_creator, 1);
    if (read_u32(from_creator) != 1) {
        fail("the creator's ibv_query_qp", "did not see the state the handle set (RTS)");
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fail("the creator", "did not succeed");
    }
    if (state_of(tgt) != IBV_QPS_RTS) {
        fail("the target after its creator ended", "no longer RTS");
    }
    exchange(ini, send_cq, srq, recv_cq, mr, srqn, tgt_qpn, 1000);

    /* The last handle goes: so does the target. */
    if (ibv_destroy_qp(tgt) != 0) {
        fail("ibv_destroy_qp of the opened handle", "refused");
    }
    if (open_qp(ctx, xrcd, tgt_qpn, IBV_QPT_XRC_RECV) != NULL || errno != EINVAL) {
        fail("ibv_open_qp after the last handle went", "not refused with EINVAL");
    }
    if (ibv_destroy_qp(ini) != 0 || ibv_destroy_srq(srq) != 0 || ibv_close_xrcd(xrcd) != 0) {
        fail("ibv_destroy_qp / ibv_destroy_srq / ibv_close_xrcd", strerror(errno));
    }
    ibv_dereg_mr(mr);
    free(buf);
    ibv_destroy_cq(send_cq);
    ibv_destroy_cq(recv_cq);
    ibv_dealloc_pd(pd);
    if (ibv_close_device(ctx) != 0) {
        fail("ibv_close_device", strerror(errno));
    }
    close(fd);
    unlink(path);
    printf(pause_for_test ? "done OK\n" : "OK\n");
    return 0;
}
