/* A second driver named "alpha" (and its own table registered twice): the first registration of
 * a name wins. */
#include "testdrv_core.h"

static const struct verbs_device_extend_ops dup_alpha = {
    .name = "alpha",
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};
static const struct verbs_device_extend_ops dup_gamma = {
    .name = "gamma",
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};

__attribute__((constructor)) static void dup_register(void) {
    verbs_register_driver_extend(&dup_alpha);
    verbs_register_driver_extend(&dup_gamma);
    verbs_register_driver_extend(&dup_gamma);
}
