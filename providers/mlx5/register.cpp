// Registers the mlx5 extension driver when libibvx_mlx5.so is loaded. The library does not
// link libibv_extend: verbs_register_driver_extend resolves from the process that loads it
// (libibv_extend.so in direct mode, ibv-extendd with the broker).
#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include "providers/mlx5/driver.h"

namespace {

const verbs_device_extend_ops mlx5_extend_driver = {
    ibvx::mlx5::kDriverName,
    ibvx::mlx5::allocContext,
    ibvx::mlx5::freeContext,
};

PROVIDER_EXTEND_DRIVER(mlx5_extend_driver)
// Its registry mutex over rdma-core's thread-safe verbs (driver.h): contexts may run in parallel.
PROVIDER_EXTEND_GUARANTEES(mlx5_extend_driver, IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS)

}  // namespace
