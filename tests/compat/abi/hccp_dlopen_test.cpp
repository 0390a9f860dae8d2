// The real consumer's way in (HCCP): dlopen("libibv_extend.so", RTLD_NOW | RTLD_GLOBAL), dlsym
// the functions it uses, then open an rdma-core device's extension context and walk its QP
// setup. The device is a fake with rdma-core's leading layout whose provider name is "alpha";
// the driver is the test driver libibvxtest_alpha.so found through IBV_EXTEND_DRIVERS.
#include <dlfcn.h>

#include <cstring>

#include <gtest/gtest.h>

#include <ibv_extend.h>

#include "common/qp_init_attr.h"
#include "tests/unit/loader/test_support.h"

namespace {

using ibvx::test::DiscoveryEnv;

IBVX_FAKE_DEVICE(mlx_like_dev, "alpha");

// The function table HCCP fills with dlsym.
struct ExtendApi {
    decltype(&ibv_extend_get_version) get_version;
    decltype(&ibv_extend_check_version) check_version;
    decltype(&ibv_open_extend) open;
    decltype(&ibv_close_extend) close;
    decltype(&ibv_query_device_extend) query_device;
    decltype(&ibv_create_qp_extend) create_qp;
    decltype(&ibv_create_cq_extend) create_cq;
    decltype(&ibv_destroy_qp_extend) destroy_qp;
    decltype(&ibv_destroy_cq_extend) destroy_cq;
    // optional in HCCP
    decltype(&ibv_modify_qp_extend) modify_qp;
    decltype(&ibv_query_qp_supported_hyroce_feature) query_hyroce;
    decltype(&ibv_nego_qp_hyroce_feature) nego_hyroce;
};

template <typename T>
bool bind(void *h, const char *name, T *fn) {
    *fn = reinterpret_cast<T>(dlsym(h, name));
    return *fn != nullptr;
}

bool bindAll(void *h, ExtendApi *api) {
    return bind(h, "ibv_extend_get_version", &api->get_version) &&
           bind(h, "ibv_extend_check_version", &api->check_version) &&
           bind(h, "ibv_open_extend", &api->open) && bind(h, "ibv_close_extend", &api->close) &&
           bind(h, "ibv_query_device_extend", &api->query_device) &&
           bind(h, "ibv_create_qp_extend", &api->create_qp) &&
           bind(h, "ibv_create_cq_extend", &api->create_cq) &&
           bind(h, "ibv_destroy_qp_extend", &api->destroy_qp) &&
           bind(h, "ibv_destroy_cq_extend", &api->destroy_cq) &&
           bind(h, "ibv_modify_qp_extend", &api->modify_qp) &&
           bind(h, "ibv_query_qp_supported_hyroce_feature", &api->query_hyroce) &&
           bind(h, "ibv_nego_qp_hyroce_feature", &api->nego_hyroce);
}

// Device memory of the consumer: plain host memory here, with the same callback contract.
struct ibv_extend_ops hostOps() {
    struct ibv_extend_ops o {};
    o.alloc = [](size_t n) { return calloc(1, n); };
    o.free = [](void *p) { free(p); };
    o.memset_s = [](void *d, int v, size_t n) { memset(d, v, n); };
    o.memcpy_s = [](void *d, size_t max, void *s, size_t n, uint32_t) {
        if (n > max) {
            return -1;
        }
        memcpy(d, s, n);
        return 0;
    };
    o.db_mmap = [](doorbell_map_desc *d) { return reinterpret_cast<void *>(d->hva); };
    o.db_unmap = [](void *p, doorbell_map_desc *d) { return p != nullptr && d != nullptr ? 0 : -EINVAL; };
    return o;
}

void hccpFlow(void *lib) {
    ExtendApi api{};
    ASSERT_TRUE(bindAll(lib, &api)) << dlerror();
    EXPECT_STREQ(api.get_version(nullptr, nullptr, nullptr), IBV_EXTEND_VERSION_STRING);
    EXPECT_EQ(api.check_version(IBV_EXTEND_VERSION_MAJOR, IBV_EXTEND_VERSION_MINOR, IBV_EXTEND_VERSION_PATCH),
              0);

    ibv_context ctx{};
    ctx.device = &mlx_like_dev.device;
    ibv_context_extend *ext = api.open(&ctx);
    ASSERT_NE(ext, nullptr);
    testdrv_control *drv = ibvx::test::driverControl("ibvxtest_alpha");
    ASSERT_NE(drv, nullptr) << "the library loaded the driver";

    ibv_device_attr_extend dev_attr{};
    ASSERT_EQ(api.query_device(ext, &dev_attr), 0);
    ASSERT_TRUE(dev_attr.ext_cap & IBV_EXTEND_DEV_NDA);

    struct ibv_extend_ops ops = hostOps();
    ibv_cq_init_attr_extend cq_attr{};
    cq_attr.attr.cqe = 256;
    cq_attr.type = QU_BUF_DMA_MODE_DEFAULT;
    cq_attr.ops = &ops;
    ibv_cq_extend *cq = api.create_cq(ext, &cq_attr);
    ASSERT_NE(cq, nullptr);
    queue_info cq_info = cq->cq_info;  // HCCP copies the whole cq_info back
    EXPECT_EQ(cq_info.qbuf.entry_cnt, 256u);
    EXPECT_NE(cq_info.db_hw_va.iov_base, nullptr);

    ibv_pd pd{};
    pd.context = &ctx;
    ibv_qp_init_attr_extend qp_attr = ibvx::qpInitAttr({.pd = &pd,
                                                        .send_cq = cq->cq,
                                                        .send_wr = 128,
                                                        .recv_wr = 128,
                                                        .send_sge = 0,
                                                        .recv_sge = 0,
                                                        .ops = &ops});
    ibv_qp_extend *qp = api.create_qp(ext, &qp_attr);
    ASSERT_NE(qp, nullptr);
    ASSERT_NE(qp->qp, nullptr);
    EXPECT_EQ(qp->sq_info.qbuf.entry_cnt, 128u);
    EXPECT_EQ(qp->sq_info.qbuf.entry_size, 64u);
    EXPECT_NE(qp->sq_info.dbr_pi_va.iov_base, nullptr);

    ibv_hyroce_feature supported{};
    ASSERT_EQ(api.query_hyroce(ext, qp->qp, 3, 106, &supported), 0);
    EXPECT_EQ(drv->last_sl, 3u);
    ibv_hyroce_feature peer{};
    peer.type = IBV_HYPER_FEAT_HYPER_ROCE;
    peer.version = IBV_HYPER_FEAT_V3;
    ibv_hyroce_feature agreed{};
    uint32_t more = 1;
    ASSERT_EQ(api.nego_hyroce(ext, qp->qp, &peer, &agreed, &more), 0);
    EXPECT_EQ(agreed.version, IBV_HYPER_FEAT_V2);

    ibv_qp_attr_extend qattr{};
    qattr.qp = qp->qp;
    qattr.udp_src_port = 49152;
    qattr.feature = agreed;
    ASSERT_EQ(api.modify_qp(ext, &qattr, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE),
              0);
    EXPECT_EQ(drv->last_mask, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE);
    EXPECT_EQ(qp->vendor_priv_info.vendor1.db_cos, 5) << "HCCP reads vendor_priv_info after modify";

    EXPECT_EQ(api.destroy_qp(ext, qp), 0);
    EXPECT_EQ(api.destroy_cq(ext, cq), 0);
    EXPECT_EQ(drv->live_queues, 0);
    EXPECT_EQ(api.close(ext), 0);
    EXPECT_EQ(drv->alloc_calls, 1);
    EXPECT_EQ(drv->free_calls, 1);
}

TEST(HccpDlopen, GlobalLoadDrivesTestDriver) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    void *lib = dlopen(IBVX_LIBIBV_EXTEND, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(lib, nullptr) << dlerror();
    hccpFlow(lib);
    // HCCP never unloads; neither do we, so the driver's pointers stay valid for the process.
}

TEST(HccpDlopen, LocalLoadStillLetsDriversRegister) {
    // Drivers resolve verbs_register_driver_extend from the global scope; the library promotes
    // itself before loading them, so even an RTLD_LOCAL consumer works.
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    void *lib = dlopen(IBVX_LIBIBV_EXTEND, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib, nullptr) << dlerror();
    hccpFlow(lib);
}

TEST(HccpDlopen, MissingDriverMeansNdaUnsupported) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_nosuch", 1);
    void *lib = dlopen(IBVX_LIBIBV_EXTEND, RTLD_NOW | RTLD_GLOBAL);
    ASSERT_NE(lib, nullptr) << dlerror();
    ExtendApi api{};
    ASSERT_TRUE(bindAll(lib, &api));
    ibv_context ctx{};
    ctx.device = &mlx_like_dev.device;
    EXPECT_EQ(api.open(&ctx), nullptr);
}

}  // namespace
