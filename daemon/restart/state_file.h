// A memfd holding one state record stream (a session's snapshot, the broker's globals) as an
// append-only log, so a commit costs what changed, not the size of the state (docs/restart.md).
//
// Layout: a 4 KiB header page {magic, start, end}, then records from `start` to `end`, each
// {u32 length, u32 CRC-32, u8 type, payload}. A payload is stored zero-run encoded
// (zero_runs.h) when that is shorter, its type then with the high bit set (record types are
// below 0x80); the CRC covers what is stored, records() gives back the decoded record. An
// append writes its records past `end`, then
// moves `end` with one 16-byte pwrite inside the header page: a kill at any instant leaves the
// previous `end` (records past it are ignored), and a record that fails its CRC ends the replay.
// A compaction writes the whole state as new records past `end` and moves `start` and `end` in
// that same single write; the dead prefix is given back with FALLOC_FL_PUNCH_HOLE.
//
// Threading: none; the owner serializes writes (a session's mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ibvx::daemon {

class StateFile {
  public:
    using Record = std::pair<uint8_t, std::string>;  // type (below 0x80), payload

    // How this process writes records (any file reads both): kPlain for what an older broker
    // must still read whole (ibvx.global, whose format field refuses a downgrade).
    enum class Encoding { kZeroRuns, kPlain };

    // A new, empty file (memfd named so in /proc/<pid>/fd).
    static StatusOr<StateFile> create(const std::string &name, Encoding encoding = Encoding::kZeroRuns);
    // A file a previous process wrote (from the fd store or across exec). INVALID_ARGUMENT when
    // the fd is not one (wrong magic, bad header).
    static StatusOr<StateFile> adopt(UniqueFd fd, Encoding encoding = Encoding::kZeroRuns);

    StateFile() = default;
    StateFile(StateFile &&) noexcept = default;
    StateFile &operator=(StateFile &&) noexcept = default;

    // A record of this type is written as it is: its payload is a record as the file stores it
    // (storedRecord()), head and all. A compaction copies a record still current this way
    // instead of building and encoding it again (no record type is 0).
    static constexpr uint8_t kStoredRecord = 0;
    // Where a written record lies, to copy it later: its offset << 24 | its stored size; 0 when
    // it does not fit (an offset past 2^40, a record of 16 MiB or more).
    using Placement = uint64_t;

    // Adds records after the last committed one. placed (when given) gets each record's
    // placement, in order.
    Status append(const std::vector<Record> &records, std::vector<Placement> *placed = nullptr);
    // Replaces everything with records (a full image).
    Status compact(const std::vector<Record> &records, std::vector<Placement> *placed = nullptr);
    // The committed records' stored bytes, read at once (a compaction's copies come from them).
    StatusOr<std::string> storedBytes() const;
    // The stored record at p, out of storedBytes()' result: false when p is not a committed
    // record of this file as it is now (compacted away, or never placed).
    bool storedRecord(const std::string &stored, Placement p, std::string *out) const;
    // Every committed record, in order. A record that fails its CRC (a corrupt file) is an
    // INVALID_ARGUMENT, never a silently shorter state.
    StatusOr<std::vector<Record>> records() const;
    // The same records handed to fn one at a time, in order, without holding them all: a
    // restore replays a 10,000-object log as it reads it. The payload is valid during the call
    // only. The first error, the file's or fn's, ends the walk and is returned; the records fn
    // saw before it may be any prefix, so a caller that must not act on part of a state keeps
    // what fn built until this returns OK.
    using RecordVisitor = std::function<Status(uint8_t type, std::string_view payload)>;
    Status forEachRecord(const RecordVisitor &fn) const;

    int fd() const { return fd_.get(); }
    // Bytes of records written since the last compaction, and in that compaction.
    uint64_t appendedBytes() const { return end_ - compacted_end_; }
    uint64_t compactedBytes() const { return compacted_end_ - start_; }

  private:
    Status writeRecords(const std::vector<Record> &records, uint64_t at, uint64_t *end,
                        std::vector<Placement> *placed);
    Status publish(uint64_t start, uint64_t end);

    UniqueFd fd_;
    uint64_t start_ = 0, end_ = 0, compacted_end_ = 0;
    Encoding encoding_ = Encoding::kZeroRuns;
};

}  // namespace ibvx::daemon
