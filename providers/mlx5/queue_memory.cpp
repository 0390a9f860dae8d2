#include "providers/mlx5/queue_memory.h"

#include <infiniband/mlx5dv.h>

#include <cstring>

#include "providers/mlx5/warn.h"

namespace ibvx::mlx5 {
namespace {

bool isPowerOfTwo(size_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

bool isAligned(const void *p, size_t alignment) {
    return (reinterpret_cast<uintptr_t>(p) & (alignment - 1)) == 0;
}

}  // namespace

QueueMemory::~QueueMemory() {
    for (auto &[ptr, block] : blocks_) {
        warn("queue memory %p was not freed by rdma-core; returning it to ops->free", ptr);
        ops_->free(block.original);
    }
}

bool QueueMemory::routes(uint64_t resource_type) {
    return resource_type == MLX5DV_RES_TYPE_QP || resource_type == MLX5DV_RES_TYPE_SRQ ||
           resource_type == MLX5DV_RES_TYPE_CQ || resource_type == MLX5DV_RES_TYPE_DBR;
}

// rdma-core calls these from C: nothing may throw out of them.
void *QueueMemory::allocCallback(ibv_pd *, void *pd_context, size_t size, size_t alignment,
                                 uint64_t resource_type) noexcept {
    return static_cast<QueueMemory *>(pd_context)->allocate(size, alignment, resource_type);
}

void QueueMemory::freeCallback(ibv_pd *, void *pd_context, void *ptr, uint64_t) noexcept {
    static_cast<QueueMemory *>(pd_context)->release(ptr);
}

// Most allocators (the broker's arena, device allocators) hand out page-aligned blocks, so
// ask for the exact size first and pay the alignment slack only when the block is misaligned.
void *QueueMemory::allocateAligned(size_t size, size_t alignment, Block *block) {
    void *p = ops_->alloc(size);
    if (p == nullptr) {
        return nullptr;
    }
    if (isAligned(p, alignment)) {
        *block = Block{p, size};
        return p;
    }
    ops_->free(p);
    if (size > SIZE_MAX - (alignment - 1)) {
        return nullptr;
    }
    size_t padded = size + alignment - 1;
    p = ops_->alloc(padded);
    if (p == nullptr) {
        return nullptr;
    }
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(p) + alignment - 1) & ~uintptr_t{alignment - 1};
    *block = Block{p, padded};
    return reinterpret_cast<void *>(aligned);
}

void *QueueMemory::allocate(size_t size, size_t alignment, uint64_t resource_type) {
    if (!routes(resource_type)) {
        return IBV_ALLOCATOR_USE_DEFAULT;
    }
    if (alignment == 0) {
        alignment = 1;
    }
    if (size == 0 || !isPowerOfTwo(alignment)) {
        warn("refusing queue allocation of %zu bytes aligned to %zu", size, alignment);
        return nullptr;
    }
    Block block{};
    void *p = allocateAligned(size, alignment, &block);
    if (p == nullptr) {
        warn("ops->alloc failed for %zu bytes (resource type %#llx)", size,
             static_cast<unsigned long long>(resource_type));
        return nullptr;
    }
    if (ops_->memset_s != nullptr) {
        ops_->memset_s(p, 0, size);
    } else {
        std::memset(p, 0, size);
    }
    try {
        std::lock_guard lock(mu_);
        blocks_.emplace(p, block);
    } catch (...) {  // no room to remember the block: hand it back rather than lose it
        ops_->free(block.original);
        return nullptr;
    }
    return p;
}

void QueueMemory::release(void *ptr) {
    if (ptr == nullptr) {
        return;
    }
    Block block{};
    {
        std::lock_guard lock(mu_);
        auto it = blocks_.find(ptr);
        if (it == blocks_.end()) {
            warn("free of %p that this queue did not allocate; ignored", ptr);
            return;
        }
        block = it->second;
        blocks_.erase(it);
    }
    ops_->free(block.original);
}

size_t QueueMemory::outstanding() const {
    std::lock_guard lock(mu_);
    return blocks_.size();
}

size_t QueueMemory::bytesHeld() const {
    std::lock_guard lock(mu_);
    size_t total = 0;
    for (const auto &[ptr, block] : blocks_) {
        total += block.allocated;
    }
    return total;
}

}  // namespace ibvx::mlx5
