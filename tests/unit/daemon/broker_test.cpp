// The broker core over the real softnda driver, linked in and registered by the test: sessions,
// handles, dependency errors, teardown order, MR registration from an fd, region hand-out.
#include "daemon/core/broker.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "providers/loader/loader.h"
#include "tests/unit/daemon/softnda_broker.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {
namespace {

// Records object events as "create qp", "destroy cq", ...
class RecordingEvents : public BrokerEvents {
  public:
    RecordingEvents(std::mutex &mu, std::vector<std::string> &log) : mu_(mu), log_(log) {}
    void objectCreated(const Session &, ObjectKind kind, uint64_t) override { add("create", kind); }
    void objectDestroyed(const Session &, ObjectKind kind, uint64_t) override { add("destroy", kind); }
    void quotaDenied(const PeerIdentity &, uint64_t, const std::string &) override {}

  private:
    void add(const char *action, ObjectKind kind) {
        std::lock_guard lock(mu_);
        log_.push_back(std::string(action) + " " + kindName(kind));
    }
    std::mutex &mu_;
    std::vector<std::string> &log_;
};

class BrokerTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        Broker::Options opt;
        opt.xfer_wait = std::chrono::milliseconds(200);
        broker_ = std::make_unique<Broker>(opt, devices_);
        broker_->setRegionSender([this](Session &, std::vector<RegionToSend> &regions) {
            std::lock_guard lock(sent_mu_);
            for (auto &r : regions) {
                sent_.push_back(r.id);
            }
            return send_status_;
        });
        broker_->setEvents(&events_);
        session_ = newSession();
    }

    // The broker ends its sessions on destruction, through hooks that use the members below.
    void TearDown() override { broker_.reset(); }

    std::shared_ptr<Session> newSession() {
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        auto s = broker_->hello(peer, {4, 2, 0}, "unit");
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        return *s;
    }

    // Context + PD + CQ + QP on softnda0.
    struct Objs {
        uint64_t ctx = 0, pd = 0, cq = 0, qp = 0;
    };
    Objs makeQp(Session &s) {
        Objs o;
        auto ctx = broker_->openContext(s, "softnda0");
        EXPECT_TRUE(ctx.isOk()) << ctx.status().toString();
        o.ctx = ctx->context;
        auto pd = broker_->allocPd(s, o.ctx);
        EXPECT_TRUE(pd.isOk()) << pd.status().toString();
        o.pd = *pd;
        CreateCqArgs ca;
        ca.context = o.ctx;
        ca.cqe = 64;
        auto cq = broker_->createCq(s, ca);
        EXPECT_TRUE(cq.isOk()) << cq.status().toString();
        o.cq = cq->cq;
        CreateQpArgs qa;
        qa.context = o.ctx;
        qa.pd = o.pd;
        qa.send_cq = qa.recv_cq = o.cq;
        qa.cap.max_send_wr = qa.cap.max_recv_wr = 16;
        qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
        auto qp = broker_->createQp(s, qa);
        EXPECT_TRUE(qp.isOk()) << qp.status().toString();
        o.qp = qp->qp;
        return o;
    }

    std::unique_ptr<Broker> broker_;
    std::shared_ptr<Session> session_;
    std::mutex sent_mu_;  // the hooks run on the threads of ConcurrentSessionsStayApart
    std::vector<RegionId> sent_;
    std::vector<std::string> audit_;
    RecordingEvents events_{sent_mu_, audit_};
    Status send_status_;
};

TEST_F(BrokerTest, ListsSoftnda) {
    auto devs = broker_->listDevices();
    ASSERT_FALSE(devs.empty());
    EXPECT_EQ(devs[0].name, "softnda0");
    EXPECT_EQ(devs[0].provider, "softnda");
    EXPECT_TRUE(devs[0].virtual_device);
    EXPECT_NE(devs[0].ext_cap & IBV_EXTEND_DEV_NDA, 0u);
}

TEST_F(BrokerTest, HelloChecksVersionAndTokensDiffer) {
    PeerIdentity peer;
    peer.creds = {getpid(), getuid(), getgid()};
    EXPECT_EQ(broker_->hello(peer, {5, 0, 0}, "x").status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(broker_->hello(peer, {4, 3, 0}, "x").status().code(), Code::kFailedPrecondition);
    auto other = newSession();
    EXPECT_NE(other->tokenHex(), session_->tokenHex());
    EXPECT_EQ(broker_->sessionCount(), 2u);
}

TEST_F(BrokerTest, AuthenticateChecksTokenAndCredentials) {
    Credentials me{getpid(), getuid(), getgid()};
    EXPECT_TRUE(broker_->authenticate(session_->tokenHex(), me).isOk());
    Credentials other = me;
    other.pid += 1;
    EXPECT_EQ(broker_->authenticate(session_->tokenHex(), other).status().code(), Code::kPermissionDenied);
    EXPECT_EQ(broker_->authenticate("zz", me).status().code(), Code::kPermissionDenied);
    EXPECT_EQ(broker_->authenticate(std::string(32, '0'), me).status().code(), Code::kUnavailable);
}

TEST_F(BrokerTest, HandlesAreNonZeroDistinctAndScopedToTheSession) {
    Objs o = makeQp(*session_);
    std::set<uint64_t> handles{o.ctx, o.pd, o.cq, o.qp};
    EXPECT_EQ(handles.size(), 4u);
    EXPECT_EQ(handles.count(0), 0u);
    auto other = newSession();
    // Another session's handle answers NOT_FOUND, exactly like a made-up one.
    EXPECT_EQ(broker_->allocPd(*other, o.ctx).status().code(), Code::kNotFound);
    EXPECT_EQ(broker_->destroyQp(*other, o.qp).status().code(), Code::kNotFound);
    EXPECT_EQ(broker_->destroyQp(*session_, o.qp + 1).status().code(), Code::kNotFound);
    // A handle of the wrong kind is not found either.
    EXPECT_EQ(broker_->destroyCq(*session_, o.qp).status().code(), Code::kNotFound);
    EXPECT_EQ(broker_->objectCount(), 4u);
}

TEST_F(BrokerTest, DestroyOfAnObjectInUseIsBusy) {
    Objs o = makeQp(*session_);
    auto st = broker_->destroyCq(*session_, o.cq);
    EXPECT_EQ(st.status().code(), Code::kFailedPrecondition);
    EXPECT_EQ(st.status().errnoValue(), EBUSY);
    EXPECT_EQ(broker_->deallocPd(*session_, o.pd).code(), Code::kFailedPrecondition);
    EXPECT_EQ(broker_->closeContext(*session_, o.ctx).status().errnoValue(), EBUSY);
    ASSERT_TRUE(broker_->destroyQp(*session_, o.qp).isOk());
    auto cq = broker_->destroyCq(*session_, o.cq);
    ASSERT_TRUE(cq.isOk());
    ASSERT_TRUE(broker_->deallocPd(*session_, o.pd).isOk());
    ASSERT_TRUE(broker_->closeContext(*session_, o.ctx).isOk());
    EXPECT_EQ(session_->objectCount(), 0u);
    EXPECT_EQ(MappingManager::instance().stats(session_->memory()).allocated_bytes, 0u);
}

TEST_F(BrokerTest, CreateSendsEveryReferencedRegionFirstAndDestroyReleasesThem) {
    Objs o = makeQp(*session_);
    ASSERT_FALSE(sent_.empty());
    std::set<RegionId> sent(sent_.begin(), sent_.end());
    EXPECT_EQ(sent.size(), sent_.size());  // each region sent once
    auto qr = broker_->queryQp(*session_, o.qp, IBV_QP_STATE);
    ASSERT_TRUE(qr.isOk());
    EXPECT_EQ(qr->attr.qp_state, IBV_QPS_RESET);
    auto qp_released = broker_->destroyQp(*session_, o.qp);
    ASSERT_TRUE(qp_released.isOk());
    auto cq_released = broker_->destroyCq(*session_, o.cq);
    ASSERT_TRUE(cq_released.isOk());
    std::set<RegionId> released(qp_released->begin(), qp_released->end());
    released.insert(cq_released->begin(), cq_released->end());
    EXPECT_EQ(released, sent);  // nothing left mapped after the last queue is gone
}

TEST_F(BrokerTest, CreateFailsCleanlyWhenRegionsCannotBeSent) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    send_status_ = Status(Code::kUnavailable, EPIPE, "channel broken");
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 8;
    auto cq = broker_->createCq(*session_, ca);
    EXPECT_EQ(cq.status().code(), Code::kUnavailable);
    EXPECT_EQ(session_->objectCount(), 1u);
    EXPECT_EQ(MappingManager::instance().stats(session_->memory()).allocated_bytes, 0u);
}

// ResizeCq (softnda SPEC.md §12): a new ring in the session's memory, sent before the reply,
// the old one's memory given back; bad sizes change nothing; the CQ still goes with a destroy.
TEST_F(BrokerTest, ResizeCqMovesTheRingAndKeepsTheDoorbell) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 8;
    auto cq = broker_->createCq(*session_, ca);
    ASSERT_TRUE(cq.isOk()) << cq.status().toString();
    auto grown = broker_->resizeCq(*session_, cq->cq, 4096);
    ASSERT_TRUE(grown.isOk()) << grown.status().toString();
    EXPECT_EQ(grown->cqe, 4096u);
    EXPECT_EQ(grown->info.entry_cnt, 4096u);
    EXPECT_EQ(grown->info.db_hw.region, cq->info.db_hw.region);  // the register stays
    EXPECT_EQ(grown->info.db_hw.offset, cq->info.db_hw.offset);
    EXPECT_GE(MappingManager::instance().stats(session_->memory()).allocated_bytes, 4096u * 32);
    EXPECT_EQ(broker_->resizeCq(*session_, cq->cq, 0).status().code(), Code::kInvalidArgument);
    EXPECT_FALSE(broker_->resizeCq(*session_, cq->cq + 1000, 8).isOk());
    auto shrunk = broker_->resizeCq(*session_, cq->cq, 8);
    ASSERT_TRUE(shrunk.isOk()) << shrunk.status().toString();
    EXPECT_EQ(shrunk->cqe, 8u);
    EXPECT_LT(MappingManager::instance().stats(session_->memory()).allocated_bytes, 4096u * 32);
    ASSERT_TRUE(broker_->destroyCq(*session_, cq->cq).isOk());
    EXPECT_EQ(session_->objectCount(), 1u);
}

TEST_F(BrokerTest, QpStateMachineAndExtendCalls) {
    Objs o = makeQp(*session_);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    auto st = broker_->modifyQp(*session_, o.qp, a,
                                IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS);
    ASSERT_TRUE(st.isOk()) << st.status().toString();
    EXPECT_EQ(*st, IBV_QPS_INIT);
    auto q = broker_->queryQp(*session_, o.qp, IBV_QP_STATE);
    ASSERT_TRUE(q.isOk());
    EXPECT_EQ(q->attr.qp_state, IBV_QPS_INIT);
    EXPECT_EQ(q->init.qp_type, IBV_QPT_RC);
    // Extended calls reach the driver or answer UNIMPLEMENTED, never crash.
    auto qe = broker_->queryQpExtend(*session_, o.qp, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT);
    EXPECT_TRUE(qe.isOk() || qe.status().code() == Code::kUnimplemented ||
                qe.status().code() == Code::kInvalidArgument);
    EXPECT_EQ(broker_->queryQpExtend(*session_, o.qp, IBV_QP_ATTR_EXTEND_MAX).status().code(),
              Code::kUnimplemented);
}

// A tenant keeps the fd it sends: memory it could ftruncate under the broker's mapping would
// end the engine's next access with SIGBUS, so only memory sealed against shrinking is taken,
// and the refusal says how to seal it.
TEST_F(BrokerTest, RegMrRefusesAMemfdTheTenantCouldShrink) {
    Objs o = makeQp(*session_);
    RegMrArgs args;
    args.pd = o.pd;
    args.length = 8192;
    args.access = IBV_ACCESS_LOCAL_WRITE;
    UniqueFd plain(memfd_create("unsealable", MFD_CLOEXEC));
    ASSERT_EQ(ftruncate(plain.get(), 8192), 0);
    UniqueFd growable(memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(growable.get(), 8192), 0);
    ASSERT_EQ(fcntl(growable.get(), F_ADD_SEALS, F_SEAL_GROW), 0);  // sealed, but not against shrinking
    uint64_t xfer = 40;
    for (UniqueFd *fd : {&plain, &growable}) {
        ASSERT_TRUE(session_->putXfer(++xfer, std::move(*fd)));
        args.xfer_id = xfer;
        Status st = broker_->regMr(*session_, args).status();
        EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.toString();
        EXPECT_EQ(st.errnoValue(), EACCES);
        EXPECT_NE(st.message().find("F_SEAL_SHRINK"), std::string::npos) << st.message();
    }
    UniqueFd sealed(memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(ftruncate(sealed.get(), 8192), 0);
    ASSERT_EQ(fcntl(sealed.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);
    ASSERT_TRUE(session_->putXfer(++xfer, std::move(sealed)));
    args.xfer_id = xfer;
    auto mr = broker_->regMr(*session_, args);
    EXPECT_TRUE(mr.isOk()) << mr.status().toString();
}

TEST_F(BrokerTest, RegMrTakesAMemfdAndValidatesIt) {
    Objs o = makeQp(*session_);
    int fd = memfd_create("mr", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 65536), 0);
    ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the broker maps only sealed memory
    ASSERT_TRUE(session_->putXfer(7, UniqueFd(fd)));
    RegMrArgs args;
    args.pd = o.pd;
    args.xfer_id = 7;
    args.offset = 4096;
    args.length = 8192;
    args.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    args.iova = 0x7f0000001000;
    auto mr = broker_->regMr(*session_, args);
    ASSERT_TRUE(mr.isOk()) << mr.status().toString();
    EXPECT_NE(mr->mr, 0u);
    EXPECT_EQ(mr->iova, args.iova);
    // The fd was taken once.
    EXPECT_EQ(broker_->regMr(*session_, args).status().errnoValue(), EBADF);
    // Too long for the fd.
    int fd2 = memfd_create("mr2", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_EQ(ftruncate(fd2, 4096), 0);
    ASSERT_EQ(fcntl(fd2, F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the broker maps only sealed memory
    ASSERT_TRUE(session_->putXfer(8, UniqueFd(fd2)));
    args.xfer_id = 8;
    EXPECT_EQ(broker_->regMr(*session_, args).status().code(), Code::kInvalidArgument);
    // Not a memfd.
    ASSERT_TRUE(session_->putXfer(9, UniqueFd(dup(STDERR_FILENO))));
    args.xfer_id = 9;
    args.offset = 0;
    args.length = 1;
    EXPECT_EQ(broker_->regMr(*session_, args).status().errnoValue(), EBADF);
    EXPECT_EQ(broker_->deallocPd(*session_, o.pd).code(), Code::kFailedPrecondition);  // the MR uses it
    EXPECT_TRUE(broker_->deregMr(*session_, mr->mr).isOk());
}

// ReregMr (softnda SPEC.md §13): the keys stay, as on a kernel provider; CHANGE_PD moves the MR's parent
// (the old PD can go, the new one cannot); CHANGE_TRANSLATION takes new memory as RegMr does and
// charges a larger range; a refusal changes nothing (the extra charge goes back).
TEST_F(BrokerTest, ReregMrChangesAccessPdAndMemoryOrNothing) {
    Objs o = makeQp(*session_);
    auto memfd = [](size_t size) {
        UniqueFd fd(memfd_create("mr", MFD_CLOEXEC | MFD_ALLOW_SEALING));
        EXPECT_EQ(ftruncate(fd.get(), static_cast<off_t>(size)), 0);
        EXPECT_EQ(fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK), 0);  // the broker maps only sealed memory
        return fd;
    };
    auto mrBytes = [this] {
        return broker_->quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(Quota::kMrBytes)];
    };
    const uint64_t bytes_before = mrBytes();
    ASSERT_TRUE(session_->putXfer(10, memfd(65536)));
    RegMrArgs args;
    args.pd = o.pd;
    args.xfer_id = 10;
    args.length = 8192;
    args.access = IBV_ACCESS_LOCAL_WRITE;
    args.iova = 0x7f0000001000;
    auto mr = broker_->regMr(*session_, args);
    ASSERT_TRUE(mr.isOk()) << mr.status().toString();
    EXPECT_EQ(mrBytes(), bytes_before + 8192);

    ReregMrArgs ra;
    ra.mr = mr->mr;
    ra.flags = IBV_REREG_MR_CHANGE_ACCESS;
    ra.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    auto access = broker_->reregMr(*session_, ra);
    ASSERT_TRUE(access.isOk()) << access.status().toString();
    EXPECT_EQ(access->lkey, mr->lkey);
    EXPECT_EQ(access->rkey, mr->rkey);
    EXPECT_EQ(access->iova, 0u);  // the memory did not change

    // Refused, nothing changed: no flag, an unknown flag, a PD without its flag, bad access.
    ra.flags = 0;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    ra.flags = 8;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    ra.flags = IBV_REREG_MR_CHANGE_ACCESS;
    ra.access = IBV_ACCESS_REMOTE_WRITE;  // remote write needs local write (SPEC.md §13)
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    ra.pd = o.pd;
    ra.access = IBV_ACCESS_LOCAL_WRITE;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    // Another session's MR is not found.
    ra.pd = 0;
    auto other = newSession();
    EXPECT_EQ(broker_->reregMr(*other, ra).status().code(), Code::kNotFound);

    // CHANGE_PD: a PD of another context is refused; one of the MR's context becomes its parent.
    auto pd2 = broker_->allocPd(*session_, o.ctx);
    auto ctx2 = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(pd2.isOk() && ctx2.isOk());
    auto pd3 = broker_->allocPd(*session_, ctx2->context);
    ASSERT_TRUE(pd3.isOk());
    ra.flags = IBV_REREG_MR_CHANGE_PD;
    ra.pd = *pd3;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    ra.pd = *pd2;
    auto moved = broker_->reregMr(*session_, ra);
    ASSERT_TRUE(moved.isOk()) << moved.status().toString();
    EXPECT_EQ(moved->rkey, access->rkey);
    EXPECT_EQ(broker_->deallocPd(*session_, *pd2).errnoValue(), EBUSY);  // the MR uses it now

    // CHANGE_TRANSLATION: new memory, larger, charged; a refusal gives the extra charge back.
    ra.flags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_ACCESS;
    ra.pd = 0;
    ra.access = IBV_ACCESS_REMOTE_WRITE;
    ra.memory.xfer_id = 11;
    ra.memory.length = 16384;
    ra.memory.iova = 0x7f0000100000;
    ASSERT_TRUE(session_->putXfer(11, memfd(16384)));
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);
    EXPECT_EQ(mrBytes(), bytes_before + 8192);
    ra.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EBADF);  // fd 11 was taken
    ASSERT_TRUE(session_->putXfer(12, memfd(16384)));
    ra.memory.xfer_id = 12;
    auto translated = broker_->reregMr(*session_, ra);
    ASSERT_TRUE(translated.isOk()) << translated.status().toString();
    EXPECT_EQ(translated->iova, ra.memory.iova);
    EXPECT_EQ(translated->rkey, moved->rkey);
    EXPECT_EQ(mrBytes(), bytes_before + 16384);
    // New memory without the flag is refused.
    ra.flags = IBV_REREG_MR_CHANGE_ACCESS;
    EXPECT_EQ(broker_->reregMr(*session_, ra).status().errnoValue(), EINVAL);

    EXPECT_TRUE(broker_->deregMr(*session_, mr->mr).isOk());
    EXPECT_EQ(mrBytes(), bytes_before);
    EXPECT_TRUE(broker_->deallocPd(*session_, *pd2).isOk());
}

// ---- event fds (CreateCq's event_xfer_id, SetAsyncEventFd) ----

UniqueFd newEventFd() {
    return UniqueFd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
}

TEST_F(BrokerTest, CreateCqTakesAnEventFdAndChecksIt) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 8;
    ca.event_xfer_id = 30;
    ASSERT_TRUE(session_->putXfer(30, newEventFd()));
    auto cq = broker_->createCq(*session_, ca);
    ASSERT_TRUE(cq.isOk()) << cq.status().toString();
    EXPECT_EQ(session_->objectCount(), 2u);
    // Taken once: the same id again has nothing waiting.
    auto again = broker_->createCq(*session_, ca);
    EXPECT_EQ(again.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(again.status().errnoValue(), EBADF);
    // Not an eventfd: refused before the driver sees it.
    ca.event_xfer_id = 31;
    ASSERT_TRUE(session_->putXfer(31, UniqueFd(memfd_create("not-an-eventfd", MFD_CLOEXEC))));
    auto bad = broker_->createCq(*session_, ca);
    EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(bad.status().errnoValue(), EINVAL);
    EXPECT_NE(bad.status().message().find("not an eventfd"), std::string::npos);
    EXPECT_EQ(session_->objectCount(), 2u);
    // Another session's context.
    auto other = newSession();
    ca.event_xfer_id = 32;
    ASSERT_TRUE(other->putXfer(32, newEventFd()));
    EXPECT_EQ(broker_->createCq(*other, ca).status().code(), Code::kNotFound);
    EXPECT_EQ(other->objectCount(), 0u);
}

TEST_F(BrokerTest, CreateCqRollsTheCqBackWhenTheDeviceCannotDeliverEvents) {
    // softnda as a V2 provider: no event fd entries, so set_cq_event_fd answers EOPNOTSUPP after
    // the CQ was made.
    Device *dev = devices_->find("softnda0");
    ASSERT_NE(dev, nullptr);
    static ibv_extend_vdev_ops v2 = softnda_vdev_ops;
    v2.abi = IBV_EXTEND_VDEV_ABI_V2;
    loader::DeviceVerbs saved = dev->verbs;
    dev->verbs = loader::DeviceVerbs::forVirtual(&v2, "softnda0");
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    audit_.clear();
    CreateCqArgs ca;
    ca.context = ctx->context;
    ca.cqe = 8;
    ca.event_xfer_id = 33;
    ASSERT_TRUE(session_->putXfer(33, newEventFd()));
    auto cq = broker_->createCq(*session_, ca);
    EXPECT_FALSE(cq.isOk());
    EXPECT_EQ(cq.status().errnoValue(), EOPNOTSUPP) << cq.status().toString();
    EXPECT_EQ(session_->objectCount(), 1u);
    EXPECT_TRUE(audit_.empty()) << "never published";
    EXPECT_EQ(MappingManager::instance().stats(session_->memory()).allocated_bytes, 0u)
        << "the driver's CQ and its rings are gone";
    ca.event_xfer_id = 0;
    EXPECT_TRUE(broker_->createCq(*session_, ca).isOk()) << "without an event fd it works";
    broker_->endSession(session_);
    dev->verbs = saved;
}

TEST_F(BrokerTest, SetAsyncEventFdChecksItsArguments) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    ASSERT_TRUE(session_->putXfer(40, newEventFd()));
    EXPECT_TRUE(broker_->setAsyncEventFd(*session_, ctx->context, 40).isOk());
    ASSERT_TRUE(session_->putXfer(41, newEventFd()));
    EXPECT_TRUE(broker_->setAsyncEventFd(*session_, ctx->context, 41).isOk()) << "replaces the first";
    EXPECT_EQ(broker_->setAsyncEventFd(*session_, ctx->context, 0).code(), Code::kInvalidArgument);
    EXPECT_EQ(broker_->setAsyncEventFd(*session_, ctx->context, 42).errnoValue(), EBADF) << "never sent";
    int p[2];
    ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
    close(p[0]);
    ASSERT_TRUE(session_->putXfer(43, UniqueFd(p[1])));
    EXPECT_EQ(broker_->setAsyncEventFd(*session_, ctx->context, 43).errnoValue(), EINVAL);
    auto other = newSession();
    ASSERT_TRUE(other->putXfer(44, newEventFd()));
    EXPECT_EQ(broker_->setAsyncEventFd(*other, ctx->context, 44).code(), Code::kNotFound);
}

TEST_F(BrokerTest, EndSessionDestroysEverythingInDependencyOrder) {
    Objs o = makeQp(*session_);
    CreateSrqArgs sa;
    sa.context = o.ctx;
    sa.pd = o.pd;
    sa.max_wr = 16;
    sa.max_sge = 1;
    auto srq = broker_->createSrq(*session_, sa);
    ASSERT_TRUE(srq.isOk()) << srq.status().toString();
    audit_.clear();
    broker_->endSession(session_);
    std::vector<std::string> expected = {"destroy qp", "destroy srq", "destroy cq", "destroy pd",
                                         "destroy context"};
    EXPECT_EQ(audit_, expected);
    EXPECT_EQ(broker_->sessionCount(), 0u);
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u);
    // Calls on an ended session answer UNAVAILABLE.
    EXPECT_EQ(broker_->allocPd(*session_, o.ctx).status().code(), Code::kUnavailable);
}

TEST_F(BrokerTest, ConcurrentSessionsStayApart) {
    std::vector<std::thread> threads;
    std::atomic<int> failures{0};
    std::vector<std::shared_ptr<Session>> sessions;
    for (int i = 0; i < 4; ++i) {
        sessions.push_back(newSession());
    }
    for (auto &s : sessions) {
        threads.emplace_back([&, s] {
            for (int i = 0; i < 20; ++i) {
                Objs o = makeQp(*s);
                if (!broker_->destroyQp(*s, o.qp).isOk() || !broker_->destroyCq(*s, o.cq).isOk() ||
                    !broker_->deallocPd(*s, o.pd).isOk() || !broker_->closeContext(*s, o.ctx).isOk()) {
                    ++failures;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(broker_->objectCount(), 0u);
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u);
}

// softnda declares its calls safe across contexts (its vdev ops, ABI V5), so the broker does not
// serialise its tenants on one device lock: every control call of four sessions on softnda0 runs
// in parallel here, and the tsan build checks that nothing races (the driver's own locks, the
// mapping manager, the thread-local binding of each call to its session).
TEST_F(BrokerTest, SoftndaCallsOfDifferentSessionsRunUnserialised) {
    ASSERT_NE(devices_->find("softnda0"), nullptr);
    EXPECT_TRUE(threadSafeAcrossContexts(&softnda_driver_ops));
    EXPECT_FALSE(devices_->find("softnda0")->serialize_calls);
    static const verbs_device_extend_ops undeclared = {"ibvxtest", nullptr, nullptr};
    verbs_register_driver_extend(&undeclared);
    EXPECT_FALSE(threadSafeAcrossContexts(&undeclared)) << "a driver that declares nothing is serialised";
    std::vector<std::shared_ptr<Session>> sessions;
    for (int i = 0; i < 4; ++i) {
        sessions.push_back(newSession());
    }
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (auto &s : sessions) {
        threads.emplace_back([&, s] {
            for (int i = 0; i < 10; ++i) {
                Objs o = makeQp(*s);
                CreateSrqArgs sa;
                sa.context = o.ctx;
                sa.pd = o.pd;
                sa.max_wr = 8;
                sa.max_sge = 1;
                auto srq = broker_->createSrq(*s, sa);
                ibv_qp_attr a{};
                a.qp_state = IBV_QPS_INIT;
                a.port_num = 1;
                a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
                auto st = broker_->modifyQp(
                    *s, o.qp, a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS);
                auto q = broker_->queryQp(*s, o.qp, IBV_QP_STATE);
                if (!srq.isOk() || !st.isOk() || !q.isOk() || q->attr.qp_state != IBV_QPS_INIT ||
                    !broker_->destroySrq(*s, srq->srq).isOk() || !broker_->destroyQp(*s, o.qp).isOk() ||
                    !broker_->destroyCq(*s, o.cq).isOk() || !broker_->deallocPd(*s, o.pd).isOk() ||
                    !broker_->closeContext(*s, o.ctx).isOk()) {
                    ++failures;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(broker_->objectCount(), 0u);
    EXPECT_EQ(MappingManager::instance().totals().arena_chunks, 0u);
}

// A driver of rdma-core devices declares what it guarantees next to its reference registration
// (PROVIDER_EXTEND_GUARANTEES): mlx5's contexts run in parallel as softnda's do.
TEST_F(BrokerTest, Mlx5DeclaresItsCallsSafeAcrossContexts) {
    const char *dir = getenv("IBV_EXTEND_PROVIDER_DIR");
    const std::string lib = std::string(dir != nullptr ? dir : ".") + "/libibvx_mlx5.so";
    if (::access(lib.c_str(), F_OK) != 0) {
        GTEST_SKIP() << lib << " is not built here (no mlx5dv)";
    }
    loader::LoadRecord loaded = loader::loadDriver(lib, "broker_test");
    ASSERT_TRUE(loaded.loaded) << loaded.error;
    EXPECT_TRUE(threadSafeAcrossContexts(loader::findDriverByName("mlx5")));
}

// The guarantees of a vdev provider are read only from an ABI V5 table: a V4 provider's struct
// ends before them, so its driver stays serialised whatever lies past its end.
TEST_F(BrokerTest, OnlyAV5VdevProviderDeclaresGuarantees) {
    static const verbs_device_extend_ops driver = {"ibvxtest_v4", nullptr, nullptr};
    static ibv_extend_vdev_ops v4 = softnda_vdev_ops;
    v4.abi = IBV_EXTEND_VDEV_ABI_V4;
    v4.provider = driver.name;
    ASSERT_NE(v4.guarantees & IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS, 0u);
    verbs_register_vdev_extend(&v4);
    EXPECT_FALSE(threadSafeAcrossContexts(&driver));
    EXPECT_FALSE(threadSafeAcrossContexts(nullptr));
}

// A commit costs what a call changed: a new child touches its parents, and a parent whose
// export did not change keeps its state and fds (the new duplicates are closed), so the commit
// does not log it again.
TEST_F(BrokerTest, AParentIsLoggedAgainOnlyWhenItsExportChanged) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    ObjectImport first = exportedForRestore(*broker_, *session_, ctx->context);
    ASSERT_TRUE(broker_->allocPd(*session_, ctx->context).isOk());
    auto held = session_->hold();
    SessionChanges changes = session_->takeChanges();
    ASSERT_EQ(changes.parents, std::vector<uint64_t>{ctx->context}) << "the PD's context is its parent";
    const Object *c = session_->object(ctx->context);
    ASSERT_NE(c, nullptr);
    std::vector<int> fds_before;
    for (const UniqueFd &fd : c->driver_fds) {
        fds_before.push_back(fd.get());
    }
    bool changed = true;
    ASSERT_TRUE(broker_->exportObject(*session_, ctx->context, true, &changed).isOk());
    EXPECT_FALSE(changed) << "a PD does not change softnda's context state";
    EXPECT_EQ(c->driver_state, first.driver_state);
    std::vector<int> fds_after;
    for (const UniqueFd &fd : c->driver_fds) {
        fds_after.push_back(fd.get());
    }
    EXPECT_EQ(fds_after, fds_before) << "the exported fds are kept";
}

// The restore's side of the core: an exported context and PD made again in another session,
// under their handles, through the driver (import_object) and without a create event.
TEST_F(BrokerTest, AdoptMakesExportedObjectsAgainUnderTheirHandles) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto pd = broker_->allocPd(*session_, ctx->context);
    ASSERT_TRUE(pd.isOk());
    ObjectImport ctx_in = exportedForRestore(*broker_, *session_, ctx->context);
    ObjectImport pd_in = exportedForRestore(*broker_, *session_, *pd);
    EXPECT_FALSE(ctx_in.driver_state.empty());
    EXPECT_FALSE(pd_in.driver_state.empty());
    {
        auto held = session_->hold();
        EXPECT_TRUE(broker_->exportObject(*session_, *pd).isOk()) << "unchanged since: nothing to do";
        EXPECT_EQ(session_->object(*pd)->driver_state, pd_in.driver_state);
    }
    audit_.clear();
    auto restored = newSession();
    Relocations relocations;
    Device *dev = devices_->find("softnda0");
    ASSERT_EQ(dev->verbs.setPaused(true), 0) << "a restore imports with the engine paused";
    Status st = broker_->adopt(*restored, std::move(ctx_in), relocations);
    EXPECT_TRUE(st.isOk()) << st.toString();
    st = broker_->adopt(*restored, std::move(pd_in), relocations);
    EXPECT_TRUE(st.isOk()) << st.toString();
    ASSERT_EQ(dev->verbs.setPaused(false), 0);
    EXPECT_TRUE(audit_.empty()) << "an adopted object is no new object";
    ASSERT_EQ(restored->objectCount(), 2u);
    {
        auto held = restored->hold();
        const Object *c = restored->object(ctx->context);
        const Object *p = restored->object(*pd);
        ASSERT_NE(c, nullptr);
        ASSERT_NE(p, nullptr);
        EXPECT_EQ(c->users, 1u) << "the PD uses it";
        ASSERT_EQ(p->uses.size(), 1u);
        EXPECT_EQ(*p->uses.begin(), c);
        SessionChanges changes = restored->takeChanges();
        EXPECT_EQ(changes.touched.size(), 2u) << "the next commit exports both";
        EXPECT_EQ(changes.parents, std::vector<uint64_t>{ctx->context})
            << "the PD's parent, logged if changed";
    }
    EXPECT_TRUE(broker_->queryDevice(*restored, ctx->context).isOk()) << "its extension context is open";
    EXPECT_EQ(broker_->closeContext(*restored, ctx->context).status().errnoValue(), EBUSY);
    broker_->endSession(restored);
    EXPECT_EQ(restored->objectCount(), 0u);
    EXPECT_EQ(session_->objectCount(), 2u) << "the original session keeps its own";
}

TEST_F(BrokerTest, AdoptRefusesWhatDoesNotFitTheSession) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto restored = newSession();
    Relocations relocations;
    auto refusal = [&](ObjectImport in) {
        Status st = broker_->adopt(*restored, std::move(in), relocations);
        EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.toString();
        return st.message();
    };
    ObjectImport orphan;
    orphan.handle = 7;
    orphan.kind = ObjectKind::kPd;
    orphan.uses = {ctx->context};  // the other session's context
    EXPECT_NE(refusal(std::move(orphan)).find("uses an unknown handle"), std::string::npos);
    ObjectImport no_parent;
    no_parent.handle = 8;
    no_parent.kind = ObjectKind::kPd;
    EXPECT_NE(refusal(std::move(no_parent)).find("no device or parent"), std::string::npos);
    ObjectImport no_state;
    no_state.handle = 9;
    no_state.device = "softnda0";
    EXPECT_NE(refusal(std::move(no_state)).find("no usable driver state"), std::string::npos);
    ObjectImport unnamed;
    unnamed.device = "softnda0";
    unnamed.driver_state = "x";
    EXPECT_NE(refusal(std::move(unnamed)).find("malformed"), std::string::npos) << "handle 0";
    ObjectImport unknown_kind;
    unknown_kind.handle = 10;
    unknown_kind.kind = static_cast<ObjectKind>(99);
    EXPECT_NE(refusal(std::move(unknown_kind)).find("malformed"), std::string::npos);
    EXPECT_EQ(restored->objectCount(), 0u);
}

// ---- address handles (kept by the broker, no driver object) ----

ibv_ah_attr lidAh(uint16_t dlid) {
    ibv_ah_attr a{};
    a.port_num = 1;
    a.dlid = dlid;
    return a;
}

uint64_t ahsHeld(Broker &broker) {
    return broker.quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(Quota::kAhs)];
}

TEST_F(BrokerTest, AnAddressHandleBelongsToItsSessionAndItsTenantsQuota) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto pd = broker_->allocPd(*session_, ctx->context);
    ASSERT_TRUE(pd.isOk());
    auto ah = broker_->createAh(*session_, *pd, lidAh(7));
    ASSERT_TRUE(ah.isOk()) << ah.status().toString();
    EXPECT_EQ(ahsHeld(*broker_), 1u);
    {
        auto held = session_->hold();
        const Object *o = session_->object(*ah);
        ASSERT_NE(o, nullptr);
        ObjectSnapshot snap;
        o->snapshot(snap);
        EXPECT_EQ(snap.device, "softnda0");
        EXPECT_EQ(snap.ah.dlid, 7);
    }
    EXPECT_EQ(broker_->deallocPd(*session_, *pd).errnoValue(), EBUSY) << "parents first";
    auto other = newSession();
    EXPECT_EQ(broker_->destroyAh(*other, *ah).code(), Code::kNotFound) << "another session's AH";
    EXPECT_EQ(broker_->destroyAh(*session_, *pd).code(), Code::kNotFound) << "a PD is no AH";
    EXPECT_TRUE(broker_->destroyAh(*session_, *ah).isOk());
    EXPECT_EQ(ahsHeld(*broker_), 0u) << "released with the AH";
    EXPECT_EQ(broker_->destroyAh(*session_, *ah).code(), Code::kNotFound);

    // The session's end reclaims an AH left behind, before its PD.
    ASSERT_TRUE(broker_->createAh(*session_, *pd, lidAh(8)).isOk());
    EXPECT_EQ(ahsHeld(*broker_), 1u);
    audit_.clear();
    broker_->endSession(session_);
    std::vector<std::string> expected = {"destroy ah", "destroy pd", "destroy context"};
    EXPECT_EQ(audit_, expected);
    EXPECT_EQ(ahsHeld(*broker_), 0u);
}

TEST_F(BrokerTest, AnAddressHandleWithBadAttributesIsRefusedAndLeavesNothing) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto pd = broker_->allocPd(*session_, ctx->context);
    ASSERT_TRUE(pd.isOk());
    auto port = broker_->queryPort(*session_, ctx->context, 1);
    ASSERT_TRUE(port.isOk());
    ASSERT_EQ(port->gids.size(), 1u) << "softnda: a one-entry GID table";
    const uint32_t ports = devices_->find("softnda0")->info.phys_port_cnt;
    ibv_ah_attr grh = lidAh(0);
    grh.is_global = 1;
    grh.grh.dgid = port->gids[0].gid;
    grh.grh.sgid_index = 0;
    grh.grh.hop_limit = 1;

    auto refused = [&](ibv_ah_attr a, const char *why) {
        auto r = broker_->createAh(*session_, *pd, a);
        EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << why;
        EXPECT_EQ(r.status().errnoValue(), EINVAL) << why;
        EXPECT_NE(r.status().message().find("ah_attr"), std::string::npos) << r.status().toString();
    };
    ibv_ah_attr a = lidAh(1);
    a.port_num = 0;
    refused(a, "port 0");
    a.port_num = static_cast<uint8_t>(ports + 1);
    refused(a, "a port past the device's");
    refused(lidAh(0), "no GRH and no LID");
    a = lidAh(1);
    a.sl = 16;
    refused(a, "sl past 15");
    a = grh;
    a.grh.dgid = {};
    refused(a, "a zero dgid");
    a = grh;
    a.grh.sgid_index = 1;
    refused(a, "an sgid_index past the GID table");
    EXPECT_EQ(broker_->createAh(*session_, 0, lidAh(1)).status().code(), Code::kNotFound);
    EXPECT_EQ(session_->objectCount(), 2u) << "nothing made";
    EXPECT_EQ(ahsHeld(*broker_), 0u) << "nothing charged";

    auto good = broker_->createAh(*session_, *pd, grh);
    ASSERT_TRUE(good.isOk()) << good.status().toString();
    // A flow label past 20 bits is taken, as the kernel takes it (UCX on RoCE passes ~0).
    a = grh;
    a.grh.flow_label = 0xffffffffu;
    auto wide = broker_->createAh(*session_, *pd, a);
    ASSERT_TRUE(wide.isOk()) << wide.status().toString();
    ASSERT_TRUE(broker_->destroyAh(*session_, *wide).isOk());
    broker_->quotas().setDefault(Quota::kAhs, 1);
    auto over = broker_->createAh(*session_, *pd, lidAh(1));
    EXPECT_EQ(over.status().code(), Code::kResourceExhausted);
    EXPECT_NE(over.status().message().find("'ahs'"), std::string::npos) << over.status().toString();
    EXPECT_EQ(session_->objectCount(), 3u);
    EXPECT_EQ(ahsHeld(*broker_), 1u);
}

// On a RoCE port (softnda bound to an interface: lo here, which every namespace has) an AH must
// have a GRH, as the kernel and mlx5 require: a LID-only one is refused with EINVAL, a GRH one made.
TEST_F(BrokerTest, ARoceAddressHandleNeedsAGrh) {
    ASSERT_EQ(softnda_vdev_ops.configure("netdev", "lo"), 0);
    struct Loopback {
        ~Loopback() { softnda_vdev_ops.configure("netdev", ""); }
    } back;
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
    auto pd = broker_->allocPd(*session_, ctx->context);
    ASSERT_TRUE(pd.isOk());
    auto port = broker_->queryPort(*session_, ctx->context, 1);
    ASSERT_TRUE(port.isOk());
    ASSERT_EQ(port->attr.link_layer, IBV_LINK_LAYER_ETHERNET);
    ASSERT_FALSE(port->gids.empty());
    auto lid = broker_->createAh(*session_, *pd, lidAh(1));
    EXPECT_EQ(lid.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(lid.status().errnoValue(), EINVAL);
    EXPECT_NE(lid.status().message().find("Ethernet"), std::string::npos) << lid.status().toString();
    EXPECT_EQ(ahsHeld(*broker_), 0u) << "nothing charged";
    ibv_ah_attr grh = lidAh(0);
    grh.is_global = 1;
    grh.grh.dgid = port->gids[0].gid;
    grh.grh.sgid_index = 0;
    grh.grh.hop_limit = 64;
    auto good = broker_->createAh(*session_, *pd, grh);
    ASSERT_TRUE(good.isOk()) << good.status().toString();
    EXPECT_TRUE(broker_->destroyAh(*session_, *good).isOk());
}

// An AH has no driver state: its export leaves none, and a restore makes it again from the
// attributes its record carries, under the same handle and charge.
TEST_F(BrokerTest, AdoptMakesAnAddressHandleAgainFromItsAttributes) {
    auto ctx = broker_->openContext(*session_, "softnda0");
    ASSERT_TRUE(ctx.isOk());
    auto pd = broker_->allocPd(*session_, ctx->context);
    ASSERT_TRUE(pd.isOk());
    ibv_ah_attr attr = lidAh(9);
    attr.sl = 3;
    auto ah = broker_->createAh(*session_, *pd, attr);
    ASSERT_TRUE(ah.isOk());
    ObjectImport ctx_in = exportedForRestore(*broker_, *session_, ctx->context);
    ObjectImport pd_in = exportedForRestore(*broker_, *session_, *pd);
    ObjectImport ah_in = exportedForRestore(*broker_, *session_, *ah);
    EXPECT_TRUE(ah_in.driver_state.empty());
    ah_in.ah = attr;  // what its record carries (daemon/restart)
    ah_in.quota[static_cast<size_t>(Quota::kAhs)] = 1;
    auto restored = newSession();
    Relocations relocations;
    Device *dev = devices_->find("softnda0");
    ASSERT_EQ(dev->verbs.setPaused(true), 0);
    for (ObjectImport *in : {&ctx_in, &pd_in, &ah_in}) {
        Status st = broker_->adopt(*restored, std::move(*in), relocations);
        EXPECT_TRUE(st.isOk()) << st.toString();
    }
    ASSERT_EQ(dev->verbs.setPaused(false), 0);
    EXPECT_EQ(ahsHeld(*broker_), 2u) << "the original's and the restored one's";
    {
        auto held = restored->hold();
        const auto *a = dynamic_cast<const AhObject *>(restored->object(*ah));
        ASSERT_NE(a, nullptr);
        EXPECT_EQ(a->attr.dlid, 9);
        EXPECT_EQ(a->attr.sl, 3);
        EXPECT_EQ(a->attr.port_num, 1);
    }
    EXPECT_EQ(broker_->deallocPd(*restored, *pd).errnoValue(), EBUSY);
    EXPECT_TRUE(broker_->destroyAh(*restored, *ah).isOk());
    EXPECT_TRUE(broker_->deallocPd(*restored, *pd).isOk());
    broker_->endSession(restored);
    EXPECT_EQ(ahsHeld(*broker_), 1u);
}

}  // namespace
}  // namespace ibvx::daemon
