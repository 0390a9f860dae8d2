/*
 * Multicast between two hosts over RoCEv2 (softnda SPEC.md §11.3, §18), through the standard
 * verbs alone (Debian's pyverbs 44 has no ibv_attach_mcast, so this program is C; run through
 * ibv-extend-run so the face serves it). One process on each host, meeting through the test line
 * by line as pyverbs_ud_wire.py's do:
 *
 *   mcast-wire DEVICE GID_INDEX server|client N
 *
 * Each prints "ADDR qpn gid" (its sending QP and GID index GID_INDEX's GID) and reads the peer's.
 * The group's MGID is the IPv4-mapped ::ffff:239.201.8.1 when that GID is IPv4-mapped, else the
 * link-local-scope IPv6 group ff12::c9:8:1.
 *  - The server (host A) attaches two UD QPs to the group, posts N receives on each, prints
 *    "READY", and, given a line, expects N datagrams on each member.
 *  - The client (host B) attaches its own QP to the group too, posts N receives and, given a
 *    line, sends N datagrams of distinct lengths and patterns (odd ones with immediate data) to
 *    the group (QPN 0xffffff) through an address handle naming the MGID, then expects its own N
 *    copies (a NIC loops multicast back to its port), and prints "DONE".
 * Each copy is checked: RECV, the GRH flag, byte_len 40 + the length, the client's QP as src_qp,
 * the immediate data, the GRH's source (the client's GID) and destination (the MGID) as the IP
 * header in the 40 bytes gives them, and the payload. Each side prints "OK" at the end, or exits
 * 1 with "mcast-wire: <step>: <why>".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rc_prog = "mcast-wire";
#include "rc_helpers.h"

#define QKEY 0x1ee7u
#define GRH 40
#define SLOT (1024 + GRH)
#define MAX_N 64

static size_t length_of(int i) {
    return 1 + (size_t)(i * 37) % 1000; /* within a 1024-byte MTU */
}

static unsigned char pattern(int i, size_t j) {
    return (unsigned char)(i * 31 + j * 7 + (j >> 8));
}

static void next_line(char *buf, size_t len) {
    if (fgets(buf, (int)len, stdin) == NULL) {
        fail("a line from the test", "stdin closed");
    }
}

static void post_receives(struct ibv_qp *qp, struct ibv_mr *mr, unsigned char *base, int n) {
    for (int i = 0; i < n; ++i) {
        struct ibv_sge sge = {(uintptr_t)(base + (size_t)i * SLOT), SLOT, mr->lkey};
        struct ibv_recv_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = (uint64_t)i;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        if (ibv_post_recv(qp, &wr, &bad) != 0) {
            fail("ibv_post_recv", strerror(errno));
        }
    }
}

/* The address the 40 GRH bytes carry at offset (IPv4: 20 zero bytes, then the IPv4 header, whose
 * addresses are at 12 and 16; IPv6: the IPv6 header, addresses at 8 and 24), as a GID. */
static union ibv_gid grh_address(const unsigned char *grh, int ipv4, int destination) {
    union ibv_gid g;
    memset(&g, 0, sizeof(g));
    if (ipv4) {
        g.raw[10] = g.raw[11] = 0xff;
        memcpy(g.raw + 12, grh + 20 + (destination ? 16 : 12), 4);
    } else {
        memcpy(g.raw, grh + (destination ? 24 : 8), 16);
    }
    return g;
}

/* n copies on a member's receives (in any order on the shared CQ: by wr_id within qp). */
static void expect_copies(struct ibv_cq *cq, struct ibv_qp *const *members, int nmembers,
                          unsigned char *const *bufs, int n, uint32_t src_qp, const union ibv_gid *src,
                          const union ibv_gid *mgid) {
    const int ipv4 = src->raw[10] == 0xff && src->raw[11] == 0xff && src->raw[0] == 0;
    int got[4] = {0};
    for (int k = 0; k < n * nmembers; ++k) {
        struct ibv_wc wc = wait_wc(cq, "a copy of a datagram to the group");
        if (wc.status != IBV_WC_SUCCESS) {
            fail("a copy of a datagram to the group", ibv_wc_status_str(wc.status));
        }
        int m = 0;
        while (m < nmembers && members[m]->qp_num != wc.qp_num) {
            ++m;
        }
        if (m == nmembers) {
            fail("a completion", "on a QP that is not a member");
        }
        const int i = (int)wc.wr_id;
        char why[160];
        if (wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_GRH) || wc.byte_len != GRH + length_of(i) ||
            wc.src_qp != src_qp || ((i % 2 == 1) != !!(wc.wc_flags & IBV_WC_WITH_IMM)) ||
            (i % 2 == 1 && ntohl(wc.imm_data) != 0x1000u + (uint32_t)i)) {
            snprintf(why, sizeof(why), "copy %d on member %d: opcode %d flags %#x byte_len %u src_qp %u", i,
                     m, wc.opcode, wc.wc_flags, wc.byte_len, wc.src_qp);
            fail("a copy", why);
        }
        const unsigned char *slot = bufs[m] + (size_t)i * SLOT;
        union ibv_gid s = grh_address(slot, ipv4, 0), d = grh_address(slot, ipv4, 1);
        if (memcmp(&s, src, sizeof(s)) != 0 || memcmp(&d, mgid, sizeof(d)) != 0) {
            snprintf(why, sizeof(why), "copy %d on member %d: the GRH does not name the sender and the group",
                     i, m);
            fail("a copy's GRH", why);
        }
        for (size_t j = 0; j < length_of(i); ++j) {
            if (slot[GRH + j] != pattern(i, j)) {
                snprintf(why, sizeof(why), "copy %d on member %d: byte %zu differs", i, m, j);
                fail("a copy's payload", why);
            }
        }
        got[m]++;
    }
    for (int m = 0; m < nmembers; ++m) {
        if (got[m] != n) {
            fail("the copies", "a member did not get each datagram once");
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 5 || (strcmp(argv[3], "server") != 0 && strcmp(argv[3], "client") != 0)) {
        fprintf(stderr, "usage: mcast-wire DEVICE GID_INDEX server|client N\n");
        return 2;
    }
    const int gid_index = atoi(argv[2]), server = strcmp(argv[3], "server") == 0, n = atoi(argv[4]);
    if (n < 1 || n > MAX_N) {
        fail("N", "between 1 and 64");
    }
    struct ibv_context *ctx = open_named(argv[1]);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *cq = pd != NULL ? ibv_create_cq(ctx, 4 * n, NULL, NULL, 0) : NULL;
    const size_t per = (size_t)n * SLOT;
    unsigned char *mem = calloc(3, per);
    struct ibv_mr *mr =
        cq != NULL && mem != NULL ? ibv_reg_mr(pd, mem, 3 * per, IBV_ACCESS_LOCAL_WRITE) : NULL;
    if (mr == NULL) {
        fail("PD, CQ and MR", strerror(errno));
    }
    struct ibv_qp *members[2] = {ud_qp_rts(pd, cq, (uint32_t)n, QKEY),
                                 server ? ud_qp_rts(pd, cq, (uint32_t)n, QKEY) : NULL};
    const int nmembers = server ? 2 : 1;
    union ibv_gid gid, peer_gid, mgid;
    if (ibv_query_gid(ctx, 1, gid_index, &gid) != 0) {
        fail("ibv_query_gid", strerror(errno));
    }
    char text[INET6_ADDRSTRLEN], buf[256];
    inet_ntop(AF_INET6, gid.raw, text, sizeof(text));
    printf("ADDR %u %s\n", members[0]->qp_num, text);
    fflush(stdout);
    next_line(buf, sizeof(buf));
    unsigned peer_qpn = 0;
    char peer_text[INET6_ADDRSTRLEN + 1];
    if (sscanf(buf, "ADDR %u %46s", &peer_qpn, peer_text) != 2 ||
        inet_pton(AF_INET6, peer_text, peer_gid.raw) != 1) {
        fail("the peer's ADDR line", buf);
    }
    const int ipv4 = gid.raw[10] == 0xff && gid.raw[11] == 0xff && gid.raw[0] == 0;
    inet_pton(AF_INET6, ipv4 ? "::ffff:239.201.8.1" : "ff12::c9:8:1", mgid.raw);
    unsigned char *bufs[2] = {mem, mem + per};
    for (int m = 0; m < nmembers; ++m) {
        /* The LID means nothing on RoCE; the kernel ignores it there. */
        if (ibv_attach_mcast(members[m], &mgid, 0) != 0) {
            fail("ibv_attach_mcast", strerror(errno));
        }
        post_receives(members[m], mr, bufs[m], n);
    }
    if (server) {
        printf("READY\n");
        fflush(stdout);
        next_line(buf, sizeof(buf));
        expect_copies(cq, members, nmembers, bufs, n, peer_qpn, &peer_gid, &mgid);
    } else {
        next_line(buf, sizeof(buf));
        struct ibv_ah_attr aa;
        memset(&aa, 0, sizeof(aa));
        aa.is_global = 1;
        aa.port_num = 1;
        aa.grh.dgid = mgid;
        aa.grh.sgid_index = (uint8_t)gid_index;
        aa.grh.hop_limit = 1;
        struct ibv_ah *ah = ibv_create_ah(pd, &aa);
        if (ah == NULL) {
            fail("ibv_create_ah of the group", strerror(errno));
        }
        unsigned char *out = mem + 2 * per;
        for (int i = 0; i < n; ++i) {
            for (size_t j = 0; j < length_of(i); ++j) {
                out[(size_t)i * SLOT + j] = pattern(i, j);
            }
            struct ibv_sge sge = {(uintptr_t)(out + (size_t)i * SLOT), (uint32_t)length_of(i), mr->lkey};
            struct ibv_send_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof(wr));
            wr.wr_id = 1000u + (uint64_t)i;
            wr.sg_list = &sge;
            wr.num_sge = 1;
            wr.opcode = i % 2 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
            wr.imm_data = htonl(0x1000u + (uint32_t)i);
            wr.send_flags = IBV_SEND_SIGNALED;
            wr.wr.ud.ah = ah;
            wr.wr.ud.remote_qpn = 0xffffff;
            wr.wr.ud.remote_qkey = QKEY;
            if (ibv_post_send(members[0], &wr, &bad) != 0) {
                fail("ibv_post_send to the group", strerror(errno));
            }
        }
        /* The sends' completions and the sender's own copies share the CQ. */
        int sends = 0;
        struct ibv_wc copies[MAX_N];
        int ncopies = 0;
        while (sends < n || ncopies < n) {
            struct ibv_wc wc = wait_wc(cq, "the sends and the sender's own copies");
            if (wc.status != IBV_WC_SUCCESS) {
                fail("the sends and the sender's own copies", ibv_wc_status_str(wc.status));
            }
            if (wc.opcode == IBV_WC_SEND) {
                sends++;
            } else if (ncopies < n) {
                copies[ncopies++] = wc;
            } else {
                fail("the sender's copies", "more than one of a datagram");
            }
        }
        /* Checked as the server checks its own, from the completions already taken. */
        for (int k = 0; k < n; ++k) {
            const int i = (int)copies[k].wr_id;
            if (copies[k].opcode != IBV_WC_RECV || copies[k].byte_len != GRH + length_of(i) ||
                copies[k].src_qp != members[0]->qp_num ||
                memcmp(grh_address(bufs[0] + (size_t)i * SLOT, ipv4, 1).raw, mgid.raw, 16) != 0 ||
                memcmp(bufs[0] + (size_t)i * SLOT + GRH, out + (size_t)i * SLOT, length_of(i)) != 0) {
                fail("the sender's own copy", "not the datagram it sent to the group");
            }
        }
        printf("DONE\n");
        fflush(stdout);
        ibv_destroy_ah(ah);
    }
    for (int m = 0; m < nmembers; ++m) {
        if (ibv_detach_mcast(members[m], &mgid, 0) != 0) {
            fail("ibv_detach_mcast", strerror(errno));
        }
        ibv_destroy_qp(members[m]);
    }
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(mem);
    printf("OK\n");
    return 0;
}
