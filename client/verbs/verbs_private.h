/*
 * verbs_private.h - what libibv_extend.so serves the libibverbs face.
 *
 * The face (a libibverbs.so.1 for brokered devices) and libibv_extend.so must share one broker
 * session per process: ibv_open_extend() on a context the face opened is the same broker
 * context, ibv_create_qp_extend() takes a PD the face allocated. So every verb the face serves
 * is implemented inside libibv_extend.so, next to the session and the shadow objects (the face's
 * logic: the C++ files beside this header, listed in face.h), and exported from it under the
 * private version node IBVX_VERBS_PRIVATE_1; the face's ibv_* entry points forward to these
 * (served.c).
 * Nothing outside this project may call them: the node is private and may change in any
 * release, like libibverbs' own IBVERBS_PRIVATE_*.
 *
 * Each function has the prototype and the return convention of the libibverbs verb of the same
 * name (ibvx_verbs_X <-> ibv_X): NULL + errno, an errno return, or -1 + errno, as libibverbs
 * documents for that verb. Plain C; compiles on its own in C and C++.
 */
#ifndef IBVX_VERBS_PRIVATE_H
#define IBVX_VERBS_PRIVATE_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices and contexts. */
struct ibv_device **ibvx_verbs_get_device_list(int *num_devices);
void ibvx_verbs_free_device_list(struct ibv_device **list);
const char *ibvx_verbs_get_device_name(struct ibv_device *device);
__be64 ibvx_verbs_get_device_guid(struct ibv_device *device);
int ibvx_verbs_get_device_index(struct ibv_device *device);
struct ibv_context *ibvx_verbs_open_device(struct ibv_device *device);
int ibvx_verbs_close_device(struct ibv_context *context);
/* rdma-core's shared-object API, within one process (imports.cpp). */
struct ibv_context *ibvx_verbs_import_device(int cmd_fd);
struct ibv_pd *ibvx_verbs_import_pd(struct ibv_context *context, uint32_t pd_handle);
void ibvx_verbs_unimport_pd(struct ibv_pd *pd);
struct ibv_mr *ibvx_verbs_import_mr(struct ibv_pd *pd, uint32_t mr_handle);
void ibvx_verbs_unimport_mr(struct ibv_mr *mr);
struct ibv_dm *ibvx_verbs_import_dm(struct ibv_context *context, uint32_t dm_handle);
void ibvx_verbs_unimport_dm(struct ibv_dm *dm);

/* Queries. query_port fills a whole struct ibv_port_attr. */
int ibvx_verbs_query_device(struct ibv_context *context, struct ibv_device_attr *attr);
int ibvx_verbs_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
int ibvx_verbs_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid);
int ibvx_verbs_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                            struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size);
ssize_t ibvx_verbs_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                                   size_t max_entries, uint32_t flags, size_t entry_size);
/* ibv_query_gid_type (IBVERBS_PRIVATE_34): *type is rdma-core's enum ibv_gid_type_sysfs, which
 * <infiniband/verbs.h> does not carry: 0 = IB / RoCE v1, 1 = RoCE v2. */
int ibvx_verbs_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type);
int ibvx_verbs_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey);
int ibvx_verbs_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey);

/* Protection domains and memory regions (ordinary memory: heap, mmap, static data). */
struct ibv_pd *ibvx_verbs_alloc_pd(struct ibv_context *context);
int ibvx_verbs_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *ibvx_verbs_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned int access);
int ibvx_verbs_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                        int access);
int ibvx_verbs_dereg_mr(struct ibv_mr *mr);

/* Queues. */
struct ibv_comp_channel *ibvx_verbs_create_comp_channel(struct ibv_context *context);
int ibvx_verbs_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *ibvx_verbs_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector);
int ibvx_verbs_destroy_cq(struct ibv_cq *cq);
int ibvx_verbs_resize_cq(struct ibv_cq *cq, int cqe);
int ibvx_verbs_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
void ibvx_verbs_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);
struct ibv_qp *ibvx_verbs_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr);
int ibvx_verbs_destroy_qp(struct ibv_qp *qp);
/* ibv_attach_mcast (attach != 0) and ibv_detach_mcast. */
int ibvx_verbs_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid, int attach);
int ibvx_verbs_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ibvx_verbs_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                        struct ibv_qp_init_attr *init_attr);
struct ibv_srq *ibvx_verbs_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr);
int ibvx_verbs_destroy_srq(struct ibv_srq *srq);
int ibvx_verbs_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask);
int ibvx_verbs_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr);
/* The ibv_wr_* post API of a QP made by ibv_create_qp_ex() with send_ops_flags; NULL + EOPNOTSUPP
 * for any other QP. */
struct ibv_qp_ex *ibvx_verbs_qp_to_qp_ex(struct ibv_qp *qp);
struct ibv_ah *ibvx_verbs_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr);
int ibvx_verbs_destroy_ah(struct ibv_ah *ah);

/* Async events of a context (its async_fd). */
int ibvx_verbs_get_async_event(struct ibv_context *context, struct ibv_async_event *event);
void ibvx_verbs_ack_async_event(struct ibv_async_event *event);

/* fork() support: see docs/verbs.md ("Memory registration"). */
int ibvx_verbs_fork_init(void);
enum ibv_fork_status ibvx_verbs_is_fork_initialized(void);

#ifdef __cplusplus
}
#endif

#endif /* IBVX_VERBS_PRIVATE_H */
