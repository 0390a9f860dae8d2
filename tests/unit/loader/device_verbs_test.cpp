// The per-device verbs table (providers/loader/device_verbs.h): defaults for what a provider
// lacks, one error convention for the vdev and libibverbs flavours, the QP state patch, and the
// direct-mode lookup by ibv_device.
#include "providers/loader/device_verbs.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace ibvx::loader {
namespace {

// What the fake providers below saw.
struct Seen {
    int opens = 0;
    std::string opened_name;
    int allocs = 0;
    int modifies = 0;
    ibv_qp_state state_at_modify = IBV_QPS_RESET;
    int rc = 0;   // what int entries answer
    int err = 0;  // errno the entries leave
};
Seen seen;

ibv_context fake_context{};
ibv_pd fake_pd{};

ibv_context *fakeOpenByName(const char *name) {
    seen.opens++;
    seen.opened_name = name;
    return &fake_context;
}
ibv_pd *fakeAllocPd(ibv_context *) {
    seen.allocs++;
    return &fake_pd;
}
int fakeDeallocPd(ibv_pd *) {
    errno = seen.err;
    return seen.rc;
}
int fakeModifyQp(ibv_qp *qp, ibv_qp_attr *, int) {
    seen.modifies++;
    seen.state_at_modify = qp->state;
    errno = seen.err;
    return seen.rc;
}

// A provider with some entries left NULL.
ibv_extend_vdev_ops partialProvider() {
    ibv_extend_vdev_ops v{};
    v.abi = IBV_EXTEND_VDEV_ABI_V1;
    v.provider = "fakevdev";
    v.open_device = fakeOpenByName;
    v.alloc_pd = fakeAllocPd;
    v.dealloc_pd = fakeDeallocPd;
    v.modify_qp = fakeModifyQp;
    return v;
}

// The same entries in libibverbs' convention (tests reach it through fromOps).
DeviceVerbs libibverbsFlavour() {
    DeviceVerbs::Ops ops{};
    ops.dealloc_pd = fakeDeallocPd;
    ops.modify_qp = fakeModifyQp;
    return DeviceVerbs::fromOps(ops, DeviceVerbs::Convention::kLibibverbs, nullptr, nullptr, "fakeverbs0");
}

int counter_calls = 0;
int fakeQueryCounters(const char *device, void (*emit)(void *, const char *, uint64_t), void *arg) {
    counter_calls++;
    emit(arg, device, 7);
    return 0;
}

class DeviceVerbsTest : public ::testing::Test {
  protected:
    void SetUp() override { seen = Seen{}; }
    const ibv_extend_vdev_ops provider_ = partialProvider();
};

TEST_F(DeviceVerbsTest, MissingEntriesAnswerEopnotsupp) {
    DeviceVerbs v = DeviceVerbs::forVirtual(&provider_, "fake0");
    EXPECT_TRUE(v.isVirtual());
    ibv_mr mr{};
    ibv_qp qp{};
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(v.deregMr(&mr), -EOPNOTSUPP);
    EXPECT_EQ(v.queryQp(&qp, &attr, 0, &init), -EOPNOTSUPP);
    errno = 0;
    EXPECT_EQ(v.regMr(&fake_pd, nullptr, 1, 0, 0), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(v.closeDevice(&fake_context), 0) << "no close_device: nothing to release";
}

TEST_F(DeviceVerbsTest, PresentEntriesReachTheProvider) {
    DeviceVerbs v = DeviceVerbs::forVirtual(&provider_, "fake0");
    EXPECT_EQ(v.openDevice(), &fake_context);
    EXPECT_EQ(seen.opened_name, "fake0") << "open_device is bound to the device's name";
    EXPECT_EQ(v.allocPd(&fake_context), &fake_pd);
    EXPECT_EQ(seen.allocs, 1);
}

TEST_F(DeviceVerbsTest, AnEmptyTableRefusesEverything) {
    DeviceVerbs v;
    EXPECT_FALSE(v.isVirtual());
    errno = 0;
    EXPECT_EQ(v.openDevice(), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    errno = 0;
    EXPECT_EQ(v.allocPd(&fake_context), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(v.deallocPd(&fake_pd), -EOPNOTSUPP);
    ibv_qp qp{};
    ibv_qp_attr attr{};
    EXPECT_EQ(v.modifyQp(&qp, &attr, IBV_QP_STATE), -EOPNOTSUPP);
}

TEST_F(DeviceVerbsTest, BothFlavoursReportErrorsAlike) {
    DeviceVerbs vdev = DeviceVerbs::forVirtual(&provider_, "fake0");
    DeviceVerbs verbs = libibverbsFlavour();
    seen.rc = -EBUSY;  // ibv_extend.h convention
    EXPECT_EQ(vdev.deallocPd(&fake_pd), -EBUSY);
    seen.rc = EBUSY;  // libibverbs: a positive errno
    EXPECT_EQ(verbs.deallocPd(&fake_pd), -EBUSY);
    seen.rc = -1;  // libibverbs' old paths: -1 and errno
    seen.err = EBUSY;
    EXPECT_EQ(verbs.deallocPd(&fake_pd), -EBUSY);
    seen.err = 0;
    EXPECT_EQ(verbs.deallocPd(&fake_pd), -EIO) << "-1 without errno still reads as a failure";
    seen.rc = 0;
    EXPECT_EQ(vdev.deallocPd(&fake_pd), 0);
    EXPECT_EQ(verbs.deallocPd(&fake_pd), 0);
}

TEST_F(DeviceVerbsTest, VerbsRcTranslation) {
    EXPECT_EQ(verbsRc(0), 0);
    EXPECT_EQ(verbsRc(EINVAL), -EINVAL);
    errno = ENOMEM;
    EXPECT_EQ(verbsRc(-1), -ENOMEM);
    errno = 0;
    EXPECT_EQ(verbsRc(-1), -EIO);
}

TEST_F(DeviceVerbsTest, ModifyQpPatchesTheStateOnceAfterSuccess) {
    for (DeviceVerbs v : {DeviceVerbs::forVirtual(&provider_, "fake0"), libibverbsFlavour()}) {
        seen = Seen{};
        ibv_qp qp{};
        qp.state = IBV_QPS_RESET;
        ibv_qp_attr attr{};
        attr.qp_state = IBV_QPS_INIT;
        ASSERT_EQ(v.modifyQp(&qp, &attr, IBV_QP_STATE), 0);
        EXPECT_EQ(seen.modifies, 1);
        EXPECT_EQ(seen.state_at_modify, IBV_QPS_RESET) << "the patch follows the provider's call";
        EXPECT_EQ(qp.state, IBV_QPS_INIT);

        attr.qp_state = IBV_QPS_RTR;
        EXPECT_EQ(v.modifyQp(&qp, &attr, IBV_QP_PKEY_INDEX), 0);
        EXPECT_EQ(qp.state, IBV_QPS_INIT) << "no IBV_QP_STATE in the mask: the state stays";

        seen.rc = -EINVAL;
        seen.err = EINVAL;
        EXPECT_EQ(v.modifyQp(&qp, &attr, IBV_QP_STATE), -EINVAL);
        EXPECT_EQ(qp.state, IBV_QPS_INIT) << "a refused transition leaves the state";
    }
}

// A provider owning exactly one device, for the lookup by ibv_device.
ibv_device owned_device{};
ibv_device other_device{};
int isOwn(const ibv_device *dev) {
    return dev == &owned_device;
}

TEST_F(DeviceVerbsTest, DirectLookupDecidesOncePerDevice) {
    static ibv_extend_vdev_ops owner = [] {
        ibv_extend_vdev_ops v = partialProvider();
        v.provider = "fakeowner";
        v.is_own_device = isOwn;
        return v;
    }();
    verbs_register_vdev_extend(&owner);
    snprintf(owned_device.name, sizeof(owned_device.name), "owned0");
    const DeviceVerbs &a = deviceVerbsFor(&owned_device);
    EXPECT_TRUE(a.isVirtual());
    EXPECT_EQ(a.provider(), &owner);
    EXPECT_EQ(&deviceVerbsFor(&owned_device), &a) << "cached";
    const DeviceVerbs &b = deviceVerbsFor(&other_device);
    EXPECT_FALSE(b.isVirtual()) << "no provider owns it: libibverbs";
    EXPECT_EQ(b.verbsDevice(), &other_device);
}

}  // namespace
}  // namespace ibvx::loader

namespace ibvx::loader {
namespace {

// query_counters lies past the end of a V1 provider's struct: the table never reads it there,
// and reads it from V2 on.
TEST(DeviceVerbsCounters, ReadOnlyFromProvidersOfAbiV2) {
    ibv_extend_vdev_ops v = partialProvider();
    v.query_counters = fakeQueryCounters;
    std::string got;
    auto emit = [](void *arg, const char *name, uint64_t value) {
        *static_cast<std::string *>(arg) = std::string(name) + "=" + std::to_string(value);
    };
    counter_calls = 0;
    v.abi = IBV_EXTEND_VDEV_ABI_V1;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").queryCounters(emit, &got), -EOPNOTSUPP);
    EXPECT_EQ(counter_calls, 0);
    v.abi = IBV_EXTEND_VDEV_ABI_V2;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").queryCounters(emit, &got), 0);
    EXPECT_EQ(counter_calls, 1);
    EXPECT_EQ(got, "fake0=7");
    v.query_counters = nullptr;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").queryCounters(emit, &got), -EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs().queryCounters(emit, &got), -EOPNOTSUPP);
}

}  // namespace
}  // namespace ibvx::loader

namespace ibvx::loader {
namespace {

int event_fd_seen = -100;
int fakeSetCqEventFd(ibv_cq *, int fd) {
    event_fd_seen = fd;
    return 0;
}
int fakeSetAsyncEventFd(ibv_context *, int fd) {
    event_fd_seen = fd;
    return -EINVAL;
}

// The event fd entries lie past the end of a V2 provider's struct: read from V3 on only, and an
// rdma-core device (its own completion channels) has none.
TEST(DeviceVerbsEvents, ReadOnlyFromProvidersOfAbiV3) {
    ibv_extend_vdev_ops v = partialProvider();
    v.set_cq_event_fd = fakeSetCqEventFd;
    v.set_async_event_fd = fakeSetAsyncEventFd;
    ibv_cq cq{};
    v.abi = IBV_EXTEND_VDEV_ABI_V2;
    event_fd_seen = -100;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").setCqEventFd(&cq, 5), -EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").setAsyncEventFd(&fake_context, 5), -EOPNOTSUPP);
    EXPECT_EQ(event_fd_seen, -100);
    v.abi = IBV_EXTEND_VDEV_ABI_V3;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").setCqEventFd(&cq, 5), 0);
    EXPECT_EQ(event_fd_seen, 5);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").setAsyncEventFd(&fake_context, -1), -EINVAL);
    EXPECT_EQ(event_fd_seen, -1);
    v.set_cq_event_fd = nullptr;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").setCqEventFd(&cq, 5), -EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVerbs(nullptr).setCqEventFd(&cq, 5), -EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVerbs(nullptr).setAsyncEventFd(&fake_context, 5), -EOPNOTSUPP);
}

ibv_xrcd fake_xrcd{};
ibv_xrcd *fakeOpenXrcd(ibv_context *) {
    return &fake_xrcd;
}
int fakeCloseXrcd(ibv_xrcd *) {
    return 0;
}
ibv_srq_extend *fakeCreateXrcSrq(ibv_context *, ibv_srq_init_attr_extend *, ibv_xrcd *, ibv_cq *) {
    return nullptr;
}
ibv_qp_extend *fakeCreateXrcTgtQp(ibv_context *, ibv_qp_init_attr_extend *, ibv_xrcd *) {
    return nullptr;
}
int fakeGetSrqNum(ibv_srq *, uint32_t *num) {
    *num = 42;
    return 0;
}

// The XRC entries lie past the end of a V5 provider's struct, and come all five or none: a
// provider lacking one serves no XRC at all (no domain it could not fill).
TEST(DeviceVerbsXrc, ReadOnlyFromProvidersOfAbiV6AndAllOrNone) {
    ibv_extend_vdev_ops v = partialProvider();
    v.open_xrcd = fakeOpenXrcd;
    v.close_xrcd = fakeCloseXrcd;
    v.create_xrc_srq = fakeCreateXrcSrq;
    v.create_xrc_tgt_qp = fakeCreateXrcTgtQp;
    v.get_srq_num = fakeGetSrqNum;
    ibv_srq srq{};
    uint32_t num = 0;
    v.abi = IBV_EXTEND_VDEV_ABI_V5;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").openXrcd(&fake_context), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").getSrqNum(&srq, &num), -EOPNOTSUPP);
    v.abi = IBV_EXTEND_VDEV_ABI_V6;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").openXrcd(&fake_context), &fake_xrcd);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").getSrqNum(&srq, &num), 0);
    EXPECT_EQ(num, 42u);
    v.create_xrc_tgt_qp = nullptr;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").openXrcd(&fake_context), nullptr);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").closeXrcd(&fake_xrcd), -EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVerbs(nullptr).openXrcd(&fake_context), nullptr);
}

ibv_pd fake_mw_pd{};
ibv_mw fake_mw{};
ibv_mw *fakeAllocMw(ibv_pd *pd, ibv_mw_type type) {
    return pd == &fake_mw_pd && type == IBV_MW_TYPE_2 ? &fake_mw : nullptr;
}
int fakeDeallocMw(ibv_mw *mw) {
    return mw == &fake_mw ? 0 : -EINVAL;
}

TEST(DeviceVerbsMw, ReadOnlyFromProvidersOfAbiV9AndBothOrNone) {
    ibv_extend_vdev_ops v = partialProvider();
    v.alloc_mw = fakeAllocMw;
    v.dealloc_mw = fakeDeallocMw;
    v.abi = IBV_EXTEND_VDEV_ABI_V8;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").allocMw(&fake_mw_pd, IBV_MW_TYPE_2), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").deallocMw(&fake_mw), -EOPNOTSUPP);
    v.abi = IBV_EXTEND_VDEV_ABI_V9;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").allocMw(&fake_mw_pd, IBV_MW_TYPE_2), &fake_mw);
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").deallocMw(&fake_mw), 0);
    v.dealloc_mw = nullptr;
    EXPECT_EQ(DeviceVerbs::forVirtual(&v, "fake0").allocMw(&fake_mw_pd, IBV_MW_TYPE_2), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
}

}  // namespace
}  // namespace ibvx::loader
