/* Registers everything a loader must refuse, then one valid driver ("badreg_ok") to show the
 * load itself went on. */
#include <ibv_extend_vdev.h>

#include "testdrv_core.h"

static const struct verbs_device_extend_ops nameless = {
    .name = NULL,
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};
static const struct verbs_device_extend_ops ok = {
    .name = "badreg_ok",
    .alloc_context = testdrv_alloc_context,
    .free_context = testdrv_free_context,
};
static const struct ibv_extend_vdev_ops vdev_nameless = {.abi = IBV_EXTEND_VDEV_ABI_V1, .provider = NULL};
static const struct ibv_extend_vdev_ops vdev_bad_abi = {.abi = 99, .provider = "badreg_abi"};

__attribute__((constructor)) static void badreg_register(void) {
    verbs_register_driver_extend(NULL);
    verbs_register_driver_extend(&nameless);
    verbs_register_vdev_extend(NULL);
    verbs_register_vdev_extend(&vdev_nameless);
    verbs_register_vdev_extend(&vdev_bad_abi);
    verbs_register_driver_extend(&ok);
}
