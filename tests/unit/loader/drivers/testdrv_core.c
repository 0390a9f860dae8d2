#include "testdrv_core.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define TD_ENTRY_SIZE 64u
#define TD_DBR_SIZE 64u

static struct testdrv_control g_ctl = {
    .ops_version = IBV_EXTEND_DRIVER_VERSION_V3,
    .ext_cap = IBV_EXTEND_DEV_NDA | IBV_EXTEND_DEV_NDR,
};

/* The "hardware" doorbell register page every queue rings. */
static uint8_t g_doorbells[4096] __attribute__((aligned(4096)));
static uint32_t g_next_qpn = 0x100;

__attribute__((visibility("default"))) struct testdrv_control *testdrv_get_control(void) {
    return &g_ctl;
}

/* Memory of one queue, obtained through the caller's callbacks and returned through them. */
struct td_queue {
    struct ibv_extend_ops *ops;
    void *buf;
    void *dbr;
    void *db;
    struct doorbell_map_desc desc;
};

static int td_queue_make(struct ibv_extend_ops *ops, uint32_t depth, size_t db_offset, struct queue_info *qi,
                         struct td_queue *q) {
    memset(q, 0, sizeof(*q));
    if (ops == NULL || ops->alloc == NULL || ops->free == NULL || ops->db_mmap == NULL ||
        ops->db_unmap == NULL) {
        return -EINVAL;
    }
    if (depth == 0) {
        depth = 1;
    }
    q->ops = ops;
    q->buf = ops->alloc((size_t)depth * TD_ENTRY_SIZE);
    q->dbr = ops->alloc(TD_DBR_SIZE);
    if (q->buf == NULL || q->dbr == NULL) {
        goto fail;
    }
    if (ops->memset_s != NULL) {
        ops->memset_s(q->buf, 0, (size_t)depth * TD_ENTRY_SIZE);
        ops->memset_s(q->dbr, 0, TD_DBR_SIZE);
    }
    q->desc.hva = (uint64_t)(uintptr_t)(g_doorbells + db_offset);
    q->desc.size = 8;
    q->desc.type = DB_MAP_MODE_HOST_VA;
    q->db = ops->db_mmap(&q->desc);
    if (q->db == NULL) {
        goto fail;
    }
    qi->qbuf.base = (uint64_t)(uintptr_t)q->buf;
    qi->qbuf.entry_cnt = depth;
    qi->qbuf.entry_size = TD_ENTRY_SIZE;
    qi->dbr_pi_va.iov_base = q->dbr;
    qi->dbr_pi_va.iov_len = 4;
    qi->dbr_ci_va.iov_base = (char *)q->dbr + 8;
    qi->dbr_ci_va.iov_len = 4;
    qi->db_hw_va.iov_base = q->db;
    qi->db_hw_va.iov_len = 8;
    return 0;
fail:
    if (q->buf != NULL) {
        ops->free(q->buf);
    }
    if (q->dbr != NULL) {
        ops->free(q->dbr);
    }
    return -ENOMEM;
}

static void td_queue_release(struct td_queue *q) {
    if (q->ops == NULL) {
        return;
    }
    q->ops->db_unmap(q->db, &q->desc);
    q->ops->free(q->buf);
    q->ops->free(q->dbr);
}

struct td_qp {
    struct ibv_qp_extend ext; /* first: destroy_qp gets this pointer back */
    struct ibv_qp qp;
    struct td_queue sq;
    struct td_queue rq;
    uint32_t udp_src_port;
};

struct td_cq {
    struct ibv_cq_extend ext;
    struct ibv_cq cq;
    struct td_queue q;
};

struct td_srq {
    struct ibv_srq_extend ext;
    struct ibv_srq srq;
    struct td_queue q;
};

static struct ibv_qp_extend *td_create_qp(struct ibv_context *context, struct ibv_qp_init_attr_extend *attr) {
    g_ctl.create_qp_calls++;
    struct td_qp *qp = calloc(1, sizeof(*qp));
    if (qp == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    int rc = td_queue_make(attr->ops, attr->attr.cap.max_send_wr, 0, &qp->ext.sq_info, &qp->sq);
    if (rc == 0) {
        rc = td_queue_make(attr->ops, attr->attr.cap.max_recv_wr, 64, &qp->ext.rq_info, &qp->rq);
        if (rc != 0) {
            td_queue_release(&qp->sq);
        }
    }
    if (rc != 0) {
        free(qp);
        errno = -rc;
        return NULL;
    }
    qp->qp.context = context;
    qp->qp.pd = attr->pd;
    qp->qp.send_cq = attr->attr.send_cq;
    qp->qp.recv_cq = attr->attr.recv_cq;
    qp->qp.qp_num = g_next_qpn++;
    qp->qp.state = IBV_QPS_RESET;
    qp->qp.qp_type = attr->attr.qp_type;
    qp->ext.qp = &qp->qp;
    g_ctl.live_queues++;
    return &qp->ext;
}

static struct ibv_cq_extend *td_create_cq(struct ibv_context *context, struct ibv_cq_init_attr_extend *attr) {
    g_ctl.create_cq_calls++;
    struct td_cq *cq = calloc(1, sizeof(*cq));
    if (cq == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    int rc = td_queue_make(attr->ops, attr->attr.cqe, 128, &cq->ext.cq_info, &cq->q);
    if (rc != 0) {
        free(cq);
        errno = -rc;
        return NULL;
    }
    cq->cq.context = context;
    cq->cq.cqe = (int)cq->ext.cq_info.qbuf.entry_cnt;
    cq->ext.cq = &cq->cq;
    g_ctl.live_queues++;
    return &cq->ext;
}

static struct ibv_srq_extend *td_create_srq(struct ibv_context *context,
                                            struct ibv_srq_init_attr_extend *attr) {
    g_ctl.create_srq_calls++;
    struct td_srq *srq = calloc(1, sizeof(*srq));
    if (srq == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    int rc = td_queue_make(attr->ops, attr->attr.attr.max_wr, 192, &srq->ext.srq_info, &srq->q);
    if (rc != 0) {
        free(srq);
        errno = -rc;
        return NULL;
    }
    srq->srq.context = context;
    srq->srq.pd = attr->pd;
    srq->ext.srq = &srq->srq;
    g_ctl.live_queues++;
    return &srq->ext;
}

static int td_destroy_qp(struct ibv_qp_extend *ext) {
    g_ctl.destroy_qp_calls++;
    struct td_qp *qp = (struct td_qp *)ext;
    td_queue_release(&qp->sq);
    td_queue_release(&qp->rq);
    free(qp);
    g_ctl.live_queues--;
    return 0;
}

static int td_destroy_cq(struct ibv_cq_extend *ext) {
    g_ctl.destroy_cq_calls++;
    struct td_cq *cq = (struct td_cq *)ext;
    td_queue_release(&cq->q);
    free(cq);
    g_ctl.live_queues--;
    return 0;
}

static int td_destroy_srq(struct ibv_srq_extend *ext) {
    g_ctl.destroy_srq_calls++;
    struct td_srq *srq = (struct td_srq *)ext;
    td_queue_release(&srq->q);
    free(srq);
    g_ctl.live_queues--;
    return 0;
}

static int td_query_device(struct ibv_context *context, struct ibv_device_attr_extend *attr) {
    (void)context;
    g_ctl.query_device_calls++;
    g_ctl.query_device_seen_ext_cap = attr->ext_cap;
    attr->ext_cap = g_ctl.ext_cap;
    return 0;
}

static struct td_qp *td_qp_of(struct ibv_qp *qp) {
    return (struct td_qp *)((char *)qp - offsetof(struct td_qp, qp));
}

static int td_modify_qp(struct ibv_context *context, struct ibv_qp_attr_extend *attr, int mask) {
    (void)context;
    g_ctl.modify_calls++;
    g_ctl.last_mask = mask;
    if (attr->qp == NULL) {
        return -EINVAL;
    }
    struct td_qp *qp = td_qp_of(attr->qp);
    if (mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) {
        qp->udp_src_port = attr->udp_src_port;
    }
    qp->ext.vendor_priv_info.vendor1.db_cos = 5;
    return 0;
}

static int td_query_qp(struct ibv_context *context, struct ibv_qp_attr_extend *attr, int mask) {
    (void)context;
    g_ctl.query_calls++;
    g_ctl.last_mask = mask;
    if (attr->qp == NULL) {
        return -EINVAL;
    }
    attr->udp_src_port = td_qp_of(attr->qp)->udp_src_port;
    return 0;
}

static int td_query_hyroce(struct ibv_context *context, struct ibv_qp *qp, uint32_t sl, uint32_t tc,
                           struct ibv_hyroce_feature *feature) {
    (void)context;
    (void)qp;
    g_ctl.hyroce_query_calls++;
    g_ctl.last_sl = sl;
    g_ctl.last_tc = tc;
    memset(feature, 0, sizeof(*feature));
    feature->type = IBV_HYPER_FEAT_HYPER_ROCE;
    feature->version = IBV_HYPER_FEAT_V2;
    feature->sack_enable = 1;
    return 0;
}

static int td_nego_hyroce(struct ibv_context *context, struct ibv_qp *qp,
                          const struct ibv_hyroce_feature *input, struct ibv_hyroce_feature *output,
                          uint32_t *need_more_nego) {
    (void)context;
    (void)qp;
    g_ctl.nego_calls++;
    memset(output, 0, sizeof(*output));
    output->type = input->type;
    output->version = input->version < IBV_HYPER_FEAT_V2 ? input->version : IBV_HYPER_FEAT_V2;
    output->sack_enable = input->sack_enable;
    *need_more_nego = 0;
    return 0;
}

static const struct ibv_context_extend_ops td_ops_template = {
    .version = IBV_EXTEND_DRIVER_VERSION_V3,
    .create_qp = td_create_qp,
    .create_cq = td_create_cq,
    .create_srq = td_create_srq,
    .destroy_qp = td_destroy_qp,
    .destroy_cq = td_destroy_cq,
    .destroy_srq = td_destroy_srq,
    .query_device = td_query_device,
    .modify_qp = td_modify_qp,
    .query_qp = td_query_qp,
    .query_qp_supported_hyroce_feature = td_query_hyroce,
    .nego_qp_hyroce_feature = td_nego_hyroce,
};

struct td_context {
    struct ibv_context_extend ext; /* first: free_context gets this pointer back */
    struct ibv_context_extend_ops ops;
};

struct ibv_context_extend *testdrv_alloc_context(struct ibv_context *context) {
    g_ctl.alloc_calls++;
    if (g_ctl.alloc_null) {
        return NULL;
    }
    struct td_context *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    c->ops = td_ops_template;
    c->ops.version = g_ctl.ops_version;
    c->ext.context = context;
    c->ext.ops = g_ctl.null_ops ? NULL : &c->ops;
    return &c->ext;
}

void testdrv_free_context(struct ibv_context_extend *context) {
    g_ctl.free_calls++;
    free(context);
}
