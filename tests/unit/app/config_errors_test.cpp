// Configuration errors an operator meets first, each naming file, line and key: a TOML syntax
// error (socket_mode = 0660 as chmod spells it), and a group this host does not have.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "daemon/app/config.h"

namespace ibvx::daemon {
namespace {

std::string parseError(const std::string &text) {
    DaemonConfig c;
    Status st = parseConfig(text, "t.toml", &c);
    EXPECT_FALSE(st.isOk()) << text;
    return st.message();
}

TEST(ConfigSyntaxErrors, UnquotedSocketModeNamesTheKeyAndHowToWriteIt) {
    std::string msg = parseError("[broker]\nsocket = \"/tmp/x.sock\"\nsocket_mode = 0660\n");
    EXPECT_EQ(msg.rfind("t.toml:3: broker.socket_mode: ", 0), 0u) << msg;
    EXPECT_NE(msg.find("socket_mode = \"0660\""), std::string::npos) << msg;
    // The TOML octal spelling and the string are both accepted.
    DaemonConfig c;
    ASSERT_TRUE(parseConfig("[broker]\nsocket_mode = 0o660\n", "t.toml", &c).isOk());
    EXPECT_EQ(*c.socket_mode, 0660u);
}

TEST(ConfigSyntaxErrors, TheKeyIsNamedWithItsTable) {
    EXPECT_EQ(parseError("[quotas.uid.1000]\nqps = 01\n").rfind("t.toml:2: quotas.uid.1000.qps: ", 0), 0u);
    EXPECT_EQ(parseError("# top\n[[x]] # an array of tables\nn = 0x\n").rfind("t.toml:3: x.n: ", 0), 0u);
    EXPECT_EQ(parseError("[softnda]\nmax_qp = 12 34\n").rfind("t.toml:2: softnda.max_qp: ", 0), 0u);
    // A line that sets no key (a broken header) has only its line to name.
    std::string header = parseError("[broker\n");
    EXPECT_EQ(header.rfind("t.toml:1: ", 0), 0u) << header;
    EXPECT_EQ(header.find("broker."), std::string::npos) << header;
}

class ConfigFile : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx-cfg.XXXXXX";
        ASSERT_NE(::mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        path_ = dir_ + "/ibv-extendd.toml";
    }
    void TearDown() override {
        ::unlink(path_.c_str());
        ::rmdir(dir_.c_str());
    }
    Status load(const std::string &text) {
        std::ofstream(path_) << text;
        DaemonConfig c;
        return loadConfigFile(path_, &c);
    }
    std::string dir_, path_;
};

TEST_F(ConfigFile, AnUnknownSocketGroupNamesFileLineAndKey) {
    Status st = load("[broker]\nlog_level = \"info\"\nsocket_group = \"ibvx-no-such-group\"\n");
    ASSERT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(path_ + ":3: broker.socket_group: the socket's group 'ibvx-no-such-group' "
                                         "does not exist on this host",
                                 0),
              0u)
        << st.message();
    EXPECT_NE(st.message().find("groupadd"), std::string::npos) << st.message();
}

TEST_F(ConfigFile, AnUnknownAdminGroupNamesWhereItWasSet) {
    Status broker = load("[broker]\nadmin_group = \"ibvx-no-such-group\"\n");
    EXPECT_EQ(broker.message().rfind(
                  path_ + ":2: broker.admin_group: the admin group 'ibvx-no-such-group' does not exist", 0),
              0u)
        << broker.message();
    Status policy = load("[policy]\nallow_uids = [0]\nadmin_group = \"ibvx-no-such-group\"\n");
    EXPECT_EQ(policy.message().rfind(
                  path_ + ":3: policy.admin_group: the admin group 'ibvx-no-such-group' does not exist", 0),
              0u)
        << policy.message();
}

TEST_F(ConfigFile, ExistingGroupsLoad) {
    Status st = load("[broker]\nsocket_group = \"root\"\nadmin_group = \"root\"\n");
    EXPECT_TRUE(st.isOk()) << st.toString();
}

}  // namespace
}  // namespace ibvx::daemon
