// Buffers from ibvx_alloc_buf(): page-aligned MAP_SHARED mappings of a memfd each. The memfd is
// kept so broker mode can hand the same memory to the broker (SCM_RIGHTS) for registration.
// Thread-safety: all functions may be called concurrently; one internal mutex guards the map of
// buffers and is never held across a syscall other than the munmap/close of a buffer being freed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ibvx::client {

struct BufferInfo {
    void *base = nullptr;  // what ibvx_alloc_buf() returned
    size_t size = 0;       // mapped bytes (a multiple of the page size)
    int fd = -1;           // the memfd behind it, owned by the registry: do not close
};

// The buffer that contains all of [addr, addr + length); false when no single buffer does.
bool findBuffer(const void *addr, size_t length, BufferInfo *out);

}  // namespace ibvx::client
