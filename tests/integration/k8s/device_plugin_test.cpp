// ibv-extend-device-plugin against a fake kubelet (fake_kubelet.h) and the real ibv-extendd:
// registration, health that follows the broker, re-registration after a kubelet restart,
// Allocate, the CDI spec, and a container built from the Allocate answer the way a runtime
// builds one, reaching the broker as an unprivileged user.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tcp_ports.h"
#include "common/unique_fd.h"
#include "fake_kubelet.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/wait_for.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

namespace fs = std::filesystem;
namespace pb = ::v1beta1;
using namespace std::chrono_literals;

constexpr int kDevices = 4;
constexpr const char *kEndpoint = "ibv-extend.io-nda.sock";
// Generous: the plugin looks every 0.5 s and a health check takes at most 1 s, so it reacts
// within 1.5 s (the bound is 5 s); the deadline only keeps a broken plugin from hanging.
constexpr auto kDeadline = 20s;
constexpr const char *kBrokerConfig = "[broker]\nsocket_mode = \"0666\"\n";

std::string buildDir() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    return b != nullptr ? b : ".";
}

bool isSocket(const std::string &path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// A listening socket at path, as systemd's ibv-extendd.socket would hold it.
UniqueFd listenAt(const std::string &path) {
    ::unlink(path.c_str());
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) < 0 ||
        ::chmod(path.c_str(), 0666) < 0 || ::listen(fd.get(), 64) < 0) {
        return UniqueFd();
    }
    return fd;
}

class PluginProcess {
  public:
    PluginProcess(const std::vector<std::string> &args, const std::string &log) {
        std::vector<std::string> argv = {
            buildDir() + "/tools/ibv-extend-device-plugin/ibv-extend-device-plugin", "--log-level", "debug"};
        argv.insert(argv.end(), args.begin(), args.end());
        bg_ = startBackground(argv, log);
    }
    ~PluginProcess() { terminate(); }
    PluginProcess(const PluginProcess &) = delete;
    PluginProcess &operator=(const PluginProcess &) = delete;

    int terminate() {
        if (bg_.pid <= 0) {
            return -1;
        }
        ::kill(bg_.pid, SIGTERM);
        return waitBackground(bg_, 15000);
    }
    std::string log() const { return readFile(bg_.out_path); }

  private:
    Background bg_;
};

class DevicePluginTest : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvk.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        ::chmod(dir_.c_str(), 0755);  // the unprivileged container user walks into run/
        for (const char *d : {"kd", "cdi", "run", "libs/ibv_extend"}) {
            fs::create_directories(dir_ + "/" + d);
        }
        // The client libraries as an installed tree lays them out: <libdir>/libibv_extend.so.4
        // and <libdir>/ibv_extend/verbs/libibverbs.so.1.
        fs::create_symlink(buildDir() + "/client/libibv_extend.so.4", dir_ + "/libs/libibv_extend.so.4");
        fs::create_directory_symlink(buildDir() + "/lib/ibv_extend/verbs", dir_ + "/libs/ibv_extend/verbs");
        // and softnda's tenant-side data path beside the drivers: <libdir>/ibv_extend/.
        fs::create_symlink(buildDir() + "/providers-out/libsoftnda-verbs.so",
                           dir_ + "/libs/ibv_extend/libsoftnda-verbs.so");
        ::chmod((dir_ + "/run").c_str(), 0755);
    }
    void TearDown() override {
        plugin_.reset();
        kubelet_.reset();
        broker_.reset();
        std::error_code ec;
        fs::remove_all(dir_, ec);
    }

    std::string kubeletDir() const { return dir_ + "/kd"; }
    std::string brokerSocket() const { return dir_ + "/run/b.sock"; }
    std::string cdiSpecPath() const { return dir_ + "/cdi/ibv-extend.json"; }
    std::string markerDir() const { return dir_ + "/markers"; }

    // The broker on brokerSocket(), handed its listening socket as under socket activation, so
    // a restarted broker serves the same path.
    void startBroker() {
        UniqueFd fd = listenAt(brokerSocket());
        ASSERT_TRUE(fd) << "cannot listen on " << brokerSocket();
        BrokerOptions o;
        o.config = kBrokerConfig;
        o.activated_fd = fd.get();
        o.activated_path = brokerSocket();
        broker_ = std::make_unique<BrokerProcess>(o);
        ASSERT_TRUE(broker_->started()) << broker_->log();
        // fd closes here: the broker holds the only listening copy, so its exit refuses connects.
    }
    void stopBroker() { ASSERT_EQ(broker_->terminate(), 0) << broker_->log(); }

    void startPlugin(std::vector<std::string> extra = {}, const std::string &kubelet_dir = "") {
        std::vector<std::string> args = {"--kubelet-dir",
                                         kubelet_dir.empty() ? kubeletDir() : kubelet_dir,
                                         "--socket",
                                         brokerSocket(),
                                         "--devices",
                                         std::to_string(kDevices),
                                         "--cdi-spec-dir",
                                         dir_ + "/cdi",
                                         "--client-lib-dir",
                                         dir_ + "/libs",
                                         "--device-marker-dir",
                                         markerDir()};
        args.insert(args.end(), extra.begin(), extra.end());
        plugin_ = std::make_unique<PluginProcess>(args, dir_ + "/plugin.log");
    }

    void startKubelet() {
        kubelet_ = std::make_unique<FakeKubelet>(kubeletDir());
        ASSERT_TRUE(kubelet_->started());
    }

    bool waitHealth(const std::string &health) {
        return waitFor([&] { return kubelet_->healthOf(kDevices) == health; }, kDeadline, 20ms);
    }

    // Registered, listed and Healthy.
    void bringUp() {
        startBroker();
        startKubelet();
        startPlugin();
        ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    }

    std::string dir_;
    std::unique_ptr<BrokerProcess> broker_;
    std::unique_ptr<FakeKubelet> kubelet_;
    std::unique_ptr<PluginProcess> plugin_;
};

TEST_F(DevicePluginTest, RegistersAndListsHealthyDevices) {
    bringUp();
    auto regs = kubelet_->registrations();
    ASSERT_EQ(regs.size(), 1u);
    EXPECT_EQ(regs[0].version(), "v1beta1");
    EXPECT_EQ(regs[0].resource_name(), "ibv-extend.io/nda");
    EXPECT_EQ(regs[0].endpoint(), kEndpoint);
    EXPECT_TRUE(isSocket(kubeletDir() + "/" + kEndpoint));
    std::set<std::string> ids;
    for (const pb::Device &d : kubelet_->devices()) {
        ids.insert(d.id());
    }
    EXPECT_EQ(ids, (std::set<std::string>{"nda-0", "nda-1", "nda-2", "nda-3"}));
    EXPECT_NE(plugin_->log().find("registered ibv-extend.io/nda with the kubelet"), std::string::npos);
}

TEST_F(DevicePluginTest, SigtermRemovesItsSocket) {
    bringUp();
    EXPECT_EQ(plugin_->terminate(), 0) << plugin_->log();
    EXPECT_FALSE(fs::exists(kubeletDir() + "/" + kEndpoint));
    EXPECT_TRUE(isSocket(kubeletDir() + "/kubelet.sock"));  // never the kubelet's
}

TEST_F(DevicePluginTest, StartsBeforeTheKubeletAndTheBroker) {
    startPlugin();
    ASSERT_TRUE(waitFor([&] { return isSocket(kubeletDir() + "/" + kEndpoint); }, kDeadline, 20ms))
        << plugin_->log();
    startKubelet();
    ASSERT_TRUE(waitHealth("Unhealthy")) << plugin_->log();  // registered, no broker yet
    startBroker();
    EXPECT_TRUE(waitHealth("Healthy")) << plugin_->log();
}

TEST_F(DevicePluginTest, RefusedRegistrationIsRetried) {
    startBroker();
    startKubelet();
    kubelet_->refuseNext(2);
    startPlugin();
    ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    EXPECT_EQ(kubelet_->registrations().size(), 3u);
    EXPECT_NE(plugin_->log().find("registration refused by the test's kubelet"), std::string::npos);
}

TEST_F(DevicePluginTest, HealthFollowsTheBrokerStopAndRestart) {
    bringUp();
    auto t0 = std::chrono::steady_clock::now();
    stopBroker();
    ASSERT_TRUE(waitHealth("Unhealthy")) << plugin_->log();
    auto down = std::chrono::steady_clock::now() - t0;
    t0 = std::chrono::steady_clock::now();
    startBroker();
    ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    auto up = std::chrono::steady_clock::now() - t0;
    // Reported, not asserted: timing on a shared machine is no test of correctness.
    std::printf("Unhealthy %lld ms after the broker stopped, Healthy %lld ms after it came back\n",
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(down).count()),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(up).count()));
}

TEST_F(DevicePluginTest, RegistersAgainAfterTheKubeletRestarts) {
    bringUp();
    // A restarting kubelet removes every plugin socket in its directory, then serves again.
    kubelet_->stop();
    ::unlink((kubeletDir() + "/" + kEndpoint).c_str());
    startKubelet();
    ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    EXPECT_EQ(kubelet_->registrations().size(), 1u);
    EXPECT_TRUE(isSocket(kubeletDir() + "/" + kEndpoint));
    // Only kubelet.sock made anew (the plugin's socket left alone): registration again too.
    kubelet_->stop();
    startKubelet();
    ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    EXPECT_EQ(kubelet_->registrations().size(), 1u);
}

TEST_F(DevicePluginTest, AllocateAnswersMountsAndEnvironment) {
    bringUp();
    pb::AllocateResponse resp;
    grpc::Status st = kubelet_->allocate({{"nda-0"}, {"nda-1", "nda-3"}}, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_EQ(resp.container_responses_size(), 2);
    const char *first_device[] = {"nda-0", "nda-1"};
    for (int i = 0; i < 2; ++i) {
        const pb::ContainerAllocateResponse &c = resp.container_responses(i);
        std::map<std::string, std::string> envs(c.envs().begin(), c.envs().end());
        EXPECT_EQ(envs,
                  (std::map<std::string, std::string>{
                      {"IBV_EXTEND_SOCKET", "/run/ibv-extend/b.sock"},
                      {"IBV_EXTEND_MODE", "broker"},
                      {"IBV_EXTEND_PROVIDER_DIR", "/opt/ibv-extend/lib/ibv_extend"},
                      {"LD_LIBRARY_PATH", "/opt/ibv-extend/lib/ibv_extend/verbs:/opt/ibv-extend/lib"}}));
        std::map<std::string, std::string> mounts;
        for (const pb::Mount &m : c.mounts()) {
            EXPECT_TRUE(m.read_only()) << m.container_path();
            mounts[m.container_path()] = m.host_path();
        }
        EXPECT_EQ(mounts, (std::map<std::string, std::string>{
                              {"/run/ibv-extend", fs::canonical(dir_ + "/run").string()},
                              {"/opt/ibv-extend/lib/libibv_extend.so.4",
                               fs::canonical(buildDir() + "/client/libibv_extend.so.4").string()},
                              {"/opt/ibv-extend/lib/ibv_extend/verbs",
                               fs::canonical(buildDir() + "/lib/ibv_extend/verbs").string()},
                              {"/opt/ibv-extend/lib/ibv_extend/libsoftnda-verbs.so",
                               fs::canonical(buildDir() + "/providers-out/libsoftnda-verbs.so").string()},
                              // The container's own device marker (pod identity in the broker).
                              {"/run/ibv-extend-device", markerDir() + "/" + first_device[i]}}));
        EXPECT_TRUE(fs::is_regular_file(markerDir() + "/" + first_device[i]));
        EXPECT_EQ(c.devices_size(), 0);  // no /dev/infiniband
        EXPECT_EQ(c.cdi_devices_size(), 0);
    }
    EXPECT_NE(plugin_->log().find("Allocate: 2 container(s), devices [nda-0,nda-1,nda-3]"),
              std::string::npos);

    for (const char *bad : {"nda-4", "gpu-0", "nda-01", ""}) {
        pb::AllocateResponse r;
        st = kubelet_->allocate({{"nda-0"}, {bad}}, &r);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
        EXPECT_NE(st.error_message().find("unknown device ID"), std::string::npos) << st.error_message();
    }
}

TEST_F(DevicePluginTest, CdiSpecCarriesTheSameEdits) {
    bringUp();
    pb::AllocateResponse resp;
    ASSERT_TRUE(kubelet_->allocate({{"nda-2"}}, &resp).ok());
    const pb::ContainerAllocateResponse &c = resp.container_responses(0);

    nlohmann::json spec = nlohmann::json::parse(readFile(cdiSpecPath()));
    EXPECT_EQ(spec["cdiVersion"], "0.5.0");
    EXPECT_EQ(spec["kind"], "ibv-extend.io/nda");
    ASSERT_EQ(spec["devices"].size(), 1u);
    EXPECT_EQ(spec["devices"][0]["name"], "broker");
    const nlohmann::json &edits = spec["devices"][0]["containerEdits"];
    std::set<std::string> cdi_env(edits["env"].begin(), edits["env"].end());
    std::set<std::string> allocate_env;
    for (const auto &[k, v] : c.envs()) {
        allocate_env.insert(k + "=" + v);
    }
    EXPECT_EQ(cdi_env, allocate_env);
    std::set<std::string> cdi_mounts, allocate_mounts;
    for (const nlohmann::json &m : edits["mounts"]) {
        std::vector<std::string> opts = m["options"];
        bool ro = std::find(opts.begin(), opts.end(), "ro") != opts.end();
        EXPECT_EQ(m["type"], "bind");
        cdi_mounts.insert(m["hostPath"].get<std::string>() + " " + m["containerPath"].get<std::string>() +
                          (ro ? " ro" : " rw"));
    }
    for (const pb::Mount &m : c.mounts()) {
        if (m.container_path() == "/run/ibv-extend-device") {
            continue;  // per container: no CDI device can carry it
        }
        allocate_mounts.insert(m.host_path() + " " + m.container_path() + (m.read_only() ? " ro" : " rw"));
    }
    EXPECT_EQ(cdi_mounts, allocate_mounts);
}

TEST_F(DevicePluginTest, CdiSpecFollowsChangedPaths) {
    bringUp();
    std::string old_spec = readFile(cdiSpecPath());
    // An upgrade puts a new library file in place: the resolved host path changes.
    std::string copy = dir_ + "/libibv_extend.so.4.new";
    fs::copy_file(fs::canonical(buildDir() + "/client/libibv_extend.so.4"), copy);
    std::string link = dir_ + "/libs/libibv_extend.so.4";
    fs::remove(link);
    fs::create_symlink(copy, link);
    ASSERT_TRUE(
        waitFor([&] { return readFile(cdiSpecPath()).find(copy) != std::string::npos; }, kDeadline, 20ms))
        << plugin_->log();
    EXPECT_TRUE(nlohmann::json::accept(readFile(cdiSpecPath())));
    // Written by rename: no temporary file stays behind.
    int files = 0;
    for (const auto &e : fs::directory_iterator(dir_ + "/cdi")) {
        (void)e;
        ++files;
    }
    EXPECT_EQ(files, 1);
    pb::AllocateResponse resp;
    ASSERT_TRUE(kubelet_->allocate({{"nda-0"}}, &resp).ok());
    bool found = false;
    for (const pb::Mount &m : resp.container_responses(0).mounts()) {
        found = found || m.host_path() == copy;
    }
    EXPECT_TRUE(found);
}

TEST_F(DevicePluginTest, CdiModeAnswersTheCdiDevice) {
    startBroker();
    startKubelet();
    startPlugin({"--cdi"});
    ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
    pb::AllocateResponse resp;
    ASSERT_TRUE(kubelet_->allocate({{"nda-0"}, {"nda-1"}}, &resp).ok());
    ASSERT_EQ(resp.container_responses_size(), 2);
    for (const pb::ContainerAllocateResponse &c : resp.container_responses()) {
        ASSERT_EQ(c.cdi_devices_size(), 1);
        EXPECT_EQ(c.cdi_devices(0).name(), "ibv-extend.io/nda=broker");
        EXPECT_EQ(c.mounts_size(), 0);
        EXPECT_EQ(c.envs_size(), 0);
    }
    EXPECT_TRUE(fs::exists(cdiSpecPath()));
}

// The container, built from an Allocate answer by ibvx-k8s-runtime (container_runtime.cpp).
class ContainerTest : public DevicePluginTest {
  protected:
    std::vector<std::string> runtimeArgs(const pb::ContainerAllocateResponse &c) {
        std::vector<std::string> argv = {buildDir() + "/tests/integration/k8s/ibvx-k8s-runtime", "--uid",
                                         "65534"};
        for (const pb::Mount &m : c.mounts()) {
            argv.insert(argv.end(), {"--mount", m.host_path() + ":" + m.container_path() +
                                                    (m.read_only() ? ":ro" : ":rw")});
        }
        for (const auto &[k, v] : c.envs()) {
            argv.insert(argv.end(), {"--env", k + "=" + v});
        }
        return argv;
    }

    // A broker as an operator starts it for unprivileged tenants (socket_mode 0666, a socket
    // directory the tenant can enter), the kubelet and the plugin; *base: the runtime's command
    // line for the container the plugin's answer to Allocate(nda-0) describes.
    void allocateContainer(std::vector<std::string> *base) {
        broker_ = std::make_unique<BrokerProcess>(std::string(kBrokerConfig));
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ::chmod(broker_->dir().c_str(), 0755);
        startKubelet();
        std::vector<std::string> args = {"--kubelet-dir",   kubeletDir(),          "--socket",
                                         broker_->socket(), "--devices",           std::to_string(kDevices),
                                         "--cdi-spec-dir",  dir_ + "/cdi",         "--client-lib-dir",
                                         dir_ + "/libs",    "--device-marker-dir", markerDir()};
        plugin_ = std::make_unique<PluginProcess>(args, dir_ + "/plugin.log");
        ASSERT_TRUE(waitHealth("Healthy")) << plugin_->log();
        pb::AllocateResponse resp;
        ASSERT_TRUE(kubelet_->allocate({{"nda-0"}}, &resp).ok());
        *base = runtimeArgs(resp.container_responses(0));
    }
};

TEST_F(ContainerTest, SocketInAReadOnlyBindMountStillConnects) {
    UniqueFd listener = listenAt(dir_ + "/run/t.sock");
    ASSERT_TRUE(listener);
    ProcessResult r =
        runProcess({buildDir() + "/tests/integration/k8s/ibvx-k8s-runtime", "--uid", "65534", "--mount",
                    dir_ + "/run:/run/ibv-extend:ro", "--", "@connect", "/run/ibv-extend/t.sock"});
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("connected"), std::string::npos) << r.out << r.err;
    EXPECT_NE(r.out.find("write=" + std::to_string(EROFS)), std::string::npos) << r.out;
}

TEST_F(ContainerTest, AllocatedContainerReachesTheBroker) {
    std::vector<std::string> base;
    allocateContainer(&base);
    if (HasFatalFailure()) {
        return;
    }

    // The environment inside is the answer's and nothing else.
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), {"--", "/usr/bin/env"});
    ProcessResult env = runProcess(argv);
    ASSERT_EQ(env.exit_code, 0) << env.err;
    std::set<std::string> inside;
    for (size_t at = 0, nl; (nl = env.out.find('\n', at)) != std::string::npos; at = nl + 1) {
        inside.insert(env.out.substr(at, nl - at));
    }
    EXPECT_EQ(inside, (std::set<std::string>{
                          "IBV_EXTEND_MODE=broker", "IBV_EXTEND_SOCKET=/run/ibv-extend/b.sock",
                          "IBV_EXTEND_PROVIDER_DIR=/opt/ibv-extend/lib/ibv_extend",
                          "LD_LIBRARY_PATH=/opt/ibv-extend/lib/ibv_extend/verbs:/opt/ibv-extend/lib"}));
    std::printf("injected environment:\n%s", env.out.c_str());

    // A program of the "image" using libibv_extend.so from the injected path only (the build
    // tree is not inside).
    argv = base;
    argv.insert(argv.end(),
                {"--mount", buildDir() + "/tests/integration/client/ibvx-mode-probe:/opt/app/probe:ro", "--",
                 "/opt/app/probe", "softnda0"});
    ProcessResult probe = runProcess(argv);
    EXPECT_EQ(probe.exit_code, 0) << probe.out << probe.err;
    EXPECT_EQ(probe.out, "broker\nopen=ok\n") << probe.err << broker_->log();

    // Debian's own ibv_devinfo, unmodified, finds the broker's device through the face. (In an
    // ASan build the uninstrumented program needs the ASan runtime first to load our libraries:
    // the test adds it, from the image's /usr; the Allocate answer is unchanged.)
    argv = base;
    if (std::string(IBVX_SANITIZER_PRELOAD).size() != 0) {
        argv.insert(argv.end(),
                    {"--env", "LD_PRELOAD=" IBVX_SANITIZER_PRELOAD, "--env", "ASAN_OPTIONS=detect_leaks=0"});
    }
    argv.insert(argv.end(), {"--", "/usr/bin/ibv_devinfo"});
    ProcessResult devinfo = runProcess(argv);
    EXPECT_EQ(devinfo.exit_code, 0) << devinfo.out << devinfo.err;
    EXPECT_NE(devinfo.out.find("softnda0"), std::string::npos) << devinfo.out << devinfo.err;
    std::printf("ibv_devinfo inside:\n%s\nthe plugin's log:\n%s", devinfo.out.c_str(),
                plugin_->log().c_str());

    // The broker's discovery tree is the container's /dev/infiniband and /sys/class/infiniband
    // (docs/kubernetes.md), agreeing with the face; the host's /dev is left as it was.
    const bool host_dev = fs::exists("/dev/infiniband");
    argv = base;
    argv.insert(argv.end(),
                {"--", "/bin/sh", "-c",
                 "stat -c %F /dev/infiniband/uverbs0; cat /sys/class/infiniband/softnda0/node_guid"
                 " /sys/class/infiniband/softnda0/ports/1/state /sys/class/infiniband_verbs/uverbs0/ibdev"});
    ProcessResult tree = runProcess(argv);
    EXPECT_EQ(tree.exit_code, 0) << tree.out << tree.err;
    EXPECT_THAT(tree.out,
                ::testing::ContainsRegex(
                    "^character special file\n02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0000\n4: ACTIVE\nsoftnda0\n$"))
        << tree.err;
    const std::string guid = tree.out.substr(tree.out.find('\n') + 1, 19);
    EXPECT_NE(devinfo.out.find("node_guid:\t\t\t" + guid), std::string::npos) << devinfo.out;
    EXPECT_EQ(fs::exists("/dev/infiniband"), host_dev);
}

// UCX as ucx_test.cpp runs it, inside containers built from the Allocate answer alone: the
// discovery tree the plugin mounts is the /dev/infiniband and /sys/class/infiniband UCX reads,
// with no sandbox and no UCX_TLS. ucx_info lists the device with rc_verbs, and ucx_perftest's
// put_lat runs between two such containers (two runtime instances of the answer, as two pods
// given one device each would be) over rc_verbs through the broker.
TEST_F(ContainerTest, UcxInAllocatedContainersFindsTheDeviceAndMovesData) {
    if (std::string(IBVX_SANITIZER_PRELOAD).size() != 0) {
        GTEST_SKIP() << "a sanitizer build: Debian's uninstrumented UCX cannot load the instrumented face";
    }
    if (!fs::exists("/usr/bin/ucx_info") || !fs::exists("/usr/bin/ucx_perftest")) {
        GTEST_SKIP() << "ucx-utils is not installed (scripts/install-deps.sh)";
    }
    std::vector<std::string> base;
    allocateContainer(&base);
    if (HasFatalFailure()) {
        return;
    }
    auto inside = [&](std::vector<std::string> command) {
        std::vector<std::string> argv = base;
        argv.push_back("--");
        argv.insert(argv.end(), command.begin(), command.end());
        return runProcess(argv, {.env = {}, .uid = -1, .timeout_ms = 60000});
    };
    ProcessResult info = inside({"/usr/bin/ucx_info", "-d"});
    EXPECT_EQ(info.exit_code, 0) << info.err;
    EXPECT_THAT(info.out, ::testing::HasSubstr("Device: softnda0:1")) << info.err;
    EXPECT_THAT(info.out, ::testing::HasSubstr("Transport: rc_verbs"));

    const int port = freePort();
    ASSERT_GT(port, 0);
    const std::vector<std::string> device = {"-p",      std::to_string(port), "-d", "softnda0:1", "-x",
                                             "rc_verbs"};
    auto server = std::async(std::launch::async, [&] {
        std::vector<std::string> command = {"/usr/bin/ucx_perftest"};
        command.insert(command.end(), device.begin(), device.end());
        return inside(command);
    });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!listening(port) && std::chrono::steady_clock::now() < deadline &&
           server.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    }
    std::vector<std::string> client = {"/usr/bin/ucx_perftest", "127.0.0.1"};
    client.insert(client.end(), device.begin(), device.end());
    client.insert(client.end(), {"-t", "put_lat", "-n", "1000"});
    ProcessResult c = inside(client);
    ProcessResult srv = server.get();
    EXPECT_EQ(c.exit_code, 0) << c.out << c.err << broker_->log();
    EXPECT_EQ(srv.exit_code, 0) << srv.out << srv.err;
    EXPECT_THAT(c.out, ::testing::HasSubstr("Final:"));
}

}  // namespace
}  // namespace ibvx::test
