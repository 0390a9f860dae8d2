// The end of a broker session as a tenant that only polls meets it (docs/verbs.md, "When the
// session ends"): session-end-tenant over the libibverbs face, its session evicted through
// Admin.EvictSession (what `ibv-extendctl evict` calls), must see its outstanding work flushed,
// IBV_EVENT_DEVICE_FATAL, its QP in ERR and its verbs failing, within a few seconds; a broker
// restart (Admin.Restart) under the same tenant must show it none of that.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "ibv_extend/v1/admin.grpc.pb.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/wait_for.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

namespace pb = ::ibv_extend::v1;
using namespace std::chrono_literals;

// The tenant through ibv-extend-run, stdout and stderr into one file.
Background startTenant(const BrokerProcess &broker, const std::vector<std::string> &args,
                       const std::string &out) {
    std::vector<std::string> argv = {IBVX_RUN_BINARY,         "--socket", broker.socket(), "--",
                                     IBVX_SESSION_END_TENANT, "softnda0"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> env = {"LD_LIBRARY_PATH=" IBVX_EXTEND_LIB_DIR, "IBV_EXTEND_SHOW_WARNINGS=1",
                                    "ASAN_OPTIONS=detect_leaks=0"};
    if (std::string(IBVX_SANITIZER_PRELOAD).size() != 0) {
        env.push_back("LD_PRELOAD=" IBVX_SANITIZER_PRELOAD);
    }
    return startBackground(argv, out, env);
}

bool hasLine(const std::string &path, const std::string &line) {
    return ("\n" + readFile(path)).find("\n" + line) != std::string::npos;
}

class Admin {
  public:
    explicit Admin(const std::string &socket) : socket_(socket) { reconnect(); }
    void reconnect() {
        stub_ =
            pb::Admin::NewStub(grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
    }
    // The session of a process, 0 when it has none.
    uint64_t sessionOf(pid_t pid) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 5s);
        pb::ListSessionsResponse resp;
        if (!stub_->ListSessions(&ctx, pb::ListSessionsRequest{}, &resp).ok()) {
            return 0;
        }
        for (const auto &s : resp.sessions()) {
            if (s.pid() == pid) {
                return s.id();
            }
        }
        return 0;
    }
    grpc::Status evict(uint64_t session) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 15s);
        pb::EvictSessionRequest req;
        req.set_session(session);
        pb::EvictSessionResponse resp;
        return stub_->EvictSession(&ctx, req, &resp);
    }
    grpc::Status restart(pb::RestartResponse *resp) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 10s);
        return stub_->Restart(&ctx, pb::RestartRequest{}, resp);
    }
    uint64_t restarts() {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + 2s);
        ctx.set_wait_for_ready(true);
        pb::GetStatusResponse st;
        return stub_->GetStatus(&ctx, pb::GetStatusRequest{}, &st).ok() ? st.restarts() : 0;
    }

  private:
    std::string socket_;
    std::unique_ptr<pb::Admin::Stub> stub_;
};

TEST(SessionEnd, AnEvictedTenantThatOnlyPollsSeesFlushedWorkTheFatalEventAndFailingVerbs) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    const std::string out = broker.dir() + "/tenant.out";
    Background tenant = startTenant(broker, {"evict"}, out);
    ASSERT_TRUE(waitFor([&] { return hasLine(out, "ready "); }, 20s)) << readFile(out) << broker.log();
    Admin admin(broker.socket());
    uint64_t session = 0;
    ASSERT_TRUE(waitFor([&] { return (session = admin.sessionOf(tenant.pid)) != 0; }, 5s)) << broker.log();

    auto evicted_at = std::chrono::steady_clock::now();
    grpc::Status st = admin.evict(session);
    ASSERT_TRUE(st.ok()) << st.error_message() << broker.log();
    // Learned from the data path alone, within a few seconds.
    ASSERT_TRUE(waitFor([&] { return hasLine(out, "flushed "); }, 10s)) << readFile(out);
    auto learned = std::chrono::steady_clock::now() - evicted_at;
    EXPECT_LT(learned, 5s);
    ::testing::Test::RecordProperty(
        "flushed_after_ms",
        std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(learned).count()));

    int rc = waitBackground(tenant, 30000);
    const std::string text = readFile(out);
    EXPECT_EQ(rc, 0) << text << broker.log();
    // Every outstanding work request of QP a: 3 SENDs (one unsignaled) and 4 receives.
    EXPECT_TRUE(hasLine(out, "flushed send=3 recv=4 status=Work Request Flushed Error order_ok=1")) << text;
    EXPECT_TRUE(hasLine(out, "cq_event rc=0")) << text;
    EXPECT_TRUE(hasLine(out, "async readable=1 event=local catastrophic error")) << text;
    EXPECT_TRUE(hasLine(out, "async_after rc=-1 errno=EIO")) << text;
    EXPECT_TRUE(hasLine(out, "query_qp rc=0 state=ERR")) << text;
    EXPECT_TRUE(hasLine(out, "post_send rc=EIO bad_wr_ok=1")) << text;
    EXPECT_TRUE(hasLine(out, "post_recv rc=EIO bad_wr_ok=1")) << text;
    EXPECT_TRUE(hasLine(out, "req_notify rc=EIO")) << text;
    EXPECT_TRUE(hasLine(out, "get_cq_event rc=-1 errno=EIO")) << text;
    EXPECT_TRUE(hasLine(out, "modify_qp rc=ECONNRESET")) << text;
    EXPECT_TRUE(hasLine(out, "done ok=1")) << text;
    EXPECT_EQ(admin.sessionOf(tenant.pid), 0u);
    printf("evicted tenant, flushed after %lld ms:\n%s",
           static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(learned).count()),
           text.c_str());
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

TEST(SessionEnd, ABrokerRestartEndsNothing) {
    BrokerProcess broker;
    ASSERT_TRUE(broker.started()) << broker.log();
    const std::string out = broker.dir() + "/tenant.out";
    const std::string go = broker.dir() + "/go";
    Background tenant = startTenant(broker, {"restart", go}, out);
    ASSERT_TRUE(waitFor([&] { return hasLine(out, "ready "); }, 20s)) << readFile(out) << broker.log();

    Admin admin(broker.socket());
    pb::RestartResponse resp;
    grpc::Status st = admin.restart(&resp);
    ASSERT_TRUE(st.ok()) << st.error_message() << broker.log();
    EXPECT_EQ(resp.sessions_dropped(), 0u);
    admin.reconnect();
    ASSERT_TRUE(waitFor([&] { return admin.restarts() >= 1; }, 20s)) << broker.log();
    ASSERT_NE(admin.sessionOf(tenant.pid), 0u) << broker.log();
    std::this_thread::sleep_for(200ms);  // time for a watcher that wrongly fired to show it
    std::ofstream(go).put('\n');

    int rc = waitBackground(tenant, 60000);
    const std::string text = readFile(out);
    EXPECT_EQ(rc, 0) << text << broker.log();
    EXPECT_TRUE(hasLine(out, "after_restart completions=0 cq_event=1 async_readable=0")) << text;
    EXPECT_TRUE(hasLine(out, "query_qp rc=0 state=RTS")) << text;
    EXPECT_TRUE(hasLine(out, "restart ok=1 sends=2 recvs=3 cq_event=0")) << text;
    EXPECT_TRUE(hasLine(out, "done ok=1")) << text;
    EXPECT_EQ(text.find("ended this process's session"), std::string::npos) << text;
    printf("tenant across a restart:\n%s", text.c_str());
    EXPECT_EQ(broker.terminate(), 0) << broker.log();
}

}  // namespace
}  // namespace ibvx::test
