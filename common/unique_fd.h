// Owning wrappers for the two resources every part of the project juggles: file descriptors
// and memory mappings. Closing/unmapping on every path is what keeps the broker leak-free when
// a tenant misbehaves.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

namespace ibvx {

class UniqueFd {
  public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;
    UniqueFd(UniqueFd &&o) noexcept : fd_(o.release()) {}
    UniqueFd &operator=(UniqueFd &&o) noexcept {
        if (this != &o) {
            reset(o.release());
        }
        return *this;
    }
    ~UniqueFd() { reset(); }

    int get() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    explicit operator bool() const { return valid(); }
    int release() { return std::exchange(fd_, -1); }
    void reset(int fd = -1) {
        if (fd_ >= 0) {
            ::close(fd_);
        }
        fd_ = fd;
    }

  private:
    int fd_ = -1;
};

class UniqueMapping {
  public:
    UniqueMapping() = default;
    UniqueMapping(void *addr, size_t length) : addr_(addr), length_(length) {}
    UniqueMapping(const UniqueMapping &) = delete;
    UniqueMapping &operator=(const UniqueMapping &) = delete;
    UniqueMapping(UniqueMapping &&o) noexcept
        : addr_(std::exchange(o.addr_, nullptr)), length_(std::exchange(o.length_, 0)) {}
    UniqueMapping &operator=(UniqueMapping &&o) noexcept {
        if (this != &o) {
            reset();
            addr_ = std::exchange(o.addr_, nullptr);
            length_ = std::exchange(o.length_, 0);
        }
        return *this;
    }
    ~UniqueMapping() { reset(); }

    void *get() const { return addr_; }
    size_t size() const { return length_; }
    bool valid() const { return addr_ != nullptr; }
    void reset() {
        if (addr_ != nullptr) {
            ::munmap(addr_, length_);
        }
        addr_ = nullptr;
        length_ = 0;
    }

  private:
    void *addr_ = nullptr;
    size_t length_ = 0;
};

}  // namespace ibvx
