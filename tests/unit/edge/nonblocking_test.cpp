// The edge never waits on gRPC's callback threads: RegMr, which waits for its fd on the fd
// channel, runs on the Broker service's BlockingExecutor, so while one tenant's RegMr calls
// wait for fds that never come, another tenant's calls are answered. The real BrokerService
// over the real core and softnda, in-process, on a socketpair connection.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "daemon/edge/services.h"
#include "tests/unit/edge/in_process.h"

namespace ibvx::daemon {
namespace {

class Edge : public SessionListener {
  public:
    explicit Edge(BlockingLimits limits) : core_(waitingOptions()) {
        service_ = std::make_unique<BrokerService>(broker(), connections_, stats_, this, limits);
        grpc::ServerBuilder builder;
        builder.RegisterService(service_.get());
        server_ = builder.BuildAndStart();
        stub_ = pb::Broker::NewStub(connectInProcess(*server_, connections_));
    }
    ~Edge() {
        broker().endAllSessions();
        server_->Shutdown();
        server_->Wait();
    }

    // A new session: its token for the metadata.
    std::string hello() {
        grpc::ClientContext ctx;
        pb::HelloRequest req;
        req.mutable_client_version()->set_major(broker().options().version.major);
        pb::HelloResponse resp;
        EXPECT_TRUE(stub_->Hello(&ctx, req, &resp).ok());
        std::lock_guard lock(mu_);
        return sessions_.back()->tokenHex();
    }
    std::shared_ptr<Session> session(const std::string &token) {
        std::lock_guard lock(mu_);
        for (auto &s : sessions_) {
            if (s->tokenHex() == token) {
                return s;
            }
        }
        return nullptr;
    }

    // OpenContext + AllocPd under token: the PD handle (0 on failure).
    uint64_t pdOf(const std::string &token) {
        pb::OpenContextRequest oreq;
        oreq.set_device_name("softnda0");
        pb::OpenContextResponse oresp;
        grpc::ClientContext octx;
        octx.AddMetadata(kSessionMetadataKey, token);
        if (!stub_->OpenContext(&octx, oreq, &oresp).ok()) {
            return 0;
        }
        pb::AllocPdRequest preq;
        preq.set_context(oresp.context());
        pb::AllocPdResponse presp;
        grpc::ClientContext pctx;
        pctx.AddMetadata(kSessionMetadataKey, token);
        return stub_->AllocPd(&pctx, preq, &presp).ok() ? presp.pd() : 0;
    }

    Broker &broker() { return core_.broker(); }
    BrokerService &service() { return *service_; }
    pb::Broker::Stub &stub() { return *stub_; }

    void sessionOpened(const std::shared_ptr<Session> &s) override {
        std::lock_guard lock(mu_);
        sessions_.push_back(s);
    }

  private:
    static Broker::Options waitingOptions() {
        Broker::Options opt;
        opt.xfer_wait = std::chrono::hours(1);  // only the session's end releases a waiting RegMr
        return opt;
    }

    InProcessCore core_;
    ConnectionRegistry connections_;
    RpcStats stats_;
    std::unique_ptr<BrokerService> service_;
    std::unique_ptr<grpc::Server> server_;
    std::unique_ptr<pb::Broker::Stub> stub_;
    std::mutex mu_;
    std::vector<std::shared_ptr<Session>> sessions_;
};

// RegMr calls started asynchronously; their replies counted as they come.
class PendingRegMrs {
  public:
    PendingRegMrs(pb::Broker::Stub &stub, const std::string &token, uint64_t pd, int n) : calls_(n) {
        for (int i = 0; i < n; ++i) {
            Call &c = calls_[i];
            c.ctx.AddMetadata(kSessionMetadataKey, token);
            c.req.set_pd(pd);
            c.req.set_xfer_id(1000 + i);  // never sent on the fd channel
            c.req.set_length(4096);
            stub.async()->RegMr(&c.ctx, &c.req, &c.resp, [this, &c](grpc::Status st) {
                std::lock_guard lock(mu_);
                c.status = std::move(st);
                ++done_;
                cv_.notify_all();
            });
        }
    }
    int done() {
        std::lock_guard lock(mu_);
        return done_;
    }
    // Waits for n replies (the test's timeout bounds it); their codes.
    std::vector<grpc::StatusCode> waitFor(int n) {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return done_ >= n; });
        std::vector<grpc::StatusCode> codes;
        for (const Call &c : calls_) {
            if (c.status) {
                codes.push_back(c.status->error_code());
            }
        }
        return codes;
    }

  private:
    struct Call {
        grpc::ClientContext ctx;
        pb::RegMrRequest req;
        pb::RegMrResponse resp;
        std::optional<grpc::Status> status;
    };
    std::deque<Call> calls_;
    std::mutex mu_;
    std::condition_variable cv_;
    int done_ = 0;
};

TEST(EdgeNonBlocking, WaitingRegMrsDoNotHoldAnotherTenantsCalls) {
    Edge edge({2, 256});
    std::string slow = edge.hello();
    uint64_t slow_pd = edge.pdOf(slow);
    ASSERT_NE(slow_pd, 0u);
    constexpr int kWaiting = 32;  // more than gRPC keeps callback threads for
    PendingRegMrs pending(edge.stub(), slow, slow_pd, kWaiting);

    // Another tenant's calls, start to finish, while every RegMr above is still waiting.
    std::string other = edge.hello();
    EXPECT_NE(edge.pdOf(other), 0u);
    pb::ListDevicesResponse devices;
    grpc::ClientContext ctx;
    ctx.AddMetadata(kSessionMetadataKey, other);
    ASSERT_TRUE(edge.stub().ListDevices(&ctx, pb::ListDevicesRequest{}, &devices).ok());
    EXPECT_GE(devices.devices_size(), 1);
    EXPECT_EQ(pending.done(), 0);

    // Ending the slow session releases its waits: every RegMr is answered, none succeeded.
    edge.broker().endSession(edge.session(slow));
    std::vector<grpc::StatusCode> codes = pending.waitFor(kWaiting);
    ASSERT_EQ(codes.size(), static_cast<size_t>(kWaiting));
    for (grpc::StatusCode c : codes) {
        EXPECT_NE(c, grpc::StatusCode::OK);
    }
}

TEST(EdgeNonBlocking, AFullExecutorAnswersUnavailableAtOnce) {
    Edge edge({1, 1});  // one RegMr waits, at most one queues, the rest are refused
    std::string slow = edge.hello();
    uint64_t pd = edge.pdOf(slow);
    ASSERT_NE(pd, 0u);
    constexpr int kCalls = 5;
    PendingRegMrs pending(edge.stub(), slow, pd, kCalls);
    // Nothing but a refusal can answer before the session ends (the waits are an hour long).
    for (grpc::StatusCode c : pending.waitFor(kCalls - 2)) {
        EXPECT_EQ(c, grpc::StatusCode::UNAVAILABLE);
    }
    edge.broker().endSession(edge.session(slow));
    std::vector<grpc::StatusCode> codes = pending.waitFor(kCalls);
    EXPECT_EQ(codes.size(), static_cast<size_t>(kCalls));
    EXPECT_GE(std::count(codes.begin(), codes.end(), grpc::StatusCode::UNAVAILABLE), kCalls - 2);
}

}  // namespace
}  // namespace ibvx::daemon
