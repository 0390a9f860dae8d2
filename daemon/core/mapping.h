// The mapping manager: the broker's own struct ibv_extend_ops, which extension drivers call for
// queue memory and doorbells while they create and destroy a tenant's queues.
//
// The reference callbacks carry no context pointer, so the owner of a call is the
// SessionMemory bound to the calling thread by a ScopedBinding for the duration of one driver
// call. Memory comes from the bound session's own arena (chunks of memfd, never shared between
// sessions); doorbells become regions of the fd the device's vdev provider exports. Every
// address a driver returns in a queue_info is translated back into (region, offset), and
// regions not yet sent to the tenant are handed out by takeUnsent() so the caller can put them
// on the fd channel before replying.
//
// Threading: one process-wide mutex (MappingManager::mu_) guards every SessionMemory and the
// address index. It is a leaf lock: nothing else is taken while holding it and no driver code
// runs under it. Callbacks may run on any thread, but alloc and db_mmap need a binding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include "common/memfd_region.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx::daemon {

using RegionId = uint64_t;

// A place in a region: tenant address = its mapping of `region` + offset. region 0 = absent.
struct RegionRef {
    RegionId region = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
};

// A region the tenant has not seen yet: send fd with a kRegionAdd frame of `size` bytes.
struct RegionToSend {
    RegionId id = 0;
    UniqueFd fd;  // a dup: the caller owns it
    uint64_t size = 0;
};

struct MemoryStats {
    uint64_t arena_chunks = 0;
    uint64_t arena_bytes = 0;      // mapped chunk bytes
    uint64_t allocated_bytes = 0;  // handed to drivers and not freed
    uint64_t doorbell_pages = 0;
};

class SessionMemory;

// One allocation or free in an arena chunk: a commit logs these instead of the chunk's whole
// block list when only a few changed (docs/restart.md).
struct BlockChange {
    uint32_t offset = 0;
    uint32_t size = 0;
    bool freed = false;  // false: allocated
};
// Restart (docs/restart.md): what a session's memory is made of, as the snapshot records it. In
// an export the fds are borrowed from the live SessionMemory; in a restore they are owned.
struct ChunkState {
    RegionId id = 0;
    int fd = -1;
    UniqueFd owned;
    uint64_t size = 0;
    uint64_t base = 0;  // where the (old) broker maps it
    bool sent = false;
    uint64_t version = 0;                             // changes with every allocation or free in the chunk
    bool unchanged = false;                           // export: version as known, `used` left empty
    std::vector<std::pair<uint32_t, uint32_t>> used;  // (offset, size), by offset
    // exportChanges: the chunk changed since the known version and `changes` says how, in order
    // (`used` left empty); false: `used` is the whole list.
    bool delta = false;
    std::vector<BlockChange> changes;
};
struct DoorbellState {
    RegionId id = 0;
    int fd = -1;
    UniqueFd owned;
    uint64_t fd_offset = 0;
    uint64_t map_size = 0;
    int refs = 0;
    bool sent = false;
    uint64_t page = 0;  // the address the driver gave db_mmap (old process)
};
struct MemoryState {
    std::vector<ChunkState> chunks;
    std::vector<DoorbellState> doorbells;
};
// Old address -> new address of memory a restored session's objects used (import_object's
// relocate): arena chunks, doorbell pages, MR mappings.
class Relocations {
  public:
    void add(uint64_t old_base, uint64_t new_base, uint64_t size);
    // The new address of [old_addr, old_addr + length), 0 when no single range holds it.
    uint64_t find(uint64_t old_addr, uint64_t length) const;

  private:
    struct Range {
        uint64_t new_base = 0, size = 0;
    };
    std::map<uint64_t, Range> by_old_;
};

class MappingManager {
  public:
    // Chunks are at least this big, so small queues of one session share a region.
    static constexpr size_t kChunkSize = 256 * 1024;
    // Allocations are aligned to this many bytes (drivers put doorbell records at the end).
    static constexpr size_t kAlign = 64;
    // Nothing a driver asks for may exceed this (protocol limit on region sizes).
    static constexpr size_t kMaxAlloc = size_t{1} << 30;

    static MappingManager &instance();

    // The ops table handed to drivers: static, so it outlives every queue that keeps it.
    static ibv_extend_ops *ops();

    std::unique_ptr<SessionMemory> createSession(uint64_t session_id);
    // Frees everything the session still holds (a driver that leaked, or a teardown).
    void dropSession(SessionMemory *mem);

    // Translates a driver-returned address of the session's memory; 0 gives an absent ref.
    StatusOr<RegionRef> resolve(SessionMemory &mem, uint64_t addr, uint64_t length);
    // Regions created since the last call, marked sent.
    std::vector<RegionToSend> takeUnsent(SessionMemory &mem);
    // Sent regions released since the last call.
    std::vector<RegionId> takeReleased(SessionMemory &mem);

    MemoryStats stats(const SessionMemory &mem);
    MemoryStats totals();

    // ---- restart (docs/restart.md) ----
    // Everything: every chunk with its whole block list, every doorbell page.
    MemoryState exportState(const SessionMemory &mem);
    // What changed since the chunk versions a commit has recorded (known), so a commit costs what
    // the call changed: a known chunk at its known version comes back marked unchanged, one that
    // moved since as a delta (its allocations and frees since, in order) when its journal reaches
    // back to that version, else with its whole list; a chunk not known, with its whole list.
    // Each chunk's journal then starts again from now.
    MemoryState exportChanges(SessionMemory &mem, const std::map<RegionId, uint64_t> &known);
    // A session's memory rebuilt from a snapshot: every chunk and doorbell page mapped anew
    // (adding old -> new to reloc), the same region ids, blocks and sent flags. Takes the fds.
    StatusOr<std::unique_ptr<SessionMemory>> restoreSession(uint64_t session_id, MemoryState state,
                                                            Relocations *reloc);
    // Region ids: the next one to hand out, and a floor it never goes below again (a successor
    // starts above every id its predecessor may have sent).
    RegionId nextRegionId();
    void raiseRegionFloor(RegionId floor);

    // The callbacks (public for tests; drivers reach them through ops()).
    void *alloc(size_t size);
    void free(void *ptr);
    void *dbMmap(doorbell_map_desc *desc);
    int dbUnmap(void *ptr, doorbell_map_desc *desc);

  private:
    friend class ScopedBinding;
    friend class SessionMemory;
    MappingManager() = default;
    RegionId newRegionId();
    void releaseChunkLocked(SessionMemory &mem, size_t index);
    // exportState, and exportChanges without the journals' restart; mu_ held.
    MemoryState exportLocked(const SessionMemory &mem, const std::map<RegionId, uint64_t> *known);
    void forget(SessionMemory *mem);

    std::mutex mu_;
    // chunk base address -> owner, for free() of any pointer from any session.
    std::map<uintptr_t, SessionMemory *> chunk_owner_;
    // Every live SessionMemory, for a db_unmap that arrives without a binding.
    std::set<SessionMemory *> live_;
    RegionId next_region_ = 1;
};

// Binds the calling thread to a session (and the device a driver call is for) while a driver
// call runs. Nests: the previous binding comes back on destruction.
class ScopedBinding {
  public:
    ScopedBinding(SessionMemory *mem, const ibv_extend_vdev_ops *vdev);
    ~ScopedBinding();
    ScopedBinding(const ScopedBinding &) = delete;
    ScopedBinding &operator=(const ScopedBinding &) = delete;

    static SessionMemory *currentSession();

  private:
    SessionMemory *prev_mem_;
    const ibv_extend_vdev_ops *prev_vdev_;
};

// One session's arena and doorbell regions. Opaque outside the manager; guarded by its mutex.
class SessionMemory {
  public:
    ~SessionMemory();
    SessionMemory(const SessionMemory &) = delete;
    SessionMemory &operator=(const SessionMemory &) = delete;
    uint64_t sessionId() const { return session_id_; }

  private:
    friend class MappingManager;
    // A run of a chunk. Chunks are at most kMaxAlloc (1 GiB) bytes, so 32 bits hold both.
    struct Block {
        uint32_t offset = 0;
        uint32_t size = 0;
    };
    // The blocks are sorted flat vectors, not maps: a queue costs 8 bytes here instead of a
    // 48-byte tree node, and a broker holding 100,000 QPs holds 200,000 allocations.
    struct Chunk {
        RegionId id = 0;
        MemfdRegion mem;
        std::vector<Block> free_blocks;  // by offset, never adjacent (coalesced)
        std::vector<Block> used_blocks;  // by offset
        size_t used_bytes = 0;
        bool sent = false;
        uint64_t version = 1;  // bumped by every alloc and free in it (restart's commits)
        // The allocations and frees since the last exportChanges(), each with the version it
        // made: complete for every version after journal_base. Bounded: past kMaxJournal
        // changes it starts again (journal_base moves up), and an export then gives the whole
        // list, as it does for a chunk a commit never saw.
        struct Journaled {
            BlockChange change;
            uint64_t version = 0;
        };
        static constexpr size_t kMaxJournal = 64;
        std::vector<Journaled> journal;
        uint64_t journal_base = 1;
        void note(BlockChange change);
    };
    struct Doorbell {
        RegionId id = 0;
        UniqueFd fd;
        uint64_t fd_offset = 0;  // of the page in fd
        uint64_t map_size = 0;   // fd_offset + one page: what the tenant maps
        int refs = 0;
        bool sent = false;
        // Restored doorbells only: the broker's own mapping of the page (its address is the
        // key), since the driver's mapping of the old process is gone.
        UniqueMapping mapping;
    };

    explicit SessionMemory(uint64_t id) : session_id_(id) {}
    uint64_t session_id_;
    std::vector<std::unique_ptr<Chunk>> chunks_;
    std::map<uintptr_t, Doorbell> doorbells_;  // by broker page address
    std::vector<RegionId> released_;
};

}  // namespace ibvx::daemon
