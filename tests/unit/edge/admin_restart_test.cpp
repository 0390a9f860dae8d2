// Admin.Restart and the restart fields of GetStatus and ListDrivers, served by the real
// AdminService over the real core and softnda in-process, with hooks standing in for the
// daemon's restart code: what a plan says reaches the reply, a refusal keeps its code and
// message, no hook means UNIMPLEMENTED, and restart_keeps follows the drivers' restart entries.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>

#include "daemon/edge/admin_service.h"
#include "providers/loader/loader.h"
#include "tests/unit/edge/in_process.h"

namespace ibvx::daemon {
namespace {

// Two vdev providers with no device: one with the ABI V4 restart entries, one (V3) without.
int noDevices(ibv_extend_vdev_attr *, int) {
    return 0;
}
int exportStub(ibv_extend_vdev_obj, const void *, ibv_extend_vdev_state *) {
    return -EOPNOTSUPP;
}
void *importStub(ibv_extend_vdev_obj, const ibv_extend_vdev_state *, const ibv_extend_vdev_import *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int pauseStub(const char *, int) {
    return 0;
}

const verbs_device_extend_ops kKeeperDriver{"restart_keeper", nullptr, nullptr};
const verbs_device_extend_ops kOldDriver{"restart_old", nullptr, nullptr};

ibv_extend_vdev_ops vdevOps(const char *provider, uint32_t abi, bool restart_entries) {
    ibv_extend_vdev_ops ops{};
    ops.abi = abi;
    ops.provider = provider;
    ops.query_devices = noDevices;
    if (restart_entries) {
        ops.export_object = exportStub;
        ops.import_object = importStub;
        ops.set_paused = pauseStub;
    }
    return ops;
}
const ibv_extend_vdev_ops kKeeperVdev = vdevOps("restart_keeper", IBV_EXTEND_VDEV_ABI_V4, true);
const ibv_extend_vdev_ops kOldVdev = vdevOps("restart_old", 3, false);

class AdminRestartEdge {
  public:
    explicit AdminRestartEdge(AdminHooks hooks) {
        hooks.admin_gid = static_cast<long>(::getgid());  // the test's own group may call Admin
        service_ = std::make_unique<AdminService>(
            core_.broker(), connections_, stats_, admin_stats_, std::make_shared<AdminEvents>(), hooks,
            [](const std::shared_ptr<Session> &) { return std::shared_future<void>(); });
        grpc::ServerBuilder builder;
        builder.RegisterService(service_.get());
        server_ = builder.BuildAndStart();
        stub_ = pb::Admin::NewStub(connectInProcess(*server_, connections_));
    }
    ~AdminRestartEdge() {
        server_->Shutdown();
        server_->Wait();
    }

    grpc::Status restart(bool require_keep, pb::RestartResponse *resp) {
        pb::RestartRequest req;
        req.set_require_keep(require_keep);
        grpc::ClientContext ctx;
        return stub_->Restart(&ctx, req, resp);
    }
    pb::Admin::Stub &stub() { return *stub_; }
    AdminRpcStats &adminStats() { return admin_stats_; }
    Broker &broker() { return core_.broker(); }

  private:
    InProcessCore core_;
    ConnectionRegistry connections_;
    RpcStats stats_;
    AdminRpcStats admin_stats_;
    std::unique_ptr<AdminService> service_;
    std::unique_ptr<grpc::Server> server_;
    std::unique_ptr<pb::Admin::Stub> stub_;
};

TEST(AdminRestart, PlanReachesTheReplyAndTheFlagReachesTheHook) {
    std::atomic<int> asked{-1};
    AdminHooks hooks;
    hooks.restart = [&](bool require_keep) -> StatusOr<RestartPlan> {
        asked = require_keep ? 1 : 0;
        RestartPlan p;
        p.sessions_kept = 3;
        p.sessions_dropped = 1;
        p.dropping_drivers = {"mlx5"};
        p.binary = "/usr/sbin/ibv-extendd";
        return p;
    };
    AdminRestartEdge edge(hooks);
    pb::RestartResponse resp;
    ASSERT_TRUE(edge.restart(false, &resp).ok());
    EXPECT_EQ(asked.load(), 0);
    EXPECT_EQ(resp.sessions_kept(), 3u);
    EXPECT_EQ(resp.sessions_dropped(), 1u);
    ASSERT_EQ(resp.dropping_drivers_size(), 1);
    EXPECT_EQ(resp.dropping_drivers(0), "mlx5");
    EXPECT_EQ(resp.binary(), "/usr/sbin/ibv-extendd");
    EXPECT_EQ(edge.adminStats().calls(AdminMethod::kRestart), 1u);
    EXPECT_STREQ(methodName(AdminMethod::kRestart), "Restart");
}

TEST(AdminRestart, RefusalKeepsItsCodeAndMessage) {
    AdminHooks hooks;
    hooks.restart = [](bool require_keep) -> StatusOr<RestartPlan> {
        EXPECT_TRUE(require_keep);
        return failedPrecondition("session 7 (pid 1234) holds objects of mlx5, which cannot hand over");
    };
    AdminRestartEdge edge(hooks);
    pb::RestartResponse resp;
    grpc::Status st = edge.restart(true, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_NE(st.error_message().find("session 7 (pid 1234)"), std::string::npos) << st.error_message();
    EXPECT_EQ(edge.adminStats().errors(AdminMethod::kRestart), 1u);
}

TEST(AdminRestart, WithoutAHookItIsUnimplementedAndStatusShowsNoRestart) {
    AdminRestartEdge edge{AdminHooks{}};
    pb::RestartResponse resp;
    EXPECT_EQ(edge.restart(false, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);

    grpc::ClientContext ctx;
    pb::GetStatusResponse status;
    ASSERT_TRUE(edge.stub().GetStatus(&ctx, pb::GetStatusRequest{}, &status).ok());
    EXPECT_EQ(status.restarts(), 0u);
    EXPECT_EQ(status.last_restart_unix_ms(), 0u);
}

TEST(AdminRestart, StatusCarriesTheRestartHistory) {
    AdminHooks hooks;
    hooks.restart_info = [] { return RestartInfo{2, 1764601201123, 850}; };
    AdminRestartEdge edge(hooks);
    grpc::ClientContext ctx;
    pb::GetStatusResponse status;
    ASSERT_TRUE(edge.stub().GetStatus(&ctx, pb::GetStatusRequest{}, &status).ok());
    EXPECT_EQ(status.restarts(), 2u);
    EXPECT_EQ(status.last_restart_unix_ms(), 1764601201123u);
    EXPECT_EQ(status.last_restart_took_ms(), 850u);
    EXPECT_FALSE(status.last_restart_crash());
}

TEST(AdminRestart, StatusSaysWhenTheLastRestartFollowedACrash) {
    AdminHooks hooks;
    hooks.restart_info = [] { return RestartInfo{1, 1764601201123, 1830, /*last_crash=*/true}; };
    AdminRestartEdge edge(hooks);
    grpc::ClientContext ctx;
    pb::GetStatusResponse status;
    ASSERT_TRUE(edge.stub().GetStatus(&ctx, pb::GetStatusRequest{}, &status).ok());
    EXPECT_TRUE(status.last_restart_crash());
    EXPECT_EQ(status.last_restart_took_ms(), 1830u);  // an upper bound, as the flag says
}

TEST(AdminRestart, DriversKeepWhenTheirRestartEntriesAreThere) {
    verbs_register_driver_extend(&kKeeperDriver);
    verbs_register_vdev_extend(&kKeeperVdev);
    verbs_register_driver_extend(&kOldDriver);
    verbs_register_vdev_extend(&kOldVdev);
    AdminRestartEdge edge{AdminHooks{}};
    grpc::ClientContext ctx;
    pb::ListDriversResponse resp;
    ASSERT_TRUE(edge.stub().ListDrivers(&ctx, pb::ListDriversRequest{}, &resp).ok());
    std::map<std::string, const pb::DriverEntry *> by_name;
    for (const auto &d : resp.drivers()) {
        by_name[d.name()] = &d;
    }
    ASSERT_TRUE(by_name.count("restart_keeper") && by_name.count("restart_old") && by_name.count("softnda"));
    EXPECT_TRUE(by_name["restart_keeper"]->restart_keeps());
    EXPECT_EQ(by_name["restart_keeper"]->devices_size(), 0);
    EXPECT_FALSE(by_name["restart_old"]->restart_keeps());
    // softnda serves a device: its answer is the device's own table.
    const pb::DriverEntry &softnda = *by_name["softnda"];
    ASSERT_GT(softnda.devices_size(), 0);
    Device *dev = edge.broker().devices().find(softnda.devices(0));
    ASSERT_NE(dev, nullptr);
    EXPECT_EQ(softnda.restart_keeps(), dev->verbs.keepsAcrossRestart());
}

}  // namespace
}  // namespace ibvx::daemon
