// Tenant identity from the kernel (cgroup classification, SO_PEERCRED + /proc at connect time)
// and the [policy] rules and their config syntax.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fd_channel.h"
#include "daemon/app/config.h"
#include "daemon/core/identity.h"
#include "daemon/core/policy.h"

namespace ibvx::daemon {
namespace {

const std::string kId64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

struct CgroupCase {
    std::string path, runtime, id;
};

TEST(ClassifyCgroup, KnownRuntimes) {
    const CgroupCase cases[] = {
        // docker: systemd and cgroupfs drivers
        {"/system.slice/docker-" + kId64 + ".scope", "docker", kId64},
        {"/docker/" + kId64, "docker", kId64},
        // containerd under kubernetes (systemd driver) and cri-o
        {"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice/cri-containerd-" +
             kId64 + ".scope",
         "containerd", kId64},
        {"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab.slice/crio-" + kId64 + ".scope",
         "cri-o", kId64},
        // kubernetes with the cgroupfs driver: the id under the pod's cgroup
        {"/kubepods/burstable/pod0f1e2d3c-aaaa-bbbb-cccc-000000000000/" + kId64, "kubernetes", kId64},
        // podman rootless/rootful, including the nested "container" cgroup; conmon is not it
        {"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-" + kId64 + ".scope", "podman",
         kId64},
        {"/machine.slice/libpod-" + kId64 + ".scope/container", "podman", kId64},
        {"/machine.slice/libpod-conmon-" + kId64 + ".scope", "systemd-scope",
         "libpod-conmon-" + kId64 + ".scope"},
        {"/libpod_parent/" + kId64, "podman", kId64},
        // docker short ids (12 hex) still count
        {"/docker/0123456789ab", "docker", "0123456789ab"},
        // systemd units
        {"/user.slice/user-1000.slice/session-3.scope", "systemd-scope", "session-3.scope"},
        {"/system.slice/sshd.service", "systemd-service", "sshd.service"},
        {"/user.slice", "systemd-slice", "user.slice"},
        // unknown: verbatim
        {"/", "", "/"},
        {"/my/own/group", "", "/my/own/group"},
        {"", "", ""},
        // too short or not hex: not a container id
        {"/docker/abc", "", "/docker/abc"},
        {"/system.slice/docker-xyz.scope", "systemd-scope", "docker-xyz.scope"},
    };
    for (const CgroupCase &c : cases) {
        CgroupOwner o = classifyCgroup(c.path);
        EXPECT_EQ(o.runtime, c.runtime) << c.path;
        EXPECT_EQ(o.id, c.id) << c.path;
        EXPECT_EQ(containerIdFromCgroup(c.path), o.container() ? c.id : "") << c.path;
    }
}

TEST(PeerIdentity, ReadsTheKernelsViewOfThePeer) {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    auto id = peerIdentity(sv[0]);
    ASSERT_TRUE(id.isOk()) << id.status().toString();
    EXPECT_EQ(id->creds.pid, getpid());
    EXPECT_EQ(id->creds.uid, getuid());
    EXPECT_EQ(id->creds.gid, getgid());
    EXPECT_EQ(id->cgroup, readCgroup(getpid()));
    EXPECT_FALSE(id->cgroup.empty());
    EXPECT_EQ(id->groups, readGroups(getpid()));
    ::close(sv[0]);
    ::close(sv[1]);
}

TEST(PeerIdentity, APeerThatExitedIsNotIdentified) {
    // SO_PEERCRED records the pid at connect time; once that process is gone its pid may be
    // reused, so /proc must not be trusted for it.
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int lsock[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, lsock), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        // A socket pair made by the child carries the child's credentials.
        int pair[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0) {
            _exit(1);
        }
        char c = 0;
        _exit(ibvx::sendmsgWithFds(lsock[1], &c, 1, {&pair[0], 1}, 0) == 1 ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_EQ(WEXITSTATUS(status), 0);
    char c;
    msghdr msg{};
    iovec iov{&c, 1};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))];
    msg.msg_control = buf;
    msg.msg_controllen = sizeof(buf);
    ASSERT_EQ(::recvmsg(lsock[0], &msg, 0), 1);
    int fd = -1;
    memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(int));
    auto creds = peerCredentials(fd);
    ASSERT_TRUE(creds.isOk());
    EXPECT_EQ(creds->pid, child);
    auto id = peerIdentity(fd);
    EXPECT_EQ(id.status().code(), Code::kUnavailable) << id.status().toString();
    for (int f : {fd, sv[0], sv[1], lsock[0], lsock[1]}) {
        ::close(f);
    }
}

PeerIdentity peer(uid_t uid, gid_t gid, std::vector<gid_t> groups = {}) {
    PeerIdentity p;
    p.creds = {1234, uid, gid};
    p.groups = std::move(groups);
    return p;
}

TEST(Policy, WithoutASectionEverythingIsAllowed) {
    Policy p;
    EXPECT_TRUE(p.admitConnect(peer(65534, 65534)).isOk());
    EXPECT_TRUE(p.admitDevice(peer(65534, 65534), "softnda0").isOk());
}

TEST(Policy, DenyByDefaultAndNameTheRule) {
    PolicyConfig c;
    c.enabled = true;
    Policy p(c);
    Status st = p.admitConnect(peer(0, 0));
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    EXPECT_NE(st.message().find("policy.allow_uids"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("uid 0"), std::string::npos) << st.message();
}

TEST(Policy, UidsGidsSupplementaryGroupsAndClasses) {
    PolicyConfig c;
    c.enabled = true;
    c.allow_uids = {1000};
    c.allow_gids = {500};
    c.default_devices = {"softnda0"};
    c.classes.push_back({"trainers", {2000}, {600}, {"softnda1", "mlx5_0"}});
    c.classes.push_back({"ops", {3000}, {}, {"*"}});
    Policy p(c);
    EXPECT_TRUE(p.admitConnect(peer(1000, 1)).isOk());
    EXPECT_TRUE(p.admitConnect(peer(7, 500)).isOk());
    EXPECT_TRUE(p.admitConnect(peer(7, 1, {3, 500})).isOk());  // supplementary
    EXPECT_TRUE(p.admitConnect(peer(2000, 1)).isOk());         // a class admits too
    EXPECT_TRUE(p.admitConnect(peer(8, 1, {600})).isOk());
    EXPECT_EQ(p.admitConnect(peer(7, 1, {3, 4})).code(), Code::kPermissionDenied);

    // Devices: the class decides, else default_devices.
    EXPECT_TRUE(p.admitDevice(peer(1000, 1), "softnda0").isOk());
    Status st = p.admitDevice(peer(1000, 1), "softnda1");
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    EXPECT_NE(st.message().find("policy.default_devices"), std::string::npos) << st.message();
    EXPECT_TRUE(p.admitDevice(peer(2000, 1), "softnda1").isOk());
    st = p.admitDevice(peer(2000, 1), "softnda0");
    EXPECT_EQ(st.code(), Code::kPermissionDenied);
    EXPECT_NE(st.message().find("policy.class.trainers.devices"), std::string::npos) << st.message();
    EXPECT_TRUE(p.admitDevice(peer(3000, 1), "anything").isOk());
    ASSERT_NE(p.classOf(peer(8, 1, {600})), nullptr);
    EXPECT_EQ(p.classOf(peer(8, 1, {600}))->name, "trainers");
    EXPECT_EQ(p.classOf(peer(1000, 1)), nullptr);
}

TEST(PolicyConfigFile, ParsesPolicyAndQuotas) {
    const char *text = R"(
[policy]
allow_uids = [1000, "root"]
allow_gids = [0]
default_devices = ["softnda0"]
admin_group = "root"

[policy.class.trainers]
uids = [2000]
gids = ["root"]
devices = ["*"]

[quotas]
qps = 4
mr_bytes = 1048576
sessions = 2

[quotas.uid.1000]
qps = 8
sessions = 0

[quotas.container.0123456789ab]
cqs = 3
)";
    DaemonConfig cfg;
    Status st = parseConfig(text, "t.toml", &cfg);
    ASSERT_TRUE(st.isOk()) << st.toString();
    EXPECT_TRUE(cfg.policy.enabled);
    EXPECT_EQ(cfg.policy.allow_uids, (std::vector<uid_t>{1000, 0}));
    EXPECT_EQ(cfg.policy.allow_gids, (std::vector<gid_t>{0}));
    EXPECT_EQ(cfg.policy.default_devices, (std::vector<std::string>{"softnda0"}));
    EXPECT_EQ(cfg.admin_group, "root");
    ASSERT_EQ(cfg.policy.classes.size(), 1u);
    EXPECT_EQ(cfg.policy.classes[0].name, "trainers");
    EXPECT_EQ(cfg.policy.classes[0].gids, (std::vector<gid_t>{0}));
    EXPECT_EQ(cfg.quotas.defaults[static_cast<size_t>(Quota::kQps)], 4u);
    EXPECT_EQ(cfg.quotas.defaults[static_cast<size_t>(Quota::kMrBytes)], 1048576u);
    EXPECT_EQ(cfg.quotas.defaults[static_cast<size_t>(Quota::kCqs)], kUnlimited);
    ASSERT_EQ(cfg.quotas.uids.count(1000), 1u);
    EXPECT_EQ(cfg.quotas.uids[1000].max[static_cast<size_t>(Quota::kQps)], 8u);
    EXPECT_EQ(cfg.quotas.uids[1000].max[static_cast<size_t>(Quota::kSessions)], 0u);
    EXPECT_FALSE(cfg.quotas.uids[1000].max[static_cast<size_t>(Quota::kCqs)].has_value());
    EXPECT_EQ(cfg.quotas.containers["0123456789ab"].max[static_cast<size_t>(Quota::kCqs)], 3u);

    DaemonConfig none;
    ASSERT_TRUE(parseConfig("[broker]\n", "t.toml", &none).isOk());
    EXPECT_FALSE(none.policy.enabled);
    DaemonConfig empty;
    ASSERT_TRUE(parseConfig("[policy]\n", "t.toml", &empty).isOk());
    EXPECT_TRUE(empty.policy.enabled);  // an empty section denies everyone
}

TEST(PolicyConfigFile, RejectsMistakesWithTheKeyAndLine) {
    struct Bad {
        const char *text, *needle;
    } cases[] = {
        {"[policy]\nallow_uid = [1]\n", "t.toml:2: unknown key 'policy.allow_uid'"},
        {"[policy]\nallow_uids = 1\n", "policy.allow_uids must be an array"},
        {"[policy]\nallow_uids = [-1]\n", "out of range"},
        {"[policy]\nallow_gids = [\"no-such-group-ibvx\"]\n", "no group named"},
        {"[policy]\nallow_uids = [\"no-such-user-ibvx\"]\n", "no user named"},
        {"[policy.class.x]\ndevice = [\"a\"]\n", "unknown key 'policy.class.x.device'"},
        {"[broker]\nadmin_group = \"a\"\n[policy]\nadmin_group = \"b\"\n", "differs"},
        {"[quotas]\nqp = 1\n", "unknown quota 'quotas.qp'"},
        {"[quotas]\nqps = -1\n", "quotas.qps must be an integer >= 0"},
        {"[quotas]\nqps = 1.5\n", "quotas.qps must be an integer >= 0"},
        {"[quotas.uid.alice]\nqps = 1\n", "numeric uid"},
        {"[quotas.uid.99999999999]\nqps = 1\n", "numeric uid"},
        {"[quotas.container.abc]\nqpz = 1\n", "unknown quota 'quotas.container.abc.qpz'"},
    };
    for (const Bad &b : cases) {
        DaemonConfig cfg;
        Status st = parseConfig(b.text, "t.toml", &cfg);
        EXPECT_EQ(st.code(), Code::kInvalidArgument) << b.text;
        EXPECT_NE(st.message().find(b.needle), std::string::npos) << b.text << " -> " << st.message();
    }
}

}  // namespace
}  // namespace ibvx::daemon
