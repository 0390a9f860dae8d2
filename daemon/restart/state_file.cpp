#include "daemon/restart/state_file.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "common/zero_runs.h"

namespace ibvx::daemon {
namespace {

constexpr char kMagic[8] = {'I', 'B', 'V', 'X', 'L', 'G', '0', '1'};
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kBoundsOffset = 8;  // {start, end}: one 16-byte write
constexpr size_t kRecordHead = 9;      // u32 length, u32 crc, u8 type
constexpr uint32_t kMaxRecord = 64u << 20;
constexpr uint8_t kZeroRunsBit = 0x80;  // the stored payload is zero-run encoded
constexpr uint64_t kPlacedOffsetLimit = uint64_t{1} << 40;
constexpr uint64_t kPlacedSizeLimit = uint64_t{1} << 24;

uint32_t crcOf(uint8_t type, std::string_view payload) {
    uLong c = crc32(0L, Z_NULL, 0);
    c = crc32(c, &type, 1);
    c = crc32(c, reinterpret_cast<const Bytef *>(payload.data()), static_cast<uInt>(payload.size()));
    return static_cast<uint32_t>(c);
}

Status pwriteAll(int fd, const void *buf, uint64_t n, uint64_t off) {
    const char *p = static_cast<const char *>(buf);
    while (n > 0) {
        ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
        if (w < 0) {
            if (errno == EINTR) {
                continue;
            }
            return Status::fromErrno(errno, "cannot write the state file");
        }
        p += w;
        off += static_cast<uint64_t>(w);
        n -= static_cast<uint64_t>(w);
    }
    return Status::ok();
}

bool preadAll(int fd, void *buf, uint64_t n, uint64_t off) {
    char *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false;
        }
        p += r;
        off += static_cast<uint64_t>(r);
        n -= static_cast<uint64_t>(r);
    }
    return true;
}

}  // namespace

StatusOr<StateFile> StateFile::create(const std::string &name, Encoding encoding) {
    StateFile f;
    f.encoding_ = encoding;
    f.fd_.reset(::memfd_create(name.c_str(), MFD_CLOEXEC));
    if (!f.fd_) {
        return Status::fromErrno(errno, "memfd_create for the state file failed");
    }
    char header[kHeaderBytes] = {};
    std::memcpy(header, kMagic, sizeof(kMagic));
    uint64_t bounds[2] = {kHeaderBytes, kHeaderBytes};
    std::memcpy(header + kBoundsOffset, bounds, sizeof(bounds));
    RETURN_IF_ERROR(pwriteAll(f.fd_.get(), header, sizeof(header), 0));
    f.start_ = f.end_ = f.compacted_end_ = kHeaderBytes;
    return f;
}

StatusOr<StateFile> StateFile::adopt(UniqueFd fd, Encoding encoding) {
    StateFile f;
    f.encoding_ = encoding;
    f.fd_ = std::move(fd);
    struct stat st {};
    char head[kBoundsOffset + 16];
    if (::fstat(f.fd_.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < kHeaderBytes ||
        !preadAll(f.fd_.get(), head, sizeof(head), 0) || std::memcmp(head, kMagic, sizeof(kMagic)) != 0) {
        return invalidArgument("not a state file");
    }
    uint64_t bounds[2];
    std::memcpy(bounds, head + kBoundsOffset, sizeof(bounds));
    if (bounds[0] < kHeaderBytes || bounds[1] < bounds[0] || bounds[1] > static_cast<uint64_t>(st.st_size)) {
        return invalidArgument("the state file's header points outside it");
    }
    f.start_ = bounds[0];
    f.end_ = bounds[1];
    f.compacted_end_ = f.end_;  // unknown: the next compaction comes after as much again
    return f;
}

Status StateFile::writeRecords(const std::vector<Record> &records, uint64_t at, uint64_t *end,
                               std::vector<Placement> *placed) {
    // Written through a buffer of up to about kWriteChunk bytes, reused: an image of 10,000
    // objects (~5 MiB) built whole in one string grew it by doubling, each step a fresh mapping
    // that the copy faulted in page by page (~12 us a page on a VM), in the handover and again in
    // the successor's first commit. An append's few records stay one pwrite. The records are not
    // visible before publish() either way.
    constexpr size_t kWriteChunk = 1u << 20;
    std::string buf, encoded;
    uint64_t written = 0;  // bytes of this call already in the file, at `at`
    if (placed != nullptr) {
        placed->clear();
        placed->reserve(records.size());
    }
    auto place = [&](size_t from) {
        if (placed != nullptr) {
            const uint64_t offset = at + written + from, size = buf.size() - from;
            placed->push_back(offset < kPlacedOffsetLimit && size < kPlacedSizeLimit ? offset << 24 | size
                                                                                     : 0);
        }
    };
    for (const auto &[type, payload] : records) {
        if (buf.size() >= kWriteChunk) {
            RETURN_IF_ERROR(pwriteAll(fd_.get(), buf.data(), buf.size(), at + written));
            written += buf.size();
            buf.clear();
        }
        const size_t from = buf.size();
        if (type == kStoredRecord) {
            if (payload.size() < kRecordHead) {
                return invalidArgument("a stored record shorter than its head");
            }
            buf += payload;  // CRC and encoding as they were written
            place(from);
            continue;
        }
        if (payload.size() > kMaxRecord || (type & kZeroRunsBit) != 0) {
            return invalidArgument("state record too large, or of a type past 0x7f");
        }
        const bool encode = encoding_ == Encoding::kZeroRuns && encodeZeroRuns(payload, &encoded);
        const std::string &stored = encode ? encoded : payload;
        const auto stored_type = static_cast<uint8_t>(encode ? type | kZeroRunsBit : type);
        uint32_t head[2] = {static_cast<uint32_t>(stored.size()), crcOf(stored_type, stored)};
        buf.append(reinterpret_cast<const char *>(head), sizeof(head));
        buf.push_back(static_cast<char>(stored_type));
        buf += stored;
        place(from);
    }
    RETURN_IF_ERROR(pwriteAll(fd_.get(), buf.data(), buf.size(), at + written));
    *end = at + written + buf.size();
    return Status::ok();
}

Status StateFile::publish(uint64_t start, uint64_t end) {
    uint64_t bounds[2] = {start, end};
    return pwriteAll(fd_.get(), bounds, sizeof(bounds), kBoundsOffset);
}

Status StateFile::append(const std::vector<Record> &records, std::vector<Placement> *placed) {
    if (!fd_) {
        return Status(Code::kFailedPrecondition, EBADF, "no state file");
    }
    if (records.empty()) {
        return Status::ok();
    }
    uint64_t end = 0;
    RETURN_IF_ERROR(writeRecords(records, end_, &end, placed));
    RETURN_IF_ERROR(publish(start_, end));
    end_ = end;
    return Status::ok();
}

Status StateFile::compact(const std::vector<Record> &records, std::vector<Placement> *placed) {
    if (!fd_) {
        return Status(Code::kFailedPrecondition, EBADF, "no state file");
    }
    uint64_t at = end_, end = 0;
    RETURN_IF_ERROR(writeRecords(records, at, &end, placed));
    RETURN_IF_ERROR(publish(at, end));
    // The old records are dead now: give their memory back (the offsets keep growing, a memfd
    // holds only the pages in use).
    uint64_t dead_from = (start_ + 4095) / 4096 * 4096, dead_to = at / 4096 * 4096;
    if (dead_to > dead_from) {
        (void)::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                          static_cast<off_t>(dead_from), static_cast<off_t>(dead_to - dead_from));
    }
    start_ = at;
    end_ = compacted_end_ = end;
    return Status::ok();
}

StatusOr<std::string> StateFile::storedBytes() const {
    std::string bytes(end_ - start_, '\0');
    if (!preadAll(fd_.get(), bytes.data(), bytes.size(), start_)) {
        return Status::fromErrno(errno != 0 ? errno : EIO, "cannot read the state file");
    }
    return bytes;
}

bool StateFile::storedRecord(const std::string &stored, Placement p, std::string *out) const {
    const uint64_t offset = p >> 24, size = p & (kPlacedSizeLimit - 1);
    if (p == 0 || offset < start_ || size < kRecordHead || offset + size > end_ ||
        end_ - start_ != stored.size()) {
        return false;
    }
    uint32_t length = 0;
    std::memcpy(&length, stored.data() + (offset - start_), sizeof(length));
    if (length + kRecordHead != size) {
        return false;  // not where a record starts: never so for a placement this file gave
    }
    out->assign(stored, offset - start_, size);
    return true;
}

Status StateFile::forEachRecord(const RecordVisitor &fn) const {
    // The records are read through a window of at least kReadWindow bytes, one pread per window:
    // three per record (head, type, payload) cost a restore of 10,000 objects ~46 ms.
    constexpr uint64_t kReadWindow = 1u << 20;
    std::string window;
    uint64_t window_at = start_;  // the file offset of window[0]
    // [at, at + n) of the file, from the window (read anew from at when it does not hold it);
    // nullptr when the read fails. The caller has checked at + n <= end_.
    auto bytes = [&](uint64_t at, uint64_t n) -> const char * {
        if (at < window_at || at + n > window_at + window.size()) {
            window.resize(std::min(std::max(n, kReadWindow), end_ - at));
            window_at = at;
            if (!preadAll(fd_.get(), window.data(), window.size(), at)) {
                window.clear();
                return nullptr;
            }
        }
        return window.data() + (at - window_at);
    };
    std::string decoded;  // one buffer for every zero-run encoded payload
    uint64_t at = start_;
    while (at < end_) {
        const char *head_bytes = end_ - at < kRecordHead ? nullptr : bytes(at, kRecordHead);
        uint32_t head[2] = {0, 0};
        if (head_bytes != nullptr) {
            std::memcpy(head, head_bytes, sizeof(head));
        }
        if (head_bytes == nullptr || head[0] > kMaxRecord || head[0] > end_ - at - kRecordHead) {
            return invalidArgument("the state file holds a truncated record");
        }
        auto type = static_cast<uint8_t>(head_bytes[8]);
        const char *data = bytes(at + kRecordHead, head[0]);
        if (data == nullptr || crcOf(type, std::string_view(data, head[0])) != head[1]) {
            return invalidArgument("the state file holds a record that fails its CRC");
        }
        std::string_view payload(data, head[0]);
        if ((type & kZeroRunsBit) != 0) {
            if (!decodeZeroRuns(payload, kMaxRecord, &decoded)) {
                return invalidArgument("the state file holds a record that does not decode");
            }
            payload = decoded;
            type &= static_cast<uint8_t>(~kZeroRunsBit);
        }
        RETURN_IF_ERROR(fn(type, payload));
        at += kRecordHead + head[0];
    }
    return Status::ok();
}

StatusOr<std::vector<StateFile::Record>> StateFile::records() const {
    std::vector<Record> out;
    RETURN_IF_ERROR(forEachRecord([&out](uint8_t type, std::string_view payload) {
        out.emplace_back(type, std::string(payload));
        return Status::ok();
    }));
    return out;
}

}  // namespace ibvx::daemon
