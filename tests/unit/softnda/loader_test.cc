// The real module: libsoftnda.so found and dlopen'ed by the loader (IBV_EXTEND_DRIVERS), its
// registration constructors run, and a device opened and driven through what they registered.
// Queue memory here is plain host memory with identity doorbell mapping, as direct mode on a
// host without an NPU would supply it.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "common/qp_init_attr.h"
#include "providers/loader/loader.h"
#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"

namespace {

std::mutex g_mu;
std::map<void *, int> g_db_refs;
int g_live_allocs = 0;

void *hostAlloc(size_t size) {
    void *p = std::aligned_alloc(4096, (size + 4095) & ~static_cast<size_t>(4095));
    if (p != nullptr) {
        std::lock_guard<std::mutex> lk(g_mu);
        g_live_allocs++;
    }
    return p;
}
void hostFree(void *p) {
    std::lock_guard<std::mutex> lk(g_mu);
    g_live_allocs--;
    std::free(p);
}
void hostMemset(void *d, int v, size_t n) {
    std::memset(d, v, n);
}
int hostMemcpy(void *d, size_t max, void *s, size_t n, uint32_t dir) {
    if (dir > MEMCPY_DIR_DEVICE_TO_DEVICE || n > max) {
        return -1;
    }
    std::memcpy(d, s, n);
    return 0;
}
void *hostDbMmap(doorbell_map_desc *desc) {
    if (desc == nullptr || desc->type != DB_MAP_MODE_HOST_VA) {
        return nullptr;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    auto *p = reinterpret_cast<void *>(desc->hva);
    g_db_refs[p]++;
    return p;
}
int hostDbUnmap(void *ptr, doorbell_map_desc *desc) {
    if (ptr == nullptr || desc == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_db_refs.find(ptr);
    if (it == g_db_refs.end()) {
        return -ENODEV;
    }
    if (--it->second == 0) {
        g_db_refs.erase(it);
    }
    return 0;
}
ibv_extend_ops g_ops = {hostAlloc, hostFree, hostMemset, hostMemcpy, hostDbMmap, hostDbUnmap};

TEST(SoftndaModule, LoadedByTheLoaderAndDriven) {
    ASSERT_NE(std::getenv("IBV_EXTEND_PROVIDER_DIR"), nullptr);
    setenv("IBV_EXTEND_DRIVERS", "softnda", 1);
    ibvx::loader::OpenedVdev ov;
    ASSERT_EQ(ibvx::loader::openVdev("softnda0", &ov), 0);
    ASSERT_NE(ov.context, nullptr);
    ASSERT_NE(ov.provider, nullptr);
    EXPECT_STREQ(ov.provider->provider, SOFTNDA_PROVIDER_NAME);
    const verbs_device_extend_ops *drv = ibvx::loader::findDriver(ov.context->device);
    ASSERT_NE(drv, nullptr);
    EXPECT_STREQ(drv->name, "softnda");
    EXPECT_EQ(ibvx::loader::providerName(ov.context->device), "softnda");
    ibv_context_extend *ext = drv->alloc_context(ov.context);
    ASSERT_NE(ext, nullptr);
    EXPECT_EQ(ext->ops->version, IBV_EXTEND_DRIVER_VERSION_V3);

    ibv_context *ctx = ov.context;
    const ibv_extend_vdev_ops *v = ov.provider;
    ibv_pd *pd = v->alloc_pd(ctx);
    ASSERT_NE(pd, nullptr);
    ibv_cq_init_attr_extend ca{};
    ca.attr.cqe = 16;
    ca.ops = &g_ops;
    ibv_cq_extend *cq = ext->ops->create_cq(ctx, &ca);
    ASSERT_NE(cq, nullptr);
    ibv_qp_init_attr_extend qa =
        ibvx::qpInitAttr({.pd = pd, .send_cq = cq->cq, .send_wr = 8, .recv_wr = 8, .ops = &g_ops});
    ibv_qp_extend *qp = ext->ops->create_qp(ctx, &qa);
    ASSERT_NE(qp, nullptr);

    ibv_qp_attr at{};
    at.qp_state = IBV_QPS_INIT;
    at.port_num = 1;
    at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    ASSERT_EQ(v->modify_qp(qp->qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
              0);
    at = ibv_qp_attr{};
    at.qp_state = IBV_QPS_RTR;
    at.dest_qp_num = qp->qp->qp_num;  // loopback to itself
    at.path_mtu = IBV_MTU_1024;
    ASSERT_EQ(v->modify_qp(qp->qp, &at,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    at = ibv_qp_attr{};
    at.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(v->modify_qp(qp->qp, &at,
                           IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
              0);

    uint64_t src = 0x600dcafe, dst = 0;
    ibv_mr *sm = v->reg_mr(pd, &src, 8, reinterpret_cast<uintptr_t>(&src), IBV_ACCESS_LOCAL_WRITE);
    ibv_mr *dm = v->reg_mr(pd, &dst, 8, reinterpret_cast<uintptr_t>(&dst),
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_TRUE(sm && dm);
    softnda_sq sq;
    softnda_cq c;
    ASSERT_EQ(softnda_sq_init(&sq, &qp->sq_info), 0);
    ASSERT_EQ(softnda_cq_init(&c, &cq->cq_info), 0);
    softnda_sge s{reinterpret_cast<uintptr_t>(&src), 8, sm->lkey};
    softnda_send_wr w{};
    w.opcode = SOFTNDA_OP_RDMA_WRITE;
    w.flags = SOFTNDA_WQE_SIGNALED;
    w.wr_id = 5;
    w.sg_list = &s;
    w.num_sge = 1;
    w.remote_addr = reinterpret_cast<uintptr_t>(&dst);
    w.rkey = dm->rkey;
    ASSERT_EQ(softnda_sq_post(&sq, &w), 0);
    softnda_sq_doorbell(&sq);
    softnda_cqe e{};
    int got = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (got == 0 && std::chrono::steady_clock::now() < deadline) {
        got = softnda_cq_poll(&c, &e, 1);
        std::this_thread::yield();
    }
    ASSERT_EQ(got, 1);
    EXPECT_EQ(e.status, IBV_WC_SUCCESS);
    EXPECT_EQ(e.wr_id, 5u);
    EXPECT_EQ(dst, 0x600dcafeu);

    // The module exports its counters function; a loader user reaches it through the library.
    std::string library;
    for (const auto &d : ibvx::loader::drivers()) {
        if (d.name == "softnda") {
            library = d.library;
        }
    }
    ASSERT_FALSE(library.empty());
    void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_NOLOAD);
    ASSERT_NE(handle, nullptr) << dlerror();
    using QueryFn = int (*)(const char *, softnda_counters *);
    auto query = reinterpret_cast<QueryFn>(dlsym(handle, "softnda_query_counters"));
    ASSERT_NE(query, nullptr);
    EXPECT_EQ(
        dlsym(handle,
              "_ZN7softnda9configSetERNS_6ConfigERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEES9_"),
        nullptr);  // the C++ inside stays private
    softnda_counters k{};
    ASSERT_EQ(query("softnda0", &k), 0);
    EXPECT_GE(k.wqes_executed, 1u);

    EXPECT_EQ(v->dereg_mr(sm), 0);
    EXPECT_EQ(v->dereg_mr(dm), 0);
    EXPECT_EQ(ext->ops->destroy_qp(qp), 0);
    EXPECT_EQ(ext->ops->destroy_cq(cq), 0);
    EXPECT_EQ(v->dealloc_pd(pd), 0);
    drv->free_context(ext);
    EXPECT_EQ(v->close_device(ctx), 0);
    dlclose(handle);
    std::lock_guard<std::mutex> lk(g_mu);
    EXPECT_EQ(g_live_allocs, 0);
    EXPECT_TRUE(g_db_refs.empty());
}

}  // namespace
