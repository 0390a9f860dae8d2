// The operator's path from docs/mlx5.md: a config file with `driver ibvx_mlx5` makes the
// project's loader (the one libibv_extend.so and ibv-extendd carry) load libibvx_mlx5.so and
// list a driver named "mlx5", on a host that has no mlx5 device at all.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "providers/loader/loader.h"

namespace {

class Mlx5ViaLoader : public ::testing::Test {
  protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ibvx.XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        dir_ = tmpl;
        conf_ = dir_ + "/mlx5.conf";
        FILE *f = std::fopen(conf_.c_str(), "w");
        ASSERT_NE(f, nullptr);
        std::fputs("# ConnectX NICs\ndriver ibvx_mlx5\n", f);
        std::fclose(f);
        setenv("IBV_EXTEND_CONFIG_DIR", dir_.c_str(), 1);  // never the host's /etc
        unsetenv("IBV_EXTEND_DRIVERS");
    }
    void TearDown() override {
        unlink(conf_.c_str());
        rmdir(dir_.c_str());
    }
    std::string dir_;
    std::string conf_;
};

TEST_F(Mlx5ViaLoader, ConfigLineLoadsTheDriverWhichRegistersAsMlx5) {
    ibvx::loader::loadAll();

    bool loaded = false;
    for (const auto &r : ibvx::loader::loadRecords()) {
        if (r.name == "ibvx_mlx5") {
            EXPECT_TRUE(r.loaded) << r.error;
            EXPECT_EQ(r.source.rfind(conf_, 0), 0u) << r.source;  // "<file>:<line>"
            loaded = r.loaded;
        }
    }
    EXPECT_TRUE(loaded);

    const verbs_device_extend_ops *drv = nullptr;
    for (const auto &d : ibvx::loader::drivers()) {
        if (d.name == "mlx5") {
            drv = d.ops;
            EXPECT_NE(d.library.find("libibvx_mlx5.so"), std::string::npos) << d.library;
        }
    }
    ASSERT_NE(drv, nullptr);
    EXPECT_EQ(ibvx::loader::findDriverByName("mlx5"), drv);
    errno = 0;
    EXPECT_EQ(drv->alloc_context(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
}

}  // namespace
