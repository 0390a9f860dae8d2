// The broker's XRC objects over the real softnda driver (SPEC.md §14): a domain, XRC SRQs with
// their numbers, target and initiator QPs, owned by a session, counted in quotas, destroyed in
// order and reclaimed at its end; bad requests refused with nothing left behind.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "daemon/core/broker.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

class DestroyLog : public BrokerEvents {
  public:
    void objectCreated(const Session &, ObjectKind, uint64_t) override {}
    void objectDestroyed(const Session &, ObjectKind kind, uint64_t) override {
        log.push_back(kindName(kind));
    }
    void quotaDenied(const PeerIdentity &, uint64_t, const std::string &) override {}
    std::vector<std::string> log;
};

class BrokerXrcTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        broker_ = std::make_unique<Broker>(Broker::Options{}, devices_);
        broker_->setRegionSender([](Session &, std::vector<RegionToSend> &) { return Status::ok(); });
        broker_->setEvents(&events_);
        session_ = newSession();
    }
    void TearDown() override { broker_.reset(); }

    std::shared_ptr<Session> newSession() {
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        auto s = broker_->hello(peer, {4, 2, 0}, "unit");
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        return *s;
    }

    uint64_t held(Quota q) {
        return broker_->quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(q)];
    }

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
        auto xrcd = broker_->openXrcd(s, b.ctx);
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

    std::unique_ptr<Broker> broker_;
    std::shared_ptr<Session> session_;
    DestroyLog events_;
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
    auto xrcd = broker_->openXrcd(*session_, ctx->context);
    ASSERT_TRUE(xrcd.isOk()) << xrcd.status().toString();
    auto exported = [&](uint64_t handle) {
        auto hold = session_->hold();
        ObjectImport in;
        EXPECT_TRUE(broker_->exportObject(*session_, handle).isOk());
        const Object *o = session_->object(handle);
        in.handle = handle;
        in.kind = o->kind;
        for (const Object *u : o->uses) {
            in.uses.push_back(u->handle);
        }
        in.device = o->device()->info.name;
        in.driver_state = o->driver_state;
        for (const UniqueFd &fd : o->driver_fds) {
            in.driver_fds.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
        }
        return in;
    };
    ObjectImport ctx_in = exported(ctx->context);
    ObjectImport xrcd_in = exported(*xrcd);
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

}  // namespace
}  // namespace ibvx::daemon
