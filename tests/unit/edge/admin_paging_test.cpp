// Admin listings page: every page within its entry count and the reply's byte budget, every
// entry listed once across the pages, and a token the broker did not hand out refused. The real
// AdminService over the real core and softnda, in-process, with a tiny byte budget so that a
// handful of objects takes several pages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <set>

#include "daemon/edge/admin_service.h"
#include "tests/unit/edge/in_process.h"

namespace ibvx::daemon {
namespace {

constexpr size_t kBudget = 160;  // bytes: a few objects a page

class AdminEdge {
  public:
    AdminEdge() {
        AdminHooks hooks;
        hooks.admin_gid = static_cast<long>(::getgid());  // the test's own group may call Admin
        hooks.reply_budget_bytes = kBudget;
        service_ = std::make_unique<AdminService>(
            broker(), connections_, stats_, admin_stats_, std::make_shared<AdminEvents>(), hooks,
            [](const std::shared_ptr<Session> &) { return std::shared_future<void>(); });
        grpc::ServerBuilder builder;
        builder.RegisterService(service_.get());
        server_ = builder.BuildAndStart();
        stub_ = pb::Admin::NewStub(connectInProcess(*server_, connections_, &peer_));
    }
    ~AdminEdge() {
        broker().endAllSessions();
        server_->Shutdown();
        server_->Wait();
    }

    // A tenant session holding a context and `pds` PDs.
    void tenant(int pds) {
        auto s = broker().hello(peer_, broker().options().version, "paging-test");
        ASSERT_TRUE(s.isOk()) << s.status().toString();
        auto ctx = broker().openContext(**s, "softnda0");
        ASSERT_TRUE(ctx.isOk()) << ctx.status().toString();
        for (int i = 0; i < pds; ++i) {
            ASSERT_TRUE(broker().allocPd(**s, ctx->context).isOk());
        }
    }

    pb::Admin::Stub &stub() { return *stub_; }
    AdminRpcStats &adminStats() { return admin_stats_; }
    Broker &broker() { return core_.broker(); }

  private:
    InProcessCore core_;
    ConnectionRegistry connections_;
    RpcStats stats_;
    AdminRpcStats admin_stats_;
    PeerIdentity peer_;
    std::unique_ptr<AdminService> service_;
    std::unique_ptr<grpc::Server> server_;
    std::unique_ptr<pb::Admin::Stub> stub_;
};

TEST(AdminPaging, ObjectsComeInPagesWithinTheByteBudgetAndAllOfThem) {
    AdminEdge edge;
    edge.tenant(6);
    edge.tenant(3);  // 2 contexts + 9 PDs
    pb::ListObjectsRequest req;
    std::vector<uint64_t> handles;
    int pages = 0;
    do {
        grpc::ClientContext ctx;
        pb::ListObjectsResponse resp;
        ASSERT_TRUE(edge.stub().ListObjects(&ctx, req, &resp).ok());
        ASSERT_GT(resp.objects_size(), 0);
        // Over the budget by at most the last entry and the token.
        size_t last = resp.objects(resp.objects_size() - 1).ByteSizeLong();
        EXPECT_LE(resp.ByteSizeLong(), kBudget + last + resp.next_page_token().size() + 8);
        for (const auto &o : resp.objects()) {
            handles.push_back(o.handle());
        }
        req.set_page_token(resp.next_page_token());
        ++pages;
    } while (!req.page_token().empty());
    EXPECT_EQ(handles.size(), 11u);
    EXPECT_EQ(std::set<uint64_t>(handles.begin(), handles.end()).size(), 11u);
    EXPECT_GT(pages, 2);
    // Counted in the Admin table, as every Admin call is.
    EXPECT_EQ(edge.adminStats().calls(AdminMethod::kListObjects), static_cast<uint64_t>(pages));
}

TEST(AdminPaging, PageSizeCountsEntriesAndKindFilters) {
    AdminEdge edge;
    edge.tenant(4);
    pb::ListObjectsRequest req;
    req.set_page_size(1);
    req.set_kind(pb::OBJECT_KIND_CONTEXT);
    grpc::ClientContext ctx;
    pb::ListObjectsResponse resp;
    ASSERT_TRUE(edge.stub().ListObjects(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.objects_size(), 1);
    EXPECT_EQ(resp.objects(0).kind(), pb::OBJECT_KIND_CONTEXT);
    EXPECT_TRUE(resp.next_page_token().empty());  // the only context

    req.set_kind(static_cast<pb::ObjectKind>(77));
    grpc::ClientContext bad;
    EXPECT_EQ(edge.stub().ListObjects(&bad, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AdminPaging, SessionsPageAndBadTokensAreRefused) {
    AdminEdge edge;
    for (int i = 0; i < 3; ++i) {
        edge.tenant(0);
    }
    pb::ListSessionsRequest req;
    req.set_page_size(2);
    std::set<uint64_t> ids;
    int pages = 0;
    do {
        grpc::ClientContext ctx;
        pb::ListSessionsResponse resp;
        ASSERT_TRUE(edge.stub().ListSessions(&ctx, req, &resp).ok());
        for (const auto &s : resp.sessions()) {
            ids.insert(s.id());
        }
        req.set_page_token(resp.next_page_token());
        ++pages;
    } while (!req.page_token().empty());
    EXPECT_EQ(ids.size(), 3u);
    EXPECT_GE(pages, 2);

    for (const char *token : {"x", "s", "s1.2", "s-1", "o1.2.3", "s18446744073709551616"}) {
        pb::ListSessionsRequest r;
        r.set_page_token(token);
        grpc::ClientContext ctx;
        pb::ListSessionsResponse resp;
        grpc::Status st = edge.stub().ListSessions(&ctx, r, &resp);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << token;
    }
    EXPECT_EQ(edge.adminStats().errors(AdminMethod::kListSessions), 6u);
}

}  // namespace
}  // namespace ibvx::daemon
