/*
 * ibvx-direct-example: the ibv_extend flow of an NPU runtime, in direct mode, on a virtual
 * device. Lists the devices, opens the first one (or the one named on the command line), reads
 * its extended capabilities, creates a CQ and an RC QP whose queue memory comes from
 * ibvx_alloc_buf() through the caller's ibv_extend_ops, prints the queue_info a device kernel
 * would be given, and tears everything down.
 *
 *   IBV_EXTEND_DRIVERS=softnda IBV_EXTEND_PROVIDER_DIR=<build>/providers-out ibvx-direct-example [DEVICE]
 *
 * Exit status 0 on success, 1 on any failure (with a message naming the failing step).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#define MAX_DEVICES 16

/* ---- the caller's memory callbacks: host memory from ibvx_alloc_buf() ---- */

static void *ex_alloc(size_t size) {
    return ibvx_alloc_buf(size);
}

static void ex_free(void *ptr) {
    ibvx_free_buf(ptr);
}

static void ex_memset(void *dst, int value, size_t count) {
    memset(dst, value, count);
}

static int ex_memcpy(void *dst, size_t dst_max, void *src, size_t size, uint32_t direction) {
    if (direction > MEMCPY_DIR_DEVICE_TO_DEVICE || size > dst_max) {
        return -1;
    }
    memcpy(dst, src, size);
    return 0;
}

/* In direct mode on the host, a doorbell's host address is already usable as is. */
static void *ex_db_mmap(struct doorbell_map_desc *desc) {
    if (desc == NULL || desc->type != DB_MAP_MODE_HOST_VA) {
        return NULL;
    }
    return (void *)(uintptr_t)desc->hva;
}

static int ex_db_unmap(void *ptr, struct doorbell_map_desc *desc) {
    return ptr != NULL && desc != NULL ? 0 : -EINVAL;
}

static struct ibv_extend_ops ex_ops = {
    .alloc = ex_alloc,
    .free = ex_free,
    .memset_s = ex_memset,
    .memcpy_s = ex_memcpy,
    .db_mmap = ex_db_mmap,
    .db_unmap = ex_db_unmap,
};

static void print_queue(const char *what, const struct queue_info *q) {
    printf("  %-3s base=0x%016llx entries=%u x %u B  pi=%p ci=%p doorbell=%p\n", what,
           (unsigned long long)q->qbuf.base, q->qbuf.entry_cnt, q->qbuf.entry_size, q->dbr_pi_va.iov_base,
           q->dbr_ci_va.iov_base, q->db_hw_va.iov_base);
}

static int fail(const char *step, int err) {
    fprintf(stderr, "ibvx-direct-example: %s failed: %s\n", step, strerror(err < 0 ? -err : err));
    return 1;
}

int main(int argc, char **argv) {
    printf("ibv_extend %s, mode %s\n", ibv_extend_get_version(NULL, NULL, NULL), ibvx_mode());

    struct ibvx_device_info devs[MAX_DEVICES];
    int n = ibvx_list_devices(devs, MAX_DEVICES);
    if (n < 0) {
        return fail("ibvx_list_devices", n);
    }
    printf("%d device(s)\n", n);
    for (int i = 0; i < n && i < MAX_DEVICES; ++i) {
        printf("  %-12s provider=%-10s ext_cap=0x%x ops=V%u max_qp=%u max_qp_wr=%u max_cqe=%u\n",
               devs[i].name, devs[i].provider, devs[i].ext_cap, devs[i].driver_version, devs[i].max_qp,
               devs[i].max_qp_wr, devs[i].max_cqe);
    }
    if (n == 0 && argc < 2) {
        fprintf(stderr, "ibvx-direct-example: no device; set IBV_EXTEND_DRIVERS (e.g. softnda)\n");
        return 1;
    }
    const char *name = argc > 1 ? argv[1] : devs[0].name;

    struct ibv_context_extend *ext = ibvx_open_device(name);
    if (ext == NULL) {
        return fail("ibvx_open_device", errno);
    }
    printf("opened %s\n", name);

    int rc = 1;
    struct ibv_pd *pd = NULL;
    struct ibv_cq_extend *cq = NULL;
    struct ibv_qp_extend *qp = NULL;

    struct ibv_device_attr_extend attr;
    memset(&attr, 0, sizeof(attr));
    int err = ibv_query_device_extend(ext, &attr);
    if (err != 0) {
        fail("ibv_query_device_extend", err);
        goto out;
    }
    printf("ext_cap 0x%x: NDA %s, NDR %s\n", attr.ext_cap, (attr.ext_cap & IBV_EXTEND_DEV_NDA) ? "yes" : "no",
           (attr.ext_cap & IBV_EXTEND_DEV_NDR) ? "yes" : "no");
    if (!(attr.ext_cap & IBV_EXTEND_DEV_NDA)) {
        fprintf(stderr, "ibvx-direct-example: %s does not support NPU Direct Async\n", name);
        goto out;
    }

    pd = ibvx_alloc_pd(ext);
    if (pd == NULL) {
        fail("ibvx_alloc_pd", errno);
        goto out;
    }

    struct ibv_cq_init_attr_extend cq_attr;
    memset(&cq_attr, 0, sizeof(cq_attr));
    cq_attr.attr.cqe = 64;
    cq_attr.type = QU_BUF_DMA_MODE_DEFAULT;
    cq_attr.ops = &ex_ops;
    cq = ibv_create_cq_extend(ext, &cq_attr);
    if (cq == NULL) {
        fail("ibv_create_cq_extend", errno);
        goto out;
    }

    struct ibv_qp_init_attr_extend qp_attr;
    memset(&qp_attr, 0, sizeof(qp_attr));
    qp_attr.pd = pd;
    qp_attr.attr.send_cq = cq->cq;
    qp_attr.attr.recv_cq = cq->cq;
    qp_attr.attr.qp_type = IBV_QPT_RC;
    qp_attr.attr.cap.max_send_wr = 32;
    qp_attr.attr.cap.max_recv_wr = 32;
    qp_attr.attr.cap.max_send_sge = 1;
    qp_attr.attr.cap.max_recv_sge = 1;
    qp_attr.type = QU_BUF_DMA_MODE_DEFAULT;
    qp_attr.ops = &ex_ops;
    qp = ibv_create_qp_extend(ext, &qp_attr);
    if (qp == NULL) {
        fail("ibv_create_qp_extend", errno);
        goto out;
    }

    printf("queue_info a device kernel would drive:\n");
    print_queue("CQ", &cq->cq_info);
    printf("  QP  qp_num=%u\n", qp->qp->qp_num);
    print_queue("SQ", &qp->sq_info);
    print_queue("RQ", &qp->rq_info);
    rc = 0;

out:
    if (qp != NULL && (err = ibv_destroy_qp_extend(ext, qp)) != 0) {
        rc = fail("ibv_destroy_qp_extend", err);
    }
    if (cq != NULL && (err = ibv_destroy_cq_extend(ext, cq)) != 0) {
        rc = fail("ibv_destroy_cq_extend", err);
    }
    if (pd != NULL && (err = ibvx_dealloc_pd(pd)) != 0) {
        rc = fail("ibvx_dealloc_pd", err);
    }
    if ((err = ibvx_close_device(ext)) != 0) {
        rc = fail("ibvx_close_device", err);
    }
    printf("%s\n", rc == 0 ? "done" : "FAILED");
    return rc;
}
