/*
 * What strict verbs programs rely on, checked through the standard verbs alone (linked against the
 * system libibverbs, run through ibv-extend-run so the face serves it):
 *  - ibv_modify_qp with an attribute mask the transition does not allow fails with EINVAL and
 *    leaves the QP as it was (an RTR refused after an INIT leaves it in INIT); ibv_query_qp
 *    reports what ibv_modify_qp set;
 *  - an RDMA WRITE with a bad rkey completes with IBV_WC_REM_ACCESS_ERR, the QP moves to ERR,
 *    the next work request is flushed with IBV_WC_WR_FLUSH_ERR, and ibv_get_async_event reports
 *    IBV_EVENT_QP_FATAL for that QP;
 *  - a completion channel becomes readable (poll()) after ibv_req_notify_cq and a completion,
 *    and ibv_get_cq_event names the CQ;
 *  - ibv_create_cq_ex's poll API and ibv_qp_ex's ibv_wr_* API move data;
 *  - a receive-only QP (max_send_wr 0) and a send-only one (max_recv_wr 0) are created, report
 *    depth 0, refuse a post to that queue with ENOMEM and *bad_wr, and carry a SEND between them.
 *  - a receive posted in RESET and a send posted before RTS are refused (EINVAL), as rdma-core's
 *    providers refuse them;
 *  - a responder whose receive CQ overflows raises IBV_EVENT_CQ_ERR for that CQ;
 *  - ibv_import_device on a dup of the context's cmd_fd, then ibv_import_pd/_mr/_dm by handle:
 *    queues on the import carry a WRITE into the imported MR; closing the import and unimporting
 *    leave the originals working; an fd that is no context's is refused with EOPNOTSUPP;
 *  - a QP moved to RESET leaves none of its unpolled completions (flushes) in its CQs, and
 *    brought up again its first completion is its new work request's;
 *  - ibv_create_ah refuses a port the device lacks and a GRH whose sgid_index names no GID
 *    (EINVAL), and an AH keeps its PD: ibv_dealloc_pd answers EBUSY until the AH is destroyed;
 *  - shared memory (a SysV segment, a memfd sealed with F_SEAL_SHRINK, shared anonymous memory)
 *    registers, in place: an RDMA WRITE into it shows through a second mapping of the same object,
 *    an RDMA READ returns what the program wrote, and deregistration leaves it as it is; memory
 *    its owner could shrink under the broker (POSIX shared memory, an unsealed memfd) is refused
 *    with EACCES;
 *  - ibv_rereg_mr answers as rdma-core 44's: IBV_REREG_MR_ERR_INPUT for what its wrapper checks
 *    (an unknown flag, a translation without a range, a range without one), IBV_REREG_MR_ERR_CMD
 *    for what the provider refuses (no flag, a PD of another context), errno EINVAL, the MR
 *    unchanged and usable; the keys stay, as on a kernel provider; a translation onto shared
 *    memory registers it in place (a WRITE through the same rkey shows through a second
 *    mapping) and one back onto ordinary memory works;
 *  - thread and parent domains: ibv_alloc_td (comp_mask must be 0), ibv_alloc_parent_domain with
 *    and without one (custom allocators refused with EOPNOTSUPP; no PD, a foreign TD: EINVAL);
 *    a QP, SRQ, MR, AH and cq_ex made under a parent domain work on its PD and name it as their
 *    pd; a WRITE between a QP of the parent domain and one of the PD lands; the PD and the TD
 *    answer EBUSY while a parent domain names them, and ibv_dealloc_pd frees the parent domain.
 *
 *   verbs-behaviour DEVICE      exit 0 and "OK", or 1 with "verbs-behaviour: <step>: <why>"
 */
#define _GNU_SOURCE /* mremap */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

static const char *rc_prog = "verbs-behaviour";
#include "rc_helpers.h"

/* One signalled RDMA operation of len bytes between local (in mr) and raddr, waited for. */
static void rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, struct ibv_mr *mr, char *local,
                 uint32_t len, char *raddr, uint32_t rkey, const char *step) {
    struct ibv_sge sge = {(uintptr_t)local, len, mr->lkey};
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 77;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)raddr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(qp, &wr, &bad) != 0) {
        fail(step, "ibv_post_send refused");
    }
    struct ibv_wc wc = wait_wc(cq, step);
    if (wc.status != IBV_WC_SUCCESS) {
        fail(step, ibv_wc_status_str(wc.status));
    }
}

enum { kSharedLen = 8192 };

/* mem and other: two mappings of one shared object of kSharedLen bytes. src and dst: 4 KiB
 * buffers registered as ms and md. */
static void check_in_place(const char *kind, struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_cq *cq,
                           struct ibv_mr *ms, char *src, struct ibv_mr *md, char *dst, char *mem,
                           char *other) {
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, kSharedLen, kAccess);
    if (mr == NULL) {
        fprintf(stderr, "verbs-behaviour: ibv_reg_mr of %s: %s\n", kind, strerror(errno));
        exit(1);
    }
    for (int i = 0; i < 3000; ++i)
        src[i] = (char)(i * 7 + 1);
    rdma(qp, cq, IBV_WR_RDMA_WRITE, ms, src, 3000, mem + 3000, mr->rkey, kind); /* across a page edge */
    if (memcmp(mem + 3000, src, 3000) != 0 || memcmp(other + 3000, src, 3000) != 0) {
        fail(kind, "the RDMA WRITE is not in the shared memory");
    }
    for (int i = 0; i < 2000; ++i)
        mem[6000 + i] = (char)(i * 3 + 5);
    rdma(qp, cq, IBV_WR_RDMA_READ, md, dst, 2000, mem + 6000, mr->rkey, kind);
    if (memcmp(dst, other + 6000, 2000) != 0) {
        fail(kind, "the RDMA READ did not return the shared memory");
    }
    if (ibv_dereg_mr(mr) != 0 || memcmp(other + 3000, src, 3000) != 0) {
        fail(kind, "ibv_dereg_mr failed or changed the shared memory");
    }
}

/* Shared memory its owner can ftruncate under the broker: the broker would fault on it, so it is
 * not registered, and says so with EACCES. */
static void refused_in_place(const char *kind, struct ibv_pd *pd, char *mem) {
    errno = 0;
    struct ibv_mr *mr = ibv_reg_mr(pd, mem, kSharedLen, kAccess);
    if (mr != NULL || errno != EACCES) {
        fprintf(stderr, "verbs-behaviour: ibv_reg_mr of %s: %s (want EACCES)\n", kind,
                mr != NULL ? "registered" : strerror(errno));
        exit(1);
    }
}

static void shared_memory(struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_cq *cq, struct ibv_mr *ms,
                          char *src, struct ibv_mr *md, char *dst) {
    int id = shmget(IPC_PRIVATE, kSharedLen, IPC_CREAT | 0600);
    char *sysv = id >= 0 ? shmat(id, NULL, 0) : (char *)-1,
         *sysv2 = id >= 0 ? shmat(id, NULL, 0) : (char *)-1;
    if (id < 0 || sysv == (char *)-1 || sysv2 == (char *)-1) {
        fail("shmget/shmat", strerror(errno));
    }
    shmctl(id, IPC_RMID, NULL);
    check_in_place("a SysV segment", pd, qp, cq, ms, src, md, dst, sysv, sysv2);

    char name[64];
    snprintf(name, sizeof(name), "/ibvx-verbs-behaviour-%d", (int)getpid());
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || shm_unlink(name) != 0 || ftruncate(fd, kSharedLen) != 0) {
        fail("shm_open", strerror(errno));
    }
    char *px = mmap(NULL, kSharedLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    char *px2 = mmap(NULL, kSharedLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (px == MAP_FAILED || px2 == MAP_FAILED) {
        fail("mmap of POSIX shared memory", strerror(errno));
    }
    refused_in_place("POSIX shared memory", pd, px);

    int mfd = memfd_create("verbs-behaviour", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mfd < 0 || ftruncate(mfd, kSharedLen) != 0) {
        fail("memfd_create", strerror(errno));
    }
    char *mf = mmap(NULL, kSharedLen, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    char *mf2 = mmap(NULL, kSharedLen, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (mf == MAP_FAILED || mf2 == MAP_FAILED) {
        fail("mmap of a memfd", strerror(errno));
    }
    refused_in_place("an unsealed memfd", pd, mf);
    if (fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
        fail("F_ADD_SEALS", strerror(errno));
    }
    check_in_place("a memfd sealed against shrinking", pd, qp, cq, ms, src, md, dst, mf, mf2);
    if (ftruncate(mfd, 0) == 0 || errno != EPERM) {
        fail("a sealed memfd", "ftruncate to 0 was not refused with EPERM");
    }
    munmap(mf, kSharedLen);
    munmap(mf2, kSharedLen);
    close(mfd);

    char *anon = mmap(NULL, kSharedLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* mremap of old size 0 maps the same shared pages a second time */
    char *anon2 = anon != MAP_FAILED ? mremap(anon, 0, kSharedLen, MREMAP_MAYMOVE) : MAP_FAILED;
    if (anon == MAP_FAILED || anon2 == MAP_FAILED) {
        fail("shared anonymous mmap", strerror(errno));
    }
    check_in_place("shared anonymous memory", pd, qp, cq, ms, src, md, dst, anon, anon2);
    shmdt(sysv);
    shmdt(sysv2);
    munmap(px, kSharedLen);
    munmap(px2, kSharedLen);
    munmap(anon, kSharedLen);
    munmap(anon2, kSharedLen);
    close(fd);
}

/* Whether the page at p is one of the shared pages registration moves ordinary memory onto. */
static int on_shared_pages(const void *p) {
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (maps != NULL && !found && fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo = 0, hi = 0;
        found = sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (unsigned long)p >= lo && (unsigned long)p < hi &&
                strstr(line, "ibvx-shared-pages") != NULL;
    }
    if (maps != NULL) {
        fclose(maps);
    }
    return found;
}

/* A QP moved to RESET leaves none of its unpolled completions in its CQs, as rdma-core's mlx5
 * cleans them, so a QP brought up again does not meet the flushes of its last connection: a bad
 * rkey puts a in ERR with flushes of its SQ and RQ still unpolled; after RESET both CQs are empty,
 * and after a new bring-up the first completion is the new WRITE. */
static void reset_cleans_cqs(struct ibv_context *ctx, struct ibv_pd *pd, uint16_t lid, struct ibv_mr *ms,
                             char *src, struct ibv_mr *md, char *dst) {
    struct ibv_cq *scq = ibv_create_cq(ctx, 16, NULL, NULL, 0), *rcq = ibv_create_cq(ctx, 16, NULL, NULL, 0),
                  *bcq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
    if (scq == NULL || rcq == NULL || bcq == NULL) {
        fail("reset: ibv_create_cq", strerror(errno));
    }
    struct ibv_qp *a = rc_qp_cqs_or_null(pd, scq, rcq), *b = rc_qp(pd, bcq);
    if (a == NULL) {
        fail("reset: ibv_create_qp", strerror(errno));
    }
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, lid);
    to_rts(b, a->qp_num, lid);
    struct ibv_sge rsge = {(uintptr_t)dst, 8, md->lkey};
    for (int i = 0; i < 3; ++i) {
        struct ibv_recv_wr rw = {.wr_id = 500 + i, .sg_list = &rsge, .num_sge = 1}, *rbad = NULL;
        if (ibv_post_recv(a, &rw, &rbad) != 0) {
            fail("reset: ibv_post_recv", "refused");
        }
    }
    struct ibv_sge sge = {(uintptr_t)src, 8, ms->lkey};
    struct ibv_send_wr wr, w2, *bad = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 510;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)dst;
    wr.wr.rdma.rkey = md->rkey ^ 0x55;
    if (ibv_post_send(a, &wr, &bad) != 0) {
        fail("reset: bad rkey", "refused");
    }
    struct ibv_wc wc = wait_wc(scq, "reset: bad rkey");
    if (wc.wr_id != 510 || wc.status != IBV_WC_REM_ACCESS_ERR) {
        fail("reset: bad rkey", "not IBV_WC_REM_ACCESS_ERR");
    }
    /* Two more sends in one post, flushed together; the first flush of each queue is polled,
     * which shows the engine flushed the queue, and the rest stays in the CQs. */
    wr.wr_id = 511;
    wr.wr.rdma.rkey = md->rkey;
    w2 = wr;
    w2.wr_id = 512;
    wr.next = &w2;
    if (ibv_post_send(a, &wr, &bad) != 0) {
        fail("reset: post in ERR", "refused");
    }
    wc = wait_wc(scq, "reset: SQ flush");
    struct ibv_wc rwc = wait_wc(rcq, "reset: RQ flush");
    if (wc.wr_id != 511 || wc.status != IBV_WC_WR_FLUSH_ERR || rwc.wr_id != 500 ||
        rwc.status != IBV_WC_WR_FLUSH_ERR) {
        fail("reset: flush", "not the flushes expected");
    }
    struct ibv_qp_attr qa;
    memset(&qa, 0, sizeof(qa));
    qa.qp_state = IBV_QPS_RESET;
    if (ibv_modify_qp(a, &qa, IBV_QP_STATE) != 0 || ibv_modify_qp(b, &qa, IBV_QP_STATE) != 0) {
        fail("reset: to RESET", "refused");
    }
    if (ibv_poll_cq(scq, 1, &wc) != 0 || ibv_poll_cq(rcq, 1, &rwc) != 0) {
        fail("reset", "a completion of the QP before its RESET is still in its CQ");
    }
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, lid);
    to_rts(b, a->qp_num, lid);
    wr.wr_id = 520;
    wr.next = NULL;
    strcpy(src, "again");
    if (ibv_post_send(a, &wr, &bad) != 0) {
        fail("reset: WRITE after bring-up", "refused");
    }
    wc = wait_wc(scq, "reset: WRITE after bring-up");
    if (wc.wr_id != 520 || wc.status != IBV_WC_SUCCESS || strcmp(dst, "again") != 0) {
        fail("reset: WRITE after bring-up", "not the first completion, or failed");
    }
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_destroy_cq(scq);
    ibv_destroy_cq(rcq);
    ibv_destroy_cq(bcq);
}

/* rdma-core's shared-object API within one process: a dup of the context's cmd_fd imports the
 * context, and by their handles its PD, an MR of that PD and a DM; queues made on the imported
 * context with the imported PD carry a WRITE into the imported MR; closing and unimporting leave
 * the originals working. An fd that is no context's is refused with EOPNOTSUPP, an unknown handle
 * with NULL. */
static void imports(struct ibv_context *ctx, uint16_t lid) {
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    static char buf[2][64];
    struct ibv_mr *mr = pd != NULL ? ibv_reg_mr(pd, buf, sizeof(buf), kAccess) : NULL;
    struct ibv_alloc_dm_attr dm_attr = {.length = 64};
    struct ibv_dm *dm = ibv_alloc_dm(ctx, &dm_attr);
    if (mr == NULL || dm == NULL) {
        fail("imports: PD, MR, DM", strerror(errno));
    }
    int not_a_context = eventfd(0, EFD_CLOEXEC);
    errno = 0;
    if (ctx->cmd_fd < 0 || ibv_import_device(not_a_context) != NULL || errno != EOPNOTSUPP) {
        fail("ibv_import_device of an eventfd", "not refused with EOPNOTSUPP");
    }
    close(not_a_context);
    struct ibv_context *imp = ibv_import_device(dup(ctx->cmd_fd));
    if (imp == NULL) {
        fail("ibv_import_device", strerror(errno));
    }
    struct ibv_pd *ipd = ibv_import_pd(imp, pd->handle);
    struct ibv_mr *imr = ipd != NULL ? ibv_import_mr(ipd, mr->handle) : NULL;
    struct ibv_dm *idm = ibv_import_dm(imp, dm->handle);
    if (ipd == NULL || imr == NULL || idm == NULL || imr->lkey != mr->lkey || imr->rkey != mr->rkey) {
        fail("ibv_import_pd/_mr/_dm", "not imported, or with other keys");
    }
    if (ibv_import_pd(imp, pd->handle + 1) != NULL || ibv_import_mr(ipd, mr->handle + 1) != NULL) {
        fail("ibv_import_pd/_mr of an unknown handle", "imported");
    }
    const uint32_t word = 0x5a5a1234;
    uint32_t back = 0;
    if (ibv_memcpy_to_dm(dm, 0, &word, 4) != 0 || ibv_memcpy_from_dm(&back, idm, 0, 4) != 0 || back != word) {
        fail("ibv_import_dm", "the import does not see the DM's bytes");
    }
    struct ibv_cq *cq = ibv_create_cq(imp, 8, NULL, NULL, 0);
    struct ibv_qp *a = cq != NULL ? rc_qp(ipd, cq) : NULL, *b = a != NULL ? rc_qp(ipd, cq) : NULL;
    if (b == NULL) {
        fail("imports: queues on the imported context", strerror(errno));
    }
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, lid);
    to_rts(b, a->qp_num, lid);
    strcpy(buf[0], "imported");
    rdma(a, cq, IBV_WR_RDMA_WRITE, imr, buf[0], 9, buf[1], imr->rkey, "WRITE through the imports");
    if (strcmp(buf[1], "imported") != 0) {
        fail("WRITE through the imports", "the data did not land");
    }
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_destroy_cq(cq);
    ibv_unimport_dm(idm);
    ibv_unimport_mr(imr);
    ibv_unimport_pd(ipd);
    if (ibv_close_device(imp) != 0) {
        fail("ibv_close_device of the import", strerror(errno));
    }
    /* The originals are their creator's still. */
    if (ibv_dereg_mr(mr) != 0 || ibv_free_dm(dm) != 0 || ibv_dealloc_pd(pd) != 0) {
        fail("imports", "the originals did not outlive the import");
    }
}

/* md registers dst (4 KiB, kAccess); a pair of QPs of its own on pd carries the WRITEs. */
static void rereg(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq, uint16_t lid,
                  struct ibv_mr *ms, char *src, struct ibv_mr *md, char *dst) {
    struct ibv_qp *qp = rc_qp(pd, cq), *peer = rc_qp(pd, cq);
    to_init(qp);
    to_init(peer);
    to_rts(qp, peer->qp_num, lid);
    to_rts(peer, qp->qp_num, lid);
    const uint32_t lkey = md->lkey, rkey = md->rkey;
    struct {
        int flags;
        void *addr;
        size_t length;
        int want;
    } bad[] = {
        {8, NULL, 0, IBV_REREG_MR_ERR_INPUT},
        {IBV_REREG_MR_CHANGE_TRANSLATION, NULL, 4096, IBV_REREG_MR_ERR_INPUT},
        {IBV_REREG_MR_CHANGE_ACCESS, dst, 4096, IBV_REREG_MR_ERR_INPUT},
        {0, NULL, 0, IBV_REREG_MR_ERR_CMD},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); ++i) {
        errno = 0;
        int rc = ibv_rereg_mr(md, bad[i].flags, NULL, bad[i].addr, bad[i].length, kAccess);
        if (rc != bad[i].want || errno != EINVAL) {
            fprintf(stderr, "verbs-behaviour: ibv_rereg_mr case %zu: %d errno %d, want %d errno EINVAL\n", i,
                    rc, errno, bad[i].want);
            exit(1);
        }
    }
    struct ibv_context *other = ibv_open_device(ctx->device);
    struct ibv_pd *foreign = other != NULL ? ibv_alloc_pd(other) : NULL;
    errno = 0;
    if (foreign == NULL ||
        ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_PD, foreign, NULL, 0, 0) != IBV_REREG_MR_ERR_CMD ||
        errno != EINVAL) {
        fail("ibv_rereg_mr to a PD of another context", "not refused with ERR_CMD and EINVAL");
    }
    if (md->lkey != lkey || md->rkey != rkey || md->pd == foreign || md->addr != dst) {
        fail("ibv_rereg_mr", "a refused call changed the MR");
    }
    strcpy(src, "still usable");
    rdma(qp, cq, IBV_WR_RDMA_WRITE, ms, src, 13, dst, md->rkey, "WRITE after a refused rereg");
    if (strcmp(dst, "still usable") != 0) {
        fail("WRITE after a refused rereg", "the data did not land");
    }

    /* Onto shared anonymous memory (registered in place), then back onto dst. */
    char *anon = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    char *anon2 = anon != MAP_FAILED ? mremap(anon, 0, 8192, MREMAP_MAYMOVE) : MAP_FAILED;
    if (anon == MAP_FAILED || anon2 == MAP_FAILED) {
        fail("shared anonymous mmap", strerror(errno));
    }
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, anon + 100, 5000, 0) != 0) {
        fail("ibv_rereg_mr onto shared memory", strerror(errno));
    }
    if (md->rkey != rkey || md->lkey != lkey || md->addr != anon + 100 || md->length != 5000) {
        fail("ibv_rereg_mr onto shared memory",
             "range not changed, or keys changed (a kernel provider keeps them)");
    }
    strcpy(src, "in place");
    rdma(qp, cq, IBV_WR_RDMA_WRITE, ms, src, 9, anon + 4090, md->rkey, "WRITE after a translation");
    if (strcmp(anon2 + 4090, "in place") != 0) {
        fail("WRITE after a translation", "not in the shared memory");
    }
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, dst, 4096, 0) != 0 || md->rkey != rkey ||
        md->addr != dst) {
        fail("ibv_rereg_mr back onto ordinary memory", strerror(errno));
    }
    strcpy(src, "back");
    rdma(qp, cq, IBV_WR_RDMA_WRITE, ms, src, 5, dst, md->rkey, "WRITE after a translation back");
    if (strcmp(dst, "back") != 0) {
        fail("WRITE after a translation back", "the data did not land");
    }
    munmap(anon, 8192);
    munmap(anon2, 8192);

    /* Between private pages: the new range's pages move onto shared pages as at registration,
     * the old range's move back as at deregistration. */
    char *one = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *two = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (one == MAP_FAILED || two == MAP_FAILED) {
        fail("private anonymous mmap", strerror(errno));
    }
    strcpy(two, "kept");
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, one, 4096, 0) != 0 || !on_shared_pages(one)) {
        fail("ibv_rereg_mr onto private memory", "the page did not move onto shared pages");
    }
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, two, 4096, 0) != 0 || !on_shared_pages(two) ||
        on_shared_pages(one) || strcmp(two, "kept") != 0) {
        fail("ibv_rereg_mr between private pages", "the pages did not move as at reg and dereg");
    }
    strcpy(src, "moved");
    rdma(qp, cq, IBV_WR_RDMA_WRITE, ms, src, 6, two, md->rkey, "WRITE after a translation between pages");
    if (strcmp(two, "moved") != 0) {
        fail("WRITE after a translation between pages", "the data did not land");
    }
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, dst, 4096, 0) != 0 || on_shared_pages(two)) {
        fail("ibv_rereg_mr back onto dst", "the private page stayed on shared pages");
    }
    munmap(one, 4096);
    munmap(two, 4096);
    ibv_destroy_qp(qp);
    ibv_destroy_qp(peer);
    ibv_dealloc_pd(foreign);
    ibv_close_device(other);
}

static void *no_alloc(struct ibv_pd *pd, void *pd_context, size_t size, size_t alignment, uint64_t type) {
    (void)pd, (void)pd_context, (void)size, (void)alignment, (void)type;
    return IBV_ALLOCATOR_USE_DEFAULT;
}
static void no_free(struct ibv_pd *pd, void *pd_context, void *ptr, uint64_t type) {
    (void)pd, (void)pd_context, (void)ptr, (void)type;
}

static void domains(struct ibv_context *ctx, uint16_t lid) {
    struct ibv_td_init_attr tda = {.comp_mask = 1};
    errno = 0;
    if (ibv_alloc_td(ctx, &tda) != NULL || errno != EINVAL) {
        fail("ibv_alloc_td with a comp_mask", "not refused with EINVAL");
    }
    tda.comp_mask = 0;
    struct ibv_td *td = ibv_alloc_td(ctx, &tda);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    if (td == NULL || td->context != ctx || pd == NULL) {
        fail("ibv_alloc_td", strerror(errno));
    }
    struct ibv_parent_domain_init_attr pa = {.pd = NULL, .td = td};
    errno = 0;
    if (ibv_alloc_parent_domain(ctx, &pa) != NULL || errno != EINVAL) {
        fail("ibv_alloc_parent_domain without a PD", "not refused with EINVAL");
    }
    pa.pd = pd;
    pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
    pa.alloc = no_alloc;
    pa.free = no_free;
    errno = 0;
    if (ibv_alloc_parent_domain(ctx, &pa) != NULL || errno != EOPNOTSUPP) {
        fail("ibv_alloc_parent_domain with allocators", "not refused with EOPNOTSUPP");
    }
    struct ibv_context *other = ibv_open_device(ctx->device);
    struct ibv_td *foreign = other != NULL ? ibv_alloc_td(other, &tda) : NULL;
    pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    pa.pd_context = &pa;
    pa.td = foreign;
    errno = 0;
    if (foreign == NULL || ibv_alloc_parent_domain(ctx, &pa) != NULL || errno != EINVAL) {
        fail("ibv_alloc_parent_domain with another context's TD", "not refused with EINVAL");
    }
    pa.td = td;
    struct ibv_pd *with_td = ibv_alloc_parent_domain(ctx, &pa);
    pa.td = NULL;
    pa.comp_mask = 0;
    struct ibv_pd *plain = ibv_alloc_parent_domain(ctx, &pa);
    if (with_td == NULL || plain == NULL || with_td->context != ctx || with_td == pd) {
        fail("ibv_alloc_parent_domain", strerror(errno));
    }
    if (ibv_dealloc_td(td) != EBUSY || ibv_dealloc_pd(pd) != EBUSY) {
        fail("ibv_dealloc_td/pd under a parent domain", "not refused with EBUSY");
    }

    /* Objects under the parent domains: a CQ (cq_ex naming one), QPs, an SRQ, MRs and an AH. */
    struct ibv_cq_init_attr_ex cx = {.cqe = 16, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD, .parent_domain = pd};
    errno = 0;
    if (ibv_create_cq_ex(ctx, &cx) != NULL || errno != EINVAL) {
        fail("ibv_create_cq_ex naming a PD as parent domain", "not refused with EINVAL");
    }
    cx.parent_domain = with_td;
    struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cx);
    if (cqx == NULL) {
        fail("ibv_create_cq_ex with a parent domain", strerror(errno));
    }
    struct ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
    struct ibv_qp *a = rc_qp(with_td, cq), *b = rc_qp(pd, cq);
    struct ibv_srq_init_attr sa = {.attr = {.max_wr = 4, .max_sge = 1}};
    struct ibv_srq *srq = ibv_create_srq(plain, &sa);
    char *src = calloc(1, 4096), *dst = calloc(1, 4096);
    struct ibv_mr *ms = ibv_reg_mr(with_td, src, 4096, kAccess), *md = ibv_reg_mr(plain, dst, 4096, kAccess);
    struct ibv_ah_attr aa = {.dlid = lid, .port_num = 1};
    struct ibv_ah *ah = ibv_create_ah(plain, &aa);
    if (a->pd != with_td || b->pd != pd || srq == NULL || srq->pd != plain || ms == NULL ||
        ms->pd != with_td || md == NULL || md->pd != plain || ah == NULL || ah->pd != plain) {
        fail("objects under a parent domain", "not made, or not naming it as their pd");
    }
    to_init(a);
    to_init(b);
    to_rts(a, b->qp_num, lid);
    to_rts(b, a->qp_num, lid);
    strcpy(src, "parent domain");
    rdma(a, cq, IBV_WR_RDMA_WRITE, ms, src, 14, dst, md->rkey, "WRITE under parent domains");
    if (strcmp(dst, "parent domain") != 0) {
        fail("WRITE under parent domains", "the data did not land");
    }
    if (ibv_rereg_mr(md, IBV_REREG_MR_CHANGE_PD, with_td, NULL, 0, 0) != 0 || md->pd != with_td) {
        fail("ibv_rereg_mr to a parent domain", strerror(errno));
    }

    ibv_destroy_ah(ah);
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
    ibv_destroy_srq(srq);
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_destroy_cq(cq);
    if (ibv_dealloc_pd(with_td) != 0 || ibv_dealloc_pd(plain) != 0 || ibv_dealloc_td(td) != 0 ||
        ibv_dealloc_pd(pd) != 0) {
        fail("ibv_dealloc_pd of the parent domains, then the TD and the PD", "refused");
    }
    errno = 0;
    if (ibv_dealloc_td(foreign) != 0 || ibv_close_device(other) != 0) {
        fail("ibv_dealloc_td/ibv_close_device", strerror(errno));
    }
    free(src);
    free(dst);
}

int main(int argc, char **argv) {
    struct ibv_context *ctx = open_named(argc > 1 ? argv[1] : "softnda0");
    struct ibv_port_attr port;
    if (ibv_query_port(ctx, 1, &port) != 0) {
        fail("ibv_query_port", "refused");
    }
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    struct ibv_cq *cq = pd != NULL && ch != NULL ? ibv_create_cq(ctx, 64, (void *)0x1234, ch, 0) : NULL;
    if (cq == NULL) {
        fail("PD, channel, CQ", strerror(errno));
    }
    struct ibv_qp *a = rc_qp(pd, cq), *b = rc_qp(pd, cq);

    /* Address handles: the broker checks the attributes and holds the AH under its PD. */
    struct ibv_pd *ah_pd = ibv_alloc_pd(ctx);
    struct ibv_ah_attr aa;
    memset(&aa, 0, sizeof(aa));
    aa.dlid = port.lid;
    aa.port_num = 0; /* no port has number 0 */
    errno = 0;
    if (ah_pd == NULL || ibv_create_ah(ah_pd, &aa) != NULL || errno != EINVAL) {
        fail("ibv_create_ah on port 0", "not refused with EINVAL");
    }
    aa.port_num = 1;
    aa.is_global = 1;
    aa.grh.dgid.global.interface_id = 1;
    aa.grh.sgid_index = 200;
    errno = 0;
    if (ibv_create_ah(ah_pd, &aa) != NULL || errno != EINVAL) {
        fail("ibv_create_ah with sgid_index 200", "not refused with EINVAL");
    }
    aa.is_global = 0;
    struct ibv_ah *ah = ibv_create_ah(ah_pd, &aa);
    if (ah == NULL) {
        fail("ibv_create_ah", strerror(errno));
    }
    if (ibv_dealloc_pd(ah_pd) != EBUSY) {
        fail("ibv_dealloc_pd under an AH", "not EBUSY");
    }
    if (ibv_destroy_ah(ah) != 0 || ibv_dealloc_pd(ah_pd) != 0) {
        fail("ibv_destroy_ah, then its PD", strerror(errno));
    }

    /* A mask the transition does not allow: RESET -> INIT with a path MTU. */
    struct ibv_qp_attr bad;
    memset(&bad, 0, sizeof(bad));
    bad.qp_state = IBV_QPS_INIT;
    bad.port_num = 1;
    bad.path_mtu = IBV_MTU_1024;
    if (ibv_modify_qp(a, &bad,
                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS |
                          IBV_QP_PATH_MTU) != EINVAL) {
        fail("invalid mask", "ibv_modify_qp did not answer EINVAL");
    }
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    if (ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) != 0 || qa.qp_state != IBV_QPS_RESET) {
        fail("invalid mask", "the QP left RESET");
    }
    struct ibv_recv_wr early_recv, *bad_recv = NULL;
    memset(&early_recv, 0, sizeof(early_recv));
    if (ibv_post_recv(a, &early_recv, &bad_recv) != EINVAL || bad_recv != &early_recv) {
        fail("receive in RESET", "ibv_post_recv did not answer EINVAL");
    }
    to_init(a);
    to_init(b);
    /* The face answers RESET -> INIT itself and sends it with the next modify (docs/verbs.md,
     * "Bring-up"): an RTR refused after it leaves the QP in INIT, as the INIT left it, and the
     * INIT is not sent twice (the RTS below would then fail). */
    struct ibv_qp_attr no_dest;
    memset(&no_dest, 0, sizeof(no_dest));
    no_dest.qp_state = IBV_QPS_RTR;
    no_dest.path_mtu = IBV_MTU_1024;
    if (ibv_modify_qp(a, &no_dest, IBV_QP_STATE | IBV_QP_PATH_MTU) != EINVAL) {
        fail("RTR without its required attributes", "ibv_modify_qp did not answer EINVAL");
    }
    if (ibv_query_qp(a, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &qi) != 0 ||
        qa.qp_state != IBV_QPS_INIT || qa.port_num != 1 || qa.qp_access_flags != (unsigned)kAccess) {
        fail("a refused RTR", "the QP is not in INIT as ibv_modify_qp set it");
    }
    struct ibv_send_wr early_send, *bad_send = NULL;
    memset(&early_send, 0, sizeof(early_send));
    early_send.opcode = IBV_WR_SEND;
    if (ibv_post_send(a, &early_send, &bad_send) != EINVAL || bad_send != &early_send) {
        fail("send in INIT", "ibv_post_send did not answer EINVAL");
    }
    to_rts(a, b->qp_num, port.lid);
    to_rts(b, a->qp_num, port.lid);
    if (ibv_query_qp(a, &qa,
                     IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN,
                     &qi) != 0 ||
        qa.qp_state != IBV_QPS_RTS || qa.path_mtu != IBV_MTU_2048 || qa.dest_qp_num != b->qp_num ||
        qa.timeout != 14 || qa.sq_psn != 77 || qi.cap.max_send_wr < 8) {
        fail("ibv_query_qp", "does not report what ibv_modify_qp set");
    }

    char *src = calloc(1, 4096), *dst = calloc(1, 4096);
    struct ibv_mr *ms = ibv_reg_mr(pd, src, 4096, kAccess), *md = ibv_reg_mr(pd, dst, 4096, kAccess);
    if (ms == NULL || md == NULL) {
        fail("ibv_reg_mr", strerror(errno));
    }

    /* A completion event: arm, complete, poll() the channel, ibv_get_cq_event. */
    if (ibv_req_notify_cq(cq, 0) != 0) {
        fail("ibv_req_notify_cq", "refused");
    }
    strcpy(src, "event");
    struct ibv_sge sge = {(uintptr_t)src, 6, ms->lkey};
    struct ibv_send_wr wr, *badwr = NULL;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = 1;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)dst;
    wr.wr.rdma.rkey = md->rkey;
    if (ibv_post_send(a, &wr, &badwr) != 0) {
        fail("ibv_post_send", "refused");
    }
    struct pollfd pfd = {ch->fd, POLLIN, 0};
    if (poll(&pfd, 1, 10000) != 1) {
        fail("completion channel", "not readable after a completion on an armed CQ");
    }
    struct ibv_cq *ev_cq = NULL;
    void *ev_ctx = NULL;
    if (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) != 0 || ev_cq != cq || ev_ctx != (void *)0x1234) {
        fail("ibv_get_cq_event", "did not name the CQ");
    }
    ibv_ack_cq_events(cq, 1);
    struct ibv_wc wc = wait_wc(cq, "event completion");
    if (wc.status != IBV_WC_SUCCESS || strcmp(dst, "event") != 0) {
        fail("event completion", "wrong status or data");
    }

    shared_memory(pd, a, cq, ms, src, md, dst);

    /* ibv_qp_ex: the ibv_wr_* API on a QP made by ibv_create_qp_ex. */
    struct ibv_qp_init_attr_ex ix;
    memset(&ix, 0, sizeof(ix));
    ix.send_cq = cq;
    ix.recv_cq = cq;
    ix.qp_type = IBV_QPT_RC;
    ix.cap.max_send_wr = 8;
    ix.cap.max_recv_wr = 8;
    ix.cap.max_send_sge = 1;
    ix.cap.max_recv_sge = 1;
    ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ix.pd = pd;
    ix.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
    struct ibv_qp *x = ibv_create_qp_ex(ctx, &ix);
    struct ibv_qp_ex *qpx = x != NULL ? ibv_qp_to_qp_ex(x) : NULL;
    if (qpx == NULL) {
        fail("ibv_create_qp_ex", strerror(errno));
    }
    struct ibv_qp *peer = rc_qp(pd, cq);
    to_init(x);
    to_init(peer);
    to_rts(x, peer->qp_num, port.lid);
    to_rts(peer, x->qp_num, port.lid);
    strcpy(src, "wr-api");
    ibv_wr_start(qpx);
    qpx->wr_id = 9;
    qpx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(qpx, md->rkey, (uintptr_t)dst + 100);
    ibv_wr_set_sge(qpx, ms->lkey, (uintptr_t)src, 7);
    if (ibv_wr_complete(qpx) != 0) {
        fail("ibv_wr_complete", "refused");
    }
    wc = wait_wc(cq, "ibv_wr_rdma_write");
    if (wc.status != IBV_WC_SUCCESS || wc.wr_id != 9 || strcmp(dst + 100, "wr-api") != 0) {
        fail("ibv_wr_rdma_write", "wrong completion or data");
    }

    /* ibv_cq_ex: the poll API. */
    struct ibv_cq_init_attr_ex cx;
    memset(&cx, 0, sizeof(cx));
    cx.cqe = 16;
    cx.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
    struct ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &cx);
    if (cqx == NULL) {
        fail("ibv_create_cq_ex", strerror(errno));
    }
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof(ia));
    ia.send_cq = ibv_cq_ex_to_cq(cqx);
    ia.recv_cq = ibv_cq_ex_to_cq(cqx);
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    struct ibv_qp *c1 = ibv_create_qp(pd, &ia), *c2 = ibv_create_qp(pd, &ia);
    if (c1 == NULL || c2 == NULL) {
        fail("QPs on a cq_ex", strerror(errno));
    }
    to_init(c1);
    to_init(c2);
    to_rts(c1, c2->qp_num, port.lid);
    to_rts(c2, c1->qp_num, port.lid);
    wr.wr_id = 11;
    wr.wr.rdma.remote_addr = (uintptr_t)dst + 200;
    if (ibv_post_send(c1, &wr, &badwr) != 0) {
        fail("ibv_post_send (cq_ex)", "refused");
    }
    struct ibv_poll_cq_attr pattr = {0};
    int rc;
    while ((rc = ibv_start_poll(cqx, &pattr)) == ENOENT) {
    }
    if (rc != 0 || cqx->wr_id != 11 || cqx->status != IBV_WC_SUCCESS ||
        ibv_wc_read_qp_num(cqx) != c1->qp_num || ibv_wc_read_opcode(cqx) != IBV_WC_RDMA_WRITE) {
        fprintf(stderr, "rc %d wr_id %llu status %d qp_num %u (want %u) opcode %d\n", rc,
                (unsigned long long)cqx->wr_id, cqx->status, ibv_wc_read_qp_num(cqx), c1->qp_num,
                ibv_wc_read_opcode(cqx));
        fail("ibv_start_poll", "wrong completion");
    }
    if (memcmp(dst + 200, "wr-api", 6) != 0) { /* src holds "wr-api" now; the SGE carries 6 bytes */
        fail("ibv_start_poll", "the WRITE's bytes did not arrive");
    }
    if (ibv_next_poll(cqx) != ENOENT) {
        fail("ibv_next_poll", "a second completion");
    }
    ibv_end_poll(cqx);

    /* Zero-depth queues, as IB allows them: the passive side of a bandwidth or READ test. */
    struct ibv_qp_init_attr za;
    memset(&za, 0, sizeof(za));
    za.send_cq = cq;
    za.recv_cq = cq;
    za.qp_type = IBV_QPT_RC;
    za.cap.max_recv_wr = 4;
    za.cap.max_recv_sge = 1;
    struct ibv_qp *recv_only = ibv_create_qp(pd, &za);
    if (recv_only == NULL || za.cap.max_send_wr != 0) {
        fail("receive-only QP", recv_only == NULL ? strerror(errno) : "granted a send queue");
    }
    za.cap.max_send_wr = 4;
    za.cap.max_send_sge = 1;
    za.cap.max_recv_wr = 0;
    za.cap.max_recv_sge = 0;
    struct ibv_qp *send_only = ibv_create_qp(pd, &za);
    if (send_only == NULL || za.cap.max_recv_wr != 0) {
        fail("send-only QP", send_only == NULL ? strerror(errno) : "granted a receive queue");
    }
    to_init(recv_only);
    to_init(send_only);
    to_rts(recv_only, send_only->qp_num, port.lid);
    to_rts(send_only, recv_only->qp_num, port.lid);
    strcpy(src, "zero-depth");
    struct ibv_sge zs = {(uintptr_t)src, 11, ms->lkey};
    struct ibv_send_wr zw, *zbad = NULL;
    memset(&zw, 0, sizeof(zw));
    zw.wr_id = 21;
    zw.sg_list = &zs;
    zw.num_sge = 1;
    zw.opcode = IBV_WR_SEND;
    zw.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(recv_only, &zw, &zbad) != ENOMEM || zbad != &zw) {
        fail("post to a send queue of depth 0", "not ENOMEM with *bad_wr");
    }
    struct ibv_sge zr = {(uintptr_t)dst + 300, 64, md->lkey};
    struct ibv_recv_wr rw, *rbad = NULL;
    memset(&rw, 0, sizeof(rw));
    rw.wr_id = 22;
    rw.sg_list = &zr;
    rw.num_sge = 1;
    if (ibv_post_recv(send_only, &rw, &rbad) != ENOMEM || rbad != &rw) {
        fail("post to a receive queue of depth 0", "not ENOMEM with *bad_wr");
    }
    if (ibv_post_recv(recv_only, &rw, &rbad) != 0 || ibv_post_send(send_only, &zw, &zbad) != 0) {
        fail("zero-depth pair", "a post to the other queue was refused");
    }
    int got_send = 0, got_recv = 0;
    while (!got_send || !got_recv) {
        wc = wait_wc(cq, "zero-depth pair");
        if (wc.status != IBV_WC_SUCCESS) {
            fail("zero-depth pair", "a completion failed");
        }
        got_send |= wc.wr_id == 21;
        got_recv |= wc.wr_id == 22 && wc.byte_len == 11;
    }
    if (strcmp(dst + 300, "zero-depth") != 0) {
        fail("zero-depth pair", "the SEND's bytes did not arrive");
    }

    /* A remote access error: the QP goes to ERR, flushes, and raises IBV_EVENT_QP_FATAL. */
    wr.wr_id = 2;
    wr.wr.rdma.rkey = md->rkey + 1;
    if (ibv_post_send(a, &wr, &badwr) != 0) {
        fail("ibv_post_send (bad rkey)", "refused");
    }
    wc = wait_wc(cq, "bad rkey");
    if (wc.status != IBV_WC_REM_ACCESS_ERR || wc.wr_id != 2) {
        fail("bad rkey", "the completion does not carry IBV_WC_REM_ACCESS_ERR");
    }
    if (ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) != 0 || qa.qp_state != IBV_QPS_ERR) {
        fail("bad rkey", "the QP is not in ERR");
    }
    wr.wr_id = 3;
    wr.wr.rdma.rkey = md->rkey;
    if (ibv_post_send(a, &wr, &badwr) != 0) {
        fail("post after ERR", "refused");
    }
    wc = wait_wc(cq, "flush");
    while (wc.qp_num != a->qp_num) { /* the responder's own error may come first */
        wc = wait_wc(cq, "flush");
    }
    if (wc.status != IBV_WC_WR_FLUSH_ERR || wc.wr_id != 3) {
        fail("flush", "the next work request was not flushed with IBV_WC_WR_FLUSH_ERR");
    }
    struct ibv_async_event ev;
    int found = 0;
    for (int i = 0; i < 4 && !found; ++i) { /* b, the responder, may report first */
        if (ibv_get_async_event(ctx, &ev) != 0) {
            fail("ibv_get_async_event", strerror(errno));
        }
        found = ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == a;
        ibv_ack_async_event(&ev);
    }
    if (!found) {
        fail("ibv_get_async_event", "no IBV_EVENT_QP_FATAL for the QP");
    }

    /* A responder CQ overflow: the receive completion that does not fit raises IBV_EVENT_CQ_ERR. */
    struct ibv_cq *tiny = ibv_create_cq(ctx, 2, NULL, NULL, 0);
    if (tiny == NULL || tiny->cqe > 6) {
        fail("small CQ", tiny == NULL ? strerror(errno) : "more entries than asked for");
    }
    struct ibv_qp *sender = rc_qp(pd, cq), *receiver = rc_qp_cqs_or_null(pd, cq, tiny);
    if (receiver == NULL) {
        fail("ibv_create_qp (small CQ)", strerror(errno));
    }
    to_init(sender);
    to_init(receiver);
    to_rts(sender, receiver->qp_num, port.lid);
    to_rts(receiver, sender->qp_num, port.lid);
    int overflow_at = tiny->cqe + 1;
    struct ibv_sge rsge = {(uintptr_t)dst, 8, md->lkey}, ssge = {(uintptr_t)src, 8, ms->lkey};
    for (int i = 0; i < overflow_at; ++i) {
        struct ibv_recv_wr rw, *rbad = NULL;
        memset(&rw, 0, sizeof(rw));
        rw.wr_id = 100 + i;
        rw.sg_list = &rsge;
        rw.num_sge = 1;
        struct ibv_send_wr sw, *sbad = NULL;
        memset(&sw, 0, sizeof(sw));
        sw.sg_list = &ssge;
        sw.num_sge = 1;
        sw.opcode = IBV_WR_SEND; /* unsignalled: only the receiver's CQ fills */
        if (ibv_post_recv(receiver, &rw, &rbad) != 0 || ibv_post_send(sender, &sw, &sbad) != 0) {
            fail("CQ overflow", "a post was refused");
        }
    }
    found = 0;
    for (int i = 0; i < 4 && !found; ++i) { /* the receiver's QP_FATAL may come first */
        if (ibv_get_async_event(ctx, &ev) != 0) {
            fail("ibv_get_async_event (CQ overflow)", strerror(errno));
        }
        found = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == tiny;
        ibv_ack_async_event(&ev);
    }
    if (!found) {
        fail("CQ overflow", "no IBV_EVENT_CQ_ERR for the CQ");
    }
    reset_cleans_cqs(ctx, pd, port.lid, ms, src, md, dst);
    imports(ctx, port.lid);
    rereg(ctx, pd, cq, port.lid, ms, src, md, dst); /* last: it changes md's range */
    domains(ctx, port.lid);
    ibv_destroy_qp(sender);
    ibv_destroy_qp(receiver);
    ibv_destroy_cq(tiny);

    ibv_destroy_qp(c1);
    ibv_destroy_qp(c2);
    ibv_destroy_cq(ibv_cq_ex_to_cq(cqx));
    ibv_destroy_qp(x);
    ibv_destroy_qp(peer);
    ibv_destroy_qp(a);
    ibv_destroy_qp(b);
    ibv_dereg_mr(ms);
    ibv_dereg_mr(md);
    ibv_destroy_cq(cq);
    ibv_destroy_comp_channel(ch);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(src);
    free(dst);
    printf("OK\n");
    return 0;
}
