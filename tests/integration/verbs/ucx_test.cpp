// UCX 1.13 (Debian's ucx-utils) over the libibverbs face, UCT level: ucx_info lists the broker's
// device with an IB memory domain and rc_verbs, and ucx_perftest's put_lat, put_bw, get, am_lat
// and am_bw run between two unprivileged tenants over rc_verbs (am_lat over ud_verbs too); at the
// UCP level tag_lat, tag_bw (rendezvous), ucp_put_bw, ucp_get and ucp-verify (every byte of
// many sizes checked) run with UCX_TLS=rc_verbs,ud_verbs,self, and tag_bw, put/get and ucp-verify
// with UCX's defaults too; each tenant in ibv-extend-run's
// sandbox (UCX considers a device only when /dev/infiniband/<dev_name> is a character device it may
// open, docs/verbs.md). Short iteration counts: these prove the transport works; figures belong
// to the benchmark. Open MPI (pml ucx, osc ucx) runs mpi-verify between two unprivileged ranks,
// over verbs only and with UCX's defaults.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tcp_ports.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/ops/run_process.h"

namespace ibvx::test {
namespace {

constexpr long kNobody = 65534;

// Debian's UCX is not instrumented: its programs load the face built with the sanitizer, whose
// runtime must then come first in the process ("ASan runtime does not come first in initial
// library list") - and preloading it puts the sanitizer's interceptors beside UCX's own mmap
// hooks. The plain build runs these; the sanitizer suite leaves them out by their no-asan label,
// and a sanitizer build run by hand skips them here.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerBuild = true;
#else
constexpr bool kSanitizerBuild = false;
#endif

class UcxTest : public ::testing::Test {
  protected:
    void SetUp() override {
        if (kSanitizerBuild) {
            GTEST_SKIP()
                << "a sanitizer build: Debian's uninstrumented UCX cannot load the instrumented face";
        }
        if (std::string(IBVX_UCX_PERFTEST).empty() || std::string(IBVX_UCX_INFO).empty()) {
            GTEST_SKIP() << "ucx-utils is not installed (scripts/install-deps.sh)";
        }
        broker_ = std::make_unique<BrokerProcess>("[broker]\nsocket_mode = \"0666\"\n");
        ASSERT_TRUE(broker_->started()) << broker_->log();
        ASSERT_EQ(::chmod(broker_->dir().c_str(), 0755), 0);
        // The socket accepts from its bind on; the discovery tree comes just before serving.
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (::access((broker_->dir() + "/discovery").c_str(), F_OK) != 0 &&
               std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        // UCX sees the device only inside the sandbox; where bwrap cannot make one (a chroot
        // whose "/" is not a mount point) there is nothing to test.
        ProcessResult probe = tenant({"/bin/true"});
        if (probe.exit_code != 0 && probe.err.find("bwrap cannot make the sandbox") != std::string::npos) {
            GTEST_SKIP() << probe.err;
        }
        ASSERT_EQ(probe.exit_code, 0) << probe.err;
    }

    // argv run as uid 65534 through ibv-extend-run, in the sandbox or not at all.
    ProcessResult tenant(const std::vector<std::string> &command, const std::vector<std::string> &env = {},
                         int timeout_ms = 60000) const {
        std::vector<std::string> argv = {IBVX_RUN_BINARY, "--socket", broker_->socket(), "--sandbox=on",
                                         "--"};
        argv.insert(argv.end(), command.begin(), command.end());
        RunOptions o;
        o.uid = kNobody;
        o.timeout_ms = timeout_ms;
        o.env = {"PATH=/usr/bin:/bin", "UCX_WARN_UNUSED_ENV_VARS=n"};
        o.env.insert(o.env.end(), env.begin(), env.end());
        return runProcess(argv, o);
    }

    // A server tenant, then a client tenant: each command is completed by port(), a free TCP
    // port the server listens on for the out-of-band exchange. Both must succeed; the client's
    // output is returned.
    std::string pair(const std::function<std::vector<std::string>(int port)> &server,
                     const std::function<std::vector<std::string>(int port)> &client,
                     const std::vector<std::string> &env = {}) {
        const int port = freePort();
        EXPECT_GT(port, 0);
        auto served = std::async(std::launch::async, [&] { return tenant(server(port), env); });
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!listening(port) && std::chrono::steady_clock::now() < deadline &&
               served.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
        }
        ProcessResult c = tenant(client(port), env);
        ProcessResult s = served.get();
        EXPECT_EQ(c.exit_code, 0) << c.out << c.err << broker_->log();
        EXPECT_EQ(s.exit_code, 0) << s.out << s.err;
        return c.out;
    }

    // One ucx_perftest case between two tenants. UCT-level cases name the device and transport
    // (device_args); UCP-level ones choose by UCX_TLS (env).
    void perftest(const std::vector<std::string> &args,
                  const std::vector<std::string> &device_args = {"-d", "softnda0:1", "-x", "rc_verbs"},
                  const std::vector<std::string> &env = {}) {
        auto command = [&](int port) {
            std::vector<std::string> argv = {IBVX_UCX_PERFTEST, "-p", std::to_string(port)};
            argv.insert(argv.end(), device_args.begin(), device_args.end());
            return argv;
        };
        std::string out = pair(
            command,
            [&](int port) {
                std::vector<std::string> argv = command(port);
                argv.insert(argv.begin() + 1, "127.0.0.1");
                argv.insert(argv.end(), args.begin(), args.end());
                return argv;
            },
            env);
        EXPECT_THAT(out, ::testing::HasSubstr("Final:"));
        if (out.find("Final:") != std::string::npos) {
            std::printf("%s", out.substr(out.find("Final:")).c_str());
        }
    }

    void verify(const std::vector<std::string> &env);
    // mpirun -np 2 of mpi-verify as uid 65534, each rank through ibv-extend-run; env: UCX's.
    void mpiJob(const std::vector<std::string> &env);

    std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(UcxTest, UcxInfoListsTheDeviceWithAnIbMemoryDomainAndRcVerbs) {
    ProcessResult r = tenant({IBVX_UCX_INFO, "-d"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, ::testing::ContainsRegex("# Memory domain: softnda0\n"));
    EXPECT_THAT(r.out, ::testing::ContainsRegex("# +Transport: rc_verbs\n# +Device: softnda0:1\n"));
}

TEST_F(UcxTest, PutLatency) {
    perftest({"-t", "put_lat", "-n", "100", "-w", "10"});
}

TEST_F(UcxTest, PutBandwidthZeroCopy64KiB) {
    perftest({"-t", "put_bw", "-D", "zcopy", "-s", "65536", "-n", "200", "-w", "10"});
}

TEST_F(UcxTest, GetBandwidthZeroCopy64KiB) {
    perftest({"-t", "get", "-D", "zcopy", "-s", "65536", "-n", "200", "-w", "10"});
}

// Active messages are SENDs into rc_verbs' SRQ; rc_verbs flushes with zero-length WRITEs.
TEST_F(UcxTest, ActiveMessageLatency) {
    perftest({"-t", "am_lat", "-n", "100", "-w", "10"});
}

TEST_F(UcxTest, ActiveMessageBandwidthBcopy4KiB) {
    perftest({"-t", "am_bw", "-D", "bcopy", "-s", "4096", "-n", "200", "-w", "10"});
}

// ud_verbs: UD QPs on softnda (SPEC.md §11), one per UCT interface; UCP connects its RC
// endpoints through it.
TEST_F(UcxTest, UcxInfoListsUdVerbs) {
    ProcessResult r = tenant({IBVX_UCX_INFO, "-d"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_THAT(r.out, ::testing::ContainsRegex("# +Transport: ud_verbs\n# +Device: softnda0:1\n"));
}

TEST_F(UcxTest, UdActiveMessageLatency) {
    perftest({"-t", "am_lat", "-n", "100", "-w", "10"}, {"-d", "softnda0:1", "-x", "ud_verbs"});
}

// ---- UCP: the transports chosen by UCX_TLS, as applications use them ----
const std::vector<std::string> kUcpVerbs = {"UCX_TLS=rc_verbs,ud_verbs,self"};

TEST_F(UcxTest, UcpTagLatency) {
    perftest({"-t", "tag_lat", "-n", "100", "-w", "10"}, {}, kUcpVerbs);
}

// 1 MiB is past every eager threshold: rendezvous, the payload moved by RDMA from registered
// memory.
TEST_F(UcxTest, UcpTagBandwidthRendezvous1MiB) {
    perftest({"-t", "tag_bw", "-s", "1048576", "-n", "20", "-w", "2"}, {}, kUcpVerbs);
}

TEST_F(UcxTest, UcpPutBandwidth64KiB) {
    perftest({"-t", "ucp_put_bw", "-s", "65536", "-n", "100", "-w", "10"}, {}, kUcpVerbs);
}

TEST_F(UcxTest, UcpGet64KiB) {
    perftest({"-t", "ucp_get", "-s", "65536", "-n", "100", "-w", "10"}, {}, kUcpVerbs);
}

// ucp-verify (ucp_verify.c): tagged messages of 0 B to 4 MiB, eager and rendezvous, every byte
// checked on both sides, buffers freed and reallocated between messages so UCX's registration
// cache sees pages come and go while the face moves registered pages onto its memfd.
TEST_F(UcxTest, UcpVerifiedTaggedMessagesOfManySizes) {
    verify(kUcpVerbs);
}

// ---- UCP with UCX's defaults (no UCX_TLS) ----
// UCX then allocates from its SysV/POSIX shared-memory domains and registers that memory with the
// IB domain too (the face registers it in place: docs/verbs.md, "Shared memory: registered in
// place"), and moves data between the two tenants with shared memory and cma (the sandboxes share
// a user namespace).

TEST_F(UcxTest, UcpTagBandwidthRendezvous1MiBWithUcxDefaults) {
    perftest({"-t", "tag_bw", "-s", "1048576", "-n", "20", "-w", "2"}, {}, {});
}

TEST_F(UcxTest, UcpPutAndGetWithUcxDefaults) {
    perftest({"-t", "ucp_put_bw", "-s", "65536", "-n", "50"}, {}, {});
    perftest({"-t", "ucp_get", "-s", "65536", "-n", "50"}, {}, {});
}

TEST_F(UcxTest, UcpVerifiedTaggedMessagesWithUcxDefaults) {
    verify({});
}

// ---- Sandboxes of one user share one user namespace (tools/ibv-extend-run/shared_userns.h) ----

// UCX's cma transport reads the peer's memory with process_vm_readv, which the kernel allows only
// within one user namespace: with a namespace per sandbox this put_bw fails (EPERM, fatal in
// UCX). UCP and Open MPI pick cma by default between two processes of one host.
TEST_F(UcxTest, CmaWorksBetweenTwoSandboxesOfOneUser) {
    perftest({"-t", "put_bw", "-D", "zcopy", "-s", "65536", "-n", "200"}, {"-d", "memory", "-x", "cma"});
}

// The namespace's holder is there while a sandbox runs and goes with the last one, taking its
// registry entry along. A registry of this test's own (XDG_RUNTIME_DIR), so tests running beside
// it cannot keep the holder alive.
TEST_F(UcxTest, TheSharedNamespaceHolderGoesWithTheLastSandbox) {
    const std::string runtime = broker_->dir() + "/xdg-runtime";
    ASSERT_EQ(::mkdir(runtime.c_str(), 0700), 0);
    ASSERT_EQ(::chown(runtime.c_str(), kNobody, kNobody), 0);
    const std::string registry = runtime + "/ibv-extend-run";
    const std::string said = runtime + "/said";
    // The sandbox names its holder and its own namespace, then stays a while: the holder has every
    // capability in the namespace, so only a process outside it (this one) may look at it.
    auto sandbox = std::async(std::launch::async, [&] {
        return tenant({"/bin/sh", "-c",
                       "echo $(cat " + registry + "/holder) $(readlink /proc/self/ns/user) > " + said +
                           ".new && mv " + said + ".new " + said + " && sleep 2"},
                      {"XDG_RUNTIME_DIR=" + runtime});
    });
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (::access(said.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < deadline &&
           sandbox.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    }
    std::ifstream in(said);
    std::string holder, sandbox_ns;
    in >> holder >> sandbox_ns;
    ASSERT_FALSE(holder.empty()) << "the sandbox said nothing";
    std::ifstream comm("/proc/" + holder + "/comm");
    std::string name;
    comm >> name;
    EXPECT_EQ(name, "ibvx-userns");
    char holder_ns[64] = {}, ours[64] = {};
    ASSERT_GT(::readlink(("/proc/" + holder + "/ns/user").c_str(), holder_ns, sizeof(holder_ns) - 1), 0);
    ASSERT_GT(::readlink("/proc/self/ns/user", ours, sizeof(ours) - 1), 0);
    EXPECT_EQ(sandbox_ns, holder_ns) << "the sandbox is not in its holder's user namespace";
    EXPECT_NE(sandbox_ns, ours);
    ProcessResult r = sandbox.get();
    ASSERT_EQ(r.exit_code, 0) << r.err;
    // Gone: no registry entry, and the process has exited (a zombie until whoever adopted it reaps).
    auto holderRuns = [&] {
        std::ifstream stat("/proc/" + holder + "/stat");
        std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
        size_t paren = text.rfind(')');
        return paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] != 'Z';
    };
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((::access((registry + "/holder").c_str(), F_OK) == 0 || holderRuns()) &&
           std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_NE(::access((registry + "/holder").c_str(), F_OK), 0) << "the registry still names a holder";
    EXPECT_FALSE(holderRuns()) << "holder " << holder << " still runs after the last sandbox";
}

// ---- Open MPI over UCX: mpirun as uid 65534, each rank a tenant in its sandbox ----

// Debian's Open MPI 4.1 with its UCX pml and osc; with verbs transports only (UCX_TLS) every
// message and every one-sided access between the two ranks crosses softnda through the broker;
// the btl is self alone, so Open MPI has no path of its own between them. mpi-verify checks every
// byte of point-to-point messages of 0 B-4 MiB, MPI_Allreduce, MPI_Alltoall and MPI_Put/MPI_Get.
// No --allow-run-as-root: the job is the unprivileged user's own.
void UcxTest::mpiJob(const std::vector<std::string> &env) {
    if (std::string(IBVX_MPIRUN).empty() || std::string(IBVX_MPI_VERIFY).empty()) {
        GTEST_SKIP() << "openmpi-bin / libopenmpi-dev are not installed (scripts/install-deps.sh)";
    }
    RunOptions o;
    o.uid = kNobody;
    o.timeout_ms = 120000;
    o.env = {"PATH=/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "UCX_WARN_UNUSED_ENV_VARS=n"};
    o.env.insert(o.env.end(), env.begin(), env.end());
    ProcessResult r = runProcess({IBVX_MPIRUN, "--oversubscribe", "-np", "2", "--mca", "pml", "ucx", "--mca",
                                  "osc", "ucx", "--mca", "btl", "self", IBVX_RUN_BINARY, "--socket",
                                  broker_->socket(), "--sandbox=on", "--", IBVX_MPI_VERIFY},
                                 o);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err << broker_->log();
    EXPECT_THAT(r.out, ::testing::HasSubstr("allreduce, alltoall, put/get: 0 + 0 + 0 bad bytes")) << r.err;
    std::printf("%s", r.out.c_str());
}

TEST_F(UcxTest, OpenMpiJobOfTwoUnprivilegedRanksLosesNoByte) {
    mpiJob(kUcpVerbs);
}

// UCX's defaults: between two ranks of one host UCX moves messages over shared memory and cma,
// and MPI_Win_allocate takes the one-sided window from SysV shared memory, registered in place.
TEST_F(UcxTest, OpenMpiJobWithUcxDefaultsLosesNoByte) {
    mpiJob({});
}

void UcxTest::verify(const std::vector<std::string> &env) {
    if (std::string(IBVX_UCP_VERIFY).empty()) {
        GTEST_SKIP() << "libucx-dev is not installed (scripts/install-deps.sh)";
    }
    std::string out = pair(
        [](int port) {
            return std::vector<std::string>{IBVX_UCP_VERIFY, "-p", std::to_string(port)};
        },
        [](int port) {
            return std::vector<std::string>{IBVX_UCP_VERIFY, "-c", "127.0.0.1", "-p", std::to_string(port)};
        },
        env);
    EXPECT_THAT(out, ::testing::HasSubstr("client checked 54 messages"));
}

}  // namespace
}  // namespace ibvx::test
