// The mlx5 extension driver: ibv_extend's south-bound ops implemented on rdma-core's mlx5
// provider (mlx5dv). register.cpp registers it as "mlx5" so it serves rdma-core mlx5 devices.
//
// Per object: an extended QP/CQ/SRQ is a standard verbs object created on its own parent
// domain whose allocators route queue buffers and doorbell records to the creating call's
// ibv_extend_ops (queue_memory.h), plus the doorbell register mapped through ops->db_mmap.
// Its queue_info comes from mlx5dv_init_obj() through translate.h.
//
// Threading: every op may be called from any thread. One process-wide registry (a mutex over
// maps) knows the contexts alloc_context opened and the objects this driver created, so a
// destroy or modify of a pointer the driver did not hand out answers -EINVAL instead of
// touching it. Two destroys of one object race safely: the first claims it from the registry.
#pragma once

#include <ibv_extend.h>

namespace ibvx::mlx5 {

inline constexpr const char *kDriverName = "mlx5";

// verbs_device_extend_ops entry points. allocContext answers NULL with errno EINVAL for a
// NULL context and EOPNOTSUPP for a device mlx5 does not drive.
ibv_context_extend *allocContext(ibv_context *context);
void freeContext(ibv_context_extend *context);

// The ops table alloc_context hands out (version V3).
const ibv_context_extend_ops &contextOps();

}  // namespace ibvx::mlx5
