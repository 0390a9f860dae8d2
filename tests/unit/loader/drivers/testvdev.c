/* A virtual-device provider for tests and the direct-mode example: two devices, "testvdev0" and
 * "testvdev1", with PD/MR/QP-state ops, served by the test extension driver core. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ibv_extend_vdev.h>

#include "testdrv_core.h"

#define TESTVDEV_PROVIDER "ibvxtestvdev"
#define TESTVDEV_COUNT 2

static struct ibv_device g_devs[TESTVDEV_COUNT];
static uint32_t g_next_key = 0x1000;

__attribute__((constructor(101))) static void testvdev_init_devices(void) {
    for (int i = 0; i < TESTVDEV_COUNT; ++i) {
        snprintf(g_devs[i].name, sizeof(g_devs[i].name), "testvdev%d", i);
        snprintf(g_devs[i].dev_name, sizeof(g_devs[i].dev_name), "vuverbs%d", i);
        g_devs[i].node_type = IBV_NODE_RNIC;
        g_devs[i].transport_type = IBV_TRANSPORT_IWARP;
    }
}

static int tv_query_devices(struct ibv_extend_vdev_attr *attrs, int max) {
    for (int i = 0; i < TESTVDEV_COUNT && i < max; ++i) {
        struct ibv_extend_vdev_attr *a = &attrs[i];
        memset(a, 0, sizeof(*a));
        snprintf(a->name, sizeof(a->name), "%s", g_devs[i].name);
        a->phys_port_cnt = 1;
        a->max_pd = 16;
        a->max_mr = 64;
        a->max_qp = 32;
        a->max_cq = 32;
        a->max_srq = 8;
        a->max_qp_wr = 1024;
        a->max_cqe = 4096;
        a->max_srq_wr = 1024;
        a->max_sge = 4;
        a->max_inline_data = 64;
        a->max_msg_sz = 1u << 20;
        a->max_mr_size = 1ull << 32;
    }
    return TESTVDEV_COUNT;
}

static struct ibv_context *tv_open_device(const char *name) {
    for (int i = 0; i < TESTVDEV_COUNT; ++i) {
        if (strcmp(name, g_devs[i].name) == 0) {
            struct ibv_context *ctx = calloc(1, sizeof(*ctx));
            if (ctx == NULL) {
                errno = ENOMEM;
                return NULL;
            }
            ctx->device = &g_devs[i];
            ctx->cmd_fd = -1;
            ctx->async_fd = -1;
            return ctx;
        }
    }
    errno = ENODEV;
    return NULL;
}

static int tv_close_device(struct ibv_context *ctx) {
    free(ctx);
    return 0;
}

static int tv_is_own_device(const struct ibv_device *dev) {
    return dev >= g_devs && dev < g_devs + TESTVDEV_COUNT;
}

static struct ibv_pd *tv_alloc_pd(struct ibv_context *ctx) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pd->context = ctx;
    pd->handle = g_next_key++;
    return pd;
}

static int tv_dealloc_pd(struct ibv_pd *pd) {
    free(pd);
    return 0;
}

static struct ibv_mr *tv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    (void)addr;
    (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = (void *)(uintptr_t)iova;
    mr->length = length;
    mr->lkey = g_next_key++;
    mr->rkey = g_next_key++;
    return mr;
}

static int tv_dereg_mr(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

/* RESET->INIT->RTR->RTS, INIT->INIT, RTS->RTS, anything->RESET/ERR. qp->state is left to the
 * library, which updates it on success. */
static int tv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask) {
    if (!(mask & IBV_QP_STATE)) {
        return 0;
    }
    enum ibv_qp_state from = qp->state, to = attr->qp_state;
    int ok = to == IBV_QPS_RESET || to == IBV_QPS_ERR || (from == IBV_QPS_RESET && to == IBV_QPS_INIT) ||
             (from == IBV_QPS_INIT && (to == IBV_QPS_INIT || to == IBV_QPS_RTR)) ||
             (from == IBV_QPS_RTR && to == IBV_QPS_RTS) || (from == IBV_QPS_RTS && to == IBV_QPS_RTS);
    return ok ? 0 : -EINVAL;
}

static int tv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
                       struct ibv_qp_init_attr *init_attr) {
    (void)mask;
    memset(attr, 0, sizeof(*attr));
    memset(init_attr, 0, sizeof(*init_attr));
    attr->qp_state = qp->state;
    attr->cur_qp_state = qp->state;
    init_attr->qp_type = qp->qp_type;
    init_attr->send_cq = qp->send_cq;
    init_attr->recv_cq = qp->recv_cq;
    return 0;
}

static const struct ibv_extend_vdev_ops testvdev_vops = {
    .abi = IBV_EXTEND_VDEV_ABI_V1,
    .provider = TESTVDEV_PROVIDER,
    .configure = NULL,
    .query_devices = tv_query_devices,
    .open_device = tv_open_device,
    .close_device = tv_close_device,
    .is_own_device = tv_is_own_device,
    .alloc_pd = tv_alloc_pd,
    .dealloc_pd = tv_dealloc_pd,
    .reg_mr = tv_reg_mr,
    .dereg_mr = tv_dereg_mr,
    .modify_qp = tv_modify_qp,
    .query_qp = tv_query_qp,
    .export_mmio = NULL,
};

static const struct verbs_device_extend_ops testvdev_ops = {
    .name = TESTVDEV_PROVIDER,
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};

PROVIDER_EXTEND_VDEV(testvdev_vops)
PROVIDER_EXTEND_DRIVER(testvdev_ops)
