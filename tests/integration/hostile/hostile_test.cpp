// Hostile tenants against the real ibv-extendd, as real processes. A victim (this process, root)
// keeps working while a second uid (a child that drops to nobody before it touches gRPC) attacks
// its objects and the broker every way the issue lists; every attack must fail with the expected
// code, the victim's traffic must keep flowing, and the broker must give back every fd and keep
// its RSS. Quotas are raced by several processes of one uid; policy refuses a uid by rule; and a
// client in new pid and mount namespaces, seeing only the broker's socket, works end to end.
//
// The helper processes are this binary again (exec, so no gRPC state crosses a fork), selected
// with IBVX_HOSTILE_MODE and run through the HostileHelper.Run test.
#include <fcntl.h>
#include <grp.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "broker_process.h"
#include "test_client.h"
#include "wait_for.h"

namespace ibvx::test {
namespace {

using Clock = std::chrono::steady_clock;
using grpc::StatusCode;

constexpr uid_t kNobody = 65534;

// The attacker's uid has small quotas; the victim (root) has none.
constexpr char kConfig[] =
    "[broker]\n"
    "socket_mode = \"0666\"\n"
    "handshake_timeout_ms = 300\n"
    "attach_timeout_ms = 1000\n"
    "[quotas.uid.65534]\n"
    "cqs = 4\n"
    "pds = 10\n"
    "sessions = 12\n";

std::string env(const char *name) {
    const char *v = std::getenv(name);
    return v != nullptr ? v : "";
}

uint64_t envU64(const char *name) {
    return std::strtoull(env(name).c_str(), nullptr, 10);
}

// Runs this binary as a helper; the child inherits stdout (the attack list goes to the log).
// Pipes are close-on-exec so one helper never holds another's ends (EOF would never come);
// the child's own ends and `inherit` are made inheritable in the child only.
pid_t spawn(const std::string &mode, const std::vector<std::string> &vars, int *report_fd = nullptr,
            int *hold_fd = nullptr, std::vector<int> inherit = {}) {
    int rep[2] = {-1, -1}, hold[2] = {-1, -1};
    if ((report_fd != nullptr && ::pipe2(rep, O_CLOEXEC) < 0) ||
        (hold_fd != nullptr && ::pipe2(hold, O_CLOEXEC) < 0)) {
        return -1;
    }
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {
        for (int fd : inherit) {
            ::fcntl(fd, F_SETFD, 0);
        }
        if (report_fd != nullptr) {
            ::fcntl(rep[1], F_SETFD, 0);
        }
        if (hold_fd != nullptr) {
            ::fcntl(hold[0], F_SETFD, 0);
        }
        ::setenv("IBVX_HOSTILE_MODE", mode.c_str(), 1);
        for (const std::string &v : vars) {
            ::putenv(const_cast<char *>(v.c_str()));
        }
        if (report_fd != nullptr) {
            ::close(rep[0]);
            ::setenv("IBVX_REPORT_FD", std::to_string(rep[1]).c_str(), 1);
        }
        if (hold_fd != nullptr) {
            ::close(hold[1]);
            ::setenv("IBVX_HOLD_FD", std::to_string(hold[0]).c_str(), 1);
        }
        const char *argv[] = {"/proc/self/exe", "--gtest_filter=HostileHelper.Run", nullptr};
        ::execv("/proc/self/exe", const_cast<char *const *>(argv));
        _exit(127);
    }
    if (report_fd != nullptr) {
        ::close(rep[1]);
        *report_fd = rep[0];
    }
    if (hold_fd != nullptr) {
        ::close(hold[0]);
        *hold_fd = hold[1];
    }
    return pid;
}

int waitExit(pid_t pid) {
    int status = 0;
    if (::waitpid(pid, &status, 0) != pid) {
        return -1;
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Reads one line (up to '\n' or EOF) from fd.
std::string readLine(int fd, int timeout_ms) {
    std::string out;
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    char c;
    while (Clock::now() < deadline) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 50) != 1) {
            continue;
        }
        if (::read(fd, &c, 1) != 1 || c == '\n') {
            break;
        }
        out += c;
    }
    return out;
}

void report(const std::string &line) {
    int fd = std::atoi(env("IBVX_REPORT_FD").c_str());
    std::string l = line + "\n";
    (void)!::write(fd, l.data(), l.size());
}

// Blocks until the parent closes the hold pipe.
void hold() {
    int fd = std::atoi(env("IBVX_HOLD_FD").c_str());
    char c;
    while (::read(fd, &c, 1) > 0) {
    }
}

bool dropToNobody() {
    return ::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0 &&
           ::getuid() == kNobody && ::geteuid() == kNobody;
}

// ---- the attacker ---------------------------------------------------------------------------

class Attacker {
  public:
    explicit Attacker(std::string socket) : socket_(std::move(socket)) {}

    // Records one attack and whether it failed the expected way.
    void expect(const std::string &name, const grpc::Status &st, StatusCode want) {
        bool ok = st.error_code() == want;
        std::printf("ATTACK %-58s -> %s%s (%s)\n", name.c_str(), codeName(st.error_code()),
                    ok ? "" : " UNEXPECTED", st.error_message().substr(0, 110).c_str());
        failures_ += ok ? 0 : 1;
    }
    void expectTrue(const std::string &name, bool ok, const std::string &what) {
        std::printf("ATTACK %-58s -> %s%s\n", name.c_str(), what.c_str(), ok ? "" : " UNEXPECTED");
        failures_ += ok ? 0 : 1;
    }
    int failures() const { return failures_; }

    static const char *codeName(StatusCode c) {
        static const char *const names[] = {
            "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
            "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
            "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
            "DATA_LOSS", "UNAUTHENTICATED"};
        auto i = static_cast<size_t>(c);
        return i < std::size(names) ? names[i] : "?";
    }

    // Raw connection: sends bytes, then reports whether the broker closed it within timeout_ms.
    bool closedAfter(const std::string &bytes, int timeout_ms, bool shut_write = false) {
        UniqueFd fd = connectUnix(socket_);
        if (!fd) {
            return false;
        }
        if (!bytes.empty() && ::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) < 0) {
            return true;  // refused while sending: closed
        }
        if (shut_write) {
            ::shutdown(fd.get(), SHUT_WR);
        }
        auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
        char buf[4096];
        while (Clock::now() < deadline) {
            pollfd p{fd.get(), POLLIN, 0};
            if (::poll(&p, 1, 20) == 1) {
                ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
                if (n <= 0) {
                    return true;
                }
            }
        }
        return false;
    }

  private:
    std::string socket_;
    int failures_ = 0;
};

template <typename Req, typename Resp>
grpc::Status callWithToken(TestClient &c, const std::string &token_hex,
                           grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &,
                                                                    Resp *),
                           const Req &req, Resp *resp) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("ibvx-session", token_hex);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return (c.stub().*method)(&ctx, req, resp);
}

UniqueFd memfdOf(size_t size) {
    UniqueFd fd(::memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (fd && (::ftruncate(fd.get(), static_cast<off_t>(size)) < 0 ||
               ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK) < 0)) {
        fd.reset();
    }
    return fd;
}

grpc::Status regMr(TestClient &c, uint64_t pd, uint64_t xfer, uint64_t offset, uint64_t length,
                   pb::RegMrResponse *resp = nullptr) {
    pb::RegMrRequest req;
    req.set_pd(pd);
    req.set_xfer_id(xfer);
    req.set_offset(offset);
    req.set_length(length);
    req.set_access(IBV_ACCESS_LOCAL_WRITE);
    pb::RegMrResponse r;
    return c.call(&pb::Broker::Stub::RegMr, req, resp != nullptr ? resp : &r);
}

grpc::Status createCq(TestClient &c, uint64_t ctx, uint32_t cqe, pb::CreateCqResponse *resp,
                      pb::DmaMode mode = pb::DMA_MODE_DEFAULT) {
    pb::CreateCqRequest req;
    req.set_context(ctx);
    req.set_cqe(cqe);
    req.set_dma_mode(mode);
    return c.call(&pb::Broker::Stub::CreateCq, req, resp);
}

pb::CreateQpRequest qpRequest(uint64_t ctx, uint64_t pd, uint64_t cq) {
    pb::CreateQpRequest req;
    req.set_context(ctx);
    req.set_pd(pd);
    req.set_send_cq(cq);
    req.set_recv_cq(cq);
    req.set_qp_type(pb::QP_TYPE_RC);
    req.mutable_cap()->set_max_send_wr(8);
    req.mutable_cap()->set_max_recv_wr(8);
    req.mutable_cap()->set_max_send_sge(1);
    req.mutable_cap()->set_max_recv_sge(1);
    req.set_dma_mode(pb::DMA_MODE_DEFAULT);
    return req;
}

struct Own {
    uint64_t ctx = 0, pd = 0, cq = 0, qp = 0;
};

bool openOwn(TestClient &c, Own *o, bool with_qp) {
    pb::OpenContextRequest oreq;
    oreq.set_device_name("softnda0");
    pb::OpenContextResponse oresp;
    pb::AllocPdRequest preq;
    pb::AllocPdResponse presp;
    if (!c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok()) {
        return false;
    }
    o->ctx = oresp.context();
    preq.set_context(o->ctx);
    if (!c.call(&pb::Broker::Stub::AllocPd, preq, &presp).ok()) {
        return false;
    }
    o->pd = presp.pd();
    if (!with_qp) {
        return true;
    }
    pb::CreateCqResponse cq;
    if (!createCq(c, o->ctx, 16, &cq).ok()) {
        return false;
    }
    o->cq = cq.cq();
    pb::CreateQpResponse qp;
    if (!c.call(&pb::Broker::Stub::CreateQp, qpRequest(o->ctx, o->pd, o->cq), &qp).ok()) {
        return false;
    }
    o->qp = qp.qp();
    return c.drainRegions() >= 0;
}

int runAttacker() {
    if (!dropToNobody()) {
        std::printf("cannot drop to uid %u: %s\n", kNobody, std::strerror(errno));
        return 100;
    }
    const std::string sock = env("IBVX_SOCKET");
    const std::string victim_token = env("IBVX_VICTIM_TOKEN");
    const uint64_t v_ctx = envU64("IBVX_VICTIM_CTX"), v_pd = envU64("IBVX_VICTIM_PD"),
                   v_cq = envU64("IBVX_VICTIM_CQ"), v_qp = envU64("IBVX_VICTIM_QP"),
                   v_mr = envU64("IBVX_VICTIM_MR"), v_xfer = envU64("IBVX_VICTIM_XFER");
    Attacker a(sock);

    // 1. Riding the victim's session.
    {
        TestClient c(sock);
        pb::AllocPdRequest req;
        req.set_context(v_ctx);
        pb::AllocPdResponse resp;
        a.expect("victim's token from another uid (call metadata)",
                 callWithToken(c, victim_token, &pb::Broker::Stub::AllocPd, req, &resp),
                 StatusCode::PERMISSION_DENIED);
        SessionToken t{};
        tokenFromHex(victim_token, &t);
        UniqueFd ch = connectUnix(sock);
        int rc = attachClient(ch.get(), t, 3000);
        a.expectTrue("attach an fd channel with the victim's token", rc == -EPERM,
                     "attach " + std::string(std::strerror(-rc)));
        a.expect("no token at all", callWithToken(c, "", &pb::Broker::Stub::AllocPd, req, &resp),
                 StatusCode::PERMISSION_DENIED);
        a.expect("malformed token", callWithToken(c, "zz", &pb::Broker::Stub::AllocPd, req, &resp),
                 StatusCode::PERMISSION_DENIED);
        a.expect("forged token (random 16 bytes)",
                 callWithToken(c, "0123456789abcdef0123456789abcdef", &pb::Broker::Stub::AllocPd, req, &resp),
                 StatusCode::UNAVAILABLE);
    }

    // 2. The victim's handles from the attacker's own session.
    TestClient c(sock);
    if (!c.connect()) {
        std::printf("attacker cannot connect\n");
        return 101;
    }
    Own own;
    if (!openOwn(c, &own, true)) {
        std::printf("attacker cannot create its own objects\n");
        return 102;
    }
    {
        pb::AllocPdRequest r1;
        r1.set_context(v_ctx);
        pb::AllocPdResponse p1;
        a.expect("AllocPd on the victim's context", c.call(&pb::Broker::Stub::AllocPd, r1, &p1),
                 StatusCode::NOT_FOUND);
        pb::DeallocPdRequest r2;
        r2.set_pd(v_pd);
        pb::DeallocPdResponse p2;
        a.expect("DeallocPd of the victim's PD", c.call(&pb::Broker::Stub::DeallocPd, r2, &p2),
                 StatusCode::NOT_FOUND);
        pb::DestroyQpRequest r3;
        r3.set_qp(v_qp);
        pb::DestroyQpResponse p3;
        a.expect("DestroyQp of the victim's QP", c.call(&pb::Broker::Stub::DestroyQp, r3, &p3),
                 StatusCode::NOT_FOUND);
        pb::DestroyCqRequest r4;
        r4.set_cq(v_cq);
        pb::DestroyCqResponse p4;
        a.expect("DestroyCq of the victim's CQ", c.call(&pb::Broker::Stub::DestroyCq, r4, &p4),
                 StatusCode::NOT_FOUND);
        pb::DeregMrRequest r5;
        r5.set_mr(v_mr);
        pb::DeregMrResponse p5;
        a.expect("DeregMr of the victim's MR", c.call(&pb::Broker::Stub::DeregMr, r5, &p5),
                 StatusCode::NOT_FOUND);
        pb::QueryQpRequest r6;
        r6.set_qp(v_qp);
        r6.set_attr_mask(IBV_QP_STATE);
        pb::QueryQpResponse p6;
        a.expect("QueryQp of the victim's QP", c.call(&pb::Broker::Stub::QueryQp, r6, &p6),
                 StatusCode::NOT_FOUND);
        pb::ModifyQpRequest r7;
        r7.set_qp(v_qp);
        r7.mutable_attr()->set_qp_state(pb::QP_STATE_ERR);
        r7.set_attr_mask(IBV_QP_STATE);
        pb::ModifyQpResponse p7;
        a.expect("ModifyQp of the victim's QP to ERR", c.call(&pb::Broker::Stub::ModifyQp, r7, &p7),
                 StatusCode::NOT_FOUND);
        pb::CloseContextRequest r8;
        r8.set_context(v_ctx);
        pb::CloseContextResponse p8;
        a.expect("CloseContext of the victim's context", c.call(&pb::Broker::Stub::CloseContext, r8, &p8),
                 StatusCode::NOT_FOUND);
        pb::CreateQpResponse p9;
        a.expect("CreateQp on the victim's PD and CQ",
                 c.call(&pb::Broker::Stub::CreateQp, qpRequest(own.ctx, v_pd, v_cq), &p9),
                 StatusCode::NOT_FOUND);
        UniqueFd m = memfdOf(4096);
        c.sendFd(2, m.get());
        a.expect("RegMr (own memfd) into the victim's PD", regMr(c, v_pd, 2, 0, 4096), StatusCode::NOT_FOUND);
    }

    // 3. Forged handles.
    {
        std::mt19937_64 rng(42);
        for (uint64_t h : {uint64_t{0}, rng(), v_qp + 1, v_qp ^ 1, ~v_qp}) {
            pb::DestroyQpRequest r;
            r.set_qp(h);
            pb::DestroyQpResponse p;
            a.expect("DestroyQp of forged handle " + std::to_string(h),
                     c.call(&pb::Broker::Stub::DestroyQp, r, &p), StatusCode::NOT_FOUND);
        }
        // A real handle of the wrong kind.
        pb::DestroyCqRequest r;
        r.set_cq(own.qp);
        pb::DestroyCqResponse p;
        a.expect("DestroyCq given its own QP handle", c.call(&pb::Broker::Stub::DestroyCq, r, &p),
                 StatusCode::NOT_FOUND);
    }

    // 4. Dependencies, double destroys, stale handles.
    {
        pb::DestroyCqRequest r;
        r.set_cq(own.cq);
        pb::DestroyCqResponse p;
        a.expect("DestroyCq still used by a QP", c.call(&pb::Broker::Stub::DestroyCq, r, &p),
                 StatusCode::FAILED_PRECONDITION);
        pb::DeallocPdRequest r2;
        r2.set_pd(own.pd);
        pb::DeallocPdResponse p2;
        a.expect("DeallocPd still used by a QP", c.call(&pb::Broker::Stub::DeallocPd, r2, &p2),
                 StatusCode::FAILED_PRECONDITION);
        pb::CloseContextRequest r3;
        r3.set_context(own.ctx);
        pb::CloseContextResponse p3;
        a.expect("CloseContext with objects in it", c.call(&pb::Broker::Stub::CloseContext, r3, &p3),
                 StatusCode::FAILED_PRECONDITION);
        pb::DestroyQpRequest q;
        q.set_qp(own.qp);
        pb::DestroyQpResponse qr;
        a.expect("DestroyQp (own, first time)", c.call(&pb::Broker::Stub::DestroyQp, q, &qr), StatusCode::OK);
        a.expect("DestroyQp again (double destroy)", c.call(&pb::Broker::Stub::DestroyQp, q, &qr),
                 StatusCode::NOT_FOUND);
        pb::QueryQpRequest qq;
        qq.set_qp(own.qp);
        pb::QueryQpResponse qqr;
        a.expect("QueryQp of a destroyed QP (stale handle)", c.call(&pb::Broker::Stub::QueryQp, qq, &qqr),
                 StatusCode::NOT_FOUND);
        for (uint64_t reg : qr.released_regions()) {
            c.unmap(reg);
        }
        pb::CreateQpResponse again;
        a.expect("CreateQp again after the destroy",
                 c.call(&pb::Broker::Stub::CreateQp, qpRequest(own.ctx, own.pd, own.cq), &again),
                 StatusCode::OK);
        own.qp = again.qp();
        c.drainRegions();
    }

    // 5. RegMr with memory that is not the attacker's to give, or not memory.
    {
        int p[2];
        if (::pipe(p) == 0) {
            c.sendFd(11, p[0]);
            a.expect("RegMr with a pipe fd", regMr(c, own.pd, 11, 0, 4096), StatusCode::INVALID_ARGUMENT);
            ::close(p[0]);
            ::close(p[1]);
        }
        UniqueFd file(::open("/tmp", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600));
        if (file && ::ftruncate(file.get(), 8192) == 0) {
            c.sendFd(12, file.get());
            a.expect("RegMr with a regular file fd", regMr(c, own.pd, 12, 0, 4096),
                     StatusCode::INVALID_ARGUMENT);
        }
        UniqueFd small = memfdOf(4096);
        c.sendFd(13, small.get());
        a.expect("RegMr beyond the memfd's size", regMr(c, own.pd, 13, 0, 8192),
                 StatusCode::INVALID_ARGUMENT);
        UniqueFd m = memfdOf(4096);
        c.sendFd(14, m.get());
        a.expect("RegMr with offset + length overflowing", regMr(c, own.pd, 14, UINT64_MAX - 10, 100),
                 StatusCode::INVALID_ARGUMENT);
        a.expect("RegMr of length 0", regMr(c, own.pd, 15, 0, 0), StatusCode::INVALID_ARGUMENT);
        a.expect("RegMr with the victim's pending xfer id", regMr(c, own.pd, v_xfer, 0, 4096),
                 StatusCode::INVALID_ARGUMENT);
        UniqueFd ok = memfdOf(8192);
        c.sendFd(16, ok.get());
        pb::RegMrResponse mr;
        a.expect("RegMr of its own memfd (control)", regMr(c, own.pd, 16, 0, 8192, &mr), StatusCode::OK);
        a.expect("RegMr reusing a consumed xfer id", regMr(c, own.pd, 16, 0, 8192),
                 StatusCode::INVALID_ARGUMENT);
    }

    // 6. Invalid enums, huge and zero sizes, oversized and malformed messages.
    {
        pb::CreateCqResponse cq;
        a.expect("CreateCq with an invalid dma_mode enum (77)",
                 createCq(c, own.ctx, 16, &cq, static_cast<pb::DmaMode>(77)), StatusCode::INVALID_ARGUMENT);
        a.expect("CreateCq with cqe 0", createCq(c, own.ctx, 0, &cq), StatusCode::INVALID_ARGUMENT);
        a.expect("CreateCq with cqe 0xffffffff", createCq(c, own.ctx, 0xffffffffu, &cq),
                 StatusCode::INVALID_ARGUMENT);
        auto q = qpRequest(own.ctx, own.pd, own.cq);
        q.set_qp_type(static_cast<pb::QpType>(99));
        pb::CreateQpResponse qr;
        a.expect("CreateQp with an invalid qp_type enum (99)", c.call(&pb::Broker::Stub::CreateQp, q, &qr),
                 StatusCode::INVALID_ARGUMENT);
        q = qpRequest(own.ctx, own.pd, own.cq);
        q.mutable_cap()->set_max_send_wr(0xffffffffu);
        a.expect("CreateQp with max_send_wr 0xffffffff", c.call(&pb::Broker::Stub::CreateQp, q, &qr),
                 StatusCode::INVALID_ARGUMENT);
        q = qpRequest(own.ctx, own.pd, own.cq);
        q.mutable_cap()->set_max_inline_data(0xffffffffu);
        a.expect("CreateQp with max_inline_data 0xffffffff", c.call(&pb::Broker::Stub::CreateQp, q, &qr),
                 StatusCode::INVALID_ARGUMENT);
        pb::CreateSrqRequest s;
        s.set_context(own.ctx);
        s.set_pd(own.pd);
        s.set_max_wr(0);
        s.set_dma_mode(pb::DMA_MODE_DEFAULT);
        pb::CreateSrqResponse sr;
        a.expect("CreateSrq with max_wr 0", c.call(&pb::Broker::Stub::CreateSrq, s, &sr),
                 StatusCode::INVALID_ARGUMENT);
        s.set_max_wr(0xffffffffu);
        a.expect("CreateSrq with max_wr 0xffffffff", c.call(&pb::Broker::Stub::CreateSrq, s, &sr),
                 StatusCode::INVALID_ARGUMENT);
        pb::OpenContextRequest o;
        o.set_device_name(std::string(65, 'x'));
        pb::OpenContextResponse orr;
        a.expect("OpenContext with a 65-byte device name", c.call(&pb::Broker::Stub::OpenContext, o, &orr),
                 StatusCode::INVALID_ARGUMENT);
        o.set_device_name(std::string(200 * 1024, 'x'));
        a.expect("OpenContext with a 200 KiB message (over the 64 KiB limit)",
                 c.call(&pb::Broker::Stub::OpenContext, o, &orr), StatusCode::RESOURCE_EXHAUSTED);
        o.set_device_name("no-such-device");
        a.expect("OpenContext of a device that does not exist",
                 c.call(&pb::Broker::Stub::OpenContext, o, &orr), StatusCode::NOT_FOUND);

        // Malformed protobuf: raw bytes through a generic stub (the same path with a well-formed
        // request first, so a wrong path cannot pass for a parse failure).
        grpc::GenericStub generic(c.channel());
        auto raw = [&](const std::string &bytes) {
            grpc::Slice slice(bytes.data(), bytes.size());
            grpc::ByteBuffer in(&slice, 1), out;
            grpc::ClientContext ctx;
            ctx.AddMetadata("ibvx-session", c.tokenHex());
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
            std::mutex mu;
            std::condition_variable cv;
            bool done = false;
            grpc::Status result;
            generic.UnaryCall(&ctx, "/ibv_extend.v1.Broker/AllocPd", grpc::StubOptions(), &in, &out,
                              [&](grpc::Status s2) {
                                  std::lock_guard lock(mu);
                                  result = s2;
                                  done = true;
                                  cv.notify_all();
                              });
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return done; });
            return result;
        };
        pb::AllocPdRequest wellformed;
        wellformed.set_context(12345);
        a.expect("well-formed AllocPd through the raw path (control)", raw(wellformed.SerializeAsString()),
                 StatusCode::NOT_FOUND);
        const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x80};
        grpc::Status st = raw(std::string(reinterpret_cast<const char *>(junk), sizeof(junk)));
        a.expectTrue("malformed protobuf (13 junk bytes as AllocPd)",
                     !st.ok() && st.error_code() != StatusCode::UNAVAILABLE,
                     Attacker::codeName(st.error_code()));
    }

    // 7. Garbage on the socket.
    a.expectTrue("garbage preface (HTTP/1.1 request)",
                 a.closedAfter("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 2000), "closed");
    a.expectTrue("truncated HTTP/2 preface then silence", a.closedAfter("PRI * HTTP/2", 3000), "closed");
    a.expectTrue("truncated IBVX preface then silence", a.closedAfter("IBV", 3000), "closed");
    a.expectTrue("IBVX attach with a random token",
                 a.closedAfter(std::string("IBVX\x01\0\0\0", 8) + std::string(16, '\x5a'), 3000), "closed");
    a.expectTrue("silent connection", a.closedAfter("", 3000), "closed");
    {
        std::mt19937 rng(7);
        std::string junk = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        for (int i = 0; i < 4096; ++i) {
            junk += static_cast<char>(rng());
        }
        a.expectTrue("random bytes after the HTTP/2 preface", a.closedAfter(junk, 5000), "closed");
        std::string ibvx = "IBVX";
        for (int i = 0; i < 4096; ++i) {
            ibvx += static_cast<char>(rng());
        }
        a.expectTrue("random bytes after the IBVX magic", a.closedAfter(ibvx, 3000), "closed");
    }
    {
        // More silent connections than the broker keeps in handshake.
        std::vector<UniqueFd> many;
        for (int i = 0; i < 300; ++i) {
            UniqueFd fd = connectUnix(sock);
            if (fd) {
                many.push_back(std::move(fd));
            }
        }
        pb::ListDevicesResponse ld;
        a.expect("300 silent connections at once, then a call on an open session",
                 c.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &ld), StatusCode::OK);
    }

    // 8. fd-channel abuse on sessions of its own.
    {
        // The broker may still be dropping the 300 connections above (at most 32 per uid wait in
        // handshake, more are refused): retry until they are gone.
        TestClient f(sock);
        bool connected = waitFor([&] { return f.hello().ok(); }, std::chrono::seconds(5)) &&
                         waitFor([&] { return f.attach() == 0; }, std::chrono::seconds(5));
        a.expectTrue("(a fresh session for the flood)", connected,
                     connected ? "connected" : "cannot connect");
        if (connected) {
            std::vector<UniqueFd> fds;
            int sent = 0;
            for (int i = 0; i < 200; ++i) {
                UniqueFd m = memfdOf(4096);
                if (f.sendFd(1000 + static_cast<uint64_t>(i), m.get()) < 0) {
                    break;
                }
                ++sent;
            }
            pb::ListDevicesResponse ld;
            bool ended = waitFor(
                [&] {
                    return f.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &ld)
                               .error_code() == StatusCode::UNAVAILABLE;
                },
                std::chrono::milliseconds(3000));
            a.expectTrue("SCM_RIGHTS flood (" + std::to_string(sent) + " memfds, no RegMr)", ended,
                         ended ? "session ended" : "session alive");
        }
        TestClient g(sock);
        if (g.connect()) {
            RegionPayload p{};
            sendFrame(g.channelFd(), FrameType::kRegionAdd, 1, &p, sizeof(p), -1, 1000);
            pb::ListDevicesResponse ld;
            bool ended = waitFor(
                [&] {
                    return g.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &ld)
                               .error_code() == StatusCode::UNAVAILABLE;
                },
                std::chrono::milliseconds(3000));
            a.expectTrue("fd-channel frame of a type clients may not send", ended,
                         ended ? "session ended" : "session alive");
        }
        TestClient h(sock);
        if (h.connect()) {
            // A header announcing a payload larger than the protocol allows.
            uint8_t junk[64];
            std::memset(junk, 0xff, sizeof(junk));
            (void)!::send(h.channelFd(), junk, sizeof(junk), MSG_NOSIGNAL);
            pb::ListDevicesResponse ld;
            bool ended = waitFor(
                [&] {
                    return h.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &ld)
                               .error_code() == StatusCode::UNAVAILABLE;
                },
                std::chrono::milliseconds(3000));
            a.expectTrue("malformed fd-channel frame (0xff bytes)", ended,
                         ended ? "session ended" : "session alive");
        }
    }

    // 9. Closing mid-call: a RegMr waiting for an fd that never comes, abandoned by the client.
    {
        TestClient m(sock);
        if (m.connect()) {
            Own mo;
            openOwn(m, &mo, false);
            pb::RegMrRequest req;
            req.set_pd(mo.pd);
            req.set_xfer_id(999);
            req.set_length(4096);
            pb::RegMrResponse resp;
            grpc::ClientContext ctx;
            ctx.AddMetadata("ibvx-session", m.tokenHex());
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
            a.expect("RegMr abandoned mid-call (client deadline 100 ms)", m.stub().RegMr(&ctx, req, &resp),
                     StatusCode::DEADLINE_EXCEEDED);
            // And a session closed (fd channel) while its RegMr waits.
            std::thread closer([&] {
                std::this_thread::sleep_for(std::chrono::milliseconds(100));
                m.closeChannel();
            });
            grpc::Status st = regMr(m, mo.pd, 998, 0, 4096);
            closer.join();
            a.expectTrue("fd channel closed while a RegMr waits", !st.ok(),
                         Attacker::codeName(st.error_code()));
        }
    }

    // 10. Quotas of this uid (cqs = 4, sessions = 12 in the broker's config).
    {
        int made = 1;  // own.cq
        grpc::Status st;
        for (int i = 0; i < 10 && st.ok(); ++i) {
            pb::CreateCqResponse cq;
            st = createCq(c, own.ctx, 16, &cq);
            made += st.ok() ? 1 : 0;
            c.drainRegions();
        }
        a.expect("CreateCq past the uid's quota (cqs = 4) after " + std::to_string(made) + " CQs", st,
                 StatusCode::RESOURCE_EXHAUSTED);
        a.expectTrue("the quota error names the quota", st.error_message().find("'cqs'") != std::string::npos,
                     st.error_message().substr(0, 60));
        std::vector<std::unique_ptr<TestClient>> flood;
        grpc::Status hs;
        for (int i = 0; i < 20 && hs.ok(); ++i) {
            flood.push_back(std::make_unique<TestClient>(sock));
            hs = flood.back()->hello();
        }
        a.expect("Hello flood past the uid's quota (sessions = 12)", hs, StatusCode::RESOURCE_EXHAUSTED);
    }

    // The attacker's own objects still work after all that.
    pb::QueryQpRequest qq;
    qq.set_qp(own.qp);
    qq.set_attr_mask(IBV_QP_STATE);
    pb::QueryQpResponse qqr;
    a.expect("its own QP still answers (control)", c.call(&pb::Broker::Stub::QueryQp, qq, &qqr),
             StatusCode::OK);
    std::printf("ATTACKS DONE: %d unexpected outcome(s)\n", a.failures());
    std::fflush(stdout);
    return a.failures() > 99 ? 99 : a.failures();
}

// ---- quota racers: N threads in one process of uid nobody -----------------------------------

int runRacer() {
    if (!dropToNobody()) {
        return 100;
    }
    constexpr int kThreads = 4, kTries = 6;
    TestClient c(env("IBVX_SOCKET"));
    if (!c.connect()) {
        report("-1");
        return 101;
    }
    pb::OpenContextRequest oreq;
    oreq.set_device_name("softnda0");
    pb::OpenContextResponse oresp;
    if (!c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok()) {
        report("-1");
        return 102;
    }
    // Everyone starts together: the parent closes the start pipe.
    hold();
    std::atomic<int> ok{0}, exhausted{0}, other{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&] {
            for (int k = 0; k < kTries; ++k) {
                pb::AllocPdRequest req;
                req.set_context(oresp.context());
                pb::AllocPdResponse resp;
                grpc::Status st = c.call(&pb::Broker::Stub::AllocPd, req, &resp);
                if (st.ok()) {
                    ++ok;
                } else if (st.error_code() == StatusCode::RESOURCE_EXHAUSTED) {
                    ++exhausted;
                } else {
                    ++other;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    report(std::to_string(ok.load()) + " " + std::to_string(exhausted.load()) + " " +
           std::to_string(other.load()));
    // Keep the PDs (and the session) until the parent has every count.
    int fd = std::atoi(env("IBVX_HOLD2_FD").c_str());
    char ch;
    while (::read(fd, &ch, 1) > 0) {
    }
    return 0;
}

// ---- a client in its own pid and mount namespaces --------------------------------------------

int runContained() {
    if (!env("IBVX_DROP").empty() && !dropToNobody()) {
        return 100;
    }
    TestClient c(env("IBVX_SOCKET"));
    pb::HelloResponse hello;
    grpc::Status hs = c.hello(&hello);
    if (!hs.ok()) {
        report("ERR " + std::to_string(static_cast<int>(hs.error_code())) + " " + hs.error_message());
        return 1;
    }
    if (c.attach() != 0) {
        std::printf("contained client: attach failed\n");
        return 1;
    }
    Own o;
    if (!openOwn(c, &o, true)) {
        std::printf("contained client: objects failed\n");
        return 2;
    }
    int regions = static_cast<int>(c.mappedRegions());
    // The broker's view of us vs ours.
    std::printf("CONTAINED own pid %d; broker says pid %d uid %u cgroup '%s'; %d regions mapped\n", getpid(),
                hello.identity().pid(), hello.identity().uid(), hello.identity().cgroup().c_str(), regions);
    std::fflush(stdout);
    report(std::to_string(getpid()) + " " + std::to_string(hello.identity().pid()) + " " +
           std::to_string(regions) + " " + hello.identity().cgroup());
    // Stay alive until the parent looked at /proc/<pid>.
    hold();
    return 0;
}

// ---- a tenant whose class allows no device --------------------------------------------------

int runPolicyProbe() {
    if (!dropToNobody()) {
        return 100;
    }
    TestClient c(env("IBVX_SOCKET"));
    if (!c.connect()) {
        report("-1");
        return 1;
    }
    pb::ListDevicesResponse devs;
    grpc::Status ls = c.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &devs);
    pb::OpenContextRequest oreq;
    oreq.set_device_name("softnda0");
    pb::OpenContextResponse oresp;
    grpc::Status os = c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp);
    report(std::to_string(ls.ok() ? devs.devices_size() : -1) + " " +
           std::to_string(static_cast<int>(os.error_code())) + " " + os.error_message());
    return 0;
}

TEST(HostileHelper, Run) {
    std::string mode = env("IBVX_HOSTILE_MODE");
    if (mode.empty()) {
        GTEST_SKIP() << "only runs as a helper process";
    }
    int rc = mode == "attack"      ? runAttacker()
             : mode == "race"      ? runRacer()
             : mode == "contained" ? runContained()
             : mode == "probe"     ? runPolicyProbe()
                                   : 120;
    std::fflush(stdout);
    _exit(rc);
}

// ---- the tests -----------------------------------------------------------------------------

class HostileTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) {
            GTEST_SKIP() << "needs root to run a second uid (fork + setuid)";
        }
        BrokerOptions o;
        o.config = kConfig;
        const char *asan = std::getenv("ASAN_OPTIONS");
        o.env = {std::string("ASAN_OPTIONS=") + (asan != nullptr ? asan : "") + ":quarantine_size_mb=0"};
        broker_ = std::make_unique<BrokerProcess>(o);
        ASSERT_TRUE(broker_->started()) << broker_->log();
        // The socket's directory is private to root (mkdtemp): open it for the second uid.
        ASSERT_EQ(::chmod(broker_->dir().c_str(), 0755), 0);
    }
    std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(HostileTest, SecondUidAttacksEveryWayAndTheVictimKeepsWorking) {
    TestClient victim(broker_->socket());
    ASSERT_TRUE(victim.connect());
    Own v;
    ASSERT_TRUE(openOwn(victim, &v, true));
    UniqueFd mem = memfdOf(65536);
    ASSERT_EQ(victim.sendFd(1, mem.get()), 0);
    pb::RegMrResponse mr;
    ASSERT_TRUE(regMr(victim, v.pd, 1, 0, 65536, &mr).ok());
    // A pending fd of the victim's that the attacker will try to claim.
    UniqueFd pending = memfdOf(4096);
    ASSERT_EQ(victim.sendFd(77, pending.get()), 0);

    // Victim traffic for the whole attack: queries and create/destroy cycles on its own objects.
    std::atomic<bool> stop{false};
    std::atomic<int> v_ok{0}, v_fail{0};
    std::string v_first_error;
    std::thread traffic([&] {
        while (!stop) {
            pb::QueryQpRequest q;
            q.set_qp(v.qp);
            q.set_attr_mask(IBV_QP_STATE);
            pb::QueryQpResponse qr;
            grpc::Status st = victim.call(&pb::Broker::Stub::QueryQp, q, &qr);
            pb::AllocPdRequest a;
            a.set_context(v.ctx);
            pb::AllocPdResponse ar;
            grpc::Status st2 = victim.call(&pb::Broker::Stub::AllocPd, a, &ar);
            grpc::Status st3;
            if (st2.ok()) {
                pb::DeallocPdRequest d;
                d.set_pd(ar.pd());
                pb::DeallocPdResponse dr;
                st3 = victim.call(&pb::Broker::Stub::DeallocPd, d, &dr);
            }
            if (st.ok() && st2.ok() && st3.ok()) {
                ++v_ok;
            } else {
                if (v_fail++ == 0) {
                    v_first_error = (st.ok() ? (st2.ok() ? st3 : st2) : st).error_message();
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
    });
    // Warm up, then the baseline.
    ASSERT_TRUE(waitFor([&] { return v_ok.load() > 20; }, std::chrono::seconds(10)));
    const std::vector<std::string> fd_targets0 = broker_->fdTargets();
    const int fds0 = static_cast<int>(fd_targets0.size());
    long rss0 = broker_->rssKiB();

    pid_t attacker =
        spawn("attack", {"IBVX_SOCKET=" + broker_->socket(), "IBVX_VICTIM_TOKEN=" + victim.tokenHex(),
                         "IBVX_VICTIM_CTX=" + std::to_string(v.ctx), "IBVX_VICTIM_PD=" + std::to_string(v.pd),
                         "IBVX_VICTIM_CQ=" + std::to_string(v.cq), "IBVX_VICTIM_QP=" + std::to_string(v.qp),
                         "IBVX_VICTIM_MR=" + std::to_string(mr.mr()), "IBVX_VICTIM_XFER=77"});
    ASSERT_GT(attacker, 0);
    int rc = waitExit(attacker);
    int ok_during = v_ok.load();
    stop = true;
    traffic.join();
    EXPECT_EQ(rc, 0) << "unexpected attack outcomes (see ATTACK lines)\n" << broker_->log().substr(0, 0);
    EXPECT_EQ(v_fail.load(), 0) << v_first_error;
    EXPECT_GT(ok_during, 20);

    // Every attacker session is gone and its fds with it.
    EXPECT_TRUE(waitFor([&] { return broker_->fdCount() <= fds0; }, std::chrono::seconds(10)));
    int fds1 = broker_->fdCount();
    long rss1 = broker_->rssKiB();

    // The victim's objects are intact and its pending fd is still its own.
    pb::QueryQpRequest q;
    q.set_qp(v.qp);
    q.set_attr_mask(IBV_QP_STATE);
    pb::QueryQpResponse qr;
    EXPECT_TRUE(victim.call(&pb::Broker::Stub::QueryQp, q, &qr).ok());
    EXPECT_TRUE(regMr(victim, v.pd, 77, 0, 4096).ok());
    std::printf(
        "hostile suite: broker fds %d -> %d, RSS %ld -> %ld KiB (victim: %d clean cycles during it)\n", fds0,
        fds1, rss0, rss1, ok_during);
    // A leak only adds fds. The baseline can hold one the broker was about to close, so ending
    // with fewer is not a failure (CI once saw 27 -> 26). Either way, say which fds differ.
    const std::vector<std::string> fd_targets1 = broker_->fdTargets();
    std::vector<std::string> gone, added;
    std::set_difference(fd_targets0.begin(), fd_targets0.end(), fd_targets1.begin(), fd_targets1.end(),
                        std::back_inserter(gone));
    std::set_difference(fd_targets1.begin(), fd_targets1.end(), fd_targets0.begin(), fd_targets0.end(),
                        std::back_inserter(added));
    if (!gone.empty() || !added.empty()) {
        std::printf("broker fds gone since the baseline: %s; new: %s\n", testing::PrintToString(gone).c_str(),
                    testing::PrintToString(added).c_str());
    }
    EXPECT_LE(fds1, fds0) << "new fds: " << testing::PrintToString(added);
    EXPECT_LT(rss1 - rss0, 8192);
}

TEST_F(HostileTest, ProcessesOfOneUidRacingPastAQuotaNeverOvershoot) {
    constexpr int kProcs = 3, kLimit = 10;  // pds = 10 for uid 65534 in kConfig
    for (int round = 0; round < 2; ++round) {
        // Round 2 proves every counter went back to zero when round 1's sessions ended.
        std::vector<pid_t> pids;
        std::vector<int> reports, starts, holds;
        for (int i = 0; i < kProcs; ++i) {
            int rep = -1, start = -1, h2[2];
            ASSERT_EQ(::pipe2(h2, O_CLOEXEC), 0);
            pid_t pid =
                spawn("race", {"IBVX_SOCKET=" + broker_->socket(), "IBVX_HOLD2_FD=" + std::to_string(h2[0])},
                      &rep, &start, {h2[0]});
            ASSERT_GT(pid, 0);
            ::close(h2[0]);
            pids.push_back(pid);
            reports.push_back(rep);
            starts.push_back(start);
            holds.push_back(h2[1]);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // all connected
        for (int fd : starts) {
            ::close(fd);
        }
        int ok = 0, exhausted = 0, other = 0;
        for (int fd : reports) {
            std::istringstream in(readLine(fd, 30000));
            int o = -1, e = -1, x = -1;
            in >> o >> e >> x;
            ASSERT_GE(o, 0) << "a racer failed to report";
            ok += o;
            exhausted += e;
            other += x;
            ::close(fd);
        }
        for (int fd : holds) {
            ::close(fd);
        }
        for (pid_t pid : pids) {
            EXPECT_EQ(waitExit(pid), 0);
        }
        std::printf(
            "round %d: %d processes x 4 threads x 6 AllocPd: %d granted, %d RESOURCE_EXHAUSTED, %d other\n",
            round + 1, kProcs, ok, exhausted, other);
        EXPECT_EQ(ok, kLimit);
        EXPECT_EQ(exhausted, kProcs * 4 * 6 - kLimit);
        EXPECT_EQ(other, 0);
        // Sessions end on process exit (pidfd): wait until the broker dropped them.
        pb::GetStatsResponse s;
        EXPECT_TRUE(waitFor([&] { return getStats(broker_->socket(), &s).ok() && s.sessions() == 0; },
                            std::chrono::seconds(10)));
    }
}

TEST(HostilePolicy, AUidOutsideThePolicyIsRefusedByRule) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a second uid";
    }
    BrokerOptions o;
    o.config =
        "[broker]\nsocket_mode = \"0666\"\n"
        "[policy]\nallow_uids = [0]\ndefault_devices = [\"softnda0\"]\n";
    BrokerProcess broker(o);
    ASSERT_TRUE(broker.started()) << broker.log();
    ASSERT_EQ(::chmod(broker.dir().c_str(), 0755), 0);
    // Root is allowed and may open softnda0 only.
    TestClient root(broker.socket());
    ASSERT_TRUE(root.connect());
    Own own;
    EXPECT_TRUE(openOwn(root, &own, false));
    pb::OpenContextRequest oreq;
    oreq.set_device_name("softnda1");
    pb::OpenContextResponse oresp;
    grpc::Status st = root.call(&pb::Broker::Stub::OpenContext, oreq, &oresp);
    EXPECT_TRUE(st.error_code() == StatusCode::PERMISSION_DENIED || st.error_code() == StatusCode::NOT_FOUND)
        << st.error_message();
    if (st.error_code() == StatusCode::PERMISSION_DENIED) {
        EXPECT_NE(st.error_message().find("policy.default_devices"), std::string::npos);
    }
    // nobody is refused at Hello, naming the rule.
    int rep = -1;
    pid_t pid = spawn("contained", {"IBVX_SOCKET=" + broker.socket(), "IBVX_DROP=1"}, &rep);
    ASSERT_GT(pid, 0);
    std::string line = readLine(rep, 30000);
    ::close(rep);
    EXPECT_EQ(waitExit(pid), 1);
    EXPECT_EQ(line.rfind("ERR " + std::to_string(static_cast<int>(StatusCode::PERMISSION_DENIED)) + " ", 0),
              0u)
        << line;
    EXPECT_NE(line.find("policy.allow_uids"), std::string::npos) << line;
    EXPECT_NE(line.find("uid 65534"), std::string::npos) << line;
}

TEST(HostilePolicy, AClassWithoutDevicesSeesAndOpensNone) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a second uid";
    }
    BrokerOptions o;
    o.config =
        "[broker]\nsocket_mode = \"0666\"\n"
        "[policy]\nallow_uids = [0]\ndefault_devices = [\"*\"]\n"
        "[policy.class.guests]\nuids = [65534]\ndevices = []\n";
    BrokerProcess broker(o);
    ASSERT_TRUE(broker.started()) << broker.log();
    ASSERT_EQ(::chmod(broker.dir().c_str(), 0755), 0);
    TestClient root(broker.socket());
    ASSERT_TRUE(root.connect());
    pb::ListDevicesResponse devs;
    ASSERT_TRUE(root.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &devs).ok());
    EXPECT_GE(devs.devices_size(), 1);  // root is in no class: default_devices = ["*"]
    int rep = -1;
    pid_t pid = spawn("probe", {"IBVX_SOCKET=" + broker.socket()}, &rep);
    ASSERT_GT(pid, 0);
    std::string line = readLine(rep, 30000);
    ::close(rep);
    EXPECT_EQ(waitExit(pid), 0);
    // The class admits uid 65534 (Hello works) but lists and opens no device.
    EXPECT_EQ(line.rfind("0 " + std::to_string(static_cast<int>(StatusCode::PERMISSION_DENIED)) + " ", 0), 0u)
        << line;
    EXPECT_NE(line.find("policy.class.guests.devices"), std::string::npos) << line;
}

TEST(HostileContainer, ClientInNewPidAndMountNamespacesSeesOnlyTheSocket) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root for unshare --mount";
    }
    if (::system("unshare --pid --mount --fork true >/dev/null 2>&1") != 0) {
        GTEST_SKIP() << "the kernel refuses unshare --pid --mount here";
    }
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    std::string empty = broker.dir() + "/empty";
    ASSERT_EQ(::mkdir(empty.c_str(), 0755), 0);
    std::string inner = empty + "/broker.sock";
    int rep = -1, holdfd = -1;
    // unshare runs a shell that bind-mounts only the socket into the empty directory, then execs
    // this binary as the client (pid 1 of the new pid namespace).
    std::string script = "mount --make-rprivate / && touch " + inner + " && mount --bind " + broker.socket() +
                         " " + inner + " && exec /proc/" + std::to_string(getpid()) +
                         "/exe --gtest_filter=HostileHelper.Run";
    int rp[2], hp[2];
    ASSERT_EQ(::pipe(rp), 0);
    ASSERT_EQ(::pipe(hp), 0);
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {
        ::close(rp[0]);
        ::close(hp[1]);
        ::setenv("IBVX_HOSTILE_MODE", "contained", 1);
        ::setenv("IBVX_SOCKET", inner.c_str(), 1);
        ::setenv("IBVX_REPORT_FD", std::to_string(rp[1]).c_str(), 1);
        ::setenv("IBVX_HOLD_FD", std::to_string(hp[0]).c_str(), 1);
        ::execlp("unshare", "unshare", "--pid", "--mount", "--fork", "sh", "-c", script.c_str(), nullptr);
        _exit(127);
    }
    ::close(rp[1]);
    ::close(hp[0]);
    rep = rp[0];
    holdfd = hp[1];
    std::istringstream in(readLine(rep, 30000));
    pid_t inner_pid = 0, seen_pid = 0;
    int regions = -1;
    std::string cgroup;
    in >> inner_pid >> seen_pid >> regions >> cgroup;
    ASSERT_GT(seen_pid, 0) << "the contained client did not report\n" << broker.log();
    EXPECT_EQ(inner_pid, 1);         // pid 1 of its own namespace...
    EXPECT_NE(seen_pid, inner_pid);  // ...but the broker reports its real pid
    EXPECT_GT(regions, 0);           // queue memory reached it through the fd channel
    // The real pid is the contained process: its NSpid line ends with its in-namespace pid.
    std::ifstream status("/proc/" + std::to_string(seen_pid) + "/status");
    std::string line, nspid;
    while (std::getline(status, line)) {
        if (line.rfind("NSpid:", 0) == 0) {
            nspid = line;
        }
    }
    std::istringstream ns(nspid.substr(6));
    std::vector<pid_t> pids;
    pid_t x;
    while (ns >> x) {
        pids.push_back(x);
    }
    ASSERT_EQ(pids.size(), 2u) << nspid;
    EXPECT_EQ(pids[0], seen_pid);
    EXPECT_EQ(pids[1], 1);
    // And its cgroup as this (the broker's) namespace sees it.
    std::ifstream cg("/proc/" + std::to_string(seen_pid) + "/cgroup");
    std::string cgline, path;
    while (std::getline(cg, cgline)) {
        if (cgline.rfind("0::", 0) == 0) {
            path = cgline.substr(3);
        }
    }
    EXPECT_EQ(cgroup, path);
    ::close(holdfd);
    ::close(rep);
    EXPECT_EQ(waitExit(pid), 0);
}

}  // namespace
}  // namespace ibvx::test
