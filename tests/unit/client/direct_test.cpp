// The ibv_extend_broker.h functions in direct mode, against the test virtual-device provider
// (libibvxtest_vdev.so, devices testvdev0 and testvdev1) loaded through IBV_EXTEND_DRIVERS.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "common/qp_init_attr.h"
#include "tests/unit/loader/test_support.h"

namespace {

using ibvx::test::DiscoveryEnv;

// The caller's ibv_extend_ops for queue memory: ibvx_alloc_buf() buffers, doorbells by address.
struct ibv_extend_ops bufOps() {
    struct ibv_extend_ops o {};
    o.alloc = [](size_t size) { return ibvx_alloc_buf(size); };
    o.free = [](void *p) { ibvx_free_buf(p); };
    o.memset_s = [](void *dst, int v, size_t n) { memset(dst, v, n); };
    o.memcpy_s = [](void *dst, size_t max, void *src, size_t n, uint32_t) {
        if (n > max) {
            return -1;
        }
        memcpy(dst, src, n);
        return 0;
    };
    o.db_mmap = [](doorbell_map_desc *d) { return reinterpret_cast<void *>(d->hva); };
    o.db_unmap = [](void *, doorbell_map_desc *) { return 0; };
    return o;
}

class Direct : public ::testing::Test {
  protected:
    void SetUp() override {
        setenv("IBV_EXTEND_DRIVERS", "ibvxtest_vdev", 1);
        setenv("IBV_EXTEND_MODE", "direct", 1);
    }
    static struct testdrv_control *control() { return ibvx::test::driverControl("ibvxtest_vdev"); }

    DiscoveryEnv env_;
};

TEST_F(Direct, ModeIsDirect) {
    EXPECT_STREQ(ibvx_mode(), "direct");
}

TEST_F(Direct, ListDevicesReportsVirtualDevices) {
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_vdev", 1);
    ibvx_device_info devs[4];
    memset(devs, 0xff, sizeof(devs));
    ASSERT_EQ(ibvx_list_devices(devs, 4), 2);
    EXPECT_STREQ(devs[0].name, "testvdev0");
    EXPECT_STREQ(devs[1].name, "testvdev1");
    EXPECT_STREQ(devs[0].provider, "ibvxtestvdev");
    EXPECT_EQ(devs[0].ext_cap, static_cast<uint32_t>(IBV_EXTEND_DEV_NDA | IBV_EXTEND_DEV_NDR));
    EXPECT_EQ(devs[0].driver_version, static_cast<uint32_t>(IBV_EXTEND_DRIVER_VERSION_V3));
    EXPECT_EQ(devs[0].max_qp, 32u);
    EXPECT_EQ(devs[0].max_cqe, 4096u);
    EXPECT_EQ(devs[0].max_mr_size, 1ull << 32);
    EXPECT_EQ(devs[0].resv0, 0u);
    struct testdrv_control *c = control();
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->alloc_calls, c->free_calls) << "listing leaves no context open";
}

TEST_F(Direct, ListDevicesCountsBeyondMax) {
    ibvx_device_info one{};
    EXPECT_EQ(ibvx_list_devices(nullptr, 0), 2);
    EXPECT_EQ(ibvx_list_devices(&one, 1), 2);
    EXPECT_STREQ(one.name, "testvdev0");
}

TEST_F(Direct, ListDevicesArgumentChecks) {
    ibvx_device_info one{};
    EXPECT_EQ(ibvx_list_devices(&one, -1), -EINVAL);
    EXPECT_EQ(ibvx_list_devices(nullptr, 1), -EINVAL);
}

TEST_F(Direct, ListDevicesWithNoProvidersIsEmpty) {
    unsetenv("IBV_EXTEND_DRIVERS");
    // libibverbs has no devices on this machine (NULL + ENOSYS): must be an empty list, no crash.
    EXPECT_EQ(ibvx_list_devices(nullptr, 0), 0);
}

TEST_F(Direct, OpenAndCloseDeviceByName) {
    ibv_context_extend *ext = ibvx_open_device("testvdev1");
    ASSERT_NE(ext, nullptr);
    ASSERT_NE(ext->context, nullptr);
    EXPECT_STREQ(ext->context->device->name, "testvdev1");
    ASSERT_NE(ext->ops, nullptr);
    ibv_device_attr_extend attr{};
    EXPECT_EQ(ibv_query_device_extend(ext, &attr), 0);
    EXPECT_TRUE(attr.ext_cap & IBV_EXTEND_DEV_NDA);
    EXPECT_EQ(ibvx_close_device(ext), 0);
    EXPECT_EQ(control()->alloc_calls, control()->free_calls);
}

TEST_F(Direct, OpenDeviceErrors) {
    errno = 0;
    EXPECT_EQ(ibvx_open_device(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibvx_open_device(""), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibvx_open_device("testvdev7"), nullptr);
    EXPECT_EQ(errno, ENODEV);
}

TEST_F(Direct, OpenDeviceWhoseDriverRefusesFailsCleanly) {
    ASSERT_EQ(ibvx_list_devices(nullptr, 0), 2);  // loads the provider
    control()->ops_version = 0;
    errno = 0;
    EXPECT_EQ(ibvx_open_device("testvdev0"), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(control()->alloc_calls, control()->free_calls);
}

TEST_F(Direct, CloseDeviceErrors) {
    EXPECT_EQ(ibvx_close_device(nullptr), -EINVAL);
    ibv_context_extend *ext = ibvx_open_device("testvdev0");
    ASSERT_NE(ext, nullptr);
    ibv_context_extend copy = *ext;  // same contents, but not a context ibvx_open_device returned
    EXPECT_EQ(ibvx_close_device(&copy), -EINVAL);
    ibv_context_extend no_ctx{nullptr, ext->ops};
    EXPECT_EQ(ibvx_close_device(&no_ctx), -EINVAL);
    EXPECT_EQ(ibvx_close_device(ext), 0);
}

TEST_F(Direct, PdAndMrOnVirtualDevice) {
    ibv_context_extend *ext = ibvx_open_device("testvdev0");
    ASSERT_NE(ext, nullptr);
    ibv_pd *pd = ibvx_alloc_pd(ext);
    ASSERT_NE(pd, nullptr);
    EXPECT_EQ(pd->context, ext->context);

    void *buf = ibvx_alloc_buf(8192);
    ASSERT_NE(buf, nullptr);
    ibv_mr *mr = ibvx_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(mr, nullptr);
    EXPECT_EQ(mr->addr, buf);
    EXPECT_EQ(mr->length, 8192u);
    EXPECT_NE(mr->lkey, 0u);
    EXPECT_EQ(ibvx_dereg_mr(mr), 0);

    errno = 0;
    EXPECT_EQ(ibvx_reg_mr(nullptr, buf, 1, 0), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibvx_reg_mr(pd, nullptr, 1, 0), nullptr);
    EXPECT_EQ(ibvx_reg_mr(pd, buf, 0, 0), nullptr);
    EXPECT_EQ(ibvx_dereg_mr(nullptr), -EINVAL);
    EXPECT_EQ(ibvx_alloc_pd(nullptr), nullptr);
    EXPECT_EQ(ibvx_dealloc_pd(nullptr), -EINVAL);

    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
    ibvx_free_buf(buf);
    EXPECT_EQ(ibvx_close_device(ext), 0);
}

TEST_F(Direct, RegMrFdMapsTheFileRange) {
    ibv_context_extend *ext = ibvx_open_device("testvdev0");
    ASSERT_NE(ext, nullptr);
    ibv_pd *pd = ibvx_alloc_pd(ext);
    ASSERT_NE(pd, nullptr);
    int fd = memfd_create("ibvx-test", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    const long page = sysconf(_SC_PAGESIZE);
    ASSERT_EQ(ftruncate(fd, 2 * page), 0);
    ASSERT_EQ(pwrite(fd, "hello", 5, page + 100), 5);

    ibv_mr *mr = ibvx_reg_mr_fd(pd, fd, page + 100, 64, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    close(fd);  // the registration keeps what it needs
    ASSERT_NE(mr->addr, nullptr);
    EXPECT_EQ(memcmp(mr->addr, "hello", 5), 0) << "mr->addr is the registered file offset";
    EXPECT_EQ(mr->length, 64u);
    EXPECT_EQ(ibvx_dereg_mr(mr), 0);

    EXPECT_EQ(ibvx_reg_mr_fd(pd, -1, 0, 64, 0), nullptr);
    EXPECT_EQ(ibvx_reg_mr_fd(pd, 0, 0, 0, 0), nullptr);
    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
    EXPECT_EQ(ibvx_close_device(ext), 0);
}

TEST_F(Direct, QueuesOnVirtualDeviceWithBufferOps) {
    ibv_context_extend *ext = ibvx_open_device("testvdev0");
    ASSERT_NE(ext, nullptr);
    ibv_pd *pd = ibvx_alloc_pd(ext);
    ASSERT_NE(pd, nullptr);
    struct ibv_extend_ops ops = bufOps();

    ibv_cq_init_attr_extend cq_attr{};
    cq_attr.attr.cqe = 128;
    cq_attr.type = QU_BUF_DMA_MODE_DEFAULT;
    cq_attr.ops = &ops;
    ibv_cq_extend *cq = ibv_create_cq_extend(ext, &cq_attr);
    ASSERT_NE(cq, nullptr);
    EXPECT_EQ(cq->cq_info.qbuf.entry_cnt, 128u);

    ibv_qp_init_attr_extend qp_attr = ibvx::qpInitAttr({.pd = pd,
                                                        .send_cq = cq->cq,
                                                        .send_wr = 64,
                                                        .recv_wr = 32,
                                                        .send_sge = 0,
                                                        .recv_sge = 0,
                                                        .ops = &ops});
    ibv_qp_extend *qp = ibv_create_qp_extend(ext, &qp_attr);
    ASSERT_NE(qp, nullptr);
    ASSERT_NE(qp->qp, nullptr);
    EXPECT_EQ(qp->qp->context, ext->context);
    EXPECT_EQ(qp->sq_info.qbuf.entry_cnt, 64u);
    EXPECT_EQ(qp->rq_info.qbuf.entry_cnt, 32u);
    // The driver carved the SQ from our callbacks: it lies in an ibvx_alloc_buf() buffer, which is
    // a memfd mapping.
    std::ifstream maps_file("/proc/self/maps");
    std::string maps((std::istreambuf_iterator<char>(maps_file)), std::istreambuf_iterator<char>());
    char addr[32];
    snprintf(addr, sizeof(addr), "%lx-", static_cast<unsigned long>(qp->sq_info.qbuf.base));
    size_t at = maps.find(addr);
    ASSERT_NE(at, std::string::npos);
    EXPECT_NE(maps.find("memfd:ibvx-buf", at), std::string::npos);

    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTS;
    EXPECT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE), -EINVAL) << "RESET -> RTS is not a transition";
    EXPECT_EQ(qp->qp->state, IBV_QPS_RESET);
    for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS}) {
        attr.qp_state = s;
        ASSERT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE), 0) << s;
        EXPECT_EQ(qp->qp->state, s);
    }
    ibv_qp_attr got{};
    ibv_qp_init_attr init{};
    EXPECT_EQ(ibvx_query_qp(qp->qp, &got, IBV_QP_STATE, &init), 0);
    EXPECT_EQ(got.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(init.qp_type, IBV_QPT_RC);
    EXPECT_EQ(ibvx_modify_qp(nullptr, &attr, IBV_QP_STATE), -EINVAL);
    EXPECT_EQ(ibvx_modify_qp(qp->qp, nullptr, IBV_QP_STATE), -EINVAL);
    EXPECT_EQ(ibvx_query_qp(qp->qp, &got, 0, nullptr), -EINVAL);

    EXPECT_EQ(ibv_destroy_qp_extend(ext, qp), 0);
    EXPECT_EQ(ibv_destroy_cq_extend(ext, cq), 0);
    EXPECT_EQ(control()->live_queues, 0);
    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
    EXPECT_EQ(ibvx_close_device(ext), 0);
}

// Direct mode refuses what the broker refuses (providers/loader/create_rules.h) on a device whose
// limits it knows, with the reference's answer for a bad argument, before the driver sees it.
TEST_F(Direct, CreateRulesOfTheBrokerApplyInDirectMode) {
    ibv_context_extend *ext = ibvx_open_device("testvdev0");
    ASSERT_NE(ext, nullptr);
    ibv_context_extend *other = ibvx_open_device("testvdev1");
    ASSERT_NE(other, nullptr);
    ibv_pd *pd = ibvx_alloc_pd(ext);
    ibv_pd *other_pd = ibvx_alloc_pd(other);
    ASSERT_NE(pd, nullptr);
    ASSERT_NE(other_pd, nullptr);
    struct ibv_extend_ops ops = bufOps();
    struct testdrv_control *c = control();
    const int cq_calls = c->create_cq_calls, qp_calls = c->create_qp_calls, srq_calls = c->create_srq_calls;

    ibv_cq_init_attr_extend cq_attr{};
    cq_attr.ops = &ops;
    for (uint32_t cqe : {0u, 4097u}) {  // testvdev0 announces max_cqe 4096
        cq_attr.attr.cqe = cqe;
        errno = 0;
        EXPECT_EQ(ibv_create_cq_extend(ext, &cq_attr), nullptr) << cqe;
        EXPECT_EQ(errno, EINVAL) << cqe;
    }
    cq_attr.attr.cqe = 16;
    const int bad_mode = 9;  // what a C caller may store; C++ may not form it as the enum
    std::memcpy(&cq_attr.type, &bad_mode, sizeof(bad_mode));
    errno = 0;
    EXPECT_EQ(ibv_create_cq_extend(ext, &cq_attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(c->create_cq_calls, cq_calls) << "none of those reached the driver";
    cq_attr.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *cq = ibv_create_cq_extend(ext, &cq_attr);
    ASSERT_NE(cq, nullptr);

    ibv_qp_init_attr_extend qp_attr{};
    qp_attr.pd = other_pd;  // another context's PD
    qp_attr.attr.send_cq = cq->cq;
    qp_attr.attr.recv_cq = cq->cq;
    qp_attr.attr.qp_type = IBV_QPT_RC;
    qp_attr.attr.cap.max_send_wr = 16;
    qp_attr.attr.cap.max_recv_wr = 16;
    qp_attr.ops = &ops;
    errno = 0;
    EXPECT_EQ(ibv_create_qp_extend(ext, &qp_attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    qp_attr.pd = pd;
    qp_attr.attr.cap.max_send_wr = 1025;  // testvdev0 announces max_qp_wr 1024
    errno = 0;
    EXPECT_EQ(ibv_create_qp_extend(ext, &qp_attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(c->create_qp_calls, qp_calls);

    ibv_srq_init_attr_extend srq_attr{};
    srq_attr.pd = other_pd;
    srq_attr.attr.attr.max_wr = 16;
    srq_attr.ops = &ops;
    errno = 0;
    EXPECT_EQ(ibv_create_srq_extend(ext, &srq_attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    srq_attr.pd = pd;
    srq_attr.attr.attr.max_wr = 0;
    errno = 0;
    EXPECT_EQ(ibv_create_srq_extend(ext, &srq_attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(c->create_srq_calls, srq_calls);

    EXPECT_EQ(ibv_destroy_cq_extend(ext, cq), 0);
    EXPECT_EQ(ibvx_dealloc_pd(pd), 0);
    EXPECT_EQ(ibvx_dealloc_pd(other_pd), 0);
    EXPECT_EQ(ibvx_close_device(other), 0);
    EXPECT_EQ(ibvx_close_device(ext), 0);
}

TEST(Buffers, AllocBufIsPageAlignedSharedMemfd) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    char *p = static_cast<char *>(ibvx_alloc_buf(1));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % page, 0u);
    memset(p, 0x5a, page);  // the whole rounded-up page is ours
    std::ifstream maps("/proc/self/maps");
    std::string line;
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "%lx-", reinterpret_cast<unsigned long>(p));
    bool found = false;
    while (std::getline(maps, line)) {
        if (line.rfind(prefix, 0) == 0) {
            found = true;
            EXPECT_NE(line.find("rw-s"), std::string::npos) << line;  // MAP_SHARED
            EXPECT_NE(line.find("/memfd:ibvx-buf"), std::string::npos) << line;
        }
    }
    EXPECT_TRUE(found);
    ibvx_free_buf(p);
}

TEST(Buffers, AllocBufZeroOrHugeFails) {
    errno = 0;
    EXPECT_EQ(ibvx_alloc_buf(0), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibvx_alloc_buf(SIZE_MAX), nullptr);
}

TEST(Buffers, FreeBufIgnoresNullAndForeignPointers) {
    ibvx_free_buf(nullptr);
    std::string foreign(64, 'x');
    ibvx_free_buf(foreign.data());
    EXPECT_EQ(foreign, std::string(64, 'x'));
    void *p = ibvx_alloc_buf(100);
    ASSERT_NE(p, nullptr);
    ibvx_free_buf(p);
    ibvx_free_buf(p);  // a second free is a no-op, not an munmap of whatever lives there now
}

}  // namespace
