// A tenant of the chaos soak (chaos_soak_test.cpp) through the extend API, as an NPU runtime uses
// it: objects made with ibvx_* / ibv_create_*_extend through libibv_extend.so (broker mode), the
// data path written straight into the mapped queues with softnda's device-side helpers, as a
// device kernel would (ibvx-demo's Tenant: no broker call after the QPs connect). Two tenants'
// QPs connected to each other run a seeded mix of RDMA WRITE, RDMA READ and SEND/RECV, every
// completion's status and every byte checked; with "churn", between them a third tenant's whole
// set (context, PD, CQ, QP, MR) is made and destroyed. Atomics are left to chaos-tenant: the
// device-side helpers here post no atomic.
//
//   chaos-extend-tenant DEVICE SEED [churn]
//
// Context churn is off by default: with it the soak found a doorbell page left in the fd store
// (fixed) and a WRITE loop with no completion for 30 s (most likely a counted §10 window now; see
// docs/restart.md, "The chaos soak").
//
// stdout: "ready\n" once the QPs are connected; when stdin reaches EOF, "done ops=N writes=W
// reads=R sends=S churn=C failed=X win_recv=.. win_cqe=..\n", exit 0 when nothing failed. The
// win_* figures count what softnda SPEC.md §10 says a broker kill may do, each checked to be
// that window's effect (see chaos_tenant.c): a receive consumed without a completion, or a
// completion lost while its effect is there. Anything else is a failure, on stderr.
#include <poll.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "tools/ibvx-demo/tenant.h"

namespace {

using ibvx::demo::PeerInfo;
using ibvx::demo::Tenant;

constexpr size_t kBuf = 64 * 1024;
constexpr size_t kRecvBase = kBuf / 2;  // b's receive slots, after its RDMA area
constexpr uint32_t kRecvSlots = 4, kRecvSize = 1024;
constexpr int kCqeWaitMs = 20000;  // a crash and restart pause completions for a while

uint64_t failed = 0, win_recv = 0, win_cqe = 0;

#define FAILURE(...)                                          \
    do {                                                      \
        ++failed;                                             \
        fprintf(stderr, "chaos-extend-tenant: " __VA_ARGS__); \
        fputc('\n', stderr);                                  \
    } while (0)

[[noreturn]] void fatal(const char *what, const std::string &why) {
    fprintf(stderr, "chaos-extend-tenant: %s: %s\n", what, why.c_str());
    exit(1);
}

bool stdinClosed() {
    pollfd p{0, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) {
        return false;
    }
    char c;
    return read(0, &c, 1) <= 0;
}

// Tenant a sends to tenant b (and reads from it); b keeps two receives posted.
struct Pair {
    Tenant a, b;
    PeerInfo to_b{};
    uint64_t recv_posted = 0, recv_expected = 0;  // receive sequence numbers

    void postRecv() {
        const uint64_t seq = recv_posted++;
        int rc = b.postRecv(kRecvBase + (seq % kRecvSlots) * kRecvSize, kRecvSize, seq);
        if (rc != 0) {
            fatal("posting a receive", strerror(-rc));
        }
    }
};

// The bytes of operation id: what the sender writes and the receiver checks.
uint32_t seedOf(uint64_t id) {
    return static_cast<uint32_t>(id * 2654435761u);
}

// WRITE (a's buffer to b's) or READ (b's into a's) of a random length at a random offset.
void transfer(Pair &p, std::mt19937_64 &rng, uint64_t id, bool read) {
    const uint32_t len = 1 + static_cast<uint32_t>(rng() % 4096);
    const size_t off = rng() % (kRecvBase - 4096);
    uint8_t *from = read ? p.b.buf() + off : p.a.buf() + off;
    uint8_t *to = read ? p.a.buf() + off : p.b.buf() + off;
    ibvx::demo::fillPattern(from, len, seedOf(id));
    memset(to, 0, len);
    const int rc =
        read ? p.a.read(p.to_b, off, off, len, kCqeWaitMs) : p.a.write(p.to_b, off, off, len, kCqeWaitMs);
    const char *what = read ? "READ" : "WRITE";
    if (rc != 0 && rc != -ETIMEDOUT) {
        FAILURE("%s %" PRIu64 ": completion status %d", what, id, rc);
        return;
    }
    if (const size_t bad = ibvx::demo::checkPattern(to, len, seedOf(id)); bad != len) {
        FAILURE("%s %" PRIu64 ": byte %zu of %u at offset %zu not as sent (completion %s)", what, id, bad,
                len, off, rc == 0 ? "seen" : "missing");
    } else if (rc == -ETIMEDOUT) {
        ++win_cqe;
    }
}

// SEND of a random length from a; b's receive completion and bytes checked.
void sendRecv(Pair &p, std::mt19937_64 &rng, uint64_t id) {
    const uint32_t len = 1 + static_cast<uint32_t>(rng() % kRecvSize);
    ibvx::demo::fillPattern(p.a.buf(), len, seedOf(id));
    const int sent = p.a.send(0, len, kCqeWaitMs);
    if (sent != 0 && sent != -ETIMEDOUT) {
        FAILURE("SEND %" PRIu64 ": completion status %d", id, sent);
        return;
    }
    auto slot = [&](uint64_t seq) { return p.b.buf() + kRecvBase + (seq % kRecvSlots) * kRecvSize; };
    softnda_cqe cqe{};
    if (p.b.waitCompletion(&cqe, kCqeWaitMs) != 0) {
        // The receive's completion lost after the commit point: the message is in its buffer.
        if (ibvx::demo::checkPattern(slot(p.recv_expected), len, seedOf(id)) == len) {
            ++win_cqe;
            ++p.recv_expected;
            p.postRecv();
        } else {
            FAILURE("SEND %" PRIu64 ": no receive completion and no message (send completion %s)", id,
                    sent == 0 ? "seen" : "missing");
        }
        return;
    }
    if (cqe.status != 0 || cqe.byte_len != len || cqe.wr_id < p.recv_expected || cqe.wr_id >= p.recv_posted) {
        FAILURE("SEND %" PRIu64 ": receive status %u, byte_len %u of %u, wr_id %" PRIu64 " (due %" PRIu64 ")",
                id, static_cast<unsigned>(cqe.status), cqe.byte_len, len, static_cast<uint64_t>(cqe.wr_id),
                p.recv_expected);
        return;
    }
    while (p.recv_expected < cqe.wr_id) {  // consumed without a completion, the message in the next
        ++win_recv;
        ++p.recv_expected;
        p.postRecv();
    }
    if (ibvx::demo::checkPattern(slot(cqe.wr_id), len, seedOf(id)) != len) {
        FAILURE("SEND %" PRIu64 ": received bytes not as sent", id);
    }
    if (sent == -ETIMEDOUT) {
        ++win_cqe;
    }
    ++p.recv_expected;
    p.postRecv();
}

// A third tenant's whole set made and destroyed through the broker.
void churn(const char *device) {
    Tenant t;
    if (int rc = t.setUp(device, 4096); rc != 0) {
        FAILURE("churn set-up: %s", t.error().c_str());
    }
    if (int rc = t.tearDown(); rc != 0) {
        FAILURE("churn tear-down: %s", strerror(rc < 0 ? -rc : rc));
    }
}

}  // namespace

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "softnda0";
    std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
    const bool churns_too = argc > 3 && strcmp(argv[3], "churn") == 0;
    Pair p;
    if (p.a.setUp(device, kBuf) != 0) {
        fatal("setting up a", p.a.error());
    }
    if (p.b.setUp(device, kBuf) != 0) {
        fatal("setting up b", p.b.error());
    }
    p.to_b = p.b.local();
    if (p.a.connect(p.to_b) != 0) {
        fatal("connecting a", p.a.error());
    }
    if (p.b.connect(p.a.local()) != 0) {
        fatal("connecting b", p.b.error());
    }
    p.postRecv();
    p.postRecv();
    printf("ready\n");
    fflush(stdout);

    uint64_t ops = 0, writes = 0, reads = 0, sends = 0, churns = 0;
    for (uint64_t id = 1;; ++id) {
        if ((id & 15) == 0 && stdinClosed()) {
            break;
        }
        const uint64_t r = rng() % 1000;
        if (r < 350) {
            transfer(p, rng, id, false);
            ++writes;
        } else if (r < 650) {
            transfer(p, rng, id, true);
            ++reads;
        } else if (r < 980 || !churns_too) {
            sendRecv(p, rng, id);
            ++sends;
        } else {
            churn(device);
            ++churns;
            continue;
        }
        ++ops;
    }
    if (int rc = p.a.tearDown(); rc != 0) {
        FAILURE("tear-down of a: %s", strerror(rc < 0 ? -rc : rc));
    }
    if (int rc = p.b.tearDown(); rc != 0) {
        FAILURE("tear-down of b: %s", strerror(rc < 0 ? -rc : rc));
    }
    printf("done ops=%" PRIu64 " writes=%" PRIu64 " reads=%" PRIu64 " sends=%" PRIu64 " churn=%" PRIu64
           " failed=%" PRIu64 " win_recv=%" PRIu64 " win_cqe=%" PRIu64 "\n",
           ops, writes, reads, sends, churns, failed, win_recv, win_cqe);
    fflush(stdout);
    return failed == 0 ? 0 : 1;
}
