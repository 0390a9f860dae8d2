// Daemon::create() in-process: each way it refuses to start (with the code runDaemon turns into
// the exit code), what it serves when it starts, reload(), run()'s signal handling, and the
// AuditEvents the core reports through.
#include "daemon/app/daemon.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common/unix_socket.h"

namespace ibvx::daemon {
namespace {

class DaemonCreate : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx-app-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        cfg_.socket = dir_ + "/b.sock";
        cfg_.log_level = "warn";
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }

    std::string dir_;
    DaemonConfig cfg_;
};

TEST_F(DaemonCreate, ServesSoftndaAndRemovesItsSocketOnTeardown) {
    {
        auto d = Daemon::create(cfg_);
        ASSERT_TRUE(d.isOk()) << d.status().toString();
        struct stat st {};
        ASSERT_EQ(::lstat(cfg_.socket.c_str(), &st), 0);
        EXPECT_TRUE(S_ISSOCK(st.st_mode));
        EXPECT_TRUE(connectUnix(cfg_.socket).isOk());
        std::vector<std::string> names;
        for (const DeviceInfo &dev : (*d)->devices().list()) {
            names.push_back(dev.name);
        }
        EXPECT_NE(std::find(names.begin(), names.end(), "softnda0"), names.end());
    }
    EXPECT_FALSE(std::filesystem::exists(cfg_.socket));
}

TEST_F(DaemonCreate, SocketPathTooLongIsAConfigurationError) {
    cfg_.socket = dir_ + "/" + std::string(120, 'x');
    auto d = Daemon::create(cfg_);
    ASSERT_FALSE(d.isOk());
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
    EXPECT_NE(d.status().message().find("socket path must be"), std::string::npos) << d.status().message();
}

TEST_F(DaemonCreate, PathThatIsNotASocketIsRefusedAndKept) {
    std::ofstream(cfg_.socket) << "not a socket";
    auto d = Daemon::create(cfg_);
    ASSERT_FALSE(d.isOk());
    EXPECT_EQ(d.status().code(), Code::kAlreadyExists);
    EXPECT_NE(d.status().message().find("exists and is not a socket"), std::string::npos);
    EXPECT_TRUE(std::filesystem::is_regular_file(cfg_.socket));
}

TEST_F(DaemonCreate, SocketServedByAnotherBrokerIsBusy) {
    auto first = Daemon::create(cfg_);
    ASSERT_TRUE(first.isOk()) << first.status().toString();
    auto second = Daemon::create(cfg_);
    ASSERT_FALSE(second.isOk());
    EXPECT_EQ(second.status().code(), Code::kAlreadyExists);
    EXPECT_EQ(second.status().errnoValue(), EADDRINUSE);
    EXPECT_NE(second.status().message().find("another broker is serving"), std::string::npos);
    // The refused second daemon must not have removed the first one's socket.
    EXPECT_TRUE(connectUnix(cfg_.socket).isOk());
}

TEST_F(DaemonCreate, StaleSocketIsReplaced) {
    {
        UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
        auto addr = unixAddress(cfg_.socket);
        ASSERT_TRUE(addr.isOk());
        ASSERT_EQ(::bind(fd.get(), addr->get(), addr->len), 0);
    }  // bound, never listening, closed: what a broker that died leaves behind
    auto d = Daemon::create(cfg_);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    EXPECT_TRUE(connectUnix(cfg_.socket).isOk());
}

TEST_F(DaemonCreate, ProviderOptionForNoLoadedProviderIsAConfigurationError) {
    cfg_.provider_options.push_back({"nosuchprovider", "devices", "2", "t.toml:3"});
    auto d = Daemon::create(cfg_);
    ASSERT_FALSE(d.isOk());
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(d.status().message(), "t.toml:3: [nosuchprovider] names no loaded virtual-device provider");
    EXPECT_FALSE(std::filesystem::exists(cfg_.socket));
}

TEST_F(DaemonCreate, NetdevOfNoInterfaceIsAConfigurationError) {
    cfg_.provider_options.push_back({"softnda", "netdev", "ibvx-nosuch0", "t.toml:4"});
    auto d = Daemon::create(cfg_);
    ASSERT_FALSE(d.isOk());
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(d.status().message(),
              "t.toml:4: softnda.netdev = 'ibvx-nosuch0' names a network interface this "
              "host (the broker's network namespace) does not have");
}

TEST_F(DaemonCreate, UnknownAdminGroupIsAConfigurationError) {
    cfg_.config_path = "t.toml";
    cfg_.admin_group = "ibvx-no-such-group";
    auto d = Daemon::create(cfg_);
    ASSERT_FALSE(d.isOk());
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
    EXPECT_EQ(d.status().message(), "t.toml: admin_group 'ibvx-no-such-group' does not exist");
}

// A driver the configuration names but that cannot be loaded is logged, not fatal: the broker
// still serves what it has.
TEST_F(DaemonCreate, MissingDriverIsNotFatal) {
    cfg_.drivers = {"ibvx_no_such_driver"};
    auto d = Daemon::create(cfg_);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    EXPECT_GE((*d)->devices().size(), 1u);
}

TEST_F(DaemonCreate, ReloadWithoutAConfigFileRescansAndReportsTheDevices) {
    auto d = Daemon::create(cfg_);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    ReloadReport r = (*d)->reload();
    EXPECT_TRUE(r.errors.empty());
    EXPECT_EQ(r.new_devices, 0u);
    EXPECT_EQ(r.devices, (*d)->devices().size());
}

TEST_F(DaemonCreate, ReloadKeepsServingWhenTheConfigFileTurnsBad) {
    cfg_.config_path = dir_ + "/d.toml";
    std::ofstream(cfg_.config_path) << "[broker]\nlog_level = \"warn\"\n";
    auto d = Daemon::create(cfg_);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    std::ofstream(cfg_.config_path) << "[broker]\nno_such_key = 1\n";
    ReloadReport r = (*d)->reload();
    ASSERT_EQ(r.errors.size(), 1u);
    EXPECT_NE(r.errors[0].find("no_such_key"), std::string::npos) << r.errors[0];
    EXPECT_TRUE(connectUnix(cfg_.socket).isOk());
}

// Signals directed at this thread: run() reads them from its signalfd in order (SIGHUP has the
// lower number), reloads on the first and stops on the second.
TEST_F(DaemonCreate, RunReloadsOnSighupAndStopsOnSigterm) {
    auto d = Daemon::create(cfg_);
    ASSERT_TRUE(d.isOk()) << d.status().toString();
    ASSERT_EQ(pthread_kill(pthread_self(), SIGHUP), 0);
    ASSERT_EQ(pthread_kill(pthread_self(), SIGTERM), 0);
    Status st = (*d)->run();
    EXPECT_TRUE(st.isOk()) << st.toString();
    sigset_t pending;
    sigpending(&pending);
    EXPECT_FALSE(sigismember(&pending, SIGHUP));
    EXPECT_FALSE(sigismember(&pending, SIGTERM));
}

TEST(DaemonSignals, TeardownRestoresTheSignalMask) {
    char tmpl[] = "/tmp/ibvx-app-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    DaemonConfig cfg;
    cfg.socket = std::string(tmpl) + "/b.sock";
    cfg.log_level = "warn";
    sigset_t before, during, after;
    pthread_sigmask(SIG_SETMASK, nullptr, &before);
    ASSERT_FALSE(sigismember(&before, SIGHUP));
    {
        auto d = Daemon::create(cfg);
        ASSERT_TRUE(d.isOk()) << d.status().toString();
        pthread_sigmask(SIG_SETMASK, nullptr, &during);
        EXPECT_TRUE(sigismember(&during, SIGHUP));
        EXPECT_TRUE(sigismember(&during, SIGTERM));
        EXPECT_TRUE(sigismember(&during, SIGINT));
    }
    pthread_sigmask(SIG_SETMASK, nullptr, &after);
    EXPECT_FALSE(sigismember(&after, SIGHUP));
    EXPECT_FALSE(sigismember(&after, SIGTERM));
    std::filesystem::remove_all(tmpl);
}

class RecordingSink : public AdminEventSink {
  public:
    void push(const ::ibv_extend::v1::AdminEvent &event) override { events.push_back(event); }
    void close() override {}
    std::vector<::ibv_extend::v1::AdminEvent> events;
};

TEST(AuditEvents, ObjectEventsReachWatchers) {
    auto hub = std::make_shared<AdminEvents>();
    RecordingSink sink;
    uint64_t id = hub->subscribe(&sink);
    AuditEvents events(hub);
    PeerIdentity peer;
    peer.creds.pid = 4242;
    peer.creds.uid = 1001;
    Session s(7, SessionToken{}, peer, "test", UniqueFd());
    events.objectCreated(s, ObjectKind::kQp, 0x1234);
    events.objectDestroyed(s, ObjectKind::kCq, 0x99);
    hub->unsubscribe(id);
    ASSERT_EQ(sink.events.size(), 2u);
    EXPECT_EQ(sink.events[0].kind(), AdminEvents::Event::OBJECT_CREATE);
    EXPECT_EQ(sink.events[0].session(), 7u);
    EXPECT_EQ(sink.events[0].pid(), 4242u);
    EXPECT_EQ(sink.events[0].uid(), 1001u);
    EXPECT_EQ(sink.events[0].object_kind(), ::ibv_extend::v1::OBJECT_KIND_QP);
    EXPECT_EQ(sink.events[0].handle(), 0x1234u);
    EXPECT_EQ(sink.events[1].kind(), AdminEvents::Event::OBJECT_DESTROY);
    EXPECT_EQ(sink.events[1].object_kind(), ::ibv_extend::v1::OBJECT_KIND_CQ);
    EXPECT_EQ(sink.events[1].handle(), 0x99u);
}

TEST(AuditEvents, QuotaDenialReachesWatchers) {
    auto hub = std::make_shared<AdminEvents>();
    RecordingSink sink;
    uint64_t id = hub->subscribe(&sink);
    AuditEvents events(hub);
    PeerIdentity peer;
    peer.creds.pid = 77;
    peer.creds.uid = 1002;
    events.quotaDenied(peer, 0, "sessions quota of uid 1002 (2) reached");
    hub->unsubscribe(id);
    ASSERT_EQ(sink.events.size(), 1u);
    EXPECT_EQ(sink.events[0].kind(), AdminEvents::Event::QUOTA_DENIAL);
    EXPECT_EQ(sink.events[0].session(), 0u);
    EXPECT_EQ(sink.events[0].pid(), 77u);
    EXPECT_EQ(sink.events[0].uid(), 1002u);
    EXPECT_EQ(sink.events[0].message(), "sessions quota of uid 1002 (2) reached");
}

}  // namespace
}  // namespace ibvx::daemon
