#include "client/buffers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <iterator>
#include <map>
#include <mutex>

#include <ibv_extend_broker.h>

namespace ibvx::client {
namespace {

struct Buffers {
    std::mutex mu;                            // guards by_addr
    std::map<uintptr_t, BufferInfo> by_addr;  // keyed by base address
};

Buffers &buffers() {
    static Buffers *b = new Buffers;  // outlives static destructors that may still free buffers
    return *b;
}

size_t pageSize() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

}  // namespace

bool findBuffer(const void *addr, size_t length, BufferInfo *out) {
    auto a = reinterpret_cast<uintptr_t>(addr);
    Buffers &b = buffers();
    std::lock_guard lock(b.mu);
    auto it = b.by_addr.upper_bound(a);
    if (it == b.by_addr.begin()) {
        return false;
    }
    const BufferInfo &info = std::prev(it)->second;
    uintptr_t base = reinterpret_cast<uintptr_t>(info.base);
    uintptr_t off = a - base;
    if (off >= info.size || length > info.size - off) {
        return false;
    }
    if (out != nullptr) {
        *out = info;
    }
    return true;
}

}  // namespace ibvx::client

extern "C" {

void *ibvx_alloc_buf(size_t size) {
    using ibvx::client::pageSize;
    if (size == 0 || size > SIZE_MAX - pageSize()) {
        errno = EINVAL;
        return nullptr;
    }
    size_t rounded = (size + pageSize() - 1) & ~(pageSize() - 1);
    // Sealed to its size: the broker maps this memory as an MR, and refuses memory that anyone
    // holding the fd (this process) could shrink under it (docs/security.md).
    int fd = memfd_create("ibvx-buf", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        return nullptr;
    }
    if (ftruncate(fd, static_cast<off_t>(rounded)) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int err = errno;
        close(fd);
        errno = err;
        return nullptr;
    }
    void *p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        close(fd);
        errno = err;
        return nullptr;
    }
    auto &b = ibvx::client::buffers();
    std::lock_guard lock(b.mu);
    b.by_addr[reinterpret_cast<uintptr_t>(p)] = {p, rounded, fd};
    return p;
}

void ibvx_free_buf(void *buf) {
    if (buf == nullptr) {
        return;
    }
    ibvx::client::BufferInfo info;
    {
        auto &b = ibvx::client::buffers();
        std::lock_guard lock(b.mu);
        auto it = b.by_addr.find(reinterpret_cast<uintptr_t>(buf));
        if (it == b.by_addr.end()) {
            // Not ours (or freed twice): touching it could unmap someone else's memory.
            errno = EINVAL;
            return;
        }
        info = it->second;
        b.by_addr.erase(it);
    }
    munmap(info.base, info.size);
    close(info.fd);
}

}  // extern "C"
