// The broker names a session's pod: [kubernetes] pod_resources_socket, a fake kubelet
// PodResources server written here on the same proto, a tenant in a container carrying the
// device plugin's marker mount, and ibv-extendctl showing NAMESPACE/POD.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "k8s/podresources/v1/api.grpc.pb.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/wait_for.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string buildDir() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    return b != nullptr ? b : ".";
}

// The kubelet's PodResources List, answering what the test put in.
class FakePodResources final : public ::v1::PodResourcesLister::Service {
  public:
    explicit FakePodResources(const std::string &socket) {
        grpc::ServerBuilder b;
        b.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
        b.RegisterService(this);
        server_ = b.BuildAndStart();
    }
    ~FakePodResources() override {
        if (server_) {
            server_->Shutdown(std::chrono::system_clock::now() + 1s);
        }
    }
    bool started() const { return server_ != nullptr; }

    void addPod(const std::string &ns, const std::string &pod, const std::string &container,
                const std::string &resource, const std::vector<std::string> &devices) {
        std::lock_guard lock(mu_);
        ::v1::PodResources *p = pods_.add_pod_resources();
        p->set_name(pod);
        p->set_namespace_(ns);
        ::v1::ContainerResources *c = p->add_containers();
        c->set_name(container);
        ::v1::ContainerDevices *d = c->add_devices();
        d->set_resource_name(resource);
        for (const std::string &id : devices) {
            d->add_device_ids(id);
        }
    }
    int calls() const {
        std::lock_guard lock(mu_);
        return calls_;
    }

    grpc::Status List(grpc::ServerContext *, const ::v1::ListPodResourcesRequest *,
                      ::v1::ListPodResourcesResponse *out) override {
        std::lock_guard lock(mu_);
        ++calls_;
        *out = pods_;
        return grpc::Status::OK;
    }

  private:
    std::unique_ptr<grpc::Server> server_;
    mutable std::mutex mu_;
    ::v1::ListPodResourcesResponse pods_;
    int calls_ = 0;
};

class PodIdentityTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvp.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        ::chmod(dir_.c_str(), 0755);
        fs::create_directories(dir_ + "/markers");
        fs::create_directories(dir_ + "/ctl");
        ::chmod((dir_ + "/ctl").c_str(), 0777);
        for (const char *id : {"nda-1", "nda-2", "nda-3", "nda-4"}) {
            std::ofstream(dir_ + "/markers/" + id);
        }
    }
    void TearDown() override {
        for (auto &h : holders_) {
            std::ofstream(dir_ + "/ctl/stop");
            waitBackground(h, 10000);
        }
        broker_.reset();
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    void startBroker(const std::string &pod_resources_socket, const std::string &more_config = "") {
        broker_ = std::make_unique<BrokerProcess>(
            "[broker]\nsocket_mode = \"0666\"\n[kubernetes]\n"
            "pod_resources_socket = \"" +
            pod_resources_socket + "\"\n" + more_config);
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ::chmod(broker_->dir().c_str(), 0755);
    }

    // A tenant in a container the device plugin equipped with device's marker (as uid 65534);
    // what the holder printed ("open=ok\n" once its session is up, else "open=<errno>\n").
    std::string tryTenant(const std::string &device) {
        std::string sock_name = fs::path(broker_->socket()).filename();
        std::string out = dir_ + "/holder-" + device + ".out";
        holders_.push_back(
            startBackground({buildDir() + "/tests/integration/k8s/ibvx-k8s-runtime",
                             "--uid",
                             "65534",
                             "--mount",
                             broker_->dir() + ":/run/ibv-extend:ro",
                             "--mount",
                             fs::canonical(buildDir() + "/client/libibv_extend.so.4").string() +
                                 ":/opt/ibv-extend/lib/libibv_extend.so.4:ro",
                             "--mount",
                             dir_ + "/markers/" + device + ":/run/ibv-extend-device:ro",
                             "--mount",
                             buildDir() + "/tests/integration/k8s/ibvx-k8s-session-holder:/opt/app/holder:ro",
                             "--mount",
                             dir_ + "/ctl:/run/ctl:rw",
                             "--env",
                             "IBV_EXTEND_SOCKET=/run/ibv-extend/" + sock_name,
                             "--env",
                             "IBV_EXTEND_MODE=broker",
                             "--env",
                             "LD_LIBRARY_PATH=/opt/ibv-extend/lib",
                             "--",
                             "/opt/app/holder",
                             "softnda0",
                             "/run/ctl/stop"},
                            out));
        waitFor([&] { return readFile(out).find('\n') != std::string::npos; }, 20s, 10ms);
        return readFile(out);
    }
    void startTenant(const std::string &device) {
        ASSERT_EQ(tryTenant(device), "open=ok\n") << broker_->log();
    }

    nlohmann::json sessions() {
        ProcessResult r = runProcess({ctlBinary(), "--socket", broker_->socket(), "--json", "sessions"});
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return nlohmann::json::parse(r.out, nullptr, false);
    }

    std::string dir_;
    std::unique_ptr<BrokerProcess> broker_;
    std::vector<Background> holders_;
};

TEST_F(PodIdentityTest, SessionsShowTheirPod) {
    FakePodResources kubelet(dir_ + "/pr.sock");
    ASSERT_TRUE(kubelet.started());
    kubelet.addPod("team-a", "trainer-0", "worker", "ibv-extend.io/nda", {"nda-2", "nda-3"});
    kubelet.addPod("team-b", "other", "main", "example.com/gpu", {"nda-1"});  // another plugin's IDs
    startBroker(dir_ + "/pr.sock");
    startTenant("nda-2");
    startTenant("nda-1");

    ProcessResult table = runProcess({ctlBinary(), "--socket", broker_->socket(), "sessions"});
    ASSERT_EQ(table.exit_code, 0) << table.err;
    std::printf("%s", table.out.c_str());
    EXPECT_NE(table.out.find("NAMESPACE/POD"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find("team-a/trainer-0"), std::string::npos) << table.out;
    EXPECT_EQ(table.out.find("team-b"), std::string::npos) << table.out;

    nlohmann::json j = sessions();
    ASSERT_TRUE(j.contains("sessions")) << j.dump();
    int named = 0;
    for (const nlohmann::json &s : j["sessions"]) {
        if (s.value("pod_name", "") == "trainer-0") {
            ++named;
            EXPECT_EQ(s.value("pod_namespace", ""), "team-a");
            EXPECT_EQ(s.value("pod_container", ""), "worker");
            EXPECT_EQ(s.value("uid", 0), 65534);
        } else {
            EXPECT_EQ(s.value("pod_name", ""), "");
        }
    }
    EXPECT_EQ(named, 1) << j.dump();
    EXPECT_NE(broker_->log().find("pod team-a/trainer-0 container worker"), std::string::npos);
}

TEST_F(PodIdentityTest, WatchEventsCarryThePod) {
    FakePodResources kubelet(dir_ + "/pr.sock");
    ASSERT_TRUE(kubelet.started());
    kubelet.addPod("team-a", "trainer-0", "worker", "ibv-extend.io/nda", {"nda-2"});
    startBroker(dir_ + "/pr.sock");
    std::string out = dir_ + "/watch.out";
    Background watch = startBackground({ctlBinary(), "--socket", broker_->socket(), "--json", "watch"}, out);
    // The watch may subscribe after a tenant opened: tenants come until one's event is seen.
    bool seen = false;
    for (int i = 0; i < 10 && !seen; ++i) {
        startTenant("nda-2");
        seen = waitFor(
            [&] {
                std::string events = readFile(out);
                return events.find("\"SESSION_OPEN\"") != std::string::npos &&
                       events.find("\"pod_name\":\"trainer-0\"") != std::string::npos &&
                       events.find("\"pod_namespace\":\"team-a\"") != std::string::npos;
            },
            2s, 10ms);
    }
    waitBackground(watch, 0);  // stops it
    EXPECT_TRUE(seen) << readFile(out);
}

TEST_F(PodIdentityTest, AnUnreachableKubeletNeverFailsATenant) {
    startBroker(dir_ + "/nobody.sock");
    startTenant("nda-2");  // asserts the session opened
    startTenant("nda-1");
    nlohmann::json j = sessions();
    ASSERT_EQ(j["sessions"].size(), 2u) << j.dump();
    for (const nlohmann::json &s : j["sessions"]) {
        EXPECT_EQ(s.value("pod_name", ""), "");
    }
    std::string log = broker_->log();
    size_t first = log.find("cannot ask the kubelet");
    ASSERT_NE(first, std::string::npos) << log;
    EXPECT_EQ(log.find("cannot ask the kubelet", first + 1), std::string::npos) << "warned twice:\n" << log;
}

TEST_F(PodIdentityTest, APodStartedAfterTheCacheFilledIsFoundOnTheMiss) {
    FakePodResources kubelet(dir_ + "/pr.sock");
    ASSERT_TRUE(kubelet.started());
    kubelet.addPod("team-a", "first", "c", "ibv-extend.io/nda", {"nda-1"});
    startBroker(dir_ + "/pr.sock");
    startTenant("nda-1");
    int calls = kubelet.calls();
    EXPECT_EQ(calls, 1);
    // A second session of the same container is served from the cache.
    startTenant("nda-1");
    EXPECT_EQ(kubelet.calls(), calls);
    // A pod the cache has not seen: asked again (after the refresh interval).
    std::this_thread::sleep_for(200ms);  // > PodResolver::kMinRefresh, not a timing assertion
    kubelet.addPod("team-c", "second", "c", "ibv-extend.io/nda", {"nda-2"});
    startTenant("nda-2");
    EXPECT_EQ(kubelet.calls(), calls + 1);
    bool found = false;
    nlohmann::json j = sessions();
    for (const nlohmann::json &s : j["sessions"]) {
        found = found || s.value("pod_name", "") == "second";
    }
    EXPECT_TRUE(found);
}

TEST_F(PodIdentityTest, ANamespaceQuotaHolds) {
    FakePodResources kubelet(dir_ + "/pr.sock");
    ASSERT_TRUE(kubelet.started());
    kubelet.addPod("team-a", "a1", "c", "ibv-extend.io/nda", {"nda-1"});
    kubelet.addPod("team-a", "a2", "c", "ibv-extend.io/nda", {"nda-2"});
    kubelet.addPod("team-b", "b1", "c", "ibv-extend.io/nda", {"nda-3"});
    startBroker(dir_ + "/pr.sock", "[quotas.namespace.team-a]\nsessions = 1\n");
    startTenant("nda-1");
    // Another pod of team-a, same uid as everyone here: refused by the namespace's account.
    EXPECT_EQ(tryTenant("nda-2"), "open=" + std::to_string(EDQUOT) + "\n");
    EXPECT_NE(broker_->log().find("exceeded for namespace team-a"), std::string::npos) << broker_->log();
    startTenant("nda-3");  // team-b has no such limit
    startTenant("nda-4");  // a container whose pod the kubelet does not list: no namespace
}

TEST_F(PodIdentityTest, APolicyClassNamesANamespace) {
    FakePodResources kubelet(dir_ + "/pr.sock");
    ASSERT_TRUE(kubelet.started());
    kubelet.addPod("team-a", "a1", "c", "ibv-extend.io/nda", {"nda-1"});
    kubelet.addPod("team-b", "b1", "c", "ibv-extend.io/nda", {"nda-3"});
    startBroker(dir_ + "/pr.sock",
                "[policy]\n[policy.class.npu]\nnamespace = \"team-a\"\ndevices = [\"*\"]\n");
    startTenant("nda-1");
    EXPECT_EQ(tryTenant("nda-3"), "open=" + std::to_string(EACCES) + "\n") << broker_->log();
}

}  // namespace
}  // namespace ibvx::test
