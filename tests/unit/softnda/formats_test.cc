// softnda_device.h against SPEC.md, without the engine: layouts at the documented offsets, and
// the helpers' ring, doorbell and phase-bit behaviour on plain memory laid out as the spec says.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "providers/softnda/include/softnda_device.h"

extern "C" int softnda_test_c_cqe_owner_offset(void);

namespace {

static_assert(offsetof(softnda_wqe, opcode) == 0);
static_assert(offsetof(softnda_wqe, flags) == 1);
static_assert(offsetof(softnda_wqe, num_sge) == 2);
static_assert(offsetof(softnda_wqe, tclass) == 3);
static_assert(offsetof(softnda_wqe, imm_data) == 4);
static_assert(offsetof(softnda_wqe, wr_id) == 8);
static_assert(offsetof(softnda_wqe, remote_addr) == 16);
static_assert(offsetof(softnda_wqe, rkey) == 24);
static_assert(offsetof(softnda_wqe, inline_len) == 28);
static_assert(offsetof(softnda_wqe, compare_add) == 32);
static_assert(offsetof(softnda_wqe, swap) == 40);
static_assert(sizeof(softnda_wqe) == 48);
static_assert(sizeof(softnda_sge) == 16 && offsetof(softnda_sge, length) == 8 &&
              offsetof(softnda_sge, lkey) == 12);
static_assert(offsetof(softnda_recv_wqe, num_sge) == 8 && sizeof(softnda_recv_wqe) == 16);
static_assert(offsetof(softnda_cqe, byte_len) == 8);
static_assert(offsetof(softnda_cqe, imm_data) == 12);
static_assert(offsetof(softnda_cqe, qp_num) == 16);
static_assert(offsetof(softnda_cqe, src_qp) == 20);
static_assert(offsetof(softnda_cqe, opcode) == 24);
static_assert(offsetof(softnda_cqe, status) == 25);
static_assert(offsetof(softnda_cqe, flags) == 26);
static_assert(offsetof(softnda_cqe, owner) == 28);
static_assert(sizeof(softnda_cqe) == 32);
static_assert(SOFTNDA_OP_ATOMIC_FETCH_AND_ADD == 7 && SOFTNDA_OP_RDMA_READ == 5);
// Status and opcode numbers are libibverbs' (SPEC.md §3, §6.1).
static_assert(IBV_WC_REM_ACCESS_ERR == 10 && IBV_WC_RNR_RETRY_EXC_ERR == 13 && IBV_WC_WR_FLUSH_ERR == 5);
static_assert(IBV_WC_RECV == 128 && IBV_WC_RECV_RDMA_WITH_IMM == 129);

TEST(SoftndaFormats, CAndCxxAgree) {
    EXPECT_EQ(softnda_test_c_cqe_owner_offset(), 28);
}

// Memory for one queue as SPEC.md §1 lays it out, plus a doorbell page.
struct FakeQueue {
    FakeQueue(uint32_t cnt, uint32_t stride) : mem(cnt * stride + 128 + 64), page(8192) {
        base = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(mem.data()) + 63) & ~uintptr_t{63});
        uint8_t *pg =
            reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(page.data()) + 4095) & ~uintptr_t{4095});
        std::memset(qi_bytes(), 0, sizeof(qi));
        qi.qbuf.base = reinterpret_cast<uintptr_t>(base);
        qi.qbuf.entry_cnt = cnt;
        qi.qbuf.entry_size = stride;
        qi.dbr_pi_va = iov_addr_desc{base + cnt * stride, 8};
        qi.dbr_ci_va = iov_addr_desc{base + cnt * stride + 64, 8};
        qi.db_hw_va = iov_addr_desc{pg + 512 + 8 * 5, 8};  // register 5
        db_page = pg;
    }
    void *qi_bytes() { return &qi; }
    uint32_t &pi() { return *static_cast<uint32_t *>(qi.dbr_pi_va.iov_base); }
    uint32_t &ci() { return *static_cast<uint32_t *>(qi.dbr_ci_va.iov_base); }
    std::vector<uint8_t> mem, page;
    uint8_t *base = nullptr;
    uint8_t *db_page = nullptr;
    queue_info qi{};
};

TEST(SoftndaFormats, SendPostWritesTheSpecLayoutAndRings) {
    FakeQueue q(4, 64);
    softnda_sq sq;
    ASSERT_EQ(softnda_sq_init(&sq, &q.qi), 0);
    EXPECT_EQ(sq.max_sge, 1u);
    EXPECT_EQ(sq.max_inline, 16u);
    softnda_sge s{0x1000, 77, 0xabcd};
    softnda_send_wr w{};
    w.opcode = SOFTNDA_OP_RDMA_WRITE;
    w.flags = SOFTNDA_WQE_SIGNALED;
    w.wr_id = 0x1122334455667788ull;
    w.remote_addr = 0x2000;
    w.rkey = 0x99;
    w.sg_list = &s;
    w.num_sge = 1;
    ASSERT_EQ(softnda_sq_post(&sq, &w), 0);
    EXPECT_EQ(q.pi(), 0u);  // not published before the doorbell
    softnda_sq_doorbell(&sq);
    EXPECT_EQ(q.pi(), 1u);
    EXPECT_EQ(*reinterpret_cast<uint32_t *>(q.db_page + 512 + 40), 1u);  // register 5 holds the PI
    EXPECT_EQ(*reinterpret_cast<uint64_t *>(q.db_page), 1ull << 5);      // summary bit 5
    const uint8_t *e = q.base;
    EXPECT_EQ(e[0], SOFTNDA_OP_RDMA_WRITE);
    EXPECT_EQ(e[1], SOFTNDA_WQE_SIGNALED);
    EXPECT_EQ(e[2], 1);
    uint64_t wr_id;
    std::memcpy(&wr_id, e + 8, 8);
    EXPECT_EQ(wr_id, 0x1122334455667788ull);
    softnda_sge got;
    std::memcpy(&got, e + 48, 16);
    EXPECT_EQ(got.addr, 0x1000u);
    EXPECT_EQ(got.lkey, 0xabcdu);
    // Too many SGEs or too much inline data for a 64 B WQE.
    softnda_sge two[2] = {s, s};
    w.sg_list = two;
    w.num_sge = 2;
    EXPECT_EQ(softnda_sq_post(&sq, &w), -EINVAL);
    char data[17] = {};
    w.inline_data = data;
    w.inline_len = 17;
    EXPECT_EQ(softnda_sq_post(&sq, &w), -EINVAL);
    w.inline_len = 16;
    ASSERT_EQ(softnda_sq_post(&sq, &w), 0);
    EXPECT_EQ(q.base[64 + 1], SOFTNDA_WQE_SIGNALED | SOFTNDA_WQE_INLINE);
    // Full at entry_cnt outstanding; space returns when the "engine" advances CI.
    w.inline_data = nullptr;
    w.num_sge = 1;
    w.sg_list = &s;
    ASSERT_EQ(softnda_sq_post(&sq, &w), 0);
    ASSERT_EQ(softnda_sq_post(&sq, &w), 0);
    EXPECT_EQ(softnda_sq_post(&sq, &w), -ENOSPC);
    q.ci() = 1;
    EXPECT_EQ(softnda_sq_post(&sq, &w), 0);  // slot 0 again (wrapped)
    EXPECT_EQ(sq.pi, 5u);
}

TEST(SoftndaFormats, CqPhaseBitAcrossWraps) {
    FakeQueue q(4, 32);
    softnda_cq cq;
    ASSERT_EQ(softnda_cq_init(&cq, &q.qi), 0);
    softnda_cqe out[4];
    EXPECT_EQ(softnda_cq_poll(&cq, out, 4), 0);  // zeroed memory is not a CQE
    // Play the engine for 3 passes over the ring (SPEC.md §3).
    for (uint32_t n = 0; n < 12; ++n) {
        auto *e = reinterpret_cast<softnda_cqe *>(q.base + (n & 3) * 32);
        e->wr_id = n;
        e->owner = ((n / 4) & 1) ^ 1;
        q.pi() = n + 1;
        ASSERT_EQ(softnda_cq_poll(&cq, out, 4), 1) << n;
        EXPECT_EQ(out[0].wr_id, n);
        EXPECT_EQ(q.ci(), n + 1);
        EXPECT_EQ(softnda_cq_poll(&cq, out, 4), 0);  // the stale entry of the last pass is not valid
    }
    *(static_cast<uint32_t *>(q.qi.dbr_pi_va.iov_base) + 1) = 1;  // state: overflow
    EXPECT_EQ(softnda_cq_poll(&cq, out, 4), -EOVERFLOW);
}

TEST(SoftndaFormats, RecvPostAndSrqWords) {
    FakeQueue q(2, 32);
    softnda_rq rq;
    ASSERT_EQ(softnda_rq_init(&rq, &q.qi), 0);
    EXPECT_EQ(rq.max_sge, 1u);
    softnda_sge s{1, 2, 3};
    ASSERT_EQ(softnda_rq_post(&rq, 7, &s, 1), 0);
    ASSERT_EQ(softnda_rq_post(&rq, 8, &s, 1), 0);
    EXPECT_EQ(softnda_rq_post(&rq, 9, &s, 1), -ENOSPC);
    softnda_sge two[2] = {s, s};
    EXPECT_EQ(softnda_rq_post(&rq, 9, two, 2), -EINVAL);
    softnda_rq_doorbell(&rq);
    EXPECT_EQ(q.pi(), 2u);
    uint64_t id;
    std::memcpy(&id, q.base + 32, 8);
    EXPECT_EQ(id, 8u);
    softnda_srq_arm(&rq, 5);
    EXPECT_EQ(*(static_cast<uint32_t *>(q.qi.dbr_pi_va.iov_base) + 1), 5u);
    *(static_cast<uint32_t *>(q.qi.dbr_ci_va.iov_base) + 1) = 3;
    EXPECT_EQ(softnda_srq_limit_events(&rq), 3u);
}

TEST(SoftndaFormats, InitRefusesIncompleteQueueInfo) {
    FakeQueue q(3, 64);  // not a power of two
    softnda_sq sq;
    EXPECT_EQ(softnda_sq_init(&sq, &q.qi), -EINVAL);
    FakeQueue r(4, 64);
    r.qi.db_hw_va.iov_base = r.db_page + 100;  // not a register
    EXPECT_EQ(softnda_sq_init(&sq, &r.qi), -EINVAL);
}

}  // namespace
