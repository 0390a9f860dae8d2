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
        return runProcess({std::string(build != nullptr ? build : ".") + "/daemon/ibv-extendd", "--foreground",
                           "--socket", dir_ + "/b.sock", "--config", config_},
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

// A driver [drivers] names that does not load stops the start (and --check-config) instead of a
// broker serving without it.
TEST_F(StartupConfig, ADriverThatDoesNotLoadIsAConfigurationError) {
    ProcessResult r = start("[drivers]\nnames = [\n  \"nosuch\",\n]\n");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find(config_ + ":3: drivers.names: cannot load extension driver 'nosuch': "),
              std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("serving on"), std::string::npos) << r.err;
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
    EXPECT_NE(r.err.find(config_ + ":2: broker.socket_group: the socket's group 'ibvx-no-such-group' does not exist on this host"),
              std::string::npos)
        << r.err;
}

}  // namespace
}  // namespace ibvx::test
