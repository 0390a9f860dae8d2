// The verbs the libibverbs face serves (client/verbs_private.h), on the broker session and
// shadow objects of this library.
#include <cerrno>

#include "client/verbs_private.h"

#pragma GCC diagnostic ignored "-Wunused-parameter"  // placeholder bodies: being written

extern "C" {
struct ibv_device **ibvx_verbs_get_device_list(int *num_devices) { errno = EOPNOTSUPP; return nullptr; }
void ibvx_verbs_free_device_list(struct ibv_device **list) {}
const char *ibvx_verbs_get_device_name(struct ibv_device *device) { errno = EOPNOTSUPP; return nullptr; }
__be64 ibvx_verbs_get_device_guid(struct ibv_device *device) { return 0; }
int ibvx_verbs_get_device_index(struct ibv_device *device) { return EOPNOTSUPP; }
struct ibv_context *ibvx_verbs_open_device(struct ibv_device *device) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_close_device(struct ibv_context *context) { return EOPNOTSUPP; }
int ibvx_verbs_query_device(struct ibv_context *context, struct ibv_device_attr *attr) { return EOPNOTSUPP; }
int ibvx_verbs_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr) { return EOPNOTSUPP; }
int ibvx_verbs_query_gid(struct ibv_context *context, uint8_t port_num, int index, union ibv_gid *gid) { return EOPNOTSUPP; }
int ibvx_verbs_query_gid_ex(struct ibv_context *context, uint32_t port_num, uint32_t gid_index, struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size) { return EOPNOTSUPP; }
ssize_t ibvx_verbs_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries, size_t max_entries, uint32_t flags, size_t entry_size) { return -EOPNOTSUPP; }
int ibvx_verbs_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, int *type) { return EOPNOTSUPP; }
int ibvx_verbs_query_pkey(struct ibv_context *context, uint8_t port_num, int index, __be16 *pkey) { return EOPNOTSUPP; }
int ibvx_verbs_get_pkey_index(struct ibv_context *context, uint8_t port_num, __be16 pkey) { return EOPNOTSUPP; }
struct ibv_pd *ibvx_verbs_alloc_pd(struct ibv_context *context) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_dealloc_pd(struct ibv_pd *pd) { return EOPNOTSUPP; }
struct ibv_mr *ibvx_verbs_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_dereg_mr(struct ibv_mr *mr) { return EOPNOTSUPP; }
struct ibv_comp_channel *ibvx_verbs_create_comp_channel(struct ibv_context *context) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_destroy_comp_channel(struct ibv_comp_channel *channel) { return EOPNOTSUPP; }
struct ibv_cq *ibvx_verbs_create_cq(struct ibv_context *context, int cqe, void *cq_context, struct ibv_comp_channel *channel, int comp_vector) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_destroy_cq(struct ibv_cq *cq) { return EOPNOTSUPP; }
int ibvx_verbs_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context) { return EOPNOTSUPP; }
void ibvx_verbs_ack_cq_events(struct ibv_cq *cq, unsigned int nevents) {}
struct ibv_qp *ibvx_verbs_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_destroy_qp(struct ibv_qp *qp) { return EOPNOTSUPP; }
int ibvx_verbs_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) { return EOPNOTSUPP; }
int ibvx_verbs_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask, struct ibv_qp_init_attr *init_attr) { return EOPNOTSUPP; }
struct ibv_srq *ibvx_verbs_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_destroy_srq(struct ibv_srq *srq) { return EOPNOTSUPP; }
int ibvx_verbs_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int attr_mask) { return EOPNOTSUPP; }
int ibvx_verbs_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr) { return EOPNOTSUPP; }
struct ibv_ah *ibvx_verbs_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr) { errno = EOPNOTSUPP; return nullptr; }
int ibvx_verbs_destroy_ah(struct ibv_ah *ah) { return EOPNOTSUPP; }
int ibvx_verbs_get_async_event(struct ibv_context *context, struct ibv_async_event *event) { return EOPNOTSUPP; }
void ibvx_verbs_ack_async_event(struct ibv_async_event *event) {}
int ibvx_verbs_fork_init(void) { return EOPNOTSUPP; }
enum ibv_fork_status ibvx_verbs_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }}
