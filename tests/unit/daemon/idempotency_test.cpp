// Idempotency keys on the Broker service: a mutating call retried with its key (as the client
// does after a broker restart) is answered from the stored reply, never applied twice; every
// mutating call that ran reaches the commit point, read-only calls do not. The real
// BrokerService over the real core and softnda, in-process, on a socketpair connection.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "daemon/edge/services.h"
#include "tests/unit/edge/in_process.h"

namespace ibvx::daemon {
namespace {

constexpr char kKey[] = "0123456789abcdef";

class Edge : public SessionListener {
  public:
    Edge() : core_(shortWaits()) {
        broker().setCommitSink([this](Session &) {
            ++commits_;
            return commit_result_;
        });
        service_ = std::make_unique<BrokerService>(broker(), connections_, stats_, this);
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

    std::string hello() {
        grpc::ClientContext ctx;
        pb::HelloRequest req;
        req.mutable_client_version()->set_major(broker().options().version.major);
        pb::HelloResponse resp;
        EXPECT_TRUE(stub_->Hello(&ctx, req, &resp).ok());
        std::lock_guard lock(mu_);
        return sessions_.back()->tokenHex();
    }

    // One call under token, with the idempotency key when key != nullptr.
    // retire != nullptr: the "ibvx-retire-keys" value it carries too.
    template <typename Req, typename Resp>
    grpc::Status call(grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                      const std::string &token, const char *key, const Req &req, Resp *resp,
                      const char *retire = nullptr) {
        grpc::ClientContext ctx;
        ctx.AddMetadata(kSessionMetadataKey, token);
        if (key != nullptr) {
            ctx.AddMetadata(kIdempotencyMetadataKey, key);
        }
        if (retire != nullptr) {
            ctx.AddMetadata(kRetireMetadataKey, retire);
        }
        return (stub_.get()->*method)(&ctx, req, resp);
    }

    uint64_t openContext(const std::string &token) {
        pb::OpenContextRequest req;
        req.set_device_name("softnda0");
        pb::OpenContextResponse resp;
        EXPECT_TRUE(call(&pb::Broker::Stub::OpenContext, token, nullptr, req, &resp).ok());
        return resp.context();
    }

    static pb::AllocPdRequest pdRequest(uint64_t context) {
        pb::AllocPdRequest req;
        req.set_context(context);
        return req;
    }

    static pb::CreateCqRequest cqRequest(uint64_t context) {
        pb::CreateCqRequest req;
        req.set_context(context);
        req.set_cqe(16);
        req.set_dma_mode(pb::DMA_MODE_DEFAULT);
        return req;
    }

    Broker &broker() { return core_.broker(); }
    void endSession(const std::string &token) {
        std::lock_guard lock(mu_);
        for (auto &s : sessions_) {
            if (s->tokenHex() == token) {
                broker().endSession(s);
            }
        }
    }
    uint64_t replies() {
        return broker().quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(Quota::kReplies)];
    }
    int commits() const { return commits_.load(); }
    void failCommits() { commit_result_ = Status(Code::kInternal, EIO, "state file not writable"); }

    void sessionOpened(const std::shared_ptr<Session> &s) override {
        std::lock_guard lock(mu_);
        sessions_.push_back(s);
    }

  private:
    static Broker::Options shortWaits() {
        Broker::Options opt;
        opt.xfer_wait = std::chrono::milliseconds(20);  // RegMr without its fd fails soon
        return opt;
    }

    InProcessCore core_;
    std::atomic<int> commits_{0};
    Status commit_result_;  // set before the calls that read it
    ConnectionRegistry connections_;
    RpcStats stats_;
    std::unique_ptr<BrokerService> service_;
    std::unique_ptr<grpc::Server> server_;
    std::unique_ptr<pb::Broker::Stub> stub_;
    std::mutex mu_;
    std::vector<std::shared_ptr<Session>> sessions_;
};

std::string errnoDetail(const grpc::Status &st) {
    pb::ErrorDetail d;
    EXPECT_TRUE(d.ParseFromString(st.error_details()));
    return std::to_string(d.errno_value());
}

TEST(IdempotencyKey, ParsesSixteenLowerCaseHexDigitsOfANonZeroValue) {
    auto k = parseIdempotencyKey("0123456789abcdef");
    ASSERT_TRUE(k.isOk());
    EXPECT_EQ(*k, 0x0123456789abcdefULL);
    for (const char *bad : {"", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF",
                            "0123456789abcdeg", "0000000000000000", " 123456789abcdef"}) {
        auto r = parseIdempotencyKey(bad);
        EXPECT_FALSE(r.isOk()) << bad;
        EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    }
}

// The one method table (proto/broker_methods.h, generated at build time from protoc's parse of
// broker.proto) against protobuf's own descriptor of the service, compiled into this test: the
// same methods in the same order, each with its request type, and mutating exactly when its rpc
// says IDEMPOTENT (made idempotent by its key); every rpc says one or the other.
TEST(IdempotencyKey, MutatingAreTheCallsBrokerProtoSaysAreIdempotentByTheirKey) {
    const google::protobuf::ServiceDescriptor *service =
        pb::HelloRequest::descriptor()->file()->FindServiceByName("Broker");
    ASSERT_NE(service, nullptr);
    ASSERT_EQ(static_cast<size_t>(service->method_count()), static_cast<size_t>(Method::kCount));
    for (int i = 0; i < service->method_count(); ++i) {
        const google::protobuf::MethodDescriptor *md = service->method(i);
        const auto level = md->options().idempotency_level();
        EXPECT_TRUE(level == google::protobuf::MethodOptions::NO_SIDE_EFFECTS ||
                    level == google::protobuf::MethodOptions::IDEMPOTENT)
            << md->name() << " says neither NO_SIDE_EFFECTS nor IDEMPOTENT";
        const auto m = static_cast<Method>(i);
        EXPECT_EQ(methodName(m), md->name());
        EXPECT_EQ(brokerMethod(m).request, md->input_type()->name()) << md->name();
        EXPECT_EQ(isMutating(m), level == google::protobuf::MethodOptions::IDEMPOTENT) << md->name();
    }
    // What the broker stores and checks keys for, as it always was.
    EXPECT_FALSE(isMutating(Method::kHello));
    EXPECT_FALSE(isMutating(Method::kQueryQp));
    EXPECT_TRUE(isMutating(Method::kCreateQp));
    EXPECT_TRUE(isMutating(Method::kOpenQp));
}

TEST(Idempotency, TheSameCreateCqTwiceIsAnsweredOnceWithTheSameHandle) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    ASSERT_NE(context, 0u);
    const size_t objects = edge.broker().objectCount();
    const int commits = edge.commits();

    pb::CreateCqResponse first;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context), &first).ok());
    EXPECT_EQ(edge.broker().objectCount(), objects + 1);
    EXPECT_EQ(edge.commits(), commits + 1);

    pb::CreateCqResponse again;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context), &again).ok());
    EXPECT_EQ(again.cq(), first.cq());
    EXPECT_EQ(again.SerializeAsString(), first.SerializeAsString());
    EXPECT_EQ(edge.broker().objectCount(), objects + 1);  // one CQ, not two
    EXPECT_EQ(edge.commits(), commits + 1);               // an answered retry changes nothing

    // The handle is the live object: destroying it works once.
    pb::DestroyCqRequest d;
    d.set_cq(first.cq());
    pb::DestroyCqResponse dr;
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::DestroyCq, token, "00000000000000a1", d, &dr).ok());
    EXPECT_EQ(edge.broker().objectCount(), objects);
}

TEST(Idempotency, AKeyReusedByAnotherMethodIsRefused) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    pb::AllocPdRequest pd;
    pd.set_context(context);
    pb::AllocPdResponse pdr;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, kKey, pd, &pdr).ok());
    const size_t objects = edge.broker().objectCount();

    pb::CreateCqResponse cq;
    grpc::Status st = edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context), &cq);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("idempotency key reused"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("/ibv_extend.v1.Broker/AllocPd"), std::string::npos)
        << st.error_message();
    EXPECT_EQ(edge.broker().objectCount(), objects);
}

TEST(Idempotency, ABadKeyIsRefusedBeforeAnythingRuns) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    const size_t objects = edge.broker().objectCount();
    const int commits = edge.commits();
    for (const char *bad : {"", "0000000000000000", "0123456789ABCDEF", "12345", "0123456789abcdef01"}) {
        pb::CreateCqResponse cq;
        grpc::Status st = edge.call(&pb::Broker::Stub::CreateCq, token, bad, Edge::cqRequest(context), &cq);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "'" << bad << "'";
        EXPECT_NE(st.error_message().find("ibvx-idempotency-key"), std::string::npos) << st.error_message();
        EXPECT_EQ(errnoDetail(st), std::to_string(EINVAL));
    }
    EXPECT_EQ(edge.broker().objectCount(), objects);
    EXPECT_EQ(edge.commits(), commits);
}

TEST(Idempotency, WithoutAKeyEveryCallRunsAndCommits) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    const int commits = edge.commits();
    pb::AllocPdRequest pd;
    pd.set_context(context);
    pb::AllocPdResponse a, b;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, nullptr, pd, &a).ok());
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, nullptr, pd, &b).ok());
    EXPECT_NE(a.pd(), b.pd());
    EXPECT_EQ(edge.commits(), commits + 2);
}

TEST(Idempotency, ReadOnlyCallsNeitherCommitNorLookAtTheKey) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    const int commits = edge.commits();
    pb::QueryDeviceRequest q;
    q.set_context(context);
    pb::QueryDeviceResponse qr;
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::QueryDevice, token, "not-a-key", q, &qr).ok());
    pb::ListDevicesResponse lr;
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::ListDevices, token, kKey, pb::ListDevicesRequest{}, &lr).ok());
    EXPECT_EQ(edge.commits(), commits);
}

TEST(Idempotency, AFailedCallIsAnsweredWithItsStoredFailure) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    const int commits = edge.commits();
    pb::CreateCqResponse cq;
    grpc::Status first =
        edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context + 1), &cq);  // no context
    ASSERT_FALSE(first.ok());
    EXPECT_EQ(edge.commits(), commits + 1);  // a failure is a reply too

    grpc::Status again =
        edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context + 1), &cq);
    EXPECT_EQ(again.error_code(), first.error_code());
    EXPECT_EQ(again.error_message(), first.error_message());
    EXPECT_EQ(errnoDetail(again), errnoDetail(first));
    EXPECT_EQ(edge.commits(), commits + 1);
}

TEST(Idempotency, ACallOnTheBlockingExecutorCommitsAndIsAnsweredToo) {
    Edge edge;
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    pb::AllocPdRequest pd;
    pd.set_context(context);
    pb::AllocPdResponse pdr;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, nullptr, pd, &pdr).ok());
    const int commits = edge.commits();
    // RegMr waits for its fd on the executor; none is sent, so it fails after xfer_wait.
    pb::RegMrRequest mr;
    mr.set_pd(pdr.pd());
    mr.set_xfer_id(77);
    mr.set_length(4096);
    pb::RegMrResponse mrr;
    grpc::Status first = edge.call(&pb::Broker::Stub::RegMr, token, kKey, mr, &mrr);
    ASSERT_FALSE(first.ok());
    EXPECT_EQ(edge.commits(), commits + 1);
    grpc::Status again = edge.call(&pb::Broker::Stub::RegMr, token, kKey, mr, &mrr);
    EXPECT_EQ(again.error_code(), first.error_code());
    EXPECT_EQ(again.error_message(), first.error_message());
    EXPECT_EQ(edge.commits(), commits + 1);
}

TEST(Idempotency, KeysBelongToTheirSession) {
    Edge edge;
    std::string a = edge.hello();
    std::string b = edge.hello();
    uint64_t ca = edge.openContext(a);
    uint64_t cb = edge.openContext(b);
    pb::CreateCqResponse ra, rb;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::CreateCq, a, kKey, Edge::cqRequest(ca), &ra).ok());
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::CreateCq, b, kKey, Edge::cqRequest(cb), &rb).ok());
    EXPECT_NE(ra.cq(), rb.cq());
}

TEST(Idempotency, AFailedCommitStillAnswersTheCall) {
    Edge edge;
    edge.failCommits();
    std::string token = edge.hello();
    uint64_t context = edge.openContext(token);
    ASSERT_NE(context, 0u);
    pb::CreateCqResponse cq;
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::CreateCq, token, kKey, Edge::cqRequest(context), &cq).ok());
    EXPECT_NE(cq.cq(), 0u);
}

// The replies the broker keeps for a tenant's retries count in its 'replies' quota (issue 26,
// hole 7): a session over it gives up its own oldest replies; a session with none to give up is
// refused before its call runs; an ended session's replies are given back.
TEST(Idempotency, StoredRepliesAreLimitedPerTenant) {
    Edge edge;
    edge.broker().quotas().setDefault(Quota::kReplies, 3);
    std::string a = edge.hello();
    uint64_t context = edge.openContext(a);
    pb::AllocPdRequest pd;
    pd.set_context(context);
    const char *keys[] = {"00000000000000b1", "00000000000000b2", "00000000000000b3", "00000000000000b4",
                          "00000000000000b5"};
    std::vector<uint64_t> pds;
    for (const char *key : keys) {
        pb::AllocPdResponse r;
        ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, a, key, pd, &r).ok());
        pds.push_back(r.pd());
        EXPECT_LE(edge.replies(), 3u);
    }
    EXPECT_EQ(edge.replies(), 3u);
    pb::AllocPdResponse r;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, a, keys[4], pd, &r).ok());
    EXPECT_EQ(r.pd(), pds[4]);  // the newest replies are kept and answered

    // Another session of the tenant: no room, and none of its own to give up.
    std::string b = edge.hello();
    pb::OpenContextRequest open;
    open.set_device_name("softnda0");
    pb::OpenContextResponse opened;
    const size_t objects = edge.broker().objectCount();
    const int commits = edge.commits();
    grpc::Status st = edge.call(&pb::Broker::Stub::OpenContext, b, kKey, open, &opened);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_NE(st.error_message().find("'replies'"), std::string::npos) << st.error_message();
    EXPECT_NE(st.error_message().find("the call was not run"), std::string::npos) << st.error_message();
    EXPECT_EQ(edge.broker().objectCount(), objects);
    EXPECT_EQ(edge.commits(), commits);
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::OpenContext, b, nullptr, open, &opened).ok());  // keyless runs

    edge.endSession(a);
    EXPECT_EQ(edge.replies(), 0u);
    EXPECT_TRUE(edge.call(&pb::Broker::Stub::OpenContext, b, kKey, open, &opened).ok());
    EXPECT_EQ(edge.replies(), 1u);
}

// A tenant that has a reply tells the broker ("ibvx-retire-keys" on a later call): its stored
// reply and the quota it held are given back at once, and the key, no longer known, would run
// its call again. Replies not named stay answerable.
TEST(Idempotency, RetiredRepliesAreGivenBackAndOthersStillAnswered) {
    Edge edge;
    std::string token = edge.hello();
    const pb::AllocPdRequest pd = Edge::pdRequest(edge.openContext(token));
    const uint64_t replies = edge.replies();
    pb::AllocPdResponse b1, b2, b3;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b1", pd, &b1).ok());
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b2", pd, &b2).ok());
    EXPECT_EQ(edge.replies(), replies + 2);
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b3", pd, &b3,
                          "00000000000000b1,00000000000000f0")
                    .ok());                  // f0 was never a key here: skipped
    EXPECT_EQ(edge.replies(), replies + 2);  // b1's gone, b3's kept

    pb::AllocPdResponse again;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b2", pd, &again).ok());
    EXPECT_EQ(again.pd(), b2.pd());  // answered
    const size_t objects = edge.broker().objectCount();
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b1", pd, &again).ok());
    EXPECT_NE(again.pd(), b1.pd());  // run as a new call: the tenant said it would not retry b1
    EXPECT_EQ(edge.broker().objectCount(), objects + 1);
}

TEST(Idempotency, BadRetireKeysAreRefusedBeforeAnythingRuns) {
    Edge edge;
    std::string token = edge.hello();
    const pb::AllocPdRequest pd = Edge::pdRequest(edge.openContext(token));
    pb::AllocPdResponse kept;
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b1", pd, &kept).ok());
    const size_t objects = edge.broker().objectCount();
    const int commits = edge.commits();
    std::string too_many;
    for (int i = 0; i <= 64; ++i) {
        too_many += (i == 0 ? "" : ",") + std::string("00000000000000b1");
    }
    for (const std::string &bad :
         {std::string(), std::string("00000000000000b1,"), std::string(",00000000000000b1"),
          std::string("00000000000000B1"), std::string("0000000000000000"),
          std::string("00000000000000b1;00000000000000b2"), too_many}) {
        pb::AllocPdResponse r;
        grpc::Status st =
            edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000c1", pd, &r, bad.c_str());
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << "'" << bad << "'";
        EXPECT_NE(st.error_message().find("ibvx-retire-keys"), std::string::npos) << st.error_message();
        EXPECT_EQ(errnoDetail(st), std::to_string(EINVAL));
    }
    EXPECT_EQ(edge.broker().objectCount(), objects);
    EXPECT_EQ(edge.commits(), commits);
    pb::AllocPdResponse again;  // b1 was not retired by any of them
    ASSERT_TRUE(edge.call(&pb::Broker::Stub::AllocPd, token, "00000000000000b1", pd, &again).ok());
    EXPECT_EQ(again.pd(), kept.pd());
}

}  // namespace
}  // namespace ibvx::daemon
