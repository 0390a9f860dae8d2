// ibvx-fake-broker: a small stand-in for ibv-extendd that speaks the real wire contract (one
// Unix socket, preface demux, gRPC Broker service on injected fds, the fd channel with real
// SCM_RIGHTS: stand_in_broker.h) but owns no driver. It lets the client's broker mode be tested
// on its own:
//  - queue memory is a memfd region per object, sent before the reply and filled with a
//    pattern the client can check at the addresses it resolved;
//  - RegMr maps the fd the client sent and answers lkey = the first 4 bytes at the registered
//    offset, so a test proves the client's memory reached the broker;
//  - errors carry an ErrorDetail errno like the real broker's.
// Usage: ibvx-fake-broker SOCKET_PATH   (runs until SIGTERM/SIGKILL)
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/memfd_region.h"
#include "tests/integration/client/stand_in_broker.h"

namespace pb = ibv_extend::v1;
using grpc::ServerContext;
using grpc::Status;
using grpc::StatusCode;
using ibvx::test::randomHandle;
using ibvx::test::wireError;

namespace {

constexpr uint64_t kRegionBytes = 8192;

// A CQ or an SRQ: the region its ring is in.
struct Queue {
    uint64_t region = 0;
};

struct Qp {
    pb::QpState state = pb::QP_STATE_RESET;
    uint32_t qp_num = 0;
    uint32_t dest_qp_num = 0;
    pb::QpType type = pb::QP_TYPE_UNSPECIFIED;
    pb::QpCap cap;
    bool sq_sig_all = false;
    uint32_t udp_src_port = 0;
    uint64_t region = 0;  // SQ and RQ
};

struct FakeSession : ibvx::test::StandInSession {
    std::map<uint64_t, ibvx::MemfdRegion> regions;  // guarded by mu
    std::set<uint64_t> contexts, pds;               // guarded by mu
    std::map<uint64_t, Queue> cqs, srqs;            // guarded by mu
    std::map<uint64_t, ibvx::UniqueMapping> mrs;    // guarded by mu
    std::map<uint64_t, Qp> qps;                     // guarded by mu
    std::atomic<uint32_t> next_qpn{0x100};
};

class FakeBroker final : public pb::Broker::Service, public ibvx::test::StandInHooks {
  public:
    std::shared_ptr<ibvx::test::StandInSession> sessionByToken(const ibvx::SessionToken &t) override {
        return sessions_.byToken(t);
    }

    Status Hello(ServerContext *, const pb::HelloRequest *req, pb::HelloResponse *resp) override {
        return sessions_.open(*req, resp);
    }

    Status ListDevices(ServerContext *ctx, const pb::ListDevicesRequest *,
                       pb::ListDevicesResponse *resp) override {
        if (sessions_.of(*ctx) == nullptr) {
            return wireError(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        ibvx::test::describeFakeDevice(resp->add_devices());
        return Status::OK;
    }

    Status OpenContext(ServerContext *ctx, const pb::OpenContextRequest *req,
                       pb::OpenContextResponse *resp) override {
        auto s = sessions_.of(*ctx);
        if (s == nullptr) {
            return wireError(StatusCode::UNAUTHENTICATED, EPERM, "no session");
        }
        // "fake-v1": a V1 driver without query_device, to check EOPNOTSUPP gating.
        bool v1 = req->device_name() == "fake-v1";
        if (req->device_name() != ibvx::test::kFakeDevice && !v1) {
            return wireError(StatusCode::NOT_FOUND, ENODEV, "no device " + req->device_name());
        }
        resp->set_context(keep(*s, &FakeSession::contexts));
        ibvx::test::describeFakeDevice(resp->mutable_device());
        resp->set_driver_version(v1 ? 1 : 3);
        resp->set_driver_ops_present(v1 ? 0x3f : ibvx::test::kAllDriverOps);
        return Status::OK;
    }

    Status CloseContext(ServerContext *ctx, const pb::CloseContextRequest *req,
                        pb::CloseContextResponse *) override {
        return forget(ctx, &FakeSession::contexts, req->context(), "context");
    }

    Status QueryDevice(ServerContext *ctx, const pb::QueryDeviceRequest *req,
                       pb::QueryDeviceResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::contexts, req->context());
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        resp->set_ext_cap(3);
        resp->set_resv(std::string(128, '\x5a'));
        return Status::OK;
    }

    Status AllocPd(ServerContext *ctx, const pb::AllocPdRequest *req, pb::AllocPdResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::contexts, req->context());
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        resp->set_pd(keep(*s, &FakeSession::pds));
        return Status::OK;
    }

    Status DeallocPd(ServerContext *ctx, const pb::DeallocPdRequest *req, pb::DeallocPdResponse *) override {
        return forget(ctx, &FakeSession::pds, req->pd(), "pd");
    }

    Status RegMr(ServerContext *ctx, const pb::RegMrRequest *req, pb::RegMrResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::pds, req->pd());
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no pd");
        }
        if (req->tenant_address() != 0) {
            // The real broker opens the tenant's own shared mapping (daemon/core/tenant_mapping.h);
            // this double maps only fds it is sent, and says so distinctly.
            return wireError(StatusCode::UNIMPLEMENTED, EOPNOTSUPP,
                             "the fake broker registers no mapping in place");
        }
        ibvx::UniqueFd fd;
        {
            std::unique_lock lock(s->mu);
            fd = s->takeXfer(lock, req->xfer_id(), std::chrono::seconds(2));
        }
        if (!fd) {
            return wireError(StatusCode::INVALID_ARGUMENT, EBADF, "no fd with that xfer id");
        }
        struct stat st {};
        if (fstat(fd.get(), &st) < 0 || req->length() == 0 ||
            req->offset() + req->length() > static_cast<uint64_t>(st.st_size)) {
            return wireError(StatusCode::INVALID_ARGUMENT, EINVAL, "range outside the fd");
        }
        // Only the registered window, from the page holding offset, as the real broker maps it:
        // the fd may be far larger (the client's shared pages sit at their own address in it).
        const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        const uint64_t delta = req->offset() % page;
        const size_t map_len = static_cast<size_t>(req->length() + delta);
        void *p = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(),
                       static_cast<off_t>(req->offset() - delta));
        if (p == MAP_FAILED) {
            return wireError(StatusCode::INVALID_ARGUMENT, EINVAL, "cannot map");
        }
        uint32_t first;
        memcpy(&first, static_cast<char *>(p) + delta, sizeof(first));
        resp->set_mr(keep(*s, &FakeSession::mrs, ibvx::UniqueMapping(p, map_len)));
        resp->set_lkey(first);
        resp->set_rkey(static_cast<uint32_t>(req->iova() & 0xffffffffu));
        resp->set_iova(req->iova());
        return Status::OK;
    }

    Status DeregMr(ServerContext *ctx, const pb::DeregMrRequest *req, pb::DeregMrResponse *) override {
        return forget(ctx, &FakeSession::mrs, req->mr(), "mr");
    }

    Status CreateCq(ServerContext *ctx, const pb::CreateCqRequest *req, pb::CreateCqResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::contexts, req->context());
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no context");
        }
        if (req->dma_mode() == pb::DMA_MODE_UNSPECIFIED || req->cqe() == 0) {
            return wireError(StatusCode::INVALID_ARGUMENT, EINVAL, "bad cq attributes");
        }
        uint64_t region = 0;
        if (Status st = newRegion(*s, 'C', &region); !st.ok()) {
            return st;
        }
        resp->set_cq(keep(*s, &FakeSession::cqs, Queue{region}));
        resp->set_cqe(req->cqe());
        fillQueue(region, 0, resp->mutable_cq_info());
        resp->set_resv(std::string(256, '\x11'));
        return Status::OK;
    }

    Status DestroyCq(ServerContext *ctx, const pb::DestroyCqRequest *req,
                     pb::DestroyCqResponse *resp) override {
        return destroyQueue(ctx, &FakeSession::cqs, req->cq(), "cq", resp->mutable_released_regions());
    }

    Status CreateSrq(ServerContext *ctx, const pb::CreateSrqRequest *req,
                     pb::CreateSrqResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::pds, req->pd());
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no pd");
        }
        uint64_t region = 0;
        if (Status st = newRegion(*s, 'S', &region); !st.ok()) {
            return st;
        }
        resp->set_srq(keep(*s, &FakeSession::srqs, Queue{region}));
        resp->set_max_wr(req->max_wr());
        resp->set_max_sge(req->max_sge());
        fillQueue(region, 0, resp->mutable_srq_info());
        return Status::OK;
    }

    Status DestroySrq(ServerContext *ctx, const pb::DestroySrqRequest *req,
                      pb::DestroySrqResponse *resp) override {
        return destroyQueue(ctx, &FakeSession::srqs, req->srq(), "srq", resp->mutable_released_regions());
    }

    Status CreateQp(ServerContext *ctx, const pb::CreateQpRequest *req, pb::CreateQpResponse *resp) override {
        auto s = sessionHolding(ctx, &FakeSession::pds, req->pd());
        if (s == nullptr || !has(*s, &FakeSession::cqs, req->send_cq()) ||
            !has(*s, &FakeSession::cqs, req->recv_cq())) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no pd/cq");
        }
        if (req->qp_type() == pb::QP_TYPE_UNSPECIFIED) {
            return wireError(StatusCode::INVALID_ARGUMENT, EINVAL, "qp type");
        }
        Qp qp;
        if (Status st = newRegion(*s, 'Q', &qp.region); !st.ok()) {
            return st;
        }
        qp.qp_num = s->next_qpn++;
        qp.type = req->qp_type();
        qp.cap = req->cap();
        qp.sq_sig_all = req->sq_sig_all();
        resp->set_qp(keep(*s, &FakeSession::qps, qp));
        resp->set_qp_num(qp.qp_num);
        resp->set_state(pb::QP_STATE_RESET);
        *resp->mutable_cap() = req->cap();
        // SQ and RQ share one region: the client must resolve the second ref without a frame.
        fillQueue(qp.region, 0, resp->mutable_sq_info());
        fillQueue(qp.region, 4096, resp->mutable_rq_info());
        resp->set_resv(std::string(248, '\x22'));
        resp->set_vendor_priv_info(0x42);
        return Status::OK;
    }

    Status DestroyQp(ServerContext *ctx, const pb::DestroyQpRequest *req,
                     pb::DestroyQpResponse *resp) override {
        return destroyQueue(ctx, &FakeSession::qps, req->qp(), "qp", resp->mutable_released_regions());
    }

    Status ModifyQp(ServerContext *ctx, const pb::ModifyQpRequest *req, pb::ModifyQpResponse *resp) override {
        return withQp(ctx, req->qp(), [&](Qp &qp) {
            if ((req->attr_mask() & 1U) != 0) {  // IBV_QP_STATE
                if (req->attr().qp_state() == pb::QP_STATE_UNSPECIFIED) {
                    return wireError(StatusCode::INVALID_ARGUMENT, EINVAL, "state");
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

    template <typename Objects>
    static bool has(FakeSession &s, Objects FakeSession::*objects, uint64_t h) {
        std::lock_guard lock(s.mu);
        return (s.*objects).count(h) != 0;
    }

    // The call's session if it holds object h (what the call creates or asks about hangs off h).
    template <typename Objects>
    std::shared_ptr<FakeSession> sessionHolding(ServerContext *ctx, Objects FakeSession::*objects,
                                                uint64_t h) {
        auto s = sessions_.of(*ctx);
        return s != nullptr && has(*s, objects, h) ? s : nullptr;
    }

    // Keeps a new object in the session under a new handle, and returns the handle.
    static uint64_t keep(FakeSession &s, std::set<uint64_t> FakeSession::*handles) {
        uint64_t h = randomHandle();
        std::lock_guard lock(s.mu);
        (s.*handles).insert(h);
        return h;
    }
    template <typename T>
    static uint64_t keep(FakeSession &s, std::map<uint64_t, T> FakeSession::*objects, T object) {
        uint64_t h = randomHandle();
        std::lock_guard lock(s.mu);
        (s.*objects).emplace(h, std::move(object));
        return h;
    }

    // Runs fn(session, position) on the call's session's object h, under the session's mutex;
    // NOT_FOUND (ENOENT) when there is no such session or object.
    template <typename Objects, typename Fn>
    Status withObject(ServerContext *ctx, Objects FakeSession::*objects, uint64_t h, const char *what,
                      Fn fn) {
        auto s = sessions_.of(*ctx);
        if (s == nullptr) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, "no session");
        }
        std::lock_guard lock(s->mu);
        auto it = ((*s).*objects).find(h);
        if (it == ((*s).*objects).end()) {
            return wireError(StatusCode::NOT_FOUND, ENOENT, std::string("no ") + what);
        }
        return fn(*s, it);
    }

    template <typename Objects>
    Status forget(ServerContext *ctx, Objects FakeSession::*objects, uint64_t h, const char *what) {
        return withObject(ctx, objects, h, what, [&](FakeSession &s, auto it) {
            (s.*objects).erase(it);
            return Status::OK;
        });
    }

    // A queue's region goes with it; the reply names it for the client to unmap.
    template <typename Queues>
    Status destroyQueue(ServerContext *ctx, Queues FakeSession::*queues, uint64_t h, const char *what,
                        google::protobuf::RepeatedField<uint64_t> *released) {
        return withObject(ctx, queues, h, what, [&](FakeSession &s, auto it) {
            released->Add(it->second.region);
            s.regions.erase(it->second.region);
            (s.*queues).erase(it);
            return Status::OK;
        });
    }

    template <typename Fn>
    Status withQp(ServerContext *ctx, uint64_t h, Fn fn) {
        return withObject(ctx, &FakeSession::qps, h, "qp",
                          [&](FakeSession &, auto it) { return fn(it->second); });
    }

    // Creates a region and sends it on the fd channel, before the reply that names it.
    Status newRegion(FakeSession &s, char letter, uint64_t *id) {
        auto region = ibvx::MemfdRegion::create("fake-region", kRegionBytes);
        if (!region.isOk()) {
            return wireError(StatusCode::RESOURCE_EXHAUSTED, ENOMEM, "memfd");
        }
        std::lock_guard lock(s.mu);
        uint64_t rid = next_region_.fetch_add(1);
        auto *bytes = static_cast<char *>(region->data());
        bytes[0] = letter;
        memcpy(bytes + 8, &rid, sizeof(rid));
        bytes[4096] = letter;  // RQ ring of a QP region
        ibvx::RegionPayload p{kRegionBytes, 0, 0};
        int rc = ibvx::sendFrame(s.fd_channel.get(), ibvx::FrameType::kRegionAdd, rid, &p, sizeof(p),
                                 region->fd(), 2000);
        if (rc < 0) {
            return wireError(StatusCode::UNAVAILABLE, -rc, "fd channel");
        }
        s.regions[rid] = std::move(region.value());
        *id = rid;
        return Status::OK;
    }

    ibvx::test::SessionTable<FakeSession> sessions_;
    std::atomic<uint64_t> next_region_{1};
};

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SOCKET_PATH\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    FakeBroker broker;
    return ibvx::test::serveStandIn(argv[1], broker, broker);
}
