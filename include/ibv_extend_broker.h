/*
 * ibv_extend_broker.h - additions to ibv_extend.h for tenants of the ibv-extendd broker.
 *
 * In broker mode (IBV_EXTEND_MODE=broker, or auto with a broker answering on IBV_EXTEND_SOCKET /
 * /run/ibv-extend/broker.sock) the queues, PDs and MRs live in the broker process. The client
 * gets *shadow* objects: struct ibv_qp / ibv_cq / ibv_srq / ibv_pd / ibv_mr values that carry
 * the numbers a program reads (qp_num, qp_type, state, lkey, rkey, ...) but belong to no
 * libibverbs context. NEVER pass a shadow object to a libibverbs function (ibv_modify_qp,
 * ibv_query_qp, ibv_dealloc_pd, ibv_dereg_mr, ibv_destroy_*, ...): use the functions below,
 * which work in both modes. The queue memory and doorbells in the returned queue_info are valid
 * addresses in the calling process in both modes.
 *
 * The same functions serve devices a provider brings itself (virtual devices such as softnda0)
 * in direct mode, and forward to libibverbs for rdma-core devices in direct mode.
 *
 * In broker mode the broker allocates queue memory from its own per-session arena (host shared
 * memory, mapped into the caller), so ibv_extend_ops.alloc, free, memset_s and memcpy_s are never
 * called. db_mmap and db_unmap are: db_mmap(DB_MAP_MODE_HOST_VA, hva = the doorbell's address in
 * this process) when a queue is created, its result becomes queue_info.db_hw_va, and db_unmap
 * follows when the queue is destroyed, exactly as a driver calls them in direct mode (one call
 * per queue doorbell; queues sharing a doorbell page map it repeatedly, so db_mmap must accept
 * repeated maps). A device driving such queues must therefore reach host shared memory: the
 * rings and doorbell records by their host addresses, the doorbell through what db_mmap returned.
 *
 * The libibverbs face (docs/verbs.md) hands out the same shadow objects from the standard verbs:
 * its contexts, PDs and QPs work with the functions below and with ibv_extend.h, in one session.
 *
 * Conventions are those of ibv_extend.h: int functions return 0 or a negative errno, pointer
 * functions return NULL and set errno. Plain C; compiles on its own in C and C++.
 */
#ifndef IBV_EXTEND_BROKER_H
#define IBV_EXTEND_BROKER_H

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IBVX_DEVICE_NAME_MAX 64

/* One device as the calling process sees it (through the broker in broker mode). */
struct ibvx_device_info {
    char name[IBVX_DEVICE_NAME_MAX];     /* "softnda0", "mlx5_0", ... */
    char provider[IBVX_DEVICE_NAME_MAX]; /* extension driver name serving it */
    uint32_t ext_cap;                    /* enum ibv_extend_device_cap bits */
    uint32_t driver_version;             /* enum IBV_EXTEND_DRIVER_VERSION of its driver */
    uint32_t phys_port_cnt;
    uint32_t max_qp;
    uint32_t max_cq;
    uint32_t max_srq;
    uint32_t max_mr;
    uint32_t max_qp_wr;
    uint32_t max_cqe;
    uint32_t max_srq_wr;
    uint32_t max_sge;
    uint32_t max_inline_data;
    uint32_t max_msg_sz;
    uint32_t resv0;
    uint64_t max_mr_size;
    uint64_t resv[8];
};

/* "broker" or "direct": the mode this process resolved (resolving it on first call). */
const char *ibvx_mode(void);

/* Fills up to max entries; returns the number of devices (may exceed max) or a negative errno. */
int ibvx_list_devices(struct ibvx_device_info *devices, int max);

/* Opens a device by name and its extension context in one step. Close with ibvx_close_device(). */
struct ibv_context_extend *ibvx_open_device(const char *name);
int ibvx_close_device(struct ibv_context_extend *context);

struct ibv_pd *ibvx_alloc_pd(struct ibv_context_extend *context);
int ibvx_dealloc_pd(struct ibv_pd *pd);

/* Page-aligned memory backed by a memfd, shareable with the broker; free with ibvx_free_buf(). */
void *ibvx_alloc_buf(size_t size);
void ibvx_free_buf(void *buf);

/* Registers memory for RDMA access (enum ibv_access_flags). In broker mode the broker can only
 * reach memory passed to it as an fd: an ibvx_alloc_buf() buffer is passed as it is; any other
 * private memory (heap, anonymous mmap, static data) has its pages moved onto shared memory at the
 * same address first (docs/verbs.md, "Memory registration"); shared file mappings and device
 * memory are refused with EINVAL. */
struct ibv_mr *ibvx_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access);
/* Registers [offset, offset+length) of a memfd or dma-buf the caller owns. The broker keeps its
 * own reference; the caller may close fd afterwards. mr->addr is NULL (no local mapping). */
struct ibv_mr *ibvx_reg_mr_fd(struct ibv_pd *pd, int fd, uint64_t offset, size_t length, int access);
int ibvx_dereg_mr(struct ibv_mr *mr);

/* Standard QP attribute modify/query (enum ibv_qp_attr_mask) on a QP from
 * ibv_create_qp_extend(). Updates qp->state on success. */
int ibvx_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ibvx_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                  struct ibv_qp_init_attr *init_attr);

#ifdef __cplusplus
}
#endif

#endif /* IBV_EXTEND_BROKER_H */
