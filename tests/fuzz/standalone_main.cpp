// Runs a libFuzzer target without libFuzzer, so every build (gcc, ASan+UBSan) exercises it in
// `make test`: each input file named on the command line (or found in a named directory), then a
// bounded number of deterministic mutations of them. The same seed gives the same inputs, so a
// failure in ctest reproduces by running the same command again; the failing input is also
// written out as a file to add to the corpus.
//
//   fuzz_<target> [--mutations N] [--seed S] [--max-len L] PATH...

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern "C" int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
// Provided by the ASan/UBSan runtimes: lets a sanitizer report save the input as well.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

using Bytes = std::vector<uint8_t>;

// What is running now, for the crash handlers (plain globals: they run in a signal handler).
const uint8_t *g_current = nullptr;
size_t g_current_size = 0;
char g_current_name[512] = "";
volatile sig_atomic_t g_dumped = 0;

void writeAll(int fd, const void *p, size_t n) {
    const char *c = static_cast<const char *>(p);
    while (n > 0) {
        ssize_t w = ::write(fd, c, n);
        if (w <= 0) {
            return;
        }
        c += w;
        n -= static_cast<size_t>(w);
    }
}

void writeStr(int fd, const char *s) {
    writeAll(fd, s, std::strlen(s));
}

// Async-signal-safe: saves the current input as ./fuzz-crash-input and says which one it was.
void dumpCurrentInput() {
    if (g_dumped || g_current == nullptr) {
        return;
    }
    g_dumped = 1;
    writeStr(2, "\nstandalone fuzz driver: failing input: ");
    writeStr(2, g_current_name);
    int fd = ::open("fuzz-crash-input", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        writeAll(fd, g_current, g_current_size);
        ::close(fd);
        writeStr(2, "\nstandalone fuzz driver: saved as ./fuzz-crash-input (relative to the working dir)\n");
    }
}

void onFatalSignal(int sig) {
    dumpCurrentInput();
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}

// splitmix64: tiny, well mixed and identical everywhere, which is all determinism needs.
class Rng {
  public:
    explicit Rng(uint64_t seed) : s_(seed) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    // Uniform enough in [0, n); n > 0.
    size_t below(size_t n) { return static_cast<size_t>(next() % n); }

  private:
    uint64_t s_;
};

// Values that sit on boundaries parsers get wrong: sizes, signs, separators of the formats we
// parse (frames, config lines, TOML, protobuf varints).
constexpr uint8_t kInterestingBytes[] = {0x00, 0x01, 0x7f, 0x80, 0xff, '\n', '\r', ' ', '\t', '#',
                                         '=',  '"',  '\'', '[',  ']',  ':',  ';',  ',', '\\', '-'};
constexpr uint32_t kInterestingWords[] = {0,    1,          16,         4095,       4096,
                                          4097, 0x7fffffff, 0x80000000, 0xffffffff, 0xfffffff0};

void mutateOnce(Bytes &b, const std::vector<Bytes> &pool, Rng &rng, size_t max_len) {
    switch (rng.below(9)) {
        case 0:  // flip a bit
            if (!b.empty()) {
                b[rng.below(b.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
            }
            break;
        case 1:  // a random byte
            if (!b.empty()) {
                b[rng.below(b.size())] = static_cast<uint8_t>(rng.next());
            }
            break;
        case 2:  // a boundary byte
            if (!b.empty()) {
                b[rng.below(b.size())] = kInterestingBytes[rng.below(std::size(kInterestingBytes))];
            }
            break;
        case 3:  // a boundary 32-bit little-endian word
            if (b.size() >= 4) {
                uint32_t w = kInterestingWords[rng.below(std::size(kInterestingWords))];
                std::memcpy(&b[rng.below(b.size() - 3)], &w, sizeof(w));
            }
            break;
        case 4: {  // insert random bytes
            size_t n = 1 + rng.below(16);
            size_t at = rng.below(b.size() + 1);
            Bytes ins(n);
            for (auto &c : ins) {
                c = static_cast<uint8_t>(rng.next());
            }
            b.insert(b.begin() + static_cast<ptrdiff_t>(at), ins.begin(), ins.end());
            break;
        }
        case 5:  // delete a range
            if (!b.empty()) {
                size_t at = rng.below(b.size());
                size_t n = 1 + rng.below(std::min<size_t>(b.size() - at, 32));
                b.erase(b.begin() + static_cast<ptrdiff_t>(at), b.begin() + static_cast<ptrdiff_t>(at + n));
            }
            break;
        case 6:  // duplicate a range elsewhere (repeated frames, lines, fields)
            if (!b.empty()) {
                size_t from = rng.below(b.size());
                size_t n = 1 + rng.below(std::min<size_t>(b.size() - from, 64));
                Bytes chunk(b.begin() + static_cast<ptrdiff_t>(from),
                            b.begin() + static_cast<ptrdiff_t>(from + n));
                b.insert(b.begin() + static_cast<ptrdiff_t>(rng.below(b.size() + 1)), chunk.begin(),
                         chunk.end());
            }
            break;
        case 7: {  // splice: our head, another input's tail
            const Bytes &other = pool[rng.below(pool.size())];
            size_t head = rng.below(b.size() + 1);
            size_t tail = rng.below(other.size() + 1);
            b.resize(head);
            b.insert(b.end(), other.begin() + static_cast<ptrdiff_t>(tail), other.end());
            break;
        }
        default:  // truncate
            b.resize(rng.below(b.size() + 1));
            break;
    }
    if (b.size() > max_len) {
        b.resize(max_len);
    }
}

// Runs one input from an exactly sized heap copy, so a read past the end is a sanitizer report
// rather than a read of the driver's spare capacity.
void runOne(const Bytes &input, const std::string &name) {
    std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(input.size(), 1)]);
    std::copy(input.begin(), input.end(), copy.get());  // memcpy may not take an empty vector's nullptr
    g_current = copy.get();
    g_current_size = input.size();
    std::snprintf(g_current_name, sizeof(g_current_name), "%s", name.c_str());
    LLVMFuzzerTestOneInput(copy.get(), input.size());
    g_current = nullptr;
}

bool readFile(const std::filesystem::path &p, Bytes *out) {
    std::ifstream f(p, std::ios::binary);
    if (!f) {
        return false;
    }
    out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return true;
}

[[noreturn]] void usage(const char *argv0) {
    std::fprintf(stderr, "usage: %s [--mutations N] [--seed S] [--max-len L] PATH...\n", argv0);
    std::exit(2);
}

}  // namespace

int main(int argc, char **argv) {
    uint64_t mutations = 0;
    uint64_t seed = 1;
    size_t max_len = 64 * 1024;
    std::vector<std::string> paths;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&]() -> uint64_t {
            if (i + 1 >= argc) {
                usage(argv[0]);
            }
            return std::strtoull(argv[++i], nullptr, 0);
        };
        if (a == "--mutations") {
            mutations = value();
        } else if (a == "--seed") {
            seed = value();
        } else if (a == "--max-len") {
            max_len = static_cast<size_t>(value());
        } else if (!a.empty() && a[0] == '-') {
            usage(argv[0]);
        } else {
            paths.push_back(a);
        }
    }
    if (paths.empty()) {
        usage(argv[0]);
    }

    struct Input {
        std::string name;
        Bytes bytes;
    };
    std::vector<Input> inputs;
    for (const std::string &p : paths) {
        std::error_code ec;
        if (std::filesystem::is_directory(p, ec)) {
            std::vector<std::filesystem::path> files;
            for (const auto &e : std::filesystem::directory_iterator(p)) {
                if (e.is_regular_file()) {
                    files.push_back(e.path());
                }
            }
            std::sort(files.begin(), files.end());  // a stable order keeps mutations reproducible
            for (const auto &f : files) {
                Input in{f.string(), {}};
                if (!readFile(f, &in.bytes)) {
                    std::fprintf(stderr, "cannot read %s\n", f.c_str());
                    return 2;
                }
                inputs.push_back(std::move(in));
            }
        } else {
            Input in{p, {}};
            if (!readFile(p, &in.bytes)) {
                std::fprintf(stderr, "cannot read %s\n", p.c_str());
                return 2;
            }
            inputs.push_back(std::move(in));
        }
    }
    if (inputs.empty()) {
        std::fprintf(stderr, "no inputs found in the given paths\n");
        return 2;
    }

    for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
        ::signal(sig, onFatalSignal);
    }
    if (__sanitizer_set_death_callback != nullptr) {
        __sanitizer_set_death_callback(dumpCurrentInput);
    }
    if (LLVMFuzzerInitialize != nullptr) {
        LLVMFuzzerInitialize(&argc, &argv);
    }

    for (const Input &in : inputs) {
        runOne(in.bytes, in.name);
    }
    std::vector<Bytes> pool;
    for (const Input &in : inputs) {
        pool.push_back(in.bytes);
    }
    Rng rng(seed);
    for (uint64_t m = 0; m < mutations; ++m) {
        size_t base = rng.below(inputs.size());
        Bytes b = inputs[base].bytes;
        size_t rounds = 1 + rng.below(4);
        for (size_t r = 0; r < rounds; ++r) {
            mutateOnce(b, pool, rng, max_len);
        }
        char name[64];
        std::snprintf(name, sizeof(name), "mutation %" PRIu64 " (seed %" PRIu64 ") of ", m, seed);
        runOne(b, name + inputs[base].name);
    }
    std::printf("%s: executed %zu corpus inputs and %" PRIu64 " mutations (seed %" PRIu64 ")\n", argv[0],
                inputs.size(), mutations, seed);
    return 0;
}
