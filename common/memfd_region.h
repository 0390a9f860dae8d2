// A memfd-backed shared memory region: the unit of memory the broker hands to a tenant. The
// same fd is mapped in both processes, so a queue ring written by the tenant is the ring the
// (software or real) NIC reads.
#pragma once

#include <cstddef>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx {

class MemfdRegion {
  public:
    // Creates and maps a region of `size` bytes (rounded up to the page size). With
    // try_hugepages, MFD_HUGETLB is tried first and silently dropped when no pool exists.
    static StatusOr<MemfdRegion> create(const std::string &name, size_t size, bool try_hugepages = false);
    // Maps an existing fd (taking ownership of it) of `size` bytes, read-write and shared.
    static StatusOr<MemfdRegion> map(UniqueFd fd, size_t size);

    MemfdRegion() = default;
    MemfdRegion(MemfdRegion &&) noexcept = default;
    MemfdRegion &operator=(MemfdRegion &&) noexcept = default;

    int fd() const { return fd_.get(); }
    void *data() const { return mapping_.get(); }
    size_t size() const { return mapping_.size(); }
    bool contains(const void *p, size_t len = 1) const;

  private:
    UniqueFd fd_;
    UniqueMapping mapping_;
};

size_t pageSize();
size_t roundUpToPage(size_t n);

}  // namespace ibvx
