/*
 * engine-attacker: a tenant that attacks softnda's engine (the emulated NIC inside the broker)
 * through what any tenant holds: the queue memory and doorbells of SPEC.md, the descriptors the
 * broker sent it, the memory it registered, the eventfds it made. engine_attacks_test.cpp runs
 * it as uid 65534 through ibv-extend-run, next to honest tenants, and judges the broker after.
 *
 *   engine-attacker MODE DEVICE
 *
 * MODE is one attack (the list at main()), or "honest": a pair of connected RC QPs that moves
 * verified data each time a line arrives on stdin ("ROUND n OK", or why not), until stdin ends.
 *
 * An attack prints what it saw as "KEY VALUE" lines on stdout, each flushed at once: where the
 * broker dies the lines printed so far are the evidence. A completion status is printed as its
 * number, then its name. Setup failures end the program with "engine-attacker: step: why" on
 * stderr and exit status 1; the test then finds the keys it needs missing.
 *
 * Standard verbs come from the libibverbs face (ibv-extend-run puts it first on the library
 * path); queues whose memory the attack writes itself come from libibv_extend's extend API and
 * are driven per SPEC.md with softnda_device.h, as hccp_consumer.c does.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <linux/magic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>
#include <softnda_device.h>

static const char *rc_prog = "engine-attacker";
#include "rc_helpers.h"
#include "xrc_helpers.h"

/* ---- what the attacker says ---- */

static void say(const char *key, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", key);
    vprintf(fmt, ap);
    printf("\n");
    fflush(stdout);
    va_end(ap);
}

/* The outcome of a call that sets errno: "OK" or the errno's name (EPERM, EACCES...). */
static const char *outcome(int rc) {
    if (rc == 0) {
        return "OK";
    }
    const char *name = strerrorname_np(errno);
    return name != NULL ? name : "unknown-errno";
}

static void say_status(const char *key, int status) {
    if (status < 0) {
        say(key, "none");
    } else {
        say(key, "%d %s", status, ibv_wc_status_str((enum ibv_wc_status)status));
    }
}

static void say_qp_state(const char *key, struct ibv_qp *qp) {
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    memset(&a, 0, sizeof(a));
    if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) != 0) {
        say(key, "-1 (ibv_query_qp failed)");
    } else {
        say(key, "%d", (int)a.qp_state);
    }
}

/* ---- descriptors the broker sent ----
 * The client library maps each region the broker sends on its fd channel and closes the fd, but
 * the descriptor did arrive in this process: a tenant owns its process and can keep it. This
 * recvmsg, which the library's calls reach first (the program exports it), keeps a duplicate of
 * every memfd that arrives. */

#define MAX_KEPT 128
static int g_kept[MAX_KEPT];
static int g_nkept;

static int fd_target(int fd, char *out, size_t size) {
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, out, size - 1);
    if (n < 0) {
        return -1;
    }
    out[n] = '\0';
    return 0;
}

ssize_t recvmsg(int sock, struct msghdr *msg, int flags) {
    static ssize_t (*real)(int, struct msghdr *, int);
    if (real == NULL) {
        *(void **)(&real) = dlsym(RTLD_NEXT, "recvmsg");
    }
    ssize_t n = real(sock, msg, flags);
    if (n <= 0 || msg->msg_controllen == 0) {
        return n;
    }
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            char target[256];
            if (fd_target(fd, target, sizeof(target)) != 0 || strncmp(target, "/memfd:", 7) != 0) {
                continue;
            }
            int slot = __atomic_fetch_add(&g_nkept, 1, __ATOMIC_SEQ_CST);
            if (slot < MAX_KEPT) {
                g_kept[slot] = fcntl(fd, F_DUPFD_CLOEXEC, 256);
            }
        }
    }
    return n;
}

/* A kept memfd whose /proc/self/fd link starts with prefix, or -1. */
static int kept_fd_named(const char *prefix) {
    int n = __atomic_load_n(&g_nkept, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n && i < MAX_KEPT; ++i) {
        char target[256];
        if (g_kept[i] >= 0 && fd_target(g_kept[i], target, sizeof(target)) == 0 &&
            strncmp(target, prefix, strlen(prefix)) == 0) {
            return g_kept[i];
        }
    }
    return -1;
}

/* A kept memfd on hugetlbfs (queue memory from MFD_HUGETLB), or -1. */
static int kept_hugetlb_fd(void) {
    int n = __atomic_load_n(&g_nkept, __ATOMIC_SEQ_CST);
    for (int i = 0; i < n && i < MAX_KEPT; ++i) {
        struct statfs fs;
        if (g_kept[i] >= 0 && fstatfs(g_kept[i], &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC) {
            return g_kept[i];
        }
    }
    return -1;
}

/* The open fd of this process behind the mapping at addr (a memfd the library made, found by the
 * inode /proc/self/maps names), or -1. */
static int fd_behind(const void *addr, const char *prefix) {
    FILE *maps = fopen("/proc/self/maps", "re");
    char line[512];
    unsigned long ino = 0;
    while (maps != NULL && fgets(line, sizeof(line), maps) != NULL) {
        uintptr_t lo, hi;
        unsigned long inode;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %lu", &lo, &hi, &inode) == 3 && (uintptr_t)addr >= lo &&
            (uintptr_t)addr < hi) {
            ino = inode;
            break;
        }
    }
    if (maps != NULL) {
        fclose(maps);
    }
    DIR *d = opendir("/proc/self/fd");
    int found = -1;
    struct dirent *e;
    while (ino != 0 && d != NULL && found < 0 && (e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        char target[256];
        struct stat st;
        if (e->d_name[0] != '.' && fd_target(fd, target, sizeof(target)) == 0 &&
            strncmp(target, prefix, strlen(prefix)) == 0 && fstat(fd, &st) == 0 && st.st_ino == ino) {
            found = fd;
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    return found;
}

/* ---- the fabric every mode starts from ---- */

struct fabric {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    uint16_t lid;
    struct ibv_context_extend *ext; /* extend_open() */
};

static void fabric_open(struct fabric *f, const char *device) {
    memset(f, 0, sizeof(*f));
    f->ctx = open_named(device);
    struct ibv_port_attr port;
    memset(&port, 0, sizeof(port));
    if (ibv_query_port(f->ctx, 1, &port) != 0) {
        fail("ibv_query_port", strerror(errno));
    }
    f->lid = port.lid;
    f->pd = ibv_alloc_pd(f->ctx);
    if (f->pd == NULL) {
        fail("ibv_alloc_pd", strerror(errno));
    }
}

static struct ibv_cq *face_cq(struct fabric *f, int depth, struct ibv_comp_channel *ch) {
    struct ibv_cq *cq = ibv_create_cq(f->ctx, depth, NULL, ch, 0);
    if (cq == NULL) {
        fail("ibv_create_cq", strerror(errno));
    }
    return cq;
}

static struct ibv_qp *face_qp(struct fabric *f, struct ibv_cq *cq, uint32_t depth, uint32_t sge) {
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = depth;
    ia.cap.max_recv_wr = depth;
    ia.cap.max_send_sge = sge;
    ia.cap.max_recv_sge = sge;
    struct ibv_qp *qp = ibv_create_qp(f->pd, &ia);
    if (qp == NULL) {
        fail("ibv_create_qp", strerror(errno));
    }
    return qp;
}

/* Two RC QPs on one CQ, connected to each other. */
struct pair {
    struct ibv_cq *cq;
    struct ibv_qp *a, *b;
};

static void pair_make(struct fabric *f, struct pair *p, struct ibv_comp_channel *ch, uint32_t depth,
                      uint32_t sge) {
    p->cq = face_cq(f, (int)(4 * depth), ch);
    p->a = face_qp(f, p->cq, depth, sge);
    p->b = face_qp(f, p->cq, depth, sge);
    to_init(p->a);
    to_init(p->b);
    to_rts(p->a, p->b->qp_num, f->lid);
    to_rts(p->b, p->a->qp_num, f->lid);
}

static struct ibv_mr *reg(struct fabric *f, void *buf, size_t len, const char *what) {
    struct ibv_mr *mr = ibv_reg_mr(f->pd, buf, len, kAccess);
    if (mr == NULL) {
        fail(what, strerror(errno));
    }
    return mr;
}

static void *shared_buf(size_t len) {
    void *p = ibvx_alloc_buf(len);
    if (p == NULL) {
        fail("ibvx_alloc_buf", strerror(errno));
    }
    return p;
}

static void fill(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = (uint8_t)(seed + i * 31);
    }
}

static int filled(const uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; ++i) {
        if (p[i] != (uint8_t)(seed + i * 31)) {
            return 0;
        }
    }
    return 1;
}

static void post_or_fail(struct ibv_qp *qp, struct ibv_send_wr *wr) {
    struct ibv_send_wr *bad = NULL;
    if (ibv_post_send(qp, wr, &bad) != 0) {
        fail("ibv_post_send", "refused");
    }
}

/* One signalled WRITE (or SEND with remote NULL) of n SGEs. */
static void post_rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t id, struct ibv_sge *sge, int n,
                      void *remote, uint32_t rkey) {
    struct ibv_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = sge;
    wr.num_sge = n;
    wr.wr.rdma.remote_addr = (uintptr_t)remote;
    wr.wr.rdma.rkey = rkey;
    post_or_fail(qp, &wr);
}

static void post_recv_or_fail(struct ibv_qp *qp, uint64_t id, struct ibv_sge *sge, int n) {
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = id;
    wr.sg_list = sge;
    wr.num_sge = n;
    if (ibv_post_recv(qp, &wr, &bad) != 0) {
        fail("ibv_post_recv", "refused");
    }
}

/* The status of the completion of wr_id on cq within seconds, or -1. Completions of other work
 * requests are passed over. */
static int status_of(struct ibv_cq *cq, uint64_t wr_id, int seconds) {
    struct ibv_wc wc;
    while (poll_wc_within(cq, &wc, seconds, "ibv_poll_cq")) {
        if (wc.wr_id == wr_id) {
            return (int)wc.status;
        }
    }
    return -1;
}

/* ---- the extend API's queues, written per SPEC.md ---- */

static void *cb_alloc(size_t size) {
    return malloc(size);
}
static void cb_free(void *p) {
    free(p);
}
static void cb_memset_s(void *dst, int c, size_t n) {
    memset(dst, c, n);
}
static int cb_memcpy_s(void *dst, size_t max, void *src, size_t n, uint32_t dir) {
    (void)dir;
    if (n > max) {
        return -1;
    }
    memcpy(dst, src, n);
    return 0;
}
/* The device of this program is the host CPU: a doorbell's device address is its host address. */
static void *cb_db_mmap(struct doorbell_map_desc *desc) {
    return (void *)(uintptr_t)desc->hva;
}
static int cb_db_unmap(void *ptr, struct doorbell_map_desc *desc) {
    (void)ptr;
    (void)desc;
    return 0;
}
static struct ibv_extend_ops g_ops = {cb_alloc, cb_free, cb_memset_s, cb_memcpy_s, cb_db_mmap, cb_db_unmap};

static void extend_open(struct fabric *f) {
    f->ext = ibv_open_extend(f->ctx);
    if (f->ext == NULL) {
        fail("ibv_open_extend", strerror(errno));
    }
}

static struct ibv_cq_extend *extend_cq(struct fabric *f, struct softnda_cq *dcq) {
    struct ibv_cq_init_attr_extend ca;
    memset(&ca, 0, sizeof(ca));
    ca.attr.cqe = 16;
    ca.type = QU_BUF_DMA_MODE_DEFAULT;
    ca.ops = &g_ops;
    struct ibv_cq_extend *cq = ibv_create_cq_extend(f->ext, &ca);
    if (cq == NULL) {
        fail("ibv_create_cq_extend", strerror(errno));
    }
    if (softnda_cq_init(dcq, &cq->cq_info) != 0) {
        fail("softnda_cq_init", "the CQ does not follow SPEC.md");
    }
    return cq;
}

/* The next CQE within seconds (1), or none (0). */
static int raw_cqe_within(struct softnda_cq *cq, struct softnda_cqe *out, int seconds) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (softnda_cq_poll(cq, out, 1) == 1) {
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > seconds) {
            return 0;
        }
        struct timespec rest = {0, 100 * 1000};
        nanosleep(&rest, NULL);
    }
}

static int raw_status_within(struct softnda_cq *cq, uint64_t wr_id, int seconds) {
    struct softnda_cqe c;
    while (raw_cqe_within(cq, &c, seconds)) {
        if (c.wr_id == wr_id) {
            return c.status;
        }
    }
    return -1;
}

/* ---- honest: connected QPs moving verified data, one round per line of stdin ---- */

#define HONEST_LEN 4096

struct honest {
    struct pair p;
    uint8_t *send, *recv, *target;
    struct ibv_mr *send_mr, *recv_mr, *target_mr;
};

/* NULL, or why the round failed. */
static const char *honest_round(struct honest *h, unsigned round) {
    struct ibv_wc wc;
    fill(h->send, HONEST_LEN, round);
    memset(h->recv, 0, HONEST_LEN);
    struct ibv_sge rsge = {(uintptr_t)h->recv, HONEST_LEN, h->recv_mr->lkey};
    post_recv_or_fail(h->p.b, 3 * (uint64_t)round, &rsge, 1);
    struct ibv_sge ssge = {(uintptr_t)h->send, HONEST_LEN, h->send_mr->lkey};
    post_rdma(h->p.a, IBV_WR_SEND, 3 * (uint64_t)round + 1, &ssge, 1, NULL, 0);
    for (int i = 0; i < 2; ++i) {
        if (!poll_wc_within(h->p.cq, &wc, 10, "ibv_poll_cq")) {
            return "SEND: no completion in 10 s";
        }
        if (wc.status != IBV_WC_SUCCESS) {
            return ibv_wc_status_str(wc.status);
        }
    }
    if (!filled(h->recv, HONEST_LEN, round)) {
        return "SEND: the receive holds other bytes";
    }
    fill(h->send, HONEST_LEN, round + 101);
    post_rdma(h->p.a, IBV_WR_RDMA_WRITE, 3 * (uint64_t)round + 2, &ssge, 1, h->target, h->target_mr->rkey);
    if (!poll_wc_within(h->p.cq, &wc, 10, "ibv_poll_cq")) {
        return "WRITE: no completion in 10 s";
    }
    if (wc.status != IBV_WC_SUCCESS) {
        return ibv_wc_status_str(wc.status);
    }
    if (!filled(h->target, HONEST_LEN, round + 101)) {
        return "WRITE: the target holds other bytes";
    }
    return NULL;
}

static int run_honest(struct fabric *f) {
    struct honest h;
    pair_make(f, &h.p, NULL, 8, 1);
    h.send = malloc(HONEST_LEN);
    h.recv = malloc(HONEST_LEN);
    h.target = malloc(HONEST_LEN);
    if (h.send == NULL || h.recv == NULL || h.target == NULL) {
        fail("malloc", "out of memory");
    }
    h.send_mr = reg(f, h.send, HONEST_LEN, "ibv_reg_mr");
    h.recv_mr = reg(f, h.recv, HONEST_LEN, "ibv_reg_mr");
    h.target_mr = reg(f, h.target, HONEST_LEN, "ibv_reg_mr");
    printf("READY\n");
    fflush(stdout);
    char line[64];
    for (unsigned round = 1; fgets(line, sizeof(line), stdin) != NULL; ++round) {
        const char *why = honest_round(&h, round);
        printf("ROUND %u %s\n", round, why == NULL ? "OK" : why);
        fflush(stdout);
    }
    return 0;
}

/* ---- 1: an XRC initiator's WQE longer than the engine's copy of it ---- */

/* max_inline_data 464 gives an XRC initiator 1,024-byte SQ entries (64 B of header and XRC segment
 * + 464, rounded to a power of two), so a WQE may say 960 bytes of inline data or 60 SGEs: more
 * than the engine's copy of a WQE holds (464 bytes, 29 SGEs). */
static int run_xrc_overflow(struct fabric *f, int by_inline) {
    extend_open(f);
    struct softnda_cq dcq;
    struct ibv_cq_extend *ecq = extend_cq(f, &dcq);
    struct ibv_xrcd *xrcd = open_xrcd(f->ctx, -1, O_CREAT);
    if (xrcd == NULL) {
        fail("ibv_open_xrcd", strerror(errno));
    }
    struct ibv_cq *srq_cq = face_cq(f, 16, NULL);
    uint32_t srqn = 0;
    (void)xrc_srq(f->ctx, f->pd, xrcd, srq_cq, 4, &srqn, "ibv_create_srq_ex (XRC)");
    struct ibv_qp *tgt = xrc_target(f->ctx, xrcd);
    if (tgt == NULL) {
        fail("ibv_create_qp_ex (XRC target)", strerror(errno));
    }
    struct ibv_qp_init_attr_extend qa;
    memset(&qa, 0, sizeof(qa));
    qa.pd = f->pd;
    qa.attr.send_cq = ecq->cq;
    qa.attr.qp_type = IBV_QPT_XRC_SEND;
    qa.attr.cap.max_send_wr = 4;
    qa.attr.cap.max_send_sge = 1;
    qa.attr.cap.max_inline_data = 464;
    qa.type = QU_BUF_DMA_MODE_DEFAULT;
    qa.ops = &g_ops;
    struct ibv_qp_extend *ini = ibv_create_qp_extend(f->ext, &qa);
    if (ini == NULL) {
        fail("ibv_create_qp_extend (XRC initiator)", strerror(errno));
    }
    say("sq_entry_size", "%u", ini->sq_info.qbuf.entry_size);
    to_init(ini->qp);
    to_init(tgt);
    to_rts(ini->qp, tgt->qp_num, f->lid);
    to_rts(tgt, ini->qp->qp_num, f->lid);

    struct softnda_sq sq;
    if (softnda_sq_init_xrc(&sq, &ini->sq_info) != 0) {
        fail("softnda_sq_init_xrc", "the SQ does not follow SPEC.md");
    }
    /* The helpers keep to SOFTNDA_MAX_SGE and SOFTNDA_MAX_INLINE; an attacker writes whatever the
     * entry has room for, so their limits are lifted to that room. */
    sq.max_sge = (sq.entry_size - sq.data_offset) / SOFTNDA_SGE_SIZE;
    sq.max_inline = sq.entry_size - sq.data_offset;
    static struct softnda_sge bytes[60]; /* 960 bytes: as inline data, or as 60 SGEs */
    memset(bytes, 0x41, sizeof(bytes));
    struct softnda_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 0x4141;
    wr.opcode = SOFTNDA_OP_SEND;
    wr.flags = SOFTNDA_WQE_SIGNALED;
    wr.remote_srqn = srqn;
    if (by_inline) {
        wr.inline_data = bytes;
        wr.inline_len = sizeof(bytes);
        say("wqe", "inline_len %u", wr.inline_len);
    } else {
        wr.sg_list = bytes;
        wr.num_sge = sizeof(bytes) / sizeof(bytes[0]);
        say("wqe", "num_sge %u", wr.num_sge);
    }
    int rc = softnda_sq_post(&sq, &wr);
    if (rc != 0) {
        fail("softnda_sq_post", strerror(-rc));
    }
    softnda_sq_doorbell(&sq);
    say_status("status", raw_status_within(&dcq, wr.wr_id, 10));
    say_qp_state("qp_state", ini->qp);
    return 0;
}

/* ---- 2: a receive WQE with more SGEs than the engine's copy of a receive holds ---- */

/* max_recv_sge 16 gives 512-byte RQ (and SRQ) entries, room for 31 SGEs; the engine copies a
 * receive into 29. */
static int run_recv_sge(struct fabric *f, int with_srq) {
    extend_open(f);
    struct softnda_cq dcq;
    struct ibv_cq_extend *ecq = extend_cq(f, &dcq);
    struct ibv_srq_extend *srq = NULL;
    if (with_srq) {
        struct ibv_srq_init_attr_extend sa;
        memset(&sa, 0, sizeof(sa));
        sa.pd = f->pd;
        sa.attr.attr.max_wr = 4;
        sa.attr.attr.max_sge = 16;
        sa.type = QU_BUF_DMA_MODE_DEFAULT;
        sa.ops = &g_ops;
        srq = ibv_create_srq_extend(f->ext, &sa);
        if (srq == NULL) {
            fail("ibv_create_srq_extend", strerror(errno));
        }
        say("granted_max_recv_sge", "%u", sa.attr.attr.max_sge);
        struct ibv_srq_attr attr;
        memset(&attr, 0, sizeof(attr));
        say("queried_max_recv_sge", "%d", ibv_query_srq(srq->srq, &attr) == 0 ? (int)attr.max_sge : -1);
    }
    struct ibv_qp_init_attr_extend qa;
    memset(&qa, 0, sizeof(qa));
    qa.pd = f->pd;
    qa.attr.send_cq = ecq->cq;
    qa.attr.recv_cq = ecq->cq;
    qa.attr.srq = srq != NULL ? srq->srq : NULL;
    qa.attr.qp_type = IBV_QPT_RC;
    qa.attr.cap.max_send_wr = 4;
    qa.attr.cap.max_send_sge = 1;
    qa.attr.cap.max_recv_wr = with_srq ? 0 : 4;
    qa.attr.cap.max_recv_sge = with_srq ? 0 : 16;
    qa.type = QU_BUF_DMA_MODE_DEFAULT;
    qa.ops = &g_ops;
    struct ibv_qp_extend *victim = ibv_create_qp_extend(f->ext, &qa);
    if (victim == NULL) {
        fail("ibv_create_qp_extend", strerror(errno));
    }
    if (!with_srq) {
        say("granted_max_recv_sge", "%u", qa.attr.cap.max_recv_sge);
        struct ibv_qp_attr a;
        struct ibv_qp_init_attr ia;
        memset(&ia, 0, sizeof(ia));
        say("queried_max_recv_sge", "%d",
            ibv_query_qp(victim->qp, &a, IBV_QP_CAP, &ia) == 0 ? (int)ia.cap.max_recv_sge : -1);
    }
    struct ibv_cq *peer_cq = face_cq(f, 16, NULL);
    struct ibv_qp *peer = face_qp(f, peer_cq, 4, 1);
    to_init(victim->qp);
    to_init(peer);
    to_rts(victim->qp, peer->qp_num, f->lid);
    to_rts(peer, victim->qp->qp_num, f->lid);

    struct softnda_rq rq;
    if (softnda_rq_init(&rq, with_srq ? &srq->srq_info : &victim->rq_info) != 0) {
        fail("softnda_rq_init", "the receive queue does not follow SPEC.md");
    }
    rq.max_sge = (rq.entry_size - SOFTNDA_RECV_HEADER_SIZE) / SOFTNDA_SGE_SIZE; /* the room, as above */
    say("rq_entry_size", "%u", rq.entry_size);
    enum { kSges = 31, kPiece = 64 };
    uint8_t *land = shared_buf(4096);
    struct ibv_mr *land_mr = reg(f, land, 4096, "ibv_reg_mr (receive buffers)");
    struct softnda_sge sges[kSges];
    for (int i = 0; i < kSges; ++i) {
        sges[i].addr = (uintptr_t)(land + i * kPiece);
        sges[i].length = kPiece;
        sges[i].lkey = land_mr->lkey;
    }
    int rc = softnda_rq_post(&rq, 0x31, sges, kSges);
    if (rc != 0) {
        fail("softnda_rq_post (31 SGEs)", strerror(-rc));
    }
    softnda_rq_doorbell(&rq);

    uint8_t *msg = shared_buf(4096);
    struct ibv_mr *msg_mr = reg(f, msg, 4096, "ibv_reg_mr (message)");
    fill(msg, 100, 7);
    struct ibv_sge ssge = {(uintptr_t)msg, 100, msg_mr->lkey};
    post_rdma(peer, IBV_WR_SEND, 0x5e, &ssge, 1, NULL, 0);
    say_status("recv_status", raw_status_within(&dcq, 0x31, 10));
    say_status("send_status", status_of(peer_cq, 0x5e, 10));
    say_qp_state("qp_state", victim->qp);
    return 0;
}

/* ---- 3: registered memory shrunk under the MR ---- */

#define SHRINK_LEN 65536

/* Shrinks the file behind src (registered as src_mr) to nothing, then WRITEs from src into dst.
 * Keys: <prefix>truncate, <prefix>write_status, <prefix>data. A shrink that succeeded leaves src
 * without pages: the program must not read it again (SIGBUS), so the WRITE's bytes are checked
 * only when it completed. */
static void shrink_then_write(struct pair *p, const char *prefix, int fd, uint8_t *src, struct ibv_mr *src_mr,
                              uint8_t *dst, struct ibv_mr *dst_mr) {
    char key[64];
    memset(dst, 0, SHRINK_LEN);
    snprintf(key, sizeof(key), "%struncate", prefix);
    say(key, "%s", outcome(ftruncate(fd, 0)));
    struct ibv_sge sge = {(uintptr_t)src, SHRINK_LEN, src_mr->lkey};
    post_rdma(p->a, IBV_WR_RDMA_WRITE, 0x3a, &sge, 1, dst, dst_mr->rkey);
    int status = status_of(p->cq, 0x3a, 10);
    snprintf(key, sizeof(key), "%swrite_status", prefix);
    say_status(key, status);
    if (status == IBV_WC_SUCCESS) {
        snprintf(key, sizeof(key), "%sdata", prefix);
        say(key, "%s", filled(dst, SHRINK_LEN, 0x3a) ? "ok" : "differs");
    }
}

/* A memfd of this program's own, mapped shared and registered in place; sealed against shrinking
 * or not. Keys start with prefix: <prefix>reg, then shrink_then_write's. */
static void own_memfd(struct fabric *f, struct pair *p, const char *prefix, int sealed, uint8_t *dst,
                      struct ibv_mr *dst_mr) {
    int fd = memfd_create(prefix, MFD_CLOEXEC | (sealed ? MFD_ALLOW_SEALING : 0));
    if (fd < 0 || ftruncate(fd, SHRINK_LEN) != 0 || (sealed && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
        fail("memfd_create", strerror(errno));
    }
    uint8_t *src = mmap(NULL, SHRINK_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (src == MAP_FAILED) {
        fail("mmap (memfd)", strerror(errno));
    }
    fill(src, SHRINK_LEN, 0x3a);
    struct ibv_mr *mr = ibv_reg_mr(f->pd, src, SHRINK_LEN, kAccess);
    char key[64];
    snprintf(key, sizeof(key), "%sreg", prefix);
    say(key, "%s", outcome(mr == NULL ? -1 : 0));
    if (mr != NULL) {
        shrink_then_write(p, prefix, fd, src, mr, dst, dst_mr);
    }
}

enum shrink_kind { SHRINK_BUF, SHRINK_HEAP, SHRINK_MEMFD };

static int run_shrink_mr(struct fabric *f, enum shrink_kind kind) {
    struct pair p;
    pair_make(f, &p, NULL, 4, 1);
    /* The WRITE's target is never shrunk: the program reads it after. */
    uint8_t *dst = shared_buf(SHRINK_LEN);
    struct ibv_mr *dst_mr = reg(f, dst, SHRINK_LEN, "ibv_reg_mr (target)");
    if (kind == SHRINK_MEMFD) {
        /* Sealed first: once an unsealed one was shrunk the broker may be gone. */
        own_memfd(f, &p, "sealed_", 1, dst, dst_mr);
        own_memfd(f, &p, "unsealed_", 0, dst, dst_mr);
        return 0;
    }
    uint8_t *src = NULL;
    const char *memfd = NULL;
    if (kind == SHRINK_BUF) {
        src = shared_buf(SHRINK_LEN);
        memfd = "/memfd:ibvx-buf";
    } else {
        if (posix_memalign((void **)&src, 4096, SHRINK_LEN) != 0) {
            fail("posix_memalign", "out of memory");
        }
        memfd = "/memfd:ibvx-shared-pages";
    }
    fill(src, SHRINK_LEN, 0x3a);
    struct ibv_mr *mr = reg(f, src, SHRINK_LEN, "ibv_reg_mr (source)");
    int fd = fd_behind(src, memfd);
    if (fd < 0) {
        say("memfd", "none (no %s behind the registered memory)", memfd);
        return 1;
    }
    say("memfd", "%s", memfd);
    shrink_then_write(&p, "", fd, src, mr, dst, dst_mr);
    return 0;
}

/* ---- 4: the doorbell BAR, or hugetlb queue memory, shrunk ---- */

/* Shrinks the memfd fd the broker sent (named what), then rings a doorbell with a WRITE. Once
 * the shrink succeeded the doorbell page and queue memory are gone in this process too: the
 * ring itself may end it with SIGBUS, so everything is said before. */
static int shrink_sent_then_ring(struct fabric *f, struct pair *p, int fd, const char *what) {
    if (fd < 0) {
        say("memfd", "none (%s never arrived)", what);
        return 1;
    }
    char target[256] = "";
    (void)fd_target(fd, target, sizeof(target));
    say("memfd", "%s", target);
    uint8_t *src = shared_buf(SHRINK_LEN), *dst = shared_buf(SHRINK_LEN);
    struct ibv_mr *src_mr = reg(f, src, SHRINK_LEN, "ibv_reg_mr (source)");
    struct ibv_mr *dst_mr = reg(f, dst, SHRINK_LEN, "ibv_reg_mr (target)");
    fill(src, SHRINK_LEN, 0x3a);
    say("truncate", "%s", outcome(ftruncate(fd, 0)));
    say("ringing", "a doorbell");
    struct ibv_sge sge = {(uintptr_t)src, SHRINK_LEN, src_mr->lkey};
    post_rdma(p->a, IBV_WR_RDMA_WRITE, 0x4d, &sge, 1, dst, dst_mr->rkey);
    int status = status_of(p->cq, 0x4d, 10);
    say_status("write_status", status);
    if (status == IBV_WC_SUCCESS) {
        say("data", "%s", filled(dst, SHRINK_LEN, 0x3a) ? "ok" : "differs");
    }
    return 0;
}

static int run_shrink_bar(struct fabric *f) {
    struct pair p;
    pair_make(f, &p, NULL, 4, 1);
    return shrink_sent_then_ring(f, &p, kept_fd_named("/memfd:softnda-bar"),
                                 "the doorbell BAR (softnda-bar)");
}

static int run_shrink_queue(struct fabric *f) {
    struct pair p;
    pair_make(f, &p, NULL, 4, 1);
    if (kept_hugetlb_fd() < 0) {
        say("memfd", "not-hugetlb (queue memory did not come from MFD_HUGETLB)");
        return 0;
    }
    return shrink_sent_then_ring(f, &p, kept_hugetlb_fd(), "hugetlb queue memory");
}

/* ---- 5: eventfds the engine writes to, full ---- */

/* An eventfd holding 0xfffffffffffffffe takes no further write: a blocking write waits for a
 * read that never comes. O_NONBLOCK belongs to the open file, shared with the broker's
 * duplicate, so it is cleared too. */
static void fill_eventfd(const char *key, int fd) {
    int fl = fcntl(fd, F_GETFL);
    uint64_t v = 0xfffffffffffffffeull;
    int rc =
        fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0 || write(fd, &v, sizeof(v)) != (ssize_t)sizeof(v)
            ? -1
            : 0;
    say(key, "%s", outcome(rc));
}

/* The attacker leaves at once, without reading: exit() would run the library's teardown,
 * broker calls that a wedged broker never answers. */
static void leave(void) {
    say("exiting", "now");
    _exit(0);
}

static int run_full_channel(struct fabric *f) {
    struct ibv_comp_channel *ch = ibv_create_comp_channel(f->ctx);
    if (ch == NULL) {
        fail("ibv_create_comp_channel", strerror(errno));
    }
    struct pair p;
    pair_make(f, &p, ch, 4, 1);
    uint8_t *src = shared_buf(4096), *dst = shared_buf(4096);
    struct ibv_mr *src_mr = reg(f, src, 4096, "ibv_reg_mr"), *dst_mr = reg(f, dst, 4096, "ibv_reg_mr");
    if (ibv_req_notify_cq(p.cq, 0) != 0) {
        fail("ibv_req_notify_cq", "refused");
    }
    fill_eventfd("filled", ch->fd);
    struct ibv_sge sge = {(uintptr_t)src, 64, src_mr->lkey};
    post_rdma(p.a, IBV_WR_RDMA_WRITE, 0x5a, &sge, 1, dst, dst_mr->rkey);
    /* Its CQE is published before the event is raised: once it is seen the engine is writing. */
    say_status("write_status", status_of(p.cq, 0x5a, 10));
    leave();
    return 0;
}

static int run_full_async(struct fabric *f) {
    struct pair p;
    pair_make(f, &p, NULL, 4, 1);
    uint8_t *src = shared_buf(4096), *dst = shared_buf(4096);
    (void)reg(f, src, 4096, "ibv_reg_mr");
    struct ibv_mr *dst_mr = reg(f, dst, 4096, "ibv_reg_mr");
    fill_eventfd("filled", f->ctx->async_fd);
    /* A key of no MR: the WQE fails and its QP goes to ERR, which the engine reports on the
     * context's async eventfd before the error CQE. */
    struct ibv_sge sge = {(uintptr_t)src, 64, 0x0badbad0};
    post_rdma(p.a, IBV_WR_RDMA_WRITE, 0x5b, &sge, 1, dst, dst_mr->rkey);
    say_status("write_status", status_of(p.cq, 0x5b, 5));
    leave();
    return 0;
}

/* ---- 6: WQEs that each keep the engine busy for a long time ---- */

/* Each SEND gathers 29 SGEs of one 64 MiB MR (1.8 GiB) into a receive that scatters them over
 * another; HOG_WQES of them are queued at once. Meanwhile another tenant (a child, forked before
 * this process made a session, so it makes its own) runs control calls and says how many of
 * the SENDs had completed before and after each. */
#define HOG_WQES 16
#define HOG_SGES 29
#define HOG_MR (64u << 20)

struct hog_board {
    uint32_t done;  /* SENDs completed, as the hog polled them */
    uint32_t total; /* HOG_WQES once they are all posted */
};

/* One control call, timed by the hog's completions: "CALL name before after". */
#define CONTROL(board, name, expr)                                            \
    do {                                                                      \
        uint32_t before_ = __atomic_load_n(&(board)->done, __ATOMIC_SEQ_CST); \
        if (!(expr)) {                                                        \
            fail(name, strerror(errno));                                      \
        }                                                                     \
        uint32_t after_ = __atomic_load_n(&(board)->done, __ATOMIC_SEQ_CST);  \
        say("CALL", "%s %u %u", name, before_, after_);                       \
    } while (0)

static void control_cycle(struct hog_board *b, const char *device) {
    int n = 0;
    struct ibv_context *ctx = NULL;
    struct ibv_pd *pd = NULL;
    struct ibv_cq *cq = NULL;
    struct ibv_qp *qp = NULL;
    struct ibv_device **list = NULL;
    CONTROL(b, "ibv_open_device",
            (list = ibv_get_device_list(&n)) != NULL && n > 0 && (ctx = ibv_open_device(list[0])) != NULL &&
                strcmp(ibv_get_device_name(list[0]), device) == 0);
    ibv_free_device_list(list);
    CONTROL(b, "ibv_alloc_pd", (pd = ibv_alloc_pd(ctx)) != NULL);
    CONTROL(b, "ibv_create_cq", (cq = ibv_create_cq(ctx, 16, NULL, NULL, 0)) != NULL);
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    CONTROL(b, "ibv_create_qp", (qp = ibv_create_qp(pd, &ia)) != NULL);
    CONTROL(b, "ibv_destroy_qp", ibv_destroy_qp(qp) == 0);
    CONTROL(b, "ibv_destroy_cq", ibv_destroy_cq(cq) == 0);
    CONTROL(b, "ibv_dealloc_pd", ibv_dealloc_pd(pd) == 0);
    CONTROL(b, "ibv_close_device", ibv_close_device(ctx) == 0);
}

static void run_control(struct hog_board *b, int go, const char *device) {
    char c;
    if (read(go, &c, 1) != 1) {
        _exit(1);
    }
    /* Cycles while the hog runs, at most 20; one full cycle at least. */
    for (int cycle = 0; cycle < 20; ++cycle) {
        control_cycle(b, device);
        if (__atomic_load_n(&b->done, __ATOMIC_SEQ_CST) >= b->total) {
            break;
        }
    }
    fflush(stdout);
    _exit(0);
}

static int run_hog(const char *device) {
    struct hog_board *board =
        mmap(NULL, sizeof(*board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int go[2];
    if (board == MAP_FAILED || pipe(go) != 0) {
        fail("the board shared with the control tenant", strerror(errno));
    }
    board->total = HOG_WQES;
    fflush(stdout);
    pid_t control = fork();
    if (control < 0) {
        fail("fork", strerror(errno));
    }
    if (control == 0) {
        close(go[1]);
        run_control(board, go[0], device);
    }
    close(go[0]);

    struct fabric f;
    fabric_open(&f, device);
    struct pair p;
    pair_make(&f, &p, NULL, HOG_WQES, HOG_SGES);
    uint8_t *src = shared_buf(HOG_MR), *dst = shared_buf(HOG_MR);
    memset(src, 0x68, HOG_MR);
    memset(dst, 0, HOG_MR);
    struct ibv_mr *src_mr = reg(&f, src, HOG_MR, "ibv_reg_mr (64 MiB)");
    struct ibv_mr *dst_mr = reg(&f, dst, HOG_MR, "ibv_reg_mr (64 MiB)");
    struct ibv_sge ssge[HOG_SGES], rsge[HOG_SGES];
    for (int i = 0; i < HOG_SGES; ++i) {
        ssge[i] = (struct ibv_sge){(uintptr_t)src, HOG_MR, src_mr->lkey};
        rsge[i] = (struct ibv_sge){(uintptr_t)dst, HOG_MR, dst_mr->lkey};
    }
    struct ibv_send_wr wrs[HOG_WQES];
    memset(wrs, 0, sizeof(wrs));
    for (int i = 0; i < HOG_WQES; ++i) {
        post_recv_or_fail(p.b, 1000 + (uint64_t)i, rsge, HOG_SGES);
        wrs[i].wr_id = (uint64_t)i;
        wrs[i].opcode = IBV_WR_SEND;
        wrs[i].send_flags = IBV_SEND_SIGNALED;
        wrs[i].sg_list = ssge;
        wrs[i].num_sge = HOG_SGES;
        wrs[i].next = i + 1 < HOG_WQES ? &wrs[i + 1] : NULL;
    }
    post_or_fail(p.a, wrs); /* one doorbell for all of them */
    if (write(go[1], "g", 1) != 1) {
        fail("starting the control tenant", strerror(errno));
    }
    /* Polls with a rest between empty polls: the broker's control path, which the criterion
     * times, needs the CPU the engine leaves. */
    uint32_t failed = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (__atomic_load_n(&board->done, __ATOMIC_SEQ_CST) < HOG_WQES) {
        struct ibv_wc wc;
        int n = ibv_poll_cq(p.cq, 1, &wc);
        if (n < 0) {
            fail("ibv_poll_cq", "failed");
        }
        if (n == 0) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if (t.tv_sec - t0.tv_sec > 120) {
                break;
            }
            struct timespec rest = {0, 200 * 1000};
            nanosleep(&rest, NULL);
        } else if (wc.opcode == IBV_WC_SEND || (wc.status != IBV_WC_SUCCESS && wc.wr_id < HOG_WQES)) {
            failed += wc.status != IBV_WC_SUCCESS;
            __atomic_fetch_add(&board->done, 1, __ATOMIC_SEQ_CST);
        }
    }
    int status = 0;
    waitpid(control, &status, 0);
    say("hog", "%u of %u failed %u control_exit %d", __atomic_load_n(&board->done, __ATOMIC_SEQ_CST),
        HOG_WQES, failed, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: engine-attacker MODE DEVICE\n");
        return 2;
    }
    const char *mode = argv[1], *device = argv[2];
    if (strcmp(mode, "hog") == 0) {
        return run_hog(device); /* opens its device after forking the control tenant */
    }
    struct fabric f;
    fabric_open(&f, device);
    if (strcmp(mode, "honest") == 0) {
        return run_honest(&f);
    }
    if (strcmp(mode, "xrc-inline") == 0 || strcmp(mode, "xrc-sge") == 0) {
        return run_xrc_overflow(&f, strcmp(mode, "xrc-inline") == 0);
    }
    if (strcmp(mode, "recv-sge-qp") == 0 || strcmp(mode, "recv-sge-srq") == 0) {
        return run_recv_sge(&f, strcmp(mode, "recv-sge-srq") == 0);
    }
    if (strcmp(mode, "shrink-buf") == 0) {
        return run_shrink_mr(&f, SHRINK_BUF);
    }
    if (strcmp(mode, "shrink-heap") == 0) {
        return run_shrink_mr(&f, SHRINK_HEAP);
    }
    if (strcmp(mode, "shrink-memfd") == 0) {
        return run_shrink_mr(&f, SHRINK_MEMFD);
    }
    if (strcmp(mode, "shrink-bar") == 0) {
        return run_shrink_bar(&f);
    }
    if (strcmp(mode, "shrink-queue") == 0) {
        return run_shrink_queue(&f);
    }
    if (strcmp(mode, "full-channel") == 0) {
        return run_full_channel(&f);
    }
    if (strcmp(mode, "full-async") == 0) {
        return run_full_async(&f);
    }
    fprintf(stderr, "engine-attacker: unknown mode %s\n", mode);
    return 2;
}
