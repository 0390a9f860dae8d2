// The Ethernet personality (SPEC.md §19): the option, rxe's MTU rule, the kernel's GID rules and
// stable slots, and a device bound to the loopback interface (present in every network
// namespace) answering as a RoCE device and connecting RC QPs by GID.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include "providers/softnda/src/netdev.h"
#include "providers/softnda/src/wire.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

using softnda::NetdevView;
using softnda::RoceGidTable;

ibv_gid gidOf(const char *text) {
    ibv_gid g{};
    EXPECT_EQ(inet_pton(AF_INET6, text, g.raw), 1) << text;
    return g;
}

std::string textOf(const std::optional<ibv_gid> &g) {
    if (!g) {
        return "empty";
    }
    char buf[INET6_ADDRSTRLEN];
    return inet_ntop(AF_INET6, g->raw, buf, sizeof(buf));
}

TEST(SoftndaNetdev, ActiveMtuFollowsRxe) {
    // rxe: the largest IB MTU <= netdev MTU - 80, at most 4096, 256 when none fits.
    EXPECT_EQ(softnda::roceActiveMtu(1500), IBV_MTU_1024);
    EXPECT_EQ(softnda::roceActiveMtu(9000), IBV_MTU_4096);
    EXPECT_EQ(softnda::roceActiveMtu(65536), IBV_MTU_4096);
    EXPECT_EQ(softnda::roceActiveMtu(4176), IBV_MTU_4096);
    EXPECT_EQ(softnda::roceActiveMtu(4175), IBV_MTU_2048);
    EXPECT_EQ(softnda::roceActiveMtu(2128), IBV_MTU_2048);
    EXPECT_EQ(softnda::roceActiveMtu(2127), IBV_MTU_1024);
    EXPECT_EQ(softnda::roceActiveMtu(592), IBV_MTU_512);
    EXPECT_EQ(softnda::roceActiveMtu(336), IBV_MTU_256);
    EXPECT_EQ(softnda::roceActiveMtu(68), IBV_MTU_256);
    EXPECT_EQ(softnda::roceActiveMtu(0), IBV_MTU_256);
}

TEST(SoftndaNetdev, GidsAsTheKernelMakesThem) {
    EXPECT_EQ(textOf(softnda::defaultRoceGid({0x52, 0x54, 0x00, 0x12, 0x34, 0x56})),
              "fe80::5054:ff:fe12:3456");
    EXPECT_EQ(textOf(softnda::defaultRoceGid({0x02, 0, 0, 0, 0, 1})), "fe80::ff:fe00:1");
    in_addr a{};
    ASSERT_EQ(inet_pton(AF_INET, "10.201.3.4", &a), 1);
    EXPECT_EQ(textOf(softnda::ipv4Gid(a.s_addr)), "::ffff:10.201.3.4");
}

NetdevView view(std::vector<const char *> addrs) {
    NetdevView v;
    v.present = true;
    v.ifindex = 7;
    v.mtu = 1500;
    v.running = true;
    v.mac = std::array<uint8_t, 6>{0x52, 0x54, 0x00, 0x12, 0x34, 0x56};
    for (const char *a : addrs) {
        v.addrs.push_back(gidOf(a));
    }
    return v;
}

TEST(SoftndaNetdev, SlotsStayWhereTheyAre) {
    RoceGidTable t;
    // The EUI-64 link-local address is the default GID: it takes no second slot.
    EXPECT_TRUE(t.update(view({"::ffff:10.201.0.1", "fd00::1", "fe80::5054:ff:fe12:3456"})));
    EXPECT_EQ(textOf(t.at(0)), "fe80::5054:ff:fe12:3456");
    EXPECT_EQ(textOf(t.at(1)), "::ffff:10.201.0.1");
    EXPECT_EQ(textOf(t.at(2)), "fd00::1");
    EXPECT_EQ(textOf(t.at(3)), "empty");
    EXPECT_FALSE(t.update(view({"::ffff:10.201.0.1", "fd00::1"})));
    // The IPv4 address goes: its slot empties and fd00::1 stays at 2.
    EXPECT_TRUE(t.update(view({"fd00::1"})));
    EXPECT_EQ(textOf(t.at(1)), "empty");
    EXPECT_EQ(textOf(t.at(2)), "fd00::1");
    // A new address takes the first free slot.
    EXPECT_TRUE(t.update(view({"fd00::1", "fd00::2", "::ffff:10.201.0.9"})));
    EXPECT_EQ(textOf(t.at(1)), "fd00::2");
    EXPECT_EQ(textOf(t.at(2)), "fd00::1");
    EXPECT_EQ(textOf(t.at(3)), "::ffff:10.201.0.9");
    EXPECT_TRUE(t.contains(gidOf("fd00::2")));
    EXPECT_FALSE(t.contains(gidOf("fd00::3")));
    // A link-local address that is not the EUI-64 one is an address like the others.
    EXPECT_TRUE(t.update(view({"fd00::1", "fd00::2", "::ffff:10.201.0.9", "fe80::1234"})));
    EXPECT_EQ(textOf(t.at(4)), "fe80::1234");
    // More addresses than slots: the ones that do not fit are left out.
    std::vector<std::string> many;
    for (int i = 0; i < 40; ++i) {
        many.push_back("fd01::" + std::to_string(i + 1));
    }
    std::vector<const char *> ptrs;
    for (auto &m : many) {
        ptrs.push_back(m.c_str());
    }
    EXPECT_TRUE(t.update(view(ptrs)));
    EXPECT_EQ(textOf(t.at(softnda::kRoceGidSlots - 1)), "fd01::15");  // the first 15 of the list
    EXPECT_EQ(t.at(softnda::kRoceGidSlots), std::nullopt);
    // An interface that is gone leaves every slot empty.
    NetdevView gone;
    EXPECT_TRUE(t.update(gone));
    for (uint32_t i = 0; i < softnda::kRoceGidSlots; ++i) {
        EXPECT_EQ(t.at(i), std::nullopt) << i;
    }
}

TEST(SoftndaNetdev, OptionNamesInterfacesOfTheHost) {
    resetConfig();
    EXPECT_EQ(softnda_vdev_ops.configure("netdev", "ibvx-nosuch0"), -ENODEV);
    EXPECT_EQ(softnda_vdev_ops.configure("netdev", "lo,lo"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("netdev", "lo,"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("netdev", "a-name-longer-than-ifnamsiz"), -EINVAL);
    ibv_extend_vdev_attr attrs[4];
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 4), 1);  // nothing refused was kept
    ASSERT_EQ(softnda_vdev_ops.configure("devices", "3"), 0);
    ASSERT_EQ(softnda_vdev_ops.configure("phys_port_cnt", "2"), 0);
    ASSERT_EQ(softnda_vdev_ops.configure("netdev", " lo "), 0);
    // One device per interface, whatever `devices` says; one port, as RoCE has.
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 4), 1);
    EXPECT_EQ(attrs[0].phys_port_cnt, 1u);
    ASSERT_EQ(softnda_vdev_ops.configure("netdev", ""), 0);
    ASSERT_EQ(softnda_vdev_ops.query_devices(attrs, 4), 3);
    EXPECT_EQ(attrs[0].phys_port_cnt, 2u);
    resetConfig();
}

// softnda0 bound to lo.
class SoftndaEthernetTest : public QpPairTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override { return {{"netdev", "lo"}}; }

    void SetUp() override {
        QpPairTest::SetUp();
        ibv_port_attr pa{};
        ASSERT_EQ(softnda_vdev_ops.query_port(ctx_, 1, &pa), 0);
        for (uint32_t i = 0; i < static_cast<uint32_t>(pa.gid_tbl_len); ++i) {
            ibv_gid_entry e{};
            if (softnda_vdev_ops.query_gid(ctx_, 1, i, &e) == 0 && e.gid.raw[10] == 0xff &&
                e.gid.raw[12] == 127) {
                v4_index_ = static_cast<int>(i);
            }
        }
    }

    int rtr(QpH &q, uint32_t dest, const ibv_ah_attr &ah) {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_RTR;
        a.path_mtu = IBV_MTU_1024;
        a.dest_qp_num = dest;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 1;
        a.ah_attr = ah;
        return softnda_vdev_ops.modify_qp(q.ext->qp, &a,
                                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                              IBV_QP_MIN_RNR_TIMER);
    }

    ibv_ah_attr global(int sgid_index, const ibv_gid &dgid) {
        ibv_ah_attr ah{};
        ah.port_num = 1;
        ah.is_global = 1;
        ah.grh.sgid_index = static_cast<uint8_t>(sgid_index);
        ah.grh.dgid = dgid;
        ah.grh.hop_limit = 1;
        return ah;
    }

    int v4_index_ = -1;
};

TEST_F(SoftndaEthernetTest, PortIsRoceOverTheInterface) {
    ibv_port_attr pa{};
    ASSERT_EQ(softnda_vdev_ops.query_port(ctx_, 1, &pa), 0);
    EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
    EXPECT_EQ(pa.lid, 0);
    EXPECT_EQ(pa.gid_tbl_len, static_cast<int>(softnda::kRoceGidSlots));
    EXPECT_EQ(pa.max_mtu, IBV_MTU_4096);
    ifreq ifr{};
    std::strcpy(ifr.ifr_name, "lo");
    int s = socket(AF_UNIX, SOCK_DGRAM, 0);
    ASSERT_GE(s, 0);
    ASSERT_EQ(ioctl(s, SIOCGIFMTU, &ifr), 0);
    close(s);
    EXPECT_EQ(pa.active_mtu, softnda::roceActiveMtu(static_cast<uint32_t>(ifr.ifr_mtu)));
    if (v4_index_ < 0) {
        GTEST_SKIP() << "lo has no 127.x address in this network namespace";
    }
    ibv_gid_entry e{};
    ASSERT_EQ(softnda_vdev_ops.query_gid(ctx_, 1, static_cast<uint32_t>(v4_index_), &e), 0);
    EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
    EXPECT_EQ(e.ndev_ifindex, if_nametoindex("lo"));
    EXPECT_EQ(e.gid_index, static_cast<uint32_t>(v4_index_));
    EXPECT_EQ(softnda_vdev_ops.query_gid(ctx_, 1, softnda::kRoceGidSlots - 1, &e), -ENODATA);
    EXPECT_EQ(softnda_vdev_ops.query_gid(ctx_, 1, softnda::kRoceGidSlots, &e), -EINVAL);
}

TEST_F(SoftndaEthernetTest, RcConnectsByGidOnThisHost) {
    if (v4_index_ < 0) {
        GTEST_SKIP() << "lo has no 127.x address in this network namespace";
    }
    ibv_gid_entry mine{};
    ASSERT_EQ(softnda_vdev_ops.query_gid(ctx_, 1, static_cast<uint32_t>(v4_index_), &mine), 0);
    ASSERT_EQ(toInit(a_.ext->qp, kAllAccess), 0);
    ASSERT_EQ(toInit(b_.ext->qp, kAllAccess), 0);
    // RoCE needs a GRH; its source must be a GID of the port. Another host is reached over
    // RoCEv2 between two IPv4 GIDs or two IPv6 ones (SPEC.md §18): an IPv6 GID of no device
    // here, from an IPv4 source, is refused.
    ibv_ah_attr lid_only{};
    lid_only.port_num = 1;
    EXPECT_EQ(rtr(a_, b_.qpn(), lid_only), -EINVAL);
    EXPECT_EQ(rtr(a_, b_.qpn(), global(static_cast<int>(softnda::kRoceGidSlots) - 1, mine.gid)), -EINVAL);
    EXPECT_EQ(rtr(a_, b_.qpn(), global(v4_index_, gidOf("2001:db8::1"))), -EHOSTUNREACH);
    EXPECT_EQ(qpState(a_), IBV_QPS_INIT);
    ASSERT_EQ(rtr(a_, b_.qpn(), global(v4_index_, mine.gid)), 0);
    ASSERT_EQ(rtr(b_, a_.qpn(), global(v4_index_, mine.gid)), 0);
    ASSERT_EQ(toRts(a_.ext->qp), 0);
    ASSERT_EQ(toRts(b_.ext->qp), 0);
    makeBuffers(64, 0x5a);
    ASSERT_EQ(postOne(a_, write(1, 64, dmr_->rkey)), 0);
    EXPECT_EQ(waitOne(scq_.cq).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst_, src_);
}

// A wire responder keeps its atomic results where a broker's successor finds them (SPEC.md §18
// "Restart"): an RC QP of an Ethernet device names two records of its context's record file in
// its SQ record (offsets 104 and 108: 1 + each index), a UD QP none, and a destroyed QP gives its
// records back for the next one.
TEST_F(SoftndaEthernetTest, AnRcQpNamesTwoAtomicRecordsAndGivesThemBack) {
    auto records = [](const QpH &q) {
        const auto *rec = static_cast<const uint8_t *>(q.ext->sq_info.dbr_pi_va.iov_base);
        uint32_t w[2];
        std::memcpy(w, rec + 104, sizeof(w));  // SPEC.md §1.1: offsets 104 and 108
        return std::set<uint32_t>{w[0], w[1]};
    };
    const std::set<uint32_t> of_a = records(a_), of_b = records(b_);
    ASSERT_EQ(of_a.size(), 2u);
    ASSERT_EQ(of_b.size(), 2u);
    EXPECT_EQ(of_a.count(0), 0u);
    EXPECT_EQ(of_b.count(0), 0u);
    for (uint32_t r : of_a) {
        EXPECT_EQ(of_b.count(r), 0u) << "record " << r - 1 << " given twice";
    }
    QpCaps ud;
    ud.type = IBV_QPT_UD;
    QpH u = makeQp(scq_, rcq_, ud);
    ASSERT_NE(u.ext, nullptr);
    EXPECT_EQ(records(u), std::set<uint32_t>{0u}) << "a UD QP answers no atomics";
    destroyQp(a_);
    QpH again = makeQp(scq_, rcq_);
    ASSERT_NE(again.ext, nullptr);
    EXPECT_EQ(records(again), of_a) << "the records a_ gave back";
}

// A RoCE device whose socket cannot be bound (another RoCEv2 stack holds the port: here a socket
// of the test's own on wire_port) serves its own host and says why in wire_socket_errno; a
// connection to another host is refused at RTR with that error (SPEC.md §18).
class SoftndaWirePortTakenTest : public SoftndaEthernetTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        holder_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        socklen_t len = sizeof(sa);
        if (holder_ < 0 || bind(holder_, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0 ||
            getsockname(holder_, reinterpret_cast<sockaddr *>(&sa), &len) != 0) {
            ADD_FAILURE() << "no UDP port to hold: " << std::strerror(errno);
        }
        return {{"netdev", "lo"}, {"wire_port", std::to_string(ntohs(sa.sin_port))}};
    }
    void TearDown() override {
        SoftndaEthernetTest::TearDown();
        if (holder_ >= 0) {
            close(holder_);
        }
    }
    int holder_ = -1;
};

TEST_F(SoftndaWirePortTakenTest, TheDeviceSaysWhyItsSocketIsClosed) {
    softnda_counters c{};
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    EXPECT_EQ(c.wire_socket_errno, static_cast<uint64_t>(EADDRINUSE));
    if (v4_index_ < 0) {
        GTEST_SKIP() << "lo has no 127.x address in this network namespace";
    }
    ASSERT_EQ(toInit(a_.ext->qp, kAllAccess), 0);
    EXPECT_EQ(rtr(a_, b_.qpn(), global(v4_index_, gidOf("::ffff:192.0.2.1"))), -EADDRINUSE);
}

// The wire's fault hook option (SPEC.md §18): what tests put in place of netem.
TEST(SoftndaWire, FaultOptionIsCheckedWhole) {
    softnda::WireFaults f;
    ASSERT_EQ(softnda::parseWireFaults("drop=0.01,dup=0.5,reorder=0.25,seed=7", &f), 0);
    EXPECT_DOUBLE_EQ(f.drop, 0.01);
    EXPECT_DOUBLE_EQ(f.dup, 0.5);
    EXPECT_DOUBLE_EQ(f.reorder, 0.25);
    EXPECT_EQ(f.seed, 7u);
    EXPECT_TRUE(f.any());
    ASSERT_EQ(softnda::parseWireFaults("", &f), 0);
    EXPECT_FALSE(f.any());
    for (const char *bad : {"drop", "drop=", "=0.1", "drop=1", "drop=-0.1", "drop=0.1,drop=0.2", "loss=0.1",
                            "drop=0.1x", "seed=-1", "drop=0.1,,dup=0.1"}) {
        f.drop = 0.5;
        EXPECT_EQ(softnda::parseWireFaults(bad, &f), -EINVAL) << bad;
        EXPECT_DOUBLE_EQ(f.drop, 0.5) << bad;  // a refused value changes nothing
    }
    resetConfig();
    EXPECT_EQ(softnda_vdev_ops.configure("wire_faults", "drop=2"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("wire_faults", "drop=0.01,seed=3"), 0);
    EXPECT_EQ(softnda_vdev_ops.configure("wire_port", "0"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("wire_port", "65536"), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.configure("wire_port", "4792"), 0);
    resetConfig();
}

// RoCEv2 addresses are IPv4-mapped GIDs; the UDP source port folds the flow label as the kernel
// does (rdma_flow_label_to_udp_sport).
TEST(SoftndaWire, AddressesAndSourcePorts) {
    uint32_t ip = 0;
    ASSERT_TRUE(softnda::ipv4OfGid(gidOf("::ffff:10.201.8.2"), &ip));
    EXPECT_EQ(ntohl(ip), 0x0ac90802u);
    EXPECT_FALSE(softnda::ipv4OfGid(gidOf("fe80::1"), &ip));
    EXPECT_FALSE(softnda::ipv4OfGid(gidOf("::10.201.8.2"), &ip));  // IPv4-compatible is not mapped
    EXPECT_EQ(softnda::roceSourcePort(0x12345, 1),
              0xc000 | ((0x12345 & 0x3fff) ^ ((0x12345 & 0xfc000) >> 14)));
    for (uint32_t qpn : {1u, 2u, 0xffffffu}) {
        uint16_t port = softnda::roceSourcePort(0, qpn);
        EXPECT_GE(port, 0xc000);
    }
    EXPECT_NE(softnda::roceSourcePort(0, 1), softnda::roceSourcePort(0, 2));
}

// A free UDP port of the loopback interface at this moment (0: none in [first, last]).
uint16_t freeUdpPort(uint16_t first, uint16_t last) {
    for (uint32_t port = first; port <= last; ++port) {
        int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        sockaddr_in6 sa{};
        sa.sin6_family = AF_INET6;
        sa.sin6_port = htons(static_cast<uint16_t>(port));
        bool free = fd >= 0 && bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) == 0;
        if (fd >= 0) {
            close(fd);
        }
        if (free) {
            return static_cast<uint16_t>(port);
        }
    }
    return 0;
}

// Packets leave from their flow's UDP source port, not the socket's own, and an IPv6 one carries
// its flow label (SPEC.md §18): sent to the socket itself over the loopback interface, each
// arrives with the port and label it was sent with. A port of 0 is the socket's own.
TEST(SoftndaWire, PacketsLeaveFromTheirFlowsSourcePortWithTheirFlowLabel) {
    const uint16_t port = freeUdpPort(20000, 20999), sport = freeUdpPort(0xe341, 0xe3ff);
    ASSERT_NE(port, 0) << "no free UDP port on lo";
    ASSERT_NE(sport, 0) << "no free UDP port on lo";
    std::unique_ptr<softnda::WireSocket> wire;
    ASSERT_EQ(softnda::WireSocket::open("lo", port, softnda::WireFaults{}, &wire), 0);
    std::vector<softnda::WireOut> out;
    auto packet = [&](const char *addr, uint16_t from, uint32_t flow, uint32_t psn) {
        softnda::WireOut o;
        o.src = o.dst = gidOf(addr);
        o.sport = from;
        o.flow = flow;
        o.pkt.bth.opcode = softnda::roce::kUd | softnda::roce::kSendOnly;
        o.pkt.bth.psn = psn;
        out.push_back(o);
    };
    packet("::ffff:127.0.0.1", sport, 0, 1);
    packet("::ffff:127.0.0.1", 0, 0, 2);
    // ::1 where the namespace has IPv6.
    int probe = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in6 loopback{};
    loopback.sin6_family = AF_INET6;
    loopback.sin6_addr = in6addr_loopback;
    const bool v6 = wire->ipv6() && probe >= 0 &&
                    bind(probe, reinterpret_cast<sockaddr *>(&loopback), sizeof(loopback)) == 0;
    if (probe >= 0) {
        close(probe);
    }
    if (v6) {
        packet("::1", sport, 0x12345, 3);
        packet("::1", sport, 0, 4);
    }
    wire->send(out);
    // The packets come back to the socket itself; stop() ends a receive that would wait for ever.
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::thread watchdog([&] {
        std::unique_lock<std::mutex> lk(mu);
        if (!cv.wait_for(lk, std::chrono::seconds(10), [&] { return done; })) {
            wire->stop();
        }
    });
    auto finish = [&] {
        {
            std::lock_guard<std::mutex> lk(mu);
            done = true;
        }
        cv.notify_one();
        watchdog.join();
    };
    std::map<uint32_t, std::tuple<uint16_t, uint16_t, uint32_t>> got;  // by PSN: sport, dport, flow
    softnda::WireFrame frames[8];
    while (got.size() < out.size()) {
        size_t n = wire->receive(frames);
        if (n == 0) {
            break;
        }
        for (size_t i = 0; i < n; ++i) {
            softnda::roce::Packet p;
            EXPECT_TRUE(softnda::roce::decode(std::span<const uint8_t>(frames[i].data, frames[i].len), &p));
            got[p.bth.psn] = {frames[i].sport, frames[i].dport, frames[i].flow};
        }
    }
    finish();
    ASSERT_EQ(got.size(), out.size()) << "packets that came back";
    using T = std::tuple<uint16_t, uint16_t, uint32_t>;
    EXPECT_EQ(got[1], T(sport, port, 0));
    EXPECT_EQ(got[2], T(port, port, 0));
    if (v6) {
        // Where the host refuses the flow label options (qemu-user), labels are 0 both ways.
        EXPECT_EQ(got[3], T(sport, port, wire->flowLabels() ? 0x12345 : 0));
        EXPECT_EQ(got[4], T(sport, port, 0));
    }
    EXPECT_EQ(wire->source_ports.load(), 1u);
}

// Whether the network namespace's IGMP table (/proc/net/igmp) lists IPv4 group `group` (dotted)
// on interface ifname: what a socket's IP_ADD_MEMBERSHIP there adds.
bool igmpMember(const std::string &ifname, const char *group) {
    in_addr a{};
    EXPECT_EQ(inet_pton(AF_INET, group, &a), 1);
    char hex[16];
    std::snprintf(hex, sizeof(hex), "%08X", a.s_addr);  // as the kernel prints the __be32
    std::ifstream in("/proc/net/igmp");
    bool on_if = false;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line[0] != '\t') {
            on_if = line.find("\t" + ifname + " ") != std::string::npos ||
                    line.find(" " + ifname + " ") != std::string::npos;
        } else if (on_if && line.find(hex) != std::string::npos) {
            return true;
        }
    }
    return false;
}

// On an Ethernet device a multicast group is its MGID (SPEC.md §18): an IPv4-mapped 224.0.0.0/4
// or IPv6 multicast GID, the LID ignored as the kernel ignores it on RoCE, so one MGID with two
// LIDs is one membership; and the device's socket is in the IP group while a QP is.
// A port of its own, so that a test process beside it holding 4791 on lo cannot leave this one
// without a socket.
class SoftndaEthernetMcastTest : public SoftndaEthernetTest {
  protected:
    std::vector<std::pair<std::string, std::string>> options() override {
        return {{"netdev", "lo"}, {"wire_port", std::to_string(freeUdpPort(21000, 21999))}};
    }
};

TEST_F(SoftndaEthernetMcastTest, MulticastGroupsAreMgidsWhoseIpGroupTheSocketJoins) {
    softnda_counters c{};
    ASSERT_EQ(softnda_query_counters("softnda0", &c), 0);
    ASSERT_EQ(c.wire_socket_errno, 0u) << "the device has no socket";
    {
        // Under qemu-user 7.2 IP_ADD_MEMBERSHIP with an ip_mreqn naming lo fails (ENODEV), where
        // natively it succeeds: no socket there joins a group by interface.
        int probe = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        ip_mreqn m{};
        inet_pton(AF_INET, "239.201.9.8", &m.imr_multiaddr);
        m.imr_ifindex = static_cast<int>(if_nametoindex("lo"));
        const int joined = setsockopt(probe, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof(m)) == 0 ? 0 : errno;
        close(probe);
        if (joined != 0) {
            GTEST_SKIP() << "a socket here cannot join an IPv4 group on lo: " << std::strerror(joined);
        }
    }
    QpCaps ud;
    ud.type = IBV_QPT_UD;
    QpH q = makeQp(scq_, rcq_, ud);
    const ibv_gid group = gidOf("::ffff:239.201.9.7"), unicast = gidOf("::ffff:10.201.9.7"),
                  reserved = gidOf("::ffff:240.0.0.1");
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(q.ext, &unicast, 0xc001), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(q.ext, &reserved, 0xc001), -EINVAL);  // not 224.0.0.0/4
    EXPECT_FALSE(igmpMember("lo", "239.201.9.7"));
    ASSERT_EQ(softnda_vdev_ops.attach_mcast(q.ext, &group, 0), 0);  // no multicast LID needed
    EXPECT_TRUE(igmpMember("lo", "239.201.9.7"));
    EXPECT_EQ(softnda_vdev_ops.attach_mcast(q.ext, &group, 0xc001), 0);  // the same membership
    EXPECT_EQ(softnda_vdev_ops.detach_mcast(q.ext, &group, 0xc002), 0);
    EXPECT_EQ(softnda_vdev_ops.detach_mcast(q.ext, &group, 0), -EINVAL);  // left once
    EXPECT_FALSE(igmpMember("lo", "239.201.9.7"));
    // A destroyed member leaves the IP group too.
    ASSERT_EQ(softnda_vdev_ops.attach_mcast(q.ext, &group, 0), 0);
    EXPECT_TRUE(igmpMember("lo", "239.201.9.7"));
    destroyQp(q);
    EXPECT_FALSE(igmpMember("lo", "239.201.9.7"));
}

}  // namespace
}  // namespace softnda_test
