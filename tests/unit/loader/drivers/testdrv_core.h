/* A small extension driver for tests: queues carved with the caller's ibv_extend_ops, every
 * call counted in a control block a test reaches with dlsym(handle, "testdrv_get_control"). */
#ifndef IBVX_TESTDRV_CORE_H
#define IBVX_TESTDRV_CORE_H

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

struct testdrv_control {
    int ops_version;  /* version of the ops table the next alloc_context hands out */
    int alloc_null;   /* alloc_context returns NULL */
    int null_ops;     /* alloc_context returns a context without ops */
    uint32_t ext_cap; /* what query_device reports */
    int alloc_calls;
    int free_calls;
    int query_device_calls;
    uint32_t query_device_seen_ext_cap; /* ext_cap on entry to query_device */
    int create_qp_calls;
    int create_cq_calls;
    int create_srq_calls;
    int destroy_qp_calls;
    int destroy_cq_calls;
    int destroy_srq_calls;
    int modify_calls;
    int query_calls;
    int last_mask;
    int hyroce_query_calls;
    int nego_calls;
    uint32_t last_sl;
    uint32_t last_tc;
    int live_queues; /* created minus destroyed */
};

struct testdrv_control *testdrv_get_control(void);

/* The driver's alloc/free_context for a provider name (the record is static storage). */
struct ibv_context_extend *testdrv_alloc_context(struct ibv_context *context);
void testdrv_free_context(struct ibv_context_extend *context);

#ifdef __cplusplus
}
#endif

#endif
