/*
 * ibv_extend_vdev.h - south-bound addition for virtual devices.
 *
 * The reference ABI matches extension drivers to rdma-core devices by provider name. A software
 * NIC such as softnda has no rdma-core ibv_device, so it brings its devices itself: it registers
 * one struct ibv_extend_vdev_ops (next to its ordinary struct verbs_device_extend_ops, with the
 * same provider name) that lists its devices, opens an ibv_context for one, and provides the
 * standard verbs the library cannot get from libibverbs for such a context (PD, MR, QP state).
 *
 * The contexts a virtual device hands out are not libibverbs contexts: libibverbs functions must
 * not be called on them or on objects created from them; use the ops below instead. The
 * reference functions (ibv_open_extend() on such a context, ibv_create_qp_extend(), ...) work
 * unchanged. Nothing in ibv_extend.h changes: this addition is purely additive.
 *
 * Every ibv_pd, ibv_mr, ibv_qp, ibv_cq and ibv_srq a provider returns for such a context must have
 * its `context` member set: the library dispatches calls on them by it.
 *
 * Return conventions follow ibv_extend.h: negative errno from int functions, NULL + errno from
 * pointer functions. Plain C; compiles on its own in C and C++.
 */
#ifndef IBV_EXTEND_VDEV_H
#define IBV_EXTEND_VDEV_H

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI a provider's struct ibv_extend_vdev_ops was built against. V1 ends at export_mmio;
 * V2 adds query_counters; V3 adds query_device, query_port, query_gid (what the libibverbs
 * face answers ibv_query_device/_port/_gid with) and the event fds. The library reads an entry only when the
 * provider's abi has it, so an older provider (a shorter struct) keeps working unchanged. */
#define IBV_EXTEND_VDEV_ABI_V1 1
#define IBV_EXTEND_VDEV_ABI_V2 2
#define IBV_EXTEND_VDEV_ABI_V3 3
#define IBV_EXTEND_VDEV_ABI_MAX IBV_EXTEND_VDEV_ABI_V3
#define IBV_EXTEND_VDEV_NAME_MAX 64

/* What a virtual device announces about itself. */
struct ibv_extend_vdev_attr {
    char name[IBV_EXTEND_VDEV_NAME_MAX]; /* unique device name, e.g. "softnda0" */
    uint32_t phys_port_cnt;
    uint32_t max_pd;
    uint32_t max_mr;
    uint32_t max_qp;
    uint32_t max_cq;
    uint32_t max_srq;
    uint32_t max_qp_wr;  /* max SQ/RQ depth */
    uint32_t max_cqe;    /* max CQ depth */
    uint32_t max_srq_wr; /* max SRQ depth */
    uint32_t max_sge;
    uint32_t max_inline_data; /* bytes */
    uint32_t max_msg_sz;      /* bytes */
    uint64_t max_mr_size;     /* bytes */
    uint64_t resv[8];
};

struct ibv_extend_vdev_ops {
    uint32_t abi;         /* IBV_EXTEND_VDEV_ABI_V1 or _V2 (see above) */
    const char *provider; /* provider name; equals the name of the matching verbs_device_extend_ops */

    /* Sets a provider option before its devices are opened ("devices", "max_qp", ...).
     * -EINVAL for an unknown key or bad value, -EBUSY once a device is open. May be NULL. */
    int (*configure)(const char *key, const char *value);

    /* Fills up to max entries; returns the number of devices the provider has (may exceed max). */
    int (*query_devices)(struct ibv_extend_vdev_attr *attrs, int max);

    /* Opens a device by name; ibv_open_extend() accepts the result. NULL + errno on failure. */
    struct ibv_context *(*open_device)(const char *name);
    int (*close_device)(struct ibv_context *context);

    /* Non-zero when dev is one of this provider's virtual devices. */
    int (*is_own_device)(const struct ibv_device *dev);

    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);

    /* Registers [addr, addr+length) of the calling process's memory, addressed by work
     * requests (local SGEs and remote RDMA addresses alike) as [iova, iova+length), as
     * ibv_reg_mr_iova() does. Direct mode passes iova == (uintptr_t)addr; a broker passes the
     * tenant's own address of the same memory, so tenants post the addresses they know.
     * mr->addr reports iova. */
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
    int (*dereg_mr)(struct ibv_mr *mr);

    /* Standard QP state machine (RESET->INIT->RTR->RTS->SQD/SQE/ERR) on QPs created through
     * ibv_create_qp_extend() on this provider's contexts. */
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                    struct ibv_qp_init_attr *init_attr);

    /* Device memory-mapped I/O (doorbell registers) is ordinary shared memory in a virtual
     * device. Given an address inside such a page, returns a new fd (the caller closes it) and
     * the offset of the page-aligned range [addr & ~4095, ...) in it, so a broker can map the
     * same doorbell into another process. -ENOENT when addr is not device MMIO. May be NULL. */
    int (*export_mmio)(const void *addr, int *fd, uint64_t *offset);

    /* Counters the provider keeps for one of its devices (an engine's WQEs, bytes, CQEs, ...),
     * for an operator: calls emit(arg, name, value) once per counter, in a stable order, before
     * returning. name is valid only during the call. 0, or -ENODEV (not one of its devices) /
     * -EINVAL (NULL argument). May be NULL: the provider reports no counters. ABI V2 and later
     * only: it is never read from a V1 provider. */
    int (*query_counters)(const char *device, void (*emit)(void *arg, const char *name, uint64_t value),
                          void *arg);

    /* ---- ABI V3 and later (never read from an older provider) ----
     * The standard queries, so a virtual device answers ibv_query_device(), ibv_query_port() and
     * ibv_query_gid() like an rdma-core device (a broker serves them to tenants through the
     * libibverbs face). Each fills the whole struct (zero what does not apply) and returns 0 or a
     * negative errno: -EINVAL for a port outside 1..phys_port_cnt or a GID index outside
     * 0..gid_tbl_len-1. May be NULL: the call then answers -EOPNOTSUPP. A virtual device's P_Key
     * table is the default one: pkey_tbl_len entries of full-membership 0xffff. */
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
    /* entry->gid, gid_index, port_num and gid_type (enum ibv_gid_type); ndev_ifindex 0. */
    int (*query_gid)(struct ibv_context *context, uint8_t port_num, uint32_t index,
                     struct ibv_gid_entry *entry);

    /* Event delivery (ABI V3). The device signals fd (adds 1 to an eventfd) when it raises a
     * completion event on cq (set_cq_event_fd) or an async event on any object of context
     * (set_async_event_fd); which object, the consumer reads from the queues' memory (the
     * driver's spec says how). The provider dups fd; fd = -1 detaches. 0 or a negative errno.
     * May be NULL: events are then not raised. */
    int (*set_cq_event_fd)(struct ibv_cq *cq, int fd);
    int (*set_async_event_fd)(struct ibv_context *context, int fd);
};

void verbs_register_vdev_extend(const struct ibv_extend_vdev_ops *ops);

#define PROVIDER_EXTEND_VDEV(vops)                                                \
    static __attribute__((constructor)) void vops##__register_extend_vdev(void) { \
        verbs_register_vdev_extend(&(vops));                                      \
    }

#ifdef __cplusplus
}
#endif

#endif /* IBV_EXTEND_VDEV_H */
