// XRC targets opened by other sessions (ibv_open_qp) across a restart (docs/restart.md), in one
// process over the real softnda driver: the creator's record carries the driver's target, each
// opener's names it by number and is adopted after every session's own objects; a handle's
// modify is committed into the creator's record before its own reply; an opener whose target's
// creator did not come back ends, leaving nothing; a restart plan keeps both sessions, and drops
// the openers once their target's creator let go of it or is dropped itself.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "daemon/core/broker.h"
#include "daemon/core/identity.h"
#include "daemon/restart/restart_state.h"
#include "tests/unit/daemon/restart_rig.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

class RestartXrcTest : public SoftndaDevicesTest {
  protected:
    struct Tenant {
        std::shared_ptr<Session> s;
        UniqueFd peer;  // the tenant's end of the fd channel
        uint64_t ctx = 0, xrcd = 0, qp = 0;
    };

    void SetUp() override {
        old_ = std::make_unique<Rig>(devices_);
        ASSERT_TRUE(old_->state.start().isOk());
        char name[] = "/tmp/ibvx-restart-xrcd-XXXXXX";
        file_.reset(::mkstemp(name));
        ASSERT_TRUE(file_);
        ::unlink(name);
        // A creates a target in the file's domain; B joins the domain and opens the target.
        a_ = tenant(O_CREAT);
        b_ = tenant(0);
        const QpResult tgt = makeTarget(a_);
        a_.qp = tgt.qp;
        qp_num_ = tgt.qp_num;
        auto opened = broker().openQp(*b_.s, {b_.ctx, b_.xrcd, qp_num_, IBV_QPT_XRC_RECV});
        ASSERT_TRUE(opened.isOk()) << opened.status().toString();
        commit(b_);
        b_.qp = opened->qp;
    }

    Broker &broker() { return old_ != nullptr ? old_->broker : fresh_->broker; }
    void commit(const Tenant &t) { ASSERT_TRUE(broker().commit(*t.s, StoredReply{}).isOk()); }

    // An XRC target in t's handle on the file's domain, committed.
    QpResult makeTarget(const Tenant &t) {
        CreateQpArgs a;
        a.context = t.ctx;
        a.xrcd = t.xrcd;
        a.qp_type = IBV_QPT_XRC_RECV;
        auto r = broker().createQp(*t.s, a);
        EXPECT_TRUE(r.isOk()) << r.status().toString();
        commit(t);
        return r.isOk() ? *r : QpResult{};
    }

    // A session of this process (attached: its fd channel is up), its context and its handle on
    // the file's domain.
    Tenant tenant(int oflags, bool attach = true) {
        Tenant t;
        int sv[2];
        EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        UniqueFd ours(sv[0]);
        t.peer.reset(sv[1]);
        auto peer = peerIdentity(ours.get());
        EXPECT_TRUE(peer.isOk());
        auto s = broker().hello(*peer, rigOptions().version, "unit");
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        t.s = *s;
        std::shared_ptr<Session> attached;
        if (attach) {
            EXPECT_EQ(broker().attach(t.s->token(), peer->creds, ours, &attached), 0);
        }
        auto ctx = broker().openContext(*t.s, "softnda0");
        EXPECT_TRUE(ctx.isOk()) << ctx.status().toString();
        t.ctx = ctx->context;
        static uint64_t next_xfer = 5000;
        const uint64_t xfer = next_xfer++;
        EXPECT_TRUE(t.s->putXfer(xfer, UniqueFd(::fcntl(file_.get(), F_DUPFD_CLOEXEC, 0))));
        auto xrcd = broker().openXrcd(*t.s, {t.ctx, xfer, static_cast<uint32_t>(oflags)});
        EXPECT_TRUE(xrcd.isOk()) << xrcd.status().toString();
        t.xrcd = xrcd.isOk() ? *xrcd : 0;
        commit(t);
        return t;
    }

    // RESET -> INIT through the opened handle, committed as the service commits a call. The
    // access flags are kept only in the driver's blob (the state is in queue memory too).
    void handleToInit() {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        auto r = broker().modifyQp(*b_.s, b_.qp, attr,
                                   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        ASSERT_TRUE(r.isOk()) << r.status().toString();
        commit(b_);
    }

    ibv_qp_state stateOf(Session &s, uint64_t qp) {
        auto r = broker().queryQp(s, qp, IBV_QP_STATE);
        EXPECT_TRUE(r.isOk()) << r.status().toString();
        return r.isOk() ? r->attr.qp_state : IBV_QPS_UNKNOWN;
    }
    unsigned accessOf(Session &s, uint64_t qp) {
        auto r = broker().queryQp(s, qp, IBV_QP_ACCESS_FLAGS);
        EXPECT_TRUE(r.isOk()) << r.status().toString();
        return r.isOk() ? r->attr.qp_access_flags : ~0u;
    }

    // The old process is gone (a crash: the store's fds are all the successor gets, less the
    // names `without` starts with); the sessions it restored, by id.
    RestoreReport restore(const std::string &without = "") {
        NamedFds fds = old_->crashFds();
        if (!without.empty()) {
            std::erase_if(fds, [&](const auto &named) { return named.first.rfind(without, 0) == 0; });
        }
        a_.s.reset();
        b_.s.reset();
        old_.reset();
        fresh_ = std::make_unique<Rig>(devices_);
        std::vector<std::shared_ptr<Session>> restored;
        RestoreReport report = fresh_->state.restore(fds, &restored);
        for (auto &s : restored) {
            (s->id() == a_id_ ? a_.s : b_.s) = s;
        }
        return report;
    }

    std::unique_ptr<Rig> old_, fresh_;
    UniqueFd file_;
    Tenant a_, b_;
    uint32_t qp_num_ = 0;
    uint64_t a_id_ = 0;
};

// The handle moved the target after the creator's last call: the crash's successor still has
// the target as the handle left it (the creator's record was committed again), and both handles
// act on one target that lives until the last of them goes.
TEST_F(RestartXrcTest, AnOpenedTargetComesBackAsItsHandleLeftIt) {
    a_id_ = a_.s->id();
    handleToInit();
    RestoreReport report = restore();
    ASSERT_EQ(report.sessions_kept, 2u) << (report.problems.empty() ? "" : report.problems[0]);
    EXPECT_EQ(report.sessions_dropped, 0u);
    ASSERT_TRUE(a_.s != nullptr && b_.s != nullptr);
    EXPECT_EQ(stateOf(*b_.s, b_.qp), IBV_QPS_INIT);
    EXPECT_EQ(accessOf(*b_.s, b_.qp), unsigned{IBV_ACCESS_REMOTE_WRITE})
        << "the handle's modify was committed in the creator's record";
    EXPECT_EQ(stateOf(*a_.s, a_.qp), IBV_QPS_INIT);
    // One target, two handles, as before the restart: the creator lets go, the opener still has it.
    ASSERT_TRUE(broker().destroyQp(*a_.s, a_.qp).isOk());
    EXPECT_EQ(stateOf(*b_.s, b_.qp), IBV_QPS_INIT);
    auto again = broker().openQp(*a_.s, {a_.ctx, a_.xrcd, qp_num_, IBV_QPT_XRC_RECV});
    ASSERT_TRUE(again.isOk()) << "openable by number after the restore: " << again.status().toString();
    ASSERT_TRUE(broker().destroyQp(*a_.s, again->qp).isOk());
    ASSERT_TRUE(broker().destroyQp(*b_.s, b_.qp).isOk());
    EXPECT_EQ(broker().openQp(*a_.s, {a_.ctx, a_.xrcd, qp_num_, IBV_QPT_XRC_RECV}).status().errnoValue(),
              EINVAL)
        << "the last handle took the target";
}

// The restore goes through the sessions in the order of their ids: a handle whose target is a
// later session's waits until that session is back.
TEST_F(RestartXrcTest, AHandleOnALaterSessionsTargetComesBack) {
    a_id_ = a_.s->id();
    ASSERT_LT(a_.s->id(), b_.s->id());
    const QpResult bs = makeTarget(b_);
    auto opened = broker().openQp(*a_.s, {a_.ctx, a_.xrcd, bs.qp_num, IBV_QPT_XRC_RECV});
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    commit(a_);
    RestoreReport report = restore();
    ASSERT_EQ(report.sessions_kept, 2u) << (report.problems.empty() ? "" : report.problems[0]);
    ASSERT_TRUE(a_.s != nullptr && b_.s != nullptr);
    ASSERT_TRUE(broker().destroyQp(*b_.s, bs.qp).isOk());
    EXPECT_EQ(stateOf(*a_.s, opened->qp), IBV_QPS_RESET) << "A's handle holds B's target";
    ASSERT_TRUE(broker().destroyQp(*a_.s, opened->qp).isOk());
    EXPECT_EQ(broker().openQp(*a_.s, {a_.ctx, a_.xrcd, bs.qp_num, IBV_QPT_XRC_RECV}).status().errnoValue(),
              EINVAL);
}

// The creator's session does not come back (here: its state is missing): the opener's handle
// has no target to name, so its session ends cleanly, with the reason, and nothing is left.
TEST_F(RestartXrcTest, AnOpenerWhoseTargetDidNotComeBackEnds) {
    a_id_ = a_.s->id();
    // Its state only: B's handle on the shared domain's file may be stored under A's name.
    RestoreReport report = restore("ibvx.s" + std::to_string(a_id_) + ".state");
    EXPECT_EQ(report.sessions_kept, 0u);
    EXPECT_EQ(report.sessions_dropped, 1u);
    ASSERT_FALSE(report.problems.empty());
    EXPECT_NE(report.problems[0].find("did not come back"), std::string::npos) << report.problems[0];
    EXPECT_EQ(report.objects, 0u);
    EXPECT_EQ(fresh_->broker.sessionCount(), 0u);
}

// A plan keeps both sessions of an opened target. An opener of a target whose creator's session
// is dropped for another reason (here: it never attached its fd channel) is dropped with it,
// and so in turn are the openers of the opener's own targets.
TEST_F(RestartXrcTest, APlanDropsTheOpenersOfATargetWhoseCreatorIsDropped) {
    RestartState::Plan p = old_->state.plan();
    EXPECT_EQ(p.kept, 2u) << "an opened target is carried";
    EXPECT_EQ(p.dropped, 0u);

    Tenant c = tenant(0, /*attach=*/false);  // C makes a target, which B opens; A opens B's
    const QpResult bs = makeTarget(b_);
    const QpResult cs = makeTarget(c);
    ASSERT_TRUE(broker().openQp(*b_.s, {b_.ctx, b_.xrcd, cs.qp_num, IBV_QPT_XRC_RECV}).isOk());
    p = old_->state.plan();
    EXPECT_EQ(p.kept, 1u) << "A: B opened its target, it opened none";
    EXPECT_EQ(p.dropped, 2u) << "C, never attached, and B, which opened C's target";
    ASSERT_TRUE(broker().openQp(*a_.s, {a_.ctx, a_.xrcd, bs.qp_num, IBV_QPT_XRC_RECV}).isOk());
    p = old_->state.plan();
    EXPECT_EQ(p.kept, 0u) << "A opened B's target, and B is dropped";
    EXPECT_EQ(p.dropped, 3u);
    EXPECT_NE(std::find(p.dropping_drivers.begin(), p.dropping_drivers.end(),
                        "(XRC targets opened from a dropped session)"),
              p.dropping_drivers.end());
}

TEST_F(RestartXrcTest, APlanDropsATargetItsCreatorLetGoOf) {
    ASSERT_TRUE(broker().destroyQp(*a_.s, a_.qp).isOk());  // hidden, kept for B's handle
    RestartState::Plan p = old_->state.plan();
    EXPECT_EQ(p.kept, 0u);
    EXPECT_EQ(p.dropped, 2u);
    ASSERT_EQ(p.dropping_drivers.size(), 1u);
    EXPECT_EQ(p.dropping_drivers[0], "softnda (XRC target QPs their creator let go of)");
    ASSERT_TRUE(broker().destroyQp(*b_.s, b_.qp).isOk());  // the last handle: the target goes
    EXPECT_EQ(old_->state.plan().kept, 2u);
}

}  // namespace
}  // namespace ibvx::daemon
