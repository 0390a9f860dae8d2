/* softnda_ops.h - the two ops tables of softnda_core. libsoftnda.so registers them from its
 * constructors (register.c); unit tests and in-process tools call them directly. Plain C. */
#ifndef SOFTNDA_OPS_H_
#define SOFTNDA_OPS_H_

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#ifdef __cplusplus
extern "C" {
#endif

extern const struct verbs_device_extend_ops softnda_driver_ops;
extern const struct ibv_extend_vdev_ops softnda_vdev_ops;

#ifdef __cplusplus
}
#endif

#endif /* SOFTNDA_OPS_H_ */
