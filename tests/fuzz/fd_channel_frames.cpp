// Fuzz target: the fd-channel frame reader (common/fd_channel.h recvFrame), the code the broker
// runs on bytes and descriptors a tenant controls.
//
// Input layout: byte 0 picks the read timeout (-1, 0 or 1000 ms); the rest is a list of segments,
// each `u8 fds, u16 length (LE), bytes[length]`, sent with one sendmsg() each carrying `fds & 7`
// copies of a memfd (more than the reader's control buffer holds, to reach the truncation path).
// A tail too short for a segment header is sent as plain bytes. The write side is then shut down
// and frames are read until recvFrame returns 0 or an error.
//
// Invariants: no crash; every returned frame is exactly the frame a model of the byte stream
// predicts (so payloads never exceed kMaxFramePayload and no byte is skipped or invented); 0 only
// at the exact end of the stream; errors only -EPROTO, and only where the stream is malformed or
// descriptors were sent; a returned fd is one of ours; no fd leaks.

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/fd_channel.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ibvx::Frame;
using ibvx::FrameHeader;
using ibvx::kMaxFramePayload;

// Bounds the work one input can ask for (sendmsg calls and descriptors in flight), keeping the
// socket buffer far from full so every write succeeds.
constexpr size_t kMaxSegments = 64;
constexpr size_t kMaxFdsPerSegment = 7;
static_assert(kMaxFdsPerSegment <= ibvx::kMaxFdsPerSendmsg);

// One memfd for the whole run, sent as often as inputs ask: each copy the reader keeps is a new
// descriptor of the same file, which is how the test recognises it.
int sharedMemfd() {
    static int fd = [] {
        int f = ::memfd_create("ibvx-fuzz-fd-channel", MFD_CLOEXEC);
        FUZZ_CHECK(f >= 0, "memfd_create failed: %s", std::strerror(errno));
        return f;
    }();
    return fd;
}

bool isSharedMemfd(int fd) {
    struct stat a, b;
    return ::fstat(fd, &a) == 0 && ::fstat(sharedMemfd(), &b) == 0 && a.st_ino == b.st_ino &&
           a.st_dev == b.st_dev;
}

struct Segment {
    size_t fds = 0;
    std::vector<uint8_t> bytes;
};

std::vector<Segment> parseSegments(const uint8_t *data, size_t size) {
    std::vector<Segment> out;
    size_t off = 0;
    while (off < size) {
        Segment s;
        if (size - off < 3 || out.size() + 1 == kMaxSegments) {
            s.bytes.assign(data + off, data + size);
            out.push_back(std::move(s));
            break;
        }
        s.fds = data[off] & kMaxFdsPerSegment;
        size_t len = data[off + 1] | static_cast<size_t>(data[off + 2]) << 8;
        off += 3;
        len = std::min(len, size - off);
        s.bytes.assign(data + off, data + off + len);
        off += len;
        out.push_back(std::move(s));
    }
    return out;
}

void sendSegment(int sock, const Segment &s) {
    if (s.bytes.empty()) {
        return;  // a stream socket carries no descriptors without at least one byte
    }
    std::array<int, kMaxFdsPerSegment> fds;
    fds.fill(sharedMemfd());
    ssize_t n =
        ibvx::sendmsgWithFds(sock, s.bytes.data(), s.bytes.size(), std::span(fds).first(s.fds), MSG_NOSIGNAL);
    FUZZ_CHECK(n == static_cast<ssize_t>(s.bytes.size()), "sendmsg of %zu bytes returned %zd (%s)",
               s.bytes.size(), n, std::strerror(errno));
}

// What recvFrame must return at `off` of the sent byte stream when no descriptor gets in the way.
struct Expected {
    int result;  // 1, 0 or -EPROTO
    FrameHeader header{};
    size_t payload_off = 0;
};

Expected expectAt(const std::vector<uint8_t> &stream, size_t off) {
    Expected e{};
    size_t left = stream.size() - off;
    if (left == 0) {
        e.result = 0;
        return e;
    }
    if (left < sizeof(FrameHeader)) {
        e.result = -EPROTO;
        return e;
    }
    std::memcpy(&e.header, stream.data() + off, sizeof(FrameHeader));
    if (e.header.length > kMaxFramePayload || left - sizeof(FrameHeader) < e.header.length) {
        e.result = -EPROTO;
        return e;
    }
    e.result = 1;
    e.payload_off = off + sizeof(FrameHeader);
    return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) {
        return 0;
    }
    static const int kTimeouts[] = {-1, 0, 1000};
    const int timeout_ms = kTimeouts[data[0] % 3];
    std::vector<Segment> segments = parseSegments(data + 1, size - 1);

    sharedMemfd();  // opened once, outside the census
    const int fds_before = ibvx::fuzz::countOpenFds();
    {
        int sv[2];
        FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s",
                   std::strerror(errno));
        ibvx::UniqueFd writer(sv[0]), reader(sv[1]);

        std::vector<uint8_t> stream;
        size_t fds_sent = 0;
        for (const Segment &s : segments) {
            sendSegment(writer.get(), s);
            stream.insert(stream.end(), s.bytes.begin(), s.bytes.end());
            fds_sent += s.bytes.empty() ? 0 : s.fds;
        }
        FUZZ_CHECK(::shutdown(writer.get(), SHUT_WR) == 0, "shutdown: %s", std::strerror(errno));

        size_t off = 0;
        size_t frames_with_fd = 0;
        for (;;) {
            Frame f;
            int r = ibvx::recvFrame(reader.get(), &f, timeout_ms);
            Expected e = expectAt(stream, off);
            if (r == 1) {
                FUZZ_CHECK(e.result == 1, "a frame was returned at offset %zu where the stream has %s", off,
                           e.result == 0 ? "ended" : "no complete frame");
                FUZZ_CHECK(f.payload.size() <= kMaxFramePayload, "payload of %zu bytes", f.payload.size());
                FUZZ_CHECK(static_cast<uint32_t>(f.type) == e.header.type && f.id == e.header.id &&
                               f.payload.size() == e.header.length,
                           "frame at offset %zu differs from the bytes sent", off);
                FUZZ_CHECK(f.payload.empty() || std::memcmp(f.payload.data(), stream.data() + e.payload_off,
                                                            f.payload.size()) == 0,
                           "payload at offset %zu differs from the bytes sent", off);
                if (f.fd) {
                    FUZZ_CHECK(isSharedMemfd(f.fd.get()), "frame carries fd %d that is not the one sent",
                               f.fd.get());
                    ++frames_with_fd;
                }
                off = e.payload_off + f.payload.size();
                continue;
            }
            if (r == 0) {
                FUZZ_CHECK(e.result == 0, "EOF reported at offset %zu of %zu", off, stream.size());
                break;
            }
            FUZZ_CHECK(r == -EPROTO, "unexpected error %d (%s) at offset %zu", r, std::strerror(-r), off);
            FUZZ_CHECK(e.result == -EPROTO || fds_sent > 0,
                       "-EPROTO at offset %zu for a well-formed stream without descriptors", off);
            break;
        }
        FUZZ_CHECK(frames_with_fd <= fds_sent, "%zu frames carry fds but only %zu were sent", frames_with_fd,
                   fds_sent);
    }
    // Descriptors still queued in the closed socket are released by the kernel, and every one
    // recvFrame received belongs to a Frame that is gone or was closed with its bad frame.
    const int fds_after = ibvx::fuzz::countOpenFds();
    FUZZ_CHECK(fds_after == fds_before, "fd leak: %d open before, %d after", fds_before, fds_after);
    return 0;
}
