/*
 * ibv_extend.h - NPU Direct Async (NDA) extension API for RDMA verbs.
 *
 * Source- and ABI-compatible with the public ibv_extend interface, header version 4.2.0
 * (extension driver ops V1..V3). Only v4.2.0 is implemented; earlier layouts (v3.x without
 * the ops `version` field, v4.1 without the LAG port) are not supported.
 *
 * Return conventions (kept from the reference, they differ from libibverbs):
 *   - functions returning int return 0 on success and a NEGATIVE errno on failure;
 *   - functions returning a pointer return NULL on failure.
 *
 * North-bound: applications call ibv_open_extend() and friends.
 * South-bound: extension drivers fill struct verbs_device_extend_ops and register it with
 * PROVIDER_EXTEND_DRIVER(); the library matches them to rdma-core devices by provider name.
 *
 * This header is plain C and compiles on its own in C and C++.
 */
#ifndef IBV_EXTEND_H
#define IBV_EXTEND_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Library version. Major must match exactly; a driver or application built against a header
 * must not be newer (minor, then patch) than the library it runs with. */
#define IBV_EXTEND_VERSION_MAJOR 4
#define IBV_EXTEND_VERSION_MINOR 2
#define IBV_EXTEND_VERSION_PATCH 0
#define IBV_EXTEND_VERSION_STRING "4.2.0"

/* Which ops a driver implements. A driver may implement an older set; calls needing a newer
 * set answer -EOPNOTSUPP. Versions above MAX are refused at open time. */
enum IBV_EXTEND_DRIVER_VERSION {
    IBV_EXTEND_DRIVER_VERSION_UNUSED = 0,
    IBV_EXTEND_DRIVER_VERSION_V1 = 1, /* NDA: create/destroy QP/CQ/SRQ, query_device */
    IBV_EXTEND_DRIVER_VERSION_V2 = 2, /* + modify_qp / query_qp extended attributes */
    IBV_EXTEND_DRIVER_VERSION_V3 = 3, /* + hyroce feature query/negotiation, LAG port */
    IBV_EXTEND_DRIVER_VERSION_MAX = IBV_EXTEND_DRIVER_VERSION_V3
};

struct ibv_context_extend_ops;

/* An opened extension context: the rdma-core context it extends and the driver's ops. */
struct ibv_context_extend {
    struct ibv_context *context;
    struct ibv_context_extend_ops *ops;
};

/* Returns the static version string; any out-pointer may be NULL. */
const char *ibv_extend_get_version(uint32_t *major, uint32_t *minor, uint32_t *patch);

/* 0 when a caller built against (major, minor, patch) can run with this library, else -1. */
int ibv_extend_check_version(uint32_t driver_major, uint32_t driver_minor, uint32_t driver_patch);

/* Opens the extension context of an rdma-core device; NULL when no extension driver serves it. */
struct ibv_context_extend *ibv_open_extend(struct ibv_context *context);

/* Closes a context returned by ibv_open_extend(). */
int ibv_close_extend(struct ibv_context_extend *context);

/* ---- NPU Direct Async ---------------------------------------------------------------- */

/* Bus the NIC uses to DMA queue memory. */
enum queue_buf_dma_mode {
    QU_BUF_DMA_MODE_DEFAULT = 0, /* host bus: NIC - PCIe - NPU */
    QU_BUF_DMA_MODE_INDEP_UB,    /* an independent UB bus: NIC - UB - NPU */
};

/* How a doorbell is described to ibv_extend_ops.db_mmap. */
enum doorbell_map_mode {
    DB_MAP_MODE_HOST_VA = 0, /* by host virtual address (desc.hva) */
    DB_MAP_MODE_UB_RES,      /* by UB resource (desc.ub_res) */
};

/* Direction argument of ibv_extend_ops.memcpy_s. */
enum memcpy_direction {
    MEMCPY_DIR_HOST_TO_HOST = 0,
    MEMCPY_DIR_HOST_TO_DEVICE,
    MEMCPY_DIR_DEVICE_TO_HOST,
    MEMCPY_DIR_DEVICE_TO_DEVICE,
};

/* ibv_qp_init_attr_extend.qp_cap_flag bits. */
enum ibv_qp_init_cap {
    QP_ENABLE_DIRECT_WQE = 1 << 0, /* the SQ may be written with direct (BlueFlame-like) WQEs */
};

/* ibv_device_attr_extend.ext_cap bits. */
enum ibv_extend_device_cap {
    IBV_EXTEND_DEV_NDR = 1 << 0, /* NPU Direct RDMA: device memory can be registered */
    IBV_EXTEND_DEV_NDA = 1 << 1, /* NPU Direct Async: queues and doorbells can live on the NPU */
};

/* Describes a doorbell to map into the device's address space. */
struct doorbell_map_desc {
    union {
        uint64_t hva; /* DB_MAP_MODE_HOST_VA: host virtual address of the doorbell */
        struct {
            uint64_t guid_l;
            uint64_t guid_h;
            struct {
                uint64_t resource_id : 4;
                uint64_t offset : 32; /* bytes */
                uint64_t resv : 28;
            } bits;
        } ub_res; /* DB_MAP_MODE_UB_RES */
    };
    uint64_t size; /* bytes */
    uint32_t type; /* enum doorbell_map_mode */
    uint32_t resv;
};

/* Memory and mapping callbacks the caller supplies at create time. They carry no context
 * pointer: an implementation must know the owner of a call from the calling thread. */
struct ibv_extend_ops {
    void *(*alloc)(size_t size);
    void (*free)(void *ptr);
    void (*memset_s)(void *dst, int value, size_t count);
    /* direct: enum memcpy_direction; returns 0 or -1 */
    int (*memcpy_s)(void *dst, size_t dst_max_size, void *src, size_t size, uint32_t direct);
    /* Must accept repeated maps of the same desc (and return the same address). */
    void *(*db_mmap)(struct doorbell_map_desc *desc);
    int (*db_unmap)(void *ptr, struct doorbell_map_desc *desc);
};

struct iov_addr_desc {
    void *iov_base;
    size_t iov_len;
};

/* A ring of fixed-size entries (WQEs or CQEs). */
struct queue_buf {
    uint64_t base;       /* address of entry 0 */
    uint32_t entry_cnt;  /* number of entries */
    uint32_t entry_size; /* bytes per entry */
    uint64_t resv[4];
};

/* Everything a device-side user needs to drive one queue. */
struct queue_info {
    struct queue_buf qbuf;
    /* Doorbell record, producer index: written by software for SQ/RQ/SRQ (read by hardware);
     * for a CQ it is the hardware-written producer index software reads. */
    struct iov_addr_desc dbr_pi_va;
    /* Doorbell record, consumer index: written by hardware for SQ/RQ/SRQ; for a CQ it is
     * written by software as it consumes CQEs. */
    struct iov_addr_desc dbr_ci_va;
    /* The doorbell register after db_mmap. */
    struct iov_addr_desc db_hw_va;
    uint64_t resv[4];
};

struct ibv_qp_extend {
    struct ibv_qp *qp;
    struct queue_info sq_info;
    struct queue_info rq_info;
    uint64_t resv[31];
    union {
        struct {
            uint8_t db_cos; /* refreshed by the driver on modify_qp */
            uint8_t resv[7];
        } vendor1;
        uint64_t value;
    } vendor_priv_info;
};

struct ibv_cq_extend {
    struct ibv_cq *cq;
    struct queue_info cq_info;
    uint64_t resv[32];
};

struct ibv_srq_extend {
    struct ibv_srq *srq;
    struct queue_info srq_info;
    uint64_t resv[32];
};

struct ibv_qp_init_attr_extend {
    struct ibv_pd *pd;
    struct ibv_qp_init_attr attr;
    uint32_t qp_cap_flag; /* enum ibv_qp_init_cap bits */
    enum queue_buf_dma_mode type;
    struct ibv_extend_ops *ops; /* the driver keeps it for the QP's lifetime */
    uint64_t resv[8];
};

struct ibv_cq_init_attr_extend {
    struct ibv_cq_init_attr_ex attr;
    uint32_t cq_cap_flag;
    enum queue_buf_dma_mode type;
    struct ibv_extend_ops *ops; /* the driver keeps it for the CQ's lifetime */
    uint64_t resv[8];
};

struct ibv_srq_init_attr_extend {
    struct ibv_pd *pd;
    struct ibv_srq_init_attr attr;
    uint32_t comp_mask;
    uint32_t srq_cap_flag;
    enum queue_buf_dma_mode type;
    struct ibv_extend_ops *ops; /* the driver keeps it for the SRQ's lifetime */
    uint64_t resv[8];
};

struct ibv_device_attr_extend {
    uint32_t ext_cap; /* enum ibv_extend_device_cap bits */
    uint32_t resv[32];
};

int ibv_query_device_extend(struct ibv_context_extend *context, struct ibv_device_attr_extend *ext_dev_attr);

struct ibv_qp_extend *ibv_create_qp_extend(struct ibv_context_extend *context,
                                           struct ibv_qp_init_attr_extend *qp_init_attr);
struct ibv_cq_extend *ibv_create_cq_extend(struct ibv_context_extend *context,
                                           struct ibv_cq_init_attr_extend *cq_init_attr);
struct ibv_srq_extend *ibv_create_srq_extend(struct ibv_context_extend *context,
                                             struct ibv_srq_init_attr_extend *srq_init_attr);

int ibv_destroy_qp_extend(struct ibv_context_extend *context, struct ibv_qp_extend *qp_extend);
int ibv_destroy_cq_extend(struct ibv_context_extend *context, struct ibv_cq_extend *cq_extend);
int ibv_destroy_srq_extend(struct ibv_context_extend *context, struct ibv_srq_extend *srq_extend);

/* ---- Hyper RoCE -------------------------------------------------------------------- */

enum ibv_hyroce_feature_type {
    IBV_HYPER_FEAT_RoCEv2 = 0,
    IBV_HYPER_FEAT_VEROCE,
    IBV_HYPER_FEAT_HYPER_ROCE,
};

enum ibv_hyroce_feature_version {
    IBV_HYPER_FEAT_V0 = 0, /* V0 means plain RoCEv2 */
    IBV_HYPER_FEAT_V1,
    IBV_HYPER_FEAT_V2,
    IBV_HYPER_FEAT_V3
};

enum ibv_lb_mode {
    IBV_LB_MODE_DEFAULT = 0,
    IBV_LB_MODE_MPATH, /* multi-path */
    IBV_LB_MODE_AR     /* adaptive routing */
};

/* attr_mask bits of ibv_modify_qp_extend / ibv_query_qp_extend. */
enum ibv_qp_attr_extend_mask {
    IBV_QP_ATTR_EXTEND_UDP_SRC_PORT = 1 << 0,
    IBV_QP_ATTR_EXTEND_HYROCE_FEATURE = 1 << 1,
    IBV_QP_ATTR_EXTEND_LB_MODE = 1 << 2,
    IBV_QP_ATTR_EXTEND_MPATH_CONFIG = 1 << 3,
    IBV_QP_ATTR_EXTEND_AR_CONFIG = 1 << 4,
    IBV_QP_ATTR_EXTEND_SACK_CONFIG = 1 << 5,
    IBV_QP_ATTR_EXTEND_LAG_PORT = 1 << 6,
    IBV_QP_ATTR_EXTEND_MAX = 1 << 7
};

/* 64 bytes. */
struct ibv_hyroce_feature {
    uint8_t type;        /* enum ibv_hyroce_feature_type */
    uint8_t version;     /* enum ibv_hyroce_feature_version */
    uint8_t sack_enable; /* 0 or 1 */
    uint8_t resv[61];
};

struct ibv_mpath_config {
    uint32_t flowlet_pkg_num; /* packets per flowlet */
    uint32_t path_num;
    uint32_t interval; /* UDP source port step between paths */
    uint32_t path_rr_enable;
    uint32_t resv[32];
};

struct ibv_ar_config {
    uint32_t port_rr_enable;
    uint32_t resv[32];
};

struct ibv_sack_config {
    uint32_t srp_range; /* max packets retransmitted (TX) */
    uint32_t oor_range; /* out-of-order window (RX), packets */
    uint32_t resv[32];
};

struct ibv_qp_attr_extend {
    struct ibv_qp *qp;
    uint32_t udp_src_port;
    struct ibv_hyroce_feature feature;
    uint32_t lb_mode; /* enum ibv_lb_mode */
    struct ibv_mpath_config mpath;
    struct ibv_ar_config ar;
    struct ibv_sack_config sack;
    uint32_t resv[47];
    uint32_t lag_port;
};

int ibv_modify_qp_extend(struct ibv_context_extend *context, struct ibv_qp_attr_extend *attr, int attr_mask);
int ibv_query_qp_extend(struct ibv_context_extend *context, struct ibv_qp_attr_extend *attr, int attr_mask);

int ibv_query_qp_supported_hyroce_feature(struct ibv_context_extend *context, struct ibv_qp *qp, uint32_t sl,
                                          uint32_t tc, struct ibv_hyroce_feature *feature);

int ibv_nego_qp_hyroce_feature(struct ibv_context_extend *context, struct ibv_qp *qp,
                               const struct ibv_hyroce_feature *input, struct ibv_hyroce_feature *output,
                               uint32_t *need_more_nego);

/* ---- South-bound: what an extension driver implements ----------------------------- */

struct ibv_context_extend_ops {
    int version; /* enum IBV_EXTEND_DRIVER_VERSION; must be 1..MAX */

    /* V1 */
    struct ibv_qp_extend *(*create_qp)(struct ibv_context *context,
                                       struct ibv_qp_init_attr_extend *qp_init_attr);
    struct ibv_cq_extend *(*create_cq)(struct ibv_context *context,
                                       struct ibv_cq_init_attr_extend *cq_init_attr);
    struct ibv_srq_extend *(*create_srq)(struct ibv_context *context,
                                         struct ibv_srq_init_attr_extend *srq_init_attr);
    int (*destroy_qp)(struct ibv_qp_extend *qp_extend);
    int (*destroy_cq)(struct ibv_cq_extend *cq_extend);
    int (*destroy_srq)(struct ibv_srq_extend *srq_extend);
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr_extend *ext_dev_attr);

    /* V2 */
    int (*modify_qp)(struct ibv_context *context, struct ibv_qp_attr_extend *attr, int attr_mask);
    int (*query_qp)(struct ibv_context *context, struct ibv_qp_attr_extend *attr, int attr_mask);

    /* V3 */
    int (*query_qp_supported_hyroce_feature)(struct ibv_context *context, struct ibv_qp *qp, uint32_t sl,
                                             uint32_t tc, struct ibv_hyroce_feature *feature);
    int (*nego_qp_hyroce_feature)(struct ibv_context *context, struct ibv_qp *qp,
                                  const struct ibv_hyroce_feature *input, struct ibv_hyroce_feature *output,
                                  uint32_t *need_more_nego);
};

/* A driver's registration record. `name` is the rdma-core provider name it serves
 * ("mlx5", "rxe", ...); the record must outlive the process. */
struct verbs_device_extend_ops {
    const char *name;
    struct ibv_context_extend *(*alloc_context)(struct ibv_context *context);
    void (*free_context)(struct ibv_context_extend *context);
};

void verbs_register_driver_extend(const struct verbs_device_extend_ops *ops);

/* Registers a driver when its shared object is loaded. */
#define PROVIDER_EXTEND_DRIVER(drv)                                                \
    static __attribute__((constructor)) void drv##__register_extend_driver(void) { \
        verbs_register_driver_extend(&drv);                                        \
    }

#ifdef __cplusplus
}
#endif

#endif /* IBV_EXTEND_H */
