// The discovery rules one at a time: config parsing, config dir trust, the driver list, how a
// name becomes a dlopen() path.
#include "providers/loader/discovery.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/unit/loader/test_support.h"

namespace ibvx::loader::detail {
namespace {

using test::DiscoveryEnv;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> names(const std::vector<ConfigName> &v) {
    std::vector<std::string> out;
    for (const ConfigName &c : v) {
        out.push_back(c.name);
    }
    return out;
}

std::vector<std::string> parse(const std::string &text) {
    std::vector<ConfigName> out;
    parseConfig(text, "test.conf", &out);
    return names(out);
}

TEST(ParseConfig, DriverLinesCommentsAndBlankLines) {
    EXPECT_THAT(parse("# a comment\n\ndriver alpha\n   \n\tdriver   beta  \n#driver gamma\n"),
                ElementsAre("alpha", "beta"));
}

TEST(ParseConfig, LastLineWithoutNewlineAndCrLf) {
    EXPECT_THAT(parse("driver alpha\r\ndriver beta"), ElementsAre("alpha", "beta"));
}

TEST(ParseConfig, UnknownDirectiveIgnoredWithWarning) {
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_THAT(parse("provider alpha\ndriverx beta\ndriver gamma\n"), ElementsAre("gamma"));
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr("ibv_extend: Warning: test.conf:1: unknown directive 'provider'"));
    EXPECT_THAT(err, HasSubstr("test.conf:2: unknown directive 'driverx'"));
}

TEST(ParseConfig, BadCharactersRejected) {
    EXPECT_THAT(parse("driver a/b\ndriver ../x\ndriver a.so\ndriver a b\ndriver é\ndriver Ok_-9\n"),
                ElementsAre("Ok_-9"));
}

TEST(ParseConfig, NameLengthLimitIs128) {
    std::string n128(128, 'a');
    std::string n129(129, 'b');
    EXPECT_THAT(parse("driver " + n129 + "\ndriver " + n128 + "\n"), ElementsAre(n128));
}

TEST(ParseConfig, DriverWithoutNameIgnored) {
    EXPECT_THAT(parse("driver\ndriver   \n"), IsEmpty());
}

TEST(ParseConfig, SourceNamesFileAndLine) {
    std::vector<ConfigName> out;
    parseConfig("\n#x\ndriver alpha\n", "/etc/x.conf", &out);
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].source, "/etc/x.conf:3");
}

TEST(ValidDriverName, Charset) {
    EXPECT_TRUE(validDriverName("mlx5"));
    EXPECT_TRUE(validDriverName("A-z_0"));
    EXPECT_FALSE(validDriverName(""));
    EXPECT_FALSE(validDriverName("a:b"));
    EXPECT_FALSE(validDriverName("/abs"));
    EXPECT_FALSE(validDriverName(std::string(129, 'x')));
    EXPECT_TRUE(validDriverName(std::string(128, 'x')));
}

TEST(SplitDriverList, BothSeparatorsAndEmptyEntries) {
    EXPECT_THAT(splitDriverList("a:b;c"), ElementsAre("a", "b", "c"));
    EXPECT_THAT(splitDriverList(";:a;;b::"), ElementsAre("a", "b"));
    EXPECT_THAT(splitDriverList("/x/liba.so;b"), ElementsAre("/x/liba.so", "b"));
    EXPECT_THAT(splitDriverList(""), IsEmpty());
}

TEST(ReadConfigDir, ReadsRegularFilesSortedByName) {
    DiscoveryEnv env;
    env.configFile("20-b.conf", "driver beta\n");
    env.configFile("10-a.conf", "driver alpha\n");
    env.configFile("no-suffix", "driver gamma\n");  // every regular file counts, not only *.conf
    EXPECT_THAT(names(readConfigDir(env.configDir())), ElementsAre("alpha", "beta", "gamma"));
}

TEST(ReadConfigDir, SymlinkSkipped) {
    DiscoveryEnv env;
    std::string target = env.tmp().file("outside.conf", "driver beta\n");
    ASSERT_EQ(symlink(target.c_str(), (env.configDir() + "/link.conf").c_str()), 0);
    env.configFile("real.conf", "driver alpha\n");
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_THAT(names(readConfigDir(env.configDir())), ElementsAre("alpha"));
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("link.conf is a symlink; skipped"));
}

TEST(ReadConfigDir, FileOwnedByAnotherUserSkipped) {
    ASSERT_EQ(getuid(), 0u) << "the suite runs as root so it can chown";
    DiscoveryEnv env;
    std::string foreign = env.configFile("foreign.conf", "driver beta\n");
    ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
    env.configFile("mine.conf", "driver alpha\n");
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_THAT(names(readConfigDir(env.configDir())), ElementsAre("alpha"));
    EXPECT_THAT(testing::internal::GetCapturedStderr(), HasSubstr("owned by uid 65534"));
}

TEST(ReadConfigDir, SubdirectoriesIgnored) {
    DiscoveryEnv env;
    ASSERT_EQ(mkdir((env.configDir() + "/sub.conf").c_str(), 0755), 0);
    env.configFile("a.conf", "driver alpha\n");
    EXPECT_THAT(names(readConfigDir(env.configDir())), ElementsAre("alpha"));
}

TEST(ReadConfigDir, MissingDirIsEmptyAndSilent) {
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_THAT(readConfigDir("/nonexistent/ibvx-conf"), IsEmpty());
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(Directories, EnvironmentOverridesBuildDefaults) {
    setenv("IBV_EXTEND_CONFIG_DIR", "/tmp/ibvx-c", 1);
    setenv("IBV_EXTEND_PROVIDER_DIR", "/tmp/ibvx-p", 1);
    EXPECT_EQ(configDir(), "/tmp/ibvx-c");
    EXPECT_EQ(providerDir(), "/tmp/ibvx-p");
    unsetenv("IBV_EXTEND_CONFIG_DIR");
    unsetenv("IBV_EXTEND_PROVIDER_DIR");
    EXPECT_EQ(configDir(), IBVX_EXPECTED_CONFIG_DIR);
    EXPECT_EQ(providerDir(), IBVX_EXPECTED_PROVIDER_DIR);
}

TEST(Directories, EnvironmentIgnoredWhenPrivilegesDiffer) {
    setenv("IBV_EXTEND_CONFIG_DIR", "/tmp/ibvx-c", 1);
    setenv("IBV_EXTEND_PROVIDER_DIR", "/tmp/ibvx-p", 1);
    EXPECT_EXIT(
        {
            // Like a setuid program: real uid stays, effective uid changes.
            if (setresuid(static_cast<uid_t>(-1), 65534, static_cast<uid_t>(-1)) < 0) {
                _exit(2);
            }
            bool ok = !environmentTrusted() && configDir() == IBVX_EXPECTED_CONFIG_DIR &&
                      providerDir() == IBVX_EXPECTED_PROVIDER_DIR;
            _exit(ok ? 0 : 1);
        },
        testing::ExitedWithCode(0), "");
}

TEST(LoadDriverLibrary, NameResolvesInProviderDir) {
    DiscoveryEnv env;
    LoadRecord rec = loadDriverLibrary("ibvxtest_alpha", "env");
    EXPECT_TRUE(rec.loaded) << rec.error;
    EXPECT_EQ(rec.path, test::driverPath("ibvxtest_alpha"));
    EXPECT_EQ(rec.source, "env");
}

TEST(LoadDriverLibrary, MissingNameFallsBackToSearchPathThenFails) {
    DiscoveryEnv env;
    LoadRecord rec = loadDriverLibrary("ibvxtest_nosuch", "env");
    EXPECT_FALSE(rec.loaded);
    EXPECT_EQ(rec.path, "libibvxtest_nosuch.so");  // the last attempt: the normal search path
    EXPECT_THAT(rec.error, HasSubstr(test::driverPath("ibvxtest_nosuch")));
}

TEST(LoadDriverLibrary, AbsolutePathLoadedAsIs) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_PROVIDER_DIR", "/nonexistent", 1);
    LoadRecord rec = loadDriverLibrary(test::driverPath("ibvxtest_beta"), "env");
    EXPECT_TRUE(rec.loaded) << rec.error;
    EXPECT_EQ(rec.path, test::driverPath("ibvxtest_beta"));
}

TEST(LoadDriverLibrary, AbsolutePathWithDotDotRejected) {
    DiscoveryEnv env;
    std::string p = test::driverDir() + "/../drivers-out/libibvxtest_beta.so";
    ASSERT_EQ(access(p.c_str(), R_OK), 0) << "the file exists; only the '..' must stop it";
    LoadRecord rec = loadDriverLibrary(p, "env");
    EXPECT_FALSE(rec.loaded);
    EXPECT_TRUE(rec.path.empty());
    EXPECT_THAT(rec.error, HasSubstr(".."));
    EXPECT_EQ(test::driverControl("ibvxtest_beta"), nullptr) << "must not have been dlopen()ed";
}

TEST(LoadDriverLibrary, RelativePathRejected) {
    DiscoveryEnv env;
    LoadRecord rec = loadDriverLibrary("../drivers-out/ibvxtest_beta", "env");
    EXPECT_FALSE(rec.loaded);
    EXPECT_TRUE(rec.path.empty());
}

TEST(LoadDriverLibrary, MissingAbsoluteFileReportsDlerror) {
    DiscoveryEnv env;
    LoadRecord rec = loadDriverLibrary("/nonexistent/libx.so", "env");
    EXPECT_FALSE(rec.loaded);
    EXPECT_THAT(rec.error, HasSubstr("/nonexistent/libx.so"));
}

}  // namespace
}  // namespace ibvx::loader::detail
