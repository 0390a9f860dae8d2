// The mlx5dv -> queue_info translation, fed with crafted mlx5dv views (never dereferenced).
#include "providers/mlx5/translate.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdint>

namespace ibvx::mlx5 {
namespace {

void *at(uintptr_t a) {
    return reinterpret_cast<void *>(a);
}
uint64_t addr(const void *p) {
    return reinterpret_cast<uintptr_t>(p);
}

constexpr uintptr_t kQpBuf = 0x7f1200000000;
constexpr uintptr_t kUarPage = 0x7f3400005000;

// An RC QP as mlx5 lays it out: one buffer, RQ (64 x 64 B) first, the SQ (128 x 64 B) after.
struct QpFixture {
    __be32 dbrec[2] = {};
    mlx5dv_qp qp{};
    QpFixture() {
        qp.dbrec = dbrec;
        qp.rq.buf = at(kQpBuf);
        qp.rq.wqe_cnt = 64;
        qp.rq.stride = 64;
        qp.sq.buf = at(kQpBuf + 64 * 64);
        qp.sq.wqe_cnt = 128;
        qp.sq.stride = 64;
        qp.bf.reg = at(kUarPage + 0x800);
        qp.bf.size = 256;
    }
};

TEST(Mlx5TranslateQp, RingsRecordsAndDoorbellWindow) {
    QpFixture f;
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, false, &q), 0);

    EXPECT_EQ(q.sq.qbuf.base, kQpBuf + 4096);
    EXPECT_EQ(q.sq.qbuf.entry_cnt, 128u);
    EXPECT_EQ(q.sq.qbuf.entry_size, 64u);
    EXPECT_EQ(q.rq.qbuf.base, kQpBuf);
    EXPECT_EQ(q.rq.qbuf.entry_cnt, 64u);
    EXPECT_EQ(q.rq.qbuf.entry_size, 64u);

    // dbrec[0] = RQ counter, dbrec[1] = SQ counter, 4 bytes each; no consumer records.
    EXPECT_EQ(q.sq.dbr_pi_va.iov_base, &f.dbrec[MLX5_SND_DBR]);
    EXPECT_EQ(q.sq.dbr_pi_va.iov_len, 4u);
    EXPECT_EQ(q.rq.dbr_pi_va.iov_base, &f.dbrec[MLX5_RCV_DBR]);
    EXPECT_EQ(q.rq.dbr_pi_va.iov_len, 4u);
    EXPECT_EQ(q.sq.dbr_ci_va.iov_base, nullptr);
    EXPECT_EQ(q.rq.dbr_ci_va.iov_base, nullptr);

    // db_hw_va is only known after db_mmap; the window to map is the UAR page.
    EXPECT_EQ(q.sq.db_hw_va.iov_base, nullptr);
    EXPECT_EQ(q.rq.db_hw_va.iov_base, nullptr);
    ASSERT_TRUE(q.has_sq_doorbell);
    EXPECT_FALSE(q.blueflame);
    EXPECT_EQ(q.sq_doorbell.desc.type, uint32_t{DB_MAP_MODE_HOST_VA});
    EXPECT_EQ(q.sq_doorbell.desc.hva, kUarPage);
    EXPECT_EQ(q.sq_doorbell.desc.size, kUarPageSize);
    EXPECT_EQ(q.sq_doorbell.offset, 0x800u);
    EXPECT_EQ(q.sq_doorbell.length, kDoorbellWriteSize);
}

TEST(Mlx5TranslateQp, KeepsRqBeforeSqLayout) {
    QpFixture f;
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, false, &q), 0);
    // The SQ starts right after the RQ ring in the one QP buffer.
    EXPECT_EQ(q.sq.qbuf.base - q.rq.qbuf.base, uint64_t{q.rq.qbuf.entry_cnt} * q.rq.qbuf.entry_size);
}

TEST(Mlx5TranslateQp, DirectWqeUsesBlueFlameBufferWhenThereIsOne) {
    QpFixture f;
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, true, &q), 0);
    EXPECT_TRUE(q.blueflame);
    EXPECT_EQ(q.sq_doorbell.length, 256u);
    EXPECT_EQ(q.sq_doorbell.offset, 0x800u);

    f.qp.bf.size = 0;  // a doorbell-only register (uuar 0): no BlueFlame to write WQEs into
    ASSERT_EQ(translateQp(f.qp, true, &q), 0);
    EXPECT_FALSE(q.blueflame);
    EXPECT_EQ(q.sq_doorbell.length, kDoorbellWriteSize);
}

TEST(Mlx5TranslateQp, BlueFlameMappingCoversBothAlternatingHalves) {
    QpFixture f;
    f.qp.bf.reg = at(kUarPage + 0xe00);  // halves at 0xe00 and 0xf00: one page
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, true, &q), 0);
    EXPECT_EQ(q.sq_doorbell.desc.size, kUarPageSize);
    EXPECT_EQ(q.sq_doorbell.length, 256u);

    f.qp.bf.reg = at(kUarPage + 0xf00);  // the second half is on the next page: map both
    ASSERT_EQ(translateQp(f.qp, true, &q), 0);
    EXPECT_EQ(q.sq_doorbell.desc.hva, kUarPage);
    EXPECT_EQ(q.sq_doorbell.desc.size, 2 * kUarPageSize);
    EXPECT_EQ(q.sq_doorbell.offset, 0xf00u);
    EXPECT_EQ(q.sq_doorbell.length, 256u);

    ASSERT_EQ(translateQp(f.qp, false, &q), 0);  // doorbell-only: 8 bytes, one page
    EXPECT_EQ(q.sq_doorbell.desc.size, kUarPageSize);
}

TEST(Mlx5TranslateQp, QpWithoutRqOrSq) {
    QpFixture f;
    f.qp.rq.wqe_cnt = 0;  // receives through an SRQ
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, false, &q), 0);
    EXPECT_EQ(q.rq.qbuf.base, 0u);
    EXPECT_EQ(q.rq.qbuf.entry_cnt, 0u);
    EXPECT_EQ(q.rq.dbr_pi_va.iov_base, nullptr);
    EXPECT_EQ(q.sq.qbuf.entry_cnt, 128u);

    QpFixture g;
    g.qp.sq.wqe_cnt = 0;
    g.qp.bf.reg = nullptr;
    ASSERT_EQ(translateQp(g.qp, false, &q), 0);
    EXPECT_FALSE(q.has_sq_doorbell);
    EXPECT_EQ(q.sq.dbr_pi_va.iov_base, nullptr);
    EXPECT_EQ(q.rq.qbuf.entry_cnt, 64u);
}

TEST(Mlx5TranslateQp, WraparoundRelevantSizesSurviveUntruncated) {
    QpFixture f;
    // 2^31 entries of 4 KiB: the ring size (8 TiB) overflows 32 bits, not the translation.
    f.qp.rq.wqe_cnt = 0;
    f.qp.sq.wqe_cnt = 1u << 31;
    f.qp.sq.stride = 4096;
    QpQueues q{};
    ASSERT_EQ(translateQp(f.qp, false, &q), 0);
    EXPECT_EQ(q.sq.qbuf.entry_cnt, 1u << 31);
    EXPECT_EQ(q.sq.qbuf.entry_size, 4096u);

    f.qp.sq.wqe_cnt = 1;  // a one-entry ring still wraps with cnt - 1 == 0
    ASSERT_EQ(translateQp(f.qp, false, &q), 0);
    EXPECT_EQ(q.sq.qbuf.entry_cnt, 1u);
}

TEST(Mlx5TranslateQp, RejectsInconsistentViews) {
    QpQueues q{};
    {
        QpFixture f;
        f.qp.sq.wqe_cnt = 100;  // device code could not wrap with a mask
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.sq.stride = 32;  // below the 64-byte send WQE basic block
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.rq.stride = 48;  // not a power of two
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.sq.buf = at(kQpBuf + 64 * 63);  // SQ starting inside the RQ
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.dbrec = nullptr;
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.sq.buf = nullptr;
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.bf.reg = nullptr;  // an SQ with no register to ring
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    {
        QpFixture f;
        f.qp.rq.wqe_cnt = 0;
        f.qp.sq.buf = at(UINTPTR_MAX - 4095);  // the ring would wrap the address space
        EXPECT_EQ(translateQp(f.qp, false, &q), -EINVAL);
    }
    QpFixture f;
    EXPECT_EQ(translateQp(f.qp, false, nullptr), -EINVAL);
}

TEST(Mlx5TranslateCq, RingConsumerRecordAndArmDoorbell) {
    __be32 dbrec[2] = {};
    mlx5dv_cq cq{};
    cq.buf = at(0x7f5600000000);
    cq.dbrec = dbrec;
    cq.cqe_cnt = 256;
    cq.cqe_size = 64;
    cq.cq_uar = at(kUarPage);
    CqQueue out{};
    ASSERT_EQ(translateCq(cq, &out), 0);
    EXPECT_EQ(out.cq.qbuf.base, 0x7f5600000000u);
    EXPECT_EQ(out.cq.qbuf.entry_cnt, 256u);
    EXPECT_EQ(out.cq.qbuf.entry_size, 64u);
    // dbrec[0] is the consumer index software writes; dbrec[1] (arm) is not an index.
    EXPECT_EQ(out.cq.dbr_ci_va.iov_base, &dbrec[0]);
    EXPECT_EQ(out.cq.dbr_ci_va.iov_len, 4u);
    EXPECT_EQ(out.cq.dbr_pi_va.iov_base, nullptr);
    EXPECT_EQ(out.arm_doorbell.desc.hva, kUarPage);
    EXPECT_EQ(out.arm_doorbell.desc.size, kUarPageSize);
    EXPECT_EQ(out.arm_doorbell.offset, uint64_t{MLX5_CQ_DOORBELL});
    EXPECT_EQ(out.arm_doorbell.length, 8u);

    cq.cqe_size = 128;
    cq.cq_uar = at(kUarPage + 0x800);
    ASSERT_EQ(translateCq(cq, &out), 0);
    EXPECT_EQ(out.cq.qbuf.entry_size, 128u);
    EXPECT_EQ(out.arm_doorbell.offset, 0x800u + MLX5_CQ_DOORBELL);
}

TEST(Mlx5TranslateCq, RejectsInconsistentViews) {
    __be32 dbrec[2] = {};
    mlx5dv_cq good{};
    good.buf = at(0x7f5600000000);
    good.dbrec = dbrec;
    good.cqe_cnt = 256;
    good.cqe_size = 64;
    good.cq_uar = at(kUarPage);
    CqQueue out{};
    mlx5dv_cq cq = good;
    cq.cqe_size = 32;
    EXPECT_EQ(translateCq(cq, &out), -EINVAL);
    cq = good;
    cq.cqe_cnt = 100;
    EXPECT_EQ(translateCq(cq, &out), -EINVAL);
    cq = good;
    cq.cqe_cnt = 0;
    EXPECT_EQ(translateCq(cq, &out), -EINVAL);
    cq = good;
    cq.cq_uar = nullptr;
    EXPECT_EQ(translateCq(cq, &out), -EINVAL);
    cq = good;
    cq.dbrec = nullptr;
    EXPECT_EQ(translateCq(cq, &out), -EINVAL);
}

TEST(Mlx5TranslateSrq, DepthIsTailPlusOneAndRecordIsTheDoorbell) {
    __be32 dbrec[1] = {};
    mlx5dv_srq srq{};
    srq.buf = at(0x7f7800000000);
    srq.dbrec = dbrec;
    srq.stride = 64;
    srq.head = 0;
    srq.tail = 127;
    queue_info out{};
    ASSERT_EQ(translateSrq(srq, &out), 0);
    EXPECT_EQ(out.qbuf.base, 0x7f7800000000u);
    EXPECT_EQ(out.qbuf.entry_cnt, 128u);
    EXPECT_EQ(out.qbuf.entry_size, 64u);
    EXPECT_EQ(out.dbr_pi_va.iov_base, &dbrec[0]);
    EXPECT_EQ(out.dbr_pi_va.iov_len, 4u);
    EXPECT_EQ(out.dbr_ci_va.iov_base, nullptr);
    EXPECT_EQ(out.db_hw_va.iov_base, nullptr);

    mlx5dv_srq bad = srq;
    bad.tail = UINT32_MAX;  // tail + 1 would wrap to 0
    EXPECT_EQ(translateSrq(bad, &out), -EINVAL);
    bad = srq;
    bad.tail = 99;
    EXPECT_EQ(translateSrq(bad, &out), -EINVAL);
    bad = srq;
    bad.stride = 16;  // smaller than next segment + one scatter entry
    EXPECT_EQ(translateSrq(bad, &out), -EINVAL);
}

TEST(Mlx5Translate, MappedRegisterAddsTheInPageOffset) {
    DoorbellWindow w = doorbellWindow(at(kUarPage + 0x900), 256);
    char page[2 * 4096];
    iov_addr_desc db = mappedRegister(page, w);
    EXPECT_EQ(db.iov_base, page + 0x900);
    EXPECT_EQ(db.iov_len, 256u);
    EXPECT_EQ(addr(db.iov_base) - addr(page), w.offset);
}

}  // namespace
}  // namespace ibvx::mlx5
