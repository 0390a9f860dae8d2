// Lookups racing the first discovery: every thread gets its driver and each library is loaded
// once. Runs under ThreadSanitizer too (label tsan).
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "providers/loader/loader.h"
#include "tests/unit/loader/test_support.h"

namespace ibvx::loader {
namespace {

using test::DiscoveryEnv;
using ::testing::ElementsAre;

IBVX_FAKE_DEVICE(alpha_dev, "alpha");
IBVX_FAKE_DEVICE(beta_dev, "beta");

std::vector<std::string> recordNames() {
    std::vector<std::string> out;
    for (const LoadRecord &r : loadRecords()) {
        out.push_back(r.name);
    }
    return out;
}

TEST(Registry, ConcurrentFirstLookupsDiscoverOnce) {
    DiscoveryEnv env;
    setenv("IBV_EXTEND_DRIVERS", "ibvxtest_alpha:ibvxtest_beta", 1);
    std::vector<std::thread> threads;
    std::vector<const verbs_device_extend_ops *> found(8, nullptr);
    for (size_t i = 0; i < found.size(); ++i) {
        threads.emplace_back(
            [i, &found] { found[i] = findDriver(i % 2 ? &alpha_dev.device : &beta_dev.device); });
    }
    for (std::thread &t : threads) {
        t.join();
    }
    for (size_t i = 0; i < found.size(); ++i) {
        ASSERT_NE(found[i], nullptr) << i;
        EXPECT_STREQ(found[i]->name, i % 2 ? "alpha" : "beta");
    }
    EXPECT_THAT(recordNames(), ElementsAre("ibvxtest_alpha", "ibvxtest_beta"));
}

}  // namespace
}  // namespace ibvx::loader
