// The driver's entry points: argument checks and refusals that need no device (fake contexts
// that are never handed to libibverbs), and the real create/destroy path on an mlx5 device,
// skipped when the host has none.
#include "providers/mlx5/driver.h"

#include <gtest/gtest.h>
#include <infiniband/mlx5dv.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "common/qp_init_attr.h"
#include "providers/mlx5/translate.h"

namespace ibvx::mlx5 {
namespace {

// rdma-core's struct verbs_device starts with the ibv_device and then the provider's ops
// pointer; mlx5dv_is_supported() compares that pointer with mlx5's. A null one is "not mlx5".
struct FakeVerbsDevice {
    ibv_device device;
    const void *ops;
};

class Mlx5DriverNoDevice : public ::testing::Test {
  protected:
    void SetUp() override {
        std::memset(&dev_, 0, sizeof(dev_));
        std::strcpy(dev_.device.name, "fake0");
        std::memset(&ctx_, 0, sizeof(ctx_));
        ctx_.device = &dev_.device;
        std::memset(&pd_, 0, sizeof(pd_));
        pd_.context = &ctx_;
    }
    static ibv_extend_ops completeOps() {
        ibv_extend_ops o{};
        o.alloc = [](size_t) -> void * {
            ADD_FAILURE() << "no allocation expected";
            return nullptr;
        };
        o.free = [](void *) {};
        o.db_mmap = [](doorbell_map_desc *) -> void * {
            ADD_FAILURE() << "no mapping expected";
            return nullptr;
        };
        o.db_unmap = [](void *, doorbell_map_desc *) { return 0; };
        return o;
    }
    FakeVerbsDevice dev_;
    ibv_context ctx_;
    ibv_pd pd_;
};

TEST(Mlx5Driver, OpsTableIsV3AndComplete) {
    const ibv_context_extend_ops &ops = contextOps();
    EXPECT_EQ(ops.version, IBV_EXTEND_DRIVER_VERSION_V3);
    EXPECT_NE(ops.create_qp, nullptr);
    EXPECT_NE(ops.create_cq, nullptr);
    EXPECT_NE(ops.create_srq, nullptr);
    EXPECT_NE(ops.destroy_qp, nullptr);
    EXPECT_NE(ops.destroy_cq, nullptr);
    EXPECT_NE(ops.destroy_srq, nullptr);
    EXPECT_NE(ops.query_device, nullptr);
    EXPECT_NE(ops.modify_qp, nullptr);
    EXPECT_NE(ops.query_qp, nullptr);
    EXPECT_NE(ops.query_qp_supported_hyroce_feature, nullptr);
    EXPECT_NE(ops.nego_qp_hyroce_feature, nullptr);
}

TEST_F(Mlx5DriverNoDevice, AllocContextRefusesNullAndNonMlx5Devices) {
    errno = 0;
    EXPECT_EQ(allocContext(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);

    ibv_context no_device{};
    errno = 0;
    EXPECT_EQ(allocContext(&no_device), nullptr);
    EXPECT_EQ(errno, EINVAL);

    errno = 0;
    EXPECT_EQ(allocContext(&ctx_), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);

    freeContext(nullptr);  // harmless
}

TEST_F(Mlx5DriverNoDevice, WarningsGoToStderrOnlyWhenAskedFor) {
    unsetenv("IBV_EXTEND_SHOW_WARNINGS");
    testing::internal::CaptureStderr();
    EXPECT_EQ(allocContext(&ctx_), nullptr);
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_EQ(allocContext(&ctx_), nullptr);
    std::string out = testing::internal::GetCapturedStderr();
    unsetenv("IBV_EXTEND_SHOW_WARNINGS");
    EXPECT_EQ(out.rfind("ibv_extend: Warning: ", 0), 0u) << out;
    EXPECT_NE(out.find("fake0"), std::string::npos) << out;
}

TEST_F(Mlx5DriverNoDevice, CreateChecksArgumentsBeforeTouchingTheDevice) {
    const ibv_context_extend_ops &ops = contextOps();
    ibv_extend_ops good = completeOps();

    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);

    ibv_qp_init_attr_extend qa{};
    qa.pd = &pd_;
    qa.attr.qp_type = IBV_QPT_RC;
    qa.ops = nullptr;
    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EINVAL);

    ibv_extend_ops no_mmap = good;
    no_mmap.db_mmap = nullptr;
    qa.ops = &no_mmap;
    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EINVAL);

    qa.ops = &good;
    qa.type = QU_BUF_DMA_MODE_INDEP_UB;
    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);

    qa.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_context other{};
    ibv_pd foreign_pd{};
    foreign_pd.context = &other;
    qa.pd = &foreign_pd;
    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EINVAL);

    ibv_cq_init_attr_extend ca{};
    ca.attr.cqe = 64;
    ca.ops = &good;
    errno = 0;
    EXPECT_EQ(ops.create_cq(&ctx_, &ca), nullptr);  // context never opened: no CQ base PD
    EXPECT_EQ(errno, EINVAL);
    ca.attr.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
    errno = 0;
    EXPECT_EQ(ops.create_cq(&ctx_, &ca), nullptr);
    EXPECT_EQ(errno, EINVAL);

    ibv_srq_init_attr_extend sa{};
    sa.pd = &foreign_pd;
    sa.ops = &good;
    errno = 0;
    EXPECT_EQ(ops.create_srq(&ctx_, &sa), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

TEST_F(Mlx5DriverNoDevice, CreateWithoutParentDomainSupportFailsCleanly) {
    // A context libibverbs did not make offers no parent domains: the create stops there,
    // before any allocation or mapping (completeOps fails the test if one happens).
    const ibv_context_extend_ops &ops = contextOps();
    ibv_extend_ops good = completeOps();
    ibv_qp_init_attr_extend qa{};
    qa.pd = &pd_;
    qa.attr.qp_type = IBV_QPT_RC;
    qa.qp_cap_flag = QP_ENABLE_DIRECT_WQE;
    qa.ops = &good;
    errno = 0;
    EXPECT_EQ(ops.create_qp(&ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);

    ibv_srq_init_attr_extend sa{};
    sa.pd = &pd_;
    sa.attr.attr.max_wr = 16;
    sa.ops = &good;
    errno = 0;
    EXPECT_EQ(ops.create_srq(&ctx_, &sa), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(Mlx5DriverNoDevice, ForeignObjectsAreRefusedNotTouched) {
    const ibv_context_extend_ops &ops = contextOps();
    EXPECT_EQ(ops.destroy_qp(nullptr), -EINVAL);
    EXPECT_EQ(ops.destroy_cq(nullptr), -EINVAL);
    EXPECT_EQ(ops.destroy_srq(nullptr), -EINVAL);

    // Handles this driver never made: rejected from the registry, never dereferenced deeper.
    ibv_qp fake_qp{};
    ibv_qp_extend qe{};
    qe.qp = &fake_qp;
    EXPECT_EQ(ops.destroy_qp(&qe), -EINVAL);
    ibv_cq_extend ce{};
    EXPECT_EQ(ops.destroy_cq(&ce), -EINVAL);
    ibv_srq_extend se{};
    EXPECT_EQ(ops.destroy_srq(&se), -EINVAL);

    ibv_qp_attr_extend attr{};
    attr.qp = &fake_qp;
    attr.udp_src_port = 50000;
    EXPECT_EQ(ops.modify_qp(&ctx_, &attr, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), -EINVAL);
    EXPECT_EQ(ops.query_qp(&ctx_, &attr, IBV_QP_ATTR_EXTEND_HYROCE_FEATURE), -EINVAL);
    EXPECT_EQ(ops.modify_qp(&ctx_, &attr, IBV_QP_ATTR_EXTEND_LB_MODE), -EOPNOTSUPP);
    EXPECT_EQ(ops.modify_qp(&ctx_, nullptr, 0), -EINVAL);

    ibv_device_attr_extend dattr{};
    EXPECT_EQ(ops.query_device(&ctx_, &dattr), -EINVAL);
    EXPECT_EQ(ops.query_device(&ctx_, nullptr), -EINVAL);
}

TEST_F(Mlx5DriverNoDevice, HyroceQueryAndNegotiationSettleOnRoceV2) {
    const ibv_context_extend_ops &ops = contextOps();
    ibv_qp fake_qp{};  // the answer is device-wide; the QP is not looked into
    ibv_hyroce_feature f;
    std::memset(&f, 0x5a, sizeof(f));
    ASSERT_EQ(ops.query_qp_supported_hyroce_feature(&ctx_, &fake_qp, 3, 106, &f), 0);
    EXPECT_EQ(f.type, IBV_HYPER_FEAT_RoCEv2);
    EXPECT_EQ(f.version, IBV_HYPER_FEAT_V0);
    EXPECT_EQ(f.sack_enable, 0);
    EXPECT_EQ(f.resv[60], 0);

    ibv_hyroce_feature peer{};
    peer.type = IBV_HYPER_FEAT_HYPER_ROCE;
    peer.version = IBV_HYPER_FEAT_V3;
    peer.sack_enable = 1;
    ibv_hyroce_feature result;
    std::memset(&result, 0x5a, sizeof(result));
    uint32_t more = 7;
    ASSERT_EQ(ops.nego_qp_hyroce_feature(&ctx_, &fake_qp, &peer, &result, &more), 0);
    EXPECT_EQ(result.type, IBV_HYPER_FEAT_RoCEv2);
    EXPECT_EQ(result.version, IBV_HYPER_FEAT_V0);
    EXPECT_EQ(result.sack_enable, 0);
    EXPECT_EQ(more, 0u);

    EXPECT_EQ(ops.nego_qp_hyroce_feature(&ctx_, &fake_qp, nullptr, &result, &more), -EINVAL);
    EXPECT_EQ(ops.nego_qp_hyroce_feature(&ctx_, &fake_qp, &peer, &result, nullptr), -EINVAL);
    EXPECT_EQ(ops.query_qp_supported_hyroce_feature(&ctx_, nullptr, 0, 0, &f), -EINVAL);
}

// ---- real hardware -------------------------------------------------------------------------

// Host memory standing in for NPU memory; the doorbell "mapping" is the identity (the UAR page
// is already mapped in this process). Both keep books the test checks at the end.
struct HostOps {
    static std::map<void *, size_t> blocks;
    static std::map<uint64_t, int> maps;  // page -> mappings outstanding
    static void *alloc(size_t n) {
        void *p = nullptr;
        if (posix_memalign(&p, 4096, n) != 0) {
            return nullptr;
        }
        blocks[p] = n;
        return p;
    }
    static void free(void *p) {
        blocks.erase(p);
        std::free(p);
    }
    static void *db_mmap(doorbell_map_desc *d) {
        EXPECT_EQ(d->type, uint32_t{DB_MAP_MODE_HOST_VA});
        EXPECT_EQ(d->hva % 4096, 0u);
        EXPECT_EQ(d->size % 4096, 0u);
        maps[d->hva]++;
        return reinterpret_cast<void *>(d->hva);
    }
    static int db_unmap(void *p, doorbell_map_desc *d) {
        if (reinterpret_cast<uint64_t>(p) != d->hva || maps[d->hva] == 0) {
            return -ENODEV;
        }
        maps[d->hva]--;
        return 0;
    }
    static bool owns(const void *p, size_t len) {
        auto a = reinterpret_cast<uintptr_t>(p);
        for (const auto &[base, n] : blocks) {
            auto b = reinterpret_cast<uintptr_t>(base);
            if (a >= b && a + len <= b + n) {
                return true;
            }
        }
        return false;
    }
    static ibv_extend_ops ops() {
        ibv_extend_ops o{};
        o.alloc = alloc;
        o.free = free;
        o.db_mmap = db_mmap;
        o.db_unmap = db_unmap;
        return o;
    }
};
std::map<void *, size_t> HostOps::blocks;
std::map<uint64_t, int> HostOps::maps;

class Mlx5DriverHardware : public ::testing::Test {
  protected:
    void SetUp() override {
        int n = 0;
        errno = 0;
        ibv_device **list = ibv_get_device_list(&n);
        if (list == nullptr) {  // ENOSYS without any RDMA device; never free a NULL list
            GTEST_SKIP() << "no mlx5 device (ibv_get_device_list: " << std::strerror(errno) << ")";
        }
        for (int i = 0; i < n && ctx_ == nullptr; ++i) {
            if (mlx5dv_is_supported(list[i])) {
                ctx_ = ibv_open_device(list[i]);
            }
        }
        ibv_free_device_list(list);
        if (ctx_ == nullptr) {
            GTEST_SKIP() << "no mlx5 device";
        }
        ext_ = allocContext(ctx_);
        ASSERT_NE(ext_, nullptr) << std::strerror(errno);
        pd_ = ibv_alloc_pd(ctx_);
        ASSERT_NE(pd_, nullptr);
        ops_ = HostOps::ops();
    }
    void TearDown() override {
        if (pd_ != nullptr) {
            ibv_dealloc_pd(pd_);
        }
        if (ext_ != nullptr) {
            freeContext(ext_);
        }
        if (ctx_ != nullptr) {
            ibv_close_device(ctx_);
        }
    }
    ibv_context *ctx_ = nullptr;
    ibv_context_extend *ext_ = nullptr;
    ibv_pd *pd_ = nullptr;
    ibv_extend_ops ops_{};
};

TEST_F(Mlx5DriverHardware, QueuesLiveInTheCallersMemoryAndDestroyGivesEverythingBack) {
    const ibv_context_extend_ops &ops = *ext_->ops;
    ibv_device_attr_extend dattr{};
    ASSERT_EQ(ops.query_device(ctx_, &dattr), 0);
    EXPECT_TRUE(dattr.ext_cap & IBV_EXTEND_DEV_NDA);

    ibv_cq_init_attr_extend ca{};
    ca.attr.cqe = 128;
    ca.ops = &ops_;
    ibv_cq_extend *cq = ops.create_cq(ctx_, &ca);
    ASSERT_NE(cq, nullptr) << std::strerror(errno);
    const queue_info &ci = cq->cq_info;
    EXPECT_TRUE(HostOps::owns(reinterpret_cast<void *>(ci.qbuf.base),
                              size_t{ci.qbuf.entry_cnt} * ci.qbuf.entry_size));
    EXPECT_TRUE(HostOps::owns(ci.dbr_ci_va.iov_base, ci.dbr_ci_va.iov_len));
    EXPECT_NE(ci.db_hw_va.iov_base, nullptr);

    ibv_qp_init_attr_extend qa = qpInitAttr({.pd = pd_,
                                             .send_cq = cq->cq,
                                             .send_wr = 64,
                                             .recv_wr = 64,
                                             .qp_cap_flag = QP_ENABLE_DIRECT_WQE,
                                             .ops = &ops_});
    ibv_qp_extend *qp = ops.create_qp(ctx_, &qa);
    ASSERT_NE(qp, nullptr) << std::strerror(errno);
    const queue_info &sq = qp->sq_info;
    const queue_info &rq = qp->rq_info;
    EXPECT_GE(sq.qbuf.entry_cnt, 64u);
    EXPECT_TRUE(HostOps::owns(reinterpret_cast<void *>(sq.qbuf.base),
                              size_t{sq.qbuf.entry_cnt} * sq.qbuf.entry_size));
    EXPECT_TRUE(HostOps::owns(reinterpret_cast<void *>(rq.qbuf.base),
                              size_t{rq.qbuf.entry_cnt} * rq.qbuf.entry_size));
    EXPECT_TRUE(HostOps::owns(sq.dbr_pi_va.iov_base, 4));
    EXPECT_EQ(static_cast<char *>(sq.dbr_pi_va.iov_base) - static_cast<char *>(rq.dbr_pi_va.iov_base), 4);
    EXPECT_NE(sq.db_hw_va.iov_base, nullptr);

    // Before RTS mlx5 cannot change the UDP source port.
    ibv_qp_attr_extend xa{};
    xa.qp = qp->qp;
    xa.udp_src_port = 50000;
    EXPECT_EQ(ops.modify_qp(ctx_, &xa, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), -EINVAL);

    ibv_srq_init_attr_extend sa{};
    sa.pd = pd_;
    sa.attr.attr.max_wr = 32;
    sa.attr.attr.max_sge = 1;
    sa.ops = &ops_;
    ibv_srq_extend *srq = ops.create_srq(ctx_, &sa);
    ASSERT_NE(srq, nullptr) << std::strerror(errno);
    EXPECT_TRUE(HostOps::owns(reinterpret_cast<void *>(srq->srq_info.qbuf.base),
                              size_t{srq->srq_info.qbuf.entry_cnt} * srq->srq_info.qbuf.entry_size));

    EXPECT_EQ(ops.destroy_cq(cq), -EBUSY);  // the QP still uses it; nothing was undone
    EXPECT_EQ(ops.destroy_qp(qp), 0);
    EXPECT_EQ(ops.destroy_srq(srq), 0);
    EXPECT_EQ(ops.destroy_cq(cq), 0);
    EXPECT_TRUE(HostOps::blocks.empty());
    for (const auto &[page, count] : HostOps::maps) {
        EXPECT_EQ(count, 0) << std::hex << page;
    }
}

}  // namespace
}  // namespace ibvx::mlx5
