// Ordinary memory moved onto the per-process memfd so the broker can reach it: contents,
// protection and the (fd, offset) window, reference counts, moving back, refusals, fork().
#include "client/broker/shared_pages.h"
#include "client/broker/write_hold.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ibvx::client::broker {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

uint8_t patternByte(size_t i, unsigned seed) {
    return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 9)) ^ seed);
}

void fill(void *p, size_t n, unsigned seed) {
    auto *b = static_cast<uint8_t *>(p);
    for (size_t i = 0; i < n; ++i) {
        b[i] = patternByte(i, seed);
    }
}

bool holds(const void *p, size_t n, unsigned seed) {
    const auto *b = static_cast<const uint8_t *>(p);
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != patternByte(i, seed)) {
            return false;
        }
    }
    return true;
}

// The /proc/self/maps line of the mapping holding addr ("" when unmapped).
std::string mapLineOf(const void *addr) {
    std::ifstream maps("/proc/self/maps");
    auto a = reinterpret_cast<uintptr_t>(addr);
    for (std::string line; std::getline(maps, line);) {
        unsigned long start = 0, end = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx", &start, &end) == 2 && a >= start && a < end) {
            return line;
        }
    }
    return "";
}

std::string permsOf(const void *addr) {
    std::string line = mapLineOf(addr);
    std::istringstream in(line);
    std::string range, perms;
    in >> range >> perms;
    return perms;
}

bool onSharedPages(const void *addr) {
    std::string line = mapLineOf(addr);
    return line.find("/memfd:ibvx-shared-pages") != std::string::npos && permsOf(addr)[3] == 's';
}

bool privatePage(const void *addr) {
    std::string perms = permsOf(addr);
    return perms.size() == 4 && perms[3] == 'p' && !onSharedPages(addr);
}

int openFdCount() {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) {
        return -1;
    }
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] != '.') {
            ++n;
        }
    }
    closedir(d);
    return n - 1;  // the directory's own fd
}

// Descriptors of this process that are userfaultfds.
int userfaultfdCount() {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) {
        return -1;
    }
    while (dirent *e = readdir(d)) {
        char target[64] = {};
        std::string link = std::string("/proc/self/fd/") + e->d_name;
        if (readlink(link.c_str(), target, sizeof target - 1) > 0 &&
            strstr(target, "[userfaultfd]") != nullptr) {
            ++n;
        }
    }
    closedir(d);
    return n;
}

// What the broker does: map the window's pages of the fd, from the page holding the offset.
// The bytes there must be the buffer's, and a write there (an RDMA WRITE) must show up at addr.
void expectWindowIsTheBuffer(const SharedWindow &w, void *addr, size_t len) {
    ASSERT_GE(w.fd, 0);
    EXPECT_EQ(w.offset, reinterpret_cast<uintptr_t>(addr));
    struct stat st {};
    ASSERT_EQ(fstat(w.fd, &st), 0);
    EXPECT_GE(static_cast<uint64_t>(st.st_size), w.offset + len)
        << "the broker checks offset + length <= size";
    const uint64_t delta = w.offset % kPage;
    void *map = mmap(nullptr, len + delta, PROT_READ | PROT_WRITE, MAP_SHARED, w.fd,
                     static_cast<off_t>(w.offset - delta));
    ASSERT_NE(map, MAP_FAILED) << strerror(errno);
    auto *view = static_cast<uint8_t *>(map) + delta;
    EXPECT_EQ(memcmp(view, addr, len), 0) << "the window shows other bytes than the buffer";
    std::vector<uint8_t> old(view, view + len);
    const size_t spots[] = {0, len / 2, len - 1};
    for (size_t i : spots) {
        view[i] = static_cast<uint8_t>(~view[i]);
        EXPECT_EQ(static_cast<uint8_t *>(addr)[i], view[i])
            << "a write through the window at " << i << " does not reach the buffer";
    }
    memcpy(view, old.data(), len);
    munmap(map, len + delta);
}

// Acquires, checks contents and window, releases, checks the memory is private and intact.
void roundTrip(void *buf, size_t len, unsigned seed) {
    fill(buf, len, seed);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, len, &w, &why), 0) << why;
    EXPECT_TRUE(holds(buf, len, seed)) << "contents changed by the move";
    EXPECT_TRUE(onSharedPages(buf)) << mapLineOf(buf);
    EXPECT_TRUE(onSharedPages(static_cast<uint8_t *>(buf) + len - 1));
    expectWindowIsTheBuffer(w, buf, len);
    releaseShared(buf, len);
    EXPECT_TRUE(holds(buf, len, seed)) << "contents changed by the move back";
    EXPECT_TRUE(privatePage(buf)) << mapLineOf(buf);
    EXPECT_TRUE(privatePage(static_cast<uint8_t *>(buf) + len - 1));
    EXPECT_EQ(sharedPageCount(), 0u);
}

TEST(SharedPages, HeapBufferKeepsItsContents) {
    const size_t len = 3 * kPage + 123;
    auto *buf = static_cast<uint8_t *>(malloc(len));
    ASSERT_NE(buf, nullptr);
    roundTrip(buf + 7, len - 7, 1);
    free(buf);
}

TEST(SharedPages, PosixMemalignBufferKeepsItsContents) {
    void *buf = nullptr;
    ASSERT_EQ(posix_memalign(&buf, kPage, 4 * kPage), 0);
    roundTrip(buf, 4 * kPage, 2);
    free(buf);
}

TEST(SharedPages, AnonymousMmapKeepsItsContents) {
    void *buf = mmap(nullptr, 5 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    roundTrip(buf, 5 * kPage, 3);
    munmap(buf, 5 * kPage);
}

// .data (a private mapping of the executable) and .bss.
uint8_t g_data[3 * 4096 + 100] = {1, 2, 3};
uint8_t g_bss[2 * 4096 + 50];

TEST(SharedPages, StaticDataKeepsItsContents) {
    EXPECT_NE(mapLineOf(g_data).find('/'), std::string::npos)
        << "expected a file mapping: " << mapLineOf(g_data);
    roundTrip(g_data + 3, sizeof g_data - 3, 4);
    roundTrip(g_bss, sizeof g_bss, 5);
}

// The first and last page move whole: the bytes around the buffer on them stay as they were.
TEST(SharedPages, PartialPagesAtBothEndsKeepTheirNeighbours) {
    const size_t len = 4 * kPage;
    auto *map = static_cast<uint8_t *>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(map, MAP_FAILED);
    fill(map, len, 6);
    uint8_t *buf = map + 100;
    const size_t buf_len = 2 * kPage;  // ends 100 bytes into page 2
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, buf_len, &w, &why), 0) << why;
    EXPECT_EQ(sharedPageCount(), 3u);
    EXPECT_TRUE(holds(map, len, 6));
    EXPECT_TRUE(onSharedPages(map));
    EXPECT_TRUE(onSharedPages(map + 2 * kPage + kPage - 1));
    EXPECT_TRUE(privatePage(map + 3 * kPage)) << "a page outside the buffer moved";
    expectWindowIsTheBuffer(w, buf, buf_len);
    map[50] = 0xa5;  // a neighbour on the first page stays the program's memory
    releaseShared(buf, buf_len);
    EXPECT_EQ(map[50], 0xa5);
    map[50] = patternByte(50, 6);
    EXPECT_TRUE(holds(map, len, 6));
    EXPECT_TRUE(privatePage(map));
    munmap(map, len);
}

TEST(SharedPages, ReadOnlyPagesStayReadOnly) {
    const size_t len = 2 * kPage;
    void *buf = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, len, 7);
    ASSERT_EQ(mprotect(static_cast<uint8_t *>(buf) + kPage, kPage, PROT_READ), 0);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, len, &w, &why), 0) << why;
    EXPECT_EQ(permsOf(buf), "rw-s");
    EXPECT_EQ(permsOf(static_cast<uint8_t *>(buf) + kPage), "r--s");
    EXPECT_TRUE(holds(buf, len, 7));
    releaseShared(buf, len);
    EXPECT_EQ(permsOf(buf), "rw-p");
    EXPECT_EQ(permsOf(static_cast<uint8_t *>(buf) + kPage), "r--p");
    EXPECT_TRUE(holds(buf, len, 7));
    munmap(buf, len);
}

constexpr auto kConstTable = [] {
    std::array<uint8_t, 2 * 4096 + 300> t{};
    for (size_t i = 0; i < t.size(); ++i) {
        t[i] = static_cast<uint8_t>(i * 13 + 1);
    }
    return t;
}();

TEST(SharedPages, ReadOnlyDataOfTheExecutableMoves) {
    const uint8_t *table = kConstTable.data();
    std::vector<uint8_t> copy(kConstTable.begin(), kConstTable.end());
    if (permsOf(table).substr(0, 3) == "r-x") {
        // aarch64's default link puts .rodata in the text segment: it is code then, which is
        // refused by design (UnmovableMemoryIsRefusedAndLeftAsItWas), so there is no read-only data mapping
        // to move.
        GTEST_SKIP() << "this executable's .rodata shares the text segment: " << mapLineOf(table);
    }
    ASSERT_EQ(permsOf(table).substr(0, 3), "r--") << mapLineOf(table);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(const_cast<uint8_t *>(table), kConstTable.size(), &w, &why), 0) << why;
    EXPECT_EQ(permsOf(table), "r--s");
    EXPECT_EQ(memcmp(table, copy.data(), copy.size()), 0);
    releaseShared(const_cast<uint8_t *>(table), kConstTable.size());
    EXPECT_EQ(permsOf(table), "r--p");
    EXPECT_EQ(memcmp(table, copy.data(), copy.size()), 0);
}

TEST(SharedPages, OverlappingAcquisitionsSharePagesAndCounts) {
    const size_t len = 4 * kPage;
    auto *buf = static_cast<uint8_t *>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, len, 8);
    SharedWindow a, b;
    std::string why;
    ASSERT_EQ(acquireShared(buf + 10, kPage + 10, &a, &why), 0) << why;        // pages 0-1
    ASSERT_EQ(acquireShared(buf + kPage + 5, 2 * kPage, &b, &why), 0) << why;  // pages 1-3
    EXPECT_EQ(sharedPageCount(), 4u);
    EXPECT_EQ(a.fd, b.fd) << "one memfd per process";
    expectWindowIsTheBuffer(a, buf + 10, kPage + 10);
    expectWindowIsTheBuffer(b, buf + kPage + 5, 2 * kPage);
    releaseShared(buf + 10, kPage + 10);
    EXPECT_EQ(sharedPageCount(), 3u);
    EXPECT_TRUE(privatePage(buf)) << "page 0 had one holder";
    EXPECT_TRUE(onSharedPages(buf + kPage)) << "page 1 still held by the second acquisition";
    expectWindowIsTheBuffer(b, buf + kPage + 5, 2 * kPage);
    // The same range twice: two holders.
    ASSERT_EQ(acquireShared(buf + kPage + 5, 2 * kPage, &b, &why), 0) << why;
    releaseShared(buf + kPage + 5, 2 * kPage);
    EXPECT_EQ(sharedPageCount(), 3u);
    releaseShared(buf + kPage + 5, 2 * kPage);
    EXPECT_EQ(sharedPageCount(), 0u);
    EXPECT_TRUE(privatePage(buf + kPage));
    EXPECT_TRUE(holds(buf, len, 8));
    munmap(buf, len);
}

TEST(SharedPages, ReleaseFreesTheFileSpace) {
    const size_t len = 8 * kPage;
    void *buf = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, len, 9);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, len, &w, &why), 0) << why;
    int file = dup(w.fd);  // the file outlives the module's fd, as the broker's copy would
    ASSERT_GE(file, 0);
    struct stat st {};
    ASSERT_EQ(fstat(file, &st), 0);
    EXPECT_GE(static_cast<size_t>(st.st_blocks) * 512, len);
    releaseShared(buf, len);
    ASSERT_EQ(fstat(file, &st), 0);
    EXPECT_EQ(st.st_blocks, 0) << "the released pages still take file space";
    EXPECT_TRUE(privatePage(buf));
    close(file);
    munmap(buf, len);
}

TEST(SharedPages, NoFdLeaks) {
    const int before = openFdCount();
    void *buf = mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    for (int i = 0; i < 50; ++i) {
        SharedWindow w;
        std::string why;
        ASSERT_EQ(acquireShared(buf, kPage + 1, &w, &why), 0) << why;
        ASSERT_EQ(acquireShared(static_cast<uint8_t *>(buf) + 1, kPage, &w, &why), 0) << why;
        // The userfaultfd that holds other threads' writes lives as long as the memfd.
        const int uffd = writeHoldsUnavailable().empty() ? 1 : 0;
        EXPECT_EQ(openFdCount(), before + 1 + uffd) << "one memfd, however many acquisitions";
        releaseShared(static_cast<uint8_t *>(buf) + 1, kPage);
        releaseShared(buf, kPage + 1);
    }
    EXPECT_EQ(openFdCount(), before);
    // Refusals leave nothing open either.
    void *shared = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(shared, MAP_FAILED);
    EXPECT_EQ(acquireShared(shared, 1, nullptr, nullptr), -EINVAL);
    EXPECT_EQ(openFdCount(), before);
    munmap(shared, kPage);
    munmap(buf, 2 * kPage);
}

void expectRefused(void *addr, size_t len, const std::string &reason_part) {
    SharedWindow w;
    std::string why;
    EXPECT_EQ(acquireShared(addr, len, &w, &why), -EINVAL) << reason_part;
    EXPECT_NE(why.find(reason_part), std::string::npos) << "reason: " << why;
    EXPECT_EQ(sharedPageCount(), 0u);
}

TEST(SharedPages, SharedMappingsAreRefusedWithTheirName) {
    char path[] = "/tmp/ibvx-shared-pages-XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(kPage)), 0);
    void *file = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(file, MAP_FAILED);
    expectRefused(file, 10, path);
    expectRefused(file, 10, "ibvx_reg_mr_fd");
    munmap(file, kPage);
    close(fd);
    unlink(path);

    void *anon = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(anon, MAP_FAILED);
    expectRefused(anon, kPage, "shared anonymous memory");
    munmap(anon, kPage);
}

TEST(SharedPages, UnmovableMemoryIsRefusedAndLeftAsItWas) {
    // A hole in the middle: nothing of the range moves.
    auto *map = static_cast<uint8_t *>(
        mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(map, MAP_FAILED);
    fill(map, kPage, 10);
    ASSERT_EQ(munmap(map + kPage, kPage), 0);
    expectRefused(map, 3 * kPage, "is not mapped");
    EXPECT_TRUE(privatePage(map));
    EXPECT_TRUE(holds(map, kPage, 10));
    // PROT_NONE.
    ASSERT_EQ(mprotect(map + 2 * kPage, kPage, PROT_NONE), 0);
    expectRefused(map + 2 * kPage, kPage, "PROT_NONE");
    munmap(map, 3 * kPage);
    // The caller's own stack.
    char on_stack[256];
    memset(on_stack, 1, sizeof on_stack);
    expectRefused(on_stack, sizeof on_stack, "stack");
    // The caller's own thread-local storage: errno is written by the move's failed system calls.
    // (This is the main thread, whose TLS is not on its stack.)
    static thread_local char in_tls[64];
    memset(in_tls, 1, sizeof in_tls);
    expectRefused(in_tls, sizeof in_tls, "thread-local storage");
    // Another thread moves it like any memory.
    std::thread([mine = &in_tls[0]] {
        SharedWindow w;
        std::string why;
        EXPECT_EQ(acquireShared(mine, sizeof in_tls, &w, &why), 0) << why;
        releaseShared(mine, sizeof in_tls);
    }).join();
    // Code and the kernel's pages.
    expectRefused(reinterpret_cast<void *>(&roundTrip), 16, "executable code");
    if (auto vdso = getauxval(AT_SYSINFO_EHDR); vdso != 0) {
        expectRefused(reinterpret_cast<void *>(vdso), 16, "[vdso]");
    }
}

TEST(SharedPages, BadRangesAreRefused) {
    uint8_t byte = 0;
    std::string why;
    EXPECT_EQ(acquireShared(&byte, 0, nullptr, &why), -EINVAL);
    EXPECT_NE(why.find("length is 0"), std::string::npos) << why;
    EXPECT_EQ(acquireShared(reinterpret_cast<void *>(UINTPTR_MAX - 10), 100, nullptr, &why), -EINVAL);
    EXPECT_NE(why.find("past the end of the address space"), std::string::npos) << why;
    EXPECT_EQ(acquireShared(reinterpret_cast<void *>(UINTPTR_MAX - 2 * kPage), kPage, nullptr, &why),
              -EINVAL);
    releaseShared(&byte, 0);  // harmless
    releaseShared(&byte, 1);  // never acquired: harmless
    EXPECT_EQ(sharedPageCount(), 0u);
}

// A failure halfway (the second of two pieces cannot be written) puts the first piece back.
TEST(SharedPages, AFailedMoveIsRolledBack) {
    // Four pages at known places: 0-1 the buffer (1 read-only, so two pieces), 3 held first so
    // the memfd is already big enough and only the writes can fail.
    auto *region = static_cast<uint8_t *>(
        mmap(nullptr, 4 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(region, MAP_FAILED);
    fill(region, 4 * kPage, 11);
    ASSERT_EQ(mprotect(region + kPage, kPage, PROT_READ), 0);
    std::string why;
    ASSERT_EQ(acquireShared(region + 3 * kPage, kPage, nullptr, &why), 0) << why;

    struct rlimit old {};
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    if (old.rlim_max != RLIM_INFINITY && old.rlim_max < reinterpret_cast<uintptr_t>(region) + kPage) {
        GTEST_SKIP() << "RLIMIT_FSIZE's hard limit is below the buffer's address";
    }
    auto old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit low = old;
    low.rlim_cur = reinterpret_cast<uintptr_t>(region) + kPage;  // the file ends where piece 2 starts
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
    int rc = acquireShared(region, 2 * kPage, nullptr, &why);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);

    EXPECT_EQ(rc, -ENOMEM) << why;
    EXPECT_NE(why.find("cannot move"), std::string::npos) << why;
    EXPECT_TRUE(privatePage(region)) << "the first piece was not put back: " << mapLineOf(region);
    EXPECT_EQ(permsOf(region), "rw-p");
    EXPECT_EQ(permsOf(region + kPage), "r--p");
    EXPECT_TRUE(holds(region, 4 * kPage, 11));
    EXPECT_EQ(sharedPageCount(), 1u) << "only the page held before";
    releaseShared(region + 3 * kPage, kPage);
    EXPECT_EQ(sharedPageCount(), 0u);
    munmap(region, 4 * kPage);
}

// The program unmapped its buffer while it was held (malloc freeing a big chunk): the release
// only frees the file space.
TEST(SharedPages, ReleaseAfterTheProgramUnmappedTheBuffer) {
    void *buf = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, 3 * kPage, 12);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, 3 * kPage, &w, &why), 0) << why;
    int file = dup(w.fd);
    ASSERT_GE(file, 0);
    ASSERT_EQ(munmap(buf, 3 * kPage), 0);
    releaseShared(buf, 3 * kPage);
    EXPECT_EQ(sharedPageCount(), 0u);
    EXPECT_EQ(mapLineOf(buf), "") << "the release mapped something where the program unmapped";
    struct stat st {};
    ASSERT_EQ(fstat(file, &st), 0);
    EXPECT_EQ(st.st_blocks, 0);
    close(file);
}

// The program unmapped a held buffer, got the address back and registers the new memory: the
// new memory takes the pages' home (the old MR reaches it) and both holders count.
TEST(SharedPages, ReRegisteringAnAddressUnmappedWhileHeld) {
    const size_t len = 2 * kPage;
    void *buf = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, len, 14);
    SharedWindow old_window, new_window;
    std::string why;
    ASSERT_EQ(acquireShared(buf, len, &old_window, &why), 0) << why;
    ASSERT_EQ(munmap(buf, len), 0);
    ASSERT_EQ(mmap(buf, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), buf);
    fill(buf, len, 15);
    ASSERT_EQ(acquireShared(buf, len, &new_window, &why), 0) << why;
    EXPECT_TRUE(onSharedPages(buf));
    EXPECT_TRUE(holds(buf, len, 15));
    expectWindowIsTheBuffer(new_window, buf, len);
    EXPECT_EQ(sharedPageCount(), 2u);
    releaseShared(buf, len);
    EXPECT_TRUE(onSharedPages(buf)) << "still held by the second registration";
    releaseShared(buf, len);
    EXPECT_TRUE(privatePage(buf));
    EXPECT_TRUE(holds(buf, len, 15));
    EXPECT_EQ(sharedPageCount(), 0u);
    munmap(buf, len);
}

// The program moved held pages away with mremap (realloc does that with a big chunk): at the new
// address they are the program's private memory again, with their contents.
TEST(SharedPages, PagesMovedAwayBecomePrivateAtTheirNewAddress) {
    auto *buf = static_cast<uint8_t *>(
        mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    void *target = mmap(nullptr, 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(buf, MAP_FAILED);
    ASSERT_NE(target, MAP_FAILED);
    fill(buf, 2 * kPage, 13);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, 2 * kPage, &w, &why), 0) << why;
    int file = dup(w.fd);
    ASSERT_GE(file, 0);
    void *moved = mremap(buf, 2 * kPage, 2 * kPage, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    ASSERT_EQ(moved, target);
    ASSERT_TRUE(onSharedPages(moved));
    releaseShared(buf, 2 * kPage);
    EXPECT_TRUE(privatePage(moved)) << mapLineOf(moved);
    EXPECT_TRUE(holds(moved, 2 * kPage, 13));
    struct stat st {};
    ASSERT_EQ(fstat(file, &st), 0);
    EXPECT_EQ(st.st_blocks, 0);
    EXPECT_EQ(sharedPageCount(), 0u);
    close(file);
    munmap(moved, 2 * kPage);
}

// fork(): the child sees the contents as at fork() in private memory; neither side's later
// writes reach the other; the child has no acquisitions and starts its own memfd.
void forkAndCheckTheChild() {
    const size_t len = 3 * kPage + 123;
    auto *buf = static_cast<uint8_t *>(malloc(len));
    ASSERT_NE(buf, nullptr);
    fill(buf, len, 20);
    SharedWindow w;
    std::string why;
    ASSERT_EQ(acquireShared(buf, len, &w, &why), 0) << why;
    struct stat parent_file {};
    ASSERT_EQ(fstat(w.fd, &parent_file), 0);
    int to_child[2], to_parent[2];
    ASSERT_EQ(pipe(to_child), 0);
    ASSERT_EQ(pipe(to_parent), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        close(to_child[1]);
        close(to_parent[0]);
        int failed = 0;
        char c = 0;
        if (read(to_child[0], &c, 1) != 1) {  // the parent has written its bytes by now
            _exit(100);
        }
        failed |= holds(buf, len, 20) ? 0 : 1;  // as at fork(), not the parent's later writes
        failed |= privatePage(buf) && privatePage(buf + len - 1) ? 0 : 2;
        failed |= sharedPageCount() == 0 ? 0 : 4;
        // The parent's userfaultfd acts on the parent's memory: the child must not keep it.
        failed |= userfaultfdCount() == 0 ? 0 : 128;
        fill(buf, len, 22);
        if (write(to_parent[1], "w", 1) != 1) {
            _exit(101);
        }
        SharedWindow own;
        std::string own_why;
        if (acquireShared(buf, len, &own, &own_why) == 0) {
            struct stat own_file {};
            failed |= fstat(own.fd, &own_file) == 0 && own_file.st_ino != parent_file.st_ino ? 0 : 8;
            failed |= holds(buf, len, 22) && onSharedPages(buf) ? 0 : 16;
            failed |= userfaultfdCount() == (writeHoldsUnavailable().empty() ? 1 : 0) ? 0 : 256;
            releaseShared(buf, len);
            failed |= privatePage(buf) && holds(buf, len, 22) ? 0 : 32;
        } else {
            failed |= 64;
        }
        _exit(failed);
    }
    close(to_child[0]);  // so a dead child reads as EOF, never a hang
    close(to_parent[1]);
    fill(buf, len, 21);  // right after fork() returns: must not reach the child
    ASSERT_EQ(write(to_child[1], "p", 1), 1);
    char c = 0;
    EXPECT_EQ(read(to_parent[0], &c, 1), 1) << "the child died";
    EXPECT_TRUE(holds(buf, len, 21)) << "the child's writes reached the parent";
    EXPECT_TRUE(onSharedPages(buf)) << "the parent's registration is gone";
    expectWindowIsTheBuffer(w, buf, len);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child killed by signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "child failures (bits): 1 contents at fork, 2 not private, 4 "
           "acquisitions inherited, 8 same memfd, 16 own acquisition, 32 own "
           "release, 64 acquire failed, 128 the parent's userfaultfd kept, 256 no userfaultfd "
           "of its own";
    close(to_child[1]);
    close(to_parent[0]);
    releaseShared(buf, len);
    EXPECT_TRUE(holds(buf, len, 21));
    EXPECT_EQ(sharedPageCount(), 0u);
    free(buf);
}

TEST(SharedPages, ForkGivesTheChildAPrivateCopy) {
    forkAndCheckTheChild();
}

// With another thread alive, libc's fork() takes its multi-threaded path (malloc's locks).
TEST(SharedPages, ForkFromAMultiThreadedProcess) {
    int gate[2];
    ASSERT_EQ(pipe(gate), 0);
    std::thread waiter([&] {
        char c = 0;
        (void)!read(gate[0], &c, 1);
    });
    forkAndCheckTheChild();
    ASSERT_EQ(write(gate[1], "q", 1), 1);
    waiter.join();
    close(gate[0]);
    close(gate[1]);
}

// Several threads acquire and release overlapping ranges of one buffer: every window shows the
// buffer, and at the end nothing is left shared.
TEST(SharedPages, ConcurrentOverlappingAcquisitions) {
    const size_t pages = 32;
    const size_t len = pages * kPage;
    auto *buf = static_cast<uint8_t *>(
        mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(buf, MAP_FAILED);
    fill(buf, len, 30);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            uint64_t rng = 0x9e3779b97f4a7c15ull * (t + 1);
            std::vector<uint8_t> seen;
            for (int i = 0; i < 200; ++i) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                size_t off = (rng >> 33) % (len - 1);
                size_t n = 1 + (rng >> 13) % std::min<size_t>(len - off, 6 * kPage);
                SharedWindow w;
                std::string why;
                if (acquireShared(buf + off, n, &w, &why) != 0) {
                    ++failures;
                    continue;
                }
                seen.resize(n);
                if (pread(w.fd, seen.data(), n, static_cast<off_t>(w.offset)) != static_cast<ssize_t>(n) ||
                    memcmp(seen.data(), buf + off, n) != 0 || buf[off] != patternByte(off, 30) ||
                    buf[off + n - 1] != patternByte(off + n - 1, 30)) {
                    ++failures;
                }
                releaseShared(buf + off, n);
            }
        });
    }
    for (auto &th : threads) {
        th.join();
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(sharedPageCount(), 0u);
    EXPECT_TRUE(holds(buf, len, 30));
    for (size_t p = 0; p < pages; ++p) {
        EXPECT_TRUE(privatePage(buf + p * kPage)) << p;
    }
    munmap(buf, len);
}

}  // namespace
}  // namespace ibvx::client::broker
