// Which provider dir a binary falls back to without IBV_EXTEND_PROVIDER_DIR: the build tree's
// when it runs from the build tree (tests, build/daemon/ibv-extendd, build/client/libibv_extend.so),
// the installed one otherwise.
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>

#include <cstdlib>
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

// This test binary lives in the build tree, so with no environment override it finds the build
// tree's drivers.
TEST(DefaultProviderDir, ThisBuildTreeBinaryUsesTheBuildTreesDir) {
    unsetenv("IBV_EXTEND_PROVIDER_DIR");
    EXPECT_EQ(providerDir(), std::string(std::getenv("IBVX_BUILD_DIR")) + "/providers-out");
}

}  // namespace
}  // namespace ibvx::loader::detail
