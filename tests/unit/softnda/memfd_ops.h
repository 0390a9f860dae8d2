// A test implementation of struct ibv_extend_ops backed by memfd regions, the way the broker
// backs them with per-tenant arenas: every queue allocation is its own memfd mapping (so a
// child process can map it again elsewhere), doorbells are mapped through softnda's
// export_mmio at a second address (as a device or tenant would see them), and every call is
// accounted so tests can check that nothing is left behind. Failure injection makes the n-th
// alloc or db_mmap fail.
//
// The callbacks carry no context pointer (reference ABI), so the arena is one process-wide
// object; its mutex guards all of its state.
#pragma once

#include <ibv_extend.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace softnda_test {

class MemfdArena {
  public:
    static MemfdArena &instance();

    // The ops table to pass in *_init_attr_extend.
    ibv_extend_ops *ops();

    // Forgets failure injection and zeroes the call counters (live objects stay).
    void resetCounters();
    // The n-th next alloc / db_mmap (1 = the very next) fails; 0 disables.
    void failAllocAt(int n);
    void failDbMmapAt(int n);

    size_t liveAllocs();
    size_t liveBytes();
    size_t liveDbMappings();
    size_t memcpyCalls(uint32_t direction);
    size_t memsetCalls();
    size_t dbMmapCalls();

    // The memfd and offset holding addr (an address inside an allocation); false if none.
    bool lookup(const void *addr, int *fd, uint64_t *offset, size_t *region_len, const void **region_base);
    // The exported doorbell-page fd and offset behind a db_mmap result; false if none.
    bool lookupDb(const void *mapped, int *fd, uint64_t *offset);

    // ibv_extend_ops callbacks.
    static void *alloc(size_t size);
    static void free(void *ptr);
    static void memsetS(void *dst, int value, size_t count);
    static int memcpyS(void *dst, size_t dst_max, void *src, size_t size, uint32_t direction);
    static void *dbMmap(doorbell_map_desc *desc);
    static int dbUnmap(void *ptr, doorbell_map_desc *desc);

  private:
    struct Region {
        int fd;
        size_t len;
    };
    struct DbMap {
        void *va;  // page mapping at the "device" address
        int refs;
        int fd;  // from export_mmio, kept so another process can map the page too
        uint64_t off;
    };
    std::mutex mu_;
    std::map<uintptr_t, Region> regions_;  // by base address
    std::map<uintptr_t, DbMap> db_maps_;   // by the engine's page address
    size_t live_bytes_ = 0;
    size_t memcpy_calls_[4] = {};
    size_t memset_calls_ = 0;
    size_t db_mmap_calls_ = 0;
    int fail_alloc_at_ = 0;
    int fail_db_mmap_at_ = 0;
};

// The doorbell page at offset off of a BAR fd (export_mmio's, or a context's), mapped once more,
// as a device, a tenant or a successor process maps it; nullptr when mmap fails.
void *mapDoorbellPage(int fd, uint64_t off);

}  // namespace softnda_test
