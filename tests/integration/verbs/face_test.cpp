// Unmodified consumers through the libibverbs face, as a container tenant runs them: a real
// broker, ibv-extend-run, an unprivileged uid, a mount namespace in which /dev/infiniband does
// not exist (an empty tmpfs covers it where the host has one), a clean environment.
//  - hccp-consumer: the HCCP flow of shared/REFERENCE.md (dlopen + dlsym), data through
//    queue_info, and a standard-verbs QP bring-up whose broker RPCs are counted;
//  - Debian's ibv_devinfo -v;
//  - the standard data path: Debian's ibv_rc_pingpong (defaults, -g 0, -e), ibv_srq_pingpong,
//    ibv_ud_pingpong and ibv_uc_pingpong (SPEC.md §11), ibv_xsrq_pingpong (XRC, §14), perftest's seven
//    programs over RC and four over UD and UC, each pair as server and client on this host;
//  - the pyverbs programs of this directory (RC traffic, ibv_resize_cq, ibv_rereg_mr, parent
//    domains, completion timestamps, memory windows, device memory);
//  - as root, softnda's Ethernet personality (SPEC.md §19): a broker in a network namespace of
//    the test's own, bound to a veth there; ibv_devinfo -v and ibv_rc_pingpong -g by RoCEv2 GID.
// Debian's programs are not built with our sanitizers: in an ASan build the ASan runtime is
// preloaded into them (IBVX_SANITIZER_PRELOAD) so they can load the instrumented face.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "ibv_extend/v1/admin.grpc.pb.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/test_client.h"
#include "tests/integration/daemon/wait_for.h"
#include "tests/integration/verbs/tenant.h"

namespace ibvx::test {
namespace {

namespace pb = ::ibv_extend::v1;

class FaceTest : public ::testing::Test {
  protected:
    // The tenant is uid 65534: the socket and its directory must let it in.
    virtual std::string brokerConfig() const { return "[broker]\nsocket_mode = \"0666\"\n"; }

    void SetUp() override {
        broker_ = std::make_unique<BrokerProcess>(brokerConfig());
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ASSERT_EQ(chmod(broker_->dir().c_str(), 0755), 0);
        // The socket accepts from its bind on; the discovery tree comes just before serving.
        ASSERT_TRUE(waitFor([&] { return access((broker_->dir() + "/discovery").c_str(), F_OK) == 0; },
                            std::chrono::seconds(10)))
            << broker_->log();
    }

  public:
    std::vector<std::string> env() const { return tenantEnv(); }

  public:
    std::vector<std::string> run(std::initializer_list<std::string> command) const {
        std::vector<std::string> argv = {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--"};
        argv.insert(argv.end(), command);
        return argv;
    }
    std::vector<std::string> runArgs(const std::string &program, const std::vector<std::string> &args) const {
        return viaRun(broker_->socket(), program, args);
    }
    const std::string &dir() const { return broker_->dir(); }

  protected:
    uint64_t brokerCalls() const {
        pb::GetStatsResponse stats;
        EXPECT_TRUE(getStats(broker_->socket(), &stats).ok());
        return stats.total_calls();
    }
    // Objects the broker holds, by kind name, over every session.
    std::map<std::string, int> objectKinds() const {
        auto channel = grpc::CreateChannel("unix:" + broker_->socket(), grpc::InsecureChannelCredentials());
        auto admin = pb::Admin::NewStub(channel);
        grpc::ClientContext ctx;
        pb::ListObjectsRequest req;
        pb::ListObjectsResponse resp;
        EXPECT_TRUE(admin->ListObjects(&ctx, req, &resp).ok());
        std::map<std::string, int> kinds;
        for (const auto &o : resp.objects()) {
            kinds[pb::ObjectKind_Name(o.kind())]++;
        }
        return kinds;
    }

    // rdma-core's own test suite through the face (RdmaCoresOwnTestsPass below).
    void rdmaCoreSuite() {
        const std::string work = dir() + "/rdma-core";
        ASSERT_EQ(mkdir(work.c_str(), 0777), 0);
        ASSERT_EQ(chmod(work.c_str(), 0777), 0);  // the tenant (uid 65534) unpacks the suite there
        const std::string dir_ = IBVX_PYVERBS_DIR;
        std::string err = dir() + "/rdma-core.err";
        Contained c(viaRun(broker_->socket(), "/usr/bin/python3",
                           {dir_ + "/rdma_core_suite.py", "/usr/share/doc/rdma-core/tests", work, "softnda0",
                            dir_ + "/rdma_core_expected.txt"},
                           {"--sandbox=on"}),
                    env(), err);
        c.reply();
        std::string out = c.readAll();
        int rc = c.wait();
        std::string why = slurp(err);
        if (rc != 0 && why.find("bwrap cannot make the sandbox") != std::string::npos) {
            GTEST_SKIP() << why;  // a chroot whose "/" is not a mount point: no sandbox, no /sys view
        }
        if (rc == 0 && out.rfind("SKIP:", 0) == 0) {
            GTEST_SKIP() << out;  // python3-pyverbs installed without its documentation directory
        }
        std::printf("%s", out.c_str());
        EXPECT_EQ(rc, 0) << out << why;
        EXPECT_THAT(out, ::testing::EndsWith("\nOK\n")) << why;
    }

    std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(FaceTest, HccpConsumerRunsUnmodifiedAsAContainerTenant) {
    std::string err = broker_->dir() + "/consumer.err";
    Contained c(run({IBVX_HCCP_CONSUMER, "softnda0"}), env(), err);

    ASSERT_EQ(c.readLine(), "SYNC data-begin") << slurp(err);
    // Its objects are broker objects: visible to the operator while it runs.
    auto kinds = objectKinds();
    EXPECT_GE(kinds["OBJECT_KIND_QP"], 2);
    EXPECT_GE(kinds["OBJECT_KIND_CQ"], 2);
    EXPECT_GE(kinds["OBJECT_KIND_MR"], 3);
    EXPECT_GE(kinds["OBJECT_KIND_PD"], 1);
    uint64_t before = brokerCalls();
    c.reply();
    ASSERT_EQ(c.readLine(), "SYNC data-end") << slurp(err);
    uint64_t after = brokerCalls();
    // WRITE, SEND/RECV and READ went through queue_info alone: no broker call.
    EXPECT_EQ(after, before);
    c.reply();

    ASSERT_EQ(c.readLine(), "SYNC bringup-begin") << slurp(err);
    before = brokerCalls();
    c.reply();
    ASSERT_EQ(c.readLine(), "SYNC bringup-end") << slurp(err);
    after = brokerCalls();
    // CreateCq, CreateQp, and a ModifyQp for RTR (carrying the INIT answered in the tenant:
    // softnda guarantees a plain INIT, docs/verbs.md "Bring-up") and one for RTS;
    // ibv_query_qp(IBV_QP_CAP) is answered in the tenant.
    EXPECT_EQ(after - before, 4u);
    printf("standard QP bring-up (CQ, QP, query CAP, INIT, RTR, RTS): %llu broker RPCs\n",
           static_cast<unsigned long long>(after - before));
    c.reply();

    EXPECT_EQ(c.readLine(), "OK") << slurp(err);
    EXPECT_EQ(c.wait(), 0) << slurp(err);
    EXPECT_TRUE(waitFor([&] { return objectKinds().empty(); }, std::chrono::seconds(10)))
        << "the tenant's objects outlived it";
}

TEST_F(FaceTest, IbvDevinfoListsTheBrokersDeviceWithAnActivePort) {
    std::string err = broker_->dir() + "/devinfo.err";
    Contained c(run({"/usr/bin/ibv_devinfo", "-v"}), env(), err);
    c.reply();
    std::string out = c.readAll();
    EXPECT_EQ(c.wait(), 0) << slurp(err);
    EXPECT_THAT(out, ::testing::HasSubstr("hca_id:\tsoftnda0"));
    EXPECT_THAT(out, ::testing::HasSubstr("transport:\t\t\tInfiniBand (0)"));
    EXPECT_THAT(out, ::testing::HasSubstr("state:\t\t\tPORT_ACTIVE (4)"));
    // The identity of SPEC.md §8: a locally administered vendor ID, and GUIDs that carry the
    // vendor ID, 24 host bits, the device index and (for a port GUID) the port number.
    EXPECT_THAT(out, ::testing::ContainsRegex("fw_ver:[ \t]+1\\.0\\.0"));
    EXPECT_THAT(out, ::testing::ContainsRegex("node_guid:[ \t]+02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0000"));
    EXPECT_THAT(out, ::testing::ContainsRegex("sys_image_guid:[ \t]+02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0000"));
    EXPECT_THAT(out, ::testing::ContainsRegex("vendor_id:[ \t]+0x2a0c0"));
    EXPECT_THAT(out, ::testing::ContainsRegex("vendor_part_id:[ \t]+23818"));
    EXPECT_THAT(out, ::testing::ContainsRegex("hw_ver:[ \t]+0x1\n"));
    EXPECT_THAT(out, ::testing::ContainsRegex(
                         "GID\\[  0\\]:[ \t]+fe80:0000:0000:0000:02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0001"));

    // ibv_devices: ibv_get_device_guid answers the node GUID (SPEC.md §8).
    Contained d(run({"/usr/bin/ibv_devices"}), env(), err);
    d.reply();
    std::string list = d.readAll();
    EXPECT_EQ(d.wait(), 0) << slurp(err);
    EXPECT_THAT(list, ::testing::ContainsRegex("softnda0[ \t]+02a0c0[0-9a-f]{6}0000"));
}

TEST_F(FaceTest, IbvDevicesWithTheBrokerGoneFailsCleanly) {
    ASSERT_EQ(broker_->terminate(), 0);
    std::string err = broker_->dir() + "/devices.err";
    // Straight to the face (the wrapper would refuse first): the program itself must not hang.
    std::vector<std::string> e = env();
    e.push_back("LD_LIBRARY_PATH=" IBVX_FACE_DIR ":" IBVX_EXTEND_LIB_DIR);
    e.erase(e.begin() + 1);
    e.push_back("IBV_EXTEND_MODE=broker");
    e.push_back("IBV_EXTEND_SOCKET=" + broker_->socket());
    Contained c({"/usr/bin/ibv_devices"}, e, err);
    c.reply();
    (void)c.readAll();
    EXPECT_NE(c.wait(), 0);
    EXPECT_THAT(slurp(err), ::testing::HasSubstr("Failed to get IB devices list"));
}

// Whether "/" is a mount's root here (not in a chroot): bwrap needs it to make its mounts private.
bool rootIsMountPoint() {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    bool found = false;
    while (f != nullptr && !found && fgets(line, sizeof(line), f) != nullptr) {
        char point[4096];
        found = sscanf(line, "%*s %*s %*s %*s %4095s", point) == 1 && strcmp(point, "/") == 0;
    }
    if (f != nullptr) {
        fclose(f);
    }
    return found;
}

bool exists(const char *path) {
    struct stat st {};
    return lstat(path, &st) == 0;
}

// The discovery tree (docs/verbs.md): inside ibv-extend-run's sandbox an unprivileged tenant
// with no /dev/infiniband of its own finds the broker's device as middleware looks for it, in
// agreement with what the face reports, and the placeholder node refuses to open at once. The
// host's /dev and /sys/class are left as they were.
TEST_F(FaceTest, SandboxShowsTheBrokersDiscoveryTree) {
    const bool host_dev = exists("/dev/infiniband"), host_class = exists("/sys/class/infiniband");
    const std::string script =
        "stat -c '%F %a' /dev/infiniband/uverbs0; ls /dev/infiniband; ls /sys/class/infiniband;"
        "d=/sys/class/infiniband/softnda0; cat $d/node_guid $d/node_type $d/fw_ver $d/ports/1/state"
        " $d/ports/1/phys_state $d/ports/1/rate $d/ports/1/link_layer $d/ports/1/lid $d/ports/1/gids/0"
        " $d/ports/1/gid_attrs/types/0 $d/ports/1/pkeys/0 $d/device/numa_node;"
        "echo ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev);"
        "echo abi=$(cat /sys/class/infiniband_verbs/abi_version); echo uid=$(id -u);"
        "test -d /sys/class/net && echo host-classes-kept;"
        "if (: < /dev/infiniband/uverbs0) 2>/dev/null; then echo open-succeeded; else echo open-refused; fi;"
        "ibv_devinfo | grep -E 'node_guid|fw_ver'";
    std::string err = broker_->dir() + "/sandbox.err";
    std::vector<std::string> argv = {
        IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on", "--", "/bin/sh", "-c", script};
    Contained c(argv, env(), err);
    c.reply();
    std::string out = c.readAll();
    int rc = c.wait();
    std::string why = slurp(err);
    if (rc != 0 && !rootIsMountPoint() && why.find("bwrap cannot make the sandbox") != std::string::npos) {
        GTEST_SKIP() << "\"/\" is not a mount point here (a chroot), and bwrap needs one: " << why;
    }
    ASSERT_EQ(rc, 0) << why << out;
    EXPECT_THAT(out, ::testing::HasSubstr("character special file 666\nuverbs0\nsoftnda0\n"));
    EXPECT_THAT(
        out, ::testing::ContainsRegex("\n02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0000\n1: CA\n1\\.0\\.0\n4: ACTIVE\n"
                                      "5: LinkUp\n100 Gb/sec \\(4X EDR\\)\nInfiniBand\n0x1\n"
                                      "fe80:0000:0000:0000:02a0:c0[0-9a-f]{2}:[0-9a-f]{4}:0001\n"
                                      "IB/RoCE v1\n0xffff\n-1\n"));
    EXPECT_THAT(out,
                ::testing::HasSubstr("ibdev=softnda0\nabi=6\nuid=65534\nhost-classes-kept\nopen-refused\n"));
    // The face agrees with the files.
    std::string guid = out.substr(out.find("softnda0\n") + 9, 19);
    EXPECT_THAT(out, ::testing::ContainsRegex("node_guid:[ \t]+" + guid));
    EXPECT_EQ(exists("/dev/infiniband"), host_dev);
    EXPECT_EQ(exists("/sys/class/infiniband"), host_class);
}

// Without a tree (or bwrap) --sandbox=auto runs the program anyway and says why; on refuses.
TEST_F(FaceTest, SandboxFallsBackOrRefusesClearly) {
    std::string tree = broker_->dir() + "/discovery";
    ASSERT_EQ(rename(tree.c_str(), (tree + ".moved").c_str()), 0);
    std::string err = broker_->dir() + "/fallback.err";
    Contained a(
        {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=auto", "--", "/usr/bin/ibv_devices"},
        env(), err);
    a.reply();
    std::string out = a.readAll();
    EXPECT_EQ(a.wait(), 0) << slurp(err);
    EXPECT_THAT(out, ::testing::HasSubstr("softnda0"));
    EXPECT_THAT(slurp(err),
                ::testing::HasSubstr("running without the sandbox: the broker publishes no discovery tree"));
    Contained b(
        {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on", "--", "/usr/bin/ibv_devices"}, env(),
        err);
    b.reply();
    (void)b.readAll();
    EXPECT_EQ(b.wait(), 1);
    EXPECT_THAT(slurp(err), ::testing::HasSubstr("--sandbox=on, but the broker publishes no discovery tree"));
}

// A stand-in for bwrap losing its race with the host's mounts, which a test cannot bring about
// at will (CI met it: another test deleted a network namespace's mount while bwrap copied the
// host's): the first `fails` sandboxes asked for fail with bwrap 0.8's words for a mount that
// vanished, then the real bwrap runs. In dir, writable by the tenant.
std::string fakeBwrap(const std::string &dir, int fails) {
    EXPECT_EQ(mkdir(dir.c_str(), 0777), 0);
    EXPECT_EQ(chmod(dir.c_str(), 0777), 0);
    const std::string path = dir + "/bwrap";
    std::ofstream(path)
        << "#!/bin/sh\n"
           "n=$(cat "
        << dir << "/count 2>/dev/null || echo 0)\n"
        << "echo $((n + 1)) >" << dir << "/count\n"
        << "if [ \"$n\" -lt " << fails
        << " ]; then\n"
           "  echo 'bwrap: Can'\\''t bind mount /oldroot/ on /newroot/: Unable to apply mount "
           "flags: remount \"/newroot/run/netns/gone\": No such file or directory' >&2\n"
           "  exit 1\n"
           "fi\n"
           "exec /usr/bin/bwrap \"$@\"\n";
    EXPECT_EQ(chmod(path.c_str(), 0755), 0);
    return dir;
}

// A sandbox bwrap could not make because a mount changed under it is made again (up to five
// tries), the program running once, in it; past the tries --sandbox=on fails saying why, and
// nothing ran. bwrap's complaint is ibv-extend-run's to report, never the program's stderr.
TEST_F(FaceTest, ASandboxAMountChangeFailedIsMadeAgain) {
    if (access("/usr/bin/bwrap", X_OK) != 0) {
        GTEST_SKIP() << "no /usr/bin/bwrap";
    }
    std::vector<std::string> e = env();
    const std::string fake = fakeBwrap(broker_->dir() + "/fake2", 2);
    e[0] = "PATH=" + fake + ":/usr/bin:/bin";
    const std::string err = broker_->dir() + "/retried.err";
    Contained a({IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on", "--", "/bin/sh", "-c",
                 "ls /dev/infiniband; echo ran >&2"},
                e, err);
    std::string out = a.readAll();
    int rc = a.wait();
    if (rc != 0 && !rootIsMountPoint() &&
        slurp(err).find("bwrap cannot make the sandbox") != std::string::npos) {
        GTEST_SKIP() << "\"/\" is not a mount point here (a chroot), and bwrap needs one: " << slurp(err);
    }
    EXPECT_EQ(rc, 0) << slurp(err);
    EXPECT_EQ(out, "uverbs0\n") << "the program ran in the sandbox";
    EXPECT_EQ(slurp(fake + "/count"), "3\n") << "two failed tries, then the one that ran";
    const std::string said = slurp(err);
    EXPECT_THAT(said,
                ::testing::HasSubstr("a mount changed while bwrap copied the host's; trying again (2 of 5)"));
    EXPECT_THAT(said, ::testing::HasSubstr("trying again (3 of 5)"));
    EXPECT_THAT(said, ::testing::EndsWith("ran\n")) << "the program's stderr is the caller's";

    const std::string fake9 = fakeBwrap(broker_->dir() + "/fake9", 9);
    e[0] = "PATH=" + fake9 + ":/usr/bin:/bin";
    Contained b(
        {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on", "--", "/bin/sh", "-c", "echo ran"},
        e, err);
    EXPECT_EQ(b.readAll(), "") << "nothing ran";
    EXPECT_EQ(b.wait(), 1);
    EXPECT_EQ(slurp(fake9 + "/count"), "5\n");
    EXPECT_THAT(slurp(err),
                ::testing::HasSubstr("--sandbox=on, but bwrap cannot make the sandbox: bwrap: Can't "
                                     "bind mount /oldroot/ on /newroot/"));
    EXPECT_THAT(slurp(err), ::testing::HasSubstr("(5 tries)"));
}

// In the sandbox the program is ibv-extend-run's child: a signal sent to ibv-extend-run's pid
// (a supervisor's SIGTERM) reaches the program, which may end as it likes, and its status is
// ibv-extend-run's. (Before, the pid was bwrap's: SIGTERM ended bwrap, and the program was
// killed outright with it.)
TEST_F(FaceTest, ASandboxedProgramGetsTheSignalsSentToIbvExtendRun) {
    const std::string err = broker_->dir() + "/signalled.err";
    Contained c({IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on", "--", "/bin/sh", "-c",
                 "trap 'echo got-TERM; exit 7' TERM; echo up; while :; do sleep 0.02; done"},
                env(), err);
    const std::string up = c.readLine(20000);
    if (up != "up" && !rootIsMountPoint() &&
        slurp(err).find("bwrap cannot make the sandbox") != std::string::npos) {
        GTEST_SKIP() << "\"/\" is not a mount point here (a chroot), and bwrap needs one: " << slurp(err);
    }
    ASSERT_EQ(up, "up") << slurp(err);
    ASSERT_EQ(kill(c.pid(), SIGTERM), 0);
    EXPECT_EQ(c.readAll(), "got-TERM\n") << slurp(err);
    EXPECT_EQ(c.wait(), 7) << slurp(err);
}

// Runs `program args... -p PORT` as a server, then as a client of it on localhost, both as
// contained tenants. The client is retried while the server is not listening yet.
PairResult runPair(const FaceTest &t, const std::string &name, const std::string &program,
                   std::vector<std::string> args, const char *port_flag = "-p") {
    PairResult r;
    const std::string port = std::to_string(freeLoopbackPort());
    args.push_back(port_flag);
    args.push_back(port);
    std::vector<std::string> server = t.runArgs(program, args);
    const std::string serr = t.dir() + "/" + name + ".server.err",
                      cerr = t.dir() + "/" + name + ".client.err";
    Contained srv(server, t.env(), serr);
    srv.reply();
    std::vector<std::string> client_args = args;
    client_args.push_back("localhost");
    for (int attempt = 0; attempt < 100; ++attempt) {
        Contained cli(t.runArgs(program, client_args), t.env(), cerr);
        cli.reply();
        r.client_out = cli.readAll();
        r.client_rc = cli.wait();
        r.client_err = slurp(cerr);
        bool refused = r.client_rc != 0 && (r.client_err.find("onnect") != std::string::npos ||
                                            r.client_out.find("onnect") != std::string::npos);
        if (!refused) {
            break;
        }
        usleep(50 * 1000);  // the server is not listening yet
    }
    r.server_out = srv.readAll();
    r.server_rc = srv.wait();
    r.server_err = slurp(serr);
    return r;
}

TEST_F(FaceTest, RcPingpongDefaults) {
    expectPair(runPair(*this, "rc", "/usr/bin/ibv_rc_pingpong", {"-d", "softnda0", "-n", "1000"}),
               "1000 iters in");
}

TEST_F(FaceTest, RcPingpongWithGidIndex) {
    expectPair(
        runPair(*this, "rc-g0", "/usr/bin/ibv_rc_pingpong", {"-d", "softnda0", "-n", "1000", "-g", "0"}),
        "1000 iters in");
}

// softnda's Ethernet personality (SPEC.md §19) as a tenant meets it: the broker runs in a network
// namespace the test makes, bound to one end of a veth pair there that carries addresses the test
// chose (10.201.7.0/24, fd00:201:7::/64); no traffic leaves the namespace. The test process enters
// the namespace for the test, so the broker and the tenants it forks are in it.
class EthernetFaceTest : public FaceTest {
  protected:
    std::string brokerConfig() const override {
        return FaceTest::brokerConfig() + "[softnda]\nnetdev = \"ibvx-a\"\n";
    }

    void SetUp() override {
        if (geteuid() != 0) {
            GTEST_SKIP() << "needs root: makes a network namespace and a veth pair";
        }
        ns_ = std::make_unique<Netns>();
        ASSERT_TRUE(ns_->made());
        for (const char *cmd :
             {"link set lo up", "link add ibvx-a type veth peer name ibvx-b", "link set ibvx-a up",
              "link set ibvx-b up", "addr add 10.201.7.1/24 dev ibvx-a",
              "addr add fd00:201:7::1/64 dev ibvx-a nodad"}) {
            ASSERT_EQ(inNs(cmd), 0) << cmd;
        }
        home_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        ASSERT_EQ(setns(ns_->fd(), CLONE_NEWNET), 0);
        FaceTest::SetUp();
    }

    // Runs even when SetUp failed or skipped: nothing of the namespace stays behind.
    void TearDown() override {
        broker_.reset();
        if (home_ >= 0) {
            EXPECT_EQ(setns(home_, CLONE_NEWNET), 0);
            close(home_);
        }
        ns_.reset();
    }

    int inNs(const std::string &args) const { return ns_->run(args); }

    std::string devinfo() {
        std::string err = dir() + "/devinfo.err";
        Contained c(run({"/usr/bin/ibv_devinfo", "-v"}), env(), err);
        c.reply();
        std::string out = c.readAll();
        EXPECT_EQ(c.wait(), 0) << slurp(err);
        return out;
    }

    // A file of port 1 in the broker's discovery tree.
    std::string port(const std::string &rel) const {
        return slurp(dir() + "/discovery/sys/class/infiniband/softnda0/ports/1/" + rel);
    }

    std::unique_ptr<Netns> ns_;
    int home_ = -1;
};

// The same suite on the RoCE personality: its RoCE-only checks (test_addr's RoCE AH, the GID
// types and tables) run too. Not in the sanitizer builds: the face's code under ASan is the
// InfiniBand run's (FaceTest above), and this second run would add 40 s of CI for checks the
// plain build makes.
TEST_F(EthernetFaceTest, RdmaCoresOwnTestsPassOnRoce) {
    if (IBVX_SANITIZED) {
        GTEST_SKIP() << "the RoCE personality's run is the plain build's; FaceTest.RdmaCoresOwnTestsPass "
                        "runs the suite under the sanitizer";
    }
    rdmaCoreSuite();
}

TEST_F(EthernetFaceTest, DevinfoShowsRoceV2GidsThatFollowTheInterface) {
    std::string out = devinfo();
    EXPECT_THAT(out, ::testing::HasSubstr("link_layer:\t\tEthernet"));
    EXPECT_THAT(out, ::testing::HasSubstr("port_lid:\t\t0\n"));
    EXPECT_THAT(out, ::testing::HasSubstr("state:\t\t\tPORT_ACTIVE (4)"));
    EXPECT_THAT(out, ::testing::HasSubstr("active_mtu:\t\t1024 (3)"));  // a 1500-byte veth, rxe's rule
    // The kernel's layout for a RoCEv2-only port (rxe): the MAC's EUI-64 link-local GID first,
    // then IPv4 (mapped), then IPv6; the veth's own fe80:: address is that GID, not another.
    EXPECT_THAT(out, ::testing::ContainsRegex("GID\\[  0\\]:[ \t]+fe80::[0-9a-f:]+, RoCE v2\n"));
    EXPECT_THAT(out, ::testing::HasSubstr("GID[  1]:\t\t::ffff:10.201.7.1, RoCE v2\n"));
    EXPECT_THAT(out, ::testing::HasSubstr("GID[  2]:\t\tfd00:201:7::1, RoCE v2\n"));
    EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("GID[  3]")));

    // The discovery tree (docs/verbs.md) says the same.
    EXPECT_EQ(port("link_layer"), "Ethernet\n");
    EXPECT_EQ(port("gids/1"), "0000:0000:0000:0000:0000:ffff:0ac9:0701\n");
    EXPECT_EQ(port("gid_attrs/types/1"), "RoCE v2\n");
    EXPECT_EQ(port("gid_attrs/ndevs/1"), "ibvx-a\n");

    // A new address takes the next slot; one that goes leaves its slot empty, the others stay.
    ASSERT_EQ(inNs("addr add 10.201.8.1/24 dev ibvx-a"), 0);
    out = devinfo();
    EXPECT_THAT(out, ::testing::HasSubstr("GID[  3]:\t\t::ffff:10.201.8.1, RoCE v2\n"));
    ASSERT_EQ(inNs("addr del 10.201.7.1/24 dev ibvx-a"), 0);
    out = devinfo();
    EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("GID[  1]")));
    EXPECT_THAT(out, ::testing::HasSubstr("GID[  2]:\t\tfd00:201:7::1, RoCE v2\n"));
    EXPECT_THAT(out, ::testing::HasSubstr("GID[  3]:\t\t::ffff:10.201.8.1, RoCE v2\n"));
    // The broker rewrites the tree's ports when an address or a link changes.
    EXPECT_TRUE(waitFor([&] { return port("gids/3") == "0000:0000:0000:0000:0000:ffff:0ac9:0801\n"; },
                        std::chrono::seconds(10)))
        << port("gids/3");
    EXPECT_TRUE(waitFor([&] { return port("gid_attrs/types/1").empty(); }, std::chrono::seconds(10)));

    // The port follows the link: the peer end down takes the carrier away.
    ASSERT_EQ(inNs("link set ibvx-b down"), 0);
    EXPECT_THAT(devinfo(), ::testing::HasSubstr("state:\t\t\tPORT_DOWN (1)"));
    EXPECT_TRUE(waitFor([&] { return port("state") == "1: DOWN\n"; }, std::chrono::seconds(10)))
        << port("state");
}

TEST_F(EthernetFaceTest, RcPingpongByRoceV2Gid) {
    expectPair(
        runPair(*this, "rc-roce", "/usr/bin/ibv_rc_pingpong", {"-d", "softnda0", "-n", "200", "-g", "1"}),
        "200 iters in");
}

// UD on one host by RoCEv2 GID: the address handle's GRH names a GID of this device, so the
// datagram stays in shared memory (softnda SPEC.md §18), behind the same GRH and packet type a
// datagram from another host has.
TEST_F(EthernetFaceTest, UdPingpongByRoceV2Gid) {
    expectPair(runPair(*this, "ud-roce", "/usr/bin/ibv_ud_pingpong",
                       {"-d", "softnda0", "-n", "200", "-s", "512", "-g", "1"}),
               "200 iters in");
}

TEST_F(FaceTest, RcPingpongWithCompletionEvents) {
    expectPair(runPair(*this, "rc-e", "/usr/bin/ibv_rc_pingpong", {"-d", "softnda0", "-n", "1000", "-e"}),
               "1000 iters in");
}

TEST_F(FaceTest, SrqPingpong) {
    expectPair(runPair(*this, "srq", "/usr/bin/ibv_srq_pingpong", {"-d", "softnda0", "-n", "500"}),
               "500 iters in");
}

// XRC (SPEC.md §14): each side opens a domain, makes XRC SRQs and target QPs in it and initiator
// QPs that send to the peer's SRQs by number. It prints no iteration count: both sides exiting 0
// after exchanging addresses and all their messages is the result.
TEST_F(FaceTest, XsrqPingpong) {
    PairResult r = runPair(*this, "xsrq", "/usr/bin/ibv_xsrq_pingpong", {"-d", "softnda0", "-n", "1000"});
    expectPair(r, "remote: LID");
    EXPECT_THAT(r.server_out, ::testing::HasSubstr("remote: LID")) << r.server_err;
}

// UD: datagrams through address handles, each receive behind its 40-byte GRH.
TEST_F(FaceTest, UdPingpong) {
    expectPair(runPair(*this, "ud", "/usr/bin/ibv_ud_pingpong", {"-d", "softnda0", "-n", "1000"}),
               "1000 iters in");
}

TEST_F(FaceTest, UcPingpong) {
    expectPair(runPair(*this, "uc", "/usr/bin/ibv_uc_pingpong", {"-d", "softnda0", "-n", "1000"}),
               "1000 iters in");
}

class FacePerftest : public FaceTest, public ::testing::WithParamInterface<const char *> {};

TEST_P(FacePerftest, RunsAsServerAndClient) {
    const std::string program = std::string("/usr/bin/") + GetParam();
    PairResult r = runPair(*this, GetParam(), program, {"-d", "softnda0", "-n", "200"});
    expectPerftestRow(r, "[0-9]+", "200");
}

INSTANTIATE_TEST_SUITE_P(Programs, FacePerftest,
                         ::testing::Values("ib_write_bw", "ib_write_lat", "ib_read_bw", "ib_read_lat",
                                           "ib_send_bw", "ib_send_lat", "ib_atomic_lat"),
                         [](const auto &info) { return std::string(info.param); });

// perftest over the unreliable transports: a program and its -c connection type.
struct PerftestOver {
    const char *program;
    const char *transport;
};

void PrintTo(const PerftestOver &p, std::ostream *os) {
    *os << p.program << " -c " << p.transport;
}

class FacePerftestUnreliable : public FaceTest, public ::testing::WithParamInterface<PerftestOver> {};

TEST_P(FacePerftestUnreliable, RunsAsServerAndClient) {
    const PerftestOver p = GetParam();
    const std::string name = std::string(p.program) + "-" + p.transport;
    PairResult r = runPair(*this, name, std::string("/usr/bin/") + p.program,
                           {"-d", "softnda0", "-c", p.transport, "-n", "200"});
    expectPerftestRow(r, "[0-9]+", "200");
}

INSTANTIATE_TEST_SUITE_P(
    Programs, FacePerftestUnreliable,
    ::testing::Values(PerftestOver{"ib_send_lat", "UD"}, PerftestOver{"ib_send_bw", "UD"},
                      PerftestOver{"ib_write_bw", "UC"}, PerftestOver{"ib_send_bw", "UC"}),
    [](const auto &info) { return std::string(info.param.program) + "_" + info.param.transport; });

// Runs a behaviour program of this directory ("PROGRAM DEVICE": exit 0 and "OK") as a tenant.
void expectBehaviour(const FaceTest &t, const char *program, const std::string &name) {
    std::string err = t.dir() + "/" + name + ".err";
    Contained c(t.run({program, "softnda0"}), t.env(), err);
    c.reply();
    std::string out = c.readAll();
    EXPECT_EQ(c.wait(), 0) << out << slurp(err);
    EXPECT_EQ(out, "OK\n") << slurp(err);
}

TEST_F(FaceTest, StrictVerbsBehaviour) {
    expectBehaviour(*this, IBVX_VERBS_BEHAVIOUR, "behaviour");
}

// No NULL op in any table the face hands out (verbs_context, context ops, ibv_cq_ex, ibv_qp_ex of
// each type), the refused ones answering EOPNOTSUPP, and UD sends through ibv_wr_* (issue 49: a
// NULL wr_set_ud_addr crashed the tenant).
TEST_F(FaceTest, NoNullOpAndUdSendsThroughTheWrApi) {
    expectBehaviour(*this, IBVX_VERBS_SLOTS, "verbs-slots");
}

// XRC's bad requests (no domain, a basic SRQ's number, a domain in use, an unknown SRQ number)
// and both ways to name the SRQ.
TEST_F(FaceTest, XrcBehaviour) {
    expectBehaviour(*this, IBVX_XRC_BEHAVIOUR, "xrc-behaviour");
}

// One XRC domain shared by two tenant processes through a file (ibv_open_xrcd's O_CREAT/O_EXCL
// errors, the peer's target delivering into the owner's SRQ, every byte checked), and what is
// left when one of them ends.
TEST_F(FaceTest, XrcDomainSharedByFile) {
    expectBehaviour(*this, IBVX_XRC_SHARED, "xrc-shared");
}

// ibv_open_qp of another tenant's target (the bad numbers and types first), driven to RTS through
// the handle and delivering into the opener's SRQ, before and after its creator let go and ended;
// the last handle's destroy ends it.
TEST_F(FaceTest, XrcOpenQpOutlivesItsCreator) {
    expectBehaviour(*this, IBVX_XRC_OPEN_QP, "xrc-open-qp");
}

// Multicast groups (softnda SPEC.md §11.3): the bad requests, delivery to the members only,
// leaving by detach and by destroy.
TEST_F(FaceTest, McastBehaviour) {
    expectBehaviour(*this, IBVX_MCAST_BEHAVIOUR, "mcast-behaviour");
}

// The pyverbs programs of this directory (pyverbs_<name>.py), each as an unprivileged tenant.
class FacePyverbs : public FaceTest, public ::testing::WithParamInterface<const char *> {};

TEST_P(FacePyverbs, ProgramSucceeds) {
    const std::string program = std::string(IBVX_PYVERBS_DIR) + "/pyverbs_" + GetParam() + ".py";
    std::string err = dir() + "/pyverbs_" + GetParam() + ".err";
    Contained c(runArgs("/usr/bin/python3", {program, "softnda0"}), env(), err);
    c.reply();
    std::string out = c.readAll();
    EXPECT_EQ(c.wait(), 0) << out << slurp(err);
    EXPECT_EQ(out, "OK\n") << slurp(err);
}

// rdma-core's own test suite (Debian's copy, /usr/share/doc/rdma-core/tests), unmodified, as an
// unprivileged tenant in the sandbox (the tests read the device's /sys entries): every test
// passes, or is skipped or fails as rdma_core_expected.txt says and why (rdma_core_suite.py).
// Issue 49: before it, this suite crashed the tenant (a NULL wr_set_ud_addr) and failed memory
// windows, rereg, device memory and PD import.
TEST_F(FaceTest, RdmaCoresOwnTestsPass) {
    rdmaCoreSuite();
}

INSTANTIATE_TEST_SUITE_P(Programs, FacePyverbs,
                         ::testing::Values("rc", "resize", "rereg", "domains", "timestamps", "mw", "dm"),
                         [](const auto &info) { return std::string(info.param); });

}  // namespace
}  // namespace ibvx::test
