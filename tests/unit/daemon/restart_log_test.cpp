// A session's restart log (daemon/restart, docs/restart.md) as commits write it and a successor
// replays it, in one process over the real softnda driver: arena chunks change by delta records
// (kChunkBlocks) that replay to the same blocks, a QP's driver state is given back once logged
// and exported again when an image is written, and a delta that does not fit its chunk ends the
// session cleanly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/zero_runs.h"
#include "daemon/core/broker.h"
#include "daemon/core/identity.h"
#include "daemon/core/mapping.h"
#include "daemon/restart/restart_state.h"
#include "daemon/restart/state_file.h"
#include "daemon/restart/state_records.h"
#include "ibv_extend/restart/v1/snapshot.pb.h"
#include "tests/unit/daemon/restart_rig.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

using Blocks = std::map<RegionId, std::vector<std::pair<uint32_t, uint32_t>>>;

Blocks blocksOf(const Session &s) {
    Blocks out;
    for (ChunkState &c : MappingManager::instance().exportState(s.memory()).chunks) {
        out[c.id] = std::move(c.used);
    }
    return out;
}

// The encoding as its header states it, token by token: what encodeZeroRuns, which writes in
// place and stops once it would not be shorter, must produce byte for byte.
std::string zeroRunsByTheRule(const std::string &raw) {
    std::string out;
    auto varint = [&out](uint64_t v) {
        for (; v >= 0x80; v >>= 7) {
            out.push_back(static_cast<char>(v | 0x80));
        }
        out.push_back(static_cast<char>(v));
    };
    size_t literal = 0;
    for (size_t i = 0; i < raw.size();) {
        if (raw[i] != 0) {
            ++i;
            continue;
        }
        size_t end = i;
        while (end < raw.size() && raw[end] == 0) {
            ++end;
        }
        if (end - i >= 4) {
            if (i > literal) {
                varint(uint64_t{i - literal} << 1);
                out.append(raw, literal, i - literal);
            }
            varint((uint64_t{end - i} << 1) | 1);
            literal = end;
        }
        i = end;
    }
    if (raw.size() > literal) {
        varint(uint64_t{raw.size() - literal} << 1);
        out.append(raw, literal, raw.size() - literal);
    }
    return out;
}

TEST(ZeroRuns, RoundTripAndOnlyWhenShorter) {
    std::string raw = std::string("\x01\x02", 2) + std::string(600, '\0') + "abc" + std::string(3, '\0') +
                      "d" + std::string(200, '\0');
    std::string enc, dec;
    ASSERT_TRUE(encodeZeroRuns(raw, &enc));
    EXPECT_LT(enc.size(), 20u) << "the two long runs cost a few bytes each";
    ASSERT_TRUE(decodeZeroRuns(enc, raw.size(), &dec));
    EXPECT_EQ(dec, raw);
    EXPECT_FALSE(decodeZeroRuns(enc, raw.size() - 1, &dec)) << "past its bound";
    EXPECT_FALSE(encodeZeroRuns("no zeros here", &enc));
    EXPECT_FALSE(encodeZeroRuns(std::string(), &enc));
    EXPECT_FALSE(decodeZeroRuns(std::string("\x10", 1), 1024, &dec))
        << "8 literal bytes promised, none there";
    EXPECT_FALSE(decodeZeroRuns(std::string("\x80", 1), 1024, &dec)) << "a varint cut short";
    EXPECT_FALSE(decodeZeroRuns(std::string("\x00", 1), 1024, &dec)) << "an empty token";
    // Runs of every length at every alignment, next to literal bytes.
    uint32_t seed = 7;
    for (int round = 0; round < 500; ++round) {
        std::string r;
        while (r.size() < 300) {
            seed = seed * 1103515245u + 12345u;
            const size_t len = (seed >> 16) % 23;
            r.append(len, (seed >> 8) % 3 == 0 ? static_cast<char>(1 + (seed >> 24) % 255) : '\0');
        }
        if (round % 2 == 1) {
            r.resize((seed >> 4) % r.size());  // short inputs too, where the tokens outweigh the runs
        }
        const std::string expected = zeroRunsByTheRule(r);
        ASSERT_EQ(encodeZeroRuns(r, &enc), expected.size() < r.size()) << "round " << round;
        if (expected.size() < r.size()) {
            ASSERT_EQ(enc, expected) << "round " << round;
            ASSERT_TRUE(decodeZeroRuns(enc, r.size(), &dec));
            ASSERT_EQ(dec, r) << "round " << round;
        }
    }
}

// A record of zeros is stored short and read back whole; a flipped bit is still the CRC's.
TEST(StateFileEncoding, ARecordOfZerosIsStoredShortAndReadBackWhole) {
    auto file = StateFile::create("unit-state");
    ASSERT_TRUE(file.isOk());
    const std::vector<StateFile::Record> records = {{state::kObjectPut, std::string(700, '\0') + "x"},
                                                    {state::kReply, "plain"}};
    ASSERT_TRUE(file->append(records).isOk());
    EXPECT_LT(file->appendedBytes(), 60u);
    auto back = file->records();
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_EQ(*back, records);
    EXPECT_FALSE(file->append({{0x85, "a type past 0x7f"}}).isOk());
    auto plain = StateFile::create("unit-plain", StateFile::Encoding::kPlain);
    ASSERT_TRUE(plain.isOk());
    ASSERT_TRUE(plain->append(records).isOk());
    EXPECT_GT(plain->appendedBytes(), 700u);
    char b = 0;
    ASSERT_EQ(::pread(file->fd(), &b, 1, 4096 + 9 + 1), 1);
    b = static_cast<char>(b ^ 1);
    ASSERT_EQ(::pwrite(file->fd(), &b, 1, 4096 + 9 + 1), 1);
    EXPECT_FALSE(file->records().isOk());
}

// Records are read back through a window of the file: one that straddles a window's end, one
// larger than a window, and many small ones after, each whole and in order; a CRC that fails
// past the first window is still found.
TEST(StateFileEncoding, RecordsAcrossAndLargerThanTheReadWindowComeBackWhole) {
    auto file = StateFile::create("unit-window", StateFile::Encoding::kPlain);
    ASSERT_TRUE(file.isOk());
    std::vector<StateFile::Record> records;
    uint32_t seed = 11;
    auto text = [&](size_t n) {
        std::string t(n, '\0');
        for (char &c : t) {
            seed = seed * 1103515245u + 12345u;
            c = static_cast<char>('a' + (seed >> 16) % 26);
        }
        return t;
    };
    records.push_back({state::kHeader, text((1u << 20) - 100)});   // its end is near the window's
    records.push_back({state::kObjectPut, text(300)});             // across the first window's end
    records.push_back({state::kObjectPut, text((3u << 20) / 2)});  // larger than a window
    for (int i = 0; i < 3000; ++i) {
        records.push_back({state::kObjectPut, text(1 + i % 997)});
    }
    ASSERT_TRUE(file->append(records).isOk());
    auto back = file->records();
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    ASSERT_EQ(back->size(), records.size());
    EXPECT_TRUE(*back == records);
    const uint64_t late = 4096 + file->appendedBytes() - 200;
    char b = 0;
    ASSERT_EQ(::pread(file->fd(), &b, 1, static_cast<off_t>(late)), 1);
    b = static_cast<char>(b ^ 1);
    ASSERT_EQ(::pwrite(file->fd(), &b, 1, static_cast<off_t>(late)), 1);
    EXPECT_FALSE(file->records().isOk());
}

// The walk a restore replays from: each record decoded, in order, one at a time (encoded ones
// through one reused buffer, so each payload is seen as it was written); the visitor's error
// ends the walk there and is what the walk returns.
TEST(StateFileEncoding, AWalkSeesEachRecordDecodedAndStopsAtTheVisitorsError) {
    auto file = StateFile::create("unit-walk");
    ASSERT_TRUE(file.isOk());
    const std::vector<StateFile::Record> records = {{state::kHeader, std::string(900, '\0') + "h"},
                                                    {state::kObjectPut, "plain"},
                                                    {state::kObjectPut, "y" + std::string(40, '\0')},
                                                    {state::kReply, "last"}};
    ASSERT_TRUE(file->append(records).isOk());
    std::vector<StateFile::Record> seen;
    auto all = file->forEachRecord([&seen](uint8_t type, std::string_view payload) {
        seen.emplace_back(type, std::string(payload));
        return Status::ok();
    });
    ASSERT_TRUE(all.isOk()) << all.toString();
    EXPECT_EQ(seen, records);
    seen.clear();
    auto stopped = file->forEachRecord([&seen](uint8_t type, std::string_view payload) {
        seen.emplace_back(type, std::string(payload));
        return seen.size() == 2 ? invalidArgument("the second one") : Status::ok();
    });
    EXPECT_EQ(stopped.message(), "the second one");
    EXPECT_EQ(seen.size(), 2u);
}

// A compaction copies a record still current from where the file says it lies, as it is stored
// (encoded, with its CRC); a placement the compaction left behind is no longer one.
TEST(StateFileEncoding, ACompactionCopiesAStoredRecordByItsPlacement) {
    auto file = StateFile::create("unit-copy");
    ASSERT_TRUE(file.isOk());
    const StateFile::Record zeros{state::kObjectPut, std::string(500, '\0') + "qp"};
    const StateFile::Record plain{state::kObjectPut, "a context"};
    std::vector<StateFile::Placement> placed;
    ASSERT_TRUE(file->append({{state::kHeader, "h"}, zeros, plain}, &placed).isOk());
    ASSERT_EQ(placed.size(), 3u);
    auto stored = file->storedBytes();
    ASSERT_TRUE(stored.isOk());
    std::string zeros_stored, plain_stored, junk;
    ASSERT_TRUE(file->storedRecord(*stored, placed[1], &zeros_stored));
    ASSERT_TRUE(file->storedRecord(*stored, placed[2], &plain_stored));
    EXPECT_LT(zeros_stored.size(), 40u) << "copied encoded, not expanded";
    EXPECT_FALSE(file->storedRecord(*stored, 0, &junk));
    EXPECT_FALSE(file->storedRecord(*stored, placed[1] + (uint64_t{1} << 24), &junk))
        << "not a record's start";

    std::vector<StateFile::Placement> image_placed;
    ASSERT_TRUE(file->compact({{state::kHeader, "h2"},
                               {StateFile::kStoredRecord, plain_stored},
                               {StateFile::kStoredRecord, zeros_stored}},
                              &image_placed)
                    .isOk());
    auto back = file->records();
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_EQ(*back, (std::vector<StateFile::Record>{{state::kHeader, "h2"}, plain, zeros}));
    auto now = file->storedBytes();
    ASSERT_TRUE(now.isOk());
    EXPECT_FALSE(file->storedRecord(*now, placed[1], &junk)) << "compacted away";
    std::string again;
    ASSERT_TRUE(file->storedRecord(*now, image_placed[2], &again));
    EXPECT_EQ(again, zeros_stored);
    EXPECT_FALSE(file->append({{StateFile::kStoredRecord, "short"}}).isOk()) << "no head: refused";
}

// An image of several MiB is written in pieces (the write buffer is about 1 MiB): every record
// lands whole and in order, and every placement names its own record, the pieces' seams
// included, so a compaction that copies them all by placement reads back the same image.
TEST(StateFileEncoding, AnImageLargerThanTheWriteBufferIsPlacedRecordByRecord) {
    auto file = StateFile::create("unit-big-image");
    ASSERT_TRUE(file.isOk());
    std::vector<StateFile::Record> image{{state::kHeader, "h"}};
    for (uint32_t i = 0; i < 6000; ++i) {
        std::string payload(200 + i % 700, static_cast<char>('a' + i % 26));
        std::memcpy(payload.data(), &i, sizeof(i));
        if (i % 3 == 0) {
            payload.append(300, '\0');  // some stored zero-run encoded
        }
        image.emplace_back(state::kObjectPut, std::move(payload));
    }
    std::vector<StateFile::Placement> placed;
    ASSERT_TRUE(file->compact(image, &placed).isOk());
    ASSERT_GT(file->compactedBytes(), 3u << 20);
    ASSERT_EQ(placed.size(), image.size());
    auto back = file->records();
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_TRUE(*back == image);
    auto stored = file->storedBytes();
    ASSERT_TRUE(stored.isOk());
    std::vector<StateFile::Record> copies;
    for (size_t i = 0; i < placed.size(); ++i) {
        std::string copy;
        ASSERT_TRUE(file->storedRecord(*stored, placed[i], &copy)) << "record " << i;
        copies.emplace_back(StateFile::kStoredRecord, std::move(copy));
    }
    ASSERT_TRUE(file->compact(copies).isOk());
    back = file->records();
    ASSERT_TRUE(back.isOk()) << back.status().toString();
    EXPECT_TRUE(*back == image);
}

class RestartLogTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        old_ = std::make_unique<Rig>(devices_);
        ASSERT_TRUE(old_->state.start().isOk());
        int sv[2];
        ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        UniqueFd ours(sv[0]);
        channel_.reset(sv[1]);
        auto peer = peerIdentity(ours.get());
        ASSERT_TRUE(peer.isOk()) << peer.status().toString();
        auto s = old_->broker.hello(*peer, rigOptions().version, "unit");
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        s_ = *s;
        UniqueFd attached_end = std::move(ours);
        std::shared_ptr<Session> attached;
        ASSERT_EQ(old_->broker.attach(s_->token(), peer->creds, attached_end, &attached), 0);
        Broker &b = old_->broker;
        auto ctx = b.openContext(*s_, "softnda0");
        ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
        ctx_ = ctx->context;
        auto pd = b.allocPd(*s_, ctx_);
        ASSERT_TRUE(pd.isOk());
        pd_ = *pd;
        CreateCqArgs ca;
        ca.context = ctx_;
        ca.cqe = 16;
        auto cq = b.createCq(*s_, ca);
        ASSERT_TRUE(cq.isOk());
        cq_ = cq->cq;
        commit();
    }

    void commit() { ASSERT_TRUE(old_->broker.commit(*s_, StoredReply{}).isOk()); }

    uint64_t createQp() {
        CreateQpArgs qa;
        qa.context = ctx_;
        qa.pd = pd_;
        qa.send_cq = qa.recv_cq = cq_;
        qa.cap = ibv_qp_cap{8, 8, 1, 1, 0};
        auto qp = old_->broker.createQp(*s_, qa);
        EXPECT_TRUE(qp.isOk()) << qp.status().toString();
        commit();
        return qp.isOk() ? qp->qp : 0;
    }

    // QPs made and destroyed one commit each, so most commits change a chunk already logged.
    std::vector<uint64_t> churn() {
        std::vector<uint64_t> qps;
        for (int i = 0; i < 12; ++i) {
            qps.push_back(createQp());
        }
        for (size_t i = 0; i < qps.size(); i += 3) {
            EXPECT_TRUE(old_->broker.destroyQp(*s_, qps[i]).isOk());
            commit();
            qps[i] = 0;
        }
        for (int i = 0; i < 3; ++i) {
            qps.push_back(createQp());  // into the holes the destroys left
        }
        std::erase(qps, 0);
        return qps;
    }

    // The session's log as the handover leaves it, and every fd the successor gets (dups).
    std::vector<StateFile::Record> handOver(NamedFds *fds) {
        auto named = old_->state.handover();
        EXPECT_TRUE(named.isOk()) << named.status().toString();
        std::vector<StateFile::Record> records;
        for (auto &[name, fd] : *named) {
            fds->emplace_back(name, UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)));
            if (state::isStateName(name)) {
                records = recordsOf(fd);
            }
        }
        return records;
    }

    // The same after a crash: what the fd store holds, the log as the last commit left it.
    std::vector<StateFile::Record> crash(NamedFds *fds) {
        std::vector<StateFile::Record> records;
        for (auto &[name, fd] : old_->store) {
            fds->emplace_back(name, UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)));
            if (state::isStateName(name)) {
                records = recordsOf(fd.get());
            }
        }
        return records;
    }

    // A new process's restore from fds, after the old broker is gone.
    RestoreReport restore(NamedFds fds, Blocks *blocks, size_t *objects,
                          std::vector<StoredReply> *replies = nullptr) {
        old_.reset();
        s_.reset();
        fresh_ = std::make_unique<Rig>(devices_);
        std::vector<std::shared_ptr<Session>> restored;
        RestoreReport report = fresh_->state.restore(fds, &restored);
        if (restored.size() == 1) {
            auto held = restored[0]->hold();
            *blocks = blocksOf(*restored[0]);
            *objects = restored[0]->objectCount();
            if (replies != nullptr) {
                *replies = restored[0]->replies();
            }
        }
        return report;
    }

    // Restores fds in a new process: the session must come back with these blocks and objects.
    void expectRestoredAs(NamedFds fds, const Blocks &blocks, size_t objects) {
        Blocks after;
        size_t objects_after = 0;
        RestoreReport report = restore(std::move(fds), &after, &objects_after);
        ASSERT_EQ(report.sessions_kept, 1u) << (report.problems.empty() ? "" : report.problems[0]);
        EXPECT_EQ(after, blocks);
        EXPECT_EQ(objects_after, objects);
    }

    const Object *object(uint64_t h) { return s_->object(h); }

    std::unique_ptr<Rig> old_, fresh_;
    std::shared_ptr<Session> s_;
    UniqueFd channel_;
    uint64_t ctx_ = 0, pd_ = 0, cq_ = 0;
};

size_t countOf(const std::vector<StateFile::Record> &records, uint8_t type) {
    return static_cast<size_t>(
        std::count_if(records.begin(), records.end(), [type](const auto &r) { return r.first == type; }));
}

TEST_F(RestartLogTest, ArenaChangesAreLoggedAsDeltasThatReplayToTheSameBlocks) {
    std::vector<uint64_t> qps = churn();
    Blocks before;
    size_t objects_before = 0;
    {
        auto held = s_->hold();
        before = blocksOf(*s_);
        objects_before = s_->objectCount();
        for (uint64_t qp : qps) {
            EXPECT_TRUE(object(qp)->driver_state.empty()) << "a logged QP keeps no driver state";
        }
        EXPECT_FALSE(object(ctx_)->driver_state.empty()) << "a parent keeps its state to compare";
    }
    ASSERT_FALSE(before.empty());
    NamedFds fds;
    std::vector<StateFile::Record> records = crash(&fds);
    const size_t chunk_puts = countOf(records, state::kChunkPut);
    EXPECT_GE(countOf(records, state::kChunkBlocks), 15u) << "every QP made or destroyed changed a chunk";
    EXPECT_LE(chunk_puts, before.size() + 1) << "a chunk's whole list only in the image and when it is new";
    for (const auto &[type, payload] : records) {
        if (type == state::kChunkBlocks) {
            ibv_extend::restart::v1::ChunkDelta d;
            ASSERT_TRUE(d.ParseFromString(payload));
            EXPECT_LE(d.changes_size(), 4) << "a delta holds one call's changes, not the chunk's blocks";
        }
    }
    expectRestoredAs(std::move(fds), before, objects_before);
}

// A handover (or any compaction) writes whole records again: each QP's state exported anew (its
// kept copy was given back), and no delta left in the log.
TEST_F(RestartLogTest, AnImageExportsGivenBackStateAgainAndHoldsNoDelta) {
    std::vector<uint64_t> qps = churn();
    uint64_t calls = 0;
    old_->state.countCallsWith([&calls](uint64_t) { return CallCounts{++calls, 0}; });  // an image is due
    Blocks before;
    {
        auto held = s_->hold();
        before = blocksOf(*s_);
    }
    NamedFds fds;
    std::vector<StateFile::Record> records = handOver(&fds);
    EXPECT_EQ(countOf(records, state::kChunkBlocks), 0u);
    EXPECT_EQ(countOf(records, state::kObjectPut), qps.size() + 3) << "the QPs, context, PD and CQ";
    for (const auto &[type, payload] : records) {
        if (type == state::kObjectPut) {
            ibv_extend::restart::v1::Object o;
            ASSERT_TRUE(o.ParseFromString(payload));
            EXPECT_FALSE(o.driver().data().empty()) << "object " << o.handle() << " has its driver state";
        }
    }
    {
        auto held = s_->hold();
        for (uint64_t qp : qps) {
            EXPECT_TRUE(object(qp)->driver_state.empty()) << "given back again after the image";
        }
    }
    expectRestoredAs(std::move(fds), before, qps.size() + 3);
}

// Commits that pass the log's floor compact it, copying the records of objects the call did not
// touch; a crash after several such compactions restores exactly what the session held.
TEST_F(RestartLogTest, CompactionsByCommitsRestoreExactly) {
    std::vector<uint64_t> live = churn();
    for (int i = 0; i < 80; ++i) {  // ~600 B of log a pair: past the 16 KiB floor more than once
        uint64_t qp = createQp();
        ASSERT_NE(qp, 0u);
        ASSERT_TRUE(old_->broker.destroyQp(*s_, qp).isOk());
        commit();
    }
    Blocks before;
    size_t objects_before = 0;
    {
        auto held = s_->hold();
        before = blocksOf(*s_);
        objects_before = s_->objectCount();
    }
    NamedFds fds;
    std::vector<StateFile::Record> records = crash(&fds);
    ASSERT_FALSE(records.empty());
    EXPECT_EQ(records.front().first, state::kHeader);
    EXPECT_LT(countOf(records, state::kObjectDel), 80u) << "the log was compacted since the first destroys";
    EXPECT_EQ(objects_before, live.size() + 3);
    expectRestoredAs(std::move(fds), before, objects_before);
}

// Replies the tenant retired stay retired after a crash: the next reply's record names them, and
// a replay drops them; an image holds none.
TEST_F(RestartLogTest, RetiredRepliesStayRetiredAcrossACrashAndAnImage) {
    auto reply = [](uint64_t key) {
        StoredReply r;
        r.key = key;
        r.method = "/ibv_extend.v1.Broker/AllocPd";
        r.response = "pd " + std::to_string(key);
        return r;
    };
    auto keysOf = [](const std::vector<StoredReply> &rs) {
        std::vector<uint64_t> keys;
        for (const StoredReply &r : rs) {
            keys.push_back(r.key);
        }
        return keys;
    };
    for (uint64_t key : {0xa1, 0xa2, 0xa3}) {
        ASSERT_TRUE(old_->broker.commit(*s_, reply(key)).isOk());
    }
    EXPECT_EQ(s_->retireReplies({0xa1, 0xa3}), 2u);
    ASSERT_TRUE(old_->broker.commit(*s_, reply(0xa4)).isOk());
    NamedFds fds;
    std::vector<StateFile::Record> records = crash(&fds);
    ASSERT_FALSE(records.empty());
    ibv_extend::restart::v1::Reply last;
    ASSERT_EQ(records.back().first, state::kReply);
    ASSERT_TRUE(last.ParseFromString(records.back().second));
    EXPECT_EQ(last.key(), 0xa4u);
    EXPECT_EQ(std::vector<uint64_t>(last.retired().begin(), last.retired().end()),
              (std::vector<uint64_t>{0xa1, 0xa3}));
    Blocks blocks;
    size_t objects = 0;
    std::vector<StoredReply> replies;
    RestoreReport report = restore(std::move(fds), &blocks, &objects, &replies);
    ASSERT_EQ(report.sessions_kept, 1u) << (report.problems.empty() ? "" : report.problems[0]);
    EXPECT_EQ(keysOf(replies), (std::vector<uint64_t>{0xa2, 0xa4}));
    ASSERT_EQ(replies.size(), 2u);
    EXPECT_EQ(replies[1].response, "pd " + std::to_string(0xa4));
}

TEST_F(RestartLogTest, AnImageHoldsOnlyTheRepliesKept) {
    for (uint64_t key : {0xb1, 0xb2}) {
        StoredReply r;
        r.key = key;
        r.method = "/ibv_extend.v1.Broker/AllocPd";
        ASSERT_TRUE(old_->broker.commit(*s_, r).isOk());
    }
    EXPECT_EQ(s_->retireReplies({0xb1}), 1u);
    uint64_t calls = 0;
    old_->state.countCallsWith([&calls](uint64_t) { return CallCounts{++calls, 0}; });  // an image is due
    NamedFds fds;
    std::vector<StateFile::Record> records = handOver(&fds);
    std::vector<uint64_t> logged;
    for (const auto &[type, payload] : records) {
        if (type == state::kReply) {
            ibv_extend::restart::v1::Reply r;
            ASSERT_TRUE(r.ParseFromString(payload));
            logged.push_back(r.key());
            EXPECT_EQ(r.retired_size(), 0);
        }
    }
    EXPECT_EQ(logged, (std::vector<uint64_t>{0xb2}));
}

// A delta that frees a block its chunk does not hold is a corrupt log: the session ends.
TEST_F(RestartLogTest, ADeltaThatDoesNotFitItsChunkEndsTheSession) {
    churn();
    NamedFds fds;
    std::vector<StateFile::Record> records = crash(&fds);
    RegionId region = 0;
    for (const auto &[type, payload] : records) {
        if (type == state::kChunkPut) {
            ibv_extend::restart::v1::Chunk c;
            ASSERT_TRUE(c.ParseFromString(payload));
            region = c.region();
        }
    }
    ASSERT_NE(region, 0u);
    ibv_extend::restart::v1::ChunkDelta bad;
    bad.set_region(region);
    auto *change = bad.add_changes();
    change->set_offset(3);  // no allocation starts there (they are 64-byte aligned)
    change->set_size(64);
    change->set_freed(true);
    records.emplace_back(state::kChunkBlocks, bad.SerializeAsString());
    auto file = StateFile::create("unit-state");
    ASSERT_TRUE(file.isOk());
    ASSERT_TRUE(file->append(records).isOk());
    for (auto &[name, fd] : fds) {
        if (state::isStateName(name)) {
            fd.reset(::fcntl(file->fd(), F_DUPFD_CLOEXEC, 0));
        }
    }
    Blocks after;
    size_t objects = 0;
    RestoreReport report = restore(std::move(fds), &after, &objects);
    EXPECT_EQ(report.sessions_kept, 0u);
    EXPECT_EQ(report.sessions_dropped, 1u);
    EXPECT_EQ(fresh_->broker.objectCount(), 0u);
}

}  // namespace
}  // namespace ibvx::daemon
