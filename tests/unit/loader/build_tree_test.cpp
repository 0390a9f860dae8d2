// Which provider dir a binary falls back to without IBV_EXTEND_PROVIDER_DIR: the build tree's
// when it runs from the build tree (tests, build/daemon/ibv-extendd, build/client/libibv_extend.so),
// its own install prefix's when installed, the configured one otherwise.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "providers/loader/discovery.h"

namespace ibvx::loader::detail {
namespace {

std::string buildDir() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    char real[PATH_MAX];
    return b != nullptr && realpath(b, real) != nullptr ? real : "";
}

TEST(DefaultProviderDir, InsideTheBuildTreeIsTheBuildTreesProviderDir) {
    std::string build = buildDir();
    ASSERT_FALSE(build.empty()) << "IBVX_BUILD_DIR is not set";
    std::string want = std::string(std::getenv("IBVX_BUILD_DIR")) + "/providers-out";
    EXPECT_EQ(defaultProviderDir(build + "/daemon/ibv-extendd"), want);
    EXPECT_EQ(defaultProviderDir(build + "/client/libibv_extend.so.4"), want);
}

TEST(DefaultProviderDir, OutsideTheBuildTreeIsTheInstalledDir) {
    std::string build = buildDir();
    ASSERT_FALSE(build.empty()) << "IBVX_BUILD_DIR is not set";
    EXPECT_EQ(defaultProviderDir("/usr/local/sbin/ibv-extendd"), IBVX_INSTALLED_PROVIDER_DIR);
    // A sibling whose name merely starts with the build dir's is not inside it.
    EXPECT_EQ(defaultProviderDir(build + "-installed/sbin/ibv-extendd"), IBVX_INSTALLED_PROVIDER_DIR);
    EXPECT_EQ(defaultProviderDir(build), IBVX_INSTALLED_PROVIDER_DIR);
    EXPECT_EQ(defaultProviderDir(""), IBVX_INSTALLED_PROVIDER_DIR);
}

TEST(InstallPrefixOf, IsTheDirAboveBinSbinOrLib) {
    EXPECT_EQ(installPrefixOf("/opt/ibvx/sbin/ibv-extendd"), "/opt/ibvx");
    EXPECT_EQ(installPrefixOf("/opt/ibvx/bin/ibvx-demo"), "/opt/ibvx");
    EXPECT_EQ(installPrefixOf("/usr/lib/libibv_extend.so.4"), "/usr");
    EXPECT_EQ(installPrefixOf("/sbin/ibv-extendd"), "");
    EXPECT_EQ(installPrefixOf("/opt/ibvx/libexec/ibv-extendd"), std::nullopt);
    EXPECT_EQ(installPrefixOf("/opt/mybin/ibv-extendd"), std::nullopt);
    EXPECT_EQ(installPrefixOf("/ibv-extendd"), std::nullopt);
    EXPECT_EQ(installPrefixOf("ibv-extendd"), std::nullopt);
    EXPECT_EQ(installPrefixOf(""), std::nullopt);
}

// A prefix laid out as `cmake --install --prefix` leaves it, outside the build tree.
class InstalledPrefix : public ::testing::Test {
  protected:
    void SetUp() override {
        if (std::string(IBVX_PREFIX_PROVIDER_DIR).empty()) {
            GTEST_SKIP() << "IBVX_PROVIDER_DIR lies outside the install prefix: not relocatable";
        }
        char tmpl[] = "/tmp/ibvx-prefix.XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        prefix_ = tmpl;
        drivers_ = prefix_ + "/" + IBVX_PREFIX_PROVIDER_DIR;
        std::filesystem::create_directories(drivers_);
    }
    void TearDown() override {
        if (!prefix_.empty()) {
            std::filesystem::remove_all(prefix_);
        }
    }
    std::string prefix_, drivers_;
};

TEST_F(InstalledPrefix, ProgramsAndTheLibraryUseTheirOwnPrefixsDir) {
    EXPECT_EQ(defaultProviderDir(prefix_ + "/sbin/ibv-extendd"), drivers_);
    EXPECT_EQ(defaultProviderDir(prefix_ + "/bin/ibvx-demo"), drivers_);
    EXPECT_EQ(defaultProviderDir(prefix_ + "/lib/libibv_extend.so.4"), drivers_);
}

TEST_F(InstalledPrefix, ElsewhereOrWithoutTheDirIsTheConfiguredDir) {
    EXPECT_EQ(defaultProviderDir(prefix_ + "/libexec/ibv-extendd"), IBVX_INSTALLED_PROVIDER_DIR);
    std::filesystem::remove_all(drivers_);
    EXPECT_EQ(defaultProviderDir(prefix_ + "/sbin/ibv-extendd"), IBVX_INSTALLED_PROVIDER_DIR);
}

// This test binary lives in the build tree, so with no environment override it finds the build
// tree's drivers.
TEST(DefaultProviderDir, ThisBuildTreeBinaryUsesTheBuildTreesDir) {
    unsetenv("IBV_EXTEND_PROVIDER_DIR");
    EXPECT_EQ(providerDir(), std::string(std::getenv("IBVX_BUILD_DIR")) + "/providers-out");
}

}  // namespace
}  // namespace ibvx::loader::detail
