// ibv-extend-run, refused by the socket's permissions, says whose group and mode refused and
// what to do (usermod -aG, log in again), instead of "no broker answers ...: Permission denied".
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "run_process.h"
#include "tests/integration/daemon/broker_process.h"

namespace ibvx::test {
namespace {

std::string runBinary() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    return std::string(b != nullptr ? b : ".") + "/tools/ibv-extend-run/ibv-extend-run";
}

class RunPermission : public ::testing::Test {
  protected:
    void SetUp() override {
        if (::geteuid() != 0) {
            GTEST_SKIP() << "needs root to run a child as uid 65534";
        }
        const passwd *pw = ::getpwuid(65534);
        nobody_ = pw != nullptr ? pw->pw_name : "65534";
    }
    ProcessResult runAsNobody(const std::string &socket) {
        RunOptions o;
        o.uid = 65534;  // its own gid only (setgroups(0)): not in root's group
        return runProcess({runBinary(), "--socket", socket, "--", "true"}, o);
    }
    std::string nobody_;
};

TEST_F(RunPermission, TheSocketsGroupAndModeAndTheFixAreNamed) {
    BrokerProcess broker("[broker]\nsocket_mode = \"0660\"\nsocket_group = \"root\"\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    ASSERT_EQ(::chmod(broker.dir().c_str(), 0755), 0);
    ProcessResult r = runAsNobody(broker.socket());
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("permission denied on the broker socket " + broker.socket() +
                         ": it is owned by root:root with mode 0660"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("user '" + nobody_ + "' (uid 65534) is not in group 'root'"), std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("usermod -aG root " + nobody_), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("log in again"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("no broker answers"), std::string::npos) << r.err;
}

TEST_F(RunPermission, AClosedDirectoryIsNamed) {
    BrokerProcess broker("[broker]\nsocket_mode = \"0666\"\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    ASSERT_EQ(::chmod(broker.dir().c_str(), 0750), 0);
    ProcessResult r = runAsNobody(broker.socket());
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("its directory " + broker.dir() + " is owned by root:root with mode 0750"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("usermod -aG root " + nobody_), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ibvx::test
