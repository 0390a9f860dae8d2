// Ordinary memory made reachable by the broker: the libibverbs face registers heap, anonymous
// mmap and static buffers (ibv_reg_mr on any address), but the broker can only reach memory
// passed to it as an fd. So registration moves the pages holding the buffer onto shared memory
// at the same address, with the same contents and protection, and names them by (fd, offset).
//
// Mechanism (docs/verbs.md, "Memory registration"): one sparse memfd per process in which a
// page's file offset is its virtual address, so every moved page of the process has exactly one
// home and any range of moved pages is one (fd, offset) window, however registrations overlap.
// Only private memory moves (heap, anonymous mmap, static data, private file mappings); shared
// mappings, devices, stacks, the caller's TLS, code, PROT_NONE and kernel mappings are refused
// with a reason.
// The first and last page move whole: their neighbouring bytes keep their contents.
// Pages are reference counted per acquisition (a run-length interval map); when the last
// acquisition of a page goes, the page is moved back to private anonymous memory with its
// contents and protection, and its file space is released. Pages the program unmapped or
// remapped meanwhile only have their file space released; pages it moved away with mremap
// become private memory at their new address (they are no longer the registered pages).
// fork(): the child gets a private copy of every shared page as at fork() (taken in the parent
// before fork(), put in place in the child before fork() returns there) and no acquisitions:
// its MRs are the parent's.
//
// Thread-safety: all functions may be called concurrently; one internal mutex, on a page of its
// own, guards the registry and the memfd and is held across the moves. Other threads may write
// the pages being moved (the whole first and last page, neighbours included) during
// acquireShared() or the releaseShared() that moves them back: a user-mode write waits for the
// instant of the move and lands in the new pages (write_hold.h); a system call writing them
// then fails with EFAULT. Without a userfaultfd, or for private file mappings, such a write can
// be lost (docs/verbs.md, "Other threads' writes during a move").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ibvx::client::broker {

struct SharedWindow {
    int fd = -1;          // owned by this module: do not close; valid until the matching release
    uint64_t offset = 0;  // file offset of addr in fd (the address itself)
};

// Makes [addr, addr + length) reachable through *out. 0, or a negative errno with *why set (why
// may be null): -EINVAL for length 0, a range past the end of the address space, or memory that
// cannot be moved (a shared mapping, device memory, an unmapped hole, [vvar]/[vdso], a stack,
// the calling thread's thread-local storage); -ENOMEM when the memfd cannot grow or the pages cannot be
// remapped. On failure the range is exactly as it was.
int acquireShared(void *addr, size_t length, SharedWindow *out, std::string *why);

// Whether [addr, addr + length) lies in one read-write MAP_SHARED mapping (SysV or POSIX shared
// memory, shared anonymous memory, a memfd): memory acquireShared() refuses because it is shared
// with others, and which the broker registers in place instead (RegMr's tenant_address).
bool inSharedMapping(const void *addr, size_t length);

// Drops one acquireShared() of exactly [addr, addr + length). Pages no acquisition holds are
// left alone.
void releaseShared(void *addr, size_t length);

// Pages currently moved (tests).
size_t sharedPageCount();

}  // namespace ibvx::client::broker
