// Device memory (SPEC.md §17, vdev ABI V10): a region of dm_size bytes per device, allocated
// first fit in 64-byte units; an allocation's bytes come from the creator's ops->alloc, as a
// queue's do. A region registered on it is an ordinary Mr addressed zero-based, so the engine
// reaches device memory through the key table like any other memory.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

constexpr int kDmMrAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// Whether [offset, offset + length) lies inside the first `size` bytes, without overflow.
bool inside(uint64_t offset, uint64_t length, uint64_t size) {
    return offset <= size && length <= size - offset;
}

// The start of the first free range of the region with `len` bytes at `align` into *out; false
// when there is none. Caller holds Device::ctl.
bool findFree(const Device &dev, uint64_t len, uint64_t align, uint64_t *out) {
    uint64_t at = 0;
    for (const auto &[offset, used] : dev.dm_used) {
        if (offset >= at && offset - at >= len) {
            break;
        }
        at = (offset + used + align - 1) & ~(align - 1);
    }
    if (!inside(at, len, dev.cfg.dm_size)) {
        return false;
    }
    *out = at;
    return true;
}

// Whether [offset, offset + len) overlaps no allocation (caller holds Device::ctl).
bool rangeFree(const Device &dev, uint64_t offset, uint64_t len) {
    auto next = dev.dm_used.lower_bound(offset);
    if (next != dev.dm_used.end() && next->first < offset + len) {
        return false;
    }
    if (next != dev.dm_used.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second > offset) {
            return false;
        }
    }
    return true;
}

// A copy's range: inside the allocation and in whole 32-bit words (SPEC.md §17, mlx5's rule).
bool copyRange(const Dm &dm, uint64_t offset, uint64_t length) {
    return offset % 4 == 0 && length % 4 == 0 && inside(offset, length, dm.asked);
}

// ibv_memcpy_{to,from}_dm: an errno (positive) as rdma-core's providers answer; they never throw.
int copyToDm(ibv_dm *ib, uint64_t offset, const void *src, size_t length) {
    Dm *dm = asDm(ib);
    if (dm == nullptr || (src == nullptr && length != 0) || !copyRange(*dm, offset, length)) {
        return EINVAL;
    }
    std::memcpy(dm->mem + offset, src, length);
    return 0;
}

int copyFromDm(void *dst, ibv_dm *ib, uint64_t offset, size_t length) {
    Dm *dm = asDm(ib);
    if (dm == nullptr || (dst == nullptr && length != 0) || !copyRange(*dm, offset, length)) {
        return EINVAL;
    }
    std::memcpy(dst, dm->mem + offset, length);
    return 0;
}

ibv_dm *buildDm(Context *ctx, ibv_extend_ops *ops, uint8_t *mem, uint64_t offset, uint64_t len,
                uint64_t asked) {
    auto *dm = new Dm;
    dm->magic = kMagicDm;
    dm->ctx = ctx;
    dm->ops = ops;
    dm->mem = mem;
    dm->offset = offset;
    dm->len = len;
    dm->asked = asked;
    dm->ib.context = &ctx->ib;
    dm->ib.memcpy_to_dm = copyToDm;
    dm->ib.memcpy_from_dm = copyFromDm;
    ctx->dev->dm_used.emplace(offset, len);
    ctx->objects++;
    return &dm->ib;
}

}  // namespace

ibv_dm *allocDm(ibv_context *context, const ibv_alloc_dm_attr *attr, ibv_extend_ops *ops) {
    Context *ctx = asContext(context);
    if (ctx == nullptr || attr == nullptr || ops == nullptr || ops->alloc == nullptr ||
        ops->free == nullptr || ops->memset_s == nullptr || attr->comp_mask != 0 || attr->length == 0 ||
        attr->log_align_req > kDmMaxLogAlign) {
        return failNull<ibv_dm>(EINVAL);
    }
    Device *dev = ctx->dev;
    if (attr->length > dev->cfg.dm_size) {
        return failNull<ibv_dm>(EINVAL);
    }
    const uint64_t len = (attr->length + kDmUnit - 1) & ~(kDmUnit - 1);
    const uint64_t align = std::max<uint64_t>(kDmUnit, uint64_t{1} << attr->log_align_req);
    std::lock_guard<std::mutex> ctl(dev->ctl);
    uint64_t offset = 0;
    if (!findFree(*dev, len, align, &offset)) {
        return failNull<ibv_dm>(ENOMEM);
    }
    auto *mem = static_cast<uint8_t *>(ops->alloc(len));
    if (mem == nullptr) {
        return failNull<ibv_dm>(ENOMEM);
    }
    ops->memset_s(mem, 0, len);
    return buildDm(ctx, ops, mem, offset, len, attr->length);
}

int freeDm(ibv_dm *ib) {
    Dm *dm = asDm(ib);
    if (dm == nullptr) {
        return -EINVAL;
    }
    Device *dev = dm->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dm->mrs != 0) {
        return -EBUSY;
    }
    dev->dm_used.erase(dm->offset);
    dm->ctx->objects--;
    dm->ops->free(dm->mem);
    dm->magic = 0;
    delete dm;
    return 0;
}

ibv_mr *regDmMr(ibv_pd *ib_pd, ibv_dm *ib_dm, uint64_t offset, size_t length, unsigned int access) {
    Pd *pd = asPd(ib_pd);
    Dm *dm = asDm(ib_dm);
    const int bits = static_cast<int>(access);
    if (pd == nullptr || dm == nullptr || dm->ctx->dev != pd->ctx->dev ||
        (bits & IBV_ACCESS_ZERO_BASED) == 0 || (bits & ~(kDmMrAccess | IBV_ACCESS_ZERO_BASED)) != 0 ||
        !inside(offset, length, dm->asked)) {
        return failNull<ibv_mr>(EINVAL);
    }
    const int mr_access = bits & kDmMrAccess;
    if (int rc = checkMrAccess(mr_access); rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    Device *dev = pd->ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->n_mr >= dev->cfg.max_mr) {
        return failNull<ibv_mr>(ENOMEM);
    }
    auto mr = std::make_unique<Mr>();
    mr->dm = dm;
    mr->addr = dm->mem + offset;
    mr->iova = 0;  // zero-based: byte i of the region is iova i
    mr->len = length;
    mr->access = mr_access;
    assignMrKey(dev, mr.get());
    const uint32_t handle = mr->key >> 8;
    dm->mrs++;
    return buildMr(std::move(mr), pd, handle);
}

int dmMemory(ibv_dm *ib, void **addr, uint64_t *length) {
    Dm *dm = asDm(ib);
    if (dm == nullptr || addr == nullptr || length == nullptr) {
        return -EINVAL;
    }
    *addr = dm->mem;
    *length = dm->len;
    return 0;
}

ibv_dm *buildImportedDm(Context *ctx, ibv_extend_ops *ops, uint8_t *mem, uint64_t offset, uint64_t len,
                        uint64_t asked, int *err) {
    const Device &dev = *ctx->dev;
    if (len == 0 || len % kDmUnit != 0 || offset % kDmUnit != 0 || asked == 0 || asked > len ||
        !inside(offset, len, dev.cfg.dm_size)) {
        *err = -EINVAL;
        return nullptr;
    }
    if (!rangeFree(dev, offset, len)) {
        *err = -EEXIST;
        return nullptr;
    }
    return buildDm(ctx, ops, mem, offset, len, asked);
}

}  // namespace softnda
