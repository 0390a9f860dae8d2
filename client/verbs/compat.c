/*
 * The compat (non-default) versions rdma-core 44 still exports: IBVERBS_1.0, the pre-2006 ABI
 * whose structures differ from today's (struct ibv_device_1_0 and friends), and
 * ibv_register_driver@IBVERBS_1.1, the old provider registration. Only binaries linked against
 * that ancient ABI bind them; a new link binds the default (@@) versions in served.c. The face
 * offers no 1.0 devices, so every 1.0 entry fails the libibverbs way: NULL with
 * errno = EOPNOTSUPP, an EOPNOTSUPP return, nothing for a void one. Their 1.0 structures are
 * opaque pointers here: none is ever dereferenced.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "client/verbs/face_export.h"

/* impl is exported as name@IBVERBS_1.0 only; libibverbs.map's `local: *` hides impl itself. */
#define IBVX_COMPAT_1_0(impl, name) __asm__(".symver " #impl ", " #name "@IBVERBS_1.0")

/* Unused parameters are the point: compiled without -Wunused-parameter (CMakeLists.txt). */

IBVX_FACE_EXPORT void **ibvx_compat_get_device_list(int *num_devices) {
    if (num_devices)
        *num_devices = 0;
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_get_device_list, ibv_get_device_list);
IBVX_FACE_EXPORT void ibvx_compat_free_device_list(void **list) {}
IBVX_COMPAT_1_0(ibvx_compat_free_device_list, ibv_free_device_list);
IBVX_FACE_EXPORT const char *ibvx_compat_get_device_name(void *device) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_get_device_name, ibv_get_device_name);
IBVX_FACE_EXPORT uint64_t ibvx_compat_get_device_guid(void *device) {
    errno = EOPNOTSUPP;
    return 0;
}
IBVX_COMPAT_1_0(ibvx_compat_get_device_guid, ibv_get_device_guid);
IBVX_FACE_EXPORT void *ibvx_compat_open_device(void *device) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_open_device, ibv_open_device);
IBVX_FACE_EXPORT int ibvx_compat_close_device(void *context) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_close_device, ibv_close_device);
IBVX_FACE_EXPORT int ibvx_compat_get_async_event(void *context, void *event) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_get_async_event, ibv_get_async_event);
IBVX_FACE_EXPORT void ibvx_compat_ack_async_event(void *event) {}
IBVX_COMPAT_1_0(ibvx_compat_ack_async_event, ibv_ack_async_event);
IBVX_FACE_EXPORT int ibvx_compat_query_device(void *context, void *device_attr) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_device, ibv_query_device);
IBVX_FACE_EXPORT int ibvx_compat_query_port(void *context, uint8_t port_num, void *port_attr) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_port, ibv_query_port);
IBVX_FACE_EXPORT int ibvx_compat_query_gid(void *context, uint8_t port_num, int index, void *gid) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_gid, ibv_query_gid);
IBVX_FACE_EXPORT int ibvx_compat_query_pkey(void *context, uint8_t port_num, int index, uint16_t *pkey) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_pkey, ibv_query_pkey);
IBVX_FACE_EXPORT void *ibvx_compat_alloc_pd(void *context) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_alloc_pd, ibv_alloc_pd);
IBVX_FACE_EXPORT int ibvx_compat_dealloc_pd(void *pd) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_dealloc_pd, ibv_dealloc_pd);
IBVX_FACE_EXPORT void *ibvx_compat_reg_mr(void *pd, void *addr, size_t length, int access) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_reg_mr, ibv_reg_mr);
IBVX_FACE_EXPORT int ibvx_compat_dereg_mr(void *mr) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_dereg_mr, ibv_dereg_mr);
IBVX_FACE_EXPORT void *ibvx_compat_create_cq(void *context, int cqe, void *cq_context, void *channel,
                                             int comp_vector) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_create_cq, ibv_create_cq);
IBVX_FACE_EXPORT int ibvx_compat_resize_cq(void *cq, int cqe) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_resize_cq, ibv_resize_cq);
IBVX_FACE_EXPORT int ibvx_compat_destroy_cq(void *cq) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_destroy_cq, ibv_destroy_cq);
IBVX_FACE_EXPORT int ibvx_compat_get_cq_event(void *channel, void **cq, void **cq_context) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_get_cq_event, ibv_get_cq_event);
IBVX_FACE_EXPORT void ibvx_compat_ack_cq_events(void *cq, unsigned int nevents) {}
IBVX_COMPAT_1_0(ibvx_compat_ack_cq_events, ibv_ack_cq_events);
IBVX_FACE_EXPORT void *ibvx_compat_create_srq(void *pd, void *srq_init_attr) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_create_srq, ibv_create_srq);
IBVX_FACE_EXPORT int ibvx_compat_modify_srq(void *srq, void *srq_attr, int srq_attr_mask) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_modify_srq, ibv_modify_srq);
IBVX_FACE_EXPORT int ibvx_compat_query_srq(void *srq, void *srq_attr) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_srq, ibv_query_srq);
IBVX_FACE_EXPORT int ibvx_compat_destroy_srq(void *srq) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_destroy_srq, ibv_destroy_srq);
IBVX_FACE_EXPORT void *ibvx_compat_create_qp(void *pd, void *qp_init_attr) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_create_qp, ibv_create_qp);
IBVX_FACE_EXPORT int ibvx_compat_query_qp(void *qp, void *attr, int attr_mask, void *init_attr) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_query_qp, ibv_query_qp);
IBVX_FACE_EXPORT int ibvx_compat_modify_qp(void *qp, void *attr, int attr_mask) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_modify_qp, ibv_modify_qp);
IBVX_FACE_EXPORT int ibvx_compat_destroy_qp(void *qp) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_destroy_qp, ibv_destroy_qp);
IBVX_FACE_EXPORT void *ibvx_compat_create_ah(void *pd, void *attr) {
    return ibvx_unsupported_ptr();
}
IBVX_COMPAT_1_0(ibvx_compat_create_ah, ibv_create_ah);
IBVX_FACE_EXPORT int ibvx_compat_destroy_ah(void *ah) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_destroy_ah, ibv_destroy_ah);
IBVX_FACE_EXPORT int ibvx_compat_attach_mcast(void *qp, void *gid, uint16_t lid) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_attach_mcast, ibv_attach_mcast);
IBVX_FACE_EXPORT int ibvx_compat_detach_mcast(void *qp, void *gid, uint16_t lid) {
    return ibvx_unsupported_int();
}
IBVX_COMPAT_1_0(ibvx_compat_detach_mcast, ibv_detach_mcast);

/* The pre-1.2 provider registration: like verbs_register_driver_34, a no-op, because the face's
 * devices come from the broker and no provider is consulted. */
IBVX_FACE_EXPORT void ibvx_compat_register_driver(const char *name, void *init_func) {}
__asm__(".symver ibvx_compat_register_driver, ibv_register_driver@IBVERBS_1.1");
