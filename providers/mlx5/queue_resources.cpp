#include "providers/mlx5/queue_resources.h"

#include <cerrno>

#include "providers/mlx5/warn.h"

namespace ibvx::mlx5 {

QueueResources::~QueueResources() {
    if (mapped_ != nullptr) {
        int rc = ops_->db_unmap(mapped_, &desc_);
        if (rc != 0) {
            warn("db_unmap of doorbell page %#llx failed: %d", static_cast<unsigned long long>(desc_.hva),
                 rc);
        }
    }
    if (domain_ != nullptr && ibv_dealloc_pd(domain_) != 0) {
        warn("cannot free a queue's parent domain (errno %d)", errno);
    }
    if (td_ != nullptr && ibv_dealloc_td(td_) != 0) {
        warn("cannot free a queue's thread domain (errno %d)", errno);
    }
}

int QueueResources::makeDomain(ibv_context *ctx, ibv_pd *base, bool dedicated_uar) {
    if (dedicated_uar) {
        ibv_td_init_attr td_attr{};
        td_ = ibv_alloc_td(ctx, &td_attr);
        if (td_ == nullptr) {
            warn("no dedicated BlueFlame register for a direct-WQE QP (errno %d); sharing one", errno);
        }
    }
    ibv_parent_domain_init_attr attr{};
    attr.pd = base;
    attr.td = td_;
    attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    attr.alloc = &QueueMemory::allocCallback;
    attr.free = &QueueMemory::freeCallback;
    attr.pd_context = &memory_;
    errno = 0;
    domain_ = ibv_alloc_parent_domain(ctx, &attr);
    if (domain_ == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("cannot create a parent domain with queue allocators (errno %d)", err);
        return -err;
    }
    return 0;
}

int QueueResources::mapDoorbell(const DoorbellWindow &window, iov_addr_desc *db_hw_va) {
    if (mapped_ != nullptr) {
        return -EBUSY;
    }
    desc_ = window.desc;
    errno = 0;
    void *mapped = ops_->db_mmap(&desc_);
    if (mapped == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("db_mmap of doorbell page %#llx (%llu bytes) failed (errno %d)",
             static_cast<unsigned long long>(desc_.hva), static_cast<unsigned long long>(desc_.size), err);
        return -err;
    }
    mapped_ = mapped;
    *db_hw_va = mappedRegister(mapped, window);
    return 0;
}

}  // namespace ibvx::mlx5
