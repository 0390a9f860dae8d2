// Every north-bound function of ibv_extend.h: the reference's argument checks, return codes and
// version rules, against libibv_extend.so with drivers registered by the test itself.
#include <cerrno>
#include <climits>
#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ibv_extend.h>

#include "tests/unit/loader/test_support.h"

namespace {

using ibvx::test::DiscoveryEnv;
using ::testing::HasSubstr;

IBVX_FAKE_DEVICE(fake_dev, "fakeprov");
IBVX_FAKE_DEVICE(nodrv_dev, "nodriver");
IBVX_FAKE_DEVICE(nullalloc_dev, "nullalloc");

// What the test driver "fakeprov" saw and will answer.
struct Recorder {
    int version = IBV_EXTEND_DRIVER_VERSION_V3;
    bool null_ops = false;
    bool alloc_null = false;
    int alloc_calls = 0;
    int free_calls = 0;
    ibv_context *alloc_ctx = nullptr;
    ibv_context *op_ctx = nullptr;  // the ibv_context an op received
    const void *op_arg = nullptr;   // the attr/object an op received
    int op_mask = 0;
    uint32_t seen_ext_cap = 0;
    uint32_t sl = 0, tc = 0;
    int ret = 0;  // what int ops return
};
Recorder rec;

ibv_qp_extend qp_result{};
ibv_cq_extend cq_result{};
ibv_srq_extend srq_result{};

ibv_context_extend_ops fullOps() {
    ibv_context_extend_ops o{};
    o.version = IBV_EXTEND_DRIVER_VERSION_V3;
    o.create_qp = [](ibv_context *c, ibv_qp_init_attr_extend *a) {
        rec.op_ctx = c;
        rec.op_arg = a;
        return &qp_result;
    };
    o.create_cq = [](ibv_context *c, ibv_cq_init_attr_extend *a) {
        rec.op_ctx = c;
        rec.op_arg = a;
        return &cq_result;
    };
    o.create_srq = [](ibv_context *c, ibv_srq_init_attr_extend *a) {
        rec.op_ctx = c;
        rec.op_arg = a;
        return &srq_result;
    };
    o.destroy_qp = [](ibv_qp_extend *q) {
        rec.op_arg = q;
        return rec.ret;
    };
    o.destroy_cq = [](ibv_cq_extend *q) {
        rec.op_arg = q;
        return rec.ret;
    };
    o.destroy_srq = [](ibv_srq_extend *q) {
        rec.op_arg = q;
        return rec.ret;
    };
    o.query_device = [](ibv_context *c, ibv_device_attr_extend *a) {
        rec.op_ctx = c;
        rec.seen_ext_cap = a->ext_cap;
        a->ext_cap = IBV_EXTEND_DEV_NDA;
        return rec.ret;
    };
    o.modify_qp = [](ibv_context *c, ibv_qp_attr_extend *a, int mask) {
        rec.op_ctx = c;
        rec.op_arg = a;
        rec.op_mask = mask;
        return rec.ret;
    };
    o.query_qp = [](ibv_context *c, ibv_qp_attr_extend *a, int mask) {
        rec.op_ctx = c;
        rec.op_arg = a;
        rec.op_mask = mask;
        return rec.ret;
    };
    o.query_qp_supported_hyroce_feature = [](ibv_context *c, ibv_qp *qp, uint32_t sl, uint32_t tc,
                                             ibv_hyroce_feature *) {
        rec.op_ctx = c;
        rec.op_arg = qp;
        rec.sl = sl;
        rec.tc = tc;
        return rec.ret;
    };
    o.nego_qp_hyroce_feature = [](ibv_context *c, ibv_qp *qp, const ibv_hyroce_feature *,
                                  ibv_hyroce_feature *, uint32_t *) {
        rec.op_ctx = c;
        rec.op_arg = qp;
        return rec.ret;
    };
    return o;
}

struct LocalContext {
    ibv_context_extend ext;
    ibv_context_extend_ops ops;
};

ibv_context_extend *fakeAlloc(ibv_context *ctx) {
    rec.alloc_calls++;
    rec.alloc_ctx = ctx;
    if (rec.alloc_null) {
        return nullptr;
    }
    auto *c = new LocalContext{{ctx, nullptr}, fullOps()};
    c->ops.version = rec.version;
    c->ext.ops = rec.null_ops ? nullptr : &c->ops;
    return &c->ext;
}

void fakeFree(ibv_context_extend *ext) {
    rec.free_calls++;
    delete reinterpret_cast<LocalContext *>(ext);
}

const verbs_device_extend_ops kFakeDriver = {"fakeprov", fakeAlloc, fakeFree};
const verbs_device_extend_ops kNullAllocDriver = {"nullalloc", nullptr, fakeFree};

class North : public ::testing::Test {
  protected:
    void SetUp() override {
        rec = Recorder{};
        verbs_register_driver_extend(&kFakeDriver);
        verbs_register_driver_extend(&kNullAllocDriver);
        ctx_.device = &fake_dev.device;
        ops_ = fullOps();
        ext_ = {&ctx_, &ops_};
    }

    DiscoveryEnv env_;
    ibv_context ctx_{};
    ibv_context_extend_ops ops_{};
    ibv_context_extend ext_{};  // a context built by hand, for the per-call checks
};

// ---- versions ----

TEST(Version, GetVersionFillsWhatIsAsked) {
    uint32_t major = 0, minor = 0, patch = 7;
    const char *v = ibv_extend_get_version(&major, &minor, &patch);
    EXPECT_STREQ(v, "4.2.0");
    EXPECT_EQ(major, 4u);
    EXPECT_EQ(minor, 2u);
    EXPECT_EQ(patch, 0u);
    EXPECT_EQ(ibv_extend_get_version(nullptr, nullptr, nullptr), v) << "static string";
    EXPECT_EQ(ibv_extend_get_version(nullptr, &minor, nullptr), v);
}

TEST(Version, CheckVersionRules) {
    EXPECT_EQ(ibv_extend_check_version(4, 2, 0), 0);
    EXPECT_EQ(ibv_extend_check_version(4, 1, 99), 0) << "older minor: any patch";
    EXPECT_EQ(ibv_extend_check_version(4, 0, 0), 0);
    EXPECT_EQ(ibv_extend_check_version(4, 2, 1), -1) << "same minor: newer patch refused";
    EXPECT_EQ(ibv_extend_check_version(4, 3, 0), -1) << "newer minor";
    EXPECT_EQ(ibv_extend_check_version(3, 2, 0), -1) << "major must match";
    EXPECT_EQ(ibv_extend_check_version(5, 0, 0), -1);
    EXPECT_EQ(ibv_extend_check_version(UINT32_MAX, 0, 0), -1);
}

// ---- open / close ----

TEST_F(North, OpenNullContext) {
    EXPECT_EQ(ibv_open_extend(nullptr), nullptr);
    EXPECT_EQ(rec.alloc_calls, 0);
}

TEST_F(North, OpenMatchesDriverAndPassesContext) {
    ibv_context_extend *ext = ibv_open_extend(&ctx_);
    ASSERT_NE(ext, nullptr);
    EXPECT_EQ(rec.alloc_ctx, &ctx_);
    EXPECT_EQ(ext->context, &ctx_);
    EXPECT_EQ(ext->ops->version, IBV_EXTEND_DRIVER_VERSION_V3);
    EXPECT_EQ(ibv_close_extend(ext), 0);
    EXPECT_EQ(rec.free_calls, 1);
}

TEST_F(North, OpenWithoutDriverIsNullAndWarns) {
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    ibv_context other{};
    other.device = &nodrv_dev.device;
    testing::internal::CaptureStderr();
    EXPECT_EQ(ibv_open_extend(&other), nullptr);
    EXPECT_THAT(testing::internal::GetCapturedStderr(),
                HasSubstr("ibv_extend: Warning: no available ops for open extend context"));
}

TEST_F(North, OpenWithoutDriverIsSilentWithoutShowWarnings) {
    ibv_context other{};
    other.device = &nodrv_dev.device;
    testing::internal::CaptureStderr();
    EXPECT_EQ(ibv_open_extend(&other), nullptr);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST_F(North, OpenWithNullAllocContextIsNull) {
    ibv_context other{};
    other.device = &nullalloc_dev.device;
    EXPECT_EQ(ibv_open_extend(&other), nullptr);
    EXPECT_EQ(rec.free_calls, 0);
}

TEST_F(North, OpenWhenAllocContextFailsIsNull) {
    rec.alloc_null = true;
    EXPECT_EQ(ibv_open_extend(&ctx_), nullptr);
    EXPECT_EQ(rec.alloc_calls, 1);
    EXPECT_EQ(rec.free_calls, 0);
}

class OpenVersion : public North, public ::testing::WithParamInterface<std::pair<int, bool>> {};

TEST_P(OpenVersion, VersionCheckedAfterAllocContext) {
    auto [version, accepted] = GetParam();
    rec.version = version;
    ibv_context_extend *ext = ibv_open_extend(&ctx_);
    EXPECT_EQ(rec.alloc_calls, 1);
    if (accepted) {
        ASSERT_NE(ext, nullptr);
        EXPECT_EQ(rec.free_calls, 0);
        EXPECT_EQ(ibv_close_extend(ext), 0);
    } else {
        EXPECT_EQ(ext, nullptr);
        EXPECT_EQ(rec.free_calls, 1) << "a refused context is freed through the driver";
    }
}

INSTANTIATE_TEST_SUITE_P(Versions, OpenVersion,
                         ::testing::Values(std::make_pair(0, false), std::make_pair(1, true),
                                           std::make_pair(2, true), std::make_pair(3, true),
                                           std::make_pair(4, false), std::make_pair(-1, false),
                                           std::make_pair(INT_MAX, false)));

TEST_F(North, OpenWithNullOpsRefusedAndFreed) {
    rec.null_ops = true;
    EXPECT_EQ(ibv_open_extend(&ctx_), nullptr);
    EXPECT_EQ(rec.free_calls, 1);
}

TEST_F(North, CloseArgumentChecks) {
    EXPECT_EQ(ibv_close_extend(nullptr), -EINVAL);
    ibv_context_extend no_ctx{nullptr, &ops_};
    EXPECT_EQ(ibv_close_extend(&no_ctx), -EINVAL);
    EXPECT_EQ(rec.free_calls, 0);
}

TEST_F(North, CloseWithoutMatchingDriverIsENOENT) {
    ibv_context other{};
    other.device = &nodrv_dev.device;
    ibv_context_extend ext{&other, &ops_};
    EXPECT_EQ(ibv_close_extend(&ext), -ENOENT);
}

TEST_F(North, CloseWithoutFreeContextSucceeds) {
    static const verbs_device_extend_ops no_free = {"nofree", fakeAlloc, nullptr};
    IBVX_FAKE_DEVICE(nofree_dev, "nofree");
    verbs_register_driver_extend(&no_free);
    ibv_context other{};
    other.device = &nofree_dev.device;
    ibv_context_extend *ext = ibv_open_extend(&other);
    ASSERT_NE(ext, nullptr);
    EXPECT_EQ(ibv_close_extend(ext), 0);
    EXPECT_EQ(rec.free_calls, 0);
    delete reinterpret_cast<LocalContext *>(ext);
}

// ---- query_device ----

TEST_F(North, QueryDeviceChecks) {
    ibv_device_attr_extend attr{};
    EXPECT_EQ(ibv_query_device_extend(nullptr, &attr), -EINVAL);
    EXPECT_EQ(ibv_query_device_extend(&ext_, nullptr), -EINVAL);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_query_device_extend(&no_ops, &attr), -EOPNOTSUPP);
    ops_.query_device = nullptr;
    EXPECT_EQ(ibv_query_device_extend(&ext_, &attr), -EOPNOTSUPP);
}

TEST_F(North, QueryDeviceZeroesExtCapThenAsksDriver) {
    ibv_device_attr_extend attr{};
    attr.ext_cap = 0xffffffff;
    rec.ret = -77;
    EXPECT_EQ(ibv_query_device_extend(&ext_, &attr), -77) << "the driver's result is returned";
    EXPECT_EQ(rec.seen_ext_cap, 0u);
    EXPECT_EQ(rec.op_ctx, &ctx_);
    EXPECT_EQ(attr.ext_cap, static_cast<uint32_t>(IBV_EXTEND_DEV_NDA));
}

// ---- create / destroy ----

TEST_F(North, CreateQpChecksAndDispatch) {
    ibv_qp_init_attr_extend attr{};
    errno = 0;
    EXPECT_EQ(ibv_create_qp_extend(nullptr, &attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibv_create_qp_extend(&ext_, nullptr), nullptr);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_create_qp_extend(&no_ops, &attr), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(ibv_create_qp_extend(&ext_, &attr), &qp_result);
    EXPECT_EQ(rec.op_ctx, &ctx_);
    EXPECT_EQ(rec.op_arg, &attr);
    ops_.create_qp = nullptr;
    EXPECT_EQ(ibv_create_qp_extend(&ext_, &attr), nullptr);
}

TEST_F(North, CreateCqChecksAndDispatch) {
    ibv_cq_init_attr_extend attr{};
    EXPECT_EQ(ibv_create_cq_extend(nullptr, &attr), nullptr);
    EXPECT_EQ(ibv_create_cq_extend(&ext_, nullptr), nullptr);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_create_cq_extend(&no_ops, &attr), nullptr);
    EXPECT_EQ(ibv_create_cq_extend(&ext_, &attr), &cq_result);
    EXPECT_EQ(rec.op_arg, &attr);
    ops_.create_cq = nullptr;
    EXPECT_EQ(ibv_create_cq_extend(&ext_, &attr), nullptr);
}

TEST_F(North, CreateSrqChecksAndDispatch) {
    ibv_srq_init_attr_extend attr{};
    EXPECT_EQ(ibv_create_srq_extend(nullptr, &attr), nullptr);
    EXPECT_EQ(ibv_create_srq_extend(&ext_, nullptr), nullptr);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_create_srq_extend(&no_ops, &attr), nullptr);
    EXPECT_EQ(ibv_create_srq_extend(&ext_, &attr), &srq_result);
    EXPECT_EQ(rec.op_arg, &attr);
    ops_.create_srq = nullptr;
    EXPECT_EQ(ibv_create_srq_extend(&ext_, &attr), nullptr);
}

TEST_F(North, DestroyChecksAndDriverResult) {
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_destroy_qp_extend(nullptr, &qp_result), -EINVAL);
    EXPECT_EQ(ibv_destroy_qp_extend(&ext_, nullptr), -EINVAL);
    EXPECT_EQ(ibv_destroy_qp_extend(&no_ops, &qp_result), -EOPNOTSUPP);
    EXPECT_EQ(ibv_destroy_cq_extend(nullptr, &cq_result), -EINVAL);
    EXPECT_EQ(ibv_destroy_cq_extend(&ext_, nullptr), -EINVAL);
    EXPECT_EQ(ibv_destroy_cq_extend(&no_ops, &cq_result), -EOPNOTSUPP);
    EXPECT_EQ(ibv_destroy_srq_extend(nullptr, &srq_result), -EINVAL);
    EXPECT_EQ(ibv_destroy_srq_extend(&ext_, nullptr), -EINVAL);
    EXPECT_EQ(ibv_destroy_srq_extend(&no_ops, &srq_result), -EOPNOTSUPP);

    rec.ret = -EBUSY;
    EXPECT_EQ(ibv_destroy_qp_extend(&ext_, &qp_result), -EBUSY);
    EXPECT_EQ(rec.op_arg, &qp_result);
    EXPECT_EQ(ibv_destroy_cq_extend(&ext_, &cq_result), -EBUSY);
    EXPECT_EQ(rec.op_arg, &cq_result);
    EXPECT_EQ(ibv_destroy_srq_extend(&ext_, &srq_result), -EBUSY);
    EXPECT_EQ(rec.op_arg, &srq_result);

    ops_.destroy_qp = nullptr;
    ops_.destroy_cq = nullptr;
    ops_.destroy_srq = nullptr;
    EXPECT_EQ(ibv_destroy_qp_extend(&ext_, &qp_result), -EOPNOTSUPP);
    EXPECT_EQ(ibv_destroy_cq_extend(&ext_, &cq_result), -EOPNOTSUPP);
    EXPECT_EQ(ibv_destroy_srq_extend(&ext_, &srq_result), -EOPNOTSUPP);
}

// ---- modify / query QP extended attributes (V2) ----

using QpAttrCall = int (*)(ibv_context_extend *, ibv_qp_attr_extend *, int);

class QpAttr : public North, public ::testing::WithParamInterface<QpAttrCall> {};

TEST_P(QpAttr, ArgumentChecks) {
    ibv_qp_attr_extend attr{};
    EXPECT_EQ(GetParam()(nullptr, &attr, 0), -EINVAL);
    EXPECT_EQ(GetParam()(&ext_, nullptr, 0), -EINVAL);
}

TEST_P(QpAttr, NeedsOpsV2KnownMaskAndOp) {
    ibv_qp_attr_extend attr{};
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(GetParam()(&no_ops, &attr, 0), -EOPNOTSUPP);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V1;
    EXPECT_EQ(GetParam()(&ext_, &attr, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), -EOPNOTSUPP);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V2;
    EXPECT_EQ(GetParam()(&ext_, &attr, IBV_QP_ATTR_EXTEND_MAX), -EOPNOTSUPP);
    EXPECT_EQ(GetParam()(&ext_, &attr, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | (1 << 8)), -EOPNOTSUPP);
    EXPECT_EQ(GetParam()(&ext_, &attr, INT_MIN), -EOPNOTSUPP);
    EXPECT_EQ(GetParam()(&ext_, &attr, -1), -EOPNOTSUPP);
    EXPECT_EQ(rec.op_arg, nullptr) << "none of those reached the driver";
    ops_.modify_qp = nullptr;
    ops_.query_qp = nullptr;
    EXPECT_EQ(GetParam()(&ext_, &attr, 0), -EOPNOTSUPP);
}

TEST_P(QpAttr, EveryKnownMaskBitReachesDriver) {
    ibv_qp_attr_extend attr{};
    rec.ret = 42;
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V2;
    const int all = IBV_QP_ATTR_EXTEND_MAX - 1;
    EXPECT_EQ(GetParam()(&ext_, &attr, all), 42);
    EXPECT_EQ(rec.op_mask, all);
    EXPECT_EQ(rec.op_arg, &attr);
    EXPECT_EQ(rec.op_ctx, &ctx_);
}

INSTANTIATE_TEST_SUITE_P(ModifyAndQuery, QpAttr,
                         ::testing::Values(&ibv_modify_qp_extend, &ibv_query_qp_extend));

// ---- hyroce (V3) ----

TEST_F(North, QueryHyroceChecks) {
    ibv_qp qp{};
    ibv_hyroce_feature f{};
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(nullptr, &qp, 0, 0, &f), -EINVAL);
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&ext_, nullptr, 0, 0, &f), -EINVAL);
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&ext_, &qp, 0, 0, nullptr), -EINVAL);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&no_ops, &qp, 0, 0, &f), -EOPNOTSUPP);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V2;
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&ext_, &qp, 0, 0, &f), -EOPNOTSUPP);
    EXPECT_EQ(rec.op_arg, nullptr);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V3;
    rec.ret = 5;
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&ext_, &qp, 3, 106, &f), 5);
    EXPECT_EQ(rec.op_arg, &qp);
    EXPECT_EQ(rec.sl, 3u);
    EXPECT_EQ(rec.tc, 106u);
    ops_.query_qp_supported_hyroce_feature = nullptr;
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(&ext_, &qp, 0, 0, &f), -EOPNOTSUPP);
}

TEST_F(North, NegoHyroceChecks) {
    ibv_qp qp{};
    ibv_hyroce_feature in{}, out{};
    uint32_t more = 0;
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(nullptr, &qp, &in, &out, &more), -EINVAL);
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, nullptr, &in, &out, &more), -EINVAL);
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, nullptr, &out, &more), -EINVAL);
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, &in, nullptr, &more), -EINVAL);
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, &in, &out, nullptr), -EINVAL);
    ibv_context_extend no_ops{&ctx_, nullptr};
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&no_ops, &qp, &in, &out, &more), -EOPNOTSUPP);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V2;
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, &in, &out, &more), -EOPNOTSUPP);
    EXPECT_EQ(rec.op_arg, nullptr);
    ops_.version = IBV_EXTEND_DRIVER_VERSION_V3;
    rec.ret = -ERANGE;
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, &in, &out, &more), -ERANGE);
    EXPECT_EQ(rec.op_arg, &qp);
    ops_.nego_qp_hyroce_feature = nullptr;
    EXPECT_EQ(ibv_nego_qp_hyroce_feature(&ext_, &qp, &in, &out, &more), -EOPNOTSUPP);
}

}  // namespace
