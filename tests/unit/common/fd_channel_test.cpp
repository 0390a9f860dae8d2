#include "common/fd_channel.h"

#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstring>
#include <thread>

#include "common/memfd_region.h"

namespace ibvx {
namespace {

struct SocketPair {
    UniqueFd a, b;
    SocketPair() {
        int sv[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        a.reset(sv[0]);
        b.reset(sv[1]);
    }
};

int openFdCount() {
    int n = 0;
    for (int fd = 0; fd < 1024; ++fd) {
        struct stat st;
        if (::fstat(fd, &st) == 0) {
            ++n;
        }
    }
    return n;
}

TEST(FdChannel, FrameWithFdArrivesAndMapsTheSameMemory) {
    SocketPair sp;
    auto region = MemfdRegion::create("test", 4096);
    ASSERT_TRUE(region.isOk()) << region.status().toString();
    std::strcpy(static_cast<char *>(region->data()), "hello across processes");
    RegionPayload payload{4096, 0, 0};
    ASSERT_EQ(sendFrame(sp.a.get(), FrameType::kRegionAdd, 42, &payload, sizeof(payload), region->fd(), 1000),
              0);

    Frame f;
    ASSERT_EQ(recvFrame(sp.b.get(), &f, 1000), 1);
    EXPECT_EQ(f.type, FrameType::kRegionAdd);
    EXPECT_EQ(f.id, 42u);
    ASSERT_EQ(f.payload.size(), sizeof(RegionPayload));
    ASSERT_TRUE(f.fd.valid());
    EXPECT_NE(f.fd.get(), region->fd());
    auto mapped = MemfdRegion::map(std::move(f.fd), 4096);
    ASSERT_TRUE(mapped.isOk());
    EXPECT_STREQ(static_cast<char *>(mapped->data()), "hello across processes");
}

TEST(FdChannel, FrameWithoutFdHasInvalidFd) {
    SocketPair sp;
    ASSERT_EQ(sendFrame(sp.a.get(), FrameType::kFdTransfer, 7, nullptr, 0, -1, 1000), 0);
    Frame f;
    ASSERT_EQ(recvFrame(sp.b.get(), &f, 1000), 1);
    EXPECT_FALSE(f.fd.valid());
    EXPECT_TRUE(f.payload.empty());
}

TEST(FdChannel, OversizedLengthIsRejectedAndItsFdClosed) {
    SocketPair sp;
    int before = openFdCount();
    {
        auto region = MemfdRegion::create("test", 4096);
        ASSERT_TRUE(region.isOk());
        FrameHeader h{1, kMaxFramePayload + 1, 1};
        // Hand-craft a frame with an fd and a hostile length.
        int fd = region->fd();
        ASSERT_EQ(sendmsgWithFds(sp.a.get(), &h, sizeof(h), {&fd, 1}, 0), static_cast<ssize_t>(sizeof(h)));
    }
    Frame f;
    EXPECT_EQ(recvFrame(sp.b.get(), &f, 1000), -EPROTO);
    EXPECT_EQ(openFdCount(), before);
}

TEST(FdChannel, EofBeforeFrameIsZeroAndMidFrameIsProtocolError) {
    {
        SocketPair sp;
        sp.a.reset();
        Frame f;
        EXPECT_EQ(recvFrame(sp.b.get(), &f, 1000), 0);
    }
    {
        SocketPair sp;
        uint8_t half[8] = {};
        ASSERT_EQ(::write(sp.a.get(), half, sizeof(half)), 8);
        sp.a.reset();
        Frame f;
        EXPECT_EQ(recvFrame(sp.b.get(), &f, 1000), -EPROTO);
    }
}

// The fd channel outlives a broker process (docs/restart.md): a reader that gives up while a
// frame is still arriving (a timeout here; a kill -9 in the broker) must have taken none of it,
// so the socket's next reader gets the whole frame, fd included, and the stream stays in step.
TEST(FdChannel, AFrameStillArrivingIsLeftWholeForTheNextReader) {
    SocketPair sp;
    auto region = MemfdRegion::create("test", 4096);
    ASSERT_TRUE(region.isOk());
    const int before = openFdCount();
    FrameHeader h{static_cast<uint32_t>(FrameType::kRegionAdd), sizeof(RegionPayload), 9};
    int fd = region->fd();
    ASSERT_EQ(sendmsgWithFds(sp.a.get(), &h, sizeof(h), {&fd, 1}, 0), static_cast<ssize_t>(sizeof(h)));

    Frame f;
    EXPECT_EQ(recvFrame(sp.b.get(), &f, 30), -ETIMEDOUT);  // the payload has not come
    int queued = -1;
    ASSERT_EQ(::ioctl(sp.b.get(), SIOCINQ, &queued), 0);
    EXPECT_EQ(queued, static_cast<int>(sizeof(h)));  // nothing was taken
    EXPECT_EQ(openFdCount(), before);                // and no fd received

    RegionPayload payload{4096, 0, 0};
    ASSERT_EQ(::write(sp.a.get(), &payload, sizeof(payload)), static_cast<ssize_t>(sizeof(payload)));
    UniqueFd successor(::dup(sp.b.get()));
    sp.b.reset();
    ASSERT_EQ(recvFrame(successor.get(), &f, 1000), 1);
    EXPECT_EQ(f.id, 9u);
    ASSERT_EQ(f.payload.size(), sizeof(RegionPayload));
    EXPECT_TRUE(f.fd.valid());
    // The next frame is read from its own first byte.
    ASSERT_EQ(sendFrame(sp.a.get(), FrameType::kFdTransfer, 10, nullptr, 0, -1, 1000), 0);
    ASSERT_EQ(recvFrame(successor.get(), &f, 1000), 1);
    EXPECT_EQ(f.type, FrameType::kFdTransfer);
    EXPECT_EQ(f.id, 10u);
}

TEST(FdChannel, SilentPeerTimesOut) {
    SocketPair sp;
    Frame f;
    EXPECT_EQ(recvFrame(sp.b.get(), &f, 50), -ETIMEDOUT);
}

TEST(FdChannel, SendRejectsOversizedPayload) {
    SocketPair sp;
    std::vector<uint8_t> big(kMaxFramePayload + 1);
    EXPECT_EQ(sendFrame(sp.a.get(), FrameType::kRegionAdd, 1, big.data(), big.size(), -1, 100), -EINVAL);
}

TEST(FdChannel, AttachHandshakeReportsBrokerStatus) {
    SocketPair sp;
    SessionToken token{};
    for (size_t i = 0; i < token.size(); ++i) {
        token[i] = static_cast<uint8_t>(i * 17);
    }
    // The broker side is played by hand: read the request, refuse with EPERM.
    std::thread broker([&] {
        AttachRequest req{};
        ASSERT_EQ(::read(sp.b.get(), &req, sizeof(req)), static_cast<ssize_t>(sizeof(req)));
        EXPECT_EQ(std::memcmp(req.magic, kPrefaceMagic, 4), 0);
        EXPECT_EQ(req.version, kFdChannelVersion);
        EXPECT_EQ(std::memcmp(req.token, token.data(), token.size()), 0);
        AttachReply rep{};
        std::memcpy(rep.magic, kPrefaceMagic, 4);
        rep.status = EPERM;
        ASSERT_EQ(::write(sp.b.get(), &rep, sizeof(rep)), static_cast<ssize_t>(sizeof(rep)));
    });
    EXPECT_EQ(attachClient(sp.a.get(), token, 1000), -EPERM);
    broker.join();
}

TEST(SessionTokenHex, RoundTripsAndRejectsBadInput) {
    SessionToken t{};
    for (size_t i = 0; i < t.size(); ++i) {
        t[i] = static_cast<uint8_t>(0xf0 + i);
    }
    std::string hex = tokenToHex(t);
    EXPECT_EQ(hex.size(), 32u);
    SessionToken back{};
    ASSERT_TRUE(tokenFromHex(hex, &back));
    EXPECT_EQ(back, t);
    EXPECT_FALSE(tokenFromHex(hex.substr(1), &back));
    EXPECT_FALSE(tokenFromHex(std::string(32, 'g'), &back));
    EXPECT_FALSE(tokenFromHex(std::string(32, 'A'), &back));  // lower-case only
}

}  // namespace
}  // namespace ibvx
