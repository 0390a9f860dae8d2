// ibv-extendd refuses to start on a configuration error, exit 2, and its message names the
// file, the line and the key: what an operator reads in `systemctl status` after a typo.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "run_process.h"

namespace ibvx::test {
namespace {

class StartupConfig : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        config_ = dir_ + "/ibv-extendd.toml";
    }
    void TearDown() override {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
    // Starts the broker on config text; a broker that starts is stopped by the timeout.
    ProcessResult start(const std::string &text) {
        std::ofstream(config_) << text;
        const char *build = std::getenv("IBVX_BUILD_DIR");
        RunOptions o;
        o.timeout_ms = 10000;
        return runProcess({std::string(build != nullptr ? build : ".") + "/daemon/ibv-extendd",
                           "--foreground", "--socket", dir_ + "/b.sock", "--config", config_},
                          o);
    }
    std::string dir_, config_;
};

TEST_F(StartupConfig, AnUnknownSoftndaOptionIsAConfigurationError) {
    for (const char *text : {"[softnda]\nnames = [\"nosuch\"]\n", "[softnda]\nnames = \"nosuch\"\n"}) {
        ProcessResult r = start(text);
        EXPECT_EQ(r.exit_code, 2) << text << r.err;
        EXPECT_NE(r.err.find(config_ + ":2: softnda.names"), std::string::npos) << r.err;
    }
}

// --check-config judges the file as a start would, without starting: a typo is exit 2 naming
// file, line and key; a driver that does not load is a warning (a start logs it and serves on).
TEST_F(StartupConfig, CheckConfigSaysWhatAStartWouldRefuse) {
    const char *build = std::getenv("IBVX_BUILD_DIR");
    std::string daemon = std::string(build != nullptr ? build : ".") + "/daemon/ibv-extendd";
    std::ofstream(config_) << "[broker]\nsocket_mode = 0660\n";
    ProcessResult bad = runProcess({daemon, "--check-config", config_}, RunOptions{});
    EXPECT_EQ(bad.exit_code, 2) << bad.err;
    EXPECT_NE(bad.err.find(config_ + ":2: broker.socket_mode: "), std::string::npos) << bad.err;

    std::ofstream(config_) << "[broker]\nsocket_mode = \"0660\"\n[drivers]\nnames = [\"nosuch\"]\n";
    ProcessResult good = runProcess({daemon, "--config", config_, "--check-config"}, RunOptions{});
    EXPECT_EQ(good.exit_code, 0) << good.err;
    EXPECT_NE(good.out.find(config_ + ": configuration OK"), std::string::npos) << good.out;
    EXPECT_NE(good.err.find("cannot load extension driver 'nosuch'"), std::string::npos) << good.err;
    EXPECT_EQ(good.err.find("serving on"), std::string::npos)
        << "--check-config must not start: " << good.err;
}

TEST_F(StartupConfig, AnUnquotedSocketModeNamesTheKeyAndTheFix) {
    ProcessResult r = start("[broker]\nsocket_mode = 0660\n");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(config_ + ":2: broker.socket_mode: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("socket_mode = \"0660\""), std::string::npos) << r.err;
}

TEST_F(StartupConfig, AnUnknownSocketGroupNamesFileLineAndKey) {
    ProcessResult r = start("[broker]\nsocket_group = \"ibvx-no-such-group\"\n");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(
        r.err.find(
            config_ +
            ":2: broker.socket_group: the socket's group 'ibvx-no-such-group' does not exist on this host"),
        std::string::npos)
        << r.err;
}

}  // namespace
}  // namespace ibvx::test
