// The fd channel: a plain Unix-socket connection beside the gRPC one that carries file
// descriptors (SCM_RIGHTS) between a tenant and the broker. gRPC cannot carry fds, and queue
// memory reaches a tenant only as memfds it maps.
//
// Wire format (docs/protocol.md has the full story):
//   attach (client -> broker): AttachRequest  = "IBVX" u8 version u8[3] zero, token[16]
//   reply  (broker -> client): AttachReply    = "IBVX" i32 status (0 or positive errno)
//   then frames both ways: FrameHeader {u32 type, u32 length, u64 id} + payload[length]
//   (length <= kMaxFramePayload), with at most kMaxFdsPerFrame fds attached to the header bytes.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/unique_fd.h"

namespace ibvx {

inline constexpr char kPrefaceMagic[4] = {'I', 'B', 'V', 'X'};
inline constexpr uint8_t kFdChannelVersion = 1;
inline constexpr size_t kSessionTokenSize = 16;
inline constexpr uint32_t kMaxFramePayload = 4096;
inline constexpr size_t kMaxFdsPerFrame = 1;

using SessionToken = std::array<uint8_t, kSessionTokenSize>;

struct AttachRequest {
    char magic[4];
    uint8_t version;
    uint8_t pad[3];
    uint8_t token[kSessionTokenSize];
};
static_assert(sizeof(AttachRequest) == 24);

struct AttachReply {
    char magic[4];
    int32_t status;
};
static_assert(sizeof(AttachReply) == 8);

enum class FrameType : uint32_t {
    // broker -> client: a region to map. id = region id, fd attached, payload = RegionPayload.
    kRegionAdd = 1,
    // client -> broker: memory for RegMr. id = xfer id chosen by the client, fd attached.
    kFdTransfer = 2,
};

struct FrameHeader {
    uint32_t type;
    uint32_t length;
    uint64_t id;
};
static_assert(sizeof(FrameHeader) == 16);

struct RegionPayload {
    uint64_t size;   // bytes to map from offset 0 of the fd
    uint32_t flags;  // reserved, 0
    uint32_t pad;
};
static_assert(sizeof(RegionPayload) == 16);

struct Frame {
    FrameType type{};
    uint64_t id = 0;
    std::vector<uint8_t> payload;
    UniqueFd fd;  // invalid when the frame carried none
};

// Sends one frame; fd < 0 means none. Returns 0 or -errno. Handles EINTR and short writes of a
// blocking or non-blocking socket (waits with poll up to timeout_ms for writability).
int sendFrame(int sock, FrameType type, uint64_t id, const void *payload, uint32_t length, int fd,
              int timeout_ms);

// One sendmsg() of len bytes with fds attached (SCM_RIGHTS), or none when fds is empty. Returns
// what sendmsg() returns; -1 with errno EINVAL for more than kMaxFdsPerSendmsg fds. A frame
// carries one fd at most, but tests and fuzzers also send what a hostile peer would.
inline constexpr size_t kMaxFdsPerSendmsg = 8;
ssize_t sendmsgWithFds(int sock, const void *data, size_t len, std::span<const int> fds, int flags);

// Receives one frame. Returns 1 with *out filled, 0 on orderly EOF before a frame, or -errno:
// -EPROTO for a malformed frame (oversized length, more fds than allowed, fd with a truncated
// control message) — every fd received with a bad frame is closed. -ETIMEDOUT when nothing
// complete arrived within timeout_ms (-1 = wait forever). Nothing of a frame is taken from the
// socket until all of it is there, so a reader that times out, or is killed, while a frame
// arrives leaves it whole for the next reader of the socket (a restarted broker,
// docs/restart.md).
int recvFrame(int sock, Frame *out, int timeout_ms);

// Client side of the attach handshake. Returns 0 or -errno (the broker's status when refused).
int attachClient(int sock, const SessionToken &token, int timeout_ms);

std::string tokenToHex(const SessionToken &token);
bool tokenFromHex(const std::string &hex, SessionToken *out);

}  // namespace ibvx
