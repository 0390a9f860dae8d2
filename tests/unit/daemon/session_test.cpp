// A session's stored replies (idempotency, docs/restart.md): kept packed, and with their zero
// runs as counts when that is shorter (issue 25), each one reads back exactly as it was stored,
// whatever its bytes. And the order a session's objects are restored and written in.
#include "daemon/core/session.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "daemon/core/objects.h"

namespace ibvx::daemon {
namespace {

StoredReply reply(uint64_t key, std::string response, std::string message = {}, std::string details = {}) {
    StoredReply r;
    r.key = key;
    r.method = "/ibv_extend.v1.Broker/CreateQp";
    r.code = key % 2 == 0 ? 0 : 5;
    r.message = std::move(message);
    r.details = std::move(details);
    r.response = std::move(response);
    return r;
}

// Shaped as a CreateQp's response as the edge serializes it: fields between runs of zero bytes
// (ibv_qp_extend.resv, the queue_info reserved words), 430 of its 600 bytes.
std::string zeroHeavy(uint64_t seed) {
    std::string s(600, '\0');
    for (size_t field = 0; field < 10; ++field) {
        for (size_t i = 0; i < 17; ++i) {
            s[field * 60 + i] = static_cast<char>(1 + (seed + field + i) % 250);
        }
    }
    return s;
}

std::unique_ptr<Session> sessionWith(std::vector<StoredReply> replies) {
    SessionHistory history;
    history.replies = std::move(replies);
    return std::make_unique<Session>(1, SessionToken{}, PeerIdentity{}, "test", UniqueFd(),
                                     MappingManager::instance().createSession(1), UniqueFd(),
                                     std::move(history));
}

void expectSame(const StoredReply &want, const StoredReply &got) {
    EXPECT_EQ(got.key, want.key);
    EXPECT_EQ(got.method, want.method);
    EXPECT_EQ(got.code, want.code);
    EXPECT_EQ(got.message, want.message);
    EXPECT_EQ(got.details, want.details);
    EXPECT_EQ(got.response, want.response);
}

TEST(SessionReplies, EveryReplyReadsBackExactly) {
    std::vector<StoredReply> in = {
        reply(1, zeroHeavy(1)),
        reply(2, "no zero bytes at all"),
        reply(3, std::string()),
        reply(4, std::string(4, '\0'), std::string("a message\0\0\0\0\0 with zeros", 26),
              std::string(9, '\0')),
        reply(5, std::string(1, '\0')),
        reply(6, zeroHeavy(6) + std::string(100000, '\0') + "tail"),
    };
    auto s = sessionWith(in);
    std::vector<StoredReply> out = s->replies();
    ASSERT_EQ(out.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        expectSame(in[i], out[i]);
        std::optional<StoredReply> found = s->findReply(in[i].key);
        ASSERT_TRUE(found.has_value()) << in[i].key;
        expectSame(in[i], *found);
    }
    EXPECT_FALSE(s->findReply(99).has_value());
    uint64_t seq = 4;
    std::vector<StoredReply> fresh = s->repliesSince(&seq);
    ASSERT_EQ(fresh.size(), 2u);
    expectSame(in[4], fresh[0]);
    expectSame(in[5], fresh[1]);
    EXPECT_EQ(seq, in.size());
}

// A session keeps kMaxReplies replies; a CreateQp's ~600 bytes, mostly zeros, are kept with their
// bookkeeping in well under their raw size (kept plain, the buffers alone are more than it).
TEST(SessionReplies, ZeroHeavyRepliesAreKeptCompact) {
    std::vector<StoredReply> in;
    for (uint64_t k = 1; k <= Session::kMaxReplies; ++k) {
        in.push_back(reply(k, zeroHeavy(k)));
    }
    auto s = sessionWith(in);
    const size_t raw = Session::kMaxReplies * (in[0].method.size() + in[0].response.size());
    EXPECT_LT(s->storedReplyBytes(), raw * 3 / 5) << "raw " << raw;
    EXPECT_GT(s->storedReplyBytes(), 0u);
    std::vector<StoredReply> out = s->replies();
    ASSERT_EQ(out.size(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
        expectSame(in[i], out[i]);
    }
}

// Retired replies (the tenant has them) are dropped wherever they are kept; the restart layer's
// pass over the replies stored since its last one still finds exactly the new ones, and takes
// the retired keys once.
TEST(SessionReplies, RetiredRepliesAreDroppedAndTheNewOnesStillFound) {
    std::vector<StoredReply> in;
    for (uint64_t k = 1; k <= 6; ++k) {
        in.push_back(reply(k, zeroHeavy(k)));
    }
    auto s = sessionWith(in);
    uint64_t seq = 4;  // the restart layer logged the first four
    const size_t before = s->storedReplyBytes();
    EXPECT_EQ(s->retireReplies({2, 5, 77, 2}), 2u);  // 77 was never kept; 2 only once
    EXPECT_LT(s->storedReplyBytes(), before);
    EXPECT_FALSE(s->findReply(2).has_value());
    EXPECT_FALSE(s->findReply(5).has_value());
    for (uint64_t k : {1, 3, 4, 6}) {
        EXPECT_TRUE(s->findReply(k).has_value()) << k;
    }
    std::vector<StoredReply> fresh = s->repliesSince(&seq);
    ASSERT_EQ(fresh.size(), 1u);  // 5 and 6 were new; 5 is gone
    expectSame(in[5], fresh[0]);
    EXPECT_EQ(seq, in.size());
    EXPECT_EQ(s->takeRetired(), (std::vector<uint64_t>{2, 5}));
    EXPECT_TRUE(s->takeRetired().empty());
    s->untakeRetired({2, 5});
    EXPECT_EQ(s->retireReplies({6}), 1u);
    EXPECT_EQ(s->takeRetired(), (std::vector<uint64_t>{2, 5, 6}));  // given back before the newer
    EXPECT_EQ(s->replies().size(), 3u);
}

// The order a restore makes objects in and a handover writes them: every kind after the kinds
// its objects use (kParentsFirst), each kind's objects in the order given, and a value that names
// no kind (a corrupt record, which the import then refuses) after them all.
TEST(ParentsFirst, KindsComeInParentsFirstOrderAndKeepTheirOrderWithinAKind) {
    struct Item {
        ObjectKind kind;
        int seq;
    };
    const auto nokind = static_cast<ObjectKind>(200);
    const std::vector<Item> items = {
        {ObjectKind::kQp, 0},      {nokind, 1},           {ObjectKind::kCq, 2},  {ObjectKind::kQp, 3},
        {ObjectKind::kContext, 4}, {ObjectKind::kMw, 5},  {ObjectKind::kMr, 6},  {ObjectKind::kPd, 7},
        {ObjectKind::kCq, 8},      {ObjectKind::kSrq, 9}, {ObjectKind::kAh, 10}, {ObjectKind::kQp, 11}};
    std::vector<const Item *> given;
    for (const Item &i : items) {
        given.push_back(&i);
    }
    const auto out = inParentsFirstOrder(given, [](const Item *i) { return i->kind; });
    std::vector<int> seqs;
    for (const Item *i : out) {
        seqs.push_back(i->seq);
    }
    EXPECT_EQ(seqs, (std::vector<int>{4, 7, 10, 6, 5, 2, 8, 9, 0, 3, 11, 1}));
    EXPECT_TRUE(
        inParentsFirstOrder(std::vector<const Item *>{}, [](const Item *i) { return i->kind; }).empty());
}

}  // namespace
}  // namespace ibvx::daemon
