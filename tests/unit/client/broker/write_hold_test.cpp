// Other threads' writes during a move (docs/verbs.md, "Other threads' writes during a move"):
// the hold itself (a held write waits and lands in the mapping in place when the hold ends; a
// kernel write fails with EFAULT and changes nothing), then the guarantee through the shared
// pages: threads writing and malloc()/free()ing around buffers that another thread registers
// and deregisters in a loop lose no write, user-mode or kernel-mode.
//
//   IBVX_WRITE_HOLD_SECONDS  how long each soak runs (default 1: the short form in ctest)
//   IBV_EXTEND_SHARED_PAGES_WP=0  the moves as before holds existed: the soaks then count the
//                                 writes lost (and fail)
// The long form (millions of writes and thousands of moves per soak):
//   IBVX_WRITE_HOLD_SECONDS=120 build/tests/unit/client/broker/client_write_hold_test
#include "client/broker/write_hold.h"

#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "client/broker/shared_pages.h"

namespace ibvx::client::broker {
namespace {

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

bool holdsDisabledOnPurpose() {
    const char *v = getenv("IBV_EXTEND_SHARED_PAGES_WP");
    return v != nullptr && strcmp(v, "0") == 0;
}

int soakSeconds() {
    const char *v = getenv("IBVX_WRITE_HOLD_SECONDS");
    int s = v != nullptr ? atoi(v) : 0;
    return s > 0 ? s : 1;
}

// Why holds do not work here ("" when they do), as the shared pages find it: with a page moved.
std::string holdsUnavailableHere() {
    void *p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::string why;
    if (p == MAP_FAILED || acquireShared(p, kPage, nullptr, &why) != 0) {
        return "cannot move a page: " + why;
    }
    std::string unavailable = writeHoldsUnavailable();
    releaseShared(p, kPage);
    munmap(p, kPage);
    return unavailable;
}

#define SKIP_WITHOUT_HOLDS()                                                                       \
    do {                                                                                           \
        if (std::string why = holdsUnavailableHere(); !why.empty() && !holdsDisabledOnPurpose()) { \
            GTEST_SKIP() << "no write holds in this environment: " << why;                         \
        }                                                                                          \
    } while (0)

size_t pipeBytes(int fd) {
    int n = 0;
    return ioctl(fd, FIONREAD, &n) == 0 ? static_cast<size_t>(n) : 0;
}

// The hold by itself, with the move done by hand as shared_pages.cpp does it: copy, replace.
TEST(WriteHold, AHeldWriteWaitsAndLandsInTheNewMapping) {
    if (holdsDisabledOnPurpose()) {
        GTEST_SKIP() << "IBV_EXTEND_SHARED_PAGES_WP=0";
    }
    openWriteHolds();
    if (std::string why = writeHoldsUnavailable(); !why.empty()) {
        closeWriteHolds();
        GTEST_SKIP() << "no write holds in this environment: " << why;
    }
    // Page 0 populated, page 1 never touched: a write there must not slip in as a missing-page
    // fault that write protection does not see.
    auto *a = static_cast<char *>(
        mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(a, MAP_FAILED);
    a[0] = 7;
    int mfd = memfd_create("write-hold-test", MFD_CLOEXEC);
    ASSERT_GE(mfd, 0);
    ASSERT_EQ(ftruncate(mfd, static_cast<off_t>(2 * kPage)), 0);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    ASSERT_EQ(write(p[1], "kernel!", 8), 8);

    std::atomic<int> written{0};
    std::thread writer;
    {
        WriteHold hold(reinterpret_cast<uintptr_t>(a), 2 * kPage);
        ASSERT_TRUE(hold.held());
        writer = std::thread([&] {
            a[10] = 1;
            ++written;
            a[kPage + 10] = 2;
            ++written;
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        EXPECT_EQ(written.load(), 0) << "a write went through while held";
        // A kernel write: fails, and the pipe keeps its bytes.
        errno = 0;
        EXPECT_EQ(read(p[0], a + 100, 8), -1);
        EXPECT_EQ(errno, EFAULT);
        EXPECT_EQ(pipeBytes(p[0]), 8u) << "the failed read consumed the pipe's bytes";
        // The move: copy, then the shared mapping replaces the private one.
        ASSERT_EQ(pwrite(mfd, a, 2 * kPage, 0), static_cast<ssize_t>(2 * kPage));
        ASSERT_NE(mmap(a, 2 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mfd, 0), MAP_FAILED);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        EXPECT_EQ(written.load(), 0) << "the new mapping let a held write through before the hold ended";
    }
    writer.join();
    char seen[2] = {};
    ASSERT_EQ(pread(mfd, &seen[0], 1, 10), 1);
    ASSERT_EQ(pread(mfd, &seen[1], 1, static_cast<off_t>(kPage + 10)), 1);
    EXPECT_EQ(seen[0], 1) << "the held write did not land in the new mapping";
    EXPECT_EQ(seen[1], 2) << "the held write to the untouched page did not land in the new mapping";
    EXPECT_EQ(a[0], 7);
    // Not write-protected any more: this thread's write and a kernel write go through.
    a[20] = 3;
    EXPECT_EQ(read(p[0], a + 100, 8), 8);
    EXPECT_STREQ(a + 100, "kernel!");
    closeWriteHolds();
    close(p[0]);
    close(p[1]);
    close(mfd);
    munmap(a, 2 * kPage);
}

// What userfaultfd refuses is moved unheld, and the hold says so.
TEST(WriteHold, APrivateFileMappingIsNotHeld) {
    openWriteHolds();
    FILE *f = tmpfile();
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(ftruncate(fileno(f), static_cast<off_t>(kPage)), 0);
    void *m = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE, fileno(f), 0);
    ASSERT_NE(m, MAP_FAILED);
    {
        WriteHold hold(reinterpret_cast<uintptr_t>(m), kPage);
        EXPECT_FALSE(hold.held());
    }
    static_cast<char *>(m)[0] = 1;  // and left writable
    closeWriteHolds();
    munmap(m, kPage);
    fclose(f);
}

// Without userfaultfd (here a seccomp filter refuses it, as some container runtimes' do), moves
// go unheld as before, and the first says so once on stderr under IBV_EXTEND_SHOW_WARNINGS.
TEST(WriteHold, WithoutUserfaultfdMovesGoUnheldAndSaySoOnce) {
    int err_pipe[2];
    ASSERT_EQ(pipe(err_pipe), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        dup2(err_pipe[1], STDERR_FILENO);
        close(err_pipe[0]);
        sock_filter filter[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_userfaultfd, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
            prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
            _exit(100);
        }
        setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
        unsetenv("IBV_EXTEND_SHARED_PAGES_WP");
        int failed = 0;
        auto *buf = static_cast<uint8_t *>(malloc(3 * kPage));
        for (int i = 0; i < 2; ++i) {
            memset(buf, 0x33 + i, 3 * kPage);
            std::string why;
            if (acquireShared(buf + 10, 2 * kPage, nullptr, &why) != 0) {
                _exit(101);
            }
            failed |= writeHoldsUnavailable().find("userfaultfd") != std::string::npos ? 0 : 1;
            releaseShared(buf + 10, 2 * kPage);
            failed |= std::all_of(buf, buf + 3 * kPage, [&](uint8_t b) { return b == 0x33 + i; }) ? 0 : 2;
        }
        _exit(failed);
    }
    close(err_pipe[1]);
    std::string err;
    char chunk[512];
    for (ssize_t n; (n = read(err_pipe[0], chunk, sizeof chunk)) > 0;) {
        err.append(chunk, static_cast<size_t>(n));
    }
    close(err_pipe[0]);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "100 no seccomp, 101 acquire failed; bits: 1 no reason, 2 contents";
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
    EXPECT_NE(err.find("ibv_extend: Warning: registration moves pages without holding other threads' writes "
                       "(userfaultfd(UFFD_USER_MODE_ONLY) failed: Operation not permitted)"),
              std::string::npos)
        << err;
}

// The user-mode soak: writer threads each own one 8-byte counter on every page of an arena and
// on heap blocks of their own; another thread registers and deregisters buffers that cover
// those pages partly (so counters sit on moved first and last pages, beside the buffer, and
// inside it) and heap buffers among the writers' blocks, in a loop. A counter that does not
// read back as its thread last wrote it is a lost write; so is a heap block whose pattern
// changed.
struct Soak {
    static constexpr unsigned kWriters = 3;
    static constexpr size_t kArenaPages = 24;
    static constexpr size_t kLiveBlocks = 16;

    uint8_t *arena = nullptr;
    std::atomic<bool> stop{false};
    bool register_heap = false;  // the registrar's buffers: the arena's, or heap blocks
    std::atomic<uint64_t> writes{0};
    std::atomic<uint64_t> lost{0};
    std::atomic<uint64_t> heap_ops{0};
    std::atomic<uint64_t> moves{0};
    std::atomic<uint64_t> refused{0};
    std::string first_refusal;

    // Each writer owns a third of every page; its counter sits at another place in it on each
    // page, so buffers begin and end before, after and across counters.
    volatile uint64_t *counter(unsigned t, size_t page) {
        const size_t share = kPage / kWriters / 8 * 8;
        const size_t at = t * share + (page * 8 * 37) % share / 8 * 8;
        return reinterpret_cast<volatile uint64_t *>(arena + page * kPage + at);
    }

    void writer(unsigned t) {
        std::vector<uint64_t> last(kArenaPages, 0);
        struct Block {
            uint8_t *p = nullptr;
            size_t n = 0;
            uint8_t v = 0;
        };
        std::vector<Block> blocks(kLiveBlocks);
        uint64_t rng = 0x9e3779b97f4a7c15ull * (t + 1);
        uint64_t n_writes = 0, n_lost = 0, n_heap = 0;
        while (!stop.load(std::memory_order_relaxed)) {
            for (size_t page = 0; page < kArenaPages; ++page) {
                volatile uint64_t *c = counter(t, page);
                if (*c != last[page]) {
                    ++n_lost;
                }
                *c = ++last[page];
                ++n_writes;
            }
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            Block &b = blocks[(rng >> 33) % kLiveBlocks];
            if (b.p != nullptr) {
                n_lost +=
                    static_cast<uint64_t>(std::count_if(b.p, b.p + b.n, [&](uint8_t x) { return x != b.v; }));
                free(b.p);
            }
            b.n = 16 + (rng >> 20) % 600;
            b.v = static_cast<uint8_t>(rng >> 40);
            b.p = static_cast<uint8_t *>(malloc(b.n));
            memset(b.p, b.v, b.n);
            ++n_writes;
            ++n_heap;
        }
        for (size_t page = 0; page < kArenaPages; ++page) {
            n_lost += *counter(t, page) != last[page] ? 1 : 0;
        }
        for (Block &b : blocks) {
            if (b.p != nullptr) {
                n_lost +=
                    static_cast<uint64_t>(std::count_if(b.p, b.p + b.n, [&](uint8_t x) { return x != b.v; }));
                free(b.p);
            }
        }
        writes += n_writes;
        lost += n_lost;
        heap_ops += n_heap;
    }

    void move(void *p, size_t n) {
        std::string why;
        if (acquireShared(p, n, nullptr, &why) != 0) {
            if (refused++ == 0) {
                first_refusal = why;
            }
            return;
        }
        releaseShared(p, n);
        ++moves;
    }

    void registrar() {
        uint64_t rng = 12345;
        while (!stop.load(std::memory_order_relaxed)) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            if (!register_heap) {
                // [page + a, page + k pages - b): partial first and last pages.
                size_t first = (rng >> 33) % (kArenaPages - 4);
                size_t pages = 1 + (rng >> 20) % 4;
                size_t head = (rng >> 8) % (kPage / 2);
                size_t tail = (rng >> 45) % (kPage / 2);
                move(arena + first * kPage + head, pages * kPage - head - tail + kPage / 2);
                continue;
            }
            // A heap buffer among the writers' blocks and malloc's headers.
            size_t n = 100 + (rng >> 27) % 9000;
            void *buf = malloc(n);
            memset(buf, 0x5a, n);
            move(buf, n);
            free(buf);
        }
    }
};

void runSoak(bool register_heap) {
    // One malloc arena, so the registering thread's heap buffers share pages with the writers'
    // blocks and malloc's own headers.
    mallopt(M_ARENA_MAX, 1);
    Soak soak;
    soak.register_heap = register_heap;
    soak.arena = static_cast<uint8_t *>(
        mmap(nullptr, Soak::kArenaPages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(soak.arena, MAP_FAILED);
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < Soak::kWriters; ++t) {
        threads.emplace_back([&soak, t] { soak.writer(t); });
    }
    threads.emplace_back([&soak] { soak.registrar(); });
    std::this_thread::sleep_for(std::chrono::seconds(soakSeconds()));
    soak.stop = true;
    for (auto &th : threads) {
        th.join();
    }
    std::printf("%d s: %llu writes and %llu malloc/free by %u threads around %llu moves: %llu lost\n",
                soakSeconds(), static_cast<unsigned long long>(soak.writes.load()),
                static_cast<unsigned long long>(soak.heap_ops.load()), Soak::kWriters,
                static_cast<unsigned long long>(soak.moves.load()),
                static_cast<unsigned long long>(soak.lost.load()));
    EXPECT_EQ(soak.refused.load(), 0u) << soak.first_refusal;
    EXPECT_GT(soak.moves.load(), 0u);
    EXPECT_EQ(soak.lost.load(), 0u) << "writes lost by moves";
    EXPECT_EQ(sharedPageCount(), 0u);
    munmap(soak.arena, Soak::kArenaPages * kPage);
}

// Buffers of an mmap'd arena, counters beside them on their first and last pages and inside.
TEST(SharedPagesUnderWrites, NoWriteBesideOrInsideABufferIsLost) {
    SKIP_WITHOUT_HOLDS();
    runSoak(false);
}

// Heap buffers among other threads' malloc()/free(): without holds, malloc's lost header
// writes corrupt the heap (glibc aborts: "corrupted double-linked list" and the like).
TEST(SharedPagesUnderWrites, MallocAndFreeAroundRegisteredHeapBuffers) {
    SKIP_WITHOUT_HOLDS();
    runSoak(true);
}

// The kernel-mode soak: a thread read()s a sequence of numbers from a pipe, each into an 8-byte
// slot on pages another thread registers and deregisters in a loop. A read that meets a page
// during its move fails with EFAULT and leaves the number in the pipe (read again); any other
// read lands for good: a slot that no longer holds what was read into it is a lost write.
TEST(SharedPagesUnderWrites, AKernelWriteFailsWithEfaultOrLands) {
    SKIP_WITHOUT_HOLDS();
    const size_t pages = 4;
    auto *arena = static_cast<uint8_t *>(
        mmap(nullptr, pages * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(arena, MAP_FAILED);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> moves{0};
    uint64_t reads = 0, efaults = 0, lost = 0, other_errors = 0;

    signal(SIGPIPE, SIG_IGN);  // the feeder's last write meets a closed pipe
    // The feeder runs until the read end closes, after the reader has ended: stopping it on `stop`
    // could leave the reader blocked for good in a read() of an empty pipe (CI hung so once).
    std::thread feeder([&] {
        for (uint64_t seq = 1;; ++seq) {
            if (write(p[1], &seq, sizeof seq) != sizeof seq) {
                return;
            }
        }
    });
    std::thread reader([&] {
        uint64_t expected = 1;
        std::vector<uint64_t> last(pages, 0);
        while (!stop.load(std::memory_order_relaxed)) {
            for (size_t page = 0; page < pages; ++page) {
                auto *slot = reinterpret_cast<uint64_t *>(arena + page * kPage + (page % 8) * 512);
                // What the previous read put here must still be here.
                if (*reinterpret_cast<volatile uint64_t *>(slot) != last[page]) {
                    ++lost;
                }
                ssize_t n = read(p[0], slot, sizeof(uint64_t));
                if (n < 0 && errno == EFAULT) {
                    ++efaults;
                    n = read(p[0], &last[page], sizeof(uint64_t));  // the number still in the pipe
                    *reinterpret_cast<volatile uint64_t *>(slot) = last[page];
                } else if (n == sizeof(uint64_t)) {
                    last[page] = *reinterpret_cast<volatile uint64_t *>(slot);
                }
                if (n != sizeof(uint64_t)) {
                    ++other_errors;
                    continue;
                }
                ++reads;
                if (last[page] != expected++) {
                    ++lost;  // a number skipped: a failed read consumed it
                }
            }
        }
    });
    std::thread registrar([&] {
        uint64_t rng = 777;
        while (!stop.load(std::memory_order_relaxed)) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t first = (rng >> 33) % pages;
            size_t n = 1 + (rng >> 20) % ((pages - first) * kPage - 1);
            if (acquireShared(arena + first * kPage, n, nullptr, nullptr) == 0) {
                releaseShared(arena + first * kPage, n);
                ++moves;
            }
        }
    });
    std::this_thread::sleep_for(std::chrono::seconds(soakSeconds()));
    stop = true;
    registrar.join();
    reader.join();
    close(p[0]);  // the feeder's write fails
    feeder.join();
    close(p[1]);
    std::printf("%d s: %llu reads into pages around %llu moves: %llu EFAULT, %llu lost\n", soakSeconds(),
                static_cast<unsigned long long>(reads), static_cast<unsigned long long>(moves.load()),
                static_cast<unsigned long long>(efaults), static_cast<unsigned long long>(lost));
    EXPECT_GT(moves.load(), 0u);
    EXPECT_GT(reads, 0u);
    EXPECT_EQ(other_errors, 0u);
    EXPECT_EQ(lost, 0u) << "reads whose bytes a move lost";
    EXPECT_EQ(sharedPageCount(), 0u);
    munmap(arena, pages * kPage);
}

}  // namespace
}  // namespace ibvx::client::broker
