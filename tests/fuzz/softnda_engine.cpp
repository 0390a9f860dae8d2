// Fuzz target: softnda's engine (providers/softnda/src/engine.cc) fed what a hostile tenant
// controls: the objects it makes (MRs of any size, access and iova, CQs, SRQs, RC, UC, UD and XRC
// QPs with any caps, connected to each other in any state), then raw bytes in its queue memory
// (WQEs and receive entries with any opcode, flags, SGE count, inline length, SGE list, keys),
// producer indexes anywhere (jumps, overflows) and doorbells rung every way a tenant can.
//
// Input: records of softnda_world.h (`u8 op, u16 len (LE), bytes[len]`), op % 16:
//    0 MR       u32 size, u8 access, u8 flags, u64 iova              (World::addMr)
//    1 MW       u8 type, u8 pd                                       (World::addMw)
//    2 CQ       u16 cqe, u8 flags                                    (World::addCq)
//    3 SRQ      u16 max_wr, u8 max_sge, u8 flags, u8 cq, u32 limit   (World::addSrq)
//    4 QP       u8 type, u8 scq, u8 rcq, u8 srq, u16 send_wr, u16 recv_wr, u8 send_sge,
//               u8 recv_sge, u16 inline, u8 flags                    (World::addQp)
//    5 CONNECT  u8 qp, u32 dest, u8 state, u32 sq_psn, u32 rq_psn, u8 access, u8 timeout,
//               u8 retry_cnt, u8 rnr_retry, u8 min_rnr_timer, u8 max_rd_atomic,
//               u8 max_dest_rd_atomic, u8 mtu, u32 qkey
//               brings a QP in RESET up (state % 5: RTS, RTR, INIT, SQD, ERR) towards dest (a
//               QPN, renamed: 1..16 pick this input's QPs); timeout, retry and RNR attributes are
//               kept where every wait ends within a millisecond (no rnr_retry 7, no long timer)
//    6 WQE      u8 qp, bytes: a raw send WQE at the SQ's producer index
//    7 RECV     u8 queue, bytes: a raw receive entry (queue bit 7: an SRQ)
//    8 PI       u8 queue, u32 delta: the producer index jumps
//    9 RING     u8 queue, u8 mode, u32 value: publish and ring (helper, summary bit only, bare
//               register store, both)
//   10 FILL     u8 queue, bytes: the whole ring filled with the bytes repeated
//   11 ARM      u8 target, u32 value: a CQ's arm word, an SRQ's limit word
//   12 STATE    u8 qp, u8 what: ERR, SQD, RTS, RESET
//   13 POLL     u8 cq, u8 n
//   14 SETTLE   wait until the engine has finished everything published so far
//   15 DESTROY  u8 kind, u8 index: a QP, SRQ, CQ or MR goes away now, the engine running
// Keys, QPNs and XRC SRQ numbers in what is written are renamed (softnda_world.h, Names): 1..16
// name this input's MRs (as lkeys and rkeys), QPs and XRC SRQs, 17..32 its memory windows.
//
// Invariants (a violation aborts, like a crash): no sanitizer report; the engine finishes every
// published WQE within 5 s (SQs of QPs in RTS and ERR empty, RQs of QPs in ERR flushed); every
// object destroys with 0 at the end; afterwards no queue memory, doorbell mapping or fd is left.
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>

#include "tests/fuzz/softnda_world.h"

namespace {

using namespace ibvx::fuzz::softnda_world;
using softnda_test::MemfdArena;

constexpr size_t kMaxRecords = 256;
constexpr auto kSettleLimit = std::chrono::seconds(5);

// softnda0 opened once per process, with one engine thread (one order of execution for a given
// input) that sleeps as soon as it is idle and sweeps its registers every 200 us while it sleeps
// (a bare register store is found that soon).
class Device {
  public:
    Device() {
        const char *kv[][2] = {
            {"devices", "1"},        {"netdev", ""},
            {"engine_threads", "1"}, {"spin_us", "0"},
            {"sleep_us", "200"},     {"futex_waitv", "1"},
            {"max_sge", "29"},       {"max_inline_data", "464"},
            {"max_qp_wr", "32768"},  {"max_cqe", "4194304"},
            {"max_srq_wr", "32768"}, {"max_msg_sz", "2147483648"},
            {"phys_port_cnt", "1"},  {"max_mr_size", "1099511627776"},
        };
        for (auto &p : kv) {
            FUZZ_CHECK(softnda_vdev_ops.configure(p[0], p[1]) == 0, "configure %s=%s", p[0], p[1]);
        }
        env_.ctx = softnda_vdev_ops.open_device("softnda0");
        FUZZ_CHECK(env_.ctx != nullptr, "open_device: %s", std::strerror(errno));
        env_.ext = softnda_driver_ops.alloc_context(env_.ctx);
        FUZZ_CHECK(env_.ext != nullptr, "alloc_context: %s", std::strerror(errno));
        for (ibv_pd *&pd : env_.pd) {
            pd = softnda_vdev_ops.alloc_pd(env_.ctx);
            FUZZ_CHECK(pd != nullptr, "alloc_pd: %s", std::strerror(errno));
        }
        env_.event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        FUZZ_CHECK(env_.event_fd >= 0, "eventfd: %s", std::strerror(errno));
        FUZZ_CHECK(softnda_vdev_ops.set_async_event_fd(env_.ctx, env_.event_fd) == 0, "set_async_event_fd");
        warmUp(env_);
    }
    ~Device() {
        for (ibv_pd *pd : env_.pd) {
            softnda_vdev_ops.dealloc_pd(pd);
        }
        softnda_driver_ops.free_context(env_.ext);
        softnda_vdev_ops.close_device(env_.ctx);
        close(env_.event_fd);
    }
    const Env &env() const { return env_; }

  private:
    Env env_;
};

// CONNECT (readConnect): dest names one of this input's QPs (renamed), and a peer that never
// answers is given up after (retry_cnt + 1) x 4.096 us x 2^timeout, at most 0.5 ms here.
void connectQp(World &w, Fields &f) {
    ConnectRecord r = readConnect(f);
    r.conn.timeout %= 5;
    r.conn.dest_qpn = w.names().qpn(r.dest);
    if (!w.qps().empty()) {
        w.bringUp(r.qp % w.qps().size(), r.conn);
    }
}

void settle(World &w) {
    if (!w.settle(kSettleLimit)) {
        w.trace();
        FUZZ_CHECK(false, "the engine did not finish this input's work within %lld s",
                   static_cast<long long>(kSettleLimit.count()));
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const Device &dev = ibvx::fuzz::processFixture<Device>();
    const int fds_before = ibvx::fuzz::countOpenFds();
    const size_t memory_before = HeapQueueMemory::live();
    const size_t doorbells_before = MemfdArena::instance().liveDbMappings();
    const softnda_counters counters_before = deviceCounters();
    {
        World w(dev.env());
        forEachRecord(std::span<const uint8_t>(data, size), kMaxRecords, [&](uint8_t op, Fields &f) {
            switch (op % 16) {
                case 0:
                    return w.addMr(f);
                case 1:
                    return w.addMw(f);
                case 2:
                    return w.addCq(f);
                case 3:
                    return w.addSrq(f);
                case 4:
                    return w.addQp(f);
                case 5:
                    return connectQp(w, f);
                case 6:
                    return w.writeWqe(f);
                case 7:
                    return w.writeRecv(f);
                case 8:
                    return w.movePi(f);
                case 9:
                    return w.ring(f);
                case 10:
                    return w.fill(f);
                case 11:
                    return w.arm(f);
                case 12:
                    return w.setState(f);
                case 13:
                    return w.poll(f);
                case 14:
                    return settle(w);
                default:
                    return w.destroyNow(f);
            }
        });
        settle(w);
        if (tracing()) {
            w.trace();
            traceCounters(counters_before);
        }
        w.teardown();
    }
    FUZZ_CHECK(HeapQueueMemory::live() == memory_before, "queue allocations %zu -> %zu", memory_before,
               HeapQueueMemory::live());
    FUZZ_CHECK(MemfdArena::instance().liveDbMappings() == doorbells_before, "doorbell mappings %zu -> %zu",
               doorbells_before, MemfdArena::instance().liveDbMappings());
    FUZZ_CHECK(ibvx::fuzz::countOpenFds() == fds_before, "fds %d -> %d", fds_before,
               ibvx::fuzz::countOpenFds());
    return 0;
}
