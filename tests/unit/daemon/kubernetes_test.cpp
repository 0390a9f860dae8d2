// Pod identity pieces without a kubelet: the device marker read from mountinfo, the [kubernetes]
// configuration, namespace quota accounts and policy classes by namespace.
#include <gtest/gtest.h>

#include "daemon/app/config.h"
#include "daemon/core/identity.h"
#include "daemon/core/policy.h"
#include "daemon/core/quota.h"

namespace ibvx::daemon {
namespace {

const char *kMountinfo =
    "612 540 0:55 / / ro,relatime - overlay overlay rw\n"
    "640 612 0:26 /ibv-extend /run/ibv-extend ro,nosuid,nodev - tmpfs tmpfs rw\n"
    "641 612 0:26 /ibv-extend-devices/nda-7 /run/ibv-extend-device ro,nosuid,nodev - tmpfs tmpfs rw\n";

TEST(DeviceMarker, TheMountOnTheMarkerPathNamesTheDevice) {
    EXPECT_EQ(deviceMarkerFromMountinfo(kMountinfo), "nda-7");
}

TEST(DeviceMarker, NoneOrSeveralMarkersNameNoDevice) {
    EXPECT_EQ(deviceMarkerFromMountinfo("612 540 0:55 / / rw - overlay overlay rw\n"), "");
    // A second marker stacked over the first (a process in a user namespace could): ambiguous.
    std::string stacked =
        std::string(kMountinfo) +
        "700 641 0:26 /ibv-extend-devices/nda-1 /run/ibv-extend-device ro - tmpfs tmpfs rw\n";
    EXPECT_EQ(deviceMarkerFromMountinfo(stacked), "");
    // Escaped bytes (\040 is a space) are never one of our device IDs.
    EXPECT_EQ(
        deviceMarkerFromMountinfo("641 612 0:26 /x/nda\\0407 /run/ibv-extend-device ro - tmpfs tmpfs rw\n"),
        "");
    EXPECT_EQ(deviceMarkerFromMountinfo("garbage\n\n641 612\n"), "");
}

TEST(KubernetesConfig, SocketAndResource) {
    DaemonConfig c;
    Status st = parseConfig(
        "[kubernetes]\npod_resources_socket = \"/var/lib/kubelet/pod-resources/kubelet.sock\"\n"
        "resource = \"example.com/nda\"\n[quotas.namespace.team-a]\nsessions = 2\n"
        "[policy.class.npu]\nnamespaces = [\"team-a\", \"team-b\"]\ndevices = [\"*\"]\n",
        "t.toml", &c);
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_EQ(c.kubernetes.pod_resources_socket, "/var/lib/kubelet/pod-resources/kubelet.sock");
    EXPECT_EQ(c.kubernetes.resource, "example.com/nda");
    ASSERT_EQ(c.quotas.namespaces.count("team-a"), 1u);
    EXPECT_EQ(c.quotas.namespaces["team-a"].max[static_cast<size_t>(Quota::kSessions)], 2u);
    ASSERT_EQ(c.policy.classes.size(), 1u);
    EXPECT_EQ(c.policy.classes[0].namespaces, (std::vector<std::string>{"team-a", "team-b"}));
}

TEST(KubernetesConfig, BadValuesNameTheKey) {
    for (const char *text :
         {"[kubernetes]\npod_resources_socket = \"relative.sock\"\n", "[kubernetes]\nresource = \"nda\"\n",
          "[kubernetes]\npod_resource_socket = \"/x\"\n", "[policy.class.a]\nnamespace = \"\"\n"}) {
        DaemonConfig c;
        Status st = parseConfig(text, "t.toml", &c);
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << text;
        EXPECT_NE(st.message().find("t.toml:"), std::string::npos) << st.message();
    }
}

TEST(NamespaceQuota, OneAccountForTheNamespaceAcrossUidsAndContainers) {
    QuotaConfig cfg;
    cfg.namespaces["team-a"].max[static_cast<size_t>(Quota::kQps)] = 2;
    QuotaManager q(cfg);
    auto a = q.reserve(TenantKey{1000, "c1", "team-a"}, {{Quota::kQps, 1}});
    ASSERT_TRUE(a.isOk());
    auto b = q.reserve(TenantKey{1001, "c2", "team-a"}, {{Quota::kQps, 1}});
    ASSERT_TRUE(b.isOk());
    auto c = q.reserve(TenantKey{1002, "c3", "team-a"}, {{Quota::kQps, 1}});
    ASSERT_EQ(c.status().code(), Code::kResourceExhausted);
    EXPECT_NE(c.status().message().find("namespace team-a"), std::string::npos) << c.status().message();
    // Another namespace, and no namespace at all, are not limited by it (nor by a default).
    EXPECT_TRUE(q.reserve(TenantKey{1002, "c3", "team-b"}, {{Quota::kQps, 5}}).isOk());
    EXPECT_TRUE(q.reserve(TenantKey{1002, "c3"}, {{Quota::kQps, 5}}).isOk());
    EXPECT_EQ(q.snapshot().namespaces.at("team-a").used[static_cast<size_t>(Quota::kQps)], 2u);
    a->release();
    EXPECT_TRUE(q.reserve(TenantKey{1002, "c3", "team-a"}, {{Quota::kQps, 1}}).isOk());
}

TEST(NamespacePolicy, AClassAdmitsItsNamespacesPods) {
    PolicyConfig cfg;
    cfg.enabled = true;
    TenantClass npu;
    npu.name = "npu";
    npu.namespaces = {"team-a"};
    npu.devices = {"softnda0"};
    cfg.classes.push_back(npu);
    Policy p(cfg);
    PeerIdentity in;
    in.creds = {10, 1000, 1000};
    in.pod_namespace = "team-a";
    PeerIdentity out = in;
    out.pod_namespace = "team-b";
    PeerIdentity none = in;
    none.pod_namespace.clear();
    EXPECT_TRUE(p.admitConnect(in).isOk());
    EXPECT_TRUE(p.admitDevice(in, "softnda0").isOk());
    EXPECT_EQ(p.admitConnect(out).code(), Code::kPermissionDenied);
    EXPECT_EQ(p.admitConnect(none).code(), Code::kPermissionDenied);
}

}  // namespace
}  // namespace ibvx::daemon
