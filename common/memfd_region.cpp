#include "common/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace ibvx {

size_t pageSize() {
    static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    return page;
}

size_t roundUpToPage(size_t n) {
    size_t p = pageSize();
    return (n + p - 1) / p * p;
}

StatusOr<MemfdRegion> MemfdRegion::create(const std::string &name, size_t size, bool try_hugepages) {
    if (size == 0) {
        return invalidArgument("memfd region of size 0");
    }
    size = roundUpToPage(size);
    if (try_hugepages) {
        constexpr size_t kHuge = 2u << 20;
        size_t huge_size = (size + kHuge - 1) / kHuge * kHuge;
        // Sealed like the normal-page region below: a peer holding the fd must not be able to
        // shrink what the engine reads (SIGBUS in the broker). A kernel that cannot seal
        // hugetlb memfds (before 4.16) gets normal pages.
        UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_HUGETLB | MFD_ALLOW_SEALING));
        if (fd && ::ftruncate(fd.get(), static_cast<off_t>(huge_size)) == 0 &&
            ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
            void *p = ::mmap(nullptr, huge_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
            if (p != MAP_FAILED) {
                MemfdRegion r;
                r.fd_ = std::move(fd);
                r.mapping_ = UniqueMapping(p, huge_size);
                return r;
            }
        }
        // No hugepage pool (or it is exhausted): normal pages are always acceptable.
    }
    UniqueFd fd(::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) {
        return Status::fromErrno(errno, "memfd_create failed");
    }
    if (::ftruncate(fd.get(), static_cast<off_t>(size)) < 0) {
        return Status::fromErrno(errno, "ftruncate of memfd failed");
    }
    // The size is part of the contract with the peer that maps it: forbid changing it. A peer
    // that shrank it would end the broker's next access with SIGBUS, so a region that cannot be
    // sealed is not made.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        return Status::fromErrno(errno, "cannot seal the memfd region against resizing");
    }
    return map(std::move(fd), size);
}

StatusOr<MemfdRegion> MemfdRegion::map(UniqueFd fd, size_t size) {
    if (!fd) {
        return invalidArgument("invalid fd");
    }
    if (size == 0) {
        return invalidArgument("mapping of size 0");
    }
    void *p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
        return Status::fromErrno(errno, "mmap of region failed");
    }
    MemfdRegion r;
    r.fd_ = std::move(fd);
    r.mapping_ = UniqueMapping(p, size);
    return r;
}

bool MemfdRegion::contains(const void *p, size_t len) const {
    auto base = reinterpret_cast<uintptr_t>(mapping_.get());
    auto a = reinterpret_cast<uintptr_t>(p);
    return mapping_.valid() && a >= base && len <= mapping_.size() && a - base <= mapping_.size() - len;
}

}  // namespace ibvx
