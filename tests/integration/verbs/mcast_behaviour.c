/*
 * Multicast through the standard verbs alone (softnda SPEC.md §11.3; linked against the system
 * libibverbs, run through ibv-extend-run so the face serves it). Debian's pyverbs 44 has no
 * ibv_attach_mcast, so this program is C:
 *  - ibv_attach_mcast of an RC QP, of a unicast GID or of a unicast LID fails with EINVAL, and a
 *    detach of a group the QP is not in too; attaching twice succeeds;
 *  - three UD QPs, two of them attached to a group: a SEND to the group's MLID and QPN 0xffffff
 *    through a global address handle naming the MGID reaches both members (IBV_WC_GRH, the
 *    sender's QP number, the payload, the MGID in the GRH's destination), not the third;
 *  - after one member detaches, the next SEND reaches the other member only;
 *  - a member destroyed while attached leaves its group; the context closes.
 *
 *   mcast-behaviour DEVICE      exit 0 and "OK", or 1 with "mcast-behaviour: <step>: <why>"
 */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rc_prog = "mcast-behaviour";
#include "rc_helpers.h"

#define QKEY 0x1234u
#define MLID 0xc011u
#define MSG 64
#define GRH 40
#define SLOT 256

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t id) {
    struct ibv_sge s = {(uintptr_t)mr->addr + id * SLOT, SLOT, mr->lkey};
    struct ibv_recv_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    if (ibv_post_recv(qp, &wr, &bad) != 0) {
        fail("ibv_post_recv", "refused");
    }
}

static void send_to_group(struct ibv_qp *qp, struct ibv_ah *ah, struct ibv_mr *mr, uint64_t id) {
    struct ibv_sge s = {(uintptr_t)mr->addr, MSG, mr->lkey};
    struct ibv_send_wr wr, *bad;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = 0xffffff;
    wr.wr.ud.remote_qkey = QKEY;
    if (ibv_post_send(qp, &wr, &bad) != 0) {
        fail("ibv_post_send", "refused");
    }
}

/* Polls until n receives and the send with send_id completed; each receive's wr_id goes to got. */
static void collect(struct ibv_cq *cq, uint64_t send_id, int n, uint64_t *got, uint32_t *qpns,
                    uint32_t src_qp) {
    int sends = 0;
    int recvs = 0;
    while (sends < 1 || recvs < n) {
        struct ibv_wc wc = wait_wc(cq, "multicast completion");
        if (wc.status != IBV_WC_SUCCESS) {
            fail("multicast completion", ibv_wc_status_str(wc.status));
        }
        if (wc.opcode == IBV_WC_SEND) {
            if (wc.wr_id != send_id) {
                fail("send completion", "wrong wr_id");
            }
            sends++;
            continue;
        }
        if (recvs == n) {
            fail("receive", "a receive more than members");
        }
        if ((wc.wc_flags & IBV_WC_GRH) == 0 || wc.byte_len != GRH + MSG || wc.src_qp != src_qp) {
            fail("receive", "no GRH, a wrong length or a wrong source QP");
        }
        got[recvs] = wc.wr_id;
        qpns[recvs] = wc.qp_num;
        recvs++;
    }
}

static void no_more(struct ibv_cq *cq, const char *step) {
    struct ibv_wc wc;
    for (int i = 0; i < 200000; ++i) {
        if (ibv_poll_cq(cq, 1, &wc) != 0) {
            fail(step, "a completion nobody should have");
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: mcast-behaviour DEVICE\n");
        return 2;
    }
    struct ibv_context *ctx = open_named(argv[1]);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
    if (pd == NULL || cq == NULL) {
        fail("setup", strerror(errno));
    }
    char *buf = calloc(1, 16 * SLOT);
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, 16 * SLOT, IBV_ACCESS_LOCAL_WRITE);
    if (buf == NULL || mr == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }
    for (int i = 0; i < MSG; ++i) {
        buf[i] = (char)(i * 5 + 1);
    }
    union ibv_gid mgid, unicast;
    memset(&mgid, 0, sizeof(mgid));
    mgid.raw[0] = 0xff;
    mgid.raw[1] = 0x0e;
    mgid.raw[15] = 0x11;
    memset(&unicast, 0, sizeof(unicast));
    unicast.raw[0] = 0xfe;
    unicast.raw[1] = 0x80;
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }

    struct ibv_qp *rc = rc_qp(pd, cq);
    struct ibv_qp *a = ud_qp_rts(pd, cq, 4, QKEY), *b = ud_qp_rts(pd, cq, 4, QKEY),
                  *c = ud_qp_rts(pd, cq, 4, QKEY), *d = ud_qp_rts(pd, cq, 4, QKEY);
    if (ibv_attach_mcast(rc, &mgid, MLID) != EINVAL || ibv_attach_mcast(b, &unicast, MLID) != EINVAL ||
        ibv_attach_mcast(b, &mgid, port.lid) != EINVAL || ibv_detach_mcast(b, &mgid, MLID) != EINVAL) {
        fail("bad attach", "not EINVAL");
    }
    if (ibv_attach_mcast(b, &mgid, MLID) != 0 || ibv_attach_mcast(b, &mgid, MLID) != 0 ||
        ibv_attach_mcast(c, &mgid, MLID) != 0) {
        fail("ibv_attach_mcast", "refused");
    }

    struct ibv_ah_attr aa;
    memset(&aa, 0, sizeof(aa));
    aa.dlid = MLID;
    aa.port_num = 1;
    aa.is_global = 1;
    aa.grh.dgid = mgid;
    aa.grh.hop_limit = 1;
    struct ibv_ah *ah = ibv_create_ah(pd, &aa);
    if (ah == NULL) {
        fail("ibv_create_ah", strerror(errno));
    }

    /* Receives 1 (b), 2 (c), 3 (d): the group's datagram goes to b and c. */
    post_recv(b, mr, 1);
    post_recv(c, mr, 2);
    post_recv(d, mr, 3);
    send_to_group(a, ah, mr, 100);
    uint64_t got[2];
    uint32_t qpns[2];
    collect(cq, 100, 2, got, qpns, a->qp_num);
    if (!((got[0] == 1 && got[1] == 2) || (got[0] == 2 && got[1] == 1))) {
        fail("first datagram", "not received by exactly the two members");
    }
    for (int i = 0; i < 2; ++i) {
        const unsigned char *slot = (const unsigned char *)buf + got[i] * SLOT;
        if (qpns[i] != (got[i] == 1 ? b->qp_num : c->qp_num) || memcmp(slot + 24, mgid.raw, 16) != 0 ||
            memcmp(slot + GRH, buf, MSG) != 0) {
            fail("first datagram", "wrong QP, GRH destination or payload");
        }
    }
    no_more(cq, "first datagram");

    /* c leaves: the next datagram reaches b only (c's receive stays). */
    if (ibv_detach_mcast(c, &mgid, MLID) != 0) {
        fail("ibv_detach_mcast", "refused");
    }
    post_recv(b, mr, 4);
    post_recv(c, mr, 5);
    send_to_group(a, ah, mr, 101);
    collect(cq, 101, 1, got, qpns, a->qp_num);
    if (got[0] != 4 || qpns[0] != b->qp_num) {
        fail("second datagram", "not received by the remaining member only");
    }
    no_more(cq, "second datagram");

    /* b is destroyed while a member; the group is empty, and a datagram reaches nobody. */
    if (ibv_destroy_qp(b) != 0) {
        fail("ibv_destroy_qp of a member", "refused");
    }
    send_to_group(a, ah, mr, 102);
    collect(cq, 102, 0, got, qpns, a->qp_num);
    no_more(cq, "third datagram");

    if (ibv_destroy_ah(ah) != 0 || ibv_destroy_qp(a) != 0 || ibv_destroy_qp(c) != 0 ||
        ibv_destroy_qp(d) != 0 || ibv_destroy_qp(rc) != 0 || ibv_dereg_mr(mr) != 0 ||
        ibv_destroy_cq(cq) != 0 || ibv_dealloc_pd(pd) != 0 || ibv_close_device(ctx) != 0) {
        fail("teardown", strerror(errno));
    }
    free(buf);
    printf("OK\n");
    return 0;
}
