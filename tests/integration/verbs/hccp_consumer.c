/*
 * A consumer written from shared/REFERENCE.md's account of HCCP: it reaches libibverbs and
 * libibv_extend.so only through dlopen + dlsym, exactly as HCCP does, so the libibverbs face
 * must win the name lookup (LD_LIBRARY_PATH, ibv-extend-run) for it to work in broker mode.
 *
 *   hccp-consumer DEVICE
 *
 * Flow: device list, open, port and GID queries, PD, ibv_open_extend, the NDA bit, a CQ then a QP
 * through the extend API (caller's ibv_extend_ops with a db_mmap that maps each doorbell page at
 * a second address, as a device's address space would), standard ibv_query_qp(IBV_QP_CAP),
 * hyroce negotiation, standard ibv_modify_qp to INIT/RTR/RTS of two QPs connected to each other,
 * standard ibv_reg_mr on heap memory; then data through queue_info (SPEC.md, softnda_device.h):
 * RDMA WRITE, SEND/RECV, RDMA READ, each verified; then a standard-verbs QP bring-up (CQ, QP,
 * INIT, RTR, RTS); teardown.
 *
 * The test drives it through stdin/stdout: at each "SYNC <phase>" line it waits for one line on
 * stdin, so the test can read the broker's RPC counters between phases. Exit status 0, or 1 with
 * "hccp-consumer: <step>: <reason>" on stderr.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ibv_extend.h>
#include <softnda_device.h>

#undef ibv_query_port
#undef ibv_reg_mr

static int fail(const char *step, const char *why) {
    fprintf(stderr, "hccp-consumer: %s: %s\n", step, why);
    exit(1);
}
static int failErrno(const char *step, int err) {
    return fail(step, strerror(err));
}

static void sync_point(const char *phase) {
    char line[64];
    printf("SYNC %s\n", phase);
    fflush(stdout);
    if (fgets(line, sizeof(line), stdin) == NULL) {
        fail(phase, "the test went away");
    }
}

/* ---- libibverbs, as HCCP resolves it ---- */

static struct {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
    int (*query_gid_type)(struct ibv_context *, uint8_t, unsigned int, int *);
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
    int (*destroy_comp_channel)(struct ibv_comp_channel *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    struct ibv_srq *(*create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
    int (*destroy_srq)(struct ibv_srq *);
    struct ibv_ah *(*create_ah)(struct ibv_pd *, struct ibv_ah_attr *);
    int (*destroy_ah)(struct ibv_ah *);
    const char *(*wc_status_str)(enum ibv_wc_status);
} v;

/* ---- libibv_extend.so ---- */

static struct {
    struct ibv_context_extend *(*open)(struct ibv_context *);
    int (*close)(struct ibv_context_extend *);
    int (*query_device)(struct ibv_context_extend *, struct ibv_device_attr_extend *);
    struct ibv_qp_extend *(*create_qp)(struct ibv_context_extend *, struct ibv_qp_init_attr_extend *);
    struct ibv_cq_extend *(*create_cq)(struct ibv_context_extend *, struct ibv_cq_init_attr_extend *);
    int (*destroy_qp)(struct ibv_context_extend *, struct ibv_qp_extend *);
    int (*destroy_cq)(struct ibv_context_extend *, struct ibv_cq_extend *);
    int (*modify_qp)(struct ibv_context_extend *, struct ibv_qp_attr_extend *, int);
    int (*query_hyroce)(struct ibv_context_extend *, struct ibv_qp *, uint32_t, uint32_t,
                        struct ibv_hyroce_feature *);
    int (*nego_hyroce)(struct ibv_context_extend *, struct ibv_qp *, const struct ibv_hyroce_feature *,
                       struct ibv_hyroce_feature *, uint32_t *);
} x;

static void *must(void *handle, const char *name) {
    void *p = dlsym(handle, name);
    if (p == NULL) {
        fail("dlsym", name);
    }
    return p;
}

#define RESOLVE(handle, table, field, name) *(void **)(&(table).field) = must(handle, name)

static void resolve(void) {
    void *h = dlopen("libibverbs.so", RTLD_NOW);
    if (h == NULL) {
        h = dlopen("libibverbs.so.1", RTLD_NOW);
    }
    if (h == NULL) {
        fail("dlopen libibverbs", dlerror());
    }
    RESOLVE(h, v, get_device_list, "ibv_get_device_list");
    RESOLVE(h, v, free_device_list, "ibv_free_device_list");
    RESOLVE(h, v, get_device_name, "ibv_get_device_name");
    RESOLVE(h, v, open_device, "ibv_open_device");
    RESOLVE(h, v, close_device, "ibv_close_device");
    RESOLVE(h, v, query_port, "ibv_query_port");
    RESOLVE(h, v, query_gid, "ibv_query_gid");
    RESOLVE(h, v, query_gid_type, "ibv_query_gid_type");
    RESOLVE(h, v, alloc_pd, "ibv_alloc_pd");
    RESOLVE(h, v, dealloc_pd, "ibv_dealloc_pd");
    RESOLVE(h, v, reg_mr, "ibv_reg_mr");
    RESOLVE(h, v, dereg_mr, "ibv_dereg_mr");
    RESOLVE(h, v, create_cq, "ibv_create_cq");
    RESOLVE(h, v, destroy_cq, "ibv_destroy_cq");
    RESOLVE(h, v, create_comp_channel, "ibv_create_comp_channel");
    RESOLVE(h, v, destroy_comp_channel, "ibv_destroy_comp_channel");
    RESOLVE(h, v, get_cq_event, "ibv_get_cq_event");
    RESOLVE(h, v, ack_cq_events, "ibv_ack_cq_events");
    RESOLVE(h, v, create_qp, "ibv_create_qp");
    RESOLVE(h, v, destroy_qp, "ibv_destroy_qp");
    RESOLVE(h, v, query_qp, "ibv_query_qp");
    RESOLVE(h, v, modify_qp, "ibv_modify_qp");
    RESOLVE(h, v, create_srq, "ibv_create_srq");
    RESOLVE(h, v, destroy_srq, "ibv_destroy_srq");
    RESOLVE(h, v, create_ah, "ibv_create_ah");
    RESOLVE(h, v, destroy_ah, "ibv_destroy_ah");
    RESOLVE(h, v, wc_status_str, "ibv_wc_status_str");

    void *e = dlopen("libibv_extend.so", RTLD_NOW | RTLD_GLOBAL);
    if (e == NULL) {
        e = dlopen("libibv_extend.so.4", RTLD_NOW | RTLD_GLOBAL);
    }
    if (e == NULL) {
        fail("dlopen libibv_extend", dlerror());
    }
    RESOLVE(e, x, open, "ibv_open_extend");
    RESOLVE(e, x, close, "ibv_close_extend");
    RESOLVE(e, x, query_device, "ibv_query_device_extend");
    RESOLVE(e, x, create_qp, "ibv_create_qp_extend");
    RESOLVE(e, x, create_cq, "ibv_create_cq_extend");
    RESOLVE(e, x, destroy_qp, "ibv_destroy_qp_extend");
    RESOLVE(e, x, destroy_cq, "ibv_destroy_cq_extend");
    RESOLVE(e, x, modify_qp, "ibv_modify_qp_extend");
    RESOLVE(e, x, query_hyroce, "ibv_query_qp_supported_hyroce_feature");
    RESOLVE(e, x, nego_hyroce, "ibv_nego_qp_hyroce_feature");
}

/* ---- the caller's ibv_extend_ops: a "device address space" that maps doorbell pages at a
 * second address (mremap of a shared page), refcounted per page as the reference consumer does */

#define MAX_DB_PAGES 16
static struct {
    uintptr_t host; /* 4 KiB-aligned host page */
    uint8_t *dev;   /* its alias */
    int refs;
} g_db[MAX_DB_PAGES];
static int g_alloc_calls;

static void *cb_alloc(size_t size) {
    g_alloc_calls++;
    return malloc(size);
}
static void cb_free(void *p) {
    g_alloc_calls++;
    free(p);
}
static void cb_memset_s(void *dst, int c, size_t n) {
    g_alloc_calls++;
    memset(dst, c, n);
}
static int cb_memcpy_s(void *dst, size_t max, void *src, size_t n, uint32_t dir) {
    if (n > max || dir > MEMCPY_DIR_DEVICE_TO_DEVICE) {
        return -1;
    }
    memcpy(dst, src, n);
    return 0;
}
static void *cb_db_mmap(struct doorbell_map_desc *desc) {
    if (desc == NULL || desc->type != DB_MAP_MODE_HOST_VA) {
        errno = EINVAL;
        return NULL;
    }
    uintptr_t page = desc->hva & ~(uintptr_t)4095;
    for (int i = 0; i < MAX_DB_PAGES; ++i) {
        if (g_db[i].refs > 0 && g_db[i].host == page) {
            g_db[i].refs++;
            return g_db[i].dev + (desc->hva - page);
        }
    }
    for (int i = 0; i < MAX_DB_PAGES; ++i) {
        if (g_db[i].refs == 0) {
            void *alias = mremap((void *)page, 0, 4096, MREMAP_MAYMOVE);
            if (alias == MAP_FAILED) {
                return NULL;
            }
            g_db[i].host = page;
            g_db[i].dev = alias;
            g_db[i].refs = 1;
            return g_db[i].dev + (desc->hva - page);
        }
    }
    errno = ENOMEM;
    return NULL;
}
static int cb_db_unmap(void *ptr, struct doorbell_map_desc *desc) {
    if (ptr == NULL || desc == NULL) {
        return -EINVAL;
    }
    uintptr_t page = desc->hva & ~(uintptr_t)4095;
    for (int i = 0; i < MAX_DB_PAGES; ++i) {
        if (g_db[i].refs > 0 && g_db[i].host == page && (uint8_t *)ptr - g_db[i].dev < 4096) {
            if (--g_db[i].refs == 0) {
                munmap(g_db[i].dev, 4096);
            }
            return 0;
        }
    }
    return -ENODEV;
}
static struct ibv_extend_ops g_ops = {cb_alloc, cb_free, cb_memset_s, cb_memcpy_s, cb_db_mmap, cb_db_unmap};

static int db_pages_mapped(void) {
    int n = 0;
    for (int i = 0; i < MAX_DB_PAGES; ++i) {
        n += g_db[i].refs > 0;
    }
    return n;
}

static int in_alias(const void *p) {
    for (int i = 0; i < MAX_DB_PAGES; ++i) {
        if (g_db[i].refs > 0 && (const uint8_t *)p >= g_db[i].dev &&
            (const uint8_t *)p < g_db[i].dev + 4096) {
            return 1;
        }
    }
    return 0;
}

/* ---- the data phase: the device side of SPEC.md, from queue_info alone ---- */

struct side {
    struct ibv_cq_extend *cq;
    struct ibv_qp_extend *qp;
    struct softnda_sq sq;
    struct softnda_rq rq;
    struct softnda_cq dcq;
};

static struct softnda_cqe wait_cqe(struct softnda_cq *cq, const char *step) {
    struct softnda_cqe c;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        if (softnda_cq_poll(cq, &c, 1) == 1) {
            return c;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 10) {
            fail(step, "no completion within 10 s");
        }
    }
}

static void expect_ok(struct softnda_cqe c, uint64_t wr_id, const char *step) {
    if (c.status != IBV_WC_SUCCESS) {
        fail(step, v.wc_status_str((enum ibv_wc_status)c.status));
    }
    if (c.wr_id != wr_id) {
        fail(step, "completion for another work request");
    }
}

/* One signaled work request of opcode from sge to [remote, rkey]. */
static struct softnda_send_wr rdma_wr(uint8_t opcode, uint64_t wr_id, const struct softnda_sge *sge,
                                      void *remote, uint32_t rkey) {
    struct softnda_send_wr wr;
    memset(&wr, 0, sizeof(wr));
    wr.wr_id = wr_id;
    wr.opcode = opcode;
    wr.flags = SOFTNDA_WQE_SIGNALED;
    wr.remote_addr = (uintptr_t)remote;
    wr.rkey = rkey;
    wr.sg_list = sge;
    wr.num_sge = 1;
    return wr;
}

static void post(struct side *s, struct softnda_send_wr *wr, const char *step) {
    int rc = softnda_sq_post(&s->sq, wr);
    if (rc != 0) {
        failErrno(step, -rc);
    }
    softnda_sq_doorbell(&s->sq);
}

/* ---- memory of every kind the face registers (docs/verbs.md, "Memory registration") ---- */

static uint8_t g_static[10000] = {1}; /* .data: initialised */

static void fill(uint8_t *p, size_t n, uint8_t seed) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = (uint8_t)(seed + i * 13);
    }
}

/* Registers [buf, buf+len), checks the bytes (and the neighbours on its pages) survived, lets the
 * peer QP write into it and read it back, then deregisters it. */
static void memory_case(struct side *s, struct ibv_pd *pd, struct ibv_mr *peer_mr, uint8_t *peer,
                        uint8_t *buf, size_t len, const char *what) {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    uint8_t before = buf[-1], after = buf[len];
    fill(buf, len, 0x31);
    struct ibv_mr *mr = v.reg_mr(pd, buf, len, access);
    if (mr == NULL) {
        failErrno(what, errno);
    }
    for (size_t i = 0; i < len; ++i) {
        if (buf[i] != (uint8_t)(0x31 + i * 13)) {
            fail(what, "registration changed the contents");
        }
    }
    if (buf[-1] != before || buf[len] != after) {
        fail(what, "registration changed the bytes next to the buffer");
    }
    /* The peer (QP 1) writes into it... */
    fill(peer, len, 0x77);
    struct softnda_sge sge = {(uintptr_t)peer, (uint32_t)len, peer_mr->lkey};
    struct softnda_send_wr wr = rdma_wr(SOFTNDA_OP_RDMA_WRITE, 100, &sge, buf, mr->rkey);
    post(&s[1], &wr, what);
    expect_ok(wait_cqe(&s[1].dcq, what), 100, what);
    if (memcmp(buf, peer, len) != 0) {
        fail(what, "the peer's RDMA WRITE did not reach the buffer");
    }
    /* ...and reads what the program wrote there. */
    fill(buf, len, 0x55);
    memset(peer, 0, len);
    wr.wr_id = 101;
    wr.opcode = SOFTNDA_OP_RDMA_READ;
    post(&s[1], &wr, what);
    expect_ok(wait_cqe(&s[1].dcq, what), 101, what);
    if (memcmp(buf, peer, len) != 0) {
        fail(what, "the peer's RDMA READ did not see the program's writes");
    }
    if (v.dereg_mr(mr) != 0) {
        fail(what, "ibv_dereg_mr refused");
    }
    if (buf[0] != 0x55 || buf[-1] != before || buf[len] != after) {
        fail(what, "deregistration changed the memory");
    }
}

/* fork() with a registered buffer: the child has a private copy as at fork (docs/verbs.md); the
 * parent's MR keeps working. */
static void fork_case(struct side *s, struct ibv_pd *pd, struct ibv_mr *peer_mr, uint8_t *peer) {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    uint8_t *buf = malloc(5000);
    if (buf == NULL) {
        fail("fork", "out of memory");
    }
    fill(buf, 5000, 0x21);
    struct ibv_mr *mr = v.reg_mr(pd, buf, 5000, access);
    if (mr == NULL) {
        failErrno("fork: ibv_reg_mr", errno);
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int ok = buf[4999] == (uint8_t)(0x21 + 4999 * 13);
        memset(buf, 0xee, 5000); /* the child's copy only */
        _exit(ok ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fail("fork", "the child did not see the registered bytes as at fork");
    }
    if (buf[0] != 0x21) {
        fail("fork", "the child's writes reached the parent");
    }
    fill(peer, 5000, 0x66);
    struct softnda_sge sge = {(uintptr_t)peer, 5000, peer_mr->lkey};
    struct softnda_send_wr wr = rdma_wr(SOFTNDA_OP_RDMA_WRITE, 200, &sge, buf, mr->rkey);
    post(&s[1], &wr, "fork");
    expect_ok(wait_cqe(&s[1].dcq, "fork"), 200, "fork");
    if (memcmp(buf, peer, 5000) != 0) {
        fail("fork", "the parent's MR no longer reaches its memory after fork");
    }
    if (v.dereg_mr(mr) != 0) {
        fail("fork", "ibv_dereg_mr refused");
    }
    free(buf);
}

static void memory_phase(struct side *s, struct ibv_pd *pd) {
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    const size_t len = 6000;
    uint8_t *peer = malloc(len + 8192);
    struct ibv_mr *peer_mr = peer != NULL ? v.reg_mr(pd, peer, len + 8192, access) : NULL;
    if (peer_mr == NULL) {
        fail("memory", "the peer buffer");
    }
    /* heap (malloc): odd offsets, pages shared with other heap data */
    uint8_t *heap = malloc(len + 2);
    memory_case(s, pd, peer_mr, peer, heap + 1, len, "heap (malloc)");
    free(heap);
    /* posix_memalign */
    void *aligned = NULL;
    if (posix_memalign(&aligned, 4096, len + 4096) != 0) {
        fail("memory", "posix_memalign");
    }
    memory_case(s, pd, peer_mr, peer, (uint8_t *)aligned + 4096 - 100, 200, "posix_memalign, partial pages");
    free(aligned);
    /* anonymous mmap */
    uint8_t *anon = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED) {
        fail("memory", "mmap");
    }
    memory_case(s, pd, peer_mr, peer, anon + 8, len, "anonymous mmap");
    munmap(anon, 4 * 4096);
    /* static data */
    memory_case(s, pd, peer_mr, peer, g_static + 16, len, "static data");
    /* A shared file mapping cannot be moved: refused with EINVAL. */
    FILE *f = tmpfile();
    if (f == NULL || ftruncate(fileno(f), 4096) != 0) {
        fail("memory", "tmpfile");
    }
    void *file = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(f), 0);
    errno = 0;
    if (file == MAP_FAILED || v.reg_mr(pd, file, 4096, access) != NULL || errno != EINVAL) {
        fail("memory", "a shared file mapping was not refused with EINVAL");
    }
    munmap(file, 4096);
    fclose(f);
    fork_case(s, pd, peer_mr, peer);
    if (v.dereg_mr(peer_mr) != 0) {
        fail("memory", "ibv_dereg_mr refused");
    }
    free(peer);
}

/* ---- the flow ---- */

static void connect_qp(struct ibv_qp *qp, uint32_t dest, uint16_t dlid, int access) {
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = (unsigned)access;
    int rc = v.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (rc != 0) {
        failErrno("modify_qp INIT", rc);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = dlid;
    a.ah_attr.port_num = 1;
    rc = v.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (rc != 0) {
        failErrno("modify_qp RTR", rc);
    }
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    rc = v.modify_qp(qp, &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
    if (rc != 0) {
        failErrno("modify_qp RTS", rc);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: hccp-consumer DEVICE\n");
        return 2;
    }
    if (access("/dev/infiniband", F_OK) == 0) {
        fprintf(stderr, "hccp-consumer: note: /dev/infiniband exists here (it is not used)\n");
    }
    resolve();

    int n = 0;
    struct ibv_device **list = v.get_device_list(&n);
    if (list == NULL) {
        failErrno("ibv_get_device_list", errno);
    }
    struct ibv_device *dev = NULL;
    for (int i = 0; i < n; ++i) {
        if (strcmp(v.get_device_name(list[i]), argv[1]) == 0) {
            dev = list[i];
        }
    }
    if (dev == NULL) {
        fail("ibv_get_device_list", "the device is not listed");
    }
    struct ibv_context *ctx = v.open_device(dev);
    v.free_device_list(list);
    if (ctx == NULL) {
        failErrno("ibv_open_device", errno);
    }
    struct ibv_port_attr port;
    memset(&port, 0, sizeof(port));
    if (v.query_port(ctx, 1, &port) != 0 || port.state != IBV_PORT_ACTIVE || port.lid == 0) {
        fail("ibv_query_port", "port 1 is not ACTIVE with a LID");
    }
    union ibv_gid gid;
    int gid_type = -1;
    if (v.query_gid(ctx, 1, 0, &gid) != 0 || gid.global.subnet_prefix == 0 ||
        v.query_gid_type(ctx, 1, 0, &gid_type) != 0 || gid_type != 0) {
        fail("ibv_query_gid", "no IB GID at index 0");
    }
    struct ibv_pd *pd = v.alloc_pd(ctx);
    if (pd == NULL) {
        failErrno("ibv_alloc_pd", errno);
    }
    struct ibv_context_extend *ext = x.open(ctx);
    if (ext == NULL) {
        failErrno("ibv_open_extend", errno);
    }
    struct ibv_device_attr_extend dattr;
    memset(&dattr, 0, sizeof(dattr));
    if (x.query_device(ext, &dattr) != 0 || !(dattr.ext_cap & IBV_EXTEND_DEV_NDA)) {
        fail("ibv_query_device_extend", "NDA is not supported");
    }

    struct side s[2];
    memset(s, 0, sizeof(s));
    for (int i = 0; i < 2; ++i) {
        struct ibv_cq_init_attr_extend ca;
        memset(&ca, 0, sizeof(ca));
        ca.attr.cqe = 64;
        ca.type = QU_BUF_DMA_MODE_DEFAULT;
        ca.ops = &g_ops;
        s[i].cq = x.create_cq(ext, &ca);
        if (s[i].cq == NULL) {
            failErrno("ibv_create_cq_extend", errno);
        }
        struct ibv_qp_init_attr_extend qa;
        memset(&qa, 0, sizeof(qa));
        qa.pd = pd;
        qa.attr.send_cq = s[i].cq->cq;
        qa.attr.recv_cq = s[i].cq->cq;
        qa.attr.qp_type = IBV_QPT_RC;
        qa.attr.cap.max_send_wr = 16;
        qa.attr.cap.max_recv_wr = 16;
        qa.attr.cap.max_send_sge = 1;
        qa.attr.cap.max_recv_sge = 1;
        qa.attr.sq_sig_all = 1;
        qa.type = QU_BUF_DMA_MODE_DEFAULT;
        qa.ops = &g_ops;
        s[i].qp = x.create_qp(ext, &qa);
        if (s[i].qp == NULL) {
            failErrno("ibv_create_qp_extend", errno);
        }
        struct ibv_qp_attr qattr;
        struct ibv_qp_init_attr qinit;
        if (v.query_qp(s[i].qp->qp, &qattr, IBV_QP_CAP, &qinit) != 0 || qattr.cap.max_send_wr < 16 ||
            qinit.cap.max_recv_wr < 16) {
            fail("ibv_query_qp(IBV_QP_CAP)", "the capabilities do not match the request");
        }
        /* The doorbells the device is given are the caller's db_mmap results. */
        if (!in_alias(s[i].cq->cq_info.db_hw_va.iov_base) || !in_alias(s[i].qp->sq_info.db_hw_va.iov_base)) {
            fail("db_mmap", "db_hw_va is not the address the caller's db_mmap returned");
        }
        struct ibv_hyroce_feature supported, out;
        uint32_t more = 0;
        memset(&supported, 0, sizeof(supported));
        memset(&out, 0, sizeof(out));
        if (x.query_hyroce(ext, s[i].qp->qp, 0, 0, &supported) == 0 &&
            x.nego_hyroce(ext, s[i].qp->qp, &supported, &out, &more) == 0) {
            struct ibv_qp_attr_extend ea;
            memset(&ea, 0, sizeof(ea));
            ea.qp = s[i].qp->qp;
            ea.udp_src_port = 49152;
            ea.feature = out;
            if (x.modify_qp(ext, &ea, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) !=
                0) {
                fprintf(stderr, "hccp-consumer: warning: ibv_modify_qp_extend failed (HCCP only warns)\n");
            }
        }
    }
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    connect_qp(s[0].qp->qp, s[1].qp->qp->qp_num, port.lid, access);
    connect_qp(s[1].qp->qp, s[0].qp->qp->qp_num, port.lid, access);

    /* Heap memory, registered with the standard verb; odd sizes so the pages are shared with
     * other heap data. */
    const size_t len = 3000;
    uint8_t *src = malloc(len), *dst = malloc(len), *back = malloc(len);
    if (src == NULL || dst == NULL || back == NULL) {
        fail("malloc", "out of memory");
    }
    for (size_t i = 0; i < len; ++i) {
        src[i] = (uint8_t)(i * 7 + 1);
    }
    memset(dst, 0, len);
    memset(back, 0, len);
    struct ibv_mr *msrc = v.reg_mr(pd, src, len, access);
    struct ibv_mr *mdst = v.reg_mr(pd, dst, len, access);
    struct ibv_mr *mback = v.reg_mr(pd, back, len, access);
    if (msrc == NULL || mdst == NULL || mback == NULL) {
        failErrno("ibv_reg_mr (heap)", errno);
    }
    if (src[len - 1] != (uint8_t)((len - 1) * 7 + 1)) {
        fail("ibv_reg_mr (heap)", "registration changed the buffer's contents");
    }
    for (int i = 0; i < 2; ++i) {
        if (softnda_sq_init(&s[i].sq, &s[i].qp->sq_info) != 0 ||
            softnda_rq_init(&s[i].rq, &s[i].qp->rq_info) != 0 ||
            softnda_cq_init(&s[i].dcq, &s[i].cq->cq_info) != 0) {
            fail("queue_info", "the queues do not follow SPEC.md");
        }
    }

    sync_point("data-begin");
    /* RDMA WRITE src -> dst. */
    struct softnda_sge sge = {(uintptr_t)src, (uint32_t)len, msrc->lkey};
    struct softnda_send_wr wr = rdma_wr(SOFTNDA_OP_RDMA_WRITE, 1, &sge, dst, mdst->rkey);
    post(&s[0], &wr, "RDMA WRITE");
    expect_ok(wait_cqe(&s[0].dcq, "RDMA WRITE"), 1, "RDMA WRITE");
    if (memcmp(src, dst, len) != 0) {
        fail("RDMA WRITE", "the bytes did not arrive");
    }
    /* SEND src -> a receive into back, on the other QP. */
    struct softnda_sge rsge = {(uintptr_t)back, (uint32_t)len, mback->lkey};
    if (softnda_rq_post(&s[1].rq, 7, &rsge, 1) != 0) {
        fail("post receive", "the RQ refused the WQE");
    }
    softnda_rq_doorbell(&s[1].rq);
    for (size_t i = 0; i < len; ++i) {
        src[i] = (uint8_t)(i * 3 + 5);
    }
    wr.wr_id = 2;
    wr.opcode = SOFTNDA_OP_SEND;
    post(&s[0], &wr, "SEND");
    expect_ok(wait_cqe(&s[0].dcq, "SEND"), 2, "SEND");
    struct softnda_cqe rc = wait_cqe(&s[1].dcq, "RECV");
    expect_ok(rc, 7, "RECV");
    if (rc.byte_len != len || memcmp(src, back, len) != 0) {
        fail("SEND/RECV", "the message did not arrive");
    }
    /* RDMA READ dst (remote, on QP 1's side) -> src (local). */
    memset(src, 0, len);
    wr.wr_id = 3;
    wr.opcode = SOFTNDA_OP_RDMA_READ;
    wr.remote_addr = (uintptr_t)dst;
    wr.rkey = mdst->rkey;
    post(&s[0], &wr, "RDMA READ");
    expect_ok(wait_cqe(&s[0].dcq, "RDMA READ"), 3, "RDMA READ");
    if (memcmp(src, dst, len) != 0) {
        fail("RDMA READ", "the bytes did not come back");
    }
    sync_point("data-end");

    memory_phase(s, pd);

    /* A QP brought up with the standard verbs alone: CQ, QP, INIT, RTR, RTS. */
    sync_point("bringup-begin");
    struct ibv_cq *scq = v.create_cq(ctx, 16, NULL, NULL, 0);
    if (scq == NULL) {
        failErrno("ibv_create_cq", errno);
    }
    struct ibv_qp_init_attr qia;
    memset(&qia, 0, sizeof(qia));
    qia.send_cq = scq;
    qia.recv_cq = scq;
    qia.qp_type = IBV_QPT_RC;
    qia.cap.max_send_wr = 4;
    qia.cap.max_recv_wr = 4;
    qia.cap.max_send_sge = 1;
    qia.cap.max_recv_sge = 1;
    struct ibv_qp *sqp = v.create_qp(pd, &qia);
    if (sqp == NULL) {
        failErrno("ibv_create_qp", errno);
    }
    struct ibv_qp_attr qa2;
    struct ibv_qp_init_attr qi2;
    if (v.query_qp(sqp, &qa2, IBV_QP_CAP, &qi2) != 0) {
        fail("ibv_query_qp(IBV_QP_CAP)", "refused");
    }
    connect_qp(sqp, s[1].qp->qp->qp_num, port.lid, access);
    sync_point("bringup-end");
    if (v.destroy_qp(sqp) != 0 || v.destroy_cq(scq) != 0) {
        fail("teardown", "standard QP/CQ");
    }

    /* Teardown, as HCCP: QP, CQ, then close. */
    if (v.dereg_mr(msrc) != 0 || v.dereg_mr(mdst) != 0 || v.dereg_mr(mback) != 0) {
        fail("ibv_dereg_mr", "refused");
    }
    for (int i = 0; i < 2; ++i) {
        if (x.destroy_qp(ext, s[i].qp) != 0 || x.destroy_cq(ext, s[i].cq) != 0) {
            fail("teardown", "extend QP/CQ");
        }
    }
    if (db_pages_mapped() != 0) {
        fail("db_unmap", "a doorbell page is still mapped after its queues went");
    }
    if (g_alloc_calls != 0) {
        fail("ibv_extend_ops", "alloc/free were called in broker mode");
    }
    free(src);
    free(dst);
    free(back);
    if (x.close(ext) != 0 || v.dealloc_pd(pd) != 0 || v.close_device(ctx) != 0) {
        fail("teardown", "close");
    }
    printf("OK\n");
    return 0;
}
