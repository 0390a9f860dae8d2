// Shared by every fuzz target: invariant checks that look like crashes to libFuzzer and to the
// standalone replay, and the fd census the leak invariants rely on.
#pragma once

#include <dirent.h>

#include <cstdio>
#include <cstdlib>

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
