// The libibverbs face's ABI: it exports what Debian's libibverbs.so.1 exports, programs and
// providers linked against libibverbs load with it, and what it cannot serve fails the
// libibverbs way. The system library is the reference, read from its ELF file.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include "tests/integration/ops/run_process.h"

namespace {

using ibvx::test::ProcessResult;
using ibvx::test::runProcess;

// What a shared library's dynamic section says about its ABI.
struct ElfAbi {
    std::string error;                         // empty when the file was read
    std::string soname;                        // DT_SONAME
    std::set<std::string> symbols;             // "name@@node" (default) or "name@node" (compat)
    std::set<std::string> unversioned;         // defined, exported, with no version
    std::map<std::string, std::string> nodes;  // node -> parent node ("" for none)
};

// Reads .dynsym, .gnu.version and .gnu.version_d of a 64-bit ELF shared library (both targets
// this project builds for are 64-bit).
ElfAbi readElfAbi(const std::string &path) {
    ElfAbi abi;
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) < 0) {
        abi.error = path + ": " + std::strerror(errno);
        if (fd >= 0)
            ::close(fd);
        return abi;
    }
    size_t size = static_cast<size_t>(st.st_size);
    void *map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) {
        abi.error = path + ": mmap: " + std::strerror(errno);
        return abi;
    }
    const auto *base = static_cast<const unsigned char *>(map);
    const auto *eh = reinterpret_cast<const Elf64_Ehdr *>(base);
    if (size < sizeof(Elf64_Ehdr) || std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
        eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_shoff + eh->e_shnum * sizeof(Elf64_Shdr) > size) {
        abi.error = path + ": not a 64-bit ELF file";
        ::munmap(map, size);
        return abi;
    }
    const auto *sh = reinterpret_cast<const Elf64_Shdr *>(base + eh->e_shoff);
    const Elf64_Shdr *dynsym = nullptr, *versym = nullptr, *verdef = nullptr, *dynamic = nullptr;
    for (unsigned i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type == SHT_DYNSYM)
            dynsym = &sh[i];
        if (sh[i].sh_type == SHT_GNU_versym)
            versym = &sh[i];
        if (sh[i].sh_type == SHT_GNU_verdef)
            verdef = &sh[i];
        if (sh[i].sh_type == SHT_DYNAMIC)
            dynamic = &sh[i];
    }
    if (dynsym == nullptr || dynamic == nullptr) {
        abi.error = path + ": no dynamic symbol table";
        ::munmap(map, size);
        return abi;
    }
    const char *dynstr = reinterpret_cast<const char *>(base + sh[dynsym->sh_link].sh_offset);

    std::map<unsigned, std::string> node_names;  // version index -> node
    if (verdef != nullptr) {
        const unsigned char *p = base + verdef->sh_offset;
        for (unsigned i = 0; i < verdef->sh_info; ++i) {
            const auto *vd = reinterpret_cast<const Elf64_Verdef *>(p);
            const auto *aux = reinterpret_cast<const Elf64_Verdaux *>(p + vd->vd_aux);
            std::string name = dynstr + aux->vda_name;
            if ((vd->vd_flags & VER_FLG_BASE) == 0) {
                std::string parent;
                if (vd->vd_cnt > 1) {
                    const auto *next = reinterpret_cast<const Elf64_Verdaux *>(
                        reinterpret_cast<const unsigned char *>(aux) + aux->vda_next);
                    parent = dynstr + next->vda_name;
                }
                abi.nodes[name] = parent;
            }
            node_names[vd->vd_ndx] = name;
            p += vd->vd_next;
        }
    }

    const auto *syms = reinterpret_cast<const Elf64_Sym *>(base + dynsym->sh_offset);
    size_t count = dynsym->sh_size / sizeof(Elf64_Sym);
    const auto *vers =
        versym != nullptr ? reinterpret_cast<const Elf64_Half *>(base + versym->sh_offset) : nullptr;
    for (size_t i = 1; i < count; ++i) {
        const Elf64_Sym &s = syms[i];
        int bind = ELF64_ST_BIND(s.st_info);
        if (s.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK))
            continue;
        std::string name = dynstr + s.st_name;
        unsigned v = vers != nullptr ? vers[i] : 0;
        bool hidden = (v & 0x8000) != 0;
        v &= 0x7fff;
        if (v <= 1) {  // VER_NDX_LOCAL / VER_NDX_GLOBAL: no version
            abi.unversioned.insert(name);
            continue;
        }
        auto node = node_names.find(v);
        if (node == node_names.end())
            continue;
        if (s.st_shndx == SHN_ABS && name == node->second)
            continue;  // the node's own marker
        abi.symbols.insert(name + (hidden ? "@" : "@@") + node->second);
    }

    const auto *dyn = reinterpret_cast<const Elf64_Dyn *>(base + dynamic->sh_offset);
    const char *dynamic_str = reinterpret_cast<const char *>(base + sh[dynamic->sh_link].sh_offset);
    for (size_t i = 0; i < dynamic->sh_size / sizeof(Elf64_Dyn) && dyn[i].d_tag != DT_NULL; ++i) {
        if (dyn[i].d_tag == DT_SONAME)
            abi.soname = dynamic_str + dyn[i].d_un.d_val;
    }
    ::munmap(map, size);
    return abi;
}

std::string realPath(const std::string &path) {
    char buf[PATH_MAX];
    return ::realpath(path.c_str(), buf) != nullptr ? buf : "";
}

class FaceAbi : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        system_ = new ElfAbi(readElfAbi(realPath(IBVX_SYSTEM_IBVERBS)));
        face_ = new ElfAbi(readElfAbi(IBVX_FACE_LIB));
    }
    static void TearDownTestSuite() {
        delete system_;
        delete face_;
    }
    void SetUp() override {
        ASSERT_EQ(system_->error, "");
        ASSERT_EQ(face_->error, "");
        // Guards against a reader that finds nothing, which would make every check below pass.
        ASSERT_GT(system_->symbols.size(), 150u);
        ASSERT_GT(system_->nodes.size(), 10u);
    }
    static inline ElfAbi *system_ = nullptr;
    static inline ElfAbi *face_ = nullptr;
};

TEST_F(FaceAbi, ExportsEverySymbolOfTheSystemLibraryAtItsVersion) {
    for (const std::string &s : system_->symbols) {
        EXPECT_TRUE(face_->symbols.count(s))
            << s << " is exported by " << IBVX_SYSTEM_IBVERBS << " but not the face";
    }
}

TEST_F(FaceAbi, DefinesEveryVersionNodeWithTheSameParent) {
    for (const auto &[node, parent] : system_->nodes) {
        auto it = face_->nodes.find(node);
        ASSERT_NE(it, face_->nodes.end()) << "node " << node << " missing";
        EXPECT_EQ(it->second, parent) << "node " << node;
    }
}

TEST_F(FaceAbi, ExportsNothingTheSystemLibraryLacks) {
    for (const auto &[node, parent] : face_->nodes) {
        EXPECT_TRUE(system_->nodes.count(node))
            << "the face defines node " << node << ", the system library does not";
    }
    for (const std::string &s : face_->symbols) {
        EXPECT_TRUE(system_->symbols.count(s)) << "the face exports " << s << ", the system library does not";
    }
    // `local: *` hides every helper: nothing leaves the face without a version.
    EXPECT_TRUE(face_->unversioned.empty()) << *face_->unversioned.begin() << " is exported unversioned";
}

TEST_F(FaceAbi, SonameAndDevelopmentLinkMatchTheSystemLibrary) {
    EXPECT_EQ(face_->soname, system_->soname);
    EXPECT_EQ(face_->soname, "libibverbs.so.1");
    // dlopen("libibverbs.so") (HCCP's first try) must find the face too.
    std::string link = std::string(IBVX_FACE_DIR) + "/libibverbs.so";
    ASSERT_NE(realPath(link), "") << link << " does not exist";
    EXPECT_EQ(realPath(link), realPath(std::string(IBVX_FACE_DIR) + "/libibverbs.so.1"));
}

// The checked-in list (client/verbs/rdma-core-44.symbols) is what the system library exports:
// when the distribution's rdma-core moves, this says to refresh it (refresh-abi.sh).
TEST_F(FaceAbi, ReferenceListIsTheSystemLibrarys) {
    std::ifstream in(IBVX_REFERENCE_SYMBOLS);
    ASSERT_TRUE(in) << IBVX_REFERENCE_SYMBOLS;
    std::set<std::string> listed;
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line[0] != '#')
            listed.insert(line);
    }
    EXPECT_EQ(listed, system_->symbols) << "run client/verbs/refresh-abi.sh";
}

// ---- Loading: a program and a provider linked against libibverbs, over the face ----

bool sanitized() {
    return IBVX_SANITIZED;
}

TEST(FaceLoad, PerftestBindsEverySymbolAgainstTheFace) {
    if (std::string(IBVX_IB_WRITE_BW).empty())
        GTEST_SKIP() << "ib_write_bw (perftest) not installed";
    if (sanitized())
        GTEST_SKIP() << "an uninstrumented program cannot load sanitizer-built libraries";
    std::string face_env = std::string("LD_LIBRARY_PATH=") + IBVX_FACE_DIR;
    // First: the loader really picks the face for libibverbs.so.1 (else the run below proves nothing).
    ProcessResult trace = runProcess({IBVX_IB_WRITE_BW}, {.env = {face_env, "LD_TRACE_LOADED_OBJECTS=1"}});
    ASSERT_EQ(trace.exit_code, 0) << trace.err;
    EXPECT_NE(trace.out.find(std::string("libibverbs.so.1 => ") + IBVX_FACE_DIR + "/libibverbs.so.1"),
              std::string::npos)
        << trace.out;
    // Then every symbol of ib_write_bw, libmlx5, libefa and librdmacm bound at load time.
    ProcessResult run = runProcess({IBVX_IB_WRITE_BW, "--help"}, {.env = {face_env, "LD_BIND_NOW=1"}});
    EXPECT_LT(run.exit_code, 128) << "killed by signal " << run.exit_code - 128;
    EXPECT_EQ(run.err.find("symbol lookup error"), std::string::npos) << run.err;
    EXPECT_EQ(run.err.find("not found"), std::string::npos) << run.err;
    EXPECT_NE((run.out + run.err).find("Usage:"), std::string::npos) << run.out << run.err;
}

TEST(FaceLoad, Mlx5ProviderLoadsWithTheFaceAsItsLibibverbs) {
    if (std::string(IBVX_SYSTEM_MLX5).empty())
        GTEST_SKIP() << "libmlx5.so.1 not installed";
    void *face = ::dlopen(IBVX_FACE_LIB, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    ASSERT_NE(face, nullptr) << ::dlerror();
    // libmlx5's DT_NEEDED libibverbs.so.1 is satisfied by the loaded face (same soname); RTLD_NOW
    // binds its IBVERBS_PRIVATE_34 imports, and its constructor registers with the face.
    void *mlx5 = ::dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    ASSERT_NE(mlx5, nullptr) << ::dlerror();
    void *used = ::dlsym(mlx5, "verbs_register_driver_34");
    ASSERT_NE(used, nullptr) << ::dlerror();
    Dl_info info{};
    ASSERT_NE(::dladdr(used, &info), 0);
    EXPECT_EQ(realPath(info.dli_fname), realPath(IBVX_FACE_LIB));
    ::dlclose(mlx5);
    ::dlclose(face);
}

// ---- Entry points the broker does not serve: the libibverbs failure conventions ----
// (Libraries are opened RTLD_NODELETE: unloading libibv_extend.so mid-process would orphan what
// its gRPC runtime allocated, which LeakSanitizer then reports.)

class FaceEntries : public ::testing::Test {
  protected:
    void SetUp() override {
        face_ = ::dlopen(IBVX_FACE_LIB, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        ASSERT_NE(face_, nullptr) << ::dlerror();
    }
    void TearDown() override {
        if (face_ != nullptr)
            ::dlclose(face_);
    }
    template <typename F>
    F *sym(const char *name, const char *version = nullptr) {
        void *p = version != nullptr ? ::dlvsym(face_, name, version) : ::dlsym(face_, name);
        EXPECT_NE(p, nullptr) << name << (version != nullptr ? std::string("@") + version : "");
        return reinterpret_cast<F *>(p);
    }
    void *face_ = nullptr;
};

TEST_F(FaceEntries, IntVerbsReturnEopnotsupp) {
    auto *resize_cq = sym<decltype(ibv_resize_cq)>("ibv_resize_cq");
    auto *attach_mcast = sym<decltype(ibv_attach_mcast)>("ibv_attach_mcast");
    auto *rereg_mr = sym<decltype(ibv_rereg_mr)>("ibv_rereg_mr");
    ASSERT_TRUE(resize_cq && attach_mcast && rereg_mr);
    errno = 0;
    EXPECT_EQ(resize_cq(nullptr, 16), EINVAL);  // served: not a CQ of the face, refused unread
    EXPECT_EQ(errno, EINVAL);
    union ibv_gid gid {};
    errno = 0;
    EXPECT_EQ(attach_mcast(nullptr, &gid, 0), EINVAL);  // served: not a QP of the face
    EXPECT_EQ(errno, EINVAL);
    errno = 0;  // served: not an MR of the face, refused as rdma-core refuses bad input
    EXPECT_EQ(rereg_mr(nullptr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
    EXPECT_EQ(errno, EINVAL);
}

TEST_F(FaceEntries, PointerVerbsReturnNullWithErrno) {
    auto *import_device = sym<decltype(ibv_import_device)>("ibv_import_device");
    auto *qp_to_qp_ex = sym<decltype(ibv_qp_to_qp_ex)>("ibv_qp_to_qp_ex");
    auto *reg_dmabuf_mr = sym<decltype(ibv_reg_dmabuf_mr)>("ibv_reg_dmabuf_mr");
    ASSERT_TRUE(import_device && qp_to_qp_ex && reg_dmabuf_mr);
    errno = 0;
    EXPECT_EQ(import_device(0), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    errno = 0;
    EXPECT_EQ(qp_to_qp_ex(nullptr), nullptr);  // not a QP of the face: refused unread
    EXPECT_EQ(errno, EINVAL);
    errno = 0;
    EXPECT_EQ(reg_dmabuf_mr(nullptr, 0, 4096, 0, -1, 0), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
}

TEST_F(FaceEntries, ProviderInterfaceIsHarmless) {
    // Prototypes as rdma-core's driver.h (not installed) declares them.
    using CmdDestroyQp = int(ibv_qp *);
    using RegisterDriver = void(const void *);
    auto *cmd_destroy_qp = sym<CmdDestroyQp>("ibv_cmd_destroy_qp");
    auto *register_driver = sym<RegisterDriver>("verbs_register_driver_34");
    auto *allow_destroy = sym<bool>("verbs_allow_disassociate_destroy");
    ASSERT_TRUE(cmd_destroy_qp && register_driver && allow_destroy);
    errno = 0;
    EXPECT_EQ(cmd_destroy_qp(nullptr), EOPNOTSUPP);
    EXPECT_EQ(errno, EOPNOTSUPP);
    register_driver(nullptr);  // a provider's constructor: must not crash or register anything
    EXPECT_FALSE(*allow_destroy);
}

TEST_F(FaceEntries, CompatVersionsFailAndDifferFromTheDefaults) {
    using GetDeviceList = void **(int *);
    using RegisterDriver = void(const char *, void *);
    auto *old_list = sym<GetDeviceList>("ibv_get_device_list", "IBVERBS_1.0");
    auto *new_list = sym<GetDeviceList>("ibv_get_device_list", "IBVERBS_1.1");
    auto *old_register = sym<RegisterDriver>("ibv_register_driver", "IBVERBS_1.1");
    ASSERT_TRUE(old_list && new_list && old_register);
    EXPECT_NE(reinterpret_cast<void *>(old_list), reinterpret_cast<void *>(new_list));
    int n = -1;
    errno = 0;
    EXPECT_EQ(old_list(&n), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(n, 0);
    old_register("mlx4", nullptr);
}

TEST_F(FaceEntries, SysfsAndForkHelpersHaveNothingToDo) {
    using GetSysfsPath = const char *();
    using ReadSysfsFile = int(const char *, const char *, char *, size_t);
    using ForkRange = int(void *, size_t);
    auto *get_sysfs_path = sym<GetSysfsPath>("ibv_get_sysfs_path");
    auto *read_sysfs_file = sym<ReadSysfsFile>("ibv_read_sysfs_file");
    auto *dontfork = sym<ForkRange>("ibv_dontfork_range");
    auto *dofork = sym<ForkRange>("ibv_dofork_range");
    ASSERT_TRUE(get_sysfs_path && read_sysfs_file && dontfork && dofork);
    EXPECT_EQ(get_sysfs_path(), nullptr);
    char buf[16] = "untouched";
    EXPECT_EQ(read_sysfs_file("/sys/class/infiniband/x", "node_type", buf, sizeof(buf)), -1);
    EXPECT_STREQ(buf, "untouched");
    static char page[4096];
    EXPECT_EQ(dontfork(page, sizeof(page)), 0);
    EXPECT_EQ(dofork(page, sizeof(page)), 0);
}

// ---- String and rate tables: the same answers as the system library ----

TEST(FaceTables, StringsAndRatesEqualTheSystemLibrarys) {
    std::string tables =
        std::string(std::getenv("IBVX_BUILD_DIR")) + "/tests/integration/verbs/ibvx-verbs-tables";
    ProcessResult system = runProcess({tables});
    ProcessResult face = runProcess({tables}, {.env = {std::string("LD_LIBRARY_PATH=") + IBVX_FACE_DIR}});
    ASSERT_EQ(system.exit_code, 0) << system.err;
    ASSERT_EQ(face.exit_code, 0) << face.err;
    auto split = [](const std::string &out) {
        size_t nl = out.find('\n');
        return std::pair{out.substr(0, nl), out.substr(nl + 1)};
    };
    auto [system_lib, system_tables] = split(system.out);
    auto [face_lib, face_tables] = split(face.out);
    // Each run answered from the library it should have: else the comparison proves nothing.
    EXPECT_EQ(realPath(system_lib.substr(std::strlen("library "))), realPath(IBVX_SYSTEM_IBVERBS));
    EXPECT_EQ(realPath(face_lib.substr(std::strlen("library "))), realPath(IBVX_FACE_LIB));
    EXPECT_GT(system_tables.size(), 1000u);
    EXPECT_EQ(face_tables, system_tables);
}

}  // namespace
