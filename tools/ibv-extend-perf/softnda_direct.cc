// softnda in this process ("direct"): the driver's and vdev's ops called directly, queue memory
// from plain host memory with identity doorbell mapping (direct mode on a host-only NPU), and
// every work request posted and polled through softnda_device.h as a device kernel would.
#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"
#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/wr.h"

namespace ibvx::perf {
namespace {

void *hostAlloc(size_t size) {
    return std::aligned_alloc(4096, (size + 4095) & ~static_cast<size_t>(4095));
}
void hostFree(void *p) {
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
    return desc != nullptr && desc->type == DB_MAP_MODE_HOST_VA ? reinterpret_cast<void *>(desc->hva)
                                                                : nullptr;
}
int hostDbUnmap(void *ptr, doorbell_map_desc *desc) {
    return ptr != nullptr && desc != nullptr ? 0 : -EINVAL;
}
ibv_extend_ops g_host_ops = {hostAlloc, hostFree, hostMemset, hostMemcpy, hostDbMmap, hostDbUnmap};

[[noreturn]] void die(const std::string &what) {
    throw std::runtime_error("softnda direct: " + what + " failed (errno " + std::to_string(errno) + ")");
}

// One device context with a connected QP pair, its CQ and two registered buffers.
class Rig {
  public:
    // spin_us: the engine must not fall asleep between two measurements, unless (paired runs)
    // it must leave the CPU to the broker's engine while the other half is measured.
    Rig(const Options &opt, uint32_t sq_depth, size_t buf_size, uint32_t idle_qps = 0,
        uint32_t spin_us = 2000000, ibv_qp_type type = IBV_QPT_RC) {
        softnda_vdev_ops.configure("spin_us", std::to_string(spin_us).c_str());
        softnda_vdev_ops.configure("engine_threads", std::to_string(opt.engine_threads).c_str());
        ctx_ = softnda_vdev_ops.open_device("softnda0");
        if (ctx_ == nullptr) {
            die("open_device");
        }
        ext_ = softnda_driver_ops.alloc_context(ctx_);
        pd_ = softnda_vdev_ops.alloc_pd(ctx_);
        ibv_cq_init_attr_extend ca{};
        ca.attr.cqe = sq_depth;
        ca.ops = &g_host_ops;
        cq_ = ext_->ops->create_cq(ctx_, &ca);
        if (cq_ == nullptr) {
            die("create_cq");
        }
        for (auto **qp : {&a_, &b_}) {
            ibv_qp_init_attr_extend qa = rcQpAttr(pd_, cq_->cq, sq_depth);
            qa.attr.qp_type = type;
            qa.ops = &g_host_ops;
            *qp = ext_->ops->create_qp(ctx_, &qa);
            if (*qp == nullptr) {
                die("create_qp");
            }
        }
        for (uint32_t i = 0; i < idle_qps; ++i) {
            ibv_qp_init_attr_extend qa = rcQpAttr(pd_, cq_->cq, 1);
            qa.ops = &g_host_ops;
            ibv_qp_extend *q = ext_->ops->create_qp(ctx_, &qa);
            if (q == nullptr) {
                die("create_qp (idle)");
            }
            idle_.push_back(q);
        }
        if (type == IBV_QPT_UD) {
            bringUpUd(a_->qp);
            bringUpUd(b_->qp);
        } else {
            connect(a_->qp, b_->qp->qp_num, type);
            connect(b_->qp, a_->qp->qp_num, type);
        }
        src_ = static_cast<uint8_t *>(hostAlloc(buf_size));
        dst_ = static_cast<uint8_t *>(hostAlloc(buf_size));
        std::memset(src_, 0x5a, buf_size);
        std::memset(dst_, 0, buf_size);
        int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        smr_ = softnda_vdev_ops.reg_mr(pd_, src_, buf_size, reinterpret_cast<uintptr_t>(src_), acc);
        dmr_ = softnda_vdev_ops.reg_mr(pd_, dst_, buf_size, reinterpret_cast<uintptr_t>(dst_), acc);
        if (smr_ == nullptr || dmr_ == nullptr) {
            die("reg_mr");
        }
        if (softnda_sq_init(&sq_, &a_->sq_info) != 0 || softnda_cq_init(&cqh_, &cq_->cq_info) != 0 ||
            softnda_rq_init(&rq_b_, &b_->rq_info) != 0) {
            die("queue_info");
        }
    }
    ~Rig() {
        softnda_vdev_ops.dereg_mr(smr_);
        softnda_vdev_ops.dereg_mr(dmr_);
        hostFree(src_);
        hostFree(dst_);
        for (ibv_qp_extend *q : idle_) {
            ext_->ops->destroy_qp(q);
        }
        ext_->ops->destroy_qp(a_);
        ext_->ops->destroy_qp(b_);
        ext_->ops->destroy_cq(cq_);
        softnda_vdev_ops.dealloc_pd(pd_);
        softnda_driver_ops.free_context(ext_);
        softnda_vdev_ops.close_device(ctx_);
        softnda_vdev_ops.configure("spin_us", "50");
        softnda_vdev_ops.configure("engine_threads", "1");
    }
    Rig(const Rig &) = delete;
    Rig &operator=(const Rig &) = delete;

    softnda_send_wr write(uint32_t len, uint8_t flags, uint64_t wr_id) {
        sge_ = softnda_sge{reinterpret_cast<uintptr_t>(src_), len, smr_->lkey};
        return rdmaWrite(&sge_, reinterpret_cast<uintptr_t>(dst_), dmr_->rkey, flags, wr_id);
    }
    // An 8 B UD SEND from A to B (the Q_Key both have, port 1's LID), unsignalled.
    softnda_send_wr datagram(uint64_t wr_id) {
        sge_ = softnda_sge{reinterpret_cast<uintptr_t>(src_), 8, smr_->lkey};
        softnda_send_wr w{};
        w.wr_id = wr_id;
        w.opcode = SOFTNDA_OP_SEND;
        w.sg_list = &sge_;
        w.num_sge = 1;
        ibv_port_attr port{};
        softnda_vdev_ops.query_port(ctx_, 1, &port);
        softnda_send_wr_set_ud(&w, b_->qp->qp_num, kQkey, port.lid);
        return w;
    }
    // One receive on B into the destination buffer (room for the GRH and 8 bytes).
    void postReceiveOnB() {
        softnda_sge r{reinterpret_cast<uintptr_t>(dst_), SOFTNDA_GRH_SIZE + 8, dmr_->lkey};
        if (softnda_rq_post(&rq_b_, 0, &r, 1) != 0) {
            die("post receive");
        }
        softnda_rq_doorbell(&rq_b_);
    }
    // Spins until one CQE; throws on an error completion.
    void waitCqe() {
        if (int st = waitOneCqe(&cqh_); st != IBV_WC_SUCCESS) {
            die("completion status " + std::to_string(st));
        }
    }

    // One QP with the write8 rig's attributes created (timed) and destroyed (not timed); ns.
    uint64_t createQpNs() {
        ibv_qp_init_attr_extend qa = rcQpAttr(pd_, cq_->cq, 64);
        qa.ops = &g_host_ops;
        auto t0 = Clock::now();
        ibv_qp_extend *q = ext_->ops->create_qp(ctx_, &qa);
        uint64_t ns = nsSince(t0);
        if (q == nullptr || ext_->ops->destroy_qp(q) != 0) {
            die("create_qp/destroy_qp");
        }
        return ns;
    }

    ibv_context *context() const { return ctx_; }
    ibv_context_extend *ext() const { return ext_; }
    ibv_pd *pd() const { return pd_; }
    ibv_cq *cq() const { return cq_->cq; }

    softnda_sq sq_{};
    softnda_rq rq_b_{};
    softnda_cq cqh_{};
    uint8_t *src_ = nullptr;
    uint8_t *dst_ = nullptr;

  private:
    static constexpr uint32_t kQkey = 0x1111;

    static void bringUpUd(ibv_qp *qp) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qkey = kQkey;
        if (softnda_vdev_ops.modify_qp(qp, &a,
                                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) != 0) {
            die("modify INIT (UD)");
        }
        a.qp_state = IBV_QPS_RTR;
        if (softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE) != 0) {
            die("modify RTR (UD)");
        }
        a.qp_state = IBV_QPS_RTS;
        if (softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) != 0) {
            die("modify RTS (UD)");
        }
    }

    // RC or UC (which has no reliability attributes: SPEC.md §11.2).
    static void connect(ibv_qp *qp, uint32_t dest, ibv_qp_type type) {
        const bool rc = type == IBV_QPT_RC;
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
        if (softnda_vdev_ops.modify_qp(
                qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
            die("modify INIT");
        }
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTR;
        a.dest_qp_num = dest;
        a.path_mtu = IBV_MTU_4096;
        const int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        if (softnda_vdev_ops.modify_qp(
                qp, &a, rc ? rtr | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : rtr) != 0) {
            die("modify RTR");
        }
        a = ibv_qp_attr{};
        a.qp_state = IBV_QPS_RTS;
        const int rts = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if (softnda_vdev_ops.modify_qp(
                qp, &a,
                rc ? rts | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC
                   : rts) != 0) {
            die("modify RTS");
        }
    }

    ibv_context *ctx_ = nullptr;
    ibv_context_extend *ext_ = nullptr;
    ibv_pd *pd_ = nullptr;
    ibv_cq_extend *cq_ = nullptr;
    ibv_qp_extend *a_ = nullptr;
    ibv_qp_extend *b_ = nullptr;
    ibv_mr *smr_ = nullptr;
    ibv_mr *dmr_ = nullptr;
    softnda_sge sge_{};
    std::vector<ibv_qp_extend *> idle_;
};

// One 8 B WRITE at a time, post + doorbell -> CQE, the same round-trip shape as the ping-pong.
// With idle_qps > 0 that many QPs (never rung) exist on the same device first, the case the
// doorbell summary design is for: their registers must not slow down the one being rung.
void write8Latency(const Options &opt, Results &out, uint32_t idle_qps = 0) {
    const int iters = opt.quick ? 200 : 200000;
    const int warmup = opt.quick ? 20 : 1000;
    Rig rig(opt, 64, 4096, idle_qps);
    uint64_t id = 0;
    std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] {
        softnda_send_wr w = rig.write(8, SOFTNDA_WQE_SIGNALED, id++);
        auto t0 = Clock::now();
        softnda_sq_post(&rig.sq_, &w);
        softnda_sq_doorbell(&rig.sq_);
        rig.waitCqe();
        return nsSince(t0);
    });
    if (idle_qps > 0) {
        out.add("fastpath", "write8_p50_ns_direct_idle" + std::to_string(idle_qps), percentile(ns, 50), "ns",
                std::to_string(idle_qps) + " idle QPs on the device");
        return;
    }
    out.add("fastpath", "write8_p50_ns_direct", percentile(ns, 50), "ns",
            "8 B WRITE post->CQE, in-process softnda");
    out.add("fastpath", "write8_p99_ns_direct", percentile(ns, 99), "ns");
}

// The unreliable transports beside RC in the same run (SPEC.md §11): an 8 B UD SEND, post +
// doorbell -> the receiver's CQE (the receive reposted outside the timing), and an 8 B UC WRITE,
// post + doorbell -> CQE, one at a time.
void unreliableLatency(const Options &opt, Results &out) {
    const int iters = opt.quick ? 200 : 200000;
    const int warmup = opt.quick ? 20 : 1000;
    // One work request of rig's, timed from its post to its CQE.
    auto postAndWait = [](Rig &rig, const softnda_send_wr &w) {
        auto t0 = Clock::now();
        softnda_sq_post(&rig.sq_, &w);
        softnda_sq_doorbell(&rig.sq_);
        rig.waitCqe();
        return nsSince(t0);
    };
    {
        Rig rig(opt, 64, 4096, 0, 2000000, IBV_QPT_UD);
        uint64_t id = 0;
        std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] {
            rig.postReceiveOnB();
            return postAndWait(rig, rig.datagram(id++));
        });
        out.add("fastpath", "ud_send8_p50_ns_direct", percentile(ns, 50), "ns",
                "8 B UD SEND post->receive CQE, in-process softnda");
        out.add("fastpath", "ud_send8_p99_ns_direct", percentile(ns, 99), "ns");
    }
    Rig rig(opt, 64, 4096, 0, 2000000, IBV_QPT_UC);
    uint64_t id = 0;
    std::vector<uint64_t> ns = timedSamples(
        iters, warmup, [&] { return postAndWait(rig, rig.write(8, SOFTNDA_WQE_SIGNALED, id++)); });
    out.add("fastpath", "uc_write8_p50_ns_direct", percentile(ns, 50), "ns",
            "8 B UC WRITE post->CQE, in-process softnda");
    out.add("fastpath", "uc_write8_p99_ns_direct", percentile(ns, 99), "ns");
}

// 8 B WRITEs, 64 per doorbell, one signaled per batch, up to 8 batches in flight.
void messageRate(const Options &opt, Results &out) {
    constexpr uint32_t kBatch = 64;
    constexpr uint32_t kInFlight = 8;
    // Bounded by count and by time: the figure is a rate, a loaded machine must not stretch the run.
    const uint64_t total = opt.quick ? 10'240 : 20'000'000;
    const uint64_t max_ns = opt.quick ? 500'000'000ull : 3'000'000'000ull;
    Rig rig(opt, kBatch * kInFlight, 4096);
    uint64_t posted = 0, batches_in_flight = 0;
    softnda_cqe e[16];
    auto t0 = Clock::now();
    uint64_t limit = total;
    while (posted < limit || batches_in_flight > 0) {
        if (posted < limit && (posted / kBatch) % 256 == 0 && nsSince(t0) > max_ns) {
            limit = posted;
        }
        while (posted < limit && batches_in_flight < kInFlight) {
            for (uint32_t i = 0; i < kBatch; ++i) {
                softnda_send_wr w = rig.write(8, i == kBatch - 1 ? SOFTNDA_WQE_SIGNALED : 0, posted + i);
                softnda_sq_post(&rig.sq_, &w);
            }
            softnda_sq_doorbell(&rig.sq_);
            posted += kBatch;
            batches_in_flight++;
        }
        int n = softnda_cq_poll(&rig.cqh_, e, 16);
        if (n < 0) {
            die("message-rate CQ");
        }
        for (int i = 0; i < n; ++i) {
            if (e[i].status != IBV_WC_SUCCESS) {
                die("message-rate completion");
            }
        }
        batches_in_flight -= static_cast<uint64_t>(n);
    }
    double sec = static_cast<double>(nsSince(t0)) / 1e9;
    out.add("fastpath", "msg_rate_mwrs", static_cast<double>(posted) / sec / 1e6, "M WR/s",
            "8 B WRITE, 64 per doorbell, 1 engine thread");
}

// 1 MiB WRITEs, up to 4 in flight.
void write1m(const Options &opt, Results &out) {
    constexpr uint32_t kSize = 1 << 20;
    constexpr int kInFlight = 4;
    const int max_total = opt.quick ? 8 : 4000;
    const uint64_t max_ns = opt.quick ? 500'000'000ull : 3'000'000'000ull;
    Rig rig(opt, 16, kSize);
    int posted = 0, done = 0, in_flight = 0, total = max_total;
    auto t0 = Clock::now();
    while (done < total) {
        if (posted < total && nsSince(t0) > max_ns) {
            total = posted;
        }
        while (posted < total && in_flight < kInFlight) {
            softnda_send_wr w = rig.write(kSize, SOFTNDA_WQE_SIGNALED, static_cast<uint64_t>(posted));
            softnda_sq_post(&rig.sq_, &w);
            softnda_sq_doorbell(&rig.sq_);
            posted++;
            in_flight++;
        }
        rig.waitCqe();
        done++;
        in_flight--;
    }
    double sec = static_cast<double>(nsSince(t0)) / 1e9;
    if (std::memcmp(rig.src_, rig.dst_, kSize) != 0) {
        die("1 MiB WRITE data check");
    }
    out.add("fastpath", "write1m_gbps", static_cast<double>(kSize) * done / sec / 1e9, "GB/s",
            "1 MiB WRITE, 4 in flight");
}

// The control-path baseline: the driver's create_qp called in this process, no broker.
void createQpDirect(const Options &opt, Results &out) {
    const int iters = opt.quick ? 20 : 3000;
    const int warmup = opt.quick ? 2 : 100;
    Rig rig(opt, 64, 4096);
    std::vector<uint64_t> ns = timedSamples(iters, warmup, [&] { return rig.createQpNs(); });
    out.add("control", "create_qp_p50_us_direct", percentile(ns, 50) / 1e3, "us",
            "softnda create_qp in-process");
}

// Queue memory from one mapping, never from the heap, so that the heap's growth while QPs are
// made is the driver's own bookkeeping alone. Freed with the mapping.
class QueueArena {
  public:
    explicit QueueArena(size_t bytes) : size_(bytes) {
        void *p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
        if (p == MAP_FAILED) {
            die("mmap of the queue arena");
        }
        base_ = static_cast<uint8_t *>(p);
        current = this;
        ops_ = g_host_ops;
        ops_.alloc = [](size_t size) { return current->take(size); };
        ops_.free = [](void *) {};
    }
    ~QueueArena() {
        ::munmap(base_, size_);
        current = nullptr;
    }
    QueueArena(const QueueArena &) = delete;
    QueueArena &operator=(const QueueArena &) = delete;
    ibv_extend_ops *ops() { return &ops_; }

  private:
    void *take(size_t size) {
        const size_t at = (used_ + 4095) & ~size_t{4095};
        if (at + size > size_) {
            return nullptr;
        }
        used_ = at + size;
        return base_ + at;
    }
    static inline QueueArena *current = nullptr;  // the ops carry no context pointer
    uint8_t *base_ = nullptr;
    size_t size_ = 0;
    size_t used_ = 0;
    ibv_extend_ops ops_{};
};

class DirectProbe : public Write8Probe {
  public:
    DirectProbe(const Options &opt, uint32_t spin_us) : rig_(opt, 64, 4096, 0, spin_us) {}
    uint64_t once() override {
        softnda_send_wr w = rig_.write(8, SOFTNDA_WQE_SIGNALED, id_++);
        auto t0 = Clock::now();
        softnda_sq_post(&rig_.sq_, &w);
        softnda_sq_doorbell(&rig_.sq_);
        rig_.waitCqe();
        return nsSince(t0);
    }

  private:
    Rig rig_;
    uint64_t id_ = 0;
};

}  // namespace

double softndaHeapBytesPerQp(const Options &opt, uint32_t qps) {
    Rig rig(opt, 64, 4096);
    QueueArena arena(static_cast<size_t>(qps) * 16 * 4096);
    std::vector<ibv_qp_extend *> made;
    made.reserve(qps);
    const size_t before = ::mallinfo2().uordblks;
    for (uint32_t i = 0; i < qps; ++i) {
        ibv_qp_init_attr_extend qa = rcQpAttr(rig.pd(), rig.cq(), 1);  // the scale scenario's QP
        qa.ops = arena.ops();
        ibv_qp_extend *q = rig.ext()->ops->create_qp(rig.context(), &qa);
        if (q == nullptr) {
            die("create_qp (heap bytes)");
        }
        made.push_back(q);
    }
    const size_t after = ::mallinfo2().uordblks;
    for (ibv_qp_extend *q : made) {
        rig.ext()->ops->destroy_qp(q);
    }
    return static_cast<double>(after - before) / static_cast<double>(qps);
}

std::unique_ptr<Write8Probe> makeDirectWrite8Probe(const Options &opt, uint32_t spin_us) {
    return std::make_unique<DirectProbe>(opt, spin_us);
}

void runControlDirect(const Options &opt, Results &out) {
    if (opt.wants("createqp")) {
        createQpDirect(opt, out);
    }
}

void runSoftndaDirect(const Options &opt, Results &out) {
    if (opt.wants("write8")) {
        write8Latency(opt, out);
    }
    if (opt.wants("unreliable")) {
        unreliableLatency(opt, out);
    }
    if (opt.wants("idle10k")) {
        write8Latency(opt, out, opt.quick ? 100 : 10000);
    }
    if (opt.wants("msgrate")) {
        messageRate(opt, out);
    }
    if (opt.wants("write1m")) {
        write1m(opt, out);
    }
    const Row *floor = out.find("floors", "shm_pingpong_p50_ns");
    const Row *w8 = out.find("fastpath", "write8_p50_ns_direct");
    if (floor != nullptr && w8 != nullptr && floor->value > 0) {
        out.add("fastpath", "write8_over_shm_floor", w8->value / floor->value, "x",
                "goal <= 10 (direct figure)");
    }
    const Row *mc = out.find("floors", "memcpy_gbps");
    const Row *w1 = out.find("fastpath", "write1m_gbps");
    if (mc != nullptr && w1 != nullptr && mc->value > 0) {
        out.add("fastpath", "write1m_over_memcpy", w1->value / mc->value, "x", "goal >= 0.8");
    }
    softnda_counters c{};
    if (softnda_query_counters("softnda0", &c) == 0) {
        out.add("softnda", "wqes_executed", static_cast<double>(c.wqes_executed), "WQEs");
        out.add("softnda", "doorbells", static_cast<double>(c.doorbells), "rings");
        out.add("softnda", "engine_sleeps", static_cast<double>(c.sleeps), "sleeps");
    }
}

}  // namespace ibvx::perf
