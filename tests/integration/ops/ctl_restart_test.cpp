// ibv-extendctl's restart command and the restart lines of status, drivers and watch, against a
// stand-in Admin server on a short temp socket with fixed replies: a plan, a refusal
// (FAILED_PRECONDITION), a restart history and a BROKER_RESTART event. The real broker's side of
// these replies is tested in tests/unit/edge/admin_restart_test.cpp.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "ibv_extend/v1/admin.grpc.pb.h"
#include "run_process.h"

namespace ibvx::test {
namespace {

namespace pb = ::ibv_extend::v1;
using nlohmann::json;

constexpr uint64_t kLastRestartMs = 1764601201123;  // 2025-12-01T15:00:01.123Z

class FixedAdmin final : public pb::Admin::Service {
  public:
    grpc::Status Restart(grpc::ServerContext *, const pb::RestartRequest *req,
                         pb::RestartResponse *resp) override {
        if (req->require_keep()) {
            return grpc::Status(
                grpc::StatusCode::FAILED_PRECONDITION,
                "session 7 (pid 1234) would be dropped: it holds objects of mlx5 (restart: drops)");
        }
        resp->set_sessions_kept(3);
        resp->set_sessions_dropped(1);
        resp->add_dropping_drivers("mlx5");
        resp->set_binary("/usr/sbin/ibv-extendd");
        return grpc::Status::OK;
    }
    grpc::Status GetStatus(grpc::ServerContext *, const pb::GetStatusRequest *,
                           pb::GetStatusResponse *resp) override {
        resp->set_pid(42);
        resp->set_restarts(2);
        resp->set_last_restart_unix_ms(kLastRestartMs);
        resp->set_last_restart_took_ms(850);
        return grpc::Status::OK;
    }
    grpc::Status ListDrivers(grpc::ServerContext *, const pb::ListDriversRequest *,
                             pb::ListDriversResponse *resp) override {
        auto *softnda = resp->add_drivers();
        softnda->set_name("softnda");
        softnda->set_virtual_provider(true);
        softnda->set_restart_keeps(true);
        auto *mlx5 = resp->add_drivers();
        mlx5->set_name("mlx5");
        mlx5->set_restart_keeps(false);
        return grpc::Status::OK;
    }
    grpc::Status Watch(grpc::ServerContext *, const pb::WatchRequest *,
                       grpc::ServerWriter<pb::AdminEvent> *writer) override {
        pb::AdminEvent e;
        e.set_seq(1);
        e.set_time_unix_ms(kLastRestartMs);
        e.set_kind(pb::AdminEvent::BROKER_RESTART);
        e.set_message("3 session(s) kept, 1 dropped");
        writer->Write(e);
        return grpc::Status::OK;
    }
};

class CtlRestartTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx-ctlr-XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        socket_ = dir_ + "/s";
        grpc::ServerBuilder b;
        b.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
        b.RegisterService(&admin_);
        server_ = b.BuildAndStart();
        ASSERT_NE(server_, nullptr);
    }
    void TearDown() override {
        server_->Shutdown();
        server_->Wait();
        ::unlink(socket_.c_str());
        ::rmdir(dir_.c_str());
    }
    ProcessResult ctl(std::vector<std::string> args) {
        std::vector<std::string> argv = {ctlBinary(), "--socket", socket_};
        argv.insert(argv.end(), args.begin(), args.end());
        return runProcess(argv);
    }

    std::string dir_, socket_;
    FixedAdmin admin_;
    std::unique_ptr<grpc::Server> server_;
};

TEST_F(CtlRestartTest, RestartPrintsWhatIsKeptAndDropped) {
    ProcessResult r = ctl({"restart"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out,
              "restarting: exec /usr/sbin/ibv-extendd\n"
              "sessions kept:    3\n"
              "sessions dropped: 1 (drivers that cannot hand over: mlx5)\n");

    ProcessResult j = ctl({"restart", "--json"});
    ASSERT_EQ(j.exit_code, 0) << j.err;
    json reply = json::parse(j.out, nullptr, false);
    ASSERT_FALSE(reply.is_discarded()) << j.out;
    EXPECT_EQ(reply["sessions_kept"].get<uint32_t>(), 3u);
    EXPECT_EQ(reply["sessions_dropped"].get<uint32_t>(), 1u);
    EXPECT_EQ(reply["dropping_drivers"][0], "mlx5");
    EXPECT_EQ(reply["binary"], "/usr/sbin/ibv-extendd");
}

TEST_F(CtlRestartTest, RequireKeepRefusalExitsOneWithTheBrokersMessage) {
    ProcessResult r = ctl({"restart", "--require-keep"});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("restart refused: session 7 (pid 1234) would be dropped"), std::string::npos)
        << r.err;
}

TEST_F(CtlRestartTest, StatusShowsRestartsWithTimeInUtcAndDuration) {
    ProcessResult r = ctl({"status"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("restarts: 2 (last 2025-12-01T15:00:01.123Z, took 850ms)\n"), std::string::npos)
        << r.out;
    ProcessResult j = ctl({"--json", "status"});
    json s = json::parse(j.out, nullptr, false);
    ASSERT_FALSE(s.is_discarded()) << j.out;
    EXPECT_EQ(s["restarts"], "2");  // proto3 JSON: 64-bit as strings
    EXPECT_EQ(s["last_restart_unix_ms"], std::to_string(kLastRestartMs));
    EXPECT_EQ(s["last_restart_took_ms"], "850");
}

TEST_F(CtlRestartTest, DriversShowWhetherTheyKeepSessionsAcrossARestart) {
    ProcessResult r = ctl({"drivers"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("RESTART"), std::string::npos) << r.out;
    bool softnda = false, mlx5 = false;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
        softnda =
            softnda || (line.rfind("softnda ", 0) == 0 && line.find("restart: keeps") != std::string::npos);
        mlx5 = mlx5 || (line.rfind("mlx5 ", 0) == 0 && line.find("restart: drops") != std::string::npos);
    }
    EXPECT_TRUE(softnda && mlx5) << r.out;
    json j = json::parse(ctl({"--json", "drivers"}).out, nullptr, false);
    ASSERT_FALSE(j.is_discarded());
    EXPECT_TRUE(j["drivers"][0]["restart_keeps"].get<bool>());
    EXPECT_FALSE(j["drivers"][1]["restart_keeps"].get<bool>());
}

TEST_F(CtlRestartTest, WatchNamesTheBrokerRestartEvent) {
    ProcessResult r = ctl({"watch", "--count", "1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("#1  broker-restart  3 session(s) kept, 1 dropped"), std::string::npos) << r.out;
    ProcessResult j = ctl({"--json", "watch", "--count", "1"});
    EXPECT_NE(j.out.find("\"kind\":\"BROKER_RESTART\""), std::string::npos) << j.out;
}

}  // namespace
}  // namespace ibvx::test
