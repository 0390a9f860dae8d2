// Per-tenant quotas: the QuotaManager alone (limits, overrides, all-or-nothing, exact under
// racing threads, nothing left after release), and through the broker core over the real softnda
// driver (RESOURCE_EXHAUSTED naming the quota, rollback of the driver object, zero at the end).
#include "daemon/core/quota.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "daemon/core/admin_inspect.h"
#include "daemon/core/broker.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

size_t idx(Quota q) {
    return static_cast<size_t>(q);
}

TEST(QuotaManager, NamesRoundTrip) {
    for (size_t i = 0; i < kQuotaCount; ++i) {
        auto q = static_cast<Quota>(i);
        EXPECT_EQ(quotaFromName(quotaName(q)), q);
    }
    EXPECT_FALSE(quotaFromName("qp").has_value());
}

TEST(QuotaManager, LimitsAndReleases) {
    QuotaConfig cfg;
    cfg.defaults[idx(Quota::kQps)] = 2;
    QuotaManager m(cfg);
    TenantKey t{1000, ""};
    auto a = m.reserve(t, {{Quota::kQps, 1}});
    auto b = m.reserve(t, {{Quota::kQps, 1}});
    ASSERT_TRUE(a.isOk() && b.isOk());
    auto c = m.reserve(t, {{Quota::kQps, 1}});
    ASSERT_EQ(c.status().code(), Code::kResourceExhausted);
    EXPECT_NE(c.status().message().find("quota 'qps' exceeded for uid 1000: limit 2, in use 2, asked 1"),
              std::string::npos)
        << c.status().message();
    // Another uid has its own account.
    EXPECT_TRUE(m.reserve({1001, ""}, {{Quota::kQps, 2}}).isOk());
    a->release();
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1000)[idx(Quota::kQps)], 1u);
    EXPECT_TRUE(m.reserve(t, {{Quota::kQps, 1}}).isOk());  // released again at once (temporary)
    b = Status(Code::kInternal, 0, "drop");                // the charge goes with the StatusOr
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1000)[idx(Quota::kQps)], 0u);
    EXPECT_TRUE(m.snapshot().uids.empty());
}

// check() answers as reserve() would and charges nothing; resize() follows a size (a session's
// restart state) in every account of the tenant, in place, and to nothing.
TEST(QuotaManager, ACheckChargesNothingAndAResizeFollowsTheSizeInEveryAccount) {
    QuotaConfig cfg;
    cfg.defaults[idx(Quota::kStateBytes)] = 100;
    QuotaManager m(cfg);
    TenantKey t{1000, "c1", "ns1"};
    EXPECT_TRUE(m.check(t, {{Quota::kStateBytes, 100}}).isOk());
    Status over = m.check(t, {{Quota::kStateBytes, 101}});
    EXPECT_EQ(over.code(), Code::kResourceExhausted);
    EXPECT_NE(
        over.message().find("quota 'state_bytes' exceeded for uid 1000: limit 100, in use 0, asked 101"),
        std::string::npos)
        << over.message();
    EXPECT_TRUE(m.snapshot().uids.empty()) << "a check charged something";

    QuotaCharge state;
    auto held = [&](QuotaScope scope, const std::string &name) {
        return m.usage(scope, 1000, name)[idx(Quota::kStateBytes)];
    };
    for (uint64_t bytes : {40u, 90u, 10u, 10u, 150u}) {  // past the limit too: like restore(), unchecked
        m.resize(state, t, Quota::kStateBytes, bytes);
        EXPECT_EQ(state.amount(Quota::kStateBytes), bytes);
        EXPECT_EQ(held(QuotaScope::kUid, ""), bytes);
        EXPECT_EQ(held(QuotaScope::kContainer, "c1"), bytes);
        EXPECT_EQ(held(QuotaScope::kNamespace, "ns1"), bytes);
    }
    auto other = m.reserve(t, {{Quota::kQps, 1}});
    ASSERT_TRUE(other.isOk());
    m.resize(state, t, Quota::kStateBytes, 0);
    EXPECT_TRUE(state.empty());
    EXPECT_EQ(held(QuotaScope::kUid, ""), 0u);
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1000)[idx(Quota::kQps)], 1u) << "another charge of the tenant";
    other->release();
    QuotaSnapshot s = m.snapshot();
    EXPECT_TRUE(s.uids.empty());
    EXPECT_TRUE(s.containers.empty());
}

TEST(QuotaManager, AllOrNothingAcrossQuotasAndAccounts) {
    QuotaConfig cfg;
    cfg.defaults[idx(Quota::kMrBytes)] = 100;
    cfg.containers["c1"].max[idx(Quota::kMrs)] = 1;
    QuotaManager m(cfg);
    TenantKey t{7, "c1"};
    // bytes over the limit: the MR count is not charged either
    EXPECT_EQ(m.reserve(t, {{Quota::kMrs, 1}, {Quota::kMrBytes, 101}}).status().code(),
              Code::kResourceExhausted);
    EXPECT_EQ(m.usage(QuotaScope::kUid, 7)[idx(Quota::kMrs)], 0u);
    auto one = m.reserve(t, {{Quota::kMrs, 1}, {Quota::kMrBytes, 60}});
    ASSERT_TRUE(one.isOk());
    EXPECT_EQ(m.usage(QuotaScope::kContainer, 0, "c1")[idx(Quota::kMrBytes)], 60u);
    // The container allows one MR: a second uid in the same container is refused by it.
    auto two = m.reserve({8, "c1"}, {{Quota::kMrs, 1}, {Quota::kMrBytes, 10}});
    ASSERT_EQ(two.status().code(), Code::kResourceExhausted);
    EXPECT_NE(two.status().message().find("for container c1"), std::string::npos);
    EXPECT_EQ(m.usage(QuotaScope::kUid, 8)[idx(Quota::kMrBytes)], 0u);
    // Overflowing amounts are refused, not wrapped.
    EXPECT_EQ(m.reserve(t, {{Quota::kMrBytes, UINT64_MAX}}).status().code(), Code::kResourceExhausted);
    one->release();
    QuotaSnapshot s = m.snapshot();
    EXPECT_TRUE(s.uids.empty());
    EXPECT_TRUE(s.containers.empty());
    ASSERT_EQ(s.container_overrides.count("c1"), 1u);
}

TEST(QuotaManager, RuntimeOverridesAndMerge) {
    QuotaManager m;
    TenantKey t{5, ""};
    m.setOverride(QuotaScope::kUid, 5, "", Quota::kCqs, 1);
    auto a = m.reserve(t, {{Quota::kCqs, 1}});
    ASSERT_TRUE(a.isOk());
    EXPECT_EQ(m.reserve(t, {{Quota::kCqs, 1}}).status().code(), Code::kResourceExhausted);
    QuotaSnapshot s = m.snapshot();
    EXPECT_EQ(s.uids.at(5).limit[idx(Quota::kCqs)], 1u);
    EXPECT_EQ(s.uids.at(5).used[idx(Quota::kCqs)], 1u);
    m.setOverride(QuotaScope::kUid, 5, "", Quota::kCqs, std::nullopt);  // back to the default
    EXPECT_TRUE(m.snapshot().uid_overrides.empty());
    auto b = m.reserve(t, {{Quota::kCqs, 1}, {Quota::kQueueBytes, 4096}});
    ASSERT_TRUE(b.isOk());
    // Lowering a limit below the usage keeps the objects and refuses new ones.
    m.setDefault(Quota::kQueueBytes, 100);
    EXPECT_EQ(m.reserve(t, {{Quota::kQueueBytes, 1}}).status().code(), Code::kResourceExhausted);
    a->merge(std::move(*b));
    EXPECT_TRUE(b->empty());
    EXPECT_EQ(a->amount(Quota::kCqs), 2u);
    EXPECT_EQ(a->amount(Quota::kQueueBytes), 4096u);
    a->release();
    EXPECT_TRUE(m.snapshot().uids.empty());
}

// A charge keeps its quotas in a few slots (issue 25: a charge per object and per stored reply)
// and spills to the heap beyond them: one of every quota, a merge that outgrows the slots and
// a restored one all read back and give back exactly what they hold.
TEST(QuotaManager, ChargesOfManyQuotasHoldAndGiveBackEveryAmount) {
    QuotaManager m;
    TenantKey t{7, "c7"};
    auto few = m.reserve(t, {{Quota::kMrs, 1}, {Quota::kMrBytes, 8192}});
    auto more = m.reserve(t, {{Quota::kQps, 2}, {Quota::kQueueBytes, 4096}, {Quota::kEventFds, 1}});
    ASSERT_TRUE(few.isOk() && more.isOk());
    few->merge(std::move(*more));  // five quotas: past the slots
    EXPECT_TRUE(more->empty());
    EXPECT_EQ(few->amount(Quota::kMrs), 1u);
    EXPECT_EQ(few->amount(Quota::kMrBytes), 8192u);
    EXPECT_EQ(few->amount(Quota::kQps), 2u);
    EXPECT_EQ(few->amount(Quota::kQueueBytes), 4096u);
    EXPECT_EQ(few->amount(Quota::kEventFds), 1u);
    EXPECT_EQ(few->amount(Quota::kCqs), 0u);
    QuotaValues every{};
    for (size_t i = 0; i < kQuotaCount; ++i) {
        every[i] = i + 1;
    }
    QuotaCharge all = m.restore(t, every);
    for (size_t i = 0; i < kQuotaCount; ++i) {
        EXPECT_EQ(all.amount(static_cast<Quota>(i)), i + 1) << quotaName(static_cast<Quota>(i));
    }
    QuotaCharge moved = std::move(all);
    EXPECT_TRUE(all.empty());
    EXPECT_EQ(m.usage(QuotaScope::kContainer, 0, "c7")[idx(Quota::kQps)], 2u + 6u);
    few->release();
    EXPECT_EQ(m.usage(QuotaScope::kUid, 7)[idx(Quota::kMrBytes)], every[idx(Quota::kMrBytes)]);
    moved.release();
    EXPECT_TRUE(m.snapshot().uids.empty());
    EXPECT_TRUE(m.snapshot().containers.empty());
}

// Many charges of two container tenants (the tenant is held once per tenant, not per charge):
// moved, merged and released in any order, each gives back to its own accounts only.
// What a restart carries (docs/restart.md): the latest runtime change per account and quota, in
// the order first made, until a configuration reload replaces them all.
TEST(QuotaManager, RuntimeEditsAreTheLatestPerTargetUntilAReload) {
    QuotaManager m;
    m.setOverride(QuotaScope::kUid, 1000, "", Quota::kQps, 4);
    m.setDefault(Quota::kMrs, 10);
    m.setOverride(QuotaScope::kNamespace, 0, "team-a", Quota::kCqs, 2);
    m.setOverride(QuotaScope::kUid, 1000, "", Quota::kQps, std::nullopt);  // cleared later
    std::vector<QuotaEdit> want = {{QuotaScope::kUid, 1000, "", Quota::kQps, std::nullopt},
                                   {QuotaScope::kDefault, 0, "", Quota::kMrs, 10},
                                   {QuotaScope::kNamespace, 0, "team-a", Quota::kCqs, 2}};
    EXPECT_EQ(m.runtimeEdits(), want);

    // Applied again to a fresh manager (the successor), they give the same limits.
    QuotaManager next;
    for (const QuotaEdit &e : m.runtimeEdits()) {
        ASSERT_TRUE(next.apply(e).isOk());
    }
    QuotaSnapshot a = m.snapshot(), b = next.snapshot();
    EXPECT_EQ(a.defaults, b.defaults);
    EXPECT_TRUE(b.uid_overrides.empty());
    ASSERT_EQ(b.namespace_overrides.count("team-a"), 1u);
    EXPECT_EQ(b.namespace_overrides["team-a"].max[idx(Quota::kCqs)], 2u);
    EXPECT_EQ(next.runtimeEdits(), want);

    next.configure(QuotaConfig{});
    EXPECT_TRUE(next.runtimeEdits().empty());
    EXPECT_TRUE(next.snapshot().namespace_overrides.empty());
}

TEST(QuotaManager, NamespaceOverrideLimitsThePodsTogetherAndBadEditsChangeNothing) {
    QuotaManager m;
    m.setOverride(QuotaScope::kNamespace, 0, "team-a", Quota::kQps, 1);
    auto a = m.reserve(TenantKey{1000, "c1", "team-a"}, {{Quota::kQps, 1}});
    ASSERT_TRUE(a.isOk());
    // Another uid and container, the same namespace: its account is full.
    auto b = m.reserve(TenantKey{1001, "c2", "team-a"}, {{Quota::kQps, 1}});
    EXPECT_EQ(b.status().code(), Code::kResourceExhausted);
    EXPECT_TRUE(m.reserve(TenantKey{1001, "c2", "team-b"}, {{Quota::kQps, 1}}).isOk());
    EXPECT_EQ(m.usage(QuotaScope::kNamespace, 0, "team-a")[idx(Quota::kQps)], 1u);

    EXPECT_EQ(m.apply({QuotaScope::kDefault, 0, "", Quota::kQps, std::nullopt}).code(),
              Code::kInvalidArgument);
    EXPECT_EQ(m.apply({QuotaScope::kNamespace, 0, "", Quota::kQps, 3}).code(), Code::kInvalidArgument);
    EXPECT_EQ(m.apply({QuotaScope::kUid, 7, "", static_cast<Quota>(kQuotaCount), 3}).code(),
              Code::kInvalidArgument);
    ASSERT_EQ(m.runtimeEdits().size(), 1u);
    EXPECT_EQ(m.snapshot().defaults[idx(Quota::kQps)], kUnlimited);
}

TEST(QuotaManager, ChargesOfManyObjectsGiveBackToTheirOwnTenant) {
    QuotaManager m;
    const std::string long_id(64, 'a');  // a container id as runtimes write them
    TenantKey a{1, long_id};
    TenantKey b{2, "c2"};
    std::vector<QuotaCharge> charges;
    for (int i = 0; i < 100; ++i) {  // the vector moves them as it grows
        auto ca = m.reserve(a, {{Quota::kQps, 1}, {Quota::kQueueBytes, 100}});
        auto cb = m.reserve(b, {{Quota::kQps, 1}});
        ASSERT_TRUE(ca.isOk());
        ASSERT_TRUE(cb.isOk());
        charges.push_back(std::move(*ca));
        charges.push_back(std::move(*cb));
    }
    EXPECT_EQ(m.usage(QuotaScope::kContainer, 0, long_id)[idx(Quota::kQps)], 100u);
    EXPECT_EQ(m.usage(QuotaScope::kUid, 2)[idx(Quota::kQps)], 100u);
    // Merge every other charge of a into the previous one of a (same tenant).
    for (size_t i = 2; i < charges.size(); i += 4) {
        charges[i - 2].merge(std::move(charges[i]));
        EXPECT_TRUE(charges[i].empty());
    }
    EXPECT_EQ(m.usage(QuotaScope::kContainer, 0, long_id)[idx(Quota::kQueueBytes)], 10000u);
    for (size_t i = 1; i < charges.size(); i += 2) {
        charges[i].release();  // all of b
    }
    EXPECT_EQ(m.usage(QuotaScope::kUid, 2)[idx(Quota::kQps)], 0u);
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1)[idx(Quota::kQps)], 100u);
    QuotaCharge moved = std::move(charges[0]);
    charges[0].release();  // moved from: gives nothing
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1)[idx(Quota::kQps)], 100u);
    moved.release();
    EXPECT_EQ(m.usage(QuotaScope::kUid, 1)[idx(Quota::kQps)], 98u);  // it held a merged pair
    charges.clear();
    QuotaSnapshot s = m.snapshot();
    EXPECT_TRUE(s.uids.empty());
    EXPECT_TRUE(s.containers.empty());
    // A tenant whose charges all went can be charged again.
    auto again = m.reserve(a, {{Quota::kQps, 1}});
    ASSERT_TRUE(again.isOk());
    EXPECT_EQ(m.usage(QuotaScope::kContainer, 0, long_id)[idx(Quota::kQps)], 1u);
}

TEST(QuotaManager, ChargeOutlivesTheManager) {
    StatusOr<QuotaCharge> c = Status(Code::kInternal, 0, "");
    {
        QuotaManager m;
        c = m.reserve({1, ""}, {{Quota::kPds, 1}});
        ASSERT_TRUE(c.isOk());
    }
    c->release();  // must not touch freed memory (ASan would say)
    EXPECT_TRUE(c->empty());
}

TEST(QuotaManager, RacingThreadsNeverOvershoot) {
    constexpr int kThreads = 8, kLimit = 37, kTries = 2000;
    QuotaConfig cfg;
    cfg.defaults[idx(Quota::kQps)] = kLimit;
    QuotaManager m(cfg);
    std::atomic<int> held{0}, max_held{0}, granted{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
        threads.emplace_back([&] {
            std::vector<QuotaCharge> mine;
            for (int k = 0; k < kTries; ++k) {
                auto c = m.reserve({42, "ctr"}, {{Quota::kQps, 1}});
                if (c.isOk()) {
                    int now = ++held;
                    int prev = max_held.load();
                    while (now > prev && !max_held.compare_exchange_weak(prev, now)) {
                    }
                    ++granted;
                    mine.push_back(std::move(*c));
                }
                if (mine.size() > 3 || (k % 7 == 0 && !mine.empty())) {
                    --held;
                    mine.pop_back();  // released by its destructor
                }
            }
            held -= static_cast<int>(mine.size());
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_LE(max_held.load(), kLimit);
    EXPECT_GT(granted.load(), kLimit);  // the limit was reached and space reused
    EXPECT_EQ(held.load(), 0);
    QuotaSnapshot s = m.snapshot();
    EXPECT_TRUE(s.uids.empty());
    EXPECT_TRUE(s.containers.empty());
}

// ---- through the broker core ----------------------------------------------------------------

class BrokerQuotaTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        Broker::Options opt;
        opt.xfer_wait = std::chrono::milliseconds(200);
        broker_ = std::make_unique<Broker>(opt, devices_);
        broker_->setRegionSender([](Session &, std::vector<RegionToSend> &) { return Status::ok(); });
    }
    void TearDown() override { broker_.reset(); }

    StatusOr<std::shared_ptr<Session>> hello(const std::string &container = "") {
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        peer.container_id = container;
        return broker_->hello(peer, {4, 2, 0}, "quota");
    }
    uint64_t used(Quota q) { return broker_->quotas().usage(QuotaScope::kUid, getuid())[idx(q)]; }

    std::unique_ptr<Broker> broker_;
};

TEST_F(BrokerQuotaTest, EveryQuotaIsEnforcedAndNamed) {
    QuotaConfig cfg;
    for (Quota q : {Quota::kContexts, Quota::kPds, Quota::kCqs, Quota::kQps, Quota::kSrqs, Quota::kMrs,
                    Quota::kSessions}) {
        cfg.defaults[idx(q)] = 1;
    }
    broker_->quotas().configure(cfg);
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    Status st = hello().status();
    EXPECT_EQ(st.code(), Code::kResourceExhausted);
    EXPECT_NE(st.message().find("'sessions'"), std::string::npos) << st.message();
    Session &ss = **s;
    auto ctx = broker_->openContext(ss, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    st = broker_->openContext(ss, "softnda0").status();
    EXPECT_EQ(st.code(), Code::kResourceExhausted);
    EXPECT_NE(st.message().find("'contexts'"), std::string::npos);
    auto pd = broker_->allocPd(ss, ctx->context);
    ASSERT_TRUE(pd.isOk());
    EXPECT_NE(broker_->allocPd(ss, ctx->context).status().message().find("'pds'"), std::string::npos);
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 16;
    auto cq = broker_->createCq(ss, ca);
    ASSERT_TRUE(cq.isOk());
    EXPECT_NE(broker_->createCq(ss, ca).status().message().find("'cqs'"), std::string::npos);
    CreateSrqArgs sa;
    sa.context = ctx->context;
    sa.pd = *pd;
    sa.max_wr = 16;
    sa.max_sge = 1;
    ASSERT_TRUE(broker_->createSrq(ss, sa).isOk());
    EXPECT_NE(broker_->createSrq(ss, sa).status().message().find("'srqs'"), std::string::npos);
    CreateQpArgs qa;
    qa.context = ctx->context;
    qa.pd = *pd;
    qa.send_cq = qa.recv_cq = cq->cq;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    ASSERT_TRUE(broker_->createQp(ss, qa).isOk());
    EXPECT_NE(broker_->createQp(ss, qa).status().message().find("'qps'"), std::string::npos);
    for (uint64_t xfer : {1, 2}) {
        int fd = memfd_create("mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(ftruncate(fd, 8192), 0);
        ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the broker maps only sealed memory
        ASSERT_TRUE(ss.putXfer(xfer, UniqueFd(fd)));
        RegMrArgs ma;
        ma.pd = *pd;
        ma.xfer_id = xfer;
        ma.length = 8192;
        ma.access = IBV_ACCESS_LOCAL_WRITE;
        auto mr = broker_->regMr(ss, ma);
        if (xfer == 1) {
            ASSERT_TRUE(mr.isOk()) << mr.status().toString();
        } else {
            EXPECT_NE(mr.status().message().find("'mrs'"), std::string::npos);
        }
    }
    EXPECT_EQ(used(Quota::kQps), 1u);
    EXPECT_EQ(used(Quota::kMrBytes), 8192u);
    EXPECT_GT(used(Quota::kQueueBytes), 0u);
    EXPECT_EQ(ss.objectCount(), 6u);  // nothing half-created by the refusals
    broker_->endSession(*s);
    EXPECT_TRUE(broker_->quotas().snapshot().uids.empty());
}

// What the broker holds for a tenant beside objects (issue 26, hole 7): the eventfds it keeps
// for event delivery count in 'event_fds', one per CQ made with a completion fd and one per
// context given an async fd (a second SetAsyncEventFd replaces the first).
TEST_F(BrokerQuotaTest, EventFdsAreChargedPerCqAndOncePerContext) {
    broker_->quotas().setDefault(Quota::kEventFds, 2);
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    Session &ss = **s;
    auto ctx = broker_->openContext(ss, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto eventFd = [] { return UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); };
    for (uint64_t xfer : {1, 2}) {
        ASSERT_TRUE(ss.putXfer(xfer, eventFd()));
        ASSERT_TRUE(broker_->setAsyncEventFd(ss, ctx->context, xfer).isOk());
        EXPECT_EQ(used(Quota::kEventFds), 1u);
    }
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 16;
    ca.event_xfer_id = 3;
    ASSERT_TRUE(ss.putXfer(3, eventFd()));
    auto cq = broker_->createCq(ss, ca);
    ASSERT_TRUE(cq.isOk()) << cq.status().toString();
    EXPECT_EQ(used(Quota::kEventFds), 2u);
    const size_t objects = ss.objectCount();
    ca.event_xfer_id = 4;
    ASSERT_TRUE(ss.putXfer(4, eventFd()));
    Status st = broker_->createCq(ss, ca).status();
    EXPECT_EQ(st.code(), Code::kResourceExhausted);
    EXPECT_NE(st.message().find("'event_fds'"), std::string::npos) << st.message();
    EXPECT_EQ(ss.objectCount(), objects);  // no CQ made, its fd not kept
    ca.event_xfer_id = 0;                  // a CQ without one is no event fd
    ASSERT_TRUE(broker_->createCq(ss, ca).isOk());
    EXPECT_EQ(used(Quota::kEventFds), 2u);
    ASSERT_TRUE(broker_->destroyCq(ss, cq->cq).isOk());
    EXPECT_EQ(used(Quota::kEventFds), 1u);
    ASSERT_TRUE(ss.putXfer(5, eventFd()));
    ca.event_xfer_id = 5;
    EXPECT_TRUE(broker_->createCq(ss, ca).isOk());  // the room given back is taken again
    broker_->endSession(*s);
    EXPECT_TRUE(broker_->quotas().snapshot().uids.empty());
}

// A session's restart state counts in 'state_bytes' as the restart layer reports it (after each
// commit): charged as it is, and while the tenant is at its limit no object is made (objects are
// what the state grows with); an ended session gives its bytes back.
TEST_F(BrokerQuotaTest, RestartStateBytesAtTheLimitRefuseNewObjects) {
    broker_->quotas().setDefault(Quota::kStateBytes, 1000);
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    Session &ss = **s;
    auto ctx = broker_->openContext(ss, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    broker_->chargeStateBytes(ss, 999);
    EXPECT_EQ(used(Quota::kStateBytes), 999u);
    ASSERT_TRUE(broker_->allocPd(ss, ctx->context).isOk());
    broker_->chargeStateBytes(ss, 1200);  // written already: charged over the limit
    EXPECT_EQ(used(Quota::kStateBytes), 1200u);
    Status st = broker_->allocPd(ss, ctx->context).status();
    EXPECT_EQ(st.code(), Code::kResourceExhausted);
    EXPECT_NE(st.message().find("'state_bytes'"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("restart state"), std::string::npos) << st.message();
    EXPECT_EQ(ss.objectCount(), 2u);
    broker_->chargeStateBytes(ss, 500);  // a compaction shrank it
    EXPECT_EQ(used(Quota::kStateBytes), 500u);
    EXPECT_TRUE(broker_->allocPd(ss, ctx->context).isOk());
    broker_->endSession(*s);
    EXPECT_TRUE(broker_->quotas().snapshot().uids.empty());
}

// CQs, SRQs and QPs are charged on one path (Broker::publish): each queue's rings, as the driver
// sized them, count against queue_bytes and show in the Admin snapshot alike.
TEST_F(BrokerQuotaTest, EveryQueueKindChargesItsRingsTheSameWay) {
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    Session &ss = **s;
    auto ctx = broker_->openContext(ss, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto pd = broker_->allocPd(ss, ctx->context);
    ASSERT_TRUE(pd.isOk());
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 64;
    auto cq = broker_->createCq(ss, ca);
    ASSERT_TRUE(cq.isOk());
    CreateSrqArgs sa;
    sa.context = ctx->context;
    sa.pd = *pd;
    sa.max_wr = 16;
    sa.max_sge = 1;
    auto srq = broker_->createSrq(ss, sa);
    ASSERT_TRUE(srq.isOk());
    CreateQpArgs qa;
    qa.context = ctx->context;
    qa.pd = *pd;
    qa.send_cq = qa.recv_cq = cq->cq;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    auto qp = broker_->createQp(ss, qa);
    ASSERT_TRUE(qp.isOk());

    auto rings = [](const QueueResult &q) { return uint64_t{q.entry_cnt} * q.entry_size; };
    const uint64_t cq_bytes = rings(cq->info), srq_bytes = rings(srq->info),
                   qp_bytes = rings(qp->sq) + rings(qp->rq);
    EXPECT_GT(cq_bytes, 0u);
    EXPECT_GT(srq_bytes, 0u);
    EXPECT_GT(qp_bytes, 0u);
    EXPECT_EQ(used(Quota::kQueueBytes), cq_bytes + srq_bytes + qp_bytes);
    for (const ObjectSnapshot &o : SessionInspector::objects(ss)) {
        if (o.handle == cq->cq) {
            EXPECT_EQ(o.queue_bytes, cq_bytes);
        } else if (o.handle == srq->srq) {
            EXPECT_EQ(o.queue_bytes, srq_bytes);
        } else if (o.handle == qp->qp) {
            EXPECT_EQ(o.queue_bytes, qp_bytes);
        } else {
            EXPECT_EQ(o.queue_bytes, 0u) << kindName(o.kind);
        }
    }
    ASSERT_TRUE(broker_->destroyQp(ss, qp->qp).isOk());
    EXPECT_EQ(used(Quota::kQueueBytes), cq_bytes + srq_bytes);
    broker_->endSession(*s);
    EXPECT_EQ(used(Quota::kQueueBytes), 0u);
}

TEST_F(BrokerQuotaTest, QueueBytesOverTheLimitRollTheDriverObjectBack) {
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    Session &ss = **s;
    auto ctx = broker_->openContext(ss, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 64;
    auto cq = broker_->createCq(ss, ca);
    ASSERT_TRUE(cq.isOk());
    uint64_t one_cq = used(Quota::kQueueBytes);
    ASSERT_GT(one_cq, 0u);
    // Room for exactly one more CQ of this size, and not two.
    broker_->quotas().setDefault(Quota::kQueueBytes, 2 * one_cq + one_cq / 2);
    auto second = broker_->createCq(ss, ca);
    ASSERT_TRUE(second.isOk()) << second.status().toString();
    size_t objects = ss.objectCount();
    uint64_t regions = MappingManager::instance().stats(ss.memory()).allocated_bytes;
    auto third = broker_->createCq(ss, ca);
    ASSERT_EQ(third.status().code(), Code::kResourceExhausted);
    EXPECT_NE(third.status().message().find("'queue_bytes'"), std::string::npos) << third.status().message();
    EXPECT_EQ(ss.objectCount(), objects);
    EXPECT_EQ(MappingManager::instance().stats(ss.memory()).allocated_bytes, regions);
    EXPECT_EQ(used(Quota::kQueueBytes), 2 * one_cq);
    EXPECT_EQ(used(Quota::kCqs), 2u);
    // Freed room is usable again.
    ASSERT_TRUE(broker_->destroyCq(ss, second->cq).isOk());
    EXPECT_TRUE(broker_->createCq(ss, ca).isOk());
    broker_->endSession(*s);
    EXPECT_TRUE(broker_->quotas().snapshot().uids.empty());
}

TEST_F(BrokerQuotaTest, ConcurrentSessionsRacingPastAContainerLimit) {
    constexpr int kSessions = 6, kLimit = 10;
    broker_->quotas().setOverride(QuotaScope::kContainer, 0, "0123456789ab", Quota::kPds, kLimit);
    std::vector<std::shared_ptr<Session>> sessions;
    std::vector<uint64_t> ctxs;
    for (int i = 0; i < kSessions; ++i) {
        auto s = hello("0123456789ab");
        ASSERT_TRUE(s.isOk());
        sessions.push_back(*s);
        auto c = broker_->openContext(**s, "softnda0");
        ASSERT_TRUE(c.isOk());
        ctxs.push_back(c->context);
    }
    std::atomic<int> ok{0}, exhausted{0}, other{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kSessions; ++i) {
        threads.emplace_back([&, i] {
            for (int k = 0; k < 5; ++k) {
                auto pd = broker_->allocPd(*sessions[i], ctxs[i]);
                if (pd.isOk()) {
                    ++ok;
                } else if (pd.status().code() == Code::kResourceExhausted) {
                    ++exhausted;
                } else {
                    ++other;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(ok.load(), kLimit);
    EXPECT_EQ(exhausted.load(), kSessions * 5 - kLimit);
    EXPECT_EQ(other.load(), 0);
    EXPECT_EQ(broker_->quotas().usage(QuotaScope::kContainer, 0, "0123456789ab")[idx(Quota::kPds)],
              static_cast<uint64_t>(kLimit));
    for (auto &s : sessions) {
        broker_->endSession(s);
    }
    QuotaSnapshot snap = broker_->quotas().snapshot();
    EXPECT_TRUE(snap.uids.empty());
    EXPECT_TRUE(snap.containers.empty());
}

TEST_F(BrokerQuotaTest, PolicyGatesHelloAndDevices) {
    PolicyConfig pc;
    pc.enabled = true;
    broker_->setPolicy(std::make_shared<const Policy>(pc));
    Status st = hello().status();
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    EXPECT_NE(st.message().find("policy.allow_uids"), std::string::npos);
    EXPECT_TRUE(broker_->quotas().snapshot().uids.empty());  // the refused Hello charged nothing
    pc.allow_uids = {getuid()};
    pc.default_devices = {"softnda1"};
    broker_->setPolicy(std::make_shared<const Policy>(pc));
    auto s = hello();
    ASSERT_TRUE(s.isOk());
    st = broker_->openContext(**s, "softnda0").status();
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    EXPECT_NE(st.message().find("policy.default_devices"), std::string::npos);
    EXPECT_EQ((*s)->objectCount(), 0u);
}

}  // namespace
}  // namespace ibvx::daemon
