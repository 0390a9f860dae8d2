#include "daemon/core/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <string>

namespace ibvx::daemon {
namespace {

// Doorbell pages are 4 KiB in the reference's db_mmap contract, whatever the host page size.
constexpr uint64_t kDbPage = 4096;

thread_local SessionMemory *tls_mem = nullptr;
thread_local const ibv_extend_vdev_ops *tls_vdev = nullptr;

size_t alignUp(size_t n, size_t a) {
    return (n + a - 1) / a * a;
}

// Orders a chunk's blocks (sorted by offset) against an offset, for std::lower_bound.
constexpr auto blockBefore = [](const auto &block, uint32_t offset) { return block.offset < offset; };

void *cbAlloc(size_t size) {
    return MappingManager::instance().alloc(size);
}
void cbFree(void *ptr) {
    MappingManager::instance().free(ptr);
}
// All queue memory of the broker is host memory: every direction is a plain copy.
void cbMemset(void *dst, int value, size_t count) {
    if (dst != nullptr) {
        std::memset(dst, value, count);
    }
}
int cbMemcpy(void *dst, size_t dst_max, void *src, size_t size, uint32_t direction) {
    if (direction > MEMCPY_DIR_DEVICE_TO_DEVICE || dst == nullptr || src == nullptr || size > dst_max) {
        return -1;
    }
    std::memmove(dst, src, size);
    return 0;
}
void *cbDbMmap(doorbell_map_desc *desc) {
    return MappingManager::instance().dbMmap(desc);
}
int cbDbUnmap(void *ptr, doorbell_map_desc *desc) {
    return MappingManager::instance().dbUnmap(ptr, desc);
}

ibv_extend_ops g_ops = {cbAlloc, cbFree, cbMemset, cbMemcpy, cbDbMmap, cbDbUnmap};

}  // namespace

MappingManager &MappingManager::instance() {
    // Leaked on purpose: drivers may call free() from their own static destructors.
    static MappingManager *m = new MappingManager;
    return *m;
}

ibv_extend_ops *MappingManager::ops() {
    return &g_ops;
}

ScopedBinding::ScopedBinding(SessionMemory *mem, const ibv_extend_vdev_ops *vdev)
    : prev_mem_(tls_mem), prev_vdev_(tls_vdev) {
    tls_mem = mem;
    tls_vdev = vdev;
}

ScopedBinding::~ScopedBinding() {
    tls_mem = prev_mem_;
    tls_vdev = prev_vdev_;
}

SessionMemory *ScopedBinding::currentSession() {
    return tls_mem;
}

RegionId MappingManager::newRegionId() {
    return next_region_++;
}

std::unique_ptr<SessionMemory> MappingManager::createSession(uint64_t session_id) {
    std::unique_ptr<SessionMemory> mem(new SessionMemory(session_id));
    std::lock_guard lock(mu_);
    live_.insert(mem.get());
    return mem;
}

SessionMemory::~SessionMemory() {
    MappingManager::instance().forget(this);
}

void MappingManager::forget(SessionMemory *mem) {
    dropSession(mem);
    std::lock_guard lock(mu_);
    live_.erase(mem);
}

void MappingManager::dropSession(SessionMemory *mem) {
    if (mem == nullptr) {
        return;
    }
    std::lock_guard lock(mu_);
    for (auto &c : mem->chunks_) {
        chunk_owner_.erase(reinterpret_cast<uintptr_t>(c->mem.data()));
    }
    mem->chunks_.clear();
    mem->doorbells_.clear();
    mem->released_.clear();
}

void *MappingManager::alloc(size_t size) {
    SessionMemory *mem = tls_mem;
    if (mem == nullptr) {
        // A driver allocating outside a broker call: there is no tenant to charge it to.
        errno = EPERM;
        return nullptr;
    }
    if (size == 0 || size > kMaxAlloc) {
        errno = EINVAL;
        return nullptr;
    }
    size_t want = alignUp(size, kAlign);
    static_assert(kMaxAlloc <= UINT32_MAX, "Block holds chunk offsets and sizes in 32 bits");
    auto want32 = static_cast<uint32_t>(want);
    std::lock_guard lock(mu_);
    for (auto &c : mem->chunks_) {
        for (auto it = c->free_blocks.begin(); it != c->free_blocks.end(); ++it) {
            if (it->size < want32) {
                continue;
            }
            uint32_t off = it->offset;
            // Reserve first: a throwing insert must leave the free list as it was.
            auto used = std::lower_bound(c->used_blocks.begin(), c->used_blocks.end(), off, blockBefore);
            c->used_blocks.insert(used, {off, want32});
            if (it->size > want32) {
                it->offset += want32;
                it->size -= want32;
            } else {
                c->free_blocks.erase(it);
            }
            c->used_bytes += want;
            c->note({off, want32, false});
            return static_cast<uint8_t *>(c->mem.data()) + off;
        }
    }
    auto chunk = std::make_unique<SessionMemory::Chunk>();
    auto region = MemfdRegion::create("ibvx-arena-" + std::to_string(mem->session_id_),
                                      std::max(want, kChunkSize), /*try_hugepages=*/true);
    if (!region.isOk()) {
        errno = region.status().errnoValue() != 0 ? region.status().errnoValue() : ENOMEM;
        return nullptr;
    }
    chunk->mem = std::move(region).value();
    chunk->id = newRegionId();
    if (chunk->mem.size() > want) {
        chunk->free_blocks.push_back({want32, static_cast<uint32_t>(chunk->mem.size() - want)});
    }
    chunk->used_blocks.push_back({0, want32});
    chunk->used_bytes = want;
    void *p = chunk->mem.data();
    chunk_owner_[reinterpret_cast<uintptr_t>(p)] = mem;
    mem->chunks_.push_back(std::move(chunk));
    return p;
}

void MappingManager::releaseChunkLocked(SessionMemory &mem, size_t index) {
    auto &c = mem.chunks_[index];
    chunk_owner_.erase(reinterpret_cast<uintptr_t>(c->mem.data()));
    if (c->sent) {
        mem.released_.push_back(c->id);
    }
    mem.chunks_.erase(mem.chunks_.begin() + static_cast<std::ptrdiff_t>(index));
}

void MappingManager::free(void *ptr) {
    if (ptr == nullptr) {
        return;
    }
    auto addr = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard lock(mu_);
    auto it = chunk_owner_.upper_bound(addr);
    if (it == chunk_owner_.begin()) {
        return;  // not ours: ignoring beats corrupting another arena
    }
    --it;
    SessionMemory &mem = *it->second;
    for (size_t i = 0; i < mem.chunks_.size(); ++i) {
        auto &c = mem.chunks_[i];
        if (!c->mem.contains(ptr)) {
            continue;
        }
        auto off = static_cast<uint32_t>(addr - reinterpret_cast<uintptr_t>(c->mem.data()));
        auto used = std::lower_bound(c->used_blocks.begin(), c->used_blocks.end(), off, blockBefore);
        if (used == c->used_blocks.end() || used->offset != off) {
            return;  // not the start of an allocation
        }
        uint32_t size = used->size;
        // Coalesce with the neighbours so a long-lived session does not fragment. Only the
        // last step may grow the free list (and throw): the block is used until it succeeds.
        auto next = std::lower_bound(c->free_blocks.begin(), c->free_blocks.end(), off, blockBefore);
        bool joins_next = next != c->free_blocks.end() && next->offset == off + size;
        bool joins_prev =
            next != c->free_blocks.begin() && std::prev(next)->offset + std::prev(next)->size == off;
        if (!joins_next && !joins_prev) {
            c->free_blocks.insert(next, {off, size});
        } else if (joins_prev) {
            auto prev = std::prev(next);
            prev->size += size + (joins_next ? next->size : 0);
            if (joins_next) {
                c->free_blocks.erase(next);
            }
        } else {
            next->offset = off;
            next->size += size;
        }
        c->used_blocks.erase(used);
        c->used_bytes -= size;
        c->note({off, size, true});
        if (c->used_bytes == 0) {
            releaseChunkLocked(mem, i);
        }
        return;
    }
}

void *MappingManager::dbMmap(doorbell_map_desc *desc) {
    if (desc == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    if (desc->type == DB_MAP_MODE_UB_RES) {
        // UB resources need a bus the broker does not drive; softnda queues use HOST_VA in the
        // default DMA mode.
        errno = EOPNOTSUPP;
        return nullptr;
    }
    if (desc->type != DB_MAP_MODE_HOST_VA) {
        errno = EINVAL;
        return nullptr;
    }
    SessionMemory *mem = tls_mem;
    const ibv_extend_vdev_ops *vdev = tls_vdev;
    if (mem == nullptr) {
        errno = EPERM;
        return nullptr;
    }
    uint64_t hva = desc->hva;
    uint64_t page = hva & ~(kDbPage - 1);
    if (hva == 0 || desc->size == 0 || (hva - page) + desc->size > kDbPage) {
        errno = EINVAL;
        return nullptr;
    }
    {
        std::lock_guard lock(mu_);
        auto it = mem->doorbells_.find(page);
        if (it != mem->doorbells_.end()) {
            ++it->second.refs;
            return reinterpret_cast<void *>(hva);
        }
    }
    if (vdev == nullptr || vdev->export_mmio == nullptr) {
        // Without an exporter the page cannot reach the tenant.
        errno = EOPNOTSUPP;
        return nullptr;
    }
    // Driver code: called without our lock.
    int fd = -1;
    uint64_t offset = 0;
    int rc = vdev->export_mmio(reinterpret_cast<void *>(page), &fd, &offset);
    if (rc < 0 || fd < 0) {
        errno = rc < 0 ? -rc : EIO;
        return nullptr;
    }
    UniqueFd owned(fd);
    if (offset % kDbPage != 0) {
        errno = EINVAL;
        return nullptr;
    }
    std::lock_guard lock(mu_);
    auto [it, inserted] = mem->doorbells_.try_emplace(page);
    if (inserted) {
        it->second.id = newRegionId();
        it->second.fd = std::move(owned);
        it->second.fd_offset = offset;
        it->second.map_size = offset + kDbPage;
    }
    ++it->second.refs;
    return reinterpret_cast<void *>(hva);
}

int MappingManager::dbUnmap(void *ptr, doorbell_map_desc *desc) {
    if (ptr == nullptr || desc == nullptr) {
        return -EINVAL;
    }
    uint64_t page = reinterpret_cast<uint64_t>(ptr) & ~(kDbPage - 1);
    std::lock_guard lock(mu_);
    SessionMemory *mem = tls_mem;
    if (mem == nullptr) {
        // Outside a broker call: the owner is whoever mapped this page.
        for (SessionMemory *m : live_) {
            if (m->doorbells_.count(page) != 0) {
                mem = m;
                break;
            }
        }
        if (mem == nullptr) {
            return -ENODEV;
        }
    }
    auto it = mem->doorbells_.find(page);
    if (it == mem->doorbells_.end()) {
        return -ENODEV;
    }
    if (--it->second.refs == 0) {
        if (it->second.sent) {
            mem->released_.push_back(it->second.id);
        }
        mem->doorbells_.erase(it);
    }
    return 0;
}

StatusOr<RegionRef> MappingManager::resolve(SessionMemory &mem, uint64_t addr, uint64_t length) {
    if (addr == 0) {
        return RegionRef{};
    }
    std::lock_guard lock(mu_);
    for (auto &c : mem.chunks_) {
        auto base = reinterpret_cast<uint64_t>(c->mem.data());
        if (addr >= base && addr - base < c->mem.size()) {
            if (length > c->mem.size() - (addr - base)) {
                return Status(Code::kInternal, EIO,
                              "driver returned a range past the end of its arena chunk");
            }
            return RegionRef{c->id, addr - base, length};
        }
    }
    auto it = mem.doorbells_.find(addr & ~(kDbPage - 1));
    if (it != mem.doorbells_.end()) {
        return RegionRef{it->second.id, it->second.fd_offset + (addr & (kDbPage - 1)), length};
    }
    return Status(Code::kInternal, EIO, "driver returned an address outside the session's memory");
}

std::vector<RegionToSend> MappingManager::takeUnsent(SessionMemory &mem) {
    std::vector<RegionToSend> out;
    std::lock_guard lock(mu_);
    for (auto &c : mem.chunks_) {
        if (!c->sent) {
            c->sent = true;
            ++c->version;
            out.push_back({c->id, UniqueFd(::fcntl(c->mem.fd(), F_DUPFD_CLOEXEC, 0)), c->mem.size()});
        }
    }
    for (auto &[page, db] : mem.doorbells_) {
        if (!db.sent) {
            db.sent = true;
            out.push_back({db.id, UniqueFd(::fcntl(db.fd.get(), F_DUPFD_CLOEXEC, 0)), db.map_size});
        }
    }
    return out;
}

std::vector<RegionId> MappingManager::takeReleased(SessionMemory &mem) {
    std::lock_guard lock(mu_);
    return std::exchange(mem.released_, {});
}

MemoryStats MappingManager::stats(const SessionMemory &mem) {
    std::lock_guard lock(mu_);
    MemoryStats s;
    for (auto &c : mem.chunks_) {
        ++s.arena_chunks;
        s.arena_bytes += c->mem.size();
        s.allocated_bytes += c->used_bytes;
    }
    s.doorbell_pages = mem.doorbells_.size();
    return s;
}

MemoryStats MappingManager::totals() {
    std::lock_guard lock(mu_);
    MemoryStats s;
    s.arena_chunks = chunk_owner_.size();
    for (auto &[base, mem] : chunk_owner_) {
        for (auto &c : mem->chunks_) {
            if (reinterpret_cast<uintptr_t>(c->mem.data()) == base) {
                s.arena_bytes += c->mem.size();
                s.allocated_bytes += c->used_bytes;
            }
        }
    }
    for (const SessionMemory *mem : live_) {
        s.doorbell_pages += mem->doorbells_.size();
    }
    return s;
}

// ---- restart ---------------------------------------------------------------------------------

void Relocations::add(uint64_t old_base, uint64_t new_base, uint64_t size) {
    by_old_[old_base] = Range{new_base, size};
}

uint64_t Relocations::find(uint64_t old_addr, uint64_t length) const {
    auto it = by_old_.upper_bound(old_addr);
    if (it == by_old_.begin()) {
        return 0;
    }
    --it;
    uint64_t off = old_addr - it->first;
    if (off >= it->second.size || length > it->second.size - off) {
        return 0;
    }
    return it->second.new_base + off;
}

void SessionMemory::Chunk::note(BlockChange change) {
    ++version;
    if (journal.size() >= kMaxJournal) {
        journal.clear();  // too many to be worth a delta: the next export gives the whole list
        journal_base = version;
        return;
    }
    journal.push_back({change, version});
}

MemoryState MappingManager::exportState(const SessionMemory &mem) {
    std::lock_guard lock(mu_);
    return exportLocked(mem, nullptr);
}

MemoryState MappingManager::exportChanges(SessionMemory &mem, const std::map<RegionId, uint64_t> &known) {
    std::lock_guard lock(mu_);
    MemoryState out = exportLocked(mem, &known);
    for (auto &c : mem.chunks_) {
        c->journal.clear();
        c->journal_base = c->version;
    }
    return out;
}

MemoryState MappingManager::exportLocked(const SessionMemory &mem,
                                         const std::map<RegionId, uint64_t> *known) {
    MemoryState out;
    out.chunks.reserve(mem.chunks_.size());  // every commit exports: no growth by doubling
    out.doorbells.reserve(mem.doorbells_.size());
    for (const auto &c : mem.chunks_) {
        ChunkState cs;
        cs.id = c->id;
        cs.fd = c->mem.fd();
        cs.size = c->mem.size();
        cs.base = reinterpret_cast<uint64_t>(c->mem.data());
        cs.sent = c->sent;
        cs.version = c->version;
        auto it = known != nullptr ? known->find(c->id) : std::map<RegionId, uint64_t>::const_iterator{};
        if (known != nullptr && it != known->end() && it->second == c->version) {
            cs.unchanged = true;
        } else if (known != nullptr && it != known->end() && it->second >= c->journal_base) {
            cs.delta = true;
            cs.changes.reserve(c->journal.size());
            for (const auto &j : c->journal) {
                if (j.version > it->second) {
                    cs.changes.push_back(j.change);
                }
            }
        } else {
            cs.used.reserve(c->used_blocks.size());
            for (const auto &b : c->used_blocks) {
                cs.used.emplace_back(b.offset, b.size);
            }
        }
        out.chunks.push_back(std::move(cs));
    }
    for (const auto &[page, db] : mem.doorbells_) {
        DoorbellState ds;
        ds.id = db.id;
        ds.fd = db.fd.get();
        ds.fd_offset = db.fd_offset;
        ds.map_size = db.map_size;
        ds.refs = db.refs;
        ds.sent = db.sent;
        ds.page = page;
        out.doorbells.push_back(std::move(ds));
    }
    return out;
}

StatusOr<std::unique_ptr<SessionMemory>> MappingManager::restoreSession(uint64_t session_id,
                                                                        MemoryState state,
                                                                        Relocations *reloc) {
    std::unique_ptr<SessionMemory> mem(new SessionMemory(session_id));
    for (ChunkState &cs : state.chunks) {
        if (cs.size == 0 || cs.size > kMaxAlloc || cs.size % pageSize() != 0) {
            return invalidArgument("arena chunk " + std::to_string(cs.id) + " has a bad size");
        }
        auto chunk = std::make_unique<SessionMemory::Chunk>();
        chunk->id = cs.id;
        chunk->sent = cs.sent;
        // The blocks must be sorted, inside the chunk and disjoint: anything else is a corrupt
        // snapshot, and a bad free list would hand one queue's memory to another.
        uint64_t end = 0;
        for (auto [off, size] : cs.used) {
            if (size == 0 || off < end || uint64_t{off} + size > cs.size) {
                return invalidArgument("arena chunk " + std::to_string(cs.id) + " has bad blocks");
            }
            if (off > end) {
                chunk->free_blocks.push_back({static_cast<uint32_t>(end), static_cast<uint32_t>(off - end)});
            }
            chunk->used_blocks.push_back({off, size});
            chunk->used_bytes += size;
            end = uint64_t{off} + size;
        }
        if (end < cs.size) {
            chunk->free_blocks.push_back({static_cast<uint32_t>(end), static_cast<uint32_t>(cs.size - end)});
        }
        struct stat st {};
        if (::fstat(cs.owned.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < cs.size) {
            return invalidArgument("the fd of arena chunk " + std::to_string(cs.id) + " is not its memfd");
        }
        auto region = MemfdRegion::map(std::move(cs.owned), cs.size);
        if (!region.isOk()) {
            return region.status();
        }
        chunk->mem = std::move(region).value();
        reloc->add(cs.base, reinterpret_cast<uint64_t>(chunk->mem.data()), cs.size);
        mem->chunks_.push_back(std::move(chunk));
    }
    for (DoorbellState &ds : state.doorbells) {
        if (ds.refs <= 0 || ds.map_size != ds.fd_offset + kDbPage || ds.fd_offset % kDbPage != 0 ||
            ds.page % kDbPage != 0) {
            return invalidArgument("doorbell region " + std::to_string(ds.id) + " is malformed");
        }
        // The system page may be bigger than a doorbell page (64 KiB on some aarch64 hosts).
        const uint64_t sys = pageSize();
        const uint64_t aligned = ds.fd_offset / sys * sys;
        const uint64_t len = roundUpToPage(ds.fd_offset + kDbPage - aligned);
        void *base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, ds.owned.get(),
                            static_cast<off_t>(aligned));
        if (base == MAP_FAILED) {
            return Status::fromErrno(errno, "cannot map doorbell region " + std::to_string(ds.id));
        }
        uint64_t page = reinterpret_cast<uint64_t>(base) + (ds.fd_offset - aligned);
        SessionMemory::Doorbell db;
        db.id = ds.id;
        db.fd = std::move(ds.owned);
        db.fd_offset = ds.fd_offset;
        db.map_size = ds.map_size;
        db.refs = ds.refs;
        db.sent = ds.sent;
        db.mapping = UniqueMapping(base, len);
        reloc->add(ds.page, page, kDbPage);
        mem->doorbells_.emplace(page, std::move(db));
    }
    std::lock_guard lock(mu_);
    for (auto &c : mem->chunks_) {
        chunk_owner_[reinterpret_cast<uintptr_t>(c->mem.data())] = mem.get();
    }
    live_.insert(mem.get());
    return mem;
}

RegionId MappingManager::nextRegionId() {
    std::lock_guard lock(mu_);
    return next_region_;
}

void MappingManager::raiseRegionFloor(RegionId floor) {
    std::lock_guard lock(mu_);
    next_region_ = std::max(next_region_, floor);
}

}  // namespace ibvx::daemon
