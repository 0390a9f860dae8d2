// The roce and udp scenarios (issue 24): softnda across two "hosts" on this machine. Two network
// namespaces joined by a veth pair (netns.h), one ibv-extendd in each with its softnda device
// bound to its end of the pair (`[softnda] netdev`), and in the same run:
//  - the floor of that path: a plain UDP socket ping-pong (8 B) and a UDP blast of datagrams the
//    size of one RoCE packet's payload at the path MTU, between the two namespaces (this process,
//    one socket in each);
//  - through the brokers: Debian's perftest, one tenant in each namespace (ibv-extend-run), over
//    RoCEv2 with the IPv4-mapped GID (-x 1): ib_write_bw 64 KiB, ib_write_lat and ib_send_lat 8 B.
// Both need root (namespaces); they are skipped with a line saying so otherwise, and in --quick
// unless named with --only (the suite's quick run must not need root).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu.h"
#include "common/unique_fd.h"
#include "tools/ibv-extend-perf/broker_harness.h"
#include "tools/ibv-extend-perf/netns.h"
#include "tools/ibv-extend-perf/programs.h"
#include "tools/ibv-extend-perf/scenarios.h"

namespace ibvx::perf {
namespace {

[[noreturn]] void fail(const std::string &what) {
    throw std::runtime_error("roce: " + what);
}

constexpr uint16_t kUdpPort = 9000;  // the floor's; 4791 (RoCEv2) is the brokers'
// One RoCE packet's payload at the path MTU softnda derives from a 1500-byte interface (1024,
// SPEC.md §19): the blast moves the same bytes in as many datagrams as the RDMA WRITEs' packets.
constexpr size_t kDatagram = 1024;
constexpr int kBatch = 64;  // datagrams per sendmmsg/recvmmsg

// A UDP socket made in namespace ns, bound to self:kUdpPort and connected to peer:kUdpPort.
UniqueFd udpSocket(int ns, const char *self, const char *peer) {
    InNetns in(ns);
    UniqueFd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd) {
        fail(std::string("socket: ") + std::strerror(errno));
    }
    // Room for a whole burst of the blast: root may exceed net.core.rmem_max.
    int bytes = 32 << 20;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes));
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes));
    auto addr = [](const char *ip) {
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(kUdpPort);
        ::inet_pton(AF_INET, ip, &sa.sin_addr);
        return sa;
    };
    sockaddr_in me = addr(self), them = addr(peer);
    if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&me), sizeof(me)) < 0 ||
        ::connect(fd.get(), reinterpret_cast<sockaddr *>(&them), sizeof(them)) < 0) {
        fail(std::string("bind/connect of the UDP floor's socket: ") + std::strerror(errno));
    }
    return fd;
}

// The next datagram, spinning (MSG_DONTWAIT) or blocking; false when stop was raised meanwhile.
bool recvOne(int fd, void *buf, size_t len, bool spin, const std::atomic<bool> &stop) {
    for (;;) {
        ssize_t n = ::recv(fd, buf, len, spin ? MSG_DONTWAIT : 0);
        if (n >= 0) {
            return true;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            fail(std::string("recv: ") + std::strerror(errno));
        }
        if (stop.load(std::memory_order_relaxed)) {
            return false;
        }
        if (spin) {
            ibvx_cpu_relax();
        }
    }
}

// 8 B round trips from a to b and back; ns each. spin: both ends poll their socket (what the
// RDMA side's tenants do with their CQs), else both block in recv.
std::vector<uint64_t> udpPingPong(int a, int b, int iters, int warmup, bool spin) {
    std::atomic<bool> stop{false};
    if (!spin) {
        // The echo side blocks in recv: a timeout lets it see stop.
        timeval tv{0, 100000};
        ::setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    std::thread echo([&] {
        uint64_t v = 0;
        while (recvOne(b, &v, sizeof(v), spin, stop)) {
            if (::send(b, &v, sizeof(v), 0) != sizeof(v)) {
                return;
            }
        }
    });
    std::vector<uint64_t> ns;
    try {
        ns = timedSamples(iters, warmup, [&] {
            uint64_t v = 0x1234;
            auto t0 = Clock::now();
            if (::send(a, &v, sizeof(v), 0) != sizeof(v)) {
                fail(std::string("send: ") + std::strerror(errno));
            }
            recvOne(a, &v, sizeof(v), spin, stop);
            return nsSince(t0);
        });
    } catch (...) {
        stop = true;
        echo.join();
        throw;
    }
    stop = true;
    echo.join();
    return ns;
}

struct Blast {
    double gbps = 0;  // received payload, GB/s (1e9 bytes)
    double loss = 0;  // share of the sent datagrams that never arrived
};

// kDatagram-byte datagrams from a to b with sendmmsg for `seconds`; the receiver counts what
// arrives with recvmmsg. Goodput: bytes received over the time from the first send to the last
// datagram received.
Blast udpBlast(int a, int b, double seconds) {
    timeval tv{0, 200000};  // the receiver ends 200 ms after the last datagram
    ::setsockopt(b, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::atomic<bool> sending{true};
    uint64_t received = 0;
    Clock::time_point last_rx{};
    std::thread rx([&] {
        std::vector<char> buf(static_cast<size_t>(kBatch) * kDatagram);
        mmsghdr msgs[kBatch];
        iovec iov[kBatch];
        for (;;) {
            for (int i = 0; i < kBatch; ++i) {
                iov[i] = {buf.data() + static_cast<size_t>(i) * kDatagram, kDatagram};
                msgs[i] = {};
                msgs[i].msg_hdr.msg_iov = &iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int n = ::recvmmsg(b, msgs, kBatch, MSG_WAITFORONE, nullptr);
            if (n > 0) {
                for (int i = 0; i < n; ++i) {
                    received += msgs[i].msg_len;
                }
                last_rx = Clock::now();
            } else if (!sending.load()) {
                return;  // timed out (or failed) after the sender finished
            }
        }
    });
    std::vector<char> payload(kDatagram, 'x');
    mmsghdr msgs[kBatch];
    iovec iov[kBatch];
    for (int i = 0; i < kBatch; ++i) {
        iov[i] = {payload.data(), kDatagram};
        msgs[i] = {};
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t sent = 0;
    const auto t0 = Clock::now();
    const auto until =
        t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (Clock::now() < until) {
        int n = ::sendmmsg(a, msgs, kBatch, 0);
        if (n < 0 && errno != ENOBUFS && errno != EAGAIN && errno != EINTR) {
            sending = false;
            rx.join();
            fail(std::string("sendmmsg: ") + std::strerror(errno));
        }
        sent += n > 0 ? static_cast<uint64_t>(n) : 0;
    }
    sending = false;
    rx.join();
    Blast out;
    const double secs = std::chrono::duration<double>(last_rx - t0).count();
    if (received == 0 || secs <= 0) {
        fail("the UDP blast delivered nothing");
    }
    out.gbps = static_cast<double>(received) / secs / 1e9;
    out.loss = sent == 0 ? 0 : 1.0 - static_cast<double>(received / kDatagram) / static_cast<double>(sent);
    return out;
}

void udpFloor(const Options &opt, Results &out, const NetnsPair &hosts) {
    UniqueFd a = udpSocket(hosts.fd(0), NetnsPair::address(0), NetnsPair::address(1));
    UniqueFd b = udpSocket(hosts.fd(1), NetnsPair::address(1), NetnsPair::address(0));
    const int iters = opt.quick ? 500 : 50000;
    const int warmup = opt.quick ? 50 : 2000;
    std::vector<uint64_t> spin = udpPingPong(a.get(), b.get(), iters, warmup, true);
    out.add("floors", "udp_pingpong_p50_us", percentile(spin, 50) / 1e3, "us",
            "8 B UDP round trip between the two namespaces over the veth, both ends polling");
    out.add("floors", "udp_pingpong_p99_us", percentile(spin, 99) / 1e3, "us");
    std::vector<uint64_t> blocking = udpPingPong(a.get(), b.get(), iters / 5, warmup / 5, false);
    out.add("floors", "udp_pingpong_blocking_p50_us", percentile(blocking, 50) / 1e3, "us",
            "the same, both ends blocking in recv");
    out.add("floors", "udp_pingpong_blocking_p99_us", percentile(blocking, 99) / 1e3, "us");
    Blast blast = udpBlast(a.get(), b.get(), opt.quick ? 0.2 : 3.0);
    out.add("floors", "udp_blast_gbps", blast.gbps, "GB/s",
            "1 KiB UDP datagrams (a RoCE packet's payload at MTU 1500), sendmmsg x64, received");
    out.add("floors", "udp_blast_loss", blast.loss, "x", "share of the blast's datagrams dropped");
}

// ---- through the brokers ---------------------------------------------------------------------

// Whether something listens on TCP `port` in namespace ns (its /proc/thread-self/net/tcp{,6}).
bool listeningIn(int ns, int port) {
    InNetns in(ns);
    char want[16];
    std::snprintf(want, sizeof(want), ":%04X ", port);
    for (const char *table : {"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"}) {
        std::FILE *f = std::fopen(table, "r");
        if (f == nullptr) {
            continue;
        }
        char line[512];
        bool found = false;
        while (!found && std::fgets(line, sizeof(line), f) != nullptr) {
            // sl local_address rem_address st ...: st 0A is LISTEN
            found = std::strstr(line, want) != nullptr && std::strstr(line, " 0A ") != nullptr;
        }
        std::fclose(f);
        if (found) {
            return true;
        }
    }
    return false;
}

struct TwoBrokers {
    const NetnsPair &hosts;
    BrokerHarness a, b;
};

// A perftest program between a tenant of broker b (the server, in namespace b) and one of broker a
// (the client, in namespace a, reaching b's address over the veth for the out-of-band exchange):
// the client's output.
std::string perftest(const TwoBrokers &brokers, const std::string &program, std::vector<std::string> args,
                     int port) {
    std::vector<std::string> argv = {program, "-d", "softnda0", "-x", "1", "-p", std::to_string(port)};
    argv.insert(argv.end(), args.begin(), args.end());
    Program server(tenant(brokers.b.socket(), argv), {}, brokers.hosts.fd(1));
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (!listeningIn(brokers.hosts.fd(1), port)) {
        if (Clock::now() > deadline || !server.running()) {
            int status = 0;
            std::string said = server.finish(std::chrono::seconds(1), &status);
            fail(server.name() + " (namespace b) never listened on port " + std::to_string(port) +
                 " (status " + std::to_string(status) + "):\n" + said + "\nbroker b's log:\n" +
                 brokers.b.log());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    argv.push_back(NetnsPair::address(1));
    Program client(tenant(brokers.a.socket(), argv), {}, brokers.hosts.fd(0));
    int status = 0;
    std::string said = client.finish(std::chrono::minutes(3), &status);
    int server_status = 0;
    std::string server_said = server.finish(std::chrono::seconds(30), &server_status);
    if (status != 0 || server_status != 0) {
        fail(client.name() + " (namespace a) exited with status " + std::to_string(status) + ":\n" + said +
             "\nits server (namespace b) exited with status " + std::to_string(server_status) + ":\n" +
             server_said + "\nbroker a's log:\n" + brokers.a.log() + "\nbroker b's log:\n" + brokers.b.log());
    }
    return said;
}

// The numbers of the row under perftest's column header (the line naming `column`).
std::vector<double> perftestRow(const std::string &text, const std::string &column) {
    size_t at = text.find(column);
    size_t eol = at == std::string::npos ? std::string::npos : text.find('\n', at);
    if (eol == std::string::npos) {
        fail("no \"" + column + "\" row in perftest's output:\n" + text);
    }
    std::istringstream row(text.substr(eol + 1, text.find('\n', eol + 1) - eol - 1));
    std::vector<double> v;
    std::string word;
    // Token by token with strtod: perftest prints its standard deviation as "-nan" when a few
    // outliers of milliseconds overflow its sum of squares, which operator>> would stop at.
    while (row >> word) {
        char *end = nullptr;
        double x = std::strtod(word.c_str(), &end);
        if (end == word.c_str() || *end != '\0') {
            break;
        }
        v.push_back(x);
    }
    if (v.size() < 4) {
        fail("perftest's row under \"" + column + "\" has too few numbers:\n" + text);
    }
    return v;
}

std::string perftestProgram(const char *name) {
    std::string p = std::string("/usr/bin/") + name;
    return ::access(p.c_str(), X_OK) == 0 ? p : std::string();
}

void throughBrokers(const Options &opt, Results &out, const NetnsPair &hosts) {
    const std::string write_bw = perftestProgram("ib_write_bw");
    const std::string write_lat = perftestProgram("ib_write_lat");
    const std::string send_lat = perftestProgram("ib_send_lat");
    if (write_bw.empty() || write_lat.empty() || send_lat.empty()) {
        std::cerr << "roce: no perftest (ib_write_bw, ib_write_lat, ib_send_lat in /usr/bin; Debian package "
                     "perftest): the RDMA part is skipped, the UDP floor stands alone\n";
        return;
    }
    auto netdev = [](int side) { return std::string("netdev = \"") + NetnsPair::ifname(side) + "\"\n"; };
    TwoBrokers brokers{hosts, BrokerHarness(opt.daemon, "", opt.engine_threads, 50, hosts.fd(0), netdev(0)),
                       BrokerHarness(opt.daemon, "", opt.engine_threads, 50, hosts.fd(1), netdev(1))};
    const std::string lat_iters = opt.quick ? "200" : "20000";
    // perftest's latency tests print one way, half of each round trip (t_typical is the median,
    // "99% percentile" the p99): doubled here, so the figures are round trips as the floor's are.
    std::vector<double> w =
        perftestRow(perftest(brokers, write_lat, {"-s", "8", "-n", lat_iters}, 18515), "t_typical");
    std::vector<double> s =
        perftestRow(perftest(brokers, send_lat, {"-s", "8", "-n", lat_iters}, 18516), "t_typical");
    std::vector<double> bw =
        perftestRow(perftest(brokers, write_bw,
                             {"-s", "65536", "-n", opt.quick ? "200" : "20000", "--report_gbits"}, 18517),
                    "BW average");
    if (w.size() < 8 || s.size() < 8) {
        fail("perftest's latency row lacks its 99% percentile column");
    }
    out.add("fastpath", "roce_write8_rtt_p50_us", 2 * w[4], "us",
            "ib_write_lat -x 1 -s 8 across the namespaces, t_typical x 2 (round trip)");
    out.add("fastpath", "roce_write8_rtt_p99_us", 2 * w[7], "us", "its 99% percentile x 2");
    out.add("fastpath", "roce_send8_rtt_p50_us", 2 * s[4], "us",
            "ib_send_lat -x 1 -s 8 across the namespaces, t_typical x 2 (round trip)");
    out.add("fastpath", "roce_send8_rtt_p99_us", 2 * s[7], "us", "its 99% percentile x 2");
    // Gb/s (perftest's --report_gbits: 1e9 bits) to GB/s.
    out.add("fastpath", "roce_write64k_gbps", bw[3] / 8, "GB/s",
            "ib_write_bw -x 1 -s 65536 across the namespaces, BW average");
}

void ratio(Results &out, const char *key, const char *num_sec, const char *num, const char *den_sec,
           const char *den, const char *note) {
    const Row *a = out.find(num_sec, num);
    const Row *b = out.find(den_sec, den);
    if (a != nullptr && b != nullptr && b->value > 0) {
        out.add("fastpath", key, a->value / b->value, "x", note);
    }
}

}  // namespace

void runRoce(const Options &opt, Results &out) {
    const bool udp = opt.wants("udp"), roce = opt.wants("roce");
    if (!udp && !roce) {
        return;
    }
    if (opt.quick && opt.only.empty()) {
        std::cerr << "roce, udp: not in a --quick run unless named (--only roce): they need root and make "
                     "network namespaces\n";
        return;
    }
    // The brokers and perftest's tenants run SCHED_OTHER; the floor is measured as they run.
    SchedOtherScope as_tenants;
    std::string why;
    std::unique_ptr<NetnsPair> hosts = NetnsPair::make(&why);
    if (!hosts) {
        std::cerr << "roce, udp: skipped: " << why << "\n";
        return;
    }
    udpFloor(opt, out, *hosts);
    if (roce) {
        throughBrokers(opt, out, *hosts);
    }
    ratio(out, "roce_write64k_over_udp_blast", "fastpath", "roce_write64k_gbps", "floors", "udp_blast_gbps",
          "goal >= 0.7");
    ratio(out, "roce_write8_lat_over_udp_pingpong", "fastpath", "roce_write8_rtt_p50_us", "floors",
          "udp_pingpong_p50_us", "round trips, p50 over p50 (goal <= 1.5)");
    ratio(out, "roce_send8_lat_over_udp_pingpong", "fastpath", "roce_send8_rtt_p50_us", "floors",
          "udp_pingpong_p50_us", "round trips, p50 over p50 (goal <= 1.5)");
}

}  // namespace ibvx::perf
