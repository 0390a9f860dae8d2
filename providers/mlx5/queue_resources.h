// What one extended queue owns besides its verbs object: the memory router, the parent domain
// (and, for direct-WQE QPs, the thread domain) the object is created on, and the doorbell
// mapping obtained from ops->db_mmap.
#pragma once

#include <ibv_extend.h>
#include <infiniband/verbs.h>

#include "providers/mlx5/queue_memory.h"
#include "providers/mlx5/translate.h"

namespace ibvx::mlx5 {

// Released in reverse order of acquisition by the destructor (db_unmap with the desc that was
// mapped, parent domain, thread domain, then any memory rdma-core left). The verbs object
// created on domain() must already be destroyed: rdma-core frees its buffers through the
// memory router during that destroy.
class QueueResources {
  public:
    // ops must outlive this object and provide alloc, free, db_mmap and db_unmap.
    explicit QueueResources(const ibv_extend_ops *ops) : ops_(ops), memory_(ops) {}
    ~QueueResources();
    QueueResources(const QueueResources &) = delete;
    QueueResources &operator=(const QueueResources &) = delete;

    // Creates the parent domain on `base` whose allocators route to ops. dedicated_uar asks
    // for a thread domain first, which makes mlx5 give the QP a BlueFlame register of its own
    // (the device then writes whole WQEs there without racing other users of a shared one);
    // without one the QP shares a register, with a warning. 0 or a negative errno.
    int makeDomain(ibv_context *ctx, ibv_pd *base, bool dedicated_uar);
    ibv_pd *domain() const { return domain_; }

    // Maps the window through ops->db_mmap and fills db_hw_va (mapped page + offset, window
    // length). At most one mapping per queue. 0 or a negative errno (ENOMEM when db_mmap
    // returned NULL without setting errno).
    int mapDoorbell(const DoorbellWindow &window, iov_addr_desc *db_hw_va);

    QueueMemory &memory() { return memory_; }

  private:
    const ibv_extend_ops *ops_;
    QueueMemory memory_;
    ibv_td *td_ = nullptr;
    ibv_pd *domain_ = nullptr;
    void *mapped_ = nullptr;
    doorbell_map_desc desc_{};
};

}  // namespace ibvx::mlx5
