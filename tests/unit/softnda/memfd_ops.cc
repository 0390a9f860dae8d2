#include "tests/unit/softnda/memfd_ops.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"

namespace softnda_test {

MemfdArena &MemfdArena::instance() {
    static auto *a = new MemfdArena;
    return *a;
}

ibv_extend_ops *MemfdArena::ops() {
    static ibv_extend_ops o = {alloc, free, memsetS, memcpyS, dbMmap, dbUnmap};
    return &o;
}

void MemfdArena::resetCounters() {
    std::lock_guard<std::mutex> lk(mu_);
    std::memset(memcpy_calls_, 0, sizeof(memcpy_calls_));
    memset_calls_ = 0;
    db_mmap_calls_ = 0;
    fail_alloc_at_ = 0;
    fail_db_mmap_at_ = 0;
}

void MemfdArena::failAllocAt(int n) {
    std::lock_guard<std::mutex> lk(mu_);
    fail_alloc_at_ = n;
}
void MemfdArena::failDbMmapAt(int n) {
    std::lock_guard<std::mutex> lk(mu_);
    fail_db_mmap_at_ = n;
}
size_t MemfdArena::liveAllocs() {
    std::lock_guard<std::mutex> lk(mu_);
    return regions_.size();
}
size_t MemfdArena::liveBytes() {
    std::lock_guard<std::mutex> lk(mu_);
    return live_bytes_;
}
size_t MemfdArena::liveDbMappings() {
    std::lock_guard<std::mutex> lk(mu_);
    return db_maps_.size();
}
size_t MemfdArena::memcpyCalls(uint32_t direction) {
    std::lock_guard<std::mutex> lk(mu_);
    return direction < 4 ? memcpy_calls_[direction] : 0;
}
size_t MemfdArena::memsetCalls() {
    std::lock_guard<std::mutex> lk(mu_);
    return memset_calls_;
}
size_t MemfdArena::dbMmapCalls() {
    std::lock_guard<std::mutex> lk(mu_);
    return db_mmap_calls_;
}

bool MemfdArena::lookup(const void *addr, int *fd, uint64_t *offset, size_t *region_len,
                        const void **region_base) {
    std::lock_guard<std::mutex> lk(mu_);
    auto a = reinterpret_cast<uintptr_t>(addr);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) {
        return false;
    }
    --it;
    if (a >= it->first + it->second.len) {
        return false;
    }
    *fd = it->second.fd;
    *offset = a - it->first;
    *region_len = it->second.len;
    *region_base = reinterpret_cast<const void *>(it->first);
    return true;
}

bool MemfdArena::lookupDb(const void *mapped, int *fd, uint64_t *offset) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &[page, m] : db_maps_) {
        if (reinterpret_cast<uintptr_t>(mapped) - reinterpret_cast<uintptr_t>(m.va) < 4096) {
            *fd = m.fd;
            *offset = m.off;
            return true;
        }
    }
    return false;
}

void *MemfdArena::alloc(size_t size) {
    MemfdArena &a = instance();
    std::lock_guard<std::mutex> lk(a.mu_);
    if (a.fail_alloc_at_ > 0 && --a.fail_alloc_at_ == 0) {
        errno = ENOMEM;
        return nullptr;
    }
    size_t len = (size + 4095) & ~static_cast<size_t>(4095);
    int fd = memfd_create("softnda-test-queue", MFD_CLOEXEC);
    if (fd < 0) {
        return nullptr;
    }
    if (ftruncate(fd, static_cast<off_t>(len)) < 0) {
        close(fd);
        return nullptr;
    }
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return nullptr;
    }
    a.regions_[reinterpret_cast<uintptr_t>(p)] = Region{fd, len};
    a.live_bytes_ += len;
    return p;
}

void MemfdArena::free(void *ptr) {
    MemfdArena &a = instance();
    std::lock_guard<std::mutex> lk(a.mu_);
    auto it = a.regions_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == a.regions_.end()) {
        return;
    }
    munmap(ptr, it->second.len);
    close(it->second.fd);
    a.live_bytes_ -= it->second.len;
    a.regions_.erase(it);
}

void MemfdArena::memsetS(void *dst, int value, size_t count) {
    {
        MemfdArena &a = instance();
        std::lock_guard<std::mutex> lk(a.mu_);
        a.memset_calls_++;
    }
    std::memset(dst, value, count);
}

int MemfdArena::memcpyS(void *dst, size_t dst_max, void *src, size_t size, uint32_t direction) {
    if (direction > MEMCPY_DIR_DEVICE_TO_DEVICE || size > dst_max) {
        return -1;
    }
    {
        MemfdArena &a = instance();
        std::lock_guard<std::mutex> lk(a.mu_);
        a.memcpy_calls_[direction]++;
    }
    std::memcpy(dst, src, size);
    return 0;
}

void *MemfdArena::dbMmap(doorbell_map_desc *desc) {
    if (desc == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    void *host = nullptr;
    if (desc->type == DB_MAP_MODE_HOST_VA) {
        host = reinterpret_cast<void *>(desc->hva);
    } else if (desc->type == DB_MAP_MODE_UB_RES) {
        host = softnda_ub_resolve(desc->ub_res.guid_l, desc->ub_res.guid_h, desc->ub_res.bits.resource_id,
                                  desc->ub_res.bits.offset);
        if (host == nullptr) {
            return nullptr;
        }
    } else {
        errno = EINVAL;
        return nullptr;
    }
    MemfdArena &a = instance();
    std::lock_guard<std::mutex> lk(a.mu_);
    a.db_mmap_calls_++;
    if (a.fail_db_mmap_at_ > 0 && --a.fail_db_mmap_at_ == 0) {
        errno = EIO;
        return nullptr;
    }
    uintptr_t page = reinterpret_cast<uintptr_t>(host) & ~static_cast<uintptr_t>(4095);
    uintptr_t in_page = reinterpret_cast<uintptr_t>(host) & 4095;
    auto it = a.db_maps_.find(page);
    if (it != a.db_maps_.end()) {
        it->second.refs++;
        return static_cast<uint8_t *>(it->second.va) + in_page;
    }
    int fd = -1;
    uint64_t off = 0;
    int rc = softnda_vdev_ops.export_mmio(host, &fd, &off);
    if (rc < 0) {
        errno = -rc;
        return nullptr;
    }
    void *va = mapDoorbellPage(fd, off);
    if (va == nullptr) {
        close(fd);
        return nullptr;
    }
    a.db_maps_[page] = DbMap{va, 1, fd, off};
    return static_cast<uint8_t *>(va) + in_page;
}

int MemfdArena::dbUnmap(void *ptr, doorbell_map_desc *desc) {
    if (ptr == nullptr || desc == nullptr) {
        return -EINVAL;
    }
    MemfdArena &a = instance();
    std::lock_guard<std::mutex> lk(a.mu_);
    for (auto it = a.db_maps_.begin(); it != a.db_maps_.end(); ++it) {
        auto va = reinterpret_cast<uintptr_t>(it->second.va);
        if (reinterpret_cast<uintptr_t>(ptr) - va < 4096) {
            if (--it->second.refs == 0) {
                munmap(it->second.va, 4096);
                close(it->second.fd);
                a.db_maps_.erase(it);
            }
            return 0;
        }
    }
    return -ENODEV;
}

void *mapDoorbellPage(int fd, uint64_t off) {
    void *va =
        mmap(nullptr, SOFTNDA_DB_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(off));
    return va == MAP_FAILED ? nullptr : va;
}

}  // namespace softnda_test
