/*
 * XRC between two hosts over RoCEv2 (softnda SPEC.md §14, §18), exactly once and every byte
 * checked, through the standard verbs (Debian's ibv_xsrq_pingpong checks no bytes; run through
 * ibv-extend-run so the face serves it). One process on each host, meeting through the test line
 * by line as pyverbs_wire.py's do:
 *
 *   xrc-wire DEVICE GID_INDEX server|client N [foreign]
 *
 * The server (host A) opens two XRC domains, makes an XRC SRQ in each (the second one "foreign":
 * no request may reach it through this target) and a target QP in the first, posts N receives on
 * its SRQ and prints "ADDR qpn psn gid rkey addr srqn foreign_srqn"; the client (host B) makes an
 * initiator and prints "ADDR qpn psn gid 0 0 0 0". Each reads the other's line and connects. The
 * server prints "READY"; the client, given a line, names the server's SRQ in every request, with
 * up to WINDOW of a phase outstanding:
 *  - N RDMA WRITEs of distinct 3001-byte patterns (three packets at a 1024-byte MTU, a pad) into
 *    the server's slots (an MR of the SRQ's PD), then N RDMA READs of them back, compared;
 *  - N fetch-adds of 1 on the server's counter, which must return 0, 1, ..., N-1 in order (a
 *    repeated one overshoots);
 *  - N SENDs of 2050 bytes, odd ones with immediate data, into the SRQ's receives;
 *  - with "foreign", one more SEND naming the foreign SRQ, which must complete
 *    IBV_WC_REM_INV_REQ_ERR (the target's invalid-request NAK);
 * and prints "DONE". The server checks each receive (on the SRQ's CQ: order, length, immediate,
 * bytes, the initiator as src_qp) and, given a line, its slots, the counter (N) and, with
 * "foreign", that its target went to ERR. Each side prints "OK" at the end, or exits 1 with
 * "xrc-wire: <step>: <why>". PSNs start just before the 24-bit wrap.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *rc_prog = "xrc-wire";
#include "rc_helpers.h"
#include "xrc_helpers.h"

#define SLOT 4096
#define WRITE_LEN 3001
#define SEND_LEN 2050
#define WINDOW 16
#define MAX_N 256
#define ACCESS \
    (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)

static unsigned char pattern(int kind, int i, size_t j) {
    return (unsigned char)(kind * 101 + i * 31 + j * 7 + (j >> 8));
}

static void next_line(char *buf, size_t len) {
    if (fgets(buf, (int)len, stdin) == NULL) {
        fail("a line from the test", "stdin closed");
    }
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *step) {
    if (ibv_modify_qp(qp, a, mask) != 0) {
        fail(step, strerror(errno));
    }
}

struct peer {
    unsigned qpn, psn, rkey, srqn, foreign;
    unsigned long long addr;
    union ibv_gid gid;
};

/* INIT, then RTR towards the peer (both ends), then RTS (the initiator). */
static void connect_qp(struct ibv_qp *qp, int initiator, int gid_index, uint32_t psn, const struct peer *p) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = ACCESS;
    modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = p->qpn;
    a.rq_psn = p->psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = p->gid;
    a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    a.ah_attr.grh.hop_limit = 1;
    modify(qp, &a,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               (initiator ? 0 : IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
           "RTR");
    if (!initiator) {
        return;
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7; /* for ever: an SRQ drained for a moment is answered RNR and retried */
    a.max_rd_atomic = 16;
    modify(qp, &a,
           IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
               IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
}

/* One phase of the client: n work requests made by make(i, wr, sge), WINDOW at most
 * outstanding, each completing SUCCESS with opcode, in order. */
typedef void (*make_fn)(int i, struct ibv_send_wr *wr, struct ibv_sge *sge, void *env);
static void phase(struct ibv_qp *ini, struct ibv_cq *cq, const char *what, int n, enum ibv_wc_opcode opcode,
                  make_fn make, void *env) {
    int posted = 0, done = 0;
    while (done < n) {
        while (posted < n && posted - done < WINDOW) {
            struct ibv_sge sge;
            struct ibv_send_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof(wr));
            wr.wr_id = (uint64_t)posted;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.send_flags = IBV_SEND_SIGNALED;
            make(posted, &wr, &sge, env);
            if (ibv_post_send(ini, &wr, &bad) != 0) {
                fail(what, strerror(errno));
            }
            posted++;
        }
        struct ibv_wc wc = wait_wc(cq, what);
        char why[128];
        if (wc.status != IBV_WC_SUCCESS || wc.opcode != opcode || wc.wr_id != (uint64_t)done) {
            snprintf(why, sizeof(why), "completion %d: %s, opcode %d, wr_id %llu", done,
                     ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)wc.wr_id);
            fail(what, why);
        }
        done++;
    }
}

struct client_env {
    struct ibv_mr *mr;
    unsigned char *out, *back, *results;
    const struct peer *server;
};

static void make_write(int i, struct ibv_send_wr *wr, struct ibv_sge *sge, void *v) {
    struct client_env *c = v;
    *sge = (struct ibv_sge){(uintptr_t)(c->out + (size_t)i * SLOT), WRITE_LEN, c->mr->lkey};
    wr->opcode = IBV_WR_RDMA_WRITE;
    wr->wr.rdma.remote_addr = c->server->addr + (uint64_t)i * SLOT;
    wr->wr.rdma.rkey = c->server->rkey;
    wr->qp_type.xrc.remote_srqn = c->server->srqn;
}

static void make_read(int i, struct ibv_send_wr *wr, struct ibv_sge *sge, void *v) {
    struct client_env *c = v;
    make_write(i, wr, sge, v);
    sge->addr = (uintptr_t)(c->back + (size_t)i * SLOT);
    wr->opcode = IBV_WR_RDMA_READ;
}

static void make_add(int i, struct ibv_send_wr *wr, struct ibv_sge *sge, void *v) {
    struct client_env *c = v;
    *sge = (struct ibv_sge){(uintptr_t)(c->results + 8 * (size_t)i), 8, c->mr->lkey};
    wr->opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr->wr.atomic.remote_addr = c->server->addr + (uint64_t)MAX_N * SLOT; /* the counter */
    wr->wr.atomic.rkey = c->server->rkey;
    wr->wr.atomic.compare_add = 1;
    wr->qp_type.xrc.remote_srqn = c->server->srqn;
}

static void make_send(int i, struct ibv_send_wr *wr, struct ibv_sge *sge, void *v) {
    struct client_env *c = v;
    *sge = (struct ibv_sge){(uintptr_t)(c->out + (size_t)i * SLOT), SEND_LEN, c->mr->lkey};
    wr->opcode = i % 2 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
    wr->imm_data = htonl(0x5000u + (uint32_t)i);
    wr->qp_type.xrc.remote_srqn = c->server->srqn;
}

static void read_peer(struct peer *p) {
    char buf[512], gid_text[INET6_ADDRSTRLEN + 1];
    next_line(buf, sizeof(buf));
    if (sscanf(buf, "ADDR %u %u %46s %u %llu %u %u", &p->qpn, &p->psn, gid_text, &p->rkey, &p->addr, &p->srqn,
               &p->foreign) != 7 ||
        inet_pton(AF_INET6, gid_text, p->gid.raw) != 1) {
        fail("the peer's ADDR line", buf);
    }
}

int main(int argc, char **argv) {
    if ((argc != 5 && argc != 6) || (strcmp(argv[3], "server") != 0 && strcmp(argv[3], "client") != 0) ||
        (argc == 6 && strcmp(argv[5], "foreign") != 0)) {
        fprintf(stderr, "usage: xrc-wire DEVICE GID_INDEX server|client N [foreign]\n");
        return 2;
    }
    const int gid_index = atoi(argv[2]), server = strcmp(argv[3], "server") == 0, n = atoi(argv[4]);
    const int foreign = argc == 6;
    if (n < 1 || n > MAX_N) {
        fail("N", "between 1 and 256");
    }
    const uint32_t psn = server ? 0xfffff0u : 0xffffe0u;
    struct ibv_context *ctx = open_named(argv[1]);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = pd != NULL ? ibv_create_cq(ctx, 2 * MAX_N + 8, NULL, NULL, 0) : NULL;
    /* The server: MAX_N slots, the counter, MAX_N receive buffers. The client: MAX_N sources,
     * MAX_N READ targets, the fetch-adds' results. */
    const size_t size = (2 * (size_t)MAX_N + 2) * SLOT; /* a whole number of SLOTs: aligned_alloc's rule */
    unsigned char *mem = aligned_alloc(SLOT, size);
    struct ibv_mr *mr =
        cq != NULL && mem != NULL ? (memset(mem, 0, size), ibv_reg_mr(pd, mem, size, ACCESS)) : NULL;
    if (mr == NULL) {
        fail("PD, CQ and MR", strerror(errno));
    }
    union ibv_gid gid;
    if (ibv_query_gid(ctx, 1, gid_index, &gid) != 0) {
        fail("ibv_query_gid", strerror(errno));
    }
    char text[INET6_ADDRSTRLEN], buf[256];
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
    struct peer peer;

    if (server) {
        struct ibv_xrcd *xrcd = open_xrcd(ctx, -1, O_CREAT), *other = open_xrcd(ctx, -1, O_CREAT);
        if (xrcd == NULL || other == NULL) {
            fail("ibv_open_xrcd", strerror(errno));
        }
        struct ibv_srq *srqs[2];
        uint32_t nums[2];
        srqs[0] = xrc_srq(ctx, pd, xrcd, cq, MAX_N + 4, &nums[0], "the XRC SRQ");
        srqs[1] = xrc_srq(ctx, pd, other, cq, 1, &nums[1], "the foreign XRC SRQ");
        struct ibv_qp *target = xrc_target(ctx, xrcd);
        if (target == NULL) {
            fail("ibv_create_qp_ex (XRC target)", strerror(errno));
        }
        unsigned char *slots = mem, *ring = mem + (size_t)MAX_N * SLOT + SLOT;
        uint64_t *counter = (uint64_t *)(mem + (size_t)MAX_N * SLOT);
        for (int i = 0; i < n; ++i) {
            post_srq_recv(srqs[0], mr, ring + (size_t)i * SLOT, SLOT, (uint64_t)i);
        }
        printf("ADDR %u %u %s %u %llu %u %u\n", target->qp_num, psn, text, mr->rkey,
               (unsigned long long)(uintptr_t)slots, nums[0], nums[1]);
        fflush(stdout);
        read_peer(&peer);
        connect_qp(target, 0, gid_index, psn, &peer);
        printf("READY\n");
        fflush(stdout);
        for (int i = 0; i < n; ++i) {
            struct ibv_wc wc = wait_wc(cq, "a receive on the SRQ");
            const int imm = !!(wc.wc_flags & IBV_WC_WITH_IMM);
            char why[160];
            if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.wr_id != (uint64_t)i ||
                wc.byte_len != SEND_LEN || wc.qp_num != target->qp_num || wc.src_qp != peer.qpn ||
                imm != (i % 2) || (imm && ntohl(wc.imm_data) != 0x5000u + (uint32_t)i)) {
                snprintf(why, sizeof(why),
                         "receive %d: %s, opcode %d, wr_id %llu, %u bytes, qp %u, src_qp %u", i,
                         ibv_wc_status_str(wc.status), wc.opcode, (unsigned long long)wc.wr_id, wc.byte_len,
                         wc.qp_num, wc.src_qp);
                fail("the receives", why);
            }
            for (size_t j = 0; j < SEND_LEN; ++j) {
                if (ring[(size_t)i * SLOT + j] != pattern(3, i, j)) {
                    fail("the receives", "a byte differs from what was sent");
                }
            }
        }
        next_line(buf, sizeof(buf)); /* the client is done */
        for (int i = 0; i < n; ++i) {
            for (size_t j = 0; j < WRITE_LEN; ++j) {
                if (slots[(size_t)i * SLOT + j] != pattern(1, i, j)) {
                    fail("the slots", "a byte differs from what was written");
                }
            }
        }
        if (*counter != (uint64_t)n) {
            snprintf(buf, sizeof(buf), "%llu after %d fetch-adds", (unsigned long long)*counter, n);
            fail("the counter", buf);
        }
        if (foreign) {
            struct ibv_qp_attr a;
            struct ibv_qp_init_attr ia;
            if (ibv_query_qp(target, &a, IBV_QP_STATE, &ia) != 0 || a.qp_state != IBV_QPS_ERR) {
                fail("the target after a request naming the foreign SRQ", "not in ERR");
            }
        }
        ibv_destroy_qp(target);
        ibv_destroy_srq(srqs[0]);
        ibv_destroy_srq(srqs[1]);
        ibv_close_xrcd(xrcd);
        ibv_close_xrcd(other);
    } else {
        struct ibv_qp *ini = xrc_initiator(ctx, pd, cq, WINDOW + 4);
        if (ini == NULL) {
            fail("ibv_create_qp_ex (XRC initiator)", strerror(errno));
        }
        printf("ADDR %u %u %s 0 0 0 0\n", ini->qp_num, psn, text);
        fflush(stdout);
        read_peer(&peer);
        connect_qp(ini, 1, gid_index, psn, &peer);
        next_line(buf, sizeof(buf)); /* the server is ready */
        struct client_env c = {mr, mem, mem + (size_t)MAX_N * SLOT, mem + 2 * (size_t)MAX_N * SLOT, &peer};
        for (int i = 0; i < n; ++i) {
            for (size_t j = 0; j < WRITE_LEN; ++j) {
                c.out[(size_t)i * SLOT + j] = pattern(1, i, j);
            }
        }
        phase(ini, cq, "RDMA WRITE", n, IBV_WC_RDMA_WRITE, make_write, &c);
        phase(ini, cq, "RDMA READ", n, IBV_WC_RDMA_READ, make_read, &c);
        if (memcmp(c.out, c.back, (size_t)n * SLOT) != 0) {
            fail("RDMA READ", "the bytes differ from what was written");
        }
        phase(ini, cq, "fetch-add", n, IBV_WC_FETCH_ADD, make_add, &c);
        for (int i = 0; i < n; ++i) {
            uint64_t got;
            memcpy(&got, c.results + 8 * (size_t)i, sizeof(got));
            if (got != (uint64_t)i) {
                snprintf(buf, sizeof(buf), "fetch-add %d returned %llu", i, (unsigned long long)got);
                fail("fetch-add", buf);
            }
        }
        for (int i = 0; i < n; ++i) {
            for (size_t j = 0; j < SEND_LEN; ++j) {
                c.out[(size_t)i * SLOT + j] = pattern(3, i, j);
            }
        }
        phase(ini, cq, "SEND", n, IBV_WC_SEND, make_send, &c);
        if (foreign) {
            post_xrc_send(ini, mr, c.out, SEND_LEN, peer.foreign, 9999);
            struct ibv_wc wc = wait_wc(cq, "a SEND naming the foreign SRQ");
            if (wc.status != IBV_WC_REM_INV_REQ_ERR || wc.wr_id != 9999) {
                fail("a SEND naming the foreign SRQ", ibv_wc_status_str(wc.status));
            }
        }
        printf("DONE\n");
        fflush(stdout);
        ibv_destroy_qp(ini);
    }
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(mem);
    printf("OK\n");
    return 0;
}
