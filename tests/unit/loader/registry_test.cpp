// Registration, lazy discovery and device matching, end to end through the loader's API with
// the test drivers. Every TEST runs in its own process (gtest_discover_tests), so each starts
// with an empty registry.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "providers/loader/loader.h"
#include "tests/unit/loader/test_support.h"

namespace ibvx::loader {
namespace {

using test::DiscoveryEnv;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

IBVX_FAKE_DEVICE(alpha_dev, "alpha");
IBVX_FAKE_DEVICE(beta_dev, "beta");
IBVX_FAKE_DEVICE(gamma_dev, "gamma");
IBVX_FAKE_DEVICE(nosuch_dev, "nosuch");
IBVX_FAKE_DEVICE(local_dev, "local");

ibv_context_extend *nullAlloc(ibv_context *) {
    return nullptr;
}
const verbs_device_extend_ops kLocalDriver = {"local", nullAlloc, nullptr};

std::vector<std::string> driverNames() {
    std::vector<std::string> out;
    for (const DriverInfo &d : drivers()) {
        out.push_back(d.name);
    }
    return out;
}

std::vector<std::string> recordNames() {
    std::vector<std::string> out;
    for (const LoadRecord &r : loadRecords()) {
        out.push_back(r.name);
    }
    return out;
}

TEST(Registry, ExecutableExportsRegistrationSymbols) {
    // Drivers resolve these from the process: linking ibvx_loader must have exported them.
    EXPECT_NE(dlsym(RTLD_DEFAULT, "verbs_register_driver_extend"), nullptr);
    EXPECT_NE(dlsym(RTLD_DEFAULT, "verbs_register_vdev_extend"), nullptr);
}

TEST(Registry, RegisteredDriverFoundWithoutDiscovery) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    verbs_register_driver_extend(&kLocalDriver);
    EXPECT_EQ(findDriver(&local_dev.device), &kLocalDriver);
    EXPECT_FALSE(discovered()) << "a match must not trigger discovery";
    EXPECT_THAT(loadRecords(), IsEmpty());
}

TEST(Registry, FirstMissRunsDiscovery) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    const verbs_device_extend_ops *d = findDriver(&alpha_dev.device);
    ASSERT_NE(d, nullptr);
    EXPECT_STREQ(d->name, "alpha");
    EXPECT_TRUE(discovered());
    ASSERT_EQ(loadRecords().size(), 1u);
    EXPECT_TRUE(loadRecords()[0].loaded);
    EXPECT_EQ(loadRecords()[0].source, "env");
}

TEST(Registry, DiscoveryRunsOnlyOnce) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    EXPECT_EQ(findDriver(&nosuch_dev.device), nullptr);
    size_t records = loadRecords().size();
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_beta", 1);
    EXPECT_EQ(findDriver(&beta_dev.device), nullptr) << "later misses must not rescan";
    EXPECT_EQ(loadRecords().size(), records);
}

TEST(Registry, NoDriverForDeviceIsNull) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    EXPECT_EQ(findDriver(&nosuch_dev.device), nullptr);
    EXPECT_EQ(findDriver(nullptr), nullptr);
}

TEST(Registry, EnvListSplitsOnColonAndSemicolon) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", ";ibvxtest_alpha;:ibvxtest_beta:", 1);
    loadAll();
    EXPECT_THAT(recordNames(), ElementsAre("ibvxtest_alpha", "ibvxtest_beta"));
    EXPECT_THAT(driverNames(), UnorderedElementsAre("alpha", "beta"));
}

TEST(Registry, EnvListIgnoredWhenPrivilegesDiffer) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    EXPECT_EXIT(
        {
            // Like a setuid program: the caller's list must not be loaded.
            if (setresuid(static_cast<uid_t>(-1), 65534, static_cast<uid_t>(-1)) < 0) {
                _exit(2);
            }
            loadAll();
            bool any_env = false;
            for (const LoadRecord &r : loadRecords()) {
                any_env = any_env || r.source == "env";
            }
            _exit(!any_env && findDriverByName("alpha") == nullptr ? 0 : 1);
        },
        testing::ExitedWithCode(0), "");
    // The same setup with equal ids does load it: the test above is not vacuous.
    loadAll();
    EXPECT_NE(findDriverByName("alpha"), nullptr);
}

TEST(Registry, DriverMatchedByProviderName) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha:ibvxtest_beta", 1);
    const verbs_device_extend_ops *a = findDriver(&alpha_dev.device);
    const verbs_device_extend_ops *b = findDriver(&beta_dev.device);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    EXPECT_STREQ(a->name, "alpha");
    EXPECT_STREQ(b->name, "beta");
    EXPECT_EQ(a, findDriverByName("alpha"));
    EXPECT_EQ(findDriverByName("alph"), nullptr);
}

TEST(Registry, ConfigDirNamesLoadAfterEnvList) {
    DiscoveryEnv env;
    std::string conf = env.configFile("10.conf", "# drivers\ndriver ibvxtest_beta\n");
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha", 1);
    loadAll();
    std::vector<LoadRecord> recs = loadRecords();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_EQ(recs[0].name, "ibvxtest_alpha");
    EXPECT_EQ(recs[0].source, "env");
    EXPECT_EQ(recs[1].name, "ibvxtest_beta");
    EXPECT_EQ(recs[1].source, conf + ":2");
    EXPECT_TRUE(recs[1].loaded);
}

TEST(Registry, ConfigDirTrustRulesEndToEnd) {
    DiscoveryEnv env;
    env.configFile("a.conf", "driver ibvxtest_alpha\nbogus line\n\ndriver bad!name\ndriver " +
                                 std::string(129, 'x') + "\n");
    std::string outside = env.tmp().file("outside.conf", "driver ibvxtest_beta\n");
    ASSERT_EQ(symlink(outside.c_str(), (env.configDir() + "/b.conf").c_str()), 0);
    std::string foreign = env.configFile("c.conf", "driver ibvxtest_dup\n");
    ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
    loadAll();
    EXPECT_THAT(recordNames(), ElementsAre("ibvxtest_alpha"));
    EXPECT_THAT(driverNames(), ElementsAre("alpha"));
}

TEST(Registry, AbsolutePathInEnvList) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_PROVIDER_DIR", "/nonexistent", 1);
    setenv("IBV_EXTEND_DRIVERS", test::driverPath("ibvxtest_beta").c_str(), 1);
    EXPECT_NE(findDriver(&beta_dev.device), nullptr);
}

TEST(Registry, DotDotPathRejectedAndOthersStillLoad) {
    DiscoveryEnv env;
    std::string bad = test::driverDir() + "/../drivers-out/libibvxtest_beta.so";
    setenv("IBV_EXTEND_DRIVERS", (bad + ":ibvxtest_alpha").c_str(), 1);
    loadAll();
    std::vector<LoadRecord> recs = loadRecords();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_FALSE(recs[0].loaded);
    EXPECT_THAT(recs[0].error, HasSubstr(".."));
    EXPECT_TRUE(recs[1].loaded);
    EXPECT_EQ(findDriverByName("beta"), nullptr);
    EXPECT_NE(findDriverByName("alpha"), nullptr);
}

TEST(Registry, MissingLibraryWarnsAndContinues) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_nosuch:ibvxtest_alpha", 1);
    testing::internal::CaptureStderr();
    loadAll();
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(err, HasSubstr("ibv_extend: Warning: couldn't load driver 'ibvxtest_nosuch'"));
    std::vector<LoadRecord> recs = loadRecords();
    ASSERT_EQ(recs.size(), 2u);
    EXPECT_FALSE(recs[0].loaded);
    EXPECT_FALSE(recs[0].error.empty());
    EXPECT_TRUE(recs[1].loaded);
    EXPECT_THAT(driverNames(), ElementsAre("alpha"));
}

TEST(Registry, WarningsSilentWithoutShowWarnings) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_nosuch:ibvxtest_badreg", 1);
    env.configFile("a.conf", "unknown directive\n");
    testing::internal::CaptureStderr();
    loadAll();
    EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
    EXPECT_FALSE(loadRecords()[0].loaded) << "the failure happened, it just was not printed";
}

TEST(Registry, DuplicateRegistrationFirstWins) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha:ibvxtest_dup", 1);
    testing::internal::CaptureStderr();
    loadAll();
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(driverNames(), ElementsAre("alpha", "gamma"));  // dup's alpha and second gamma refused
    EXPECT_THAT(err, HasSubstr("driver 'alpha' is already registered"));
    EXPECT_THAT(err, HasSubstr("driver 'gamma' is already registered"));
    for (const DriverInfo &d : drivers()) {
        if (d.name == "alpha") {
            EXPECT_EQ(d.library, test::driverPath("ibvxtest_alpha"));
        }
    }
    EXPECT_NE(findDriver(&gamma_dev.device), nullptr);
}

TEST(Registry, NullOpsNullNameAndBadVdevRegistrationsIgnored) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_badreg", 1);
    testing::internal::CaptureStderr();
    loadAll();
    std::string err = testing::internal::GetCapturedStderr();
    EXPECT_THAT(driverNames(), ElementsAre("badreg_ok"));
    EXPECT_THAT(vdevProviders(), IsEmpty());
    EXPECT_THAT(err, HasSubstr("verbs_register_driver_extend: NULL ops"));
    EXPECT_THAT(err, HasSubstr("verbs_register_driver_extend: ops without a name"));
    EXPECT_THAT(err, HasSubstr("verbs_register_vdev_extend: NULL ops"));
    EXPECT_THAT(err, HasSubstr("verbs_register_vdev_extend: ops without a provider name"));
    EXPECT_THAT(err, HasSubstr("'badreg_abi' has ABI 99"));
}

TEST(Registry, DriversListsLibraryOfEachOpsTable) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_beta", 1);
    loadAll();
    std::vector<DriverInfo> ds = drivers();
    ASSERT_EQ(ds.size(), 1u);
    EXPECT_EQ(ds[0].library, test::driverPath("ibvxtest_beta"));
    EXPECT_EQ(ds[0].ops, findDriverByName("beta"));
}

// A vdev provider of the test itself, claiming a device whose memory also looks like an
// rdma-core device of provider "alpha": the provider's claim must win.
int ownsLocal(const ibv_device *dev) {
    return dev == &alpha_dev.device ? 1 : 0;
}
const ibv_extend_vdev_ops kClaimingProvider = {
    .abi = IBV_EXTEND_VDEV_ABI_V1,
    .provider = "claimer",
    .configure = nullptr,
    .query_devices = nullptr,
    .open_device = nullptr,
    .close_device = nullptr,
    .is_own_device = ownsLocal,
    .alloc_pd = nullptr,
    .dealloc_pd = nullptr,
    .reg_mr = nullptr,
    .dereg_mr = nullptr,
    .modify_qp = nullptr,
    .query_qp = nullptr,
    .export_mmio = nullptr,
    .query_counters = nullptr,
    .query_device = nullptr,
    .query_port = nullptr,
    .query_gid = nullptr,
    .set_cq_event_fd = nullptr,
    .set_async_event_fd = nullptr,
    .export_object = nullptr,
    .import_object = nullptr,
    .set_paused = nullptr,
    .guarantees = 0,
    .open_xrcd = nullptr,
    .close_xrcd = nullptr,
    .create_xrc_srq = nullptr,
    .create_xrc_tgt_qp = nullptr,
    .get_srq_num = nullptr,
    .resize_cq = nullptr,
    .rereg_mr = nullptr,
    .attach_mcast = nullptr,
    .detach_mcast = nullptr,
    .alloc_mw = nullptr,
    .dealloc_mw = nullptr,
    .alloc_dm = nullptr,
    .free_dm = nullptr,
    .reg_dm_mr = nullptr,
    .dm_memory = nullptr,
};
const verbs_device_extend_ops kClaimerDriver = {"claimer", nullAlloc, nullptr};
const verbs_device_extend_ops kAlphaLocalDriver = {"alpha", nullAlloc, nullptr};

TEST(Registry, VdevProviderAskedBeforeLayoutView) {
    DiscoveryEnv env;
    verbs_register_driver_extend(&kAlphaLocalDriver);
    verbs_register_driver_extend(&kClaimerDriver);
    verbs_register_vdev_extend(&kClaimingProvider);
    EXPECT_EQ(findVdevProvider(&alpha_dev.device), &kClaimingProvider);
    EXPECT_EQ(findDriver(&alpha_dev.device), &kClaimerDriver);
    EXPECT_EQ(providerName(&alpha_dev.device), "claimer");
    EXPECT_EQ(findDriver(&beta_dev.device), nullptr);
}

TEST(Registry, VdevProviderDevicesListedAndOpened) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_vdev", 1);
    std::vector<VdevDevice> devs = queryDevices();
    ASSERT_EQ(devs.size(), 2u);
    EXPECT_STREQ(devs[0].attr.name, "testvdev0");
    EXPECT_STREQ(devs[1].attr.name, "testvdev1");
    EXPECT_STREQ(devs[0].provider->provider, "ibvxtestvdev");
    EXPECT_EQ(devs[0].attr.max_qp, 32u);

    OpenedVdev opened;
    ASSERT_EQ(openVdev("testvdev1", &opened), 0);
    ASSERT_NE(opened.context, nullptr);
    EXPECT_STREQ(opened.context->device->name, "testvdev1");
    EXPECT_EQ(findVdevProvider(opened.context->device), devs[0].provider);
    const verbs_device_extend_ops *d = findDriver(opened.context->device);
    ASSERT_NE(d, nullptr);
    EXPECT_STREQ(d->name, "ibvxtestvdev");
    EXPECT_EQ(opened.provider->close_device(opened.context), 0);

    EXPECT_EQ(openVdev("testvdev9", &opened), -ENODEV);
    EXPECT_EQ(openVdev("", &opened), -EINVAL);
    EXPECT_EQ(openVdev("testvdev0", nullptr), -EINVAL);
}

}  // namespace
}  // namespace ibvx::loader
