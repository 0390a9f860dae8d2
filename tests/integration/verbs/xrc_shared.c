/*
 * An XRC domain shared by two processes through the file they open it with (ibv_open_xrcd's fd
 * and oflags, the kernel's semantics; softnda SPEC.md §14, docs/verbs.md). Two tenants, each its
 * own broker session: this program (the owner) and a copy of itself it starts (the peer).
 *  - owner: ibv_open_xrcd of a file no domain has yet without O_CREAT fails with EAGAIN; with
 *    O_CREAT it opens one; O_CREAT|O_EXCL then fails with EINVAL. It makes an XRC SRQ in the
 *    domain and posts kMessages receives;
 *  - peer: opens the same file's domain without O_CREAT (it exists: the owner's), makes a target
 *    QP in it and an initiator of its own, and sends kMessages SENDs to the owner's SRQ number;
 *    ibv_open_qp of a number no target of the domain has answers EINVAL (xrc_open_qp.c opens one);
 *  - owner: every message lands in its SRQ, from the peer's target, every byte as sent;
 *  - the peer ends (its session ends, its handle on the domain is reclaimed): the owner's domain
 *    still works (a target and initiator of its own reach the SRQ), and the file still names it;
 *  - once the owner closes its last handle, the file has no domain (EAGAIN again).
 *
 *   xrc-shared DEVICE         exit 0 and "OK", or 1 with "xrc-shared: <step>: <why>"
 *   (xrc-shared DEVICE --peer FILE TO_OWNER FROM_OWNER: the peer, started by the owner)
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

static const char *rc_prog = "xrc-shared";
#include "rc_helpers.h"
#include "xrc_helpers.h"

enum { kMessages = 64, kMsgSize = 256 };

/* The byte j of message i: differs in every message and position. */
static uint8_t pattern(int i, int j) {
    return (uint8_t)(i * 131 + j * 7 + 1);
}

/* An initiator connected to a target of the same process; both to RTS. */
static void connect_pair(struct ibv_qp *ini, struct ibv_qp *tgt, uint16_t lid) {
    to_init(ini);
    to_init(tgt);
    to_rts(ini, tgt->qp_num, lid);
    to_rts(tgt, ini->qp_num, lid);
}

/* kMessages SENDs of kMsgSize pattern bytes (message base + i) to SRQ number srqn, each completed
 * successfully. */
static void send_all(struct ibv_qp *ini, struct ibv_cq *cq, struct ibv_mr *mr, uint32_t srqn, int base) {
    uint8_t *buf = mr->addr;
    for (int i = 0; i < kMessages; ++i) {
        uint8_t *msg = buf + (size_t)i * kMsgSize;
        for (int j = 0; j < kMsgSize; ++j) {
            msg[j] = pattern(base + i, j);
        }
        post_xrc_send(ini, mr, msg, kMsgSize, srqn, (uint64_t)i);
        if (wait_wc(cq, "a SEND's completion").status != IBV_WC_SUCCESS) {
            fail("a SEND to the shared domain's SRQ", "not IBV_WC_SUCCESS");
        }
    }
}

static void post_receives(struct ibv_srq *srq, struct ibv_mr *mr) {
    uint8_t *buf = mr->addr;
    memset(buf, 0, (size_t)kMessages * kMsgSize);
    for (int i = 0; i < kMessages; ++i) {
        post_srq_recv(srq, mr, buf + (size_t)i * kMsgSize, kMsgSize, (uint64_t)i);
    }
}

/* Every receive completed on cq from target tgt_qpn, in order, every byte as sent. */
static void check_receives(struct ibv_cq *cq, struct ibv_mr *mr, uint32_t tgt_qpn, int base) {
    const uint8_t *buf = mr->addr;
    for (int i = 0; i < kMessages; ++i) {
        struct ibv_wc wc = wait_wc(cq, "the SRQ's receive");
        if (wc.status != IBV_WC_SUCCESS || wc.wr_id != (uint64_t)i || wc.byte_len != kMsgSize ||
            wc.qp_num != tgt_qpn) {
            fail("the SRQ's receive", "not the SEND, not in order, or not from the target");
        }
        for (int j = 0; j < kMsgSize; ++j) {
            if (buf[(size_t)i * kMsgSize + j] != pattern(base + i, j)) {
                fail("the SRQ's receive", "a byte differs from what was sent");
            }
        }
    }
}

static struct ibv_mr *buffer(struct ibv_pd *pd) {
    void *buf = calloc(kMessages, kMsgSize);
    struct ibv_mr *mr = buf != NULL ? ibv_reg_mr(pd, buf, (size_t)kMessages * kMsgSize, kAccess) : NULL;
    if (mr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    return mr;
}

/* The peer: joins the owner's domain by the file, targets and sends to the owner's SRQ. */
static int peer(const char *device, const char *path, int to_owner, int from_owner) {
    struct ibv_context *ctx = open_named(device);
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("peer: ibv_query_port", "refused");
    }
    int fd = open(path, O_RDONLY);
    struct ibv_xrcd *xrcd = fd >= 0 ? open_xrcd(ctx, fd, 0) : NULL;
    if (xrcd == NULL) {
        fail("peer: ibv_open_xrcd of the owner's file without O_CREAT", strerror(errno));
    }
    struct ibv_qp_open_attr oa;
    memset(&oa, 0, sizeof(oa));
    oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
    oa.xrcd = xrcd;
    oa.qp_type = IBV_QPT_XRC_RECV;
    errno = 0;
    if (ibv_open_qp(ctx, &oa) != NULL || errno != EINVAL) {
        fail("peer: ibv_open_qp of QP number 0", "not refused with EINVAL");
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, kMessages, NULL, NULL, 0);
    if (pd == NULL || cq == NULL) {
        fail("peer: PD and CQ", strerror(errno));
    }
    struct ibv_mr *mr = buffer(pd);
    struct ibv_qp *tgt = xrc_target(ctx, xrcd);
    struct ibv_qp *ini = xrc_initiator(ctx, pd, cq, kMessages);
    if (tgt == NULL || ini == NULL) {
        fail("peer: a target in the shared domain and an initiator", strerror(errno));
    }
    connect_pair(ini, tgt, port.lid);
    const uint32_t srqn = read_u32(from_owner);
    write_u32(to_owner, tgt->qp_num);
    send_all(ini, cq, mr, srqn, 0);
    (void)read_u32(from_owner); /* the owner checked: leave without cleaning up (the session ends) */
    return 0;
}

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "softnda0";
    if (argc == 6 && strcmp(argv[2], "--peer") == 0) {
        return peer(device, argv[3], atoi(argv[4]), atoi(argv[5]));
    }
    char path[] = "/tmp/xrc-shared-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) {
        fail("mkstemp", strerror(errno));
    }
    struct ibv_context *ctx = open_named(device);
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    if (open_xrcd(ctx, fd, 0) != NULL || errno != EAGAIN) {
        fail("ibv_open_xrcd of a file with no domain, no O_CREAT", "not refused with EAGAIN");
    }
    struct ibv_xrcd *xrcd = open_xrcd(ctx, fd, O_CREAT);
    if (xrcd == NULL) {
        fail("ibv_open_xrcd(O_CREAT)", strerror(errno));
    }
    if (open_xrcd(ctx, fd, O_CREAT | O_EXCL) != NULL || errno != EINVAL) {
        fail("ibv_open_xrcd(O_CREAT | O_EXCL) of a file with a domain", "not refused with EINVAL");
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *send_cq = ibv_create_cq(ctx, kMessages, NULL, NULL, 0);
    struct ibv_cq *recv_cq = ibv_create_cq(ctx, kMessages, NULL, NULL, 0);
    if (pd == NULL || send_cq == NULL || recv_cq == NULL) {
        fail("PD and CQs", strerror(errno));
    }
    struct ibv_mr *mr = buffer(pd);
    uint32_t srqn = 0;
    struct ibv_srq *srq =
        xrc_srq(ctx, pd, xrcd, recv_cq, kMessages, &srqn, "an XRC SRQ in the shared domain");

    /* The peer's target, in its handle on this domain, delivers into this process's SRQ. */
    post_receives(srq, mr);
    int to_peer = -1, from_peer = -1;
    pid_t pid = start_other(argv[0], device, "--peer", path, &to_peer, &from_peer);
    write_u32(to_peer, srqn);
    const uint32_t peer_tgt = read_u32(from_peer);
    check_receives(recv_cq, mr, peer_tgt, 0);
    write_u32(to_peer, 1);
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fail("the peer", "did not succeed");
    }

    /* The peer's session ended: the domain is still this process's, working, and named by the file. */
    struct ibv_xrcd *again = open_xrcd(ctx, fd, 0);
    if (again == NULL || ibv_close_xrcd(again) != 0) {
        fail("ibv_open_xrcd after the peer ended", "the file no longer names the domain");
    }
    struct ibv_qp *tgt = xrc_target(ctx, xrcd);
    struct ibv_qp *ini = xrc_initiator(ctx, pd, send_cq, kMessages);
    if (tgt == NULL || ini == NULL) {
        fail("a target and initiator after the peer ended", strerror(errno));
    }
    connect_pair(ini, tgt, port.lid);
    struct ibv_mr *out = buffer(pd);
    post_receives(srq, mr);
    send_all(ini, send_cq, out, srqn, 1000);
    check_receives(recv_cq, mr, tgt->qp_num, 1000);

    if (ibv_destroy_qp(ini) != 0 || ibv_destroy_qp(tgt) != 0 || ibv_destroy_srq(srq) != 0) {
        fail("ibv_destroy_qp / ibv_destroy_srq", strerror(errno));
    }
    if (ibv_close_xrcd(xrcd) != 0) {
        fail("ibv_close_xrcd", strerror(errno));
    }
    /* Its last handle is gone: so is the domain. */
    if (open_xrcd(ctx, fd, 0) != NULL || errno != EAGAIN) {
        fail("ibv_open_xrcd after the last handle closed", "not refused with EAGAIN");
    }
    void *b1 = mr->addr, *b2 = out->addr;
    ibv_dereg_mr(mr);
    ibv_dereg_mr(out);
    free(b1);
    free(b2);
    ibv_destroy_cq(send_cq);
    ibv_destroy_cq(recv_cq);
    ibv_dealloc_pd(pd);
    if (ibv_close_device(ctx) != 0) {
        fail("ibv_close_device", strerror(errno));
    }
    close(fd);
    unlink(path);
    printf("OK\n");
    return 0;
}
