// Ordinary memory made reachable by the broker: the libibverbs face registers heap, anonymous
// mmap and static buffers (ibv_reg_mr on any address), but the broker can only reach memory
// passed to it as an fd. So registration moves the pages holding the buffer onto shared memory
// at the same address, with the same contents and protection, and names them by (fd, offset).
//
// Mechanism (docs/verbs.md, "Memory registration"): one sparse memfd per process in which a
// page's file offset is its virtual address, so every moved page of the process has exactly one
// home and any range of moved pages is one (fd, offset) window, however registrations overlap.
// Pages are reference counted per registration; when the last registration of a page goes, the
// page is moved back to private anonymous memory (contents kept) and its file space released.
// fork(): a child gets a private copy of every shared page (made in the child before fork()
// returns there), so its memory behaves as after an ordinary fork and the parent's registrations
// stay the parent's.
//
// Thread-safety: all functions may be called concurrently; one internal mutex. The bytes of a
// page being moved must not be written by another thread during the move (as for any
// registration: documented).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ibvx::client {

struct SharedWindow {
    int fd = -1;          // owned by this module: do not close; valid until the last release
    uint64_t offset = 0;  // file offset of addr in fd
};

// Makes [addr, addr + length) reachable through *out. 0, or a negative errno with *why set:
// -EINVAL for memory that cannot be moved (a shared or file-backed shared mapping, device
// memory, an unmapped hole, [vvar]/[vdso]), -ENOMEM when the memfd cannot grow.
int acquireShared(void *addr, size_t length, SharedWindow *out, std::string *why);

// Drops one acquireShared() of exactly [addr, addr + length).
void releaseShared(void *addr, size_t length);

// Pages currently moved (tests).
size_t sharedPageCount();

}  // namespace ibvx::client
