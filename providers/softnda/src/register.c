/* The module's only addition to softnda_core: register the driver and the virtual devices with
 * whichever process loaded libsoftnda.so (libibv_extend.so or the broker). */
#include "providers/softnda/include/softnda_ops.h"

PROVIDER_EXTEND_DRIVER(softnda_driver_ops)
PROVIDER_EXTEND_VDEV(softnda_vdev_ops)
