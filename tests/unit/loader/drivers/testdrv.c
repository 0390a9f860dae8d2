/* An extension driver serving the rdma-core provider name TESTDRV_NAME. */
#include "testdrv_core.h"

static const struct verbs_device_extend_ops testdrv_ops = {
    .name = TESTDRV_NAME,
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};

PROVIDER_EXTEND_DRIVER(testdrv_ops)
