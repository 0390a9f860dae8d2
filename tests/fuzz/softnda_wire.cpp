// Fuzz target: softnda's RoCEv2 wire (providers/softnda/src/wire.cc, roce_wire.cc) fed the
// packets another host can send: any BTH, RETH, AETH, AtomicETH, AtomicAckETH, DETH, XRCETH,
// ImmDt and IETH, any PSN, truncated frames and bad ICRCs, aimed at the QPs this input made
// (RC, UC, UD and XRC, connected to that host), which can have WQEs of their own on the wire, so
// the responder, the requester and the completer all take packets.
//
// softnda0 is bound to the loopback interface (netdev "lo", a UDP port of its own). The other
// host is 127.0.0.2: the QPs connect to ::ffff:127.0.0.2, and the packets are sent from a UDP
// socket bound there to the device's port, exactly as a peer's arrive; 127.0.0.3 is a host no QP
// is connected to. What the device sends to 127.0.0.2 comes back to its own socket (it listens on
// every address of lo) and is dropped as a packet from no peer. Without an IPv4 loopback address
// (a namespace without 127.0.0.1) there is nothing to fuzz: every input returns at once.
//
// Input: records of softnda_world.h (`u8 op, u16 len (LE), bytes[len]`), op % 16:
//    0 MR, 1 CQ, 2 SRQ, 3 QP, 5 WQE, 6 RECV, 7 RING, 10 STATE, 11 POLL, 12 PI, 13 MW, 14 ARM,
//   15 DESTROY   as in softnda_engine.cpp (World's handlers)
//    4 CONNECT   u8 qp, u32 remote_qpn, u8 state, u32 sq_psn, u32 rq_psn, u8 access, u8 timeout,
//                u8 retry_cnt, u8 rnr_retry, u8 min_rnr_timer, u8 max_rd_atomic,
//                u8 max_dest_rd_atomic, u8 mtu, u32 qkey, u8 path
//                brings a QP in RESET up (state % 5: RTS, RTR, INIT, SQD, ERR) connected to
//                remote_qpn (as it is: a number of the other host) at ::ffff:127.0.0.2, or with
//                path & 1 at this host's own address (no wire); the ACK timeout is 67 ms or more,
//                so the clock retransmits nothing within an input
//    8 PKT       u8 flags, bytes: the bytes are a UDP payload (BTH onwards) sent to the device;
//                flags & 3: 0 or 3 the ICRC computed, 1 computed and then wrong, 2 as given;
//                flags & 4: from 127.0.0.3. Its BTH destination QP and the keys and SRQ number of
//                its extension headers are renamed as the World renames what is written (1..16:
//                this input's QPs, MRs, XRC SRQs)
//    9 SYNC      every packet sent so far taken by the device, and its engine idle
// A PKT after anything that may make the device send (a ring, a connection, a state change)
// first waits for the engine to be idle, so the packets answer WQEs already on the wire.
//
// Invariants: no sanitizer report; the device's wire thread takes every packet (a marker
// datagram sent after them arrives, on a QP of the harness) and its engine goes idle within 5 s;
// every object destroys with 0; afterwards no queue memory, doorbell mapping or fd is left.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdio>

#include "common/unique_fd.h"
#include "providers/softnda/src/roce_wire.h"
#include "tests/fuzz/softnda_world.h"

namespace {

using namespace ibvx::fuzz::softnda_world;
using softnda_test::MemfdArena;
namespace roce = softnda::roce;

constexpr size_t kMaxRecords = 256;
constexpr size_t kMaxPackets = 64;
constexpr size_t kMaxPacketBytes = 4096 + 64;
constexpr auto kLimit = std::chrono::seconds(5);
constexpr uint32_t kDeviceAddr = 0x7f000001, kPeerAddr = 0x7f000002,
                   kStrangerAddr = 0x7f000003;  // host order
constexpr uint32_t kMarkerQkey = 0x0badcafe;

ibv_gid v4Gid(uint32_t addr) {
    ibv_gid g{};
    g.raw[10] = g.raw[11] = 0xff;
    const uint32_t be = htonl(addr);
    std::memcpy(g.raw + 12, &be, 4);
    return g;
}

// The ICRC a packet from src:sport to dst:dport must carry, over the headers the kernel writes
// for it (wire.cc's wireIcrc for IPv4: DF, identification 0; icrcIpv4 masks TOS, TTL and the
// checksums).
uint32_t icrcOf(uint32_t src, uint32_t dst, uint16_t sport, uint16_t dport, std::span<const uint8_t> packet) {
    uint8_t udp[roce::kUdpLen] = {};
    const size_t udp_len = roce::kUdpLen + packet.size();
    udp[0] = static_cast<uint8_t>(sport >> 8);
    udp[1] = static_cast<uint8_t>(sport);
    udp[2] = static_cast<uint8_t>(dport >> 8);
    udp[3] = static_cast<uint8_t>(dport);
    udp[4] = static_cast<uint8_t>(udp_len >> 8);
    udp[5] = static_cast<uint8_t>(udp_len);
    uint8_t ip[roce::kIpv4Len] = {};
    const size_t ip_len = roce::kIpv4Len + udp_len;
    ip[0] = 0x45;
    ip[2] = static_cast<uint8_t>(ip_len >> 8);
    ip[3] = static_cast<uint8_t>(ip_len);
    ip[6] = 0x40;  // DF
    ip[9] = IPPROTO_UDP;
    const uint32_t s = htonl(src), d = htonl(dst);
    std::memcpy(ip + 12, &s, 4);
    std::memcpy(ip + 16, &d, 4);
    return roce::icrcIpv4(ip, udp, packet.first(packet.size() - roce::kIcrcLen));
}

// A UDP socket of a host on lo (127.0.0.x, an ephemeral port) sending to the device's port.
class Host {
  public:
    bool bind(uint32_t addr) {
        addr_ = addr;
        fd_.reset(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(addr);
        socklen_t len = sizeof(sa);
        if (fd_.get() < 0 || ::bind(fd_.get(), reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) < 0 ||
            ::getsockname(fd_.get(), reinterpret_cast<sockaddr *>(&sa), &len) < 0) {
            return false;
        }
        port_ = ntohs(sa.sin_port);
        return true;
    }
    // Sends the packet to the device, its ICRC first computed (icrc_mode 0, 3), then spoilt (1),
    // or left as it is (2).
    void send(std::span<uint8_t> packet, uint16_t device_port, unsigned icrc_mode) const {
        if (packet.size() >= roce::kIcrcLen && icrc_mode != 2) {
            uint32_t icrc = icrcOf(addr_, kDeviceAddr, port_, device_port, packet);
            roce::storeIcrc(icrc_mode == 1 ? ~icrc : icrc, packet);
        }
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(device_port);
        to.sin_addr.s_addr = htonl(kDeviceAddr);
        // A datagram the kernel refuses (too long for lo) is a packet lost on the way.
        (void)::sendto(fd_.get(), packet.data(), packet.size(), 0, reinterpret_cast<sockaddr *>(&to),
                       sizeof(to));
    }

  private:
    ibvx::UniqueFd fd_;
    uint32_t addr_ = 0;
    uint16_t port_ = 0;
};

// softnda0 on lo with one engine thread, the two hosts, and the marker: a UD QP of the harness
// (its QPN never named by an input) whose receive completes once the wire thread has taken
// everything sent before the marker datagram (one thread takes the socket's packets in order).
class WireDevice {
  public:
    WireDevice() {
        if (!peer_.bind(kPeerAddr) || !stranger_.bind(kStrangerAddr)) {
            std::fprintf(stderr, "softnda_wire: cannot bind 127.0.0.2/127.0.0.3 (%s): nothing to fuzz\n",
                         std::strerror(errno));
            return;
        }
        if (!open()) {
            return;
        }
        for (ibv_pd *&pd : env_.pd) {
            pd = softnda_vdev_ops.alloc_pd(env_.ctx);
            FUZZ_CHECK(pd != nullptr, "alloc_pd: %s", std::strerror(errno));
        }
        env_.event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        FUZZ_CHECK(env_.event_fd >= 0, "eventfd: %s", std::strerror(errno));
        FUZZ_CHECK(softnda_vdev_ops.set_async_event_fd(env_.ctx, env_.event_fd) == 0, "set_async_event_fd");
        warmUp(env_);
        ibv_port_attr pa{};
        FUZZ_CHECK(softnda_vdev_ops.query_port(env_.ctx, 1, &pa) == 0, "query_port");
        for (uint32_t i = 0; i < static_cast<uint32_t>(pa.gid_tbl_len); ++i) {
            ibv_gid_entry e{};
            if (softnda_vdev_ops.query_gid(env_.ctx, 1, i, &e) == 0 &&
                std::memcmp(e.gid.raw, v4Gid(kDeviceAddr).raw, sizeof(e.gid.raw)) == 0) {
                sgid_index_ = static_cast<int>(i);
            }
        }
        if (sgid_index_ < 0) {
            std::fprintf(stderr,
                         "softnda_wire: lo has no 127.0.0.1 in this network namespace: nothing to fuzz\n");
            return;
        }
        makeMarker();
    }

    ~WireDevice() {
        if (marker_.ext != nullptr) {
            env_.ext->ops->destroy_qp(marker_.ext);
            env_.ext->ops->destroy_cq(marker_cq_);
            softnda_vdev_ops.dereg_mr(marker_mr_);
        }
        if (env_.ctx != nullptr) {
            for (ibv_pd *pd : env_.pd) {
                if (pd != nullptr) {
                    softnda_vdev_ops.dealloc_pd(pd);
                }
            }
            softnda_driver_ops.free_context(env_.ext);
            softnda_vdev_ops.close_device(env_.ctx);
        }
        if (env_.event_fd >= 0) {
            close(env_.event_fd);
        }
    }

    bool usable() const { return marker_.ext != nullptr; }
    const Env &env() const { return env_; }
    uint32_t markerQpn() const { return marker_.ext->qp->qp_num; }
    uint16_t port() const { return port_; }
    const Host &host(bool stranger) const { return stranger ? stranger_ : peer_; }

    // The AV of a connection to the other host (or, local, to this host's own address).
    ibv_ah_attr av(bool local) const {
        ibv_ah_attr ah{};
        ah.port_num = 1;
        ah.is_global = 1;
        ah.grh.sgid_index = static_cast<uint8_t>(sgid_index_);
        ah.grh.dgid = v4Gid(local ? kDeviceAddr : kPeerAddr);
        ah.grh.hop_limit = 64;
        return ah;
    }

    // Sends the marker (a UD SEND with the next sequence number as its immediate) until its
    // receive completes; a late marker of an earlier call is recognised by its number and
    // passed over. False when none came within the limit.
    bool drainWire() {
        const uint32_t seq = ++marker_seq_;
        const auto deadline = std::chrono::steady_clock::now() + kLimit;
        while (std::chrono::steady_clock::now() < deadline) {
            if (marker_posted_ == 0) {
                postMarkerRecv();
            }
            sendMarker(seq);
            const auto resend = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
            for (unsigned spins = 0; std::chrono::steady_clock::now() < resend; ++spins) {
                softnda_cqe c;
                const int n = softnda_cq_poll(&marker_cq_view_, &c, 1);
                FUZZ_CHECK(n >= 0, "the marker's CQ overflowed");
                if (n == 0) {
                    World::pause(spins);
                    continue;
                }
                marker_posted_--;
                if (c.status == IBV_WC_SUCCESS && c.imm_data == htonl(seq)) {
                    return true;
                }
                if (marker_posted_ == 0) {
                    postMarkerRecv();
                }
            }
        }
        return false;
    }

  private:
    // Opens softnda0 on lo at a UDP port nobody has (another process may hold the one tried):
    // from 40000-47999, which no other test picks (the unit tests' are 4791 and 20000-21999).
    bool open() {
        const unsigned base = static_cast<unsigned>(getpid()) % 8000;
        for (unsigned attempt = 0; attempt < 32; ++attempt) {
            port_ = static_cast<uint16_t>(40000 + (base + attempt * 613) % 8000);
            const std::string port = std::to_string(port_);
            const char *kv[][2] = {
                {"devices", "1"},
                {"netdev", "lo"},
                {"wire_port", port.c_str()},
                {"engine_threads", "1"},
                {"spin_us", "0"},
                {"sleep_us", "200"},
                {"futex_waitv", "1"},
                {"max_sge", "29"},
                {"max_inline_data", "464"},
                {"wire_faults", ""},
                {"max_mr_size", "1099511627776"},
            };
            for (auto &p : kv) {
                FUZZ_CHECK(softnda_vdev_ops.configure(p[0], p[1]) == 0, "configure %s=%s", p[0], p[1]);
            }
            env_.ctx = softnda_vdev_ops.open_device("softnda0");
            FUZZ_CHECK(env_.ctx != nullptr, "open_device: %s", std::strerror(errno));
            const softnda_counters c = deviceCounters();
            if (c.wire_socket_errno == 0) {
                env_.ext = softnda_driver_ops.alloc_context(env_.ctx);
                FUZZ_CHECK(env_.ext != nullptr, "alloc_context: %s", std::strerror(errno));
                return true;
            }
            softnda_vdev_ops.close_device(env_.ctx);
            env_.ctx = nullptr;
            if (c.wire_socket_errno != EADDRINUSE) {
                std::fprintf(stderr, "softnda_wire: the device's RoCEv2 socket: %s: nothing to fuzz\n",
                             std::strerror(static_cast<int>(c.wire_socket_errno)));
                return false;
            }
        }
        std::fprintf(stderr, "softnda_wire: no free UDP port for the device: nothing to fuzz\n");
        return false;
    }

    void makeMarker() {
        ibv_cq_init_attr_extend ca{};
        ca.attr.cqe = 8;
        ca.ops = HeapQueueMemory::ops();
        marker_cq_ = env_.ext->ops->create_cq(env_.ctx, &ca);
        FUZZ_CHECK(marker_cq_ != nullptr, "create_cq: %s", std::strerror(errno));
        FUZZ_CHECK(softnda_cq_init(&marker_cq_view_, &marker_cq_->cq_info) == 0, "softnda_cq_init");
        marker_mr_ =
            softnda_vdev_ops.reg_mr(env_.pd[0], marker_buf_, sizeof(marker_buf_),
                                    reinterpret_cast<uintptr_t>(marker_buf_), IBV_ACCESS_LOCAL_WRITE);
        FUZZ_CHECK(marker_mr_ != nullptr, "reg_mr: %s", std::strerror(errno));
        ibv_qp_init_attr_extend a{};
        a.pd = env_.pd[0];
        a.attr.qp_type = IBV_QPT_UD;
        a.attr.send_cq = a.attr.recv_cq = marker_cq_->cq;
        a.attr.cap.max_send_wr = 1;
        a.attr.cap.max_recv_wr = 4;
        a.attr.cap.max_send_sge = a.attr.cap.max_recv_sge = 1;
        a.ops = HeapQueueMemory::ops();
        marker_.ext = env_.ext->ops->create_qp(env_.ctx, &a);
        FUZZ_CHECK(marker_.ext != nullptr, "create_qp: %s", std::strerror(errno));
        FUZZ_CHECK(marker_.rq.init(marker_.ext->rq_info), "the marker's RQ");
        ibv_qp_attr qa{};
        qa.qp_state = IBV_QPS_INIT;
        qa.port_num = 1;
        qa.qkey = kMarkerQkey;
        FUZZ_CHECK(
            softnda_vdev_ops.modify_qp(marker_.ext->qp, &qa,
                                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0,
            "marker INIT");
        qa = ibv_qp_attr{};
        qa.qp_state = IBV_QPS_RTR;
        FUZZ_CHECK(softnda_vdev_ops.modify_qp(marker_.ext->qp, &qa, IBV_QP_STATE) == 0, "marker RTR");
    }

    void postMarkerRecv() {
        RawQueue &rq = marker_.rq;
        uint8_t *slot = rq.slot(rq.pi);
        const uint64_t wr_id = 0;
        const uint32_t one = 1;
        const softnda_sge sge{reinterpret_cast<uintptr_t>(marker_buf_), sizeof(marker_buf_),
                              marker_mr_->lkey};
        std::memcpy(slot, &wr_id, 8);
        std::memcpy(slot + 8, &one, 4);
        std::memcpy(slot + SOFTNDA_RECV_HEADER_SIZE, &sge, sizeof(sge));
        rq.pi++;
        rq.ring(0, 0);
        marker_posted_++;
    }

    void sendMarker(uint32_t seq) {
        roce::Packet p;
        p.bth.opcode = roce::kUd | roce::kSendOnlyImm;
        p.bth.dest_qp = markerQpn();
        p.deth_qkey = kMarkerQkey;
        p.deth_src_qp = 1;
        p.imm = seq;
        uint8_t buf[64];
        const size_t n = roce::encode(p, buf);
        FUZZ_CHECK(n != 0, "the marker does not encode");
        peer_.send(std::span<uint8_t>(buf, n), port_, 0);
    }

    Env env_;
    Host peer_, stranger_;
    uint16_t port_ = 0;
    int sgid_index_ = -1;
    ibv_cq_extend *marker_cq_ = nullptr;
    softnda_cq marker_cq_view_{};
    ibv_mr *marker_mr_ = nullptr;
    uint8_t marker_buf_[256] = {};
    World::Qp marker_;
    uint32_t marker_seq_ = 0;
    uint32_t marker_posted_ = 0;
};

// Waits until the engine thread has nothing left to do now: no ring pending, and it went to
// sleep with its counters unchanged since the last look (a requester's messages on the wire wait
// for their ACKs or their timers, which are not work now). Then a barrier, so a pass that was
// running has ended.
bool settleEngine(World &w) {
    auto work = [](const softnda_counters &c) {
        return std::array<uint64_t, 10>{c.wqes_executed,    c.bytes,        c.doorbells, c.cqes,
                                        c.errors,           c.flushed,      c.rnr_naks,  c.wire_tx_packets,
                                        c.wire_retransmits, c.wire_seq_naks};
    };
    const auto deadline = std::chrono::steady_clock::now() + kLimit;
    softnda_counters a = deviceCounters();
    for (unsigned spins = 0; std::chrono::steady_clock::now() < deadline; ++spins) {
        World::pause(spins);
        const softnda_counters b = deviceCounters();
        if (work(a) != work(b)) {
            a = b;
            continue;
        }
        if (b.sleeps > a.sleeps && !w.ringsPending()) {
            w.barrier();
            return true;
        }
    }
    return false;
}

void sync(World &w, WireDevice &dev) {
    FUZZ_CHECK(dev.drainWire(), "the device did not take this input's packets within %lld s",
               static_cast<long long>(kLimit.count()));
    if (!settleEngine(w)) {
        w.trace();
        FUZZ_CHECK(false, "the engine did not go idle within %lld s", static_cast<long long>(kLimit.count()));
    }
}

// CONNECT (readConnect, then `u8 path`): dest is a QPN of the other host, reached at
// ::ffff:127.0.0.2 (path & 1: this host's own address, no wire); the ACK timeout is 67 ms to 2 s,
// so no retransmission comes from the clock within an input.
void connectQp(World &w, const WireDevice &dev, Fields &f) {
    ConnectRecord r = readConnect(f);
    r.conn.timeout = static_cast<uint8_t>(14 + r.conn.timeout % 6);
    r.conn.dest_qpn = r.dest & 0xffffff;
    r.conn.ah = dev.av((f.u8() & 1) != 0);
    if (!w.qps().empty()) {
        w.bringUp(r.qp % w.qps().size(), r.conn);
    }
}

// The names in a packet (softnda_world.h, Names): the BTH's destination QP, and the rkeys and
// SRQ number of its extension headers, big-endian (roce_wire.h), where the packet holds them.
void renamePacket(std::span<uint8_t> p, const Names &names) {
    auto get = [&](size_t at, size_t n) {
        uint32_t v = 0;
        for (size_t i = 0; i < n; ++i) {
            v = v << 8 | p[at + i];
        }
        return v;
    };
    auto put = [&](size_t at, size_t n, uint32_t v) {
        for (size_t i = 0; i < n; ++i) {
            p[at + i] = static_cast<uint8_t>(v >> (8 * (n - 1 - i)));
        }
    };
    if (p.size() < roce::kBthLen) {
        return;
    }
    put(5, 3, names.qpn(get(5, 3)));
    const roce::Layout l = roce::layoutOf(p[0]);
    size_t at = roce::kBthLen;
    auto field = [&](bool present, size_t len, size_t off, size_t n,
                     uint32_t (*rename)(const Names &, uint32_t)) {
        if (present) {
            if (at + off + n <= p.size()) {
                put(at + off, n, rename(names, get(at + off, n)));
            }
            at += len;
        }
    };
    auto key = [](const Names &nm, uint32_t v) { return nm.key(v); };
    auto srqn = [](const Names &nm, uint32_t v) { return nm.srqn(v); };
    auto none = [](const Names &, uint32_t v) { return v; };
    field(l.xrceth, roce::kXrcEthLen, 1, 3, srqn);
    field(l.deth, roce::kDethLen, 0, 0, none);
    field(l.reth, roce::kRethLen, 8, 4, key);
    field(l.atomic_eth, roce::kAtomicEthLen, 8, 4, key);
    field(l.aeth, roce::kAethLen, 0, 0, none);
    field(l.atomic_ack, roce::kAtomicAckLen, 0, 0, none);
    field(l.imm, roce::kImmLen, 0, 0, none);
    field(l.ieth, roce::kIethLen, 0, 4, key);
}

void sendPacket(World &w, const WireDevice &dev, Fields &f) {
    const uint8_t flags = f.u8();
    std::span<const uint8_t> bytes = f.rest();
    uint8_t buf[kMaxPacketBytes];
    const size_t n = std::min(bytes.size(), sizeof(buf));
    if (n > 0) {
        std::memcpy(buf, bytes.data(), n);
    }
    renamePacket(std::span<uint8_t>(buf, n), w.names());
    dev.host((flags & 4) != 0).send(std::span<uint8_t>(buf, n), dev.port(), flags & 3);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    WireDevice &dev = ibvx::fuzz::processFixture<WireDevice>();
    if (!dev.usable()) {
        return 0;
    }
    const int fds_before = ibvx::fuzz::countOpenFds();
    const size_t memory_before = HeapQueueMemory::live();
    const size_t doorbells_before = MemfdArena::instance().liveDbMappings();
    const softnda_counters counters_before = deviceCounters();
    {
        World w(dev.env());
        w.names().reserved_qpns.push_back(dev.markerQpn());
        bool may_send = false;  // since the engine was last idle: something that can make it send
        size_t packets = 0;
        forEachRecord(std::span<const uint8_t>(data, size), kMaxRecords, [&](uint8_t op, Fields &f) {
            const uint8_t kind = op % 16;
            if (kind == 8) {
                if (packets++ >= kMaxPackets) {
                    return;
                }
                if (may_send) {
                    FUZZ_CHECK(settleEngine(w), "the engine did not go idle within %lld s",
                               static_cast<long long>(kLimit.count()));
                    may_send = false;
                }
                return sendPacket(w, dev, f);
            }
            may_send = kind != 9 && kind != 11;
            switch (kind) {
                case 0:
                    return w.addMr(f);
                case 1:
                    return w.addCq(f);
                case 2:
                    return w.addSrq(f);
                case 3:
                    return w.addQp(f);
                case 4:
                    return connectQp(w, dev, f);
                case 5:
                    return w.writeWqe(f);
                case 6:
                    return w.writeRecv(f);
                case 7:
                    return w.ring(f);
                case 9:
                    return sync(w, dev);
                case 10:
                    return w.setState(f);
                case 11:
                    return w.poll(f);
                case 12:
                    return w.movePi(f);
                case 13:
                    return w.addMw(f);
                case 14:
                    return w.arm(f);
                default:
                    return w.destroyNow(f);
            }
        });
        sync(w, dev);
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
    // Besides the device's sockets of UDP source ports (one per flow's port, kept: SPEC.md §18).
    const auto source_ports =
        static_cast<int>(deviceCounters().wire_source_ports - counters_before.wire_source_ports);
    FUZZ_CHECK(ibvx::fuzz::countOpenFds() == fds_before + source_ports, "fds %d -> %d (%d new source ports)",
               fds_before, ibvx::fuzz::countOpenFds(), source_ports);
    return 0;
}
