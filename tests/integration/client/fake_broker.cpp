// ibvx-fake-broker: a small stand-in for ibv-extendd that speaks the real wire contract (one
// Unix socket, preface demux, gRPC Broker service on injected fds, the fd channel with real
// SCM_RIGHTS) but owns no driver. It lets the client's broker mode be tested on its own:
//  - queue memory is a memfd region per object, sent before the reply and filled with a
//    pattern the client can check at the addresses it resolved;
//  - RegMr maps the fd the client sent and answers lkey = the first 4 bytes at the registered
//    offset, so a test proves the client's memory reached the broker;
//  - errors carry an ErrorDetail errno like the real broker's.
// Usage: ibvx-fake-broker SOCKET_PATH   (runs until SIGTERM/SIGKILL)
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>

#include "common/fd_channel.h"
#include "common/memfd_region.h"
#include "ibv_extend/v1/broker.grpc.pb.h"

namespace pb = ibv_extend::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;

namespace {

constexpr uint32_t kAllOps = (1U << 11) - 1;
constexpr uint64_t kRegionBytes = 8192;

Status error(StatusCode code, int err, const std::string &msg) {
    pb::ErrorDetail d;
    d.set_errno_value(err);
    return Status(code, msg, d.SerializeAsString());
}

uint64_t randomHandle() {
    static std::mt19937_64 rng{std::random_device{}()};
    static std::mutex mu;
    std::lock_guard lock(mu);
    uint64_t h = 0;
    while (h == 0) {
        h = rng();
    }
    return h;
}

struct Qp {
    pb::QpState state = pb::QP_STATE_RESET;
    uint32_t qp_num = 0;
    uint32_t dest_qp_num = 0;
    pb::QpType type = pb::QP_TYPE_UNSPECIFIED;
    pb::QpCap cap;
    bool sq_sig_all = false;
    uint32_t udp_src_port = 0;
    uint64_t region = 0;
};

struct FakeSession {
    std::mutex mu;
    std::condition_variable cv;
    ibvx::UniqueFd fd_channel;                         // guarded by mu (set once)
    std::map<uint64_t, ibvx::UniqueFd> xfers;          // guarded by mu
    std::map<uint64_t, ibvx::MemfdRegion> regions;     // guarded by mu
    std::map<uint64_t, int> contexts, pds, cqs, srqs;  // handle -> unused
    std::map<uint64_t, ibvx::UniqueMapping> mrs;
    std::map<uint64_t, Qp> qps;
    uint32_t next_qpn = 0x100;
};

class FakeBroker final : public pb::Broker::Service {
  public:
    std::shared_ptr<FakeSession> byToken(const ibvx::SessionToken &t) {
        std::lock_guard lock(mu_);
        auto it = sessions_.find(ibvx::tokenToHex(t));
        return it == sessions_.end() ? nullptr : it->second;
    }

    Status Hello(ServerContext *, const pb::HelloRequest *req, pb::HelloResponse *resp) override {
        if (req->client_version().major() != 4) {
            return error(StatusCode::FAILED_PRECONDITION, EPROTONOSUPPORT, "major version");
        }
        ibvx::SessionToken t;
        for (auto &b : t) {
            b = static_cast<uint8_t>(randomHandle());
        }
        {
            std::lock_guard lock(mu_);
            sessions_[ibvx::tokenToHex(t)] = std::make_shared<FakeSession>();
        }
        resp->mutable_broker_version()->set_major(4);
        resp->mutable_broker_version()->set_minor(2);
        resp->set_session_token(std::string(reinterpret_cast<char *>(t.data()), t.size()));
        resp->set_attach_timeout_ms(5000);
        resp->mutable_identity()->set_pid(0);
        return Status::OK;
    }

    Status ListDevices(ServerContext *ctx, const pb::ListDevicesRequest *,
                       pb::ListDevicesResponse *resp) override {
        if (session(ctx) == nullptr) {
            return error(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        fillDevice(resp->add_devices());
        return Status::OK;
    }

    Status OpenContext(ServerContext *ctx, const pb::OpenContextRequest *req,
                       pb::OpenContextResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        // "fake-v1": a V1 driver without query_device, to check EOPNOTSUPP gating.
        bool v1 = req->device_name() == "fake-v1";
        if (req->device_name() != "fake0" && !v1) {
            return error(StatusCode::NOT_FOUND, ENODEV, "no device " + req->device_name());
        }
        uint64_t h = randomHandle();
        std::lock_guard lock(s->mu);
        s->contexts[h] = 0;
        resp->set_context(h);
        fillDevice(resp->mutable_device());
        resp->set_driver_version(v1 ? 1 : 3);
        resp->set_driver_ops_present(v1 ? 0x3f : kAllOps);
        return Status::OK;
    }

    Status CloseContext(ServerContext *ctx, const pb::CloseContextRequest *req,
                        pb::CloseContextResponse *) override {
        return erase(ctx, &FakeSession::contexts, req->context());
    }

    Status QueryDevice(ServerContext *ctx, const pb::QueryDeviceRequest *req,
                       pb::QueryDeviceResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::contexts, req->context())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        resp->set_ext_cap(3);
        resp->set_resv(std::string(128, '\x5a'));
        return Status::OK;
    }

    Status AllocPd(ServerContext *ctx, const pb::AllocPdRequest *req, pb::AllocPdResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::contexts, req->context())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        uint64_t h = randomHandle();
        std::lock_guard lock(s->mu);
        s->pds[h] = 0;
        resp->set_pd(h);
        return Status::OK;
    }

    Status DeallocPd(ServerContext *ctx, const pb::DeallocPdRequest *req, pb::DeallocPdResponse *) override {
        return erase(ctx, &FakeSession::pds, req->pd());
    }

    Status RegMr(ServerContext *ctx, const pb::RegMrRequest *req, pb::RegMrResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::pds, req->pd())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no pd");
        }
        std::unique_lock lock(s->mu);
        // The fd travels on the other connection and may still be in flight.
        if (!s->cv.wait_for(lock, std::chrono::seconds(2),
                            [&] { return s->xfers.count(req->xfer_id()) != 0; })) {
            return error(StatusCode::INVALID_ARGUMENT, EBADF, "no fd with that xfer id");
        }
        ibvx::UniqueFd fd = std::move(s->xfers[req->xfer_id()]);
        s->xfers.erase(req->xfer_id());
        struct stat st {};
        if (fstat(fd.get(), &st) < 0 || req->length() == 0 ||
            req->offset() + req->length() > static_cast<uint64_t>(st.st_size)) {
            return error(StatusCode::INVALID_ARGUMENT, EINVAL, "range outside the fd");
        }
        // Only the registered window, from the page holding offset, as the real broker maps it:
        // the fd may be far larger (the client's shared pages sit at their own address in it).
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        const uint64_t delta = req->offset() % page;
        const size_t map_len = static_cast<size_t>(req->length() + delta);
        void *p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                       static_cast<off_t>(req->offset() - delta));
        if (p == MAP_FAILED) {
            return error(StatusCode::INVALID_ARGUMENT, EINVAL, "cannot map");
        }
        uint32_t first;
        memcpy(&first, static_cast<char *>(p) + delta, sizeof(first));
        uint64_t h = randomHandle();
        s->mrs[h] = ibvx::UniqueMapping(p, map_len);
        resp->set_mr(h);
        resp->set_lkey(first);
        resp->set_rkey(static_cast<uint32_t>(req->iova() & 0xffffffffu));
        resp->set_iova(req->iova());
        return Status::OK;
    }

    Status DeregMr(ServerContext *ctx, const pb::DeregMrRequest *req, pb::DeregMrResponse *) override {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no session");
        }
        std::lock_guard lock(s->mu);
        if (s->mrs.erase(req->mr()) == 0) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no mr");
        }
        return Status::OK;
    }

    Status CreateCq(ServerContext *ctx, const pb::CreateCqRequest *req, pb::CreateCqResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::contexts, req->context())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        if (req->dma_mode() == pb::DMA_MODE_UNSPECIFIED || req->cqe() == 0) {
            return error(StatusCode::INVALID_ARGUMENT, EINVAL, "bad cq attributes");
        }
        uint64_t region = 0;
        Status st = newRegion(s, 'C', &region);
        if (!st.ok()) {
            return st;
        }
        uint64_t h = randomHandle();
        {
            std::lock_guard lock(s->mu);
            s->cqs[h] = static_cast<int>(region);
        }
        resp->set_cq(h);
        resp->set_cqe(req->cqe());
        fillQueue(region, 0, resp->mutable_cq_info());
        resp->set_resv(std::string(256, '\x11'));
        return Status::OK;
    }

    Status DestroyCq(ServerContext *ctx, const pb::DestroyCqRequest *req,
                     pb::DestroyCqResponse *resp) override {
        return destroyQueue(ctx, &FakeSession::cqs, req->cq(), resp->mutable_released_regions());
    }

    Status CreateSrq(ServerContext *ctx, const pb::CreateSrqRequest *req,
                     pb::CreateSrqResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::pds, req->pd())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no pd");
        }
        uint64_t region = 0;
        Status st = newRegion(s, 'S', &region);
        if (!st.ok()) {
            return st;
        }
        uint64_t h = randomHandle();
        {
            std::lock_guard lock(s->mu);
            s->srqs[h] = static_cast<int>(region);
        }
        resp->set_srq(h);
        resp->set_max_wr(req->max_wr());
        resp->set_max_sge(req->max_sge());
        fillQueue(region, 0, resp->mutable_srq_info());
        return Status::OK;
    }

    Status DestroySrq(ServerContext *ctx, const pb::DestroySrqRequest *req,
                      pb::DestroySrqResponse *resp) override {
        return destroyQueue(ctx, &FakeSession::srqs, req->srq(), resp->mutable_released_regions());
    }

    Status CreateQp(ServerContext *ctx, const pb::CreateQpRequest *req, pb::CreateQpResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr || !has(s, &FakeSession::pds, req->pd()) ||
            !has(s, &FakeSession::cqs, req->send_cq()) || !has(s, &FakeSession::cqs, req->recv_cq())) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no pd/cq");
        }
        if (req->qp_type() == pb::QP_TYPE_UNSPECIFIED) {
            return error(StatusCode::INVALID_ARGUMENT, EINVAL, "qp type");
        }
        uint64_t region = 0;
        Status st = newRegion(s, 'Q', &region);
        if (!st.ok()) {
            return st;
        }
        uint64_t h = randomHandle();
        Qp qp;
        {
            std::lock_guard lock(s->mu);
            qp.qp_num = s->next_qpn++;
            qp.type = req->qp_type();
            qp.cap = req->cap();
            qp.sq_sig_all = req->sq_sig_all();
            qp.region = region;
            s->qps[h] = qp;
        }
        resp->set_qp(h);
        resp->set_qp_num(qp.qp_num);
        resp->set_state(pb::QP_STATE_RESET);
        *resp->mutable_cap() = req->cap();
        // SQ and RQ share one region: the client must resolve the second ref without a frame.
        fillQueue(region, 0, resp->mutable_sq_info());
        fillQueue(region, 4096, resp->mutable_rq_info());
        resp->set_resv(std::string(248, '\x22'));
        resp->set_vendor_priv_info(0x42);
        return Status::OK;
    }

    Status DestroyQp(ServerContext *ctx, const pb::DestroyQpRequest *req,
                     pb::DestroyQpResponse *resp) override {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no qp");
        }
        std::lock_guard lock(s->mu);
        auto it = s->qps.find(req->qp());
        if (it == s->qps.end()) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no qp");
        }
        resp->add_released_regions(it->second.region);
        s->regions.erase(it->second.region);
        s->qps.erase(it);
        return Status::OK;
    }

    Status ModifyQp(ServerContext *ctx, const pb::ModifyQpRequest *req, pb::ModifyQpResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &qp) {
            if ((req->attr_mask() & 1U) != 0) {  // IBV_QP_STATE
                if (req->attr().qp_state() == pb::QP_STATE_UNSPECIFIED) {
                    return error(StatusCode::INVALID_ARGUMENT, EINVAL, "state");
                }
                qp.state = req->attr().qp_state();
            }
            if ((req->attr_mask() & (1U << 20)) != 0) {  // IBV_QP_DEST_QPN
                qp.dest_qp_num = req->attr().dest_qp_num();
            }
            resp->set_state(qp.state);
            return Status::OK;
        });
    }

    Status QueryQp(ServerContext *ctx, const pb::QueryQpRequest *req, pb::QueryQpResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &qp) {
            resp->mutable_attr()->set_qp_state(qp.state);
            resp->mutable_attr()->set_dest_qp_num(qp.dest_qp_num);
            *resp->mutable_init_cap() = qp.cap;
            resp->set_qp_type(qp.type);
            resp->set_sq_sig_all(qp.sq_sig_all);
            return Status::OK;
        });
    }

    Status ModifyQpExtend(ServerContext *ctx, const pb::ModifyQpExtendRequest *req,
                          pb::ModifyQpExtendResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &qp) {
            qp.udp_src_port = req->attr().udp_src_port();
            resp->set_vendor_priv_info(qp.udp_src_port & 0xff);
            return Status::OK;
        });
    }

    Status QueryQpExtend(ServerContext *ctx, const pb::QueryQpExtendRequest *req,
                         pb::QueryQpExtendResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &qp) {
            resp->mutable_attr()->set_udp_src_port(qp.udp_src_port);
            return Status::OK;
        });
    }

    Status QueryQpSupportedHyroceFeature(ServerContext *ctx,
                                         const pb::QueryQpSupportedHyroceFeatureRequest *req,
                                         pb::QueryQpSupportedHyroceFeatureResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &) {
            resp->mutable_feature()->set_type(2);
            resp->mutable_feature()->set_version(req->sl());
            return Status::OK;
        });
    }

    Status NegoQpHyroceFeature(ServerContext *ctx, const pb::NegoQpHyroceFeatureRequest *req,
                               pb::NegoQpHyroceFeatureResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &) {
            *resp->mutable_output() = req->input();
            resp->mutable_output()->set_version(req->input().version() > 0 ? req->input().version() - 1 : 0);
            resp->set_need_more_nego(req->input().version() > 1 ? 1 : 0);
            return Status::OK;
        });
    }

  private:
    static void fillDevice(pb::DeviceInfo *d) {
        d->set_name("fake0");
        d->set_provider("fake");
        d->set_ext_cap(3);
        d->set_driver_version(3);
        d->set_phys_port_cnt(1);
        d->set_max_qp(64);
        d->set_max_cq(64);
        d->set_max_qp_wr(1024);
        d->set_max_mr_size(1 << 20);
        d->set_virtual_device(true);
    }

    // A region: ring at [base, base+4096), doorbell record after it at +4096 / +4160, and a
    // "doorbell page" at +4608. The ring starts with the letter and the region id.
    static void fillQueue(uint64_t region, uint64_t base, pb::QueueInfo *q) {
        auto ref = [region](pb::RegionRef *r, uint64_t off, uint64_t len) {
            r->set_region(region);
            r->set_offset(off);
            r->set_length(len);
        };
        ref(q->mutable_base(), base, 2048);
        q->set_entry_cnt(64);
        q->set_entry_size(32);
        ref(q->mutable_dbr_pi(), 6144 + base / 32, 4);
        ref(q->mutable_dbr_ci(), 6144 + base / 32 + 64, 4);
        if (base == 0) {
            ref(q->mutable_db_hw(), 7680, 8);
        }
        q->set_qbuf_resv(std::string(32, '\x33'));
        q->set_info_resv(std::string(32, '\x44'));
    }

    std::shared_ptr<FakeSession> session(ServerContext *ctx) {
        auto it = ctx->client_metadata().find("ibvx-session");
        if (it == ctx->client_metadata().end()) {
            return nullptr;
        }
        std::lock_guard lock(mu_);
        auto s = sessions_.find(std::string(it->second.data(), it->second.size()));
        return s == sessions_.end() ? nullptr : s->second;
    }

    static bool has(const std::shared_ptr<FakeSession> &s, std::map<uint64_t, int> FakeSession::*m,
                    uint64_t h) {
        std::lock_guard lock(s->mu);
        return ((*s).*m).count(h) != 0;
    }

    Status erase(ServerContext *ctx, std::map<uint64_t, int> FakeSession::*m, uint64_t h) {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no session");
        }
        std::lock_guard lock(s->mu);
        if (((*s).*m).erase(h) == 0) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no such object");
        }
        return Status::OK;
    }

    Status destroyQueue(ServerContext *ctx, std::map<uint64_t, int> FakeSession::*m, uint64_t h,
                        google::protobuf::RepeatedField<uint64_t> *released) {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no session");
        }
        std::lock_guard lock(s->mu);
        auto it = ((*s).*m).find(h);
        if (it == ((*s).*m).end()) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no such queue");
        }
        released->Add(static_cast<uint64_t>(it->second));
        s->regions.erase(static_cast<uint64_t>(it->second));
        ((*s).*m).erase(it);
        return Status::OK;
    }

    template <typename Fn>
    Status withQp(ServerContext *ctx, uint64_t h, Fn fn) {
        auto s = session(ctx);
        if (s == nullptr) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no session");
        }
        std::lock_guard lock(s->mu);
        auto it = s->qps.find(h);
        if (it == s->qps.end()) {
            return error(StatusCode::NOT_FOUND, ENOENT, "no qp");
        }
        return fn(it->second);
    }

    // Creates a region, sends it on the fd channel, and returns its id (small, so it fits the
    // int the fake keeps per queue).
    Status newRegion(const std::shared_ptr<FakeSession> &s, char letter, uint64_t *id) {
        auto region = ibvx::MemfdRegion::create("fake-region", kRegionBytes);
        if (!region.isOk()) {
            return error(StatusCode::RESOURCE_EXHAUSTED, ENOMEM, "memfd");
        }
        std::lock_guard lock(s->mu);
        uint64_t rid = next_region_.fetch_add(1);
        auto *bytes = static_cast<char *>(region->data());
        bytes[0] = letter;
        memcpy(bytes + 8, &rid, sizeof(rid));
        bytes[4096] = letter;  // RQ ring of a QP region
        ibvx::RegionPayload p{kRegionBytes, 0, 0};
        int rc = ibvx::sendFrame(s->fd_channel.get(), ibvx::FrameType::kRegionAdd, rid, &p, sizeof(p),
                                 region->fd(), 2000);
        if (rc < 0) {
            return error(StatusCode::UNAVAILABLE, -rc, "fd channel");
        }
        s->regions[rid] = std::move(region.value());
        *id = rid;
        return Status::OK;
    }

    std::mutex mu_;
    std::map<std::string, std::shared_ptr<FakeSession>> sessions_;  // guarded by mu_
    std::atomic<uint64_t> next_region_{1};
};

// Reads the attach request, then the client's kFdTransfer frames until EOF.
void serveFdChannel(FakeBroker *broker, int fd) {
    ibvx::UniqueFd sock(fd);
    ibvx::AttachRequest req{};
    size_t got = 0;
    while (got < sizeof(req)) {
        pollfd pfd{fd, POLLIN, 0};
        if (poll(&pfd, 1, 5000) <= 0) {
            return;
        }
        ssize_t n = recv(fd, reinterpret_cast<char *>(&req) + got, sizeof(req) - got, 0);
        if (n <= 0) {
            if (n < 0 && errno == EAGAIN) {
                continue;
            }
            return;
        }
        got += static_cast<size_t>(n);
    }
    ibvx::SessionToken t;
    memcpy(t.data(), req.token, t.size());
    auto s = broker->byToken(t);
    ibvx::AttachReply rep{{'I', 'B', 'V', 'X'}, s != nullptr ? 0 : ENOENT};
    if (s == nullptr) {
        (void)send(fd, &rep, sizeof(rep), MSG_NOSIGNAL);
        return;
    }
    int reader = dup(fd);
    // The channel belongs to the session before the client hears it is attached, as in the real
    // broker: its next call may need a region sent on it at once.
    {
        std::lock_guard lock(s->mu);
        s->fd_channel = std::move(sock);
    }
    if (reader < 0 || send(fd, &rep, sizeof(rep), MSG_NOSIGNAL) != sizeof(rep)) {
        if (reader >= 0) {
            close(reader);
        }
        return;
    }
    for (;;) {
        ibvx::Frame f;
        int r = ibvx::recvFrame(reader, &f, -1);
        if (r <= 0) {
            break;
        }
        if (f.type == ibvx::FrameType::kFdTransfer && f.fd.valid()) {
            std::lock_guard lock(s->mu);
            s->xfers[f.id] = std::move(f.fd);
            s->cv.notify_all();
        }
    }
    close(reader);
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    FakeBroker broker;
    grpc::ServerBuilder builder;
    builder.RegisterService(&broker);
    builder.SetMaxReceiveMessageSize(64 * 1024);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();

    int lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
    unlink(argv[1]);
    if (bind(lsock, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0 || listen(lsock, 64) < 0) {
        perror("bind/listen");
        return 1;
    }
    for (;;) {
        int fd = accept4(lsock, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        // Peek the preface on a thread: a slow client must not block the accept loop.
        std::thread([&broker, &server, fd] {
            char magic[4];
            for (int tries = 0; tries < 500; ++tries) {
                ssize_t n = recv(fd, magic, sizeof(magic), MSG_PEEK);
                if (n == sizeof(magic)) {
                    if (memcmp(magic, ibvx::kPrefaceMagic, 4) == 0) {
                        serveFdChannel(&broker, fd);
                    } else {
                        grpc::AddInsecureChannelFromFd(server.get(), fd);
                    }
                    return;
                }
                if (n == 0 || (n < 0 && errno != EAGAIN)) {
                    break;
                }
                usleep(2000);
            }
            close(fd);
        }).detach();
    }
}
