// Shared by every fuzz target: invariant checks that look like crashes to libFuzzer and to the
// standalone replay, and the fd census the leak invariants rely on.
#pragma once

#include <dirent.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

// A broken invariant is a finding exactly like a sanitizer report: say what broke, then abort so
// libFuzzer saves the input (and the standalone driver writes it out).
#define FUZZ_CHECK(cond, ...)                                                                          \
    do {                                                                                               \
        if (!(cond)) {                                                                                 \
            std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                                         \
            std::fputc('\n', stderr);                                                                  \
            std::abort();                                                                              \
        }                                                                                              \
    } while (0)

namespace ibvx::fuzz {

// Open descriptors of this process, not counting the one used to list them. A per-input
// before/after comparison is the leak check for code that receives or creates fds.
inline int countOpenFds() {
    DIR *d = opendir("/proc/self/fd");
    FUZZ_CHECK(d != nullptr, "cannot list /proc/self/fd");
    int n = 0;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] != '.') {
            ++n;
        }
    }
    closedir(d);
    return n - 1;
}

// The open-fd count once it has held still for `quiet`: a server just started (gRPC's threads,
// their pollers) may open and close descriptors for a while, and a baseline taken in that
// window makes the first input's leak check see a "leak" (or a close) that is not its own.
inline int settledFdCount(std::chrono::milliseconds quiet = std::chrono::milliseconds(200),
                          std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    int n = countOpenFds();
    auto since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        const int now = countOpenFds();
        if (now != n) {
            n = now;
            since = std::chrono::steady_clock::now();
        } else if (std::chrono::steady_clock::now() - since >= quiet) {
            break;
        }
    }
    return n;
}

// The costly setup a target builds once per process (a broker, a server): made by the first
// input, torn down at exit so LeakSanitizer finds nothing of it still allocated.
template <typename Fixture>
Fixture &processFixture() {
    static Fixture *fixture = nullptr;
    if (fixture == nullptr) {
        fixture = new Fixture;
        std::atexit([] {
            delete fixture;
            fixture = nullptr;
        });
    }
    return *fixture;
}

}  // namespace ibvx::fuzz
