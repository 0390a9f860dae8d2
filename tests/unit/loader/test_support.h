// Shared by the loader and client tests: temp dirs, a clean discovery environment, fake rdma-core
// devices with rdma-core's leading verbs_device layout, and access to the test drivers.
#pragma once

#include <dlfcn.h>
#include <ftw.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/loader/drivers/testdrv_core.h"

#ifndef IBVX_TEST_DRIVER_DIR
#error "IBVX_TEST_DRIVER_DIR must come from the build"
#endif

namespace ibvx::test {

// mkdtemp under /tmp (short paths), removed recursively on destruction.
class TempDir {
  public:
    TempDir() {
        char tmpl[] = "/tmp/ibvx.XXXXXX";
        char *p = mkdtemp(tmpl);
        if (p == nullptr) {
            ADD_FAILURE() << "mkdtemp failed";
            return;
        }
        path_ = p;
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    ~TempDir() {
        if (!path_.empty()) {
            nftw(
                path_.c_str(),
                [](const char *p, const struct stat *, int, struct FTW *) { return remove(p); }, 16,
                FTW_DEPTH | FTW_PHYS);
        }
    }
    const std::string &path() const { return path_; }
    std::string file(const std::string &name, const std::string &text) const {
        std::string p = path_ + "/" + name;
        std::ofstream(p) << text;
        return p;
    }

  private:
    std::string path_;
};

inline std::string driverDir() {
    return IBVX_TEST_DRIVER_DIR;
}
inline std::string driverPath(const std::string &lib) {
    return driverDir() + "/lib" + lib + ".so";
}

// The control block of a loaded test driver (nullptr when that library is not loaded).
inline struct testdrv_control *driverControl(const std::string &lib) {
    void *h = dlopen(driverPath(lib).c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) {
        return nullptr;
    }
    auto fn = reinterpret_cast<struct testdrv_control *(*)()>(dlsym(h, "testdrv_get_control"));
    struct testdrv_control *c = fn != nullptr ? fn() : nullptr;
    dlclose(h);
    return c;
}

// Discovery sees only what a test puts in place: an empty config dir of its own, the test
// drivers as provider dir, no driver list, no warnings, direct mode.
class DiscoveryEnv {
  public:
    DiscoveryEnv() : config_dir_(dir_.path() + "/conf") {
        mkdir(config_dir_.c_str(), 0755);
        setenv("IBV_EXTEND_CONFIG_DIR", config_dir_.c_str(), 1);
        setenv("IBV_EXTEND_PROVIDER_DIR", driverDir().c_str(), 1);
        unsetenv("IBV_EXTEND_DRIVERS");
        unsetenv("IBV_EXTEND_SHOW_WARNINGS");
        // These tests are about direct mode: never let a broker on this host answer instead.
        setenv("IBV_EXTEND_MODE", "direct", 1);
    }
    const std::string &configDir() const { return config_dir_; }
    const TempDir &tmp() const { return dir_; }
    std::string configFile(const std::string &name, const std::string &text) const {
        return dir_.file("conf/" + name, text);
    }

  private:
    TempDir dir_;
    std::string config_dir_;
};

// rdma-core's struct verbs_device / verbs_device_ops, as far as the loader may look.
struct FakeVerbsDeviceOps {
    const char *name;
};
struct FakeVerbsDevice {
    ibv_device device;
    const FakeVerbsDeviceOps *ops;
};

}  // namespace ibvx::test

// Static storage, like a provider's ops table: the loader's trust check needs the ops and the
// name inside a loaded object.
#define IBVX_FAKE_DEVICE(var, provider)                                   \
    static const ::ibvx::test::FakeVerbsDeviceOps var##_ops = {provider}; \
    static ::ibvx::test::FakeVerbsDevice var = {{}, &var##_ops}
