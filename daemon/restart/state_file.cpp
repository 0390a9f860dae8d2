#include "daemon/restart/state_file.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

namespace ibvx::daemon {
namespace {

constexpr char kMagic[8] = {'I', 'B', 'V', 'X', 'S', 'T', '0', '1'};
constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kDescOffset = 8;  // two descriptors follow the magic

// One slot's descriptor as stored (little-endian hosts only: the file never leaves the host).
struct Desc {
    uint64_t gen;
    uint64_t offset;
    uint64_t length;
    uint32_t crc;
    uint32_t capacity_pages;  // the area's size in 4 KiB pages
};
static_assert(sizeof(Desc) == 32);

uint32_t crcOf(const char *data, uint64_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        auto chunk = static_cast<uInt>(std::min<uint64_t>(n, 1u << 30));
        c = crc32(c, reinterpret_cast<const Bytef *>(data), chunk);
        data += chunk;
        n -= chunk;
    }
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

Status preadAll(int fd, void *buf, uint64_t n, uint64_t off) {
    char *p = static_cast<char *>(buf);
    while (n > 0) {
        ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return Status(Code::kInvalidArgument, EIO, "the state file is shorter than its header says");
        }
        p += r;
        off += static_cast<uint64_t>(r);
        n -= static_cast<uint64_t>(r);
    }
    return Status::ok();
}

uint64_t pagesUp(uint64_t n) {
    return (n + 4095) / 4096 * 4096;
}

}  // namespace

StatusOr<StateFile> StateFile::create(const std::string &name) {
    StateFile f;
    f.fd_.reset(::memfd_create(name.c_str(), MFD_CLOEXEC));
    if (!f.fd_) {
        return Status::fromErrno(errno, "memfd_create for the state file failed");
    }
    char header[kHeaderBytes] = {};
    std::memcpy(header, kMagic, sizeof(kMagic));
    RETURN_IF_ERROR(pwriteAll(f.fd_.get(), header, sizeof(header), 0));
    f.end_ = kHeaderBytes;
    return f;
}

StatusOr<StateFile> StateFile::adopt(UniqueFd fd) {
    StateFile f;
    f.fd_ = std::move(fd);
    RETURN_IF_ERROR(f.loadHeader());
    return f;
}

Status StateFile::loadHeader() {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) {
        return Status::fromErrno(errno, "cannot stat the state file");
    }
    if (static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
        return invalidArgument("the state file is too short");
    }
    end_ = static_cast<uint64_t>(st.st_size);
    char head[kDescOffset + 2 * sizeof(Desc)];
    RETURN_IF_ERROR(preadAll(fd_.get(), head, sizeof(head), 0));
    if (std::memcmp(head, kMagic, sizeof(kMagic)) != 0) {
        return invalidArgument("not a state file (bad magic)");
    }
    for (int i = 0; i < 2; ++i) {
        Desc d;
        std::memcpy(&d, head + kDescOffset + i * sizeof(Desc), sizeof(d));
        uint64_t cap = uint64_t{d.capacity_pages} * 4096;
        // A descriptor pointing outside the file is treated as empty, never followed.
        if (d.gen == 0 || d.offset < kHeaderBytes || d.length > cap || d.offset > end_ ||
            cap > end_ - d.offset) {
            slots_[i] = Slot{};
            continue;
        }
        slots_[i] = Slot{d.gen, d.offset, d.length, cap};
        gen_ = std::max(gen_, d.gen);
    }
    return Status::ok();
}

Status StateFile::write(const std::string &bytes) {
    if (!fd_) {
        return Status(Code::kFailedPrecondition, EBADF, "no state file");
    }
    int s = slots_[0].gen <= slots_[1].gen ? 0 : 1;  // the older one
    Slot slot = slots_[s];
    if (slot.capacity < bytes.size() || slot.offset == 0) {
        // A new area at the end, with room to grow: the file grows at most to about four times
        // the largest record.
        slot.offset = end_;
        slot.capacity = pagesUp(std::max<uint64_t>(bytes.size() * 2, 4096));
        if (slot.capacity / 4096 > UINT32_MAX) {
            return invalidArgument("state record too large");
        }
        if (::ftruncate(fd_.get(), static_cast<off_t>(slot.offset + slot.capacity)) != 0) {
            return Status::fromErrno(errno, "cannot grow the state file");
        }
        end_ = slot.offset + slot.capacity;
    }
    RETURN_IF_ERROR(pwriteAll(fd_.get(), bytes.data(), bytes.size(), slot.offset));
    Desc d{gen_ + 1, slot.offset, bytes.size(), crcOf(bytes.data(), bytes.size()),
           static_cast<uint32_t>(slot.capacity / 4096)};
    RETURN_IF_ERROR(pwriteAll(fd_.get(), &d, sizeof(d), kDescOffset + s * sizeof(Desc)));
    slot.gen = d.gen;
    slot.length = bytes.size();
    slots_[s] = slot;
    gen_ = d.gen;
    return Status::ok();
}

StatusOr<std::string> StateFile::read() const {
    int order[2] = {slots_[0].gen >= slots_[1].gen ? 0 : 1, slots_[0].gen >= slots_[1].gen ? 1 : 0};
    for (int i : order) {
        const Slot &slot = slots_[i];
        if (slot.gen == 0) {
            continue;
        }
        std::string out(slot.length, '\0');
        if (!preadAll(fd_.get(), out.data(), slot.length, slot.offset).isOk()) {
            continue;
        }
        Desc d;
        if (!preadAll(fd_.get(), &d, sizeof(d), kDescOffset + i * sizeof(Desc)).isOk() ||
            d.crc != crcOf(out.data(), out.size())) {
            continue;  // torn or corrupt: the other slot is the last good commit
        }
        return out;
    }
    return Status(Code::kNotFound, ENOENT, "the state file holds no valid commit");
}

}  // namespace ibvx::daemon
