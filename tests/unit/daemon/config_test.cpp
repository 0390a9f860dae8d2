// The daemon's TOML configuration: what is accepted, and that every error names key and line.
#include "daemon/app/config.h"

#include <gtest/gtest.h>

namespace ibvx::daemon {
namespace {

TEST(DaemonConfig, FullFileIsParsed) {
    DaemonConfig c;
    Status st = parseConfig(R"([broker]
socket = "/tmp/x.sock"
socket_mode = "0660"
socket_group = "wheel"
log_level = "debug"
attach_timeout_ms = 1500
handshake_timeout_ms = 250

[drivers]
names = ["mlx5", "/opt/lib/libfoo.so"]

[softnda]
devices = 2
max_qp = 128
)",
                            "t.toml", &c);
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(c.socket, "/tmp/x.sock");
    ASSERT_TRUE(c.socket_mode.has_value());
    EXPECT_EQ(*c.socket_mode, 0660u);
    EXPECT_EQ(c.socket_group, "wheel");
    EXPECT_EQ(c.log_level, "debug");
    EXPECT_EQ(c.attach_timeout_ms, 1500u);
    EXPECT_EQ(c.handshake_timeout_ms, 250u);
    EXPECT_EQ(c.drivers, (std::vector<std::string>{"mlx5", "/opt/lib/libfoo.so"}));
    ASSERT_EQ(c.provider_options.size(), 2u);
    EXPECT_EQ(c.provider_options[0].provider, "softnda");
    EXPECT_EQ(c.provider_options[0].key, "devices");
    EXPECT_EQ(c.provider_options[0].value, "2");
    EXPECT_EQ(c.provider_options[1].where, "t.toml:14");
}

// A list of names (softnda's netdev) reaches the provider as the comma-separated string it takes.
TEST(DaemonConfig, ProviderListsBecomeCommaSeparated) {
    DaemonConfig c;
    Status st = parseConfig("[softnda]\nnetdev = [\"veth0\", \"veth1\"]\n", "t.toml", &c);
    ASSERT_TRUE(st.isOk()) << st.toString();
    ASSERT_EQ(c.provider_options.size(), 1u);
    EXPECT_EQ(c.provider_options[0].key, "netdev");
    EXPECT_EQ(c.provider_options[0].value, "veth0,veth1");
}

TEST(DaemonConfig, ErrorsNameKeyAndLine) {
    struct Case {
        const char *text;
        const char *expect;
    } cases[] = {
        {"[broker]\nsocket = \"/a\"\nbogus = 1\n", "t.toml:3: unknown key 'broker.bogus'"},
        {"[broker]\nsocket_mode = \"0999\"\n", "t.toml:2"},
        {"[broker]\nlog_level = \"loud\"\n", "broker.log_level"},
        {"[broker]\nattach_timeout_ms = 0\n", "broker.attach_timeout_ms"},
        {"[broker]\nsocket = 5\n", "broker.socket must be a string"},
        {"[drivers]\nnames = \"mlx5\"\n", "drivers.names must be an array"},
        {"[drivers]\nlist = []\n", "unknown key 'drivers.list'"},
        {"top = 1\n", "t.toml:1: unknown top-level key 'top'"},
        {"[softnda]\nmax_qp = 1.5\n", "softnda.max_qp"},
        {"[softnda]\nnetdev = [\"a\", 1]\n", "t.toml:2: softnda.netdev must list non-empty names"},
        {"[softnda]\nnetdev = [\"a,b\"]\n", "softnda.netdev must list non-empty names without commas"},
        {"[broker\n", "t.toml:1"},
        {"[broker]\nattach_timeout_ms = 1e300\n", "broker.attach_timeout_ms must be an integer"},
        {"[broker]\nsocket_mode = 1e300\n", "broker.socket_mode"},
        {"[broker]\n# caf\xc3\xa9\n", "t.toml:2: the configuration must be ASCII"},
        {"\xcc\xaa", "must be ASCII"},
    };
    for (const Case &c : cases) {
        DaemonConfig cfg;
        Status st = parseConfig(c.text, "t.toml", &cfg);
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.text;
        EXPECT_NE(st.message().find(c.expect), std::string::npos)
            << st.message() << " / wanted: " << c.expect;
    }
}

TEST(DaemonConfig, MissingFileIsNotFound) {
    DaemonConfig c;
    EXPECT_EQ(loadConfigFile("/nonexistent/ibv-extendd.toml", &c).code(), Code::kNotFound);
}

}  // namespace
}  // namespace ibvx::daemon
