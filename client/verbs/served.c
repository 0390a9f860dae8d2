/*
 * The verbs the face serves: each entry point forwards to libibv_extend.so, where the broker
 * session lives (verbs_private.h says why). The version node each name is exported under
 * is in libibverbs.map; the names here are rdma-core 44's default (@@) versions.
 */
#include <infiniband/verbs.h>

#include "client/verbs/verbs_private.h"

/* <infiniband/verbs.h> turns these names into inline wrappers; the face defines the symbols. */
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_query_port

#define IBVX_EXPORT __attribute__((visibility("default")))

IBVX_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices) {
    return ibvx_verbs_get_device_list(num_devices);
}
IBVX_EXPORT void ibv_free_device_list(struct ibv_device **list) {
    ibvx_verbs_free_device_list(list);
}
IBVX_EXPORT const char *ibv_get_device_name(struct ibv_device *device) {
    return ibvx_verbs_get_device_name(device);
}
IBVX_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device) {
    return ibvx_verbs_get_device_guid(device);
}
IBVX_EXPORT int ibv_get_device_index(struct ibv_device *device) {
    return ibvx_verbs_get_device_index(device);
}
IBVX_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device) {
    return ibvx_verbs_open_device(device);
}
IBVX_EXPORT int ibv_close_device(struct ibv_context *context) {
    return ibvx_verbs_close_device(context);
}

/* Within one process only (imports.cpp): a context of another process answers EOPNOTSUPP. */
IBVX_EXPORT struct ibv_context *ibv_import_device(int cmd_fd) {
    return ibvx_verbs_import_device(cmd_fd);
}
IBVX_EXPORT struct ibv_pd *ibv_import_pd(struct ibv_context *context, uint32_t pd_handle) {
    return ibvx_verbs_import_pd(context, pd_handle);
}
IBVX_EXPORT void ibv_unimport_pd(struct ibv_pd *pd) {
    ibvx_verbs_unimport_pd(pd);
}
IBVX_EXPORT struct ibv_mr *ibv_import_mr(struct ibv_pd *pd, uint32_t mr_handle) {
    return ibvx_verbs_import_mr(pd, mr_handle);
}
IBVX_EXPORT void ibv_unimport_mr(struct ibv_mr *mr) {
    ibvx_verbs_unimport_mr(mr);
}
IBVX_EXPORT struct ibv_dm *ibv_import_dm(struct ibv_context *context, uint32_t dm_handle) {
    return ibvx_verbs_import_dm(context, dm_handle);
}
IBVX_EXPORT void ibv_unimport_dm(struct ibv_dm *dm) {
    ibvx_verbs_unimport_dm(dm);
}

IBVX_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr) {
    return ibvx_verbs_query_device(context, attr);
}
/* Reached only when the context has no verbs_context query_port (never for ours); the caller
 * cleared a whole struct ibv_port_attr. */
IBVX_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                               struct _compat_ibv_port_attr *attr) {
    return ibvx_verbs_query_port(context, port_num, (struct ibv_port_attr *)attr);
}
IBVX_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid) {
    return ibvx_verbs_query_gid(context, port_num, index, gid);
}
IBVX_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index,
                                  struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size) {
    return ibvx_verbs_query_gid_ex(context, port_num, gid_index, entry, flags, entry_size);
}
IBVX_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                                         size_t max_entries, uint32_t flags, size_t entry_size) {
    return ibvx_verbs_query_gid_table(context, entries, max_entries, flags, entry_size);
}
IBVX_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index,
                                   int *type) {
    return ibvx_verbs_query_gid_type(context, port_num, index, type);
}
IBVX_EXPORT int ibv_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey) {
    return ibvx_verbs_query_pkey(context, port_num, index, pkey);
}
IBVX_EXPORT int ibv_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey) {
    return ibvx_verbs_get_pkey_index(context, port_num, pkey);
}

IBVX_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
    return ibvx_verbs_alloc_pd(context);
}
IBVX_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd) {
    return ibvx_verbs_dealloc_pd(pd);
}
IBVX_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
    return ibvx_verbs_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}
IBVX_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                           int access) {
    return ibvx_verbs_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}
IBVX_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                            unsigned int access) {
    return ibvx_verbs_reg_mr_iova2(pd, addr, length, iova, access);
}
IBVX_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length,
                             int access) {
    return ibvx_verbs_rereg_mr(mr, flags, pd, addr, length, access);
}
IBVX_EXPORT int ibv_dereg_mr(struct ibv_mr *mr) {
    return ibvx_verbs_dereg_mr(mr);
}

IBVX_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context) {
    return ibvx_verbs_create_comp_channel(context);
}
IBVX_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel) {
    return ibvx_verbs_destroy_comp_channel(channel);
}
IBVX_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                         struct ibv_comp_channel *channel, int comp_vector) {
    return ibvx_verbs_create_cq(context, cqe, cq_context, channel, comp_vector);
}
IBVX_EXPORT int ibv_destroy_cq(struct ibv_cq *cq) {
    return ibvx_verbs_destroy_cq(cq);
}
IBVX_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe) {
    return ibvx_verbs_resize_cq(cq, cqe);
}
IBVX_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) {
    return ibvx_verbs_get_cq_event(channel, cq, cq_context);
}
IBVX_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {
    ibvx_verbs_ack_cq_events(cq, nevents);
}
IBVX_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) {
    return ibvx_verbs_create_qp(pd, attr);
}
IBVX_EXPORT int ibv_destroy_qp(struct ibv_qp *qp) {
    return ibvx_verbs_destroy_qp(qp);
}
IBVX_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
    return ibvx_verbs_mcast(qp, gid, lid, 1);
}
IBVX_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid) {
    return ibvx_verbs_mcast(qp, gid, lid, 0);
}
IBVX_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
    return ibvx_verbs_modify_qp(qp, attr, attr_mask);
}
IBVX_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                             struct ibv_qp_init_attr *init_attr) {
    return ibvx_verbs_query_qp(qp, attr, attr_mask, init_attr);
}
IBVX_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr) {
    return ibvx_verbs_create_srq(pd, attr);
}
IBVX_EXPORT int ibv_destroy_srq(struct ibv_srq *srq) {
    return ibvx_verbs_destroy_srq(srq);
}
IBVX_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask) {
    return ibvx_verbs_modify_srq(srq, attr, attr_mask);
}
IBVX_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr) {
    return ibvx_verbs_query_srq(srq, attr);
}
IBVX_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr) {
    return ibvx_verbs_create_ah(pd, attr);
}
IBVX_EXPORT int ibv_destroy_ah(struct ibv_ah *ah) {
    return ibvx_verbs_destroy_ah(ah);
}

IBVX_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event) {
    return ibvx_verbs_get_async_event(context, event);
}
IBVX_EXPORT void ibv_ack_async_event(struct ibv_async_event *event) {
    ibvx_verbs_ack_async_event(event);
}

IBVX_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp) {
    return ibvx_verbs_qp_to_qp_ex(qp);
}

IBVX_EXPORT int ibv_fork_init(void) {
    return ibvx_verbs_fork_init();
}
IBVX_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void) {
    return ibvx_verbs_is_fork_initialized();
}
