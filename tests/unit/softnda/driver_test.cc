// The extension driver and the virtual-device verbs: configuration, limits, queue_info, memory
// through ibv_extend_ops, doorbell mapping, failure injection, churn, extended attributes.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "providers/softnda/src/softnda_internal.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

TEST(SoftndaConfig, DevicesAndOptions) {
    resetConfig();
    ibv_extend_vdev_attr attrs[4];
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 4), 1);
    EXPECT_STREQ(attrs[0].name, "softnda0");
    EXPECT_EQ(attrs[0].phys_port_cnt, 1u);
    EXPECT_EQ(attrs[0].max_qp, 131072u);
    EXPECT_EQ(attrs[0].max_sge, 29u);
    ASSERT_EQ(softnda_vdev_ops.configure("devices", "3"), 0);
    ASSERT_EQ(softnda_vdev_ops.configure("max_qp", "7"), 0);
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 2), 3);  // more than max: the count
    EXPECT_STREQ(attrs[1].name, "softnda1");
    EXPECT_EQ(attrs[1].max_qp, 7u);
    EXPECT_EQ(softnda_vdev_ops.configure("no_such_key", "1"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "-1"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "0"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_sge", "30"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("engine_threads", "two"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure(nullptr, "1"), -EINVAL);
    ibv_context *c = softnda_vdev_ops.open_device("softnda2");
    ASSERT_NE(c, nullptr);
    EXPECT_NE(softnda_vdev_ops.is_own_device(c->device), 0);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "8"), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.close_device(c), 0);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.open_device("softnda3"), nullptr);
    EXPECT_EQ(errno, ENODEV);
    resetConfig();
}

// With a device open, a valid option is -EBUSY (not applied now), but an unknown key or a bad
// value is still -EINVAL: the broker turns that into a configuration error on a reload, where
// -EBUSY would only be a warning.
TEST(SoftndaConfig, BadOptionsAreRefusedWhileDevicesAreOpen) {
    resetConfig();
    ibv_context *c = softnda_vdev_ops.open_device("softnda0");
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(softnda_vdev_ops.configure("names", "nosuch"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "0"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "lots"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("max_qp", "8"), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.close_device(c), 0);
    // Nothing of the refused or busy calls was kept.
    ibv_extend_vdev_attr attrs[1];
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 1), 1);
    EXPECT_EQ(attrs[0].max_qp, 131072u);
    resetConfig();
}

TEST(SoftndaConfig, EnvironmentVariables) {
    softnda::Config cfg;
    setenv("SOFTNDA_MAX_QP", "12", 1);
    setenv("SOFTNDA_ENGINE_THREADS", "3", 1);
    setenv("SOFTNDA_MAX_CQE", "garbage", 1);  // ignored, not fatal
    softnda::configFromEnv(cfg);
    unsetenv("SOFTNDA_MAX_QP");
    unsetenv("SOFTNDA_ENGINE_THREADS");
    unsetenv("SOFTNDA_MAX_CQE");
    EXPECT_EQ(cfg.max_qp, 12u);
    EXPECT_EQ(cfg.engine_threads, 3u);
    EXPECT_EQ(cfg.max_cqe, softnda::Config{}.max_cqe);
}

TEST(SoftndaConfig, ForeignObjectsAreRefused) {
    ibv_context fake{};
    ibv_device fake_dev{};
    fake.device = &fake_dev;
    EXPECT_EQ(softnda_driver_ops.alloc_context(&fake), nullptr);
    EXPECT_EQ(softnda_vdev_ops.is_own_device(&fake_dev), 0);
    EXPECT_EQ(softnda_vdev_ops.is_own_device(nullptr), 0);
    EXPECT_EQ(softnda_vdev_ops.close_device(&fake), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.alloc_pd(&fake), nullptr);
    int fd = -1;
    uint64_t off = 0;
    int local = 0;
    EXPECT_EQ(softnda_vdev_ops.export_mmio(&local, &fd, &off), -ENOENT);
    errno = 0;
    EXPECT_EQ(softnda_ub_resolve(1, 2, 1, 0), nullptr);
    EXPECT_EQ(errno, ENODEV);
    EXPECT_STREQ(softnda_vdev_ops.provider, softnda_driver_ops.name);
    EXPECT_EQ(softnda_vdev_ops.abi, static_cast<uint32_t>(IBV_EXTEND_VDEV_ABI_V10));
}

class Driver : public SoftndaTest {};

TEST_F(Driver, QueryDeviceReportsNdrAndNda) {
    EXPECT_EQ(ext_->ops->version, IBV_EXTEND_DRIVER_VERSION_V3);
    ibv_device_attr_extend a{};
    ASSERT_EQ(ext_->ops->query_device(ctx_, &a), 0);
    EXPECT_EQ(a.ext_cap, static_cast<uint32_t>(IBV_EXTEND_DEV_NDR | IBV_EXTEND_DEV_NDA));
    EXPECT_EQ(ext_->ops->query_device(ctx_, nullptr), -EINVAL);
}

// SPEC.md §8: a non-zero identity that names no real vendor, and GUIDs unique per device and
// host (the host's 24 bits sit between the vendor ID and the device index).
TEST(SoftndaIdentity, DevicesReportVendorPartRevisionAndTheirOwnGuids) {
    resetConfig();
    ASSERT_EQ(softnda_vdev_ops.configure("devices", "2"), 0);
    ibv_device_attr attr[2]{};
    for (int i = 0; i < 2; ++i) {
        ibv_context *c = softnda_vdev_ops.open_device(i == 0 ? "softnda0" : "softnda1");
        ASSERT_NE(c, nullptr);
        ASSERT_EQ(softnda_vdev_ops.query_device(c, &attr[i]), 0);
        EXPECT_EQ(softnda_vdev_ops.close_device(c), 0);
        EXPECT_EQ(attr[i].vendor_id, 0x02a0c0u);
        EXPECT_EQ(attr[i].vendor_id & 0x020000u, 0x020000u) << "the locally administered bit";
        EXPECT_NE(attr[i].vendor_part_id, 0u);
        EXPECT_NE(attr[i].hw_ver, 0u);
        EXPECT_STREQ(attr[i].fw_ver, "1.0.0");
        const uint64_t guid = be64toh(attr[i].node_guid);
        EXPECT_EQ(guid, softnda::deviceGuid(static_cast<uint32_t>(i)));
        EXPECT_EQ(guid >> 40, 0x02a0c0u);
        EXPECT_EQ((guid >> 16) & 0xffffff, softnda::hostGuidBits());
        EXPECT_EQ(guid & 0xff, 0u) << "the byte port GUIDs fill";
        EXPECT_EQ(attr[i].sys_image_guid, attr[i].node_guid);
    }
    EXPECT_NE(attr[0].node_guid, attr[1].node_guid);
    resetConfig();
}

TEST_F(Driver, QueueInfoDescribesTheRings) {
    CqH cq = makeCq(100);
    QpCaps caps;
    caps.send_wr = 100;
    caps.recv_wr = 5;
    caps.send_sge = 2;
    caps.recv_sge = 3;
    caps.inline_data = 100;
    auto attr = qpAttr(cq, cq, caps);
    ibv_qp_extend *qp = ext_->ops->create_qp(ctx_, &attr);
    ASSERT_NE(qp, nullptr);
    qps_.push_back(qp);
    EXPECT_EQ(cq.ext->cq_info.qbuf.entry_cnt, 128u);
    EXPECT_EQ(cq.ext->cq_info.qbuf.entry_size, 32u);
    EXPECT_EQ(cq.ext->cq->cqe, 128);
    const queue_info &sq = qp->sq_info;
    EXPECT_EQ(sq.qbuf.entry_cnt, 128u);
    EXPECT_EQ(sq.qbuf.entry_size, 256u);  // 48 + max(2*16, 100) -> 256
    EXPECT_EQ(qp->rq_info.qbuf.entry_cnt, 8u);
    EXPECT_EQ(qp->rq_info.qbuf.entry_size, 64u);  // 16 * (1 + 3) -> 64
    // The record follows the ring, PI and CI a cache line apart.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(sq.dbr_pi_va.iov_base), sq.qbuf.base + 128u * 256u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(sq.dbr_ci_va.iov_base) -
                  reinterpret_cast<uintptr_t>(sq.dbr_pi_va.iov_base),
              64u);
    EXPECT_EQ(sq.db_hw_va.iov_len, 8u);
    // Caps written back: what the QP really has.
    EXPECT_EQ(attr.attr.cap.max_send_wr, 128u);
    EXPECT_EQ(attr.attr.cap.max_recv_wr, 8u);
    EXPECT_EQ(attr.attr.cap.max_inline_data, 208u);
    EXPECT_EQ(attr.attr.cap.max_recv_sge, 3u);
    EXPECT_GT(qp->qp->qp_num, 0u);
    EXPECT_EQ(qp->qp->qp_type, IBV_QPT_RC);
    EXPECT_EQ(qp->qp->state, IBV_QPS_RESET);
    // Doorbells were mapped through the caller's db_mmap, at the caller's address.
    EXPECT_GE(arena().dbMmapCalls(), 3u);
    EXPECT_GE(arena().memsetCalls(), 3u);
    int fd = -1;
    uint64_t off = 0;
    EXPECT_EQ(softnda_vdev_ops.export_mmio(sq.db_hw_va.iov_base, &fd, &off),
              -ENOENT);  // the caller's own mapping
}

// A context's doorbell pages are 4 KiB, but each is mapped at its own file offset: that offset
// must be a multiple of the system page size or mmap fails (a 64 KiB page system took only the
// first page, 64 queues a context). Under qemu-user `-p 65536` (the page64k tests) this reads 64 KiB.
TEST_F(Driver, DoorbellPagesSitAtPageAlignedFileOffsets) {
    const uint64_t page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(softnda::dbPageStride(), std::max<uint64_t>(SOFTNDA_DB_PAGE_SIZE, page_size));
    // One register a CQ: 70 CQs need a second doorbell page.
    for (int i = 0; i < 70; ++i) {
        auto a = cqAttr(8, QU_BUF_DMA_MODE_INDEP_UB);
        ibv_cq_extend *cq = ext_->ops->create_cq(ctx_, &a);
        ASSERT_NE(cq, nullptr) << "CQ " << i;
        cqs_.push_back(cq);
    }
    int pages = 0;
    for (uint64_t page = 0; page < 8; ++page) {
        void *host = softnda_ub_resolve(softnda::deviceGuid(0), softnda::kGuidHigh, 1, page * 4096 + 512);
        if (host == nullptr) {
            continue;
        }
        ++pages;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(host) % page_size, 512u) << "doorbell page " << page;
        int fd = -1;
        uint64_t off = 0;
        ASSERT_EQ(softnda_vdev_ops.export_mmio(host, &fd, &off), 0);
        EXPECT_EQ(off % page_size, 0u) << "doorbell page " << page << " at file offset " << off;
        void *m = mmap(nullptr, SOFTNDA_DB_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       static_cast<off_t>(off));
        close(fd);
        ASSERT_NE(m, MAP_FAILED);
        munmap(m, SOFTNDA_DB_PAGE_SIZE);
    }
    EXPECT_GE(pages, 2);
}

TEST_F(Driver, ExportMmioSharesTheDoorbellPage) {
    makeCq();
    // The engine-side register is the desc hva the driver passed to db_mmap; find it through
    // softnda_ub_resolve on a UB-mode CQ instead, which names the page by device offset.
    auto a = cqAttr(8, QU_BUF_DMA_MODE_INDEP_UB);
    ibv_cq_extend *ub = ext_->ops->create_cq(ctx_, &a);
    ASSERT_NE(ub, nullptr);
    cqs_.push_back(ub);
    softnda_doorbell db{};
    ASSERT_EQ(softnda_doorbell_init(&db, &ub->cq_info.db_hw_va), 0);
    // Store through the caller's mapping; read through a fresh mapping of the exported page.
    __atomic_store_n(db.reg, 0x5eed, __ATOMIC_RELEASE);
    bool found = false;
    for (uint64_t page = 0; page < 8 && !found; ++page) {
        for (unsigned i = 0; i < 64; ++i) {
            void *host =
                softnda_ub_resolve(softnda::deviceGuid(0), softnda::kGuidHigh, 1, page * 4096 + 512 + 8 * i);
            if (host == nullptr || *static_cast<uint32_t *>(host) != 0x5eed) {
                continue;
            }
            int fd = -1;
            uint64_t off = 0;
            ASSERT_EQ(softnda_vdev_ops.export_mmio(host, &fd, &off), 0);
            void *m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(off));
            close(fd);
            ASSERT_NE(m, MAP_FAILED);
            EXPECT_EQ(*reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(m) + 512 + 8 * i), 0x5eedu);
            munmap(m, 4096);
            found = true;
            break;
        }
    }
    EXPECT_TRUE(found);
    errno = 0;
    EXPECT_EQ(softnda_ub_resolve(softnda::deviceGuid(0), softnda::kGuidHigh, 1, 1ull << 31), nullptr);
    EXPECT_EQ(errno, ERANGE);
}

TEST_F(Driver, UbModeQueuesCarryData) {
    auto ca = cqAttr(64, QU_BUF_DMA_MODE_INDEP_UB);
    ibv_cq_extend *cqe = ext_->ops->create_cq(ctx_, &ca);
    ASSERT_NE(cqe, nullptr);
    cqs_.push_back(cqe);
    CqH cq;
    cq.ext = cqe;
    ASSERT_EQ(softnda_cq_init(&cq.cq, &cqe->cq_info), 0);
    auto qa = qpAttr(cq, cq);
    qa.type = QU_BUF_DMA_MODE_INDEP_UB;
    QpH a, b;
    a.ext = ext_->ops->create_qp(ctx_, &qa);
    ASSERT_NE(a.ext, nullptr);
    qps_.push_back(a.ext);
    b.ext = ext_->ops->create_qp(ctx_, &qa);
    ASSERT_NE(b.ext, nullptr);
    qps_.push_back(b.ext);
    ASSERT_EQ(softnda_sq_init(&a.sq, &a.ext->sq_info), 0);
    connect(a, b);
    uint64_t v = 77, d = 0;
    softnda_sge s;
    softnda_send_wr w = write8(&v, &d, &s);
    ASSERT_EQ(postOne(a, w), 0);
    EXPECT_EQ(waitOne(cq.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(d, 77u);
}

TEST_F(Driver, SrqInitialLimitIsWrittenHostToDevice) {
    size_t before = arena().memcpyCalls(MEMCPY_DIR_HOST_TO_DEVICE);
    SrqH s = makeSrq(10, 2, 3);
    EXPECT_EQ(arena().memcpyCalls(MEMCPY_DIR_HOST_TO_DEVICE), before + 1);
    EXPECT_EQ(softnda_srq_limit(&s.rq), 3u);
    EXPECT_EQ(s.ext->srq_info.qbuf.entry_cnt, 16u);
    EXPECT_EQ(arena().memcpyCalls(MEMCPY_DIR_HOST_TO_HOST), 0u);
    EXPECT_EQ(arena().memcpyCalls(MEMCPY_DIR_DEVICE_TO_HOST), 0u);
}

TEST_F(Driver, BadArgumentsAreRefused) {
    CqH cq = makeCq();
    auto a = qpAttr(cq, cq);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    a.attr.qp_type = IBV_QPT_RAW_PACKET;  // RC, UC, UD and XRC are served (SPEC.md §11, "XRC")
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    a.attr.qp_type = IBV_QPT_XRC_RECV;  // a target needs its domain: create_xrc_tgt_qp
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
    a = qpAttr(cq, cq);
    a.ops = nullptr;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    a = qpAttr(cq, cq);
    ibv_extend_ops partial = *arena().ops();
    partial.db_unmap = nullptr;
    a.ops = &partial;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    a = qpAttr(cq, cq);
    a.attr.cap.max_send_wr = 32769;
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
    a = qpAttr(cq, cq);
    a.attr.cap.max_send_sge = 30;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    a = qpAttr(cq, cq);
    a.pd = nullptr;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &a), nullptr);
    auto c = cqAttr(0);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &c), nullptr);
    EXPECT_EQ(errno, EINVAL);
    c = cqAttr(4194305);
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &c), nullptr);
    EXPECT_EQ(ext_->ops->destroy_qp(nullptr), -EINVAL);
    EXPECT_EQ(ext_->ops->destroy_cq(nullptr), -EINVAL);
    EXPECT_EQ(ext_->ops->destroy_srq(nullptr), -EINVAL);
    EXPECT_EQ(arena().liveAllocs(), base_allocs_ + 1);  // only the CQ
}

TEST_F(Driver, BusyObjectsCannotGoAway) {
    CqH cq = makeCq();
    SrqH srq = makeSrq(8);
    QpH q = makeQp(cq, cq, QpCaps{}, srq.ext);
    EXPECT_EQ(ext_->ops->destroy_cq(cq.ext), -EBUSY);
    EXPECT_EQ(ext_->ops->destroy_srq(srq.ext), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd_), -EBUSY);
    EXPECT_EQ(softnda_vdev_ops.close_device(ctx_), -EBUSY);
    EXPECT_EQ(q.ext->rq_info.qbuf.base, 0u);  // SRQ: no RQ
}

TEST_F(Driver, RegMrValidation) {
    std::vector<uint8_t> buf(4096);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, buf.data(), 4096, 0, IBV_ACCESS_REMOTE_WRITE), nullptr);
    EXPECT_EQ(errno, EINVAL);  // remote write needs local write
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, buf.data(), 0, 0, 0), nullptr);
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, nullptr, 8, 0, 0), nullptr);
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, buf.data(), 8, 0, IBV_ACCESS_ZERO_BASED),
              nullptr);  // unsupported flag
    void *hole = mmap(nullptr, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(hole, MAP_FAILED);
    munmap(hole, 8192);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, hole, 8192, 0, 0), nullptr);
    EXPECT_EQ(errno, EFAULT);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(nullptr), -EINVAL);
}

// The big extended attributes live apart from the QP until set: unset they read as zeros (not
// stale memory), and a move to RESET zeroes them again, as it does the standard attributes.
TEST_F(Driver, ExtendedAttributesReadZeroUntilSetAndAfterReset) {
    CqH cq = makeCq();
    QpH q = makeQp(cq, cq);
    constexpr int kBig = IBV_QP_ATTR_EXTEND_HYROCE_FEATURE | IBV_QP_ATTR_EXTEND_MPATH_CONFIG |
                         IBV_QP_ATTR_EXTEND_AR_CONFIG | IBV_QP_ATTR_EXTEND_SACK_CONFIG;
    auto queryZeroed = [&] {
        ibv_qp_attr_extend out;
        std::memset(&out, 0xa5, sizeof(out));
        out.qp = q.ext->qp;
        EXPECT_EQ(ext_->ops->query_qp(ctx_, &out, kBig), 0);
        ibv_qp_attr_extend zero{};
        EXPECT_EQ(std::memcmp(&out.feature, &zero.feature, sizeof(zero.feature)), 0);
        EXPECT_EQ(std::memcmp(&out.mpath, &zero.mpath, sizeof(zero.mpath)), 0);
        EXPECT_EQ(std::memcmp(&out.ar, &zero.ar, sizeof(zero.ar)), 0);
        EXPECT_EQ(std::memcmp(&out.sack, &zero.sack, sizeof(zero.sack)), 0);
    };
    auto negotiatedVersion = [&] {
        ibv_hyroce_feature peer{}, out{};
        uint32_t more = 0;
        peer.type = IBV_HYPER_FEAT_HYPER_ROCE;
        peer.version = IBV_HYPER_FEAT_V3;
        EXPECT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, &peer, &out, &more), 0);
        return out.version;
    };
    queryZeroed();
    EXPECT_EQ(negotiatedVersion(), IBV_HYPER_FEAT_V2);  // the supported feature: none was set

    ibv_qp_attr_extend in{};
    in.qp = q.ext->qp;
    in.feature.type = IBV_HYPER_FEAT_HYPER_ROCE;
    in.feature.version = IBV_HYPER_FEAT_V1;
    ASSERT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_HYROCE_FEATURE), 0);
    EXPECT_EQ(negotiatedVersion(), IBV_HYPER_FEAT_V1);
    ibv_qp_attr_extend out{};
    out.qp = q.ext->qp;
    out.mpath.path_num = 99;
    ASSERT_EQ(ext_->ops->query_qp(ctx_, &out, kBig), 0);
    EXPECT_EQ(out.feature.version, IBV_HYPER_FEAT_V1);
    EXPECT_EQ(out.mpath.path_num, 0u);  // set apart from the feature, never written

    in.mpath.path_num = 4;
    in.sack.oor_range = 10;
    ASSERT_EQ(
        ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_MPATH_CONFIG | IBV_QP_ATTR_EXTEND_SACK_CONFIG), 0);
    ASSERT_EQ(toInit(q.ext->qp, 0), 0);
    ibv_qp_attr reset{};
    reset.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(softnda_vdev_ops.modify_qp(q.ext->qp, &reset, IBV_QP_STATE), 0);
    queryZeroed();
    EXPECT_EQ(negotiatedVersion(), IBV_HYPER_FEAT_V2);
}

// db_unmap gets the very descriptor db_mmap got, in both mapping modes (softnda rebuilds it).
TEST_F(Driver, DoorbellUnmapGetsTheDescriptorOfItsMap) {
    struct Recorder {
        static std::vector<std::vector<uint8_t>> &mapped() {
            static std::vector<std::vector<uint8_t>> v;
            return v;
        }
        static std::vector<std::vector<uint8_t>> &unmapped() {
            static std::vector<std::vector<uint8_t>> v;
            return v;
        }
        static std::vector<uint8_t> bytes(const doorbell_map_desc *d) {
            auto *p = reinterpret_cast<const uint8_t *>(d);
            return {p, p + sizeof(*d)};
        }
        static void *dbMmap(doorbell_map_desc *d) {
            mapped().push_back(bytes(d));
            return MemfdArena::dbMmap(d);
        }
        static int dbUnmap(void *ptr, doorbell_map_desc *d) {
            unmapped().push_back(bytes(d));
            return MemfdArena::dbUnmap(ptr, d);
        }
    };
    static ibv_extend_ops ops = *arena().ops();
    ops.db_mmap = Recorder::dbMmap;
    ops.db_unmap = Recorder::dbUnmap;
    CqH cq = makeCq();
    for (queue_buf_dma_mode mode : {QU_BUF_DMA_MODE_DEFAULT, QU_BUF_DMA_MODE_INDEP_UB}) {
        Recorder::mapped().clear();
        Recorder::unmapped().clear();
        auto a = qpAttr(cq, cq);
        a.type = mode;
        a.ops = &ops;
        ibv_qp_extend *qp = ext_->ops->create_qp(ctx_, &a);
        ASSERT_NE(qp, nullptr);
        ASSERT_EQ(Recorder::mapped().size(), 2u);  // SQ and RQ doorbells
        ASSERT_EQ(ext_->ops->destroy_qp(qp), 0);
        ASSERT_EQ(Recorder::unmapped().size(), 2u);
        // Released RQ first, then SQ.
        EXPECT_EQ(Recorder::unmapped()[0], Recorder::mapped()[1]);
        EXPECT_EQ(Recorder::unmapped()[1], Recorder::mapped()[0]);
        doorbell_map_desc first;
        std::memcpy(&first, Recorder::mapped()[0].data(), sizeof(first));
        EXPECT_EQ(first.type, mode == QU_BUF_DMA_MODE_INDEP_UB ? uint32_t{DB_MAP_MODE_UB_RES}
                                                               : uint32_t{DB_MAP_MODE_HOST_VA});
        EXPECT_EQ(first.size, uint64_t{SOFTNDA_DB_REG_STRIDE});
    }
}

TEST_F(Driver, ExtendedAttributesAreStoredAndReturned) {
    CqH cq = makeCq();
    QpH q = makeQp(cq, cq);
    ibv_qp_attr_extend in{};
    in.qp = q.ext->qp;
    in.udp_src_port = 49200;
    in.feature.type = IBV_HYPER_FEAT_HYPER_ROCE;
    in.feature.version = IBV_HYPER_FEAT_V1;
    in.feature.sack_enable = 1;
    in.lb_mode = IBV_LB_MODE_MPATH;
    in.mpath.path_num = 4;
    in.mpath.interval = 2;
    in.ar.port_rr_enable = 1;
    in.sack.srp_range = 9;
    in.sack.oor_range = 10;
    in.lag_port = 1;
    ASSERT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_MAX - 1), 0);
    ibv_qp_attr_extend out{};
    out.qp = q.ext->qp;
    ASSERT_EQ(ext_->ops->query_qp(ctx_, &out, IBV_QP_ATTR_EXTEND_MAX - 1), 0);
    EXPECT_EQ(out.udp_src_port, 49200u);
    EXPECT_EQ(out.feature.version, IBV_HYPER_FEAT_V1);
    EXPECT_EQ(out.feature.sack_enable, 1);
    EXPECT_EQ(out.lb_mode, static_cast<uint32_t>(IBV_LB_MODE_MPATH));
    EXPECT_EQ(out.mpath.path_num, 4u);
    EXPECT_EQ(out.ar.port_rr_enable, 1u);
    EXPECT_EQ(out.sack.oor_range, 10u);
    EXPECT_EQ(out.lag_port, 1u);
    ibv_qp_attr_extend only_port{};
    only_port.qp = q.ext->qp;
    ASSERT_EQ(ext_->ops->query_qp(ctx_, &only_port, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), 0);
    EXPECT_EQ(only_port.lag_port, 0u);  // not asked for, not written
    in.udp_src_port = 70000;
    EXPECT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), -EINVAL);
    in.udp_src_port = 1;
    in.lag_port = 3;
    EXPECT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_LAG_PORT), -EINVAL);
    EXPECT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_MAX), -EINVAL);
    in.qp = nullptr;
    EXPECT_EQ(ext_->ops->modify_qp(ctx_, &in, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), -EINVAL);
}

TEST_F(Driver, HyroceFeatureNegotiationIsDeterministic) {
    CqH cq = makeCq();
    QpH q = makeQp(cq, cq);
    ibv_hyroce_feature f{};
    ASSERT_EQ(ext_->ops->query_qp_supported_hyroce_feature(ctx_, q.ext->qp, 0, 0, &f), 0);
    EXPECT_EQ(f.type, IBV_HYPER_FEAT_HYPER_ROCE);
    EXPECT_EQ(f.version, IBV_HYPER_FEAT_V2);
    EXPECT_EQ(f.sack_enable, 1);
    EXPECT_EQ(ext_->ops->query_qp_supported_hyroce_feature(ctx_, q.ext->qp, 8, 0, &f), -EINVAL);

    ibv_hyroce_feature peer{}, out{};
    uint32_t more = 9;
    peer.type = IBV_HYPER_FEAT_HYPER_ROCE;
    peer.version = IBV_HYPER_FEAT_V3;
    peer.sack_enable = 1;
    ASSERT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, &peer, &out, &more), 0);
    EXPECT_EQ(out.version, IBV_HYPER_FEAT_V2);  // min of V2 (ours) and V3
    EXPECT_EQ(out.sack_enable, 1);
    EXPECT_EQ(more, 1u);  // versions differed
    peer.version = IBV_HYPER_FEAT_V2;
    peer.sack_enable = 0;
    ASSERT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, &peer, &out, &more), 0);
    EXPECT_EQ(out.sack_enable, 0);  // both must enable
    EXPECT_EQ(more, 0u);
    peer.version = IBV_HYPER_FEAT_V0;
    peer.sack_enable = 1;
    ASSERT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, &peer, &out, &more), 0);
    EXPECT_EQ(out.type, IBV_HYPER_FEAT_RoCEv2);
    EXPECT_EQ(out.sack_enable, 0);
    peer.version = 9;
    EXPECT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, &peer, &out, &more), -EINVAL);
    EXPECT_EQ(ext_->ops->nego_qp_hyroce_feature(ctx_, q.ext->qp, nullptr, &out, &more), -EINVAL);
}

TEST_F(Driver, CreateDestroyChurnReturnsAllMemory) {
    size_t base = arena().liveAllocs();
    size_t base_bytes = arena().liveBytes();
    for (int i = 0; i < 200; ++i) {
        auto ca = cqAttr(16);
        ibv_cq_extend *cq = ext_->ops->create_cq(ctx_, &ca);
        ASSERT_NE(cq, nullptr);
        ibv_srq_init_attr_extend sa{};
        sa.pd = pd_;
        sa.attr.attr.max_wr = 8;
        sa.attr.attr.max_sge = 1;
        sa.ops = arena().ops();
        ibv_srq_extend *srq = ext_->ops->create_srq(ctx_, &sa);
        ASSERT_NE(srq, nullptr);
        CqH h;
        h.ext = cq;
        auto qa = qpAttr(h, h, QpCaps{}, i % 2 == 0 ? srq : nullptr);
        ibv_qp_extend *qp = ext_->ops->create_qp(ctx_, &qa);
        ASSERT_NE(qp, nullptr);
        ASSERT_EQ(ext_->ops->destroy_qp(qp), 0);
        ASSERT_EQ(ext_->ops->destroy_srq(srq), 0);
        ASSERT_EQ(ext_->ops->destroy_cq(cq), 0);
    }
    EXPECT_EQ(arena().liveAllocs(), base);
    EXPECT_EQ(arena().liveBytes(), base_bytes);
    EXPECT_EQ(arena().liveDbMappings(), 0u);
}

TEST_F(Driver, AllocFailureAtEveryStepLeavesNothingBehind) {
    CqH cq = makeCq();
    size_t base = arena().liveAllocs();
    size_t maps = arena().liveDbMappings();
    for (int k = 1; k <= 2; ++k) {  // SQ ring, RQ ring
        arena().failAllocAt(k);
        auto qa = qpAttr(cq, cq);
        errno = 0;
        EXPECT_EQ(ext_->ops->create_qp(ctx_, &qa), nullptr) << k;
        EXPECT_EQ(errno, ENOMEM);
        EXPECT_EQ(arena().liveAllocs(), base) << k;
        EXPECT_EQ(arena().liveDbMappings(), maps) << k;
    }
    arena().failAllocAt(1);
    auto ca = cqAttr(8);
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &ca), nullptr);
    arena().failAllocAt(1);
    ibv_srq_init_attr_extend sa{};
    sa.pd = pd_;
    sa.attr.attr.max_wr = 8;
    sa.attr.attr.max_sge = 1;
    sa.ops = arena().ops();
    EXPECT_EQ(ext_->ops->create_srq(ctx_, &sa), nullptr);
    EXPECT_EQ(arena().liveAllocs(), base);
    arena().failAllocAt(0);
    QpH ok = makeQp(cq, cq);  // and it still works
    EXPECT_NE(ok.ext, nullptr);
}

TEST_F(Driver, DbMmapFailureAtEveryStepLeavesNothingBehind) {
    CqH cq = makeCq();
    size_t base = arena().liveAllocs();
    size_t maps = arena().liveDbMappings();
    for (int k = 1; k <= 2; ++k) {  // SQ doorbell, RQ doorbell
        arena().failDbMmapAt(k);
        auto qa = qpAttr(cq, cq);
        errno = 0;
        EXPECT_EQ(ext_->ops->create_qp(ctx_, &qa), nullptr) << k;
        EXPECT_EQ(errno, EIO);
        EXPECT_EQ(arena().liveAllocs(), base) << k;
        EXPECT_EQ(arena().liveDbMappings(), maps) << k;
    }
    arena().failDbMmapAt(1);
    auto ca = cqAttr(8);
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &ca), nullptr);
    EXPECT_EQ(arena().liveAllocs(), base);
    arena().failDbMmapAt(0);
    QpH ok = makeQp(cq, cq);
    EXPECT_NE(ok.ext, nullptr);
}

class Limits : public SoftndaTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"max_qp", "2"}, {"max_cq", "2"},     {"max_srq", "1"},  {"max_mr", "2"},
                {"max_pd", "2"}, {"max_qp_wr", "16"}, {"max_cqe", "64"}, {"max_srq_wr", "8"}};
    }
};

TEST_F(Limits, BeyondEachLimitFailsCleanly) {
    CqH c1 = makeCq(64);
    CqH c2 = makeCq(8);
    auto ca = cqAttr(8);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &ca), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    QpCaps caps;
    caps.send_wr = 16;
    caps.recv_wr = 16;
    makeQp(c1, c2, caps);
    makeQp(c1, c2, caps);
    auto qa = qpAttr(c1, c2, caps);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &qa), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    makeSrq(8);
    ibv_srq_init_attr_extend sa{};
    sa.pd = pd_;
    sa.attr.attr.max_wr = 8;
    sa.attr.attr.max_sge = 1;
    sa.ops = arena().ops();
    errno = 0;
    EXPECT_EQ(ext_->ops->create_srq(ctx_, &sa), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    ibv_pd *p2 = softnda_vdev_ops.alloc_pd(ctx_);
    ASSERT_NE(p2, nullptr);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.alloc_pd(ctx_), nullptr);
    EXPECT_EQ(errno, ENOMEM);
    EXPECT_EQ(softnda_vdev_ops.dealloc_pd(p2), 0);
    uint64_t a = 0, b = 0, c = 0;
    reg(&a, 8);
    reg(&b, 8);
    errno = 0;
    EXPECT_EQ(softnda_vdev_ops.reg_mr(pd_, &c, 8, 0, 0), nullptr);
    EXPECT_EQ(errno, ENOMEM);
}

TEST_F(Limits, DepthsBeyondLimitsAreInvalid) {
    CqH c = makeCq(64);
    auto ca = cqAttr(65);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_cq(ctx_, &ca), nullptr);
    EXPECT_EQ(errno, EINVAL);
    QpCaps caps;
    caps.send_wr = 17;
    auto qa = qpAttr(c, c, caps);
    errno = 0;
    EXPECT_EQ(ext_->ops->create_qp(ctx_, &qa), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_srq_init_attr_extend sa{};
    sa.pd = pd_;
    sa.attr.attr.max_wr = 9;
    sa.attr.attr.max_sge = 1;
    sa.ops = arena().ops();
    errno = 0;
    EXPECT_EQ(ext_->ops->create_srq(ctx_, &sa), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

}  // namespace
}  // namespace softnda_test
