// softnda's standard-verbs data path (libsoftnda-verbs.so, include/ibv_extend_datapath.h) against
// the in-process engine: loaded with dlopen from the provider directory as the libibverbs face
// loads it, its states opened from the queues the driver made, ibv_send_wr / ibv_recv_wr posted
// and every ibv_wc field checked, with the data moved. Also run under ThreadSanitizer.
#include <arpa/inet.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <numeric>
#include <set>

#include <ibv_extend_datapath.h>

#include "providers/softnda/include/softnda_verbs.h"
#include "providers/softnda/src/softnda_internal.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

struct Library {
    const ibv_extend_datapath_ops *ops = nullptr;
    int (*modify_srq)(void *, const ibv_srq_attr *, int) = nullptr;
    int (*query_srq)(void *, ibv_srq_attr *) = nullptr;
    std::string error;
};

// The module as the face finds it: lib<provider>-verbs.so in IBV_EXTEND_PROVIDER_DIR. Loaded once
// and kept for the process, as the face keeps it.
const Library &library() {
    static const Library lib = [] {
        Library l;
        const char *dir = std::getenv("IBV_EXTEND_PROVIDER_DIR");
        std::string path = std::string(dir != nullptr ? dir : ".") + "/libsoftnda-verbs.so";
        void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            l.error = dlerror();
            return l;
        }
        l.ops = static_cast<const ibv_extend_datapath_ops *>(dlsym(h, IBV_EXTEND_DATAPATH_SYMBOL));
        l.modify_srq = reinterpret_cast<decltype(l.modify_srq)>(dlsym(h, "softnda_verbs_modify_srq"));
        l.query_srq = reinterpret_cast<decltype(l.query_srq)>(dlsym(h, "softnda_verbs_query_srq"));
        return l;
    }();
    return lib;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    std::iota(v.begin(), v.end(), static_cast<uint8_t>(seed * 37));
    return v;
}

ibv_sge vsge(const void *addr, uint32_t len, const ibv_mr *mr) {
    return ibv_sge{reinterpret_cast<uintptr_t>(addr), len, mr != nullptr ? mr->lkey : 0};
}

ibv_send_wr sendWr(ibv_wr_opcode op, uint64_t wr_id, ibv_sge *sg, int n, unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr w{};
    w.wr_id = wr_id;
    w.opcode = op;
    w.sg_list = sg;
    w.num_sge = n;
    w.send_flags = flags;
    return w;
}

// A WRITE of the SGE's bytes to *dst, registered as dmr.
ibv_send_wr writeWr(uint64_t wr_id, ibv_sge *sg, const uint64_t *dst, const ibv_mr *dmr,
                    unsigned flags = IBV_SEND_SIGNALED) {
    ibv_send_wr w = sendWr(IBV_WR_RDMA_WRITE, wr_id, sg, 1, flags);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst);
    w.wr.rdma.rkey = dmr->rkey;
    return w;
}

// Links wrs[0..n) into one chain.
template <typename Wr>
Wr *chain(std::vector<Wr> &wrs) {
    for (size_t i = 0; i + 1 < wrs.size(); ++i) {
        wrs[i].next = &wrs[i + 1];
    }
    wrs.back().next = nullptr;
    return wrs.data();
}

// A QP's state in the data path and in the driver.
struct VQp {
    QpH h;
    void *dp = nullptr;
};

class Datapath : public SoftndaTest {
  protected:
    void SetUp() override {
        const Library &lib = library();
        ASSERT_NE(lib.ops, nullptr) << lib.error;
        dp_ = lib.ops;
        SoftndaTest::SetUp();
        if (HasFatalFailure()) {
            return;
        }
        scq_ = makeCq();
        rcq_ = makeCq();
        vscq_ = openCq(scq_);
        vrcq_ = openCq(rcq_);
    }

    void TearDown() override {
        for (void *q : dp_qps_) {
            dp_->qp_close(q);
        }
        for (void *s : dp_srqs_) {
            dp_->srq_close(s);
        }
        for (void *c : dp_cqs_) {
            dp_->cq_close(c);
        }
        SoftndaTest::TearDown();
    }

    void *openCq(const CqH &c) {
        void *s = dp_->cq_open(c.ext, static_cast<int>(c.ext->cq->cqe));
        EXPECT_NE(s, nullptr) << "errno " << errno;
        if (s != nullptr) {
            dp_cqs_.push_back(s);
        }
        return s;
    }

    // The attributes the face passes: the QP's type and the caps the driver granted.
    static ibv_extend_datapath_qp_attr dpAttr(const QpH &h) {
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        EXPECT_EQ(softnda_vdev_ops.query_qp(h.ext->qp, &a, IBV_QP_CAP, &ia), 0);
        ibv_extend_datapath_qp_attr d{};
        d.qp = h.ext;
        d.qp_type = h.ext->qp->qp_type;
        d.cap = ia.cap;
        d.sq_sig_all = ia.sq_sig_all;
        d.has_srq = h.ext->qp->srq != nullptr;
        return d;
    }

    VQp makeVQp(const QpCaps &c = QpCaps{}, ibv_srq_extend *srq = nullptr, const CqH *scq = nullptr,
                const CqH *rcq = nullptr) {
        VQp q;
        q.h = makeQp(scq != nullptr ? *scq : scq_, rcq != nullptr ? *rcq : rcq_, c, srq);
        if (q.h.ext != nullptr) {
            auto attr = dpAttr(q.h);
            q.dp = dp_->qp_open(&attr);
            EXPECT_NE(q.dp, nullptr) << "errno " << errno;
            if (q.dp != nullptr) {
                dp_qps_.push_back(q.dp);
            }
        }
        return q;
    }

    void *openSrq(const SrqH &s, uint32_t max_wr, uint32_t max_sge) {
        ibv_srq_attr a{};
        a.max_wr = max_wr;
        a.max_sge = max_sge;
        void *st = dp_->srq_open(s.ext, &a);
        EXPECT_NE(st, nullptr) << "errno " << errno;
        if (st != nullptr) {
            dp_srqs_.push_back(st);
        }
        return st;
    }

    // Polls through the data path until n completions arrived (20 s only guard against a hang).
    std::vector<ibv_wc> waitWcs(void *cq, size_t n, int batch = 16) {
        std::vector<ibv_wc> out;
        std::vector<ibv_wc> buf(static_cast<size_t>(batch));
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
            int want = static_cast<int>(std::min<size_t>(buf.size(), n - out.size()));
            int got = dp_->poll_cq(cq, want, buf.data());
            if (got < 0) {
                ADD_FAILURE() << "poll_cq " << got;
                break;
            }
            if (got == 0) {
                std::this_thread::yield();
            }
            out.insert(out.end(), buf.begin(), buf.begin() + got);
        }
        EXPECT_EQ(out.size(), n);
        return out;
    }

    ibv_wc waitWc(void *cq) {
        auto v = waitWcs(cq, 1);
        return v.empty() ? ibv_wc{} : v[0];
    }

    bool dpStaysEmpty(void *cq) {
        ibv_wc wc;
        for (int i = 0; i < 50; ++i) {
            if (dp_->poll_cq(cq, 1, &wc) != 0) {
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return true;
    }

    int post(VQp &q, ibv_send_wr *wr, ibv_send_wr **bad = nullptr) {
        ibv_send_wr *b = nullptr;
        int rc = dp_->post_send(q.dp, wr, &b);
        if (bad != nullptr) {
            *bad = b;
        }
        return rc;
    }
    int recv(VQp &q, uint64_t wr_id, ibv_sge *sg, int n) {
        ibv_recv_wr w{};
        w.wr_id = wr_id;
        w.sg_list = sg;
        w.num_sge = n;
        ibv_recv_wr *bad = nullptr;
        return dp_->post_recv(q.dp, &w, &bad);
    }

    // A connected pair a -> b on the fixture's CQs.
    void pair(VQp &a, VQp &b, const QpCaps &c = QpCaps{}) {
        a = makeVQp(c);
        b = makeVQp(c);
        connect(a.h, b.h);
    }

    static void expectPlainWc(const ibv_wc &wc, uint64_t wr_id, ibv_wc_opcode op, uint32_t byte_len,
                              uint32_t qpn) {
        EXPECT_EQ(wc.wr_id, wr_id);
        EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "status " << wc.status;
        EXPECT_EQ(wc.opcode, op);
        EXPECT_EQ(wc.byte_len, byte_len);
        EXPECT_EQ(wc.qp_num, qpn);
        EXPECT_EQ(wc.wc_flags, 0u);
        EXPECT_EQ(wc.imm_data, 0u);
        EXPECT_EQ(wc.vendor_err, 0u);
        EXPECT_EQ(wc.pkey_index, 0u);
        EXPECT_EQ(wc.slid, 0u);
        EXPECT_EQ(wc.sl, 0u);
        EXPECT_EQ(wc.dlid_path_bits, 0u);
    }

    // The word at byte offset `off` of a queue's doorbell record (SPEC.md §1.1).
    static uint32_t *recordWord(const queue_info &qi, size_t off) {
        return reinterpret_cast<uint32_t *>(static_cast<uint8_t *>(qi.dbr_pi_va.iov_base) + off);
    }

    static softnda_counters counters() {
        softnda_counters c{};
        EXPECT_EQ(softnda_query_counters("softnda0", &c), 0);
        return c;
    }

    const ibv_extend_datapath_ops *dp_ = nullptr;
    CqH scq_, rcq_;
    void *vscq_ = nullptr;
    void *vrcq_ = nullptr;
    std::vector<void *> dp_qps_, dp_srqs_, dp_cqs_;
};

TEST_F(Datapath, ModuleExportsTheSoftndaTable) {
    const ibv_extend_datapath_ops *o = dp_;
    EXPECT_EQ(o->abi, static_cast<uint32_t>(IBV_EXTEND_DATAPATH_ABI_V1));
    EXPECT_STREQ(o->provider, SOFTNDA_PROVIDER_NAME);
    bool all = o->cq_open && o->cq_close && o->qp_open && o->qp_close && o->srq_open && o->srq_close &&
               o->post_send && o->post_recv && o->post_srq_recv && o->poll_cq && o->req_notify_cq &&
               o->cq_events && o->qp_fatal_events && o->srq_limit_events;
    EXPECT_TRUE(all);
    EXPECT_NE(library().modify_srq, nullptr);
    EXPECT_NE(library().query_srq, nullptr);
}

TEST_F(Datapath, RdmaWriteGathersSegmentsAndCompletesEveryField) {
    VQp a, b;
    pair(a, b);
    auto src = pattern(3000, 1);
    std::vector<uint8_t> dst(4096, 0xee);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_sge s[3] = {vsge(src.data(), 1000, smr), vsge(src.data() + 1000, 1500, smr),
                    vsge(src.data() + 2500, 500, smr)};
    auto w = sendWr(IBV_WR_RDMA_WRITE, 0x1122334455667788ull, s, 3);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + 10;
    w.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 0x1122334455667788ull, IBV_WC_RDMA_WRITE, 0, a.h.qpn());
    EXPECT_EQ(std::memcmp(dst.data() + 10, src.data(), 3000), 0);
    EXPECT_EQ(dst[9], 0xee);
    EXPECT_EQ(dst[3010], 0xee);
    EXPECT_TRUE(dpStaysEmpty(vrcq_));  // a plain WRITE consumes no receive
}

TEST_F(Datapath, SendScattersIntoReceiveSegments) {
    VQp a, b;
    pair(a, b);
    auto src = pattern(1000, 2);
    std::vector<uint8_t> r1(300, 0), r2(800, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *m1 = reg(r1.data(), r1.size());
    ibv_mr *m2 = reg(r2.data(), r2.size());
    ibv_sge rs[2] = {vsge(r1.data(), 300, m1), vsge(r2.data(), 800, m2)};
    ASSERT_EQ(recv(b, 55, rs, 2), 0);
    ibv_sge s = vsge(src.data(), 1000, smr);
    auto w = sendWr(IBV_WR_SEND, 9, &s, 1);
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 9, IBV_WC_SEND, 0, a.h.qpn());
    ibv_wc r = waitWc(vrcq_);
    expectPlainWc(r, 55, IBV_WC_RECV, 1000, b.h.qpn());
    EXPECT_EQ(r.src_qp, a.h.qpn());
    EXPECT_EQ(std::memcmp(r1.data(), src.data(), 300), 0);
    EXPECT_EQ(std::memcmp(r2.data(), src.data() + 300, 700), 0);
    EXPECT_EQ(r2[700], 0);
}

TEST_F(Datapath, SendWithImmediateArrivesInNetworkOrder) {
    VQp a, b;
    pair(a, b);
    auto src = pattern(64, 3);
    std::vector<uint8_t> dst(64, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_sge rs = vsge(dst.data(), 64, dmr);
    ASSERT_EQ(recv(b, 1, &rs, 1), 0);
    ibv_sge s = vsge(src.data(), 64, smr);
    auto w = sendWr(IBV_WR_SEND_WITH_IMM, 2, &s, 1);
    w.imm_data = htonl(0x12345678);
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 2, IBV_WC_SEND, 0, a.h.qpn());
    ibv_wc r = waitWc(vrcq_);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.opcode, IBV_WC_RECV);
    EXPECT_EQ(r.wc_flags, static_cast<unsigned>(IBV_WC_WITH_IMM));
    EXPECT_EQ(ntohl(r.imm_data), 0x12345678u);
    EXPECT_EQ(r.byte_len, 64u);
    EXPECT_EQ(r.src_qp, a.h.qpn());
    EXPECT_EQ(dst, src);
}

TEST_F(Datapath, ImmediateIsTheSameNumberOnTheDeviceSide) {
    // A verbs sender and a device-side receiver (and the reverse) agree on the immediate: the data
    // path converts from and to network order exactly once.
    // b's completions are taken by the helpers only, a's by the data path only: two consumers of
    // one CQ would each keep their own consumer index.
    CqH hcq = makeCq();
    VQp a = makeVQp(QpCaps{}, nullptr, &scq_, &rcq_);
    VQp b = makeVQp(QpCaps{}, nullptr, &hcq, &hcq);
    connect(a.h, b.h);
    std::vector<uint8_t> dst(16, 0);
    ibv_mr *dmr = reg(dst.data(), dst.size());
    softnda_sge hs = sge(dst.data(), 16, dmr);
    ASSERT_EQ(postRecv(b.h, 1, &hs, 1), 0);
    auto w = sendWr(IBV_WR_SEND_WITH_IMM, 2, nullptr, 0);
    w.imm_data = htonl(0xdeadbeef);
    ASSERT_EQ(post(a, &w), 0);
    EXPECT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);
    softnda_cqe c = waitOne(hcq.cq);
    EXPECT_EQ(c.imm_data, 0xdeadbeefu);

    // Device side sends to a receive posted through the data path.
    ibv_sge vs = vsge(dst.data(), 16, dmr);
    ASSERT_EQ(recv(a, 3, &vs, 1), 0);
    softnda_send_wr hw = wr(SOFTNDA_OP_SEND_WITH_IMM, 4, nullptr, 0);
    hw.imm_data = 0xcafe0001u;
    ASSERT_EQ(postOne(b.h, hw), 0);
    EXPECT_EQ(waitOne(hcq.cq).status, IBV_WC_SUCCESS);
    ibv_wc r = waitWc(vrcq_);
    EXPECT_EQ(r.wr_id, 3u);
    EXPECT_EQ(ntohl(r.imm_data), 0xcafe0001u);
    EXPECT_EQ(r.src_qp, b.h.qpn());
}

TEST_F(Datapath, RdmaWriteWithImmediateConsumesAReceive) {
    VQp a, b;
    pair(a, b);
    auto src = pattern(200, 4);
    std::vector<uint8_t> dst(256, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ASSERT_EQ(recv(b, 70, nullptr, 0), 0);
    ibv_sge s = vsge(src.data(), 200, smr);
    auto w = sendWr(IBV_WR_RDMA_WRITE_WITH_IMM, 71, &s, 1);
    w.imm_data = htonl(77);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + 8;
    w.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 71, IBV_WC_RDMA_WRITE, 0, a.h.qpn());
    ibv_wc r = waitWc(vrcq_);
    EXPECT_EQ(r.wr_id, 70u);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(r.byte_len, 200u);
    EXPECT_EQ(r.wc_flags, static_cast<unsigned>(IBV_WC_WITH_IMM));
    EXPECT_EQ(ntohl(r.imm_data), 77u);
    EXPECT_EQ(r.qp_num, b.h.qpn());
    EXPECT_EQ(r.src_qp, a.h.qpn());
    EXPECT_EQ(std::memcmp(dst.data() + 8, src.data(), 200), 0);
}

TEST_F(Datapath, RdmaReadReportsTheLengthRead) {
    VQp a, b;
    pair(a, b);
    auto remote = pattern(500, 5);
    std::vector<uint8_t> local(600, 0);
    ibv_mr *rmr = reg(remote.data(), remote.size());
    ibv_mr *lmr = reg(local.data(), local.size());
    ibv_sge s[2] = {vsge(local.data(), 100, lmr), vsge(local.data() + 200, 400, lmr)};
    auto w = sendWr(IBV_WR_RDMA_READ, 81, s, 2);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote.data());
    w.wr.rdma.rkey = rmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 81, IBV_WC_RDMA_READ, 500, a.h.qpn());
    EXPECT_EQ(std::memcmp(local.data(), remote.data(), 100), 0);
    EXPECT_EQ(std::memcmp(local.data() + 200, remote.data() + 100, 400), 0);
    EXPECT_EQ(local[150], 0);
}

// Messages longer than the engine's chunk (1 MiB) move a chunk per visit, the device gate given up
// between chunks (docs/security.md): each arrives whole, scattered and gathered across uneven
// SGEs at both ends, and a SEND or a WRITE with immediate consumes exactly one receive.
TEST_F(Datapath, MessagesLongerThanAChunkArriveWhole) {
    constexpr size_t kLen = (5u << 20) + 123;
    VQp a, b;
    pair(a, b);
    auto src = pattern(kLen, 11);
    std::vector<uint8_t> dst(kLen + 64, 0xee);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    const uint32_t cut1 = 777, cut2 = (3u << 20) + 5;
    ibv_sge s[3] = {vsge(src.data(), cut1, smr), vsge(src.data() + cut1, cut2 - cut1, smr),
                    vsge(src.data() + cut2, kLen - cut2, smr)};

    auto w = sendWr(IBV_WR_RDMA_WRITE, 1, s, 3);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data()) + 16;
    w.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 1, IBV_WC_RDMA_WRITE, 0, a.h.qpn());
    EXPECT_EQ(std::memcmp(dst.data() + 16, src.data(), kLen), 0);
    EXPECT_EQ(dst[15], 0xee);
    EXPECT_EQ(dst[16 + kLen], 0xee);

    // SEND with immediate into a receive of three buffers cut elsewhere than the source.
    std::fill(dst.begin(), dst.end(), 0);
    const uint32_t r1 = (1u << 20) + 3, r2 = (2u << 20) + 11;
    ibv_sge rs[3] = {vsge(dst.data(), r1, dmr), vsge(dst.data() + r1, r2 - r1, dmr),
                     vsge(dst.data() + r2, static_cast<uint32_t>(dst.size()) - r2, dmr)};
    ASSERT_EQ(recv(b, 20, rs, 3), 0);
    ASSERT_EQ(recv(b, 21, rs, 3), 0);
    w = sendWr(IBV_WR_SEND_WITH_IMM, 2, s, 3);
    w.imm_data = htonl(5);
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 2, IBV_WC_SEND, 0, a.h.qpn());
    ibv_wc r = waitWc(vrcq_);
    EXPECT_EQ(r.wr_id, 20u);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
    EXPECT_EQ(r.byte_len, kLen);
    EXPECT_EQ(ntohl(r.imm_data), 5u);
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), kLen), 0);
    EXPECT_TRUE(dpStaysEmpty(vrcq_));  // receive 21 is still posted

    // RDMA WRITE with immediate: the data, then the one receive it consumes (21).
    std::fill(dst.begin(), dst.end(), 0);
    w = sendWr(IBV_WR_RDMA_WRITE_WITH_IMM, 3, s, 3);
    w.imm_data = htonl(6);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    w.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 3, IBV_WC_RDMA_WRITE, 0, a.h.qpn());
    r = waitWc(vrcq_);
    EXPECT_EQ(r.wr_id, 21u);
    EXPECT_EQ(r.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
    EXPECT_EQ(r.byte_len, kLen);
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), kLen), 0);

    // RDMA READ back into the source's three SGEs.
    std::vector<uint8_t> remote = pattern(kLen, 12);
    ibv_mr *rmr = reg(remote.data(), remote.size());
    w = sendWr(IBV_WR_RDMA_READ, 4, s, 3);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(remote.data());
    w.wr.rdma.rkey = rmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 4, IBV_WC_RDMA_READ, kLen, a.h.qpn());
    EXPECT_EQ(std::memcmp(src.data(), remote.data(), kLen), 0);
}

// Fairness: a short WRITE on another QP, posted after a long one started, completes before the
// long one does, since the long one moves a chunk per visit and the other QP has its turn in
// between. (Executed whole, the long one finished first: the engine took it before the short one's
// doorbell and held the gate until it was done.)
TEST_F(Datapath, AShortMessagePassesALongOneInProgress) {
    constexpr size_t kLong = 64u << 20;
    VQp a, b, c, d;
    pair(a, b);
    pair(c, d);
    std::vector<uint8_t> src(kLong, 7), dst(kLong, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_sge s = vsge(src.data(), static_cast<uint32_t>(kLong), smr);
    auto big = sendWr(IBV_WR_RDMA_WRITE, 100, &s, 1);
    big.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    big.wr.rdma.rkey = dmr->rkey;
    ibv_sge t = vsge(src.data(), 8, smr);
    auto small = sendWr(IBV_WR_RDMA_WRITE, 200, &t, 1);
    small.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    small.wr.rdma.rkey = dmr->rkey;
    // The order means something only when the short one was posted while the long one ran: on a
    // loaded machine this thread may lose its core between the two posts for longer than the
    // whole long WRITE takes, so a round in which the long one had completed by then (its CQE
    // is the first thing polled) is run again.
    for (int round = 0; round < 20; ++round) {
        ASSERT_EQ(post(a, &big), 0);
        ASSERT_EQ(post(c, &small), 0);
        ibv_wc early{};
        if (dp_->poll_cq(vscq_, 1, &early) == 1 && early.wr_id == 100u) {
            EXPECT_EQ(waitWc(vscq_).wr_id, 200u);
            continue;
        }
        ibv_wc first = early.wr_id != 0 ? early : waitWc(vscq_);
        ibv_wc second = waitWc(vscq_);
        EXPECT_EQ(first.wr_id, 200u) << "the long WRITE held the engine until it was done";
        EXPECT_EQ(second.wr_id, 100u);
        EXPECT_EQ(first.status, IBV_WC_SUCCESS);
        EXPECT_EQ(second.status, IBV_WC_SUCCESS);
        EXPECT_EQ(dst[kLong - 1], 7);
        return;
    }
    FAIL() << "in 20 rounds the long WRITE always completed before the short one was posted";
}

TEST_F(Datapath, AtomicsReturnTheOldValue) {
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t target = 100;
    alignas(8) uint64_t old[3] = {0, 0, 0};
    ibv_mr *tmr = reg(&target, 8);
    ibv_mr *omr = reg(old, sizeof(old));
    ibv_sge s0 = vsge(&old[0], 8, omr), s1 = vsge(&old[1], 8, omr), s2 = vsge(&old[2], 8, omr);
    std::vector<ibv_send_wr> wrs = {sendWr(IBV_WR_ATOMIC_FETCH_AND_ADD, 1, &s0, 1),
                                    sendWr(IBV_WR_ATOMIC_CMP_AND_SWP, 2, &s1, 1),
                                    sendWr(IBV_WR_ATOMIC_CMP_AND_SWP, 3, &s2, 1)};
    for (auto &w : wrs) {
        w.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(&target);
        w.wr.atomic.rkey = tmr->rkey;
    }
    wrs[0].wr.atomic.compare_add = 5;  // 100 -> 105
    wrs[1].wr.atomic.compare_add = 105;
    wrs[1].wr.atomic.swap = 900;  // matches: 105 -> 900
    wrs[2].wr.atomic.compare_add = 1;
    wrs[2].wr.atomic.swap = 7;  // does not match: stays 900
    ASSERT_EQ(post(a, chain(wrs)), 0);
    auto wcs = waitWcs(vscq_, 3);
    ASSERT_EQ(wcs.size(), 3u);
    expectPlainWc(wcs[0], 1, IBV_WC_FETCH_ADD, 8, a.h.qpn());
    expectPlainWc(wcs[1], 2, IBV_WC_COMP_SWAP, 8, a.h.qpn());
    expectPlainWc(wcs[2], 3, IBV_WC_COMP_SWAP, 8, a.h.qpn());
    EXPECT_EQ(old[0], 100u);
    EXPECT_EQ(old[1], 105u);
    EXPECT_EQ(old[2], 900u);
    EXPECT_EQ(__atomic_load_n(&target, __ATOMIC_ACQUIRE), 900u);
}

TEST_F(Datapath, InlineDataIsCopiedAtPostTime) {
    VQp a, b;
    pair(a, b);
    // Not registered: inline data needs no lkey, and it is read before post_send returns.
    std::vector<uint8_t> p1 = pattern(20, 6), p2 = pattern(30, 7);
    std::vector<uint8_t> dst(64, 0), rbuf(64, 0);
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_mr *rmr = reg(rbuf.data(), rbuf.size());
    ibv_sge rs = vsge(rbuf.data(), 64, rmr);
    ASSERT_EQ(recv(b, 5, &rs, 1), 0);
    ibv_sge s[2] = {vsge(p1.data(), 20, nullptr), vsge(p2.data(), 30, nullptr)};
    s[0].lkey = 0xbad;
    std::vector<ibv_send_wr> wrs = {sendWr(IBV_WR_RDMA_WRITE, 1, s, 2, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
                                    sendWr(IBV_WR_SEND, 2, s, 2, IBV_SEND_SIGNALED | IBV_SEND_INLINE)};
    wrs[0].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    wrs[0].wr.rdma.rkey = dmr->rkey;
    auto want1 = p1, want2 = p2;
    ASSERT_EQ(post(a, chain(wrs)), 0);
    std::fill(p1.begin(), p1.end(), 0);
    std::fill(p2.begin(), p2.end(), 0);
    auto wcs = waitWcs(vscq_, 2);
    ASSERT_EQ(wcs.size(), 2u);
    expectPlainWc(wcs[0], 1, IBV_WC_RDMA_WRITE, 0, a.h.qpn());
    expectPlainWc(wcs[1], 2, IBV_WC_SEND, 0, a.h.qpn());
    ibv_wc r = waitWc(vrcq_);
    expectPlainWc(r, 5, IBV_WC_RECV, 50, b.h.qpn());
    EXPECT_EQ(std::memcmp(dst.data(), want1.data(), 20), 0);
    EXPECT_EQ(std::memcmp(dst.data() + 20, want2.data(), 30), 0);
    EXPECT_EQ(std::memcmp(rbuf.data(), want1.data(), 20), 0);
    EXPECT_EQ(std::memcmp(rbuf.data() + 20, want2.data(), 30), 0);
}

TEST_F(Datapath, InlineUpToTheGrantedCapAndNotBeyond) {
    VQp a, b;
    pair(a, b);
    auto attr = dpAttr(a.h);
    uint32_t cap = attr.cap.max_inline_data;
    ASSERT_GE(cap, 64u);
    std::vector<uint8_t> src = pattern(cap + 1, 8), dst(cap + 1, 0);
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_sge s = vsge(src.data(), cap, nullptr);
    auto w = sendWr(IBV_WR_RDMA_WRITE, 1, &s, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    w.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &w), 0);
    EXPECT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(dst.data(), src.data(), cap), 0);
    s.length = cap + 1;
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(post(a, &w, &bad), EINVAL);
    EXPECT_EQ(bad, &w);
    EXPECT_TRUE(dpStaysEmpty(vscq_));
}

TEST_F(Datapath, OnlySignaledRequestsCompleteUnlessSqSigAll) {
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    std::vector<ibv_send_wr> wrs;
    for (uint64_t i = 0; i < 4; ++i) {
        wrs.push_back(writeWr(i, &s, &dst, dmr, i == 3 ? IBV_SEND_SIGNALED : 0));
    }
    ASSERT_EQ(post(a, chain(wrs)), 0);
    EXPECT_EQ(waitWc(vscq_).wr_id, 3u);
    EXPECT_TRUE(dpStaysEmpty(vscq_));

    QpCaps all;
    all.sq_sig_all = 1;
    VQp c = makeVQp(all), d = makeVQp(all);
    connect(c.h, d.h);
    for (auto &w : wrs) {
        w.send_flags = 0;
    }
    ASSERT_EQ(post(c, chain(wrs)), 0);
    auto wcs = waitWcs(vscq_, 4);
    ASSERT_EQ(wcs.size(), 4u);
    for (uint64_t i = 0; i < 4; ++i) {
        expectPlainWc(wcs[i], i, IBV_WC_RDMA_WRITE, 0, c.h.qpn());
    }
    // The data path marks every WQE of such a QP signaled itself, whatever the engine assumes.
    EXPECT_EQ(dpAttr(c.h).sq_sig_all, 1);
    for (uint32_t i = 0; i < 4; ++i) {
        auto *wqe = reinterpret_cast<const softnda_wqe *>(c.h.sq.buf + i * c.h.sq.entry_size);
        EXPECT_EQ(wqe->flags & SOFTNDA_WQE_SIGNALED, SOFTNDA_WQE_SIGNALED);
    }
}

TEST_F(Datapath, FenceAndSolicitedReachTheWqe) {
    // The engine runs every WQE in order (FENCE is always met) and marks a solicited receive.
    VQp a, b;
    pair(a, b);
    std::vector<uint8_t> rbuf(8, 0);
    ibv_mr *rmr = reg(rbuf.data(), rbuf.size());
    ibv_sge rs = vsge(rbuf.data(), 8, rmr);
    ASSERT_EQ(recv(b, 1, &rs, 1), 0);
    uint32_t pi = a.h.sq.pi;
    auto w = sendWr(IBV_WR_SEND, 2, nullptr, 0, IBV_SEND_SIGNALED | IBV_SEND_FENCE | IBV_SEND_SOLICITED);
    ASSERT_EQ(post(a, &w), 0);
    EXPECT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);
    auto *wqe =
        reinterpret_cast<const softnda_wqe *>(a.h.sq.buf + (pi & (a.h.sq.entry_cnt - 1)) * a.h.sq.entry_size);
    EXPECT_EQ(wqe->opcode, SOFTNDA_OP_SEND);
    EXPECT_EQ(wqe->flags, SOFTNDA_WQE_SIGNALED | SOFTNDA_WQE_FENCE | SOFTNDA_WQE_SOLICITED);
    softnda_cqe c = waitOne(rcq_.cq);  // the raw CQE shows the solicited flag ibv_wc has no bit for
    EXPECT_EQ(c.wr_id, 1u);
    EXPECT_NE(c.flags & SOFTNDA_CQE_SOLICITED, 0);
}

TEST_F(Datapath, ChainFailingMidwayPostsTheRequestsBeforeIt) {
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s[8];
    for (auto &x : s) {
        x = vsge(&src, 8, smr);
    }
    auto attr = dpAttr(a.h);
    struct Bad {
        const char *what;
        void (*spoil)(ibv_send_wr &, const ibv_qp_cap &);
    } cases[] = {
        {"unknown opcode", [](ibv_send_wr &w, const ibv_qp_cap &) { w.opcode = IBV_WR_TSO; }},
        {"bind of no window",
         [](ibv_send_wr &w, const ibv_qp_cap &) {
             w.opcode = IBV_WR_BIND_MW;
             w.bind_mw.mw = nullptr;
         }},
        {"opcode out of range",
         [](ibv_send_wr &w, const ibv_qp_cap &) { w.opcode = static_cast<ibv_wr_opcode>(99); }},
        {"too many SGEs",
         [](ibv_send_wr &w, const ibv_qp_cap &c) { w.num_sge = static_cast<int>(c.max_send_sge) + 1; }},
        {"negative num_sge", [](ibv_send_wr &w, const ibv_qp_cap &) { w.num_sge = -1; }},
    };
    ASSERT_LT(attr.cap.max_send_sge + 1, 8u);
    uint64_t id = 0;
    for (const auto &c : cases) {
        SCOPED_TRACE(c.what);
        std::vector<ibv_send_wr> wrs;
        for (int i = 0; i < 4; ++i) {
            wrs.push_back(writeWr(++id, s, &dst, dmr));
        }
        c.spoil(wrs[2], attr.cap);
        ibv_send_wr *bad = nullptr;
        EXPECT_EQ(post(a, chain(wrs), &bad), EINVAL);
        EXPECT_EQ(bad, &wrs[2]);
        auto wcs = waitWcs(vscq_, 2);
        ASSERT_EQ(wcs.size(), 2u);
        EXPECT_EQ(wcs[0].wr_id, id - 3);
        EXPECT_EQ(wcs[1].wr_id, id - 2);
        EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
        EXPECT_TRUE(dpStaysEmpty(vscq_));
    }
}

TEST_F(Datapath, FullSendQueueIsEnomemCountingWhatIsPosted) {
    // In INIT nothing executes (SPEC.md §5.1), so the queue only fills.
    QpCaps c;
    c.send_wr = 8;
    c.recv_wr = 4;
    VQp q = makeVQp(c);
    ASSERT_EQ(toInit(q.h.ext->qp, kAllAccess), 0);
    auto attr = dpAttr(q.h);
    ASSERT_EQ(attr.cap.max_send_wr, 8u);
    std::vector<ibv_send_wr> wrs;
    for (uint64_t i = 0; i < 11; ++i) {
        wrs.push_back(sendWr(IBV_WR_SEND, i, nullptr, 0));
    }
    std::vector<ibv_send_wr> first(wrs.begin(), wrs.begin() + 3);
    ASSERT_EQ(post(q, chain(first)), 0);
    std::vector<ibv_send_wr> rest(wrs.begin() + 3, wrs.end());
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(post(q, chain(rest), &bad), ENOMEM);
    EXPECT_EQ(bad, &rest[5]);  // 3 + 5 = 8 fit
    EXPECT_EQ(__atomic_load_n(q.h.sq.dbr_pi, __ATOMIC_ACQUIRE) - *q.h.sq.dbr_ci, 8u);
    EXPECT_EQ(post(q, &rest[7], &bad), ENOMEM);
    EXPECT_EQ(bad, &rest[7]);

    // The receive queue the same way.
    std::vector<ibv_recv_wr> rwrs(6);
    for (size_t i = 0; i < rwrs.size(); ++i) {
        rwrs[i].wr_id = i;
    }
    ibv_recv_wr *rbad = nullptr;
    EXPECT_EQ(dp_->post_recv(q.dp, chain(rwrs), &rbad), ENOMEM);
    EXPECT_EQ(rbad, &rwrs[4]);
}

// IB allows a queue of depth 0: the passive side of a READ or a bandwidth test has no SQ, a
// sender no RQ. Such a QP is created, granted depth 0, and every post to the empty queue fails
// with ENOMEM and *bad_wr, as rdma-core's providers answer a full queue; the other queue works.
TEST_F(Datapath, ZeroDepthQueuesAreGrantedZeroAndRefuseEveryPost) {
    QpCaps send_only;
    send_only.recv_wr = 0;
    QpCaps recv_only;
    recv_only.send_wr = 0;
    VQp a = makeVQp(send_only);
    VQp b = makeVQp(recv_only);
    ASSERT_NE(a.dp, nullptr);
    ASSERT_NE(b.dp, nullptr);
    EXPECT_EQ(dpAttr(a.h).cap.max_recv_wr, 0u);
    EXPECT_EQ(dpAttr(b.h).cap.max_send_wr, 0u);
    EXPECT_GT(dpAttr(a.h).cap.max_send_wr, 0u);
    EXPECT_GT(dpAttr(b.h).cap.max_recv_wr, 0u);
    connect(a.h, b.h);

    ibv_send_wr nop = sendWr(IBV_WR_SEND, 1, nullptr, 0);
    ibv_send_wr *bad = nullptr;
    EXPECT_EQ(post(b, &nop, &bad), ENOMEM);
    EXPECT_EQ(bad, &nop);
    EXPECT_EQ(*b.h.sq.dbr_pi, 0u) << "nothing reached the ring";
    ibv_recv_wr rw{};
    ibv_recv_wr *rbad = nullptr;
    EXPECT_EQ(dp_->post_recv(a.dp, &rw, &rbad), ENOMEM);
    EXPECT_EQ(rbad, &rw);

    // The sender's SEND lands in the receive-only QP; its READ is answered by it.
    auto src = pattern(256, 3);
    std::vector<uint8_t> dst(256, 0), back(256, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_mr *bmr = reg(back.data(), back.size());
    ibv_sge rs = vsge(dst.data(), 256, dmr);
    ASSERT_EQ(recv(b, 7, &rs, 1), 0);
    ibv_sge ss = vsge(src.data(), 256, smr);
    auto w = sendWr(IBV_WR_SEND, 8, &ss, 1);
    ASSERT_EQ(post(a, &w), 0);
    expectPlainWc(waitWc(vscq_), 8, IBV_WC_SEND, 0, a.h.qpn());
    expectPlainWc(waitWc(vrcq_), 7, IBV_WC_RECV, 256, b.h.qpn());
    EXPECT_EQ(dst, src);
    ibv_sge bs = vsge(back.data(), 256, bmr);
    auto r = sendWr(IBV_WR_RDMA_READ, 9, &bs, 1);
    r.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.data());
    r.wr.rdma.rkey = dmr->rkey;
    ASSERT_EQ(post(a, &r), 0);
    expectPlainWc(waitWc(vscq_), 9, IBV_WC_RDMA_READ, 256, a.h.qpn());
    EXPECT_EQ(back, src);
}

TEST_F(Datapath, ReceiveErrorsAreEinval) {
    VQp q = makeVQp();
    auto attr = dpAttr(q.h);
    std::vector<ibv_sge> s(attr.cap.max_recv_sge + 1, ibv_sge{0, 0, 0});
    std::vector<ibv_recv_wr> wrs(3);
    for (auto &w : wrs) {
        w.sg_list = s.data();
        w.num_sge = 1;
    }
    wrs[1].num_sge = static_cast<int>(attr.cap.max_recv_sge) + 1;
    ibv_recv_wr *bad = nullptr;
    uint32_t pi = *q.h.rq.dbr_pi;
    EXPECT_EQ(dp_->post_recv(q.dp, chain(wrs), &bad), EINVAL);
    EXPECT_EQ(bad, &wrs[1]);
    EXPECT_EQ(__atomic_load_n(q.h.rq.dbr_pi, __ATOMIC_ACQUIRE), pi + 1);  // the first is posted
    wrs[0].num_sge = -1;
    EXPECT_EQ(dp_->post_recv(q.dp, chain(wrs), &bad), EINVAL);
    EXPECT_EQ(bad, &wrs[0]);
}

// UD through the verbs (SPEC.md §11.1): the destination behind wr.ud.ah, the receive behind
// its GRH with IBV_WC_GRH, src_qp and slid; an opcode UD does not carry is refused at the post.
TEST_F(Datapath, UdSendThroughAnAddressHandle) {
    QpCaps c;
    c.type = IBV_QPT_UD;
    VQp a = makeVQp(c), b = makeVQp(c);
    for (VQp *q : {&a, &b}) {
        ibv_qp_attr at{};
        at.qp_state = IBV_QPS_INIT;
        at.port_num = 1;
        at.qkey = 0x1234;
        ASSERT_EQ(softnda_vdev_ops.modify_qp(q->h.ext->qp, &at,
                                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY),
                  0);
        at.qp_state = IBV_QPS_RTR;
        ASSERT_EQ(softnda_vdev_ops.modify_qp(q->h.ext->qp, &at, IBV_QP_STATE), 0);
        at.qp_state = IBV_QPS_RTS;
        ASSERT_EQ(softnda_vdev_ops.modify_qp(q->h.ext->qp, &at, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
    }
    ibv_port_attr port{};
    ASSERT_EQ(softnda_vdev_ops.query_port(ctx_, 1, &port), 0);
    auto src = pattern(256, 5);
    std::vector<uint8_t> dst(512, 0);
    ibv_mr *smr = reg(src.data(), src.size());
    ibv_mr *dmr = reg(dst.data(), dst.size());
    ibv_recv_wr rw{};
    ibv_sge rs = vsge(dst.data(), 512, dmr);
    rw.wr_id = 42;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr *rbad = nullptr;
    ASSERT_EQ(dp_->post_recv(b.dp, &rw, &rbad), 0);
    ibv_extend_datapath_ah ah{};
    ah.attr.dlid = port.lid;
    ah.attr.port_num = 1;
    ibv_sge ss = vsge(src.data(), 256, smr);
    ibv_send_wr w = sendWr(IBV_WR_SEND_WITH_IMM, 7, &ss, 1);
    w.imm_data = htonl(0xabcd);
    w.wr.ud.ah = &ah.ah;
    w.wr.ud.remote_qpn = b.h.qpn();
    w.wr.ud.remote_qkey = 0x1234;
    ibv_send_wr *bad = nullptr;
    ASSERT_EQ(dp_->post_send(a.dp, &w, &bad), 0);
    auto r = waitWcs(vrcq_, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].wr_id, 42u);
    EXPECT_EQ(r[0].byte_len, 40u + 256u);
    EXPECT_EQ(r[0].wc_flags, unsigned{IBV_WC_GRH | IBV_WC_WITH_IMM});
    EXPECT_EQ(ntohl(r[0].imm_data), 0xabcdu);
    EXPECT_EQ(r[0].src_qp, a.h.qpn());
    EXPECT_EQ(r[0].slid, port.lid);
    EXPECT_EQ(std::memcmp(dst.data() + 40, src.data(), 256), 0);
    auto s = waitWcs(vscq_, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    ibv_send_wr wr_write = writeWr(8, &ss, reinterpret_cast<const uint64_t *>(dst.data()), dmr);
    EXPECT_EQ(dp_->post_send(a.dp, &wr_write, &bad), EINVAL);
    EXPECT_EQ(bad, &wr_write);
    w.wr.ud.ah = nullptr;
    EXPECT_EQ(dp_->post_send(a.dp, &w, &bad), EINVAL);
}

TEST_F(Datapath, OpenRefusesWhatSoftndaDoesNotServe) {
    VQp q = makeVQp();
    auto attr = dpAttr(q.h);
    for (ibv_qp_type t : {IBV_QPT_RAW_PACKET, IBV_QPT_DRIVER}) {  // XRC: XrcInitiatorNamesTheSrq
        attr.qp_type = t;
        errno = 0;
        EXPECT_EQ(dp_->qp_open(&attr), nullptr);
        EXPECT_EQ(errno, EOPNOTSUPP) << t;
    }
    errno = 0;
    EXPECT_EQ(dp_->qp_open(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);

    // Queues that are not softnda's (here: no queue at all, or a CQ ring of 48-byte entries:
    // softnda's have 32, or 64 with timestamps).
    ibv_qp_extend none{};
    attr.qp = &none;
    attr.qp_type = IBV_QPT_RC;
    errno = 0;
    EXPECT_EQ(dp_->qp_open(&attr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_cq_extend cq = *scq_.ext;
    cq.cq_info.qbuf.entry_size = 48;
    errno = 0;
    EXPECT_EQ(dp_->cq_open(&cq, 16), nullptr);
    EXPECT_EQ(errno, EINVAL);
    ibv_srq_extend srq{};
    errno = 0;
    EXPECT_EQ(dp_->srq_open(&srq, nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

// An XRC initiator's post carries wr.qp_type.xrc.remote_srqn into the WQE's XRC segment (SPEC.md
// "XRC"); the receive completes on the XRC SRQ's CQ, from the target QP. A target takes no posts.
TEST_F(Datapath, XrcInitiatorNamesTheSrq) {
    ibv_xrcd *xrcd = softnda_vdev_ops.open_xrcd(ctx_);
    ASSERT_NE(xrcd, nullptr);
    ibv_srq_init_attr_extend sa{};
    sa.pd = pd_;
    sa.attr.attr.max_wr = 8;
    sa.attr.attr.max_sge = 1;
    sa.ops = arena().ops();
    ibv_srq_extend *srq = softnda_vdev_ops.create_xrc_srq(ctx_, &sa, xrcd, rcq_.ext->cq);
    ASSERT_NE(srq, nullptr);
    srqs_.push_back(srq);
    void *vsrq = openSrq(SrqH{srq, {}}, 8, 1);
    uint32_t srqn = 0;
    ASSERT_EQ(softnda_vdev_ops.get_srq_num(srq->srq, &srqn), 0);

    ibv_qp_init_attr_extend ia{};
    ia.pd = pd_;
    ia.attr.send_cq = scq_.ext->cq;
    ia.attr.qp_type = IBV_QPT_XRC_SEND;
    ia.attr.cap.max_send_wr = 8;
    ia.attr.cap.max_send_sge = 1;
    ia.attr.cap.max_inline_data = 16;
    ia.ops = arena().ops();
    VQp ini;
    ini.h.ext = ext_->ops->create_qp(ctx_, &ia);
    ASSERT_NE(ini.h.ext, nullptr);
    qps_.push_back(ini.h.ext);
    ibv_qp_init_attr_extend ta{};
    ta.ops = arena().ops();
    VQp tgt;
    tgt.h.ext = softnda_vdev_ops.create_xrc_tgt_qp(ctx_, &ta, xrcd);
    ASSERT_NE(tgt.h.ext, nullptr);
    qps_.push_back(tgt.h.ext);
    for (VQp *q : {&ini, &tgt}) {
        auto attr = dpAttr(q->h);
        q->dp = dp_->qp_open(&attr);
        ASSERT_NE(q->dp, nullptr) << "errno " << errno;
        dp_qps_.push_back(q->dp);
    }
    ASSERT_EQ(toInit(ini.h.ext->qp, 0), 0);
    ASSERT_EQ(toInit(tgt.h.ext->qp, kAllAccess), 0);
    ASSERT_EQ(toRtr(ini.h.ext->qp, tgt.h.qpn()), 0);
    ASSERT_EQ(toRtr(tgt.h.ext->qp, ini.h.qpn()), 0);
    ASSERT_EQ(toRts(ini.h.ext->qp), 0);
    ASSERT_EQ(toRts(tgt.h.ext->qp), 0);

    char in[32] = {};
    ibv_mr *m = reg(in, sizeof(in));
    ibv_sge rs = vsge(in, sizeof(in), m);
    ibv_recv_wr rw{};
    rw.wr_id = 77;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr *rbad = nullptr;
    ASSERT_EQ(dp_->post_srq_recv(vsrq, &rw, &rbad), 0);
    char msg[] = "xrc through the data path";
    ibv_sge ss = vsge(msg, sizeof(msg), nullptr);
    auto w = sendWr(IBV_WR_SEND, 5, &ss, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    w.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(post(ini, &w), 0);
    expectPlainWc(waitWc(vscq_), 5, IBV_WC_SEND, 0, ini.h.qpn());
    ibv_wc wc = waitWc(vrcq_);
    expectPlainWc(wc, 77, IBV_WC_RECV, sizeof(msg), tgt.h.qpn());
    EXPECT_EQ(wc.src_qp, ini.h.qpn());
    EXPECT_STREQ(in, msg);

    // Neither XRC QP has a receive queue; a target has no send queue either.
    ibv_recv_wr own{};
    EXPECT_EQ(dp_->post_recv(ini.dp, &own, &rbad), EINVAL);
    EXPECT_EQ(dp_->post_recv(tgt.dp, &own, &rbad), EINVAL);
    ibv_send_wr *bad = nullptr;
    EXPECT_NE(dp_->post_send(tgt.dp, &w, &bad), 0);
    EXPECT_EQ(bad, &w);

    for (void *q : {ini.dp, tgt.dp}) {
        dp_->qp_close(q);
        dp_qps_.erase(std::find(dp_qps_.begin(), dp_qps_.end(), q));
    }
    for (ibv_qp_extend *q : {tgt.h.ext, ini.h.ext}) {
        ASSERT_EQ(ext_->ops->destroy_qp(q), 0);
        qps_.erase(std::find(qps_.begin(), qps_.end(), q));
    }
    dp_->srq_close(vsrq);
    dp_srqs_.erase(std::find(dp_srqs_.begin(), dp_srqs_.end(), vsrq));
    ASSERT_EQ(ext_->ops->destroy_srq(srq), 0);
    srqs_.erase(std::find(srqs_.begin(), srqs_.end(), srq));
    EXPECT_EQ(softnda_vdev_ops.close_xrcd(xrcd), 0);
}

TEST_F(Datapath, PollCqArguments) {
    ibv_wc wc{};
    EXPECT_EQ(dp_->poll_cq(vscq_, -1, &wc), -EINVAL);
    EXPECT_EQ(dp_->poll_cq(vscq_, 0, &wc), 0);
    EXPECT_EQ(dp_->poll_cq(vscq_, 1, &wc), 0);
}

TEST_F(Datapath, PollTakesManyCompletionsAtOnce) {
    VQp a, b;
    pair(a, b, QpCaps{.send_wr = 128});
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    std::vector<ibv_send_wr> wrs;
    for (uint64_t i = 0; i < 100; ++i) {
        wrs.push_back(writeWr(i, &s, &dst, dmr));
    }
    ASSERT_EQ(post(a, chain(wrs)), 0);
    // Wait until all are in the ring, then take them with one call (more than one helper batch).
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(scq_.cq.dbr_pi, __ATOMIC_ACQUIRE) - *scq_.cq.dbr_ci < 100 &&
           std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
    }
    std::vector<ibv_wc> wcs(128);
    ASSERT_EQ(dp_->poll_cq(vscq_, 128, wcs.data()), 100);
    for (uint64_t i = 0; i < 100; ++i) {
        EXPECT_EQ(wcs[i].wr_id, i);
        EXPECT_EQ(wcs[i].status, IBV_WC_SUCCESS);
    }
}

TEST_F(Datapath, OverflowedCqReportsAnErrorOnceDrained) {
    CqH small = makeCq(4);
    void *vsmall = openCq(small);
    ASSERT_EQ(small.ext->cq_info.qbuf.entry_cnt, 4u);
    VQp a = makeVQp(QpCaps{.send_wr = 16}, nullptr, &small, &small);
    VQp b = makeVQp(QpCaps{.send_wr = 16}, nullptr, &small, &small);
    connect(a.h, b.h);
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    std::vector<ibv_send_wr> wrs;
    for (uint64_t i = 0; i < 6; ++i) {
        wrs.push_back(writeWr(i, &s, &dst, dmr));
    }
    ASSERT_EQ(post(a, chain(wrs)), 0);
    const uint32_t *state = recordWord(small.ext->cq_info, 4);  // SPEC.md §1.1, §6.3
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(state, __ATOMIC_ACQUIRE) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
    }
    ASSERT_NE(__atomic_load_n(state, __ATOMIC_ACQUIRE), 0u);
    std::vector<ibv_wc> wc(16);
    EXPECT_EQ(dp_->poll_cq(vsmall, 16, wc.data()), 4);  // what was written before the overflow
    EXPECT_EQ(wc[0].wr_id, 0u);
    EXPECT_EQ(wc[3].wr_id, 3u);
    EXPECT_EQ(dp_->poll_cq(vsmall, 16, wc.data()), -EOVERFLOW);
}

TEST_F(Datapath, SrqReceivesFromManyQps) {
    SrqH srq = makeSrq(16, 2);
    void *vsrq = openSrq(srq, 16, 2);
    QpCaps c;
    VQp r1 = makeVQp(c, srq.ext), r2 = makeVQp(c, srq.ext);
    VQp s1 = makeVQp(c), s2 = makeVQp(c);
    connect(s1.h, r1.h);
    connect(s2.h, r2.h);
    std::vector<uint8_t> bufs(4 * 32, 0);
    ibv_mr *m = reg(bufs.data(), bufs.size());
    std::vector<ibv_sge> sg(4);
    std::vector<ibv_recv_wr> rw(4);
    for (int i = 0; i < 4; ++i) {
        sg[i] = vsge(bufs.data() + 32 * i, 32, m);
        rw[i].wr_id = 100 + i;
        rw[i].sg_list = &sg[i];
        rw[i].num_sge = 1;
    }
    ibv_recv_wr *bad = nullptr;
    ASSERT_EQ(dp_->post_srq_recv(vsrq, chain(rw), &bad), 0);
    auto p1 = pattern(10, 9), p2 = pattern(20, 10);
    ibv_sge a1 = vsge(p1.data(), 10, nullptr), a2 = vsge(p2.data(), 20, nullptr);
    auto w1 = sendWr(IBV_WR_SEND, 1, &a1, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    auto w2 = sendWr(IBV_WR_SEND_WITH_IMM, 2, &a2, 1, IBV_SEND_SIGNALED | IBV_SEND_INLINE);
    w2.imm_data = htonl(0xabc);
    ASSERT_EQ(post(s1, &w1), 0);
    ASSERT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);
    ASSERT_EQ(post(s2, &w2), 0);
    ASSERT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);
    auto wcs = waitWcs(vrcq_, 2);
    ASSERT_EQ(wcs.size(), 2u);
    // SRQ entries are taken in order.
    expectPlainWc(wcs[0], 100, IBV_WC_RECV, 10, r1.h.qpn());
    EXPECT_EQ(wcs[0].src_qp, s1.h.qpn());
    EXPECT_EQ(wcs[1].wr_id, 101u);
    EXPECT_EQ(wcs[1].qp_num, r2.h.qpn());
    EXPECT_EQ(wcs[1].src_qp, s2.h.qpn());
    EXPECT_EQ(wcs[1].byte_len, 20u);
    EXPECT_EQ(wcs[1].wc_flags, static_cast<unsigned>(IBV_WC_WITH_IMM));
    EXPECT_EQ(ntohl(wcs[1].imm_data), 0xabcu);
    EXPECT_EQ(std::memcmp(bufs.data(), p1.data(), 10), 0);
    EXPECT_EQ(std::memcmp(bufs.data() + 32, p2.data(), 20), 0);

    // A QP with an SRQ has no receive queue of its own.
    ibv_recv_wr own{};
    EXPECT_EQ(dp_->post_recv(r1.dp, &own, &bad), EINVAL);
    EXPECT_EQ(bad, &own);
}

TEST_F(Datapath, SrqFullAndBadRequests) {
    SrqH srq = makeSrq(8, 2);
    void *vsrq = openSrq(srq, 8, 2);
    ibv_sge sg[3] = {};
    std::vector<ibv_recv_wr> rw(10);
    for (auto &w : rw) {
        w.sg_list = sg;
        w.num_sge = 2;
    }
    ibv_recv_wr *bad = nullptr;
    rw[1].num_sge = 3;
    EXPECT_EQ(dp_->post_srq_recv(vsrq, chain(rw), &bad), EINVAL);
    EXPECT_EQ(bad, &rw[1]);
    rw[1].num_sge = 2;
    EXPECT_EQ(dp_->post_srq_recv(vsrq, &rw[1], &bad), ENOMEM);  // 1 + 7 = 8 fit
    EXPECT_EQ(bad, &rw[8]);
}

TEST_F(Datapath, SrqLimitIsArmedQueriedAndRaisesAnEvent) {
    SrqH srq = makeSrq(16, 1);
    void *vsrq = openSrq(srq, 16, 1);
    const Library &lib = library();
    VQp r = makeVQp(QpCaps{}, srq.ext), s = makeVQp();
    connect(s.h, r.h);
    ibv_srq_attr a{};
    a.srq_limit = 17;
    EXPECT_EQ(lib.modify_srq(vsrq, &a, IBV_SRQ_LIMIT), EINVAL);  // above max_wr
    a.max_wr = 32;
    EXPECT_EQ(lib.modify_srq(vsrq, &a, IBV_SRQ_MAX_WR), EINVAL);  // no resize
    EXPECT_EQ(lib.modify_srq(vsrq, &a, 0), EINVAL);
    a.srq_limit = 3;
    ASSERT_EQ(lib.modify_srq(vsrq, &a, IBV_SRQ_LIMIT), 0);
    ibv_srq_attr q{};
    ASSERT_EQ(lib.query_srq(vsrq, &q), 0);
    EXPECT_EQ(q.max_wr, 16u);
    EXPECT_EQ(q.max_sge, 1u);
    EXPECT_EQ(q.srq_limit, 3u);

    std::vector<ibv_recv_wr> rw(4);
    ibv_recv_wr *bad = nullptr;
    ASSERT_EQ(dp_->post_srq_recv(vsrq, chain(rw), &bad), 0);
    uint32_t before = dp_->srq_limit_events(vsrq);
    auto w = sendWr(IBV_WR_SEND, 1, nullptr, 0);
    std::vector<ibv_send_wr> two = {w, w};
    ASSERT_EQ(post(s, chain(two)), 0);  // 4 -> 2 posted: below the limit of 3
    EXPECT_EQ(waitWcs(vscq_, 2).size(), 2u);
    EXPECT_EQ(waitWcs(vrcq_, 2).size(), 2u);
    EXPECT_EQ(dp_->srq_limit_events(vsrq), before + 1);
    ASSERT_EQ(lib.query_srq(vsrq, &q), 0);
    EXPECT_EQ(q.srq_limit, 0u);  // the device disarmed it
}

TEST_F(Datapath, ErrorCompletionThenFlush) {
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge good = vsge(&src, 8, smr);
    ibv_sge badkey = good;
    badkey.lkey ^= 0x55;
    std::vector<ibv_send_wr> wrs = {
        sendWr(IBV_WR_RDMA_WRITE, 1, &badkey, 1, 0),  // unsignaled: still an error CQE
        sendWr(IBV_WR_RDMA_WRITE, 2, &good, 1, 0),    // flushed: always a CQE
        sendWr(IBV_WR_RDMA_READ, 3, &good, 1)};
    for (auto &w : wrs) {
        w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&dst);
        w.wr.rdma.rkey = dmr->rkey;
    }
    ASSERT_EQ(post(a, chain(wrs)), 0);
    auto wcs = waitWcs(vscq_, 3);
    ASSERT_EQ(wcs.size(), 3u);
    EXPECT_EQ(wcs[0].wr_id, 1u);
    EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
    EXPECT_EQ(wcs[0].qp_num, a.h.qpn());
    EXPECT_EQ(wcs[0].vendor_err, 0u);
    EXPECT_EQ(qpState(a.h), IBV_QPS_ERR);
    EXPECT_EQ(wcs[1].wr_id, 2u);
    EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wcs[1].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(wcs[2].status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wcs[2].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wcs[2].byte_len, 0u);
    // Posted after the error: flushed too, receives of the QP as well.
    ASSERT_EQ(post(a, &wrs[2]), 0);
    EXPECT_EQ(waitWc(vscq_).status, IBV_WC_WR_FLUSH_ERR);
    ASSERT_EQ(recv(a, 9, nullptr, 0), 0);
    ibv_wc r = waitWc(vrcq_);
    EXPECT_EQ(r.wr_id, 9u);
    EXPECT_EQ(r.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(r.opcode, IBV_WC_RECV);
    EXPECT_EQ(dst, 0u);
}

TEST_F(Datapath, RemoteErrorsCarryTheHardwareStatus) {
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t src = 1, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    auto w = writeWr(1, &s, &dst, dmr);
    w.wr.rdma.rkey = dmr->rkey + 1;
    ASSERT_EQ(post(a, &w), 0);
    ibv_wc wc = waitWc(vscq_);
    EXPECT_EQ(wc.status, IBV_WC_REM_ACCESS_ERR);
    EXPECT_EQ(wc.wr_id, 1u);

    // A misaligned atomic on a fresh pair.
    VQp c, d;
    pair(c, d);
    alignas(8) uint64_t target[2] = {0, 0};
    ibv_mr *tmr = reg(target, sizeof(target));
    auto at = sendWr(IBV_WR_ATOMIC_FETCH_AND_ADD, 2, &s, 1);
    at.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(target) + 4;
    at.wr.atomic.rkey = tmr->rkey;
    at.wr.atomic.compare_add = 1;
    ASSERT_EQ(post(c, &at), 0);
    EXPECT_EQ(waitWc(vscq_).status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(Datapath, RnrRetryExhaustedWithoutReceive) {
    VQp a = makeVQp(), b = makeVQp();
    connect(a.h, b.h, kAllAccess, 0);
    auto w = sendWr(IBV_WR_SEND, 4, nullptr, 0);
    ASSERT_EQ(post(a, &w), 0);
    ibv_wc wc = waitWc(vscq_);
    EXPECT_EQ(wc.wr_id, 4u);
    EXPECT_EQ(wc.status, IBV_WC_RNR_RETRY_EXC_ERR);
    EXPECT_EQ(wc.opcode, IBV_WC_SEND);
}

TEST_F(Datapath, ArmingStoresTheSpecWords) {
    // SPEC.md §9: `arm` at CQ record offset 8 (1 next, 2 solicited), `events` at offset 12, SQ
    // `fatal_events` at offset 8; the engine disarms and counts.
    uint32_t *arm = recordWord(scq_.ext->cq_info, 8);
    uint32_t *events = recordWord(scq_.ext->cq_info, 12);
    EXPECT_EQ(__atomic_load_n(arm, __ATOMIC_ACQUIRE), 0u);
    ASSERT_EQ(dp_->req_notify_cq(vscq_, 1), 0);
    EXPECT_EQ(__atomic_load_n(arm, __ATOMIC_ACQUIRE), 2u);
    ASSERT_EQ(dp_->req_notify_cq(vscq_, 0), 0);
    EXPECT_EQ(__atomic_load_n(arm, __ATOMIC_ACQUIRE), 1u);
    ASSERT_EQ(dp_->req_notify_cq(vscq_, 1), 0);  // already armed for any completion: stays so
    EXPECT_EQ(__atomic_load_n(arm, __ATOMIC_ACQUIRE), 1u);
    // The counters read exactly the device's words (stored here as the engine would).
    EXPECT_EQ(dp_->cq_events(vscq_), 0u);
    __atomic_store_n(events, 41u, __ATOMIC_RELEASE);
    EXPECT_EQ(dp_->cq_events(vscq_), 41u);
    EXPECT_EQ(dp_->cq_events(vrcq_), 0u);
    VQp q = makeVQp();
    uint32_t *fatal = recordWord(q.h.ext->sq_info, 8);
    EXPECT_EQ(dp_->qp_fatal_events(q.dp), 0u);
    __atomic_store_n(fatal, 3u, __ATOMIC_RELEASE);
    EXPECT_EQ(dp_->qp_fatal_events(q.dp), 3u);
    __atomic_store_n(fatal, 0u, __ATOMIC_RELEASE);
    __atomic_store_n(events, 0u, __ATOMIC_RELEASE);
    __atomic_store_n(arm, 0u, __ATOMIC_RELEASE);
}

// An engine that spins through the whole test (it sleeps only after spin_us without work).
class DatapathSpinning : public Datapath {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override { return {{"spin_us", "10000000"}}; }
};

TEST_F(DatapathSpinning, NoSystemCallPerWorkRequest) {
    VQp a, b;
    pair(a, b, QpCaps{.send_wr = 64});
    alignas(8) uint64_t src = 7, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    auto w = writeWr(0, &s, &dst, dmr);
    // Warm up: the engine may have been asleep when the device opened.
    ASSERT_EQ(post(a, &w), 0);
    ASSERT_EQ(waitWc(vscq_).status, IBV_WC_SUCCESS);

    // The only system call the data path can make is the wake hint, and it bumps wake_seq of the
    // page first (SPEC.md §4 step 5): unchanged wake_seq = no futex call.
    const uint32_t *wake_seq = a.h.sq.db.wake_seq;
    uint32_t seq0 = __atomic_load_n(wake_seq, __ATOMIC_ACQUIRE);
    softnda_counters c0 = counters();
    const int kWrs = 5000;
    for (int i = 0; i < kWrs; ++i) {
        w.wr_id = static_cast<uint64_t>(i);
        ASSERT_EQ(post(a, &w), 0);
        ASSERT_EQ(waitWc(vscq_).wr_id, static_cast<uint64_t>(i));
    }
    // Batched: 8 per chain, one doorbell each.
    std::vector<ibv_send_wr> batch(8, w);
    for (int i = 0; i < kWrs / 8; ++i) {
        ASSERT_EQ(post(a, chain(batch)), 0);
        ASSERT_EQ(waitWcs(vscq_, 8).size(), 8u);
    }
    softnda_counters c1 = counters();
    EXPECT_EQ(__atomic_load_n(wake_seq, __ATOMIC_ACQUIRE), seq0);
    EXPECT_EQ(c1.sleeps, c0.sleeps);
    EXPECT_EQ(c1.wakeups_by_hint, c0.wakeups_by_hint);
    EXPECT_EQ(c1.wqes_executed - c0.wqes_executed, static_cast<uint64_t>(kWrs + kWrs / 8 * 8));
    // One register rung per post_send call, whatever the chain's length.
    EXPECT_EQ(c1.doorbells - c0.doorbells, static_cast<uint64_t>(kWrs + kWrs / 8));
    EXPECT_EQ(dst, 7u);
}

// An engine that sleeps as soon as it is idle and never times out during the test.
class DatapathSleeping : public Datapath {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"spin_us", "0"}, {"sleep_us", "10000000"}};
    }
};

TEST_F(DatapathSleeping, DoorbellWakesASleepingEngine) {
    if (!softnda::haveFutexWaitv()) {
        GTEST_SKIP() << "no futex_waitv here (Linux < 5.16 or qemu-user): the engine does not sleep on "
                        "wake hints";
    }
    VQp a, b;
    pair(a, b);
    alignas(8) uint64_t src = 7, dst = 0;
    ibv_mr *smr = reg(&src, 8);
    ibv_mr *dmr = reg(&dst, 8);
    ibv_sge s = vsge(&src, 8, smr);
    auto w = writeWr(0, &s, &dst, dmr);
    // A ring that lands while the engine is between arming its pages and waiting ends the sleep
    // without a counted hint wake-up, so a few rounds may be needed; the engine's 10 s sleep means
    // each completion within the 20 s guard came from the hint.
    softnda_counters c = counters();
    const uint64_t hints0 = c.wakeups_by_hint;
    for (uint64_t round = 1; round <= 50 && c.wakeups_by_hint == hints0; ++round) {
        // The previous ring put the SQ's page among those the engine arms when it sleeps.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (__atomic_load_n(a.h.sq.db.engine_sleeping, __ATOMIC_SEQ_CST) == 0 &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        uint32_t seq = __atomic_load_n(a.h.sq.db.wake_seq, __ATOMIC_SEQ_CST);
        w.wr_id = round;
        ASSERT_EQ(post(a, &w), 0);
        ASSERT_EQ(waitWc(vscq_).wr_id, round);
        if (round > 1) {
            // The engine was asleep on this page: post_send gave the wake hint.
            EXPECT_NE(__atomic_load_n(a.h.sq.db.wake_seq, __ATOMIC_SEQ_CST), seq);
        }
        c = counters();
    }
    EXPECT_GT(c.wakeups_by_hint, hints0);
}

// ---- Threads -----------------------------------------------------------------------------

TEST_F(Datapath, ThreadsOnSeparateQps) {
    constexpr int kThreads = 4;
    constexpr uint64_t kPerThread = 3000;
    struct Lane {
        CqH cq;
        void *vcq = nullptr;
        VQp a, b;
        alignas(8) uint64_t src = 0;
        alignas(8) uint64_t dst = 0;
        ibv_mr *smr = nullptr, *dmr = nullptr;
    };
    std::vector<std::unique_ptr<Lane>> lanes;
    for (int t = 0; t < kThreads; ++t) {
        auto l = std::make_unique<Lane>();
        l->cq = makeCq(64);
        l->vcq = openCq(l->cq);
        l->a = makeVQp(QpCaps{.send_wr = 16}, nullptr, &l->cq, &l->cq);
        l->b = makeVQp(QpCaps{.send_wr = 16}, nullptr, &l->cq, &l->cq);
        connect(l->a.h, l->b.h);
        l->smr = reg(&l->src, 8);
        l->dmr = reg(&l->dst, 8);
        lanes.push_back(std::move(l));
    }
    std::atomic<int> failures{0};
    std::vector<std::thread> th;
    for (auto &lp : lanes) {
        Lane *l = lp.get();
        th.emplace_back([this, l, &failures] {
            ibv_sge s = vsge(&l->src, 8, l->smr);
            ibv_wc wc{};
            for (uint64_t i = 0; i < kPerThread && failures.load() == 0; ++i) {
                // One WRITE in flight: src changes only once the engine has read it.
                l->src = i;
                auto w = sendWr(IBV_WR_RDMA_WRITE, i, &s, 1);
                w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&l->dst);
                w.wr.rdma.rkey = l->dmr->rkey;
                ibv_send_wr *bad = nullptr;
                int n = 0;
                if (dp_->post_send(l->a.dp, &w, &bad) != 0) {
                    failures++;
                    break;
                }
                auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
                while ((n = dp_->poll_cq(l->vcq, 1, &wc)) == 0 &&
                       std::chrono::steady_clock::now() < deadline) {
                }
                if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != i || wc.qp_num != l->a.h.qpn() ||
                    l->dst != i) {
                    failures++;
                }
            }
        });
    }
    for (auto &t : th) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
}

TEST_F(Datapath, ThreadsShareOneQpAndOneCq) {
    constexpr int kPosters = 4;
    constexpr int kPollers = 2;
    constexpr uint64_t kPairs = 1000;  // per poster: a WRITE and a FETCH_AND_ADD, one chain
    constexpr uint64_t kPerPoster = 2 * kPairs;
    constexpr uint64_t kTotal = kPosters * kPerPoster;
    constexpr uint64_t kWindow = 32;  // per poster, so the CQ (1024) never overflows
    CqH cq = makeCq(1024);
    void *vcq = openCq(cq);
    VQp a = makeVQp(QpCaps{.send_wr = 32}, nullptr, &cq, &cq);
    VQp b = makeVQp(QpCaps{.send_wr = 32}, nullptr, &cq, &cq);
    connect(a.h, b.h);
    // Each poster writes its own constant into its own slot and adds 1 to a shared counter.
    std::vector<uint64_t> src(kPosters), dst(kPosters, 0), olds(kPosters, 0);
    alignas(8) uint64_t counter = 0;
    for (int t = 0; t < kPosters; ++t) {
        src[t] = 0x1000u + t;
    }
    ibv_mr *smr = reg(src.data(), src.size() * 8);
    ibv_mr *dmr = reg(dst.data(), dst.size() * 8);
    ibv_mr *omr = reg(olds.data(), olds.size() * 8);
    ibv_mr *cmr = reg(&counter, 8);
    std::atomic<int> failures{0};
    std::atomic<uint64_t> polled{0};
    std::vector<std::atomic<uint64_t>> done(kPosters);
    std::vector<std::atomic<int>> seen(kTotal);
    std::vector<std::thread> th;
    for (int t = 0; t < kPosters; ++t) {
        th.emplace_back([&, t] {
            ibv_sge ws = vsge(&src[t], 8, smr);
            ibv_sge as = vsge(&olds[t], 8, omr);
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            for (uint64_t i = 0; i < kPerPoster && failures.load() == 0;) {
                if (i - done[t].load() + 2 > kWindow) {
                    if (std::chrono::steady_clock::now() > deadline) {
                        failures++;
                    }
                    std::this_thread::yield();
                    continue;
                }
                uint64_t id = t * kPerPoster + i;
                std::vector<ibv_send_wr> two = {sendWr(IBV_WR_RDMA_WRITE, id, &ws, 1),
                                                sendWr(IBV_WR_ATOMIC_FETCH_AND_ADD, id + 1, &as, 1)};
                two[0].wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(&dst[t]);
                two[0].wr.rdma.rkey = dmr->rkey;
                two[1].wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(&counter);
                two[1].wr.atomic.rkey = cmr->rkey;
                two[1].wr.atomic.compare_add = 1;
                // A full SQ takes part of the chain: go on from bad_wr.
                ibv_send_wr *head = chain(two);
                while (head != nullptr && failures.load() == 0) {
                    ibv_send_wr *bad = nullptr;
                    int rc = dp_->post_send(a.dp, head, &bad);
                    if (rc == 0) {
                        break;
                    }
                    if (rc != ENOMEM || std::chrono::steady_clock::now() > deadline) {
                        failures++;
                    }
                    head = bad;
                    std::this_thread::yield();
                }
                i += 2;
            }
        });
    }
    for (int p = 0; p < kPollers; ++p) {
        th.emplace_back([&] {
            ibv_wc wc[16];
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
            while (polled.load() < kTotal && failures.load() == 0) {
                int n = dp_->poll_cq(vcq, 16, wc);
                if (n < 0 || std::chrono::steady_clock::now() > deadline) {
                    failures++;
                    return;
                }
                for (int k = 0; k < n; ++k) {
                    if (wc[k].status != IBV_WC_SUCCESS || wc[k].wr_id >= kTotal ||
                        wc[k].qp_num != a.h.qpn() ||
                        wc[k].opcode != (wc[k].wr_id % 2 == 0 ? IBV_WC_RDMA_WRITE : IBV_WC_FETCH_ADD)) {
                        failures++;
                        continue;
                    }
                    seen[wc[k].wr_id]++;
                    done[wc[k].wr_id / kPerPoster]++;
                }
                polled += static_cast<uint64_t>(n);
            }
        });
    }
    for (auto &t : th) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(polled.load(), kTotal);
    for (uint64_t i = 0; i < kTotal; ++i) {
        ASSERT_EQ(seen[i].load(), 1) << "wr_id " << i;
    }
    for (int t = 0; t < kPosters; ++t) {
        EXPECT_EQ(dst[t], 0x1000u + t);
    }
    EXPECT_EQ(__atomic_load_n(&counter, __ATOMIC_ACQUIRE), kPosters * kPairs);
}

TEST_F(Datapath, ThreadsPostOneSrq) {
    constexpr int kThreads = 4;
    constexpr int kPerThread = 500;
    SrqH srq = makeSrq(kThreads * kPerThread, 1);
    void *vsrq = openSrq(srq, kThreads * kPerThread, 1);
    std::vector<std::thread> th;
    std::atomic<int> failures{0};
    for (int t = 0; t < kThreads; ++t) {
        th.emplace_back([&, t] {
            for (int i = 0; i < kPerThread; ++i) {
                ibv_recv_wr w{};
                w.wr_id = static_cast<uint64_t>(t * kPerThread + i);
                ibv_recv_wr *bad = nullptr;
                if (dp_->post_srq_recv(vsrq, &w, &bad) != 0) {
                    failures++;
                }
            }
        });
    }
    for (auto &t : th) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(__atomic_load_n(srq.rq.dbr_pi, __ATOMIC_ACQUIRE), static_cast<uint32_t>(kThreads * kPerThread));
    // Every entry is there exactly once.
    std::set<uint64_t> ids;
    for (uint32_t i = 0; i < kThreads * kPerThread; ++i) {
        ids.insert(reinterpret_cast<const softnda_recv_wqe *>(srq.rq.buf + i * srq.rq.entry_size)->wr_id);
    }
    EXPECT_EQ(ids.size(), static_cast<size_t>(kThreads * kPerThread));
    ibv_recv_wr extra{};
    ibv_recv_wr *bad = nullptr;
    EXPECT_EQ(dp_->post_srq_recv(vsrq, &extra, &bad), ENOMEM);
}

}  // namespace
}  // namespace softnda_test
