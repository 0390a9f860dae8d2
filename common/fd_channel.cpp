#include "common/fd_channel.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace ibvx {
namespace {

using Clock = std::chrono::steady_clock;

// Milliseconds left until deadline; -1 for "no deadline".
int remainingMs(int timeout_ms, Clock::time_point start) {
    if (timeout_ms < 0) {
        return -1;
    }
    auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
    return elapsed >= timeout_ms ? 0 : static_cast<int>(timeout_ms - elapsed);
}

int waitFor(int sock, short events, int timeout_ms) {
    pollfd pfd{sock, events, 0};
    for (;;) {
        int r = ::poll(&pfd, 1, timeout_ms);
        if (r > 0) {
            return 0;
        }
        if (r == 0) {
            return -ETIMEDOUT;
        }
        if (errno != EINTR) {
            return -errno;
        }
    }
}

// Writes all bytes; the first sendmsg may carry an fd. Returns 0 or -errno.
int sendAll(int sock, const uint8_t *data, size_t len, int fd, int timeout_ms) {
    auto start = Clock::now();
    bool fd_sent = fd < 0;
    size_t off = 0;
    while (off < len) {
        if (timeout_ms >= 0) {
            int w = waitFor(sock, POLLOUT, remainingMs(timeout_ms, start));
            if (w < 0) {
                return w;
            }
        }
        std::span<const int> fds = fd_sent ? std::span<const int>() : std::span<const int>(&fd, 1);
        ssize_t n = sendmsgWithFds(sock, data + off, len - off, fds, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int w = waitFor(sock, POLLOUT, remainingMs(timeout_ms, start));
                if (w < 0) {
                    return w;
                }
                continue;
            }
            return -errno;
        }
        fd_sent = true;
        off += static_cast<size_t>(n);
    }
    return 0;
}

// Reads exactly len bytes, collecting fds that arrive with them. Returns 1, 0 (EOF before any
// byte), or -errno (-EPROTO for EOF mid-frame or too many fds).
int recvAll(int sock, uint8_t *data, size_t len, std::vector<int> *fds, int timeout_ms,
            Clock::time_point start) {
    size_t off = 0;
    while (off < len) {
        // A blocking socket never reports EAGAIN, so a deadline needs poll() up front.
        if (timeout_ms >= 0) {
            int w = waitFor(sock, POLLIN, remainingMs(timeout_ms, start));
            if (w < 0) {
                return w;
            }
        }
        iovec iov{data + off, len - off};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)];
        msg.msg_control = ctrl;
        msg.msg_controllen = sizeof(ctrl);
        ssize_t n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                int w = waitFor(sock, POLLIN, remainingMs(timeout_ms, start));
                if (w < 0) {
                    return w;
                }
                continue;
            }
            return -errno;
        }
        bool truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
        for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count; ++i) {
                    int f;
                    std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                    fds->push_back(f);
                }
            }
        }
        if (truncated || fds->size() > kMaxFdsPerFrame) {
            return -EPROTO;
        }
        if (n == 0) {
            return off == 0 ? 0 : -EPROTO;
        }
        off += static_cast<size_t>(n);
    }
    return 1;
}

// Waits until a whole frame is queued on sock, consuming nothing: a reader that stops at any
// point before its frame is complete (a broker killed while a tenant's frame arrives) leaves the
// frame whole in the socket for the socket's next reader (the broker's successor, which inherits
// the fd channel). 1 when the frame is all there, 0 at EOF before any byte of a frame, -EPROTO
// for a hostile length or an EOF inside a frame, -ETIMEDOUT, or another -errno.
//
// A frame is sent with one sendmsg (sendFrame), so it normally arrives whole and this returns at
// once. When it does not, nothing here tells when the rest comes (the socket stays readable), so
// the wait is a short sleep between looks. A header split so that its first part carries the fd
// cannot be peeked past that part (Linux stops a peek after an skb with fds): once its 16 bytes
// are queued it is taken, and only then is the rest waited for, as before.
int awaitWholeFrame(int sock, int timeout_ms, Clock::time_point start) {
    for (;;) {
        pollfd pfd{sock, POLLIN | POLLRDHUP, 0};
        int w = ::poll(&pfd, 1, remainingMs(timeout_ms, start));
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w < 0) {
            return -errno;
        }
        if (w == 0) {
            return -ETIMEDOUT;
        }
        int queued = 0;
        if (::ioctl(sock, SIOCINQ, &queued) < 0) {
            return -errno;
        }
        const bool peer_done = (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
        if (queued == 0 && peer_done) {
            return 0;
        }
        size_t need = sizeof(FrameHeader);
        if (static_cast<size_t>(queued) >= sizeof(FrameHeader)) {
            FrameHeader h{};
            ssize_t n = ::recv(sock, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT);
            if (n == static_cast<ssize_t>(sizeof(h))) {
                if (h.length > kMaxFramePayload) {
                    return -EPROTO;
                }
                need += h.length;
            }
        }
        if (queued > 0 && static_cast<size_t>(queued) >= need) {
            return 1;
        }
        if (peer_done) {
            return -EPROTO;  // the rest of the frame can never come
        }
        if (remainingMs(timeout_ms, start) == 0) {
            return -ETIMEDOUT;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

}  // namespace

ssize_t sendmsgWithFds(int sock, const void *data, size_t len, std::span<const int> fds, int flags) {
    if (fds.size() > kMaxFdsPerSendmsg) {
        errno = EINVAL;
        return -1;
    }
    iovec iov{const_cast<void *>(data), len};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerSendmsg)];
    if (!fds.empty()) {
        std::memset(ctrl, 0, sizeof(ctrl));
        msg.msg_control = ctrl;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    return ::sendmsg(sock, &msg, flags);
}

int sendFrame(int sock, FrameType type, uint64_t id, const void *payload, uint32_t length, int fd,
              int timeout_ms) {
    if (length > kMaxFramePayload || (length > 0 && payload == nullptr)) {
        return -EINVAL;
    }
    std::vector<uint8_t> buf(sizeof(FrameHeader) + length);
    FrameHeader h{static_cast<uint32_t>(type), length, id};
    std::memcpy(buf.data(), &h, sizeof(h));
    if (length > 0) {
        std::memcpy(buf.data() + sizeof(h), payload, length);
    }
    return sendAll(sock, buf.data(), buf.size(), fd, timeout_ms);
}

int recvFrame(int sock, Frame *out, int timeout_ms) {
    auto start = Clock::now();
    std::vector<int> fds;
    auto closeAll = [&fds] {
        for (int f : fds) {
            ::close(f);
        }
    };
    const int whole = awaitWholeFrame(sock, timeout_ms, start);
    if (whole <= 0) {
        return whole;
    }
    FrameHeader h{};
    int r = recvAll(sock, reinterpret_cast<uint8_t *>(&h), sizeof(h), &fds, timeout_ms, start);
    if (r <= 0) {
        closeAll();
        return r == 0 ? 0 : r;
    }
    if (h.length > kMaxFramePayload) {
        closeAll();
        return -EPROTO;
    }
    std::vector<uint8_t> payload(h.length);
    if (h.length > 0) {
        r = recvAll(sock, payload.data(), h.length, &fds, timeout_ms, start);
        if (r <= 0) {
            closeAll();
            return r == 0 ? -EPROTO : r;
        }
    }
    out->type = static_cast<FrameType>(h.type);
    out->id = h.id;
    out->payload = std::move(payload);
    out->fd.reset(fds.empty() ? -1 : fds.front());
    return 1;
}

int attachClient(int sock, const SessionToken &token, int timeout_ms) {
    AttachRequest req{};
    std::memcpy(req.magic, kPrefaceMagic, sizeof(req.magic));
    req.version = kFdChannelVersion;
    std::memcpy(req.token, token.data(), token.size());
    int r = sendAll(sock, reinterpret_cast<const uint8_t *>(&req), sizeof(req), -1, timeout_ms);
    if (r < 0) {
        return r;
    }
    AttachReply rep{};
    std::vector<int> fds;
    r = recvAll(sock, reinterpret_cast<uint8_t *>(&rep), sizeof(rep), &fds, timeout_ms, Clock::now());
    for (int f : fds) {
        ::close(f);
    }
    if (r == 0) {
        return -ECONNRESET;
    }
    if (r < 0) {
        return r;
    }
    if (std::memcmp(rep.magic, kPrefaceMagic, sizeof(rep.magic)) != 0) {
        return -EPROTO;
    }
    return rep.status == 0 ? 0 : -rep.status;
}

std::string tokenToHex(const SessionToken &token) {
    static const char digits[] = "0123456789abcdef";
    std::string s;
    s.reserve(token.size() * 2);
    for (uint8_t b : token) {
        s.push_back(digits[b >> 4]);
        s.push_back(digits[b & 0xf]);
    }
    return s;
}

bool tokenFromHex(const std::string &hex, SessionToken *out) {
    if (hex.size() != kSessionTokenSize * 2) {
        return false;
    }
    auto nibble = [](char c) -> int {
        if (c >= '0' && c <= '9') {
            return c - '0';
        }
        if (c >= 'a' && c <= 'f') {
            return c - 'a' + 10;
        }
        return -1;
    };
    for (size_t i = 0; i < kSessionTokenSize; ++i) {
        int hi = nibble(hex[2 * i]);
        int lo = nibble(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            return false;
        }
        (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
    }
    return true;
}

}  // namespace ibvx
