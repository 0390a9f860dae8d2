// Routes the memory rdma-core's mlx5 provider allocates for one queue object to the
// ibv_extend_ops of the call that created it.
//
// Mechanism: every extended QP/CQ/SRQ is created on its own *parent domain*
// (ibv_alloc_parent_domain with IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS). mlx5 then asks the
// parent domain's alloc/free callbacks for the object's queue buffer (MLX5DV_RES_TYPE_QP /
// _SRQ / _CQ) and its doorbell record (MLX5DV_RES_TYPE_DBR), passing back pd_context, which
// is this object's QueueMemory. So the owner of every allocation is known from the callback's
// own argument: no thread-local "call in progress" is needed, and a free that rdma-core issues
// later on another thread (destroy) still reaches the ops->free of the creating call.
//
// Why not mlx5dv_set_context_attr(MLX5DV_CTX_ATTR_BUF_ALLOCATORS): those allocators are
// per context (they would also take over the application's ordinary queues on that context),
// get no alignment or resource type, and put doorbell records of *different* objects in one
// shared page that is freed with its last user, so one owner's memory would hold another's
// records and outlive it.
//
// Doorbell records are routed to the caller's memory too: in NDA the device writes the
// SQ/RQ producer counters there, so they must be in memory the device reaches. Other resource
// types (RWQ, anything newer) answer IBV_ALLOCATOR_USE_DEFAULT.
//
// rdma-core does not clear custom-allocated queue buffers or QP/SRQ records, so every block is
// zeroed here (ops->memset_s when the caller gave one, so device memory is written the
// caller's way). mlx5 still writes CQE ownership bytes, SRQ free lists and record resets with
// CPU stores: the memory ops->alloc returns must be CPU-addressable.
#pragma once

#include <ibv_extend.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace ibvx::mlx5 {

class QueueMemory {
  public:
    // ops must outlive this object and have alloc and free (checked by the creator).
    explicit QueueMemory(const ibv_extend_ops *ops) : ops_(ops) {}
    // Returns whatever rdma-core did not free (it should be nothing) to ops->free.
    ~QueueMemory();
    QueueMemory(const QueueMemory &) = delete;
    QueueMemory &operator=(const QueueMemory &) = delete;

    // The parent-domain callbacks; pd_context is a QueueMemory*.
    static void *allocCallback(ibv_pd *pd, void *pd_context, size_t size, size_t alignment,
                               uint64_t resource_type) noexcept;
    static void freeCallback(ibv_pd *pd, void *pd_context, void *ptr, uint64_t resource_type) noexcept;

    // size bytes aligned to `alignment` (a power of two; 0 means 1) from ops->alloc, zeroed;
    // NULL on failure; IBV_ALLOCATOR_USE_DEFAULT for a resource type that is not queue memory.
    void *allocate(size_t size, size_t alignment, uint64_t resource_type);
    // Gives a block from allocate() back to ops->free; unknown pointers are ignored (warned).
    void release(void *ptr);

    static bool routes(uint64_t resource_type);
    size_t outstanding() const;
    // Bytes currently held from ops->alloc (including alignment slack).
    size_t bytesHeld() const;

  private:
    struct Block {
        void *original;  // what ops->alloc returned; ops->free gets this back
        size_t allocated;
    };

    void *allocateAligned(size_t size, size_t alignment, Block *block);

    const ibv_extend_ops *ops_;
    mutable std::mutex mu_;  // guards blocks_: creation and destroy may run on different threads
    std::unordered_map<void *, Block> blocks_;  // keyed by the aligned pointer handed to mlx5
};

}  // namespace ibvx::mlx5
