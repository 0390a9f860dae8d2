// ibv-extend-run as a user runs it: a process, with a real broker listening or none.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/ops/run_process.h"

namespace {

using ibvx::test::BrokerProcess;
using ibvx::test::ProcessResult;
using ibvx::test::RunOptions;
using ibvx::test::runProcess;

std::string runBinary() {
    return std::string(std::getenv("IBVX_BUILD_DIR")) + "/tools/ibv-extend-run/ibv-extend-run";
}

ProcessResult run(const std::vector<std::string> &args, const std::vector<std::string> &env = {}) {
    std::vector<std::string> argv{runBinary()};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, RunOptions{.env = env});
}

// NAME=value lines of `env` output, by name.
std::string envValue(const std::string &env_out, const std::string &name) {
    std::istringstream in(env_out);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind(name + "=", 0) == 0)
            return line.substr(name.size() + 1);
    }
    return "<unset>";
}

std::vector<std::string> lines(const std::string &text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        out.push_back(line);
    return out;
}

std::string realPath(const std::string &path) {
    char buf[PATH_MAX];
    return ::realpath(path.c_str(), buf) != nullptr ? buf : "";
}

class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/ibvx-run-XXXXXX";
        path_ = ::mkdtemp(tmpl) != nullptr ? tmpl : "";
    }
    ~TempDir() {
        std::error_code ignored;
        if (!path_.empty())
            std::filesystem::remove_all(path_, ignored);
    }
    const std::string &path() const { return path_; }

  private:
    std::string path_;
};

TEST(IbvExtendRun, NoSocketExitsOneWithOneLineNamingIt) {
    TempDir dir;
    std::string socket = dir.path() + "/none.sock";
    ProcessResult r = run({"sh", "-c", "echo the command ran"}, {"IBV_EXTEND_SOCKET=" + socket});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");  // the command never ran
    ASSERT_EQ(lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(socket), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::strerror(ENOENT)), std::string::npos) << r.err;
}

TEST(IbvExtendRun, SocketWithoutListenerExitsOneWithTheReason) {
    TempDir dir;
    std::string socket = dir.path() + "/stale.sock";
    // A socket file nobody listens on: what a crashed broker leaves behind.
    auto addr = ibvx::unixAddress(socket);
    ASSERT_TRUE(addr.isOk());
    ibvx::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_GE(fd.get(), 0);
    ASSERT_EQ(::bind(fd.get(), addr.value().get(), addr.value().len), 0) << std::strerror(errno);
    ProcessResult r = run({"--socket", socket, "true"});
    EXPECT_EQ(r.exit_code, 1);
    ASSERT_EQ(lines(r.err).size(), 1u) << r.err;
    EXPECT_NE(r.err.find(socket), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(std::strerror(ECONNREFUSED)), std::string::npos) << r.err;
}

TEST(IbvExtendRun, UsageErrorsExitTwo) {
    ProcessResult none = run({});
    EXPECT_EQ(none.exit_code, 2);
    EXPECT_NE(none.err.find("usage: ibv-extend-run"), std::string::npos) << none.err;
    ProcessResult unknown = run({"--frobnicate", "true"});
    EXPECT_EQ(unknown.exit_code, 2);
    EXPECT_NE(unknown.err.find("--frobnicate"), std::string::npos) << unknown.err;
    ProcessResult missing = run({"--socket"});
    EXPECT_EQ(missing.exit_code, 2);
    ProcessResult help = run({"--help"});
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("usage: ibv-extend-run"), std::string::npos);
    ProcessResult version = run({"--version"});
    EXPECT_EQ(version.exit_code, 0);
    EXPECT_EQ(version.out.rfind("ibv-extend-run ", 0), 0u) << version.out;
}

class IbvExtendRunBroker : public ::testing::Test {
  protected:
    static void SetUpTestSuite() { broker_ = std::make_unique<BrokerProcess>(std::string()); }
    static void TearDownTestSuite() { broker_.reset(); }
    void SetUp() override { ASSERT_TRUE(broker_->started()) << broker_->log(); }
    static inline std::unique_ptr<BrokerProcess> broker_;
};

TEST_F(IbvExtendRunBroker, ChildSeesTheFaceFirstBrokerModeAndTheSocket) {
    ProcessResult r = run({"env"}, {"IBV_EXTEND_SOCKET=" + broker_->socket(),
                                    "LD_LIBRARY_PATH=/opt/keep:/opt/too", "IBV_EXTEND_MODE=direct"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::string path = envValue(r.out, "LD_LIBRARY_PATH");
    std::string first = path.substr(0, path.find(':'));
    EXPECT_EQ(realPath(first), realPath(IBVX_FACE_DIR)) << path;
    EXPECT_EQ(path.substr(path.find(':')), ":/opt/keep:/opt/too");
    EXPECT_EQ(envValue(r.out, "IBV_EXTEND_MODE"), "broker");
    EXPECT_EQ(envValue(r.out, "IBV_EXTEND_SOCKET"), broker_->socket());
}

TEST_F(IbvExtendRunBroker, EmptyLibraryPathBecomesTheFaceAlone) {
    ProcessResult r = run({"env"}, {"IBV_EXTEND_SOCKET=" + broker_->socket(), "LD_LIBRARY_PATH="});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(realPath(envValue(r.out, "LD_LIBRARY_PATH")), realPath(IBVX_FACE_DIR));
}

// The installed layout: <prefix>/bin/ibv-extend-run finds <prefix>/lib/ibv_extend/verbs, ahead
// of the build tree it was built in.
TEST_F(IbvExtendRunBroker, InstalledBinaryUsesTheFaceBesideIt) {
    TempDir prefix;
    namespace fs = std::filesystem;
    fs::create_directories(prefix.path() + "/bin");
    fs::create_directories(prefix.path() + "/lib/ibv_extend/verbs");
    // A copy, not a link: the program finds itself through /proc/self/exe, which resolves links.
    fs::copy_file(runBinary(), prefix.path() + "/bin/ibv-extend-run");
    fs::create_symlink(IBVX_FACE_LIB, prefix.path() + "/lib/ibv_extend/verbs/libibverbs.so.1");
    ProcessResult r =
        runProcess({prefix.path() + "/bin/ibv-extend-run", "env"},
                   RunOptions{.env = {"IBV_EXTEND_SOCKET=" + broker_->socket(), "LD_LIBRARY_PATH="}});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(envValue(r.out, "LD_LIBRARY_PATH"), realPath(prefix.path() + "/lib/ibv_extend/verbs"));
}

TEST_F(IbvExtendRunBroker, SocketOptionOverridesTheEnvironment) {
    TempDir dir;
    std::vector<std::string> env{"IBV_EXTEND_SOCKET=" + dir.path() + "/elsewhere.sock"};
    ProcessResult spaced = run({"--socket", broker_->socket(), "--", "env"}, env);
    ASSERT_EQ(spaced.exit_code, 0) << spaced.err;
    EXPECT_EQ(envValue(spaced.out, "IBV_EXTEND_SOCKET"), broker_->socket());
    ProcessResult joined = run({"--socket=" + broker_->socket(), "env"}, env);
    ASSERT_EQ(joined.exit_code, 0) << joined.err;
    EXPECT_EQ(envValue(joined.out, "IBV_EXTEND_SOCKET"), broker_->socket());
}

TEST_F(IbvExtendRunBroker, ExitStatusOfTheCommandPassesThrough) {
    std::vector<std::string> env{"IBV_EXTEND_SOCKET=" + broker_->socket()};
    EXPECT_EQ(run({"sh", "-c", "exit 7"}, env).exit_code, 7);
    EXPECT_EQ(run({"true"}, env).exit_code, 0);
    // exec, not a child: a signal that ends the command ends the run the same way.
    EXPECT_EQ(run({"sh", "-c", "kill -TERM $$"}, env).exit_code, 128 + SIGTERM);
    // Arguments reach the command unchanged, options after COMMAND included.
    ProcessResult args = run({"printf", "%s|", "--socket", "a b", ""}, env);
    EXPECT_EQ(args.out, "--socket|a b||");
}

TEST_F(IbvExtendRunBroker, MissingCommandExits127AsEnvDoes) {
    ProcessResult r = run({"ibvx-no-such-command"}, {"IBV_EXTEND_SOCKET=" + broker_->socket()});
    EXPECT_EQ(r.exit_code, 127);
    EXPECT_NE(r.err.find("ibvx-no-such-command"), std::string::npos) << r.err;
    TempDir dir;
    std::string not_executable = dir.path() + "/script";
    std::ofstream(not_executable) << "exit 0\n";  // mode 0644: there, but not executable
    EXPECT_EQ(run({not_executable}, {"IBV_EXTEND_SOCKET=" + broker_->socket()}).exit_code, 126);
}

}  // namespace
