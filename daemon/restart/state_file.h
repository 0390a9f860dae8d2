// A memfd holding the newest committed bytes of one state record (a session's snapshot, the
// broker's globals), double-buffered so that a kill at any instant leaves the previous commit
// readable (docs/restart.md).
//
// Layout: a 4 KiB header page, then the two slots' data areas wherever the header says. The
// header holds a magic and, per slot, {generation, offset, length, CRC-32}. A write fills the
// older slot's area (moving it to the end of the file when it is too small), then rewrites that
// slot's 32-byte descriptor in one pwrite inside the header page: a write either lands whole or
// not at all, and a torn data area fails its CRC. read() answers the valid slot with the
// highest generation.
//
// Threading: none; the owner serializes writes (a session's mutex).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx::daemon {

class StateFile {
  public:
    // A new, empty file (memfd named so in /proc/<pid>/fd).
    static StatusOr<StateFile> create(const std::string &name);
    // A file a previous process wrote (from the fd store or across exec). INVALID_ARGUMENT when
    // the fd is not one (wrong magic, too short).
    static StatusOr<StateFile> adopt(UniqueFd fd);

    StateFile() = default;
    StateFile(StateFile &&) noexcept = default;
    StateFile &operator=(StateFile &&) noexcept = default;

    Status write(const std::string &bytes);
    // The newest valid commit; NOT_FOUND when nothing valid was ever written.
    StatusOr<std::string> read() const;

    int fd() const { return fd_.get(); }
    uint64_t generation() const { return gen_; }

  private:
    struct Slot {
        uint64_t gen = 0, offset = 0, length = 0, capacity = 0;
    };
    Status loadHeader();

    UniqueFd fd_;
    Slot slots_[2];
    uint64_t gen_ = 0;
    uint64_t end_ = 0;  // file size
};

}  // namespace ibvx::daemon
