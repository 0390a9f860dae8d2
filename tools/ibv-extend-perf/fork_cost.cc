// The fork section: what fork() costs a process that registered ordinary memory through the
// libibverbs face. The face gives the child a private copy of every registered page, taken in
// the parent by a pthread_atfork() prepare handler (docs/verbs.md, "fork()"), so a fork costs
// a copy of everything registered, whatever the child then touches. The same touched buffer,
// unregistered, is the baseline: there fork() only copies page tables.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/verbs_face.h"

namespace ibvx::perf {
namespace {

// fork() as the parent sees it (prepare handlers included) until the child has exited; ns.
uint64_t oneFork() {
    auto t0 = Clock::now();
    pid_t pid = ::fork();
    if (pid < 0) {
        queueError("fork");
    }
    if (pid == 0) {
        ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return nsSince(t0);
}

// An anonymous private buffer with every page written, as a program's heap would be.
class Touched {
  public:
    explicit Touched(size_t bytes) : bytes_(bytes) {
        p_ = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p_ == MAP_FAILED) {
            queueError("mmap of the fork section's buffer");
        }
        std::memset(p_, 0x5a, bytes);
    }
    ~Touched() { ::munmap(p_, bytes_); }
    Touched(const Touched &) = delete;
    Touched &operator=(const Touched &) = delete;
    void *get() const { return p_; }

  private:
    void *p_;
    size_t bytes_;
};

}  // namespace

void forkSection(const Options &opt, Results &out) {
    const size_t mib = opt.quick ? 16 : 256;
    const size_t bytes = mib << 20;
    const int iters = opt.quick ? 2 : 7;
    Face f;
    ibv_context *ctx = f.openDevice("softnda0");
    ibv_pd *pd = ctx == nullptr ? nullptr : f.alloc_pd(ctx);
    if (pd == nullptr) {
        queueError("the face's softnda0 and PD");
    }
    std::vector<uint64_t> plain, registered;
    {
        Touched buf(bytes);
        plain = timedSamples(iters, 1, oneFork);
        ibv_mr *mr = f.reg_mr(pd, buf.get(), bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        if (mr == nullptr) {
            queueError("ibv_reg_mr of the fork section's buffer");
        }
        registered = timedSamples(iters, 1, oneFork);
        f.dereg_mr(mr);
    }
    f.dealloc_pd(pd);
    f.close_device(ctx);
    const double plain_ms = percentile(plain, 50) / 1e6;
    const double reg_ms = percentile(registered, 50) / 1e6;
    const std::string size = std::to_string(mib) + " MiB";
    out.add("fork", "fork_ms_unregistered", plain_ms, "ms",
            "fork + child exit, " + size + " touched, not registered");
    out.add("fork", "fork_ms_registered", reg_ms, "ms", "the same " + size + " registered through the face");
    out.add("fork", "fork_ms_per_gib_registered", (reg_ms - plain_ms) * 1024.0 / static_cast<double>(mib),
            "ms/GiB", "what registration adds to a fork (the prepare handler's copy)");
}

}  // namespace ibvx::perf
