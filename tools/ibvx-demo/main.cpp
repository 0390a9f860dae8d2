// ibvx-demo: the brokered end-to-end demo. Two tenant processes each open softnda0 through the
// broker (ibv-extendd on IBV_EXTEND_SOCKET), create a CQ, an RC QP and an MR, exchange QP numbers,
// addresses and rkeys over a socket pair, connect their QPs to each other, then move data with
// RDMA WRITE, SEND/RECV and RDMA READ through the mapped queues only, and verify every byte. The
// parent reads the broker's RPC counters (Admin/GetStats) before and after the data phase: the
// difference must be 0. Exit 0 only when everything verified.
//
//   ibvx-demo [--device NAME] [--bytes N] [--wait MS]  (the parent; starts the two tenants;
//                                                       --wait: give the broker MS to answer)
//   ibvx-demo --tenant A|B --ctl FD --peer FD ...  (internal: one tenant, exec'd by the parent)
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/build_config.h"
#include "common/unix_socket.h"
#include "ibv_extend/v1/admin.grpc.pb.h"
#include "tools/ibvx-demo/tenant.h"

namespace {

using ibvx::connectUnix;
using ibvx::demo::PeerInfo;
using ibvx::demo::Tenant;

constexpr const char *kDefaultSocket = IBVX_DEFAULT_SOCKET;

// ---- tiny line/byte protocol on the control and peer sockets --------------------------------

bool writeAll(int fd, const void *p, size_t n) {
    const auto *b = static_cast<const char *>(p);
    while (n > 0) {
        ssize_t w = ::write(fd, b, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return false;
        }
        b += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool readAll(int fd, void *p, size_t n) {
    auto *b = static_cast<char *>(p);
    while (n > 0) {
        ssize_t r = ::read(fd, b, n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return false;
        }
        b += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

bool sendLine(int fd, const std::string &line) {
    return writeAll(fd, (line + "\n").data(), line.size() + 1);
}

bool readLine(int fd, std::string *line) {
    line->clear();
    char c;
    while (readAll(fd, &c, 1)) {
        if (c == '\n') {
            return true;
        }
        line->push_back(c);
    }
    return false;
}

bool sendByte(int fd, char c) {
    return writeAll(fd, &c, 1);
}

bool expectByte(int fd, char want) {
    char c = 0;
    return readAll(fd, &c, 1) && c == want;
}

std::string fmtUs(uint64_t ns) {
    char b[32];
    snprintf(b, sizeof(b), "%.1f us", static_cast<double>(ns) / 1000.0);
    return b;
}

// ---- a tenant -----------------------------------------------------------------------------

struct TenantArgs {
    char role = 0;
    int ctl = -1;
    int peer = -1;
    std::string device = "softnda0";
    size_t bytes = 256 * 1024;
};

int tenantFail(int ctl, const std::string &why) {
    sendLine(ctl, "done fail " + why);
    return 1;
}

// What a tenant's data phase verified, one "line" per check, for the parent to print.
struct DataReport {
    std::string me;
    std::string lines;
    bool ok = true;
    uint64_t bytes = 0;

    void check(bool cond, const std::string &what) {
        lines += "line " + me + what + (cond ? ": verified" : ": FAILED") + "\n";
        ok = ok && cond;
    }
};

// A's side: WRITE into B, SEND to B, READ from B, then a latency loop of small WRITEs. B checks
// each step's bytes and answers on the peer socket.
void initiatorPhase(Tenant &t, const PeerInfo &peer, int peer_fd, size_t n, DataReport &r) {
    ibvx::demo::fillPattern(t.buf(), n, 1);
    int st = t.write(peer, 0, 0, static_cast<uint32_t>(n));
    r.check(st == 0 && sendByte(peer_fd, 'W') && expectByte(peer_fd, 'w'),
            "RDMA WRITE " + std::to_string(n) + " B to B (status " + std::to_string(st) + ", B checked)");
    r.bytes += n;
    ibvx::demo::fillPattern(t.buf() + n, n, 2);
    st = expectByte(peer_fd, 'R') ? t.send(n, static_cast<uint32_t>(n)) : -EPIPE;
    r.check(st == 0 && expectByte(peer_fd, 's'),
            "SEND " + std::to_string(n) + " B to B (status " + std::to_string(st) + ", B checked)");
    r.bytes += n;
    st = t.read(peer, 2 * n, 2 * n, static_cast<uint32_t>(n));
    r.check(st == 0 && ibvx::demo::checkPattern(t.buf() + 2 * n, n, 3) == n,
            "RDMA READ " + std::to_string(n) + " B from B (status " + std::to_string(st) + ")");
    r.bytes += n;
    std::vector<uint64_t> lat;
    const int iters = 1000;
    int bad = 0;
    for (int i = 0; i < iters; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        t.buf()[3 * n] = static_cast<uint8_t>(i);
        bad += t.write(peer, 3 * n, 3 * n, 8) != 0;
        lat.push_back(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
                .count()));
    }
    r.bytes += 8 * iters;
    std::sort(lat.begin(), lat.end());
    r.check(bad == 0, std::to_string(iters) + " x 8 B RDMA WRITE, post->CQE latency p50 " +
                          fmtUs(lat[lat.size() / 2]) + ", p99 " + fmtUs(lat[lat.size() * 99 / 100]));
    sendByte(peer_fd, 'E');
}

// B's side: checks A's WRITE, receives A's SEND (its completion and bytes); A's READ needs
// nothing of B but the pattern set up before the phase.
void responderPhase(Tenant &t, const PeerInfo &peer, int peer_fd, size_t n, DataReport &r) {
    bool w = expectByte(peer_fd, 'W') && ibvx::demo::checkPattern(t.buf(), n, 1) == n;
    r.check(w && sendByte(peer_fd, 'w'), "received A's RDMA WRITE bytes");
    int st = t.postRecv(n, static_cast<uint32_t>(n), 77);
    softnda_cqe cqe{};
    if (st == 0 && sendByte(peer_fd, 'R')) {
        st = t.waitCompletion(&cqe);
    }
    bool ok = st == 0 && cqe.status == IBV_WC_SUCCESS && cqe.opcode == IBV_WC_RECV && cqe.wr_id == 77 &&
              cqe.byte_len == n && cqe.src_qp == peer.qp_num &&
              ibvx::demo::checkPattern(t.buf() + n, n, 2) == n;
    r.check(ok && sendByte(peer_fd, 's'), "RECV completion and bytes of A's SEND");
    r.ok = expectByte(peer_fd, 'E') && r.ok;
}

// Opens the device through the broker, exchanges queue addresses with the peer tenant and
// brings the QP to RTS; tells the parent "ready" with the number of broker objects made.
bool connectTenant(const TenantArgs &a, Tenant &t, PeerInfo *peer, std::string *why) {
    const size_t n = a.bytes;
    if (t.setUp(a.device.c_str(), 4 * n) != 0) {
        *why = t.error();
        return false;
    }
    if (a.role == 'B') {
        ibvx::demo::fillPattern(t.buf() + 2 * n, n, 3);  // what A will READ
    }
    PeerInfo mine = t.local();
    if (!writeAll(a.peer, &mine, sizeof(mine)) || !readAll(a.peer, peer, sizeof(*peer))) {
        *why = "peer exchange";
        return false;
    }
    if (t.connect(*peer) != 0) {
        *why = t.error();
        return false;
    }
    char line[160];
    snprintf(line, sizeof(line),
             "line [%c] %s: QP %u -> peer QP %u, buffer %p (%zu KiB, rkey 0x%x), QP in RTS", a.role,
             a.device.c_str(), mine.qp_num, peer->qp_num, static_cast<void *>(t.buf()), 4 * n / 1024,
             mine.rkey);
    sendLine(a.ctl, line);
    sendLine(a.ctl, "ready " + std::to_string(t.objects()));
    return true;
}

int runTenant(const TenantArgs &a) {
    Tenant t;
    PeerInfo peer{};
    std::string why, cmd;
    if (!connectTenant(a, t, &peer, &why)) {
        return tenantFail(a.ctl, why);
    }
    if (!readLine(a.ctl, &cmd) || cmd != "go") {
        return tenantFail(a.ctl, "no go");
    }

    // ---- data phase: no libibv_extend call from here until teardown ----
    DataReport report;
    report.me = std::string("[") + a.role + "] ";
    if (a.role == 'A') {
        initiatorPhase(t, peer, a.peer, a.bytes, report);
    } else {
        responderPhase(t, peer, a.peer, a.bytes, report);
    }
    // ---- end of data phase ----

    writeAll(a.ctl, report.lines.data(), report.lines.size());
    sendLine(a.ctl, std::string(report.ok ? "done ok " : "done fail data ") + std::to_string(report.bytes));
    if (!readLine(a.ctl, &cmd) || cmd != "teardown") {
        return 1;
    }
    int rc = t.tearDown();
    if (rc != 0) {
        fprintf(stderr, "%steardown: %s\n", report.me.c_str(), strerror(-rc));
    }
    return report.ok && rc == 0 ? 0 : 1;
}

// ---- the parent ---------------------------------------------------------------------------

bool getStats(const std::string &socket, ibv_extend::v1::GetStatsResponse *out, std::string *err) {
    auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    auto stub = ibv_extend::v1::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status st = stub->GetStats(&ctx, ibv_extend::v1::GetStatsRequest{}, out);
    if (!st.ok()) {
        *err = st.error_message();
    }
    return st.ok();
}

struct Child {
    char role;
    pid_t pid = -1;
    int ctl = -1;
    bool done_ok = false;
    uint64_t bytes = 0;
};

// Reads a tenant's lines until one starting with `until`; prints "line" ones.
bool pump(Child *c, const std::string &until, std::string *last) {
    std::string line;
    while (readLine(c->ctl, &line)) {
        if (line.rfind("line ", 0) == 0) {
            printf("  %s\n", line.c_str() + 5);
            continue;
        }
        *last = line;
        return line.rfind(until, 0) == 0;
    }
    *last = "(tenant " + std::string(1, c->role) + " exited)";
    return false;
}

bool socketAnswers(const std::string &path) {
    return connectUnix(path).isOk();
}

// Waits up to wait_ms for the broker's socket to answer.
bool waitForBroker(const std::string &socket, int wait_ms) {
    auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (!socketAnswers(socket)) {
        if (std::chrono::steady_clock::now() >= give_up) {
            printf("ibvx-demo: no broker answers at %s (start ibv-extendd, or set IBV_EXTEND_SOCKET)\n",
                   socket.c_str());
            return false;
        }
        usleep(20 * 1000);
    }
    return true;
}

// Starts tenants A and B (this program again, --tenant), each with a control socket to this
// process and one end of a socket pair between them.
bool spawnTenants(const std::string &device, size_t bytes, std::vector<Child> &kids) {
    // CLOEXEC everywhere; each tenant clears it on exactly its own two ends before exec.
    int peer[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, peer) < 0) {
        perror("socketpair");
        return false;
    }
    bool ok = true;
    for (size_t i = 0; i < kids.size() && ok; ++i) {
        int ctl[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0) {
            perror("socketpair");
            ok = false;
            break;
        }
        std::vector<std::string> args{"/proc/self/exe",
                                      "--tenant",
                                      std::string(1, kids[i].role),
                                      "--ctl",
                                      std::to_string(ctl[1]),
                                      "--peer",
                                      std::to_string(peer[i]),
                                      "--device",
                                      device,
                                      "--bytes",
                                      std::to_string(bytes)};
        std::vector<char *> argv;
        for (auto &a : args) {
            argv.push_back(a.data());
        }
        argv.push_back(nullptr);
        kids[i].pid = fork();
        if (kids[i].pid == 0) {
            fcntl(ctl[1], F_SETFD, 0);
            fcntl(peer[i], F_SETFD, 0);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(ctl[1]);
        kids[i].ctl = ctl[0];
    }
    close(peer[0]);
    close(peer[1]);
    return ok;
}

// The broker's RPC count around the tenants' data phase: both tenants set up, the counters read,
// "go", both report, the counters read again. Returns whether both counts were read;
// *data_ok: both tenants verified their data; *objects: the broker objects the tenants made.
bool runDataPhase(const std::string &socket, std::vector<Child> &kids, int *objects, bool *data_ok,
                  ibv_extend::v1::GetStatsResponse *before, ibv_extend::v1::GetStatsResponse *after) {
    std::string last, err;
    for (Child &c : kids) {
        if (!pump(&c, "ready", &last)) {
            printf("  [%c] setup failed: %s\n", c.role, last.c_str());
            return false;
        }
        *objects += atoi(last.c_str() + 6);
    }
    if (!getStats(socket, before, &err)) {
        printf("  Admin/GetStats failed: %s (the demo must run as root or the broker's admin group)\n",
               err.c_str());
        return false;
    }
    printf("  data phase: fast path only (WQEs into the mapped SQ/RQ, doorbell stores, CQ polling)\n");
    for (Child &c : kids) {
        sendLine(c.ctl, "go");
    }
    *data_ok = true;
    for (Child &c : kids) {
        if (pump(&c, "done", &last)) {
            c.done_ok = last.rfind("done ok", 0) == 0;
            c.bytes = strtoull(last.c_str() + last.rfind(' ') + 1, nullptr, 10);
        }
        if (!c.done_ok) {
            printf("  [%c] data phase failed: %s\n", c.role, last.c_str());
            *data_ok = false;
        }
    }
    if (!getStats(socket, after, &err)) {
        printf("  Admin/GetStats failed: %s\n", err.c_str());
        return false;
    }
    return true;
}

// Tells every started tenant to tear down and waits for it; false when one did not exit 0.
bool reapTenants(std::vector<Child> &kids) {
    bool ok = true;
    for (Child &c : kids) {
        if (c.pid > 0) {
            sendLine(c.ctl, "teardown");
        }
    }
    for (Child &c : kids) {
        if (c.pid <= 0) {
            continue;
        }
        int status = 0;
        waitpid(c.pid, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            printf("  [%c] exited with status %d\n", c.role, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            ok = false;
        }
        close(c.ctl);
    }
    return ok;
}

int runParent(const std::string &device, size_t bytes, int wait_ms) {
    const char *env = getenv("IBV_EXTEND_SOCKET");
    std::string socket = env != nullptr && env[0] != '\0' ? env : kDefaultSocket;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    if (!waitForBroker(socket, wait_ms)) {
        return 1;
    }
    printf("ibvx-demo: two tenants on %s through the broker at %s\n", device.c_str(), socket.c_str());

    std::vector<Child> kids{{'A'}, {'B'}};
    int objects = 0;
    ibv_extend::v1::GetStatsResponse before, after;
    bool data_ok = false;
    bool measured =
        spawnTenants(device, bytes, kids) && runDataPhase(socket, kids, &objects, &data_ok, &before, &after);
    bool ok = reapTenants(kids) && measured && data_ok;
    if (measured) {
        uint64_t delta = after.total_calls() - before.total_calls();
        printf("report:\n");
        printf("  objects created through the broker: %d (context, PD, CQ, QP, MR per tenant)\n", objects);
        printf("  bytes moved and verified: %" PRIu64 "\n", kids[0].bytes + kids[1].bytes);
        printf("  broker RPCs during the data phase: %" PRIu64 " (GetStats total_calls %" PRIu64
               " -> %" PRIu64 ", %u sessions)\n",
               delta, before.total_calls(), after.total_calls(), after.sessions());
        ok = ok && delta == 0;
    }
    printf("ibvx-demo: %s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
    TenantArgs t;
    std::string device = "softnda0";
    size_t bytes = 256 * 1024;
    int wait_ms = 0;
    // Every option takes exactly one value.
    for (int i = 1; i < argc; i += 2) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (v == nullptr) {
            fprintf(stderr, "ibvx-demo: %s needs a value\n", a.c_str());
            return 2;
        }
        if (a == "--tenant") {
            t.role = v[0];
        } else if (a == "--ctl") {
            t.ctl = atoi(v);
        } else if (a == "--peer") {
            t.peer = atoi(v);
        } else if (a == "--device") {
            device = v;
        } else if (a == "--bytes") {
            bytes = strtoull(v, nullptr, 10);
        } else if (a == "--wait") {
            wait_ms = atoi(v);
        } else {
            fprintf(stderr, "usage: ibvx-demo [--device NAME] [--bytes N] [--wait MS]\n");
            return 2;
        }
    }
    if (bytes < 64 || bytes > (64u << 20)) {
        fprintf(stderr, "ibvx-demo: --bytes must be in 64..67108864\n");
        return 2;
    }
    if (t.role != 0) {
        t.device = device;
        t.bytes = bytes;
        return runTenant(t);
    }
    return runParent(device, bytes, wait_ms);
}
