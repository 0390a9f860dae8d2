// The broker's XRC objects over the real softnda driver (SPEC.md §14): a domain, XRC SRQs with
// their numbers, target and initiator QPs, owned by a session, counted in quotas, destroyed in
// order and reclaimed at its end; bad requests refused with nothing left behind. A domain opened
// with a file is shared by the sessions that open it with that file, lives while any holds it,
// and comes back once from a restore. A target opened by another session (ibv_open_qp) lives
// until its last handle goes, its creator's included (across a restart: restart_xrc_test.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "daemon/core/object_snapshot.h"
#include "tests/unit/daemon/softnda_broker.h"

namespace ibvx::daemon {
namespace {

class BrokerXrcTest : public SoftndaBrokerTest {
  protected:
    // A context, PD, CQ and XRC domain on softnda0.
    struct Base {
        uint64_t ctx = 0, pd = 0, cq = 0, xrcd = 0;
    };
    Base makeBase(Session &s) {
        Base b;
        auto ctx = broker_->openContext(s, "softnda0");
        EXPECT_TRUE(ctx.isOk()) << ctx.status().toString();
        b.ctx = ctx->context;
        auto pd = broker_->allocPd(s, b.ctx);
        EXPECT_TRUE(pd.isOk()) << pd.status().toString();
        b.pd = *pd;
        CreateCqArgs ca;
        ca.context = b.ctx;
        ca.cqe = 64;
        auto cq = broker_->createCq(s, ca);
        EXPECT_TRUE(cq.isOk()) << cq.status().toString();
        b.cq = cq->cq;
        auto xrcd = broker_->openXrcd(s, {b.ctx, 0, O_CREAT});
        EXPECT_TRUE(xrcd.isOk()) << xrcd.status().toString();
        b.xrcd = *xrcd;
        return b;
    }
    CreateSrqArgs xrcSrq(const Base &b) {
        CreateSrqArgs a;
        a.context = b.ctx;
        a.pd = b.pd;
        a.xrcd = b.xrcd;
        a.cq = b.cq;
        a.max_wr = 16;
        a.max_sge = 1;
        return a;
    }
    CreateQpArgs target(const Base &b) {
        CreateQpArgs a;
        a.context = b.ctx;
        a.xrcd = b.xrcd;
        a.qp_type = IBV_QPT_XRC_RECV;
        return a;
    }
    CreateQpArgs initiator(const Base &b) {
        CreateQpArgs a;
        a.context = b.ctx;
        a.pd = b.pd;
        a.send_cq = b.cq;
        a.qp_type = IBV_QPT_XRC_SEND;
        a.cap.max_send_wr = 16;
        a.cap.max_send_sge = 1;
        return a;
    }

    // ibv_open_xrcd with a file: the file goes on the session's fd channel (here, straight into
    // its table) under a new xfer id, as the face sends it.
    StatusOr<uint64_t> openShared(Session &s, uint64_t ctx, int fd, int oflags) {
        static uint64_t next_xfer = 1000;
        const uint64_t xfer = next_xfer++;
        EXPECT_TRUE(s.putXfer(xfer, UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0))));
        return broker_->openXrcd(s, {ctx, xfer, static_cast<uint32_t>(oflags)});
    }
    ibv_xrcd *driverDomain(Session &s, uint64_t handle) {
        auto hold = s.hold();
        auto *x = static_cast<const XrcdObject *>(s.object(handle));
        return x != nullptr ? x->xrcd : nullptr;
    }
    Device *softnda0() { return devices_->find("softnda0"); }
};

// A temporary file, unlinked at once (the open fd keeps its inode, which keys the domain).
class TempFile {
  public:
    TempFile() {
        char name[] = "/tmp/ibvx-xrcd-XXXXXX";
        fd_ = UniqueFd(::mkstemp(name));
        ::unlink(name);
    }
    int fd() const { return fd_.get(); }

  private:
    UniqueFd fd_;
};

TEST_F(BrokerXrcTest, XrcObjectsBelongToTheSessionAndItsQuotas) {
    Base b = makeBase(*session_);
    EXPECT_EQ(held(Quota::kXrcds), 1u);
    auto srq1 = broker_->createSrq(*session_, xrcSrq(b));
    auto srq2 = broker_->createSrq(*session_, xrcSrq(b));
    ASSERT_TRUE(srq1.isOk()) << srq1.status().toString();
    ASSERT_TRUE(srq2.isOk()) << srq2.status().toString();
    EXPECT_NE(srq1->srq_num, 0u);
    EXPECT_NE(srq1->srq_num, srq2->srq_num) << "numbers are unique on the device";
    EXPECT_GT(srq1->max_wr, 0u);
    auto tgt = broker_->createQp(*session_, target(b));
    ASSERT_TRUE(tgt.isOk()) << tgt.status().toString();
    EXPECT_NE(tgt->qp_num, 0u);
    auto ini = broker_->createQp(*session_, initiator(b));
    ASSERT_TRUE(ini.isOk()) << ini.status().toString();
    EXPECT_GT(ini->cap.max_send_wr, 0u);
    EXPECT_EQ(ini->cap.max_recv_wr, 0u) << "an initiator has no receive queue";
    EXPECT_EQ(held(Quota::kSrqs), 2u);
    EXPECT_EQ(held(Quota::kQps), 2u);
    {
        auto hold = session_->hold();
        ObjectSnapshot snap;
        session_->object(srq1->srq)->snapshot(snap);
        EXPECT_EQ(snap.srq_num, srq1->srq_num);
    }
    // The domain outlives what uses it; the CQ outlives the SRQs completing on it.
    EXPECT_EQ(broker_->closeXrcd(*session_, b.xrcd).errnoValue(), EBUSY);
    EXPECT_EQ(broker_->destroyCq(*session_, b.cq).status().errnoValue(), EBUSY);
    ASSERT_TRUE(broker_->destroySrq(*session_, srq2->srq).isOk());
    EXPECT_EQ(held(Quota::kSrqs), 1u);

    events_.log.clear();
    broker_->endSession(session_);
    const std::vector<std::string> order = {"qp", "qp", "srq", "cq", "xrcd", "pd", "context"};
    EXPECT_EQ(events_.log, order);
    for (Quota q : {Quota::kXrcds, Quota::kSrqs, Quota::kQps, Quota::kCqs}) {
        EXPECT_EQ(held(q), 0u) << quotaName(q);
    }
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u);
}

TEST_F(BrokerXrcTest, ADomainClosesOnceNothingUsesIt) {
    Base b = makeBase(*session_);
    auto tgt = broker_->createQp(*session_, target(b));
    ASSERT_TRUE(tgt.isOk()) << tgt.status().toString();
    ASSERT_TRUE(broker_->destroyQp(*session_, tgt->qp).isOk());
    ASSERT_TRUE(broker_->closeXrcd(*session_, b.xrcd).isOk());
    EXPECT_EQ(held(Quota::kXrcds), 0u);
    EXPECT_EQ(broker_->closeXrcd(*session_, b.xrcd).code(), Code::kNotFound) << "closed already";
}

TEST_F(BrokerXrcTest, BadXrcRequestsAreRefusedAndLeaveNothing) {
    Base b = makeBase(*session_);
    auto other = newSession();
    Base theirs = makeBase(*other);
    const size_t objects = session_->objectCount();
    auto refused = [&](StatusOr<SrqResult> r, Code code, const char *why) {
        EXPECT_EQ(r.status().code(), code) << why << ": " << r.status().toString();
    };
    auto refusedQp = [&](StatusOr<QpResult> r, Code code, const char *why) {
        EXPECT_EQ(r.status().code(), code) << why << ": " << r.status().toString();
    };

    // Another session's domain is no domain of ours.
    CreateSrqArgs sa = xrcSrq(b);
    sa.xrcd = theirs.xrcd;
    refused(broker_->createSrq(*session_, sa), Code::kNotFound, "another session's domain");
    CreateQpArgs qa = target(b);
    qa.xrcd = theirs.xrcd;
    refusedQp(broker_->createQp(*session_, qa), Code::kNotFound, "a target in another session's domain");
    EXPECT_EQ(broker_->closeXrcd(*session_, theirs.xrcd).code(), Code::kNotFound);
    EXPECT_EQ(broker_->closeXrcd(*session_, b.pd).code(), Code::kNotFound) << "a PD is no domain";

    // A domain without a CQ (or a CQ without a domain) is no XRC SRQ.
    sa = xrcSrq(b);
    sa.cq = 0;
    refused(broker_->createSrq(*session_, sa), Code::kInvalidArgument, "an XRC SRQ without its CQ");
    sa = xrcSrq(b);
    sa.xrcd = 0;
    refused(broker_->createSrq(*session_, sa), Code::kInvalidArgument, "a CQ without a domain");

    // A target has its domain and nothing else.
    qa = target(b);
    qa.xrcd = 0;
    auto no_domain = broker_->createQp(*session_, qa);
    refusedQp(no_domain, Code::kInvalidArgument, "a target with no domain");
    EXPECT_NE(no_domain.status().message().find("XRC domain"), std::string::npos)
        << no_domain.status().toString();
    qa = target(b);
    qa.pd = b.pd;
    refusedQp(broker_->createQp(*session_, qa), Code::kInvalidArgument, "a target with a PD");

    // An initiator receives nothing; only a target takes a domain.
    qa = initiator(b);
    qa.recv_cq = b.cq;
    refusedQp(broker_->createQp(*session_, qa), Code::kInvalidArgument, "an initiator with a recv_cq");
    qa = initiator(b);
    qa.xrcd = b.xrcd;
    refusedQp(broker_->createQp(*session_, qa), Code::kInvalidArgument, "an initiator with a domain");

    // An XRC SRQ is reached by its number, never as an RC QP's SRQ.
    auto srq = broker_->createSrq(*session_, xrcSrq(b));
    ASSERT_TRUE(srq.isOk()) << srq.status().toString();
    qa = {};
    qa.context = b.ctx;
    qa.pd = b.pd;
    qa.send_cq = qa.recv_cq = b.cq;
    qa.srq = srq->srq;
    qa.cap.max_send_wr = 4;
    qa.cap.max_send_sge = 1;
    refusedQp(broker_->createQp(*session_, qa), Code::kInvalidArgument, "an XRC SRQ as a QP's srq");

    EXPECT_EQ(session_->objectCount(), objects + 1) << "nothing made but the one SRQ";
    EXPECT_EQ(held(Quota::kQps), 0u) << "nothing charged";
    EXPECT_EQ(held(Quota::kSrqs), 1u);
    EXPECT_EQ(held(Quota::kXrcds), 2u) << "one domain in each session";
}

// A domain's export is the driver's (IBV_EXTEND_VDEV_OBJ_XRCD); a restore makes it again in
// the restored session, under its handle, usable by new XRC SRQs.
TEST_F(BrokerXrcTest, AdoptMakesADomainAgain) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto xrcd = broker_->openXrcd(*session_, {ctx->context, 0, O_CREAT});
    ASSERT_TRUE(xrcd.isOk()) << xrcd.status().toString();
    ObjectImport ctx_in = exportedForRestore(*broker_, *session_, ctx->context);
    ObjectImport xrcd_in = exportedForRestore(*broker_, *session_, *xrcd);
    EXPECT_FALSE(xrcd_in.driver_state.empty()) << "softnda exports a domain";
    xrcd_in.quota[static_cast<size_t>(Quota::kXrcds)] = 1;
    auto restored = newSession();
    Relocations relocations;
    Device *dev = devices_->find("softnda0");
    ASSERT_EQ(dev->verbs.setPaused(true), 0);
    for (ObjectImport *in : {&ctx_in, &xrcd_in}) {
        Status st = broker_->adopt(*restored, std::move(*in), relocations);
        EXPECT_TRUE(st.isOk()) << st.toString();
    }
    ASSERT_EQ(dev->verbs.setPaused(false), 0);
    EXPECT_EQ(held(Quota::kXrcds), 2u) << "the original's and the restored one's";
    Base b;
    b.ctx = ctx->context;
    b.xrcd = *xrcd;
    auto pd = broker_->allocPd(*restored, b.ctx);
    ASSERT_TRUE(pd.isOk());
    b.pd = *pd;
    CreateCqArgs ca;
    ca.context = b.ctx;
    ca.cqe = 16;
    auto cq = broker_->createCq(*restored, ca);
    ASSERT_TRUE(cq.isOk());
    b.cq = cq->cq;
    auto srq = broker_->createSrq(*restored, xrcSrq(b));
    ASSERT_TRUE(srq.isOk()) << srq.status().toString();
    EXPECT_NE(srq->srq_num, 0u);
    EXPECT_EQ(broker_->closeXrcd(*restored, b.xrcd).errnoValue(), EBUSY);
    broker_->endSession(restored);
    EXPECT_EQ(held(Quota::kXrcds), 1u);
}

// ---- sharing by file (ibv_open_xrcd's fd and oflags, the kernel's semantics) ----

TEST_F(BrokerXrcTest, SessionsOpeningTheSameFileShareOneDomain) {
    TempFile file, other_file;
    auto other = newSession();
    auto ctx_a = broker_->openContext(*session_, "softnda0");
    auto ctx_b = broker_->openContext(*other, "softnda0");
    ASSERT_TRUE(ctx_a.isOk() && ctx_b.isOk());
    const size_t shared_before = softnda0()->xrcds.sharedCount();

    // No domain for the file yet: without O_CREAT, EAGAIN (as ib_uverbs_open_xrcd).
    auto none = openShared(*other, ctx_b->context, file.fd(), 0);
    EXPECT_EQ(none.status().errnoValue(), EAGAIN) << none.status().toString();
    auto a = openShared(*session_, ctx_a->context, file.fd(), O_CREAT);
    ASSERT_TRUE(a.isOk()) << a.status().toString();
    auto b = openShared(*other, ctx_b->context, file.fd(), 0);
    ASSERT_TRUE(b.isOk()) << b.status().toString();
    EXPECT_EQ(driverDomain(*session_, *a), driverDomain(*other, *b)) << "one driver domain";
    EXPECT_EQ(softnda0()->xrcds.sharedCount(), shared_before + 1);
    // O_EXCL with a domain for the file: EINVAL.
    auto excl = openShared(*other, ctx_b->context, file.fd(), O_CREAT | O_EXCL);
    EXPECT_EQ(excl.status().errnoValue(), EINVAL) << excl.status().toString();
    // Another file, and fd -1, are other domains.
    auto c = openShared(*other, ctx_b->context, other_file.fd(), O_CREAT | O_EXCL);
    ASSERT_TRUE(c.isOk()) << c.status().toString();
    auto priv = broker_->openXrcd(*other, {ctx_b->context, 0, O_CREAT});
    ASSERT_TRUE(priv.isOk());
    EXPECT_NE(driverDomain(*other, *c), driverDomain(*other, *b));
    EXPECT_NE(driverDomain(*other, *priv), driverDomain(*other, *b));
    // A bad oflags value, and a file that never arrived.
    EXPECT_EQ(broker_->openXrcd(*other, {ctx_b->context, 0, O_RDWR | O_CREAT}).status().errnoValue(), EINVAL);
    EXPECT_EQ(broker_->openXrcd(*other, {ctx_b->context, 424242, O_CREAT}).status().errnoValue(), EBADF);

    // Each handle is its session's: counted in its quota, one per open.
    EXPECT_EQ(held(Quota::kXrcds), 4u);
    // A second handle of the same session on the domain is a handle of its own.
    auto b2 = openShared(*other, ctx_b->context, file.fd(), 0);
    ASSERT_TRUE(b2.isOk());
    EXPECT_NE(*b2, *b);
    EXPECT_EQ(driverDomain(*other, *b2), driverDomain(*session_, *a));
    ASSERT_TRUE(broker_->closeXrcd(*other, *b2).isOk());
}

TEST_F(BrokerXrcTest, ASharedDomainLivesWhileAnySessionHoldsIt) {
    TempFile file;
    auto other = newSession();
    Base a = makeBase(*session_);
    Base b = makeBase(*other);
    auto ha = openShared(*session_, a.ctx, file.fd(), O_CREAT);
    auto hb = openShared(*other, b.ctx, file.fd(), O_CREAT);
    ASSERT_TRUE(ha.isOk() && hb.isOk());
    a.xrcd = *ha;
    b.xrcd = *hb;
    ibv_xrcd *domain = driverDomain(*session_, a.xrcd);
    const size_t shared_before = softnda0()->xrcds.sharedCount();

    // A's XRC SRQ and B's target in the one domain: the SRQ is reachable from B's target (the
    // engine checks the SRQ's domain is the target's: the same driver domain).
    auto srq = broker_->createSrq(*session_, xrcSrq(a));
    ASSERT_TRUE(srq.isOk()) << srq.status().toString();
    auto tgt = broker_->createQp(*other, target(b));
    ASSERT_TRUE(tgt.isOk()) << tgt.status().toString();
    // Each session's handle is busy with its own session's objects only.
    EXPECT_EQ(broker_->closeXrcd(*other, b.xrcd).errnoValue(), EBUSY) << "B's target uses B's handle";

    // A ends (its SRQ, its handle): the domain stays B's.
    broker_->endSession(session_);
    EXPECT_EQ(driverDomain(*other, b.xrcd), domain);
    EXPECT_EQ(softnda0()->xrcds.sharedCount(), shared_before) << "still keyed by the file";
    auto srq_b = broker_->createSrq(*other, xrcSrq(b));
    ASSERT_TRUE(srq_b.isOk()) << "the domain still works: " << srq_b.status().toString();
    // A new session joins it again by the file.
    auto third = newSession();
    auto ctx_c = broker_->openContext(*third, "softnda0");
    auto hc = openShared(*third, ctx_c->context, file.fd(), 0);
    ASSERT_TRUE(hc.isOk()) << hc.status().toString();
    EXPECT_EQ(driverDomain(*third, *hc), domain);
    broker_->endSession(third);

    // The last handle closes the driver's domain: the file has none any more.
    ASSERT_TRUE(broker_->destroySrq(*other, srq_b->srq).isOk());
    ASSERT_TRUE(broker_->destroyQp(*other, tgt->qp).isOk());
    ASSERT_TRUE(broker_->closeXrcd(*other, b.xrcd).isOk());
    EXPECT_EQ(softnda0()->xrcds.sharedCount(), shared_before - 1);
    EXPECT_EQ(openShared(*other, b.ctx, file.fd(), 0).status().errnoValue(), EAGAIN);
    broker_->endSession(other);
    EXPECT_EQ(held(Quota::kXrcds), 0u);
}

// A restore brings a shared domain back once: the first handle to come back (in whichever
// session) imports the driver's domain, the others join it by the file their record kept.
TEST_F(BrokerXrcTest, AdoptBringsASharedDomainBackOnce) {
    TempFile file;
    auto other = newSession();
    auto ctx_a = broker_->openContext(*session_, "softnda0");
    auto ctx_b = broker_->openContext(*other, "softnda0");
    auto ha = openShared(*session_, ctx_a->context, file.fd(), O_CREAT);
    auto hb = openShared(*other, ctx_b->context, file.fd(), 0);
    ASSERT_TRUE(ha.isOk() && hb.isOk());
    std::vector<ObjectImport> a_in, b_in;
    a_in.push_back(exportedForRestore(*broker_, *session_, ctx_a->context));
    a_in.push_back(exportedForRestore(*broker_, *session_, *ha));
    b_in.push_back(exportedForRestore(*broker_, *other, ctx_b->context));
    b_in.push_back(exportedForRestore(*broker_, *other, *hb));
    ASSERT_TRUE(a_in[1].xrcd_file) << "a shared handle keeps its file";
    broker_->endSession(session_);
    broker_->endSession(other);  // the domain is closed: the restore must make it again
    const size_t shared_before = softnda0()->xrcds.sharedCount();

    auto ra = newSession();
    auto rb = newSession();
    Relocations relocations;
    ASSERT_EQ(softnda0()->verbs.setPaused(true), 0);
    for (auto &[s, ins] : {std::pair{ra, &a_in}, std::pair{rb, &b_in}}) {
        for (ObjectImport &in : *ins) {
            Status st = broker_->adopt(*s, std::move(in), relocations);
            EXPECT_TRUE(st.isOk()) << st.toString();
        }
    }
    ASSERT_EQ(softnda0()->verbs.setPaused(false), 0);
    EXPECT_EQ(softnda0()->xrcds.sharedCount(), shared_before + 1);
    ibv_xrcd *domain = driverDomain(*ra, *ha);
    ASSERT_NE(domain, nullptr);
    EXPECT_EQ(driverDomain(*rb, *hb), domain) << "one domain again, in both sessions";
    // And the file still names it for a new opener.
    auto third = newSession();
    auto ctx_c = broker_->openContext(*third, "softnda0");
    auto hc = openShared(*third, ctx_c->context, file.fd(), 0);
    ASSERT_TRUE(hc.isOk()) << hc.status().toString();
    EXPECT_EQ(driverDomain(*third, *hc), domain);
    for (auto &s : {ra, rb, third}) {
        broker_->endSession(s);
    }
    EXPECT_EQ(softnda0()->xrcds.sharedCount(), shared_before);
}

// ---- ibv_open_qp: handles on another session's target (the kernel's ib_open_qp) ----

class BrokerOpenQpTest : public BrokerXrcTest {
  protected:
    // A (session_) and B (other_) hold the domain of one file; A made a target in it.
    void SetUp() override {
        BrokerXrcTest::SetUp();
        other_ = newSession();
        a_ = makeBase(*session_);
        b_ = makeBase(*other_);
        auto ha = openShared(*session_, a_.ctx, file_.fd(), O_CREAT);
        auto hb = openShared(*other_, b_.ctx, file_.fd(), 0);
        ASSERT_TRUE(ha.isOk() && hb.isOk());
        a_.xrcd = *ha;
        b_.xrcd = *hb;
        auto tgt = broker_->createQp(*session_, target(a_));
        ASSERT_TRUE(tgt.isOk()) << tgt.status().toString();
        tgt_ = *tgt;
    }
    StatusOr<QpResult> open(Session &s, const Base &b, uint32_t qp_num, ibv_qp_type type = IBV_QPT_XRC_RECV) {
        return broker_->openQp(s, {b.ctx, b.xrcd, qp_num, type});
    }
    // RESET -> INIT through a handle: the driver's target moves (0 or the status).
    Status toInit(Session &s, uint64_t qp) {
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        attr.port_num = 1;
        return broker_
            ->modifyQp(s, qp, attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
            .status();
    }
    // The target's state through a handle (IBV_QPS_UNKNOWN when the query fails).
    ibv_qp_state stateOf(Session &s, uint64_t qp) {
        auto r = broker_->queryQp(s, qp, IBV_QP_STATE);
        EXPECT_TRUE(r.isOk()) << r.status().toString();
        return r.isOk() ? r->attr.qp_state : IBV_QPS_UNKNOWN;
    }

    TempFile file_;
    std::shared_ptr<Session> other_;
    Base a_, b_;
    QpResult tgt_;
};

TEST_F(BrokerOpenQpTest, AHandleActsOnTheTarget) {
    auto opened = open(*other_, b_, tgt_.qp_num);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    EXPECT_EQ(opened->qp_num, tgt_.qp_num);
    EXPECT_EQ(opened->state, IBV_QPS_RESET);
    EXPECT_NE(opened->qp, tgt_.qp) << "a handle of B's own";
    EXPECT_EQ(held(Quota::kQps), 2u) << "the target and the handle";
    ASSERT_TRUE(toInit(*other_, opened->qp).isOk());
    EXPECT_EQ(stateOf(*session_, tgt_.qp), IBV_QPS_INIT) << "the creator sees what the handle did";
    auto q = broker_->queryQp(*other_, opened->qp, IBV_QP_STATE);
    ASSERT_TRUE(q.isOk());
    EXPECT_EQ(q->init.qp_type, IBV_QPT_XRC_RECV);
    // B's domain handle is busy with B's handle, as with a target of its own.
    EXPECT_EQ(broker_->closeXrcd(*other_, b_.xrcd).errnoValue(), EBUSY);
    // Both ends are carried by a restart (restart_xrc_test.cpp): the creator's target with its
    // driver state, the handle by the target's number alone. An operator's listing
    // (ibv-extendctl objects) says which is which and how many handles the target has.
    {
        auto hold = other_->hold();
        EXPECT_EQ(other_->object(opened->qp)->restartDropReason(), nullptr);
        ObjectSnapshot o;
        other_->object(opened->qp)->snapshot(o);
        EXPECT_EQ(o.qp_target_handles, 2u);
        EXPECT_TRUE(o.qp_opened);
        EXPECT_FALSE(o.qp_released);
    }
    {
        auto hold = session_->hold();
        EXPECT_EQ(session_->object(tgt_.qp)->restartDropReason(), nullptr);
        ObjectSnapshot o;
        session_->object(tgt_.qp)->snapshot(o);
        EXPECT_EQ(o.qp_target_handles, 2u);
        EXPECT_FALSE(o.qp_opened) << "the creator's own";
    }
    Status exported = Status::ok();
    ObjectImport in = exportedForRestore(*broker_, *other_, opened->qp, &exported);
    EXPECT_TRUE(exported.isOk()) << exported.toString();
    EXPECT_TRUE(in.driver_state.empty()) << "an opened handle exports no driver object";
    in = exportedForRestore(*broker_, *session_, tgt_.qp, &exported);
    EXPECT_TRUE(exported.isOk()) << exported.toString();
    EXPECT_FALSE(in.driver_state.empty()) << "the creator's target exports the driver's, opened or not";
    ASSERT_TRUE(broker_->destroyQp(*other_, opened->qp).isOk());
    EXPECT_EQ(stateOf(*session_, tgt_.qp), IBV_QPS_INIT) << "the creator's target stays";
    EXPECT_EQ(held(Quota::kQps), 1u);
}

TEST_F(BrokerOpenQpTest, TheTargetOutlivesItsCreatorsHandleAndSession) {
    auto opened = open(*other_, b_, tgt_.qp_num);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    // The creator lets go: its handle is gone for it, the target is not.
    ASSERT_TRUE(broker_->destroyQp(*session_, tgt_.qp).isOk());
    EXPECT_EQ(broker_->queryQp(*session_, tgt_.qp, IBV_QP_STATE).status().code(), Code::kNotFound);
    EXPECT_TRUE(broker_->closeXrcd(*session_, a_.xrcd).isOk())
        << "the hidden target does not hold A's handle";
    {
        auto hold = session_->hold();
        ObjectSnapshot o;
        session_->object(tgt_.qp)->snapshot(o);
        EXPECT_TRUE(o.qp_released) << "listed as let go of, kept for the other handle";
        EXPECT_EQ(o.qp_target_handles, 1u);
    }
    ASSERT_TRUE(toInit(*other_, opened->qp).isOk()) << "the target still works";
    // Then the creator's session ends: its memory (the target's record) and context stay.
    broker_->endSession(session_);
    EXPECT_EQ(stateOf(*other_, opened->qp), IBV_QPS_INIT);
    ASSERT_TRUE(toInit(*other_, opened->qp).isOk()) << "INIT to INIT: the record is still written";
    EXPECT_EQ(held(Quota::kQps), 2u) << "the target against its creator until it goes, and B's handle";
    // A second handle of B's counts too; the target goes with the last one.
    auto second = open(*other_, b_, tgt_.qp_num);
    ASSERT_TRUE(second.isOk()) << second.status().toString();
    ASSERT_TRUE(broker_->destroyQp(*other_, opened->qp).isOk());
    EXPECT_EQ(stateOf(*other_, second->qp), IBV_QPS_INIT);
    ASSERT_TRUE(broker_->destroyQp(*other_, second->qp).isOk());
    EXPECT_EQ(held(Quota::kQps), 0u) << "the target went with its last handle";
    auto again = open(*other_, b_, tgt_.qp_num);
    EXPECT_EQ(again.status().errnoValue(), EINVAL) << "its number is no target any more";
    EXPECT_EQ(held(Quota::kXrcds), 2u) << "B's two (its private one and the shared one): A's went";
    broker_->endSession(other_);
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u) << "A's kept memory went too";
    for (Quota q : {Quota::kXrcds, Quota::kQps, Quota::kCqs, Quota::kPds}) {
        EXPECT_EQ(held(q), 0u) << quotaName(q);
    }
}

TEST_F(BrokerOpenQpTest, TheLastHandleEndingWithItsSessionEndsTheCreatorsParkedSession) {
    auto opened = open(*other_, b_, tgt_.qp_num);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    broker_->endSession(session_);  // without destroying anything first
    ASSERT_TRUE(toInit(*other_, opened->qp).isOk()) << "the target still works";
    EXPECT_GT(MappingManager::instance().totals().arena_chunks, 0u);
    // A third session joins the domain and opens the target too.
    auto third = newSession();
    Base c = makeBase(*third);
    auto hc = openShared(*third, c.ctx, file_.fd(), 0);
    ASSERT_TRUE(hc.isOk());
    c.xrcd = *hc;
    auto theirs = open(*third, c, tgt_.qp_num);
    ASSERT_TRUE(theirs.isOk()) << theirs.status().toString();
    broker_->endSession(other_);
    EXPECT_EQ(stateOf(*third, theirs->qp), IBV_QPS_INIT) << "held by the third session";
    broker_->endSession(third);
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u);
    for (Quota q : {Quota::kXrcds, Quota::kQps, Quota::kCqs, Quota::kPds}) {
        EXPECT_EQ(held(q), 0u) << quotaName(q);
    }
    EXPECT_EQ(broker_->sessionCount(), 0u);
}

// The creator goes on living without its target: it closes its domain handle and its context
// (kept for the target, hidden), and once the last handle goes nothing of the target is left.
TEST_F(BrokerOpenQpTest, ACreatorClosesItsContextWhileOthersHoldItsTarget) {
    auto creator = newSession();
    auto ctx = broker_->openContext(*creator, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto xrcd = openShared(*creator, ctx->context, file_.fd(), 0);
    ASSERT_TRUE(xrcd.isOk());
    Base c;
    c.ctx = ctx->context;
    c.xrcd = *xrcd;
    auto tgt = broker_->createQp(*creator, target(c));
    ASSERT_TRUE(tgt.isOk()) << tgt.status().toString();
    auto opened = open(*other_, b_, tgt->qp_num);
    ASSERT_TRUE(opened.isOk()) << opened.status().toString();
    ASSERT_TRUE(broker_->destroyQp(*creator, tgt->qp).isOk());
    ASSERT_TRUE(broker_->closeXrcd(*creator, c.xrcd).isOk());
    ASSERT_TRUE(broker_->closeContext(*creator, c.ctx).isOk()) << "only the hidden target uses it";
    EXPECT_EQ(broker_->queryDeviceAttr(*creator, c.ctx).status().code(), Code::kNotFound) << "closed for it";
    ASSERT_TRUE(toInit(*other_, opened->qp).isOk()) << "the target still works";
    EXPECT_EQ(creator->objectCount(), 2u) << "the hidden target and its context";
    ASSERT_TRUE(broker_->destroyQp(*other_, opened->qp).isOk());
    EXPECT_EQ(creator->objectCount(), 0u) << "both went with the last handle";
    EXPECT_EQ(open(*other_, b_, tgt->qp_num).status().errnoValue(), EINVAL);
    broker_->endSession(creator);
}

TEST_F(BrokerOpenQpTest, BadOpensAreRefusedAndLeaveNothing) {
    const size_t objects = other_->objectCount();
    const uint64_t qps = held(Quota::kQps);
    auto errnoOf = [](const StatusOr<QpResult> &r) { return r.status().errnoValue(); };
    EXPECT_EQ(errnoOf(open(*other_, b_, tgt_.qp_num, IBV_QPT_RC)), EINVAL) << "only a target is opened";
    EXPECT_EQ(errnoOf(open(*other_, b_, tgt_.qp_num, IBV_QPT_XRC_SEND)), EINVAL);
    EXPECT_EQ(errnoOf(open(*other_, b_, tgt_.qp_num + 4242)), EINVAL) << "no target by that number";
    // An initiator's number is no target's.
    auto ini = broker_->createQp(*session_, initiator(a_));
    ASSERT_TRUE(ini.isOk());
    EXPECT_EQ(errnoOf(open(*other_, b_, ini->qp_num)), EINVAL);
    // The target is in another domain than B's private one.
    auto priv = broker_->openXrcd(*other_, {b_.ctx, 0, O_CREAT});
    ASSERT_TRUE(priv.isOk());
    Base in_private = b_;
    in_private.xrcd = *priv;
    EXPECT_EQ(errnoOf(open(*other_, in_private, tgt_.qp_num)), EINVAL) << "not a target of this domain";
    // Another session's domain handle is unknown here.
    Base foreign = b_;
    foreign.xrcd = a_.xrcd;
    EXPECT_EQ(open(*other_, foreign, tgt_.qp_num).status().code(), Code::kNotFound);
    EXPECT_EQ(other_->objectCount(), objects + 1) << "nothing made but the private domain";
    EXPECT_EQ(held(Quota::kQps), qps + 1) << "the initiator only";
}

}  // namespace
}  // namespace ibvx::daemon
