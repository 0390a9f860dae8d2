// Loads the built libibvx_mlx5.so the way the loader does and checks what it registers. This
// executable provides verbs_register_driver_extend itself (exported), exactly as libibv_extend
// or ibv-extendd do for a driver that must not link them.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <ibv_extend.h>
#include <link.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {
std::vector<const verbs_device_extend_ops *> g_registered;
}

extern "C" void verbs_register_driver_extend(const verbs_device_extend_ops *ops) {
    g_registered.push_back(ops);
}

namespace {

struct FakeVerbsDevice {
    ibv_device device;
    const void *ops;  // not mlx5's
};

void *loadDriver() {
    const char *dir = std::getenv("IBV_EXTEND_PROVIDER_DIR");
    if (dir == nullptr) {
        ADD_FAILURE() << "IBV_EXTEND_PROVIDER_DIR is not set";
        return nullptr;
    }
    std::string path = std::string(dir) + "/libibvx_mlx5.so";
    void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(h, nullptr) << dlerror();
    return h;
}

std::vector<std::string> neededLibraries(void *handle) {
    link_map *lm = nullptr;
    std::vector<std::string> out;
    if (dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || lm == nullptr) {
        return out;
    }
    const char *strtab = nullptr;
    std::vector<uint64_t> offsets;
    for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; ++d) {
        if (d->d_tag == DT_STRTAB) {
            uintptr_t p = d->d_un.d_ptr;
            // glibc relocates the dynamic section in place on most targets; not on all.
            strtab = reinterpret_cast<const char *>(p < lm->l_addr ? p + lm->l_addr : p);
        } else if (d->d_tag == DT_NEEDED) {
            offsets.push_back(d->d_un.d_val);
        }
    }
    for (uint64_t off : offsets) {
        out.emplace_back(strtab + off);
    }
    return out;
}

TEST(Mlx5Registration, RegistersMlx5OnLoadAndRefusesWhatItCannotServe) {
    void *h = loadDriver();
    ASSERT_NE(h, nullptr);
    ASSERT_EQ(g_registered.size(), 1u);
    const verbs_device_extend_ops *drv = g_registered[0];
    EXPECT_STREQ(drv->name, "mlx5");
    ASSERT_NE(drv->alloc_context, nullptr);
    ASSERT_NE(drv->free_context, nullptr);

    errno = 0;
    EXPECT_EQ(drv->alloc_context(nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);

    FakeVerbsDevice dev{};
    std::strcpy(dev.device.name, "rxe0");
    ibv_context ctx{};
    ctx.device = &dev.device;
    errno = 0;
    EXPECT_EQ(drv->alloc_context(&ctx), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);

    // Loading again registers nothing new (the constructor ran once).
    void *h2 = loadDriver();
    EXPECT_EQ(h2, h);
    EXPECT_EQ(g_registered.size(), 1u);
}

TEST(Mlx5Registration, DoesNotLinkLibibvExtendAndExportsNothing) {
    void *h = loadDriver();
    ASSERT_NE(h, nullptr);
    std::vector<std::string> needed = neededLibraries(h);
    ASSERT_FALSE(needed.empty());
    bool mlx5 = false;
    for (const std::string &n : needed) {
        EXPECT_EQ(n.find("libibv_extend"), std::string::npos) << n;
        mlx5 = mlx5 || n.rfind("libmlx5.so", 0) == 0;
    }
    EXPECT_TRUE(mlx5);
    // Internals are hidden: a loading process can neither call nor interpose them.
    EXPECT_EQ(dlsym(h, "_ZN4ibvx4mlx512allocContextEP11ibv_context"), nullptr);
}

}  // namespace
