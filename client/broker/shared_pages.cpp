#include "client/broker/shared_pages.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "client/broker/write_hold.h"
#include "common/proc_maps.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IBVX_LSAN_ROOTS 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define IBVX_LSAN_ROOTS 1
#endif
#ifdef IBVX_LSAN_ROOTS
#include <sanitizer/lsan_interface.h>
#endif

namespace ibvx::client::broker {
namespace {

constexpr int kReadWrite = PROT_READ | PROT_WRITE;

// The moves below change no memory the program sees (its pages keep their addresses and
// contents), so they go to the kernel directly: a library that hooks mmap/munmap/mremap in the
// program (UCX's UCM patches libc's entries to invalidate its registration cache) must not take
// them for the program unmapping its buffers. Through such a hook, a move made inside a
// registration or deregistration re-entered them and corrupted the heap (UCX 1.13 over the face
// died at exit with a dynamic-linker "symbol lookup error").
void *rawMmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) {
    return reinterpret_cast<void *>(::syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
}
int rawMunmap(void *addr, size_t len) {
    return static_cast<int>(::syscall(SYS_munmap, addr, len));
}
int rawMprotect(void *addr, size_t len, int prot) {
    return static_cast<int>(::syscall(SYS_mprotect, addr, len, prot));
}
void *rawMremap(void *old_addr, size_t old_len, size_t new_len, int flags, void *new_addr) {
    return reinterpret_cast<void *>(::syscall(SYS_mremap, old_addr, old_len, new_len, flags, new_addr));
}

uintptr_t pageSize() {
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    return page;
}

std::string hex(uintptr_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%" PRIxPTR, v);
    return buf;
}

std::string span(uintptr_t begin, uintptr_t end) {
    return "[" + hex(begin) + ", " + hex(end) + ")";
}

// One line of /proc/self/maps.
using Vma = MapsEntry;

bool readMaps(std::vector<Vma> *out) {
    return ibvx::readMaps("/proc/self/maps", out);
}

// Raw system calls for copying the moved bytes: the kernel reads and writes the pages, so a
// sanitizer's interceptors never see a copy that spans malloc redzones or other objects sharing
// the first and last page.
int copyToFile(int fd, uintptr_t addr, size_t len, uint64_t offset) {
    while (len > 0) {
        long n = ::syscall(SYS_pwrite64, fd, addr, len, offset);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return n < 0 ? errno : EIO;
        }
        addr += static_cast<uintptr_t>(n);
        offset += static_cast<uint64_t>(n);
        len -= static_cast<size_t>(n);
    }
    return 0;
}

int copyFromFile(int fd, uintptr_t addr, size_t len, uint64_t offset) {
    while (len > 0) {
        long n = ::syscall(SYS_pread64, fd, addr, len, offset);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return errno;
        }
        if (n == 0) {
            return 0;  // past the end of the file: the rest stays zero, as the mapping read it
        }
        addr += static_cast<uintptr_t>(n);
        offset += static_cast<uint64_t>(n);
        len -= static_cast<size_t>(n);
    }
    return 0;
}

// Other threads' writes to the pages held from before the copy until the new mapping is in
// place (write_hold.h), when the pages can be written at all. Nothing of ours writes the range
// meanwhile (no allocation, no bookkeeping, not the calling thread's stack or errno: unmovable()).
WriteHold holdWrites(uintptr_t addr, size_t len, int prot) {
    return (prot & PROT_WRITE) != 0 ? WriteHold(addr, len) : WriteHold(addr, 0);
}

// Replaces [addr, addr + len) by private anonymous memory holding the file's bytes at offset,
// with protection prot. The new pages are filled aside and moved into place by one mremap, so
// the range never reads as anything but its contents. 0 or an errno; on failure the range is
// as it was.
int moveToPrivate(int fd, uintptr_t addr, size_t len, int prot, uint64_t offset) {
    void *tmp = rawMmap(nullptr, len, kReadWrite, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tmp == MAP_FAILED) {
        return errno;
    }
    int err = 0;
    {
        WriteHold hold = holdWrites(addr, len, prot);
        err = copyFromFile(fd, reinterpret_cast<uintptr_t>(tmp), len, offset);
        if (err == 0 && prot != kReadWrite && rawMprotect(tmp, len, prot) < 0) {
            err = errno;
        }
        if (err == 0 && rawMremap(tmp, len, len, MREMAP_MAYMOVE | MREMAP_FIXED,
                                  reinterpret_cast<void *>(addr)) == MAP_FAILED) {
            err = errno;
        }
    }
    if (err != 0) {
        rawMunmap(tmp, len);
    }
    return err;
}

// Moves private [addr, addr + len) onto the memfd at file offset addr: the bytes are copied,
// then the shared mapping replaces the private one. 0 or an errno; *mapped says whether the old
// mapping may be gone.
int moveToShared(int fd, uintptr_t addr, size_t len, int prot, bool *mapped) {
    *mapped = false;
    WriteHold hold = holdWrites(addr, len, prot);
    if (int err = copyToFile(fd, addr, len, addr); err != 0) {
        return err;
    }
    *mapped = true;  // a failed MAP_FIXED may already have unmapped the old range
    if (rawMmap(reinterpret_cast<void *>(addr), len, prot, MAP_SHARED | MAP_FIXED, fd,
                static_cast<off_t>(addr)) == MAP_FAILED) {
        return errno;
    }
    return 0;
}

struct Run {
    uintptr_t end = 0;
    // Acquisitions holding the pages. 0: the pages are still shared because moving them back
    // failed; a later release retries.
    uint32_t count = 0;
};

struct ForkPiece {
    uintptr_t addr = 0;
    size_t len = 0;
    int prot = 0;
    uint64_t file_offset = 0;
    size_t snapshot_offset = 0;
};

struct State {
    std::mutex mu;  // guards everything below; held across the moves' system calls
    int fd = -1;    // the memfd; -1 while no page is moved
    dev_t dev = 0;
    ino_t ino = 0;
    uint64_t size = 0;              // the memfd's size (it only grows while open)
    std::map<uintptr_t, Run> runs;  // moved pages: disjoint page-aligned runs keyed by start
    // Between the fork handlers: what the child takes private, and the bytes as at fork(). Both
    // live in private mappings of their own: the child reads them while the heap pages it
    // shares with the parent are still the parent's live (and changing) memory.
    ForkPiece *fork_pieces = nullptr;
    size_t fork_piece_count = 0;
    size_t fork_plan_len = 0;
    void *snapshot = nullptr;
    size_t snapshot_len = 0;
};

// The state lives on a page of its own that acquireShared() refuses to move: the moving thread
// writes it, and a thread waiting for the mutex writes the mutex word, which during a move
// would wait for the mover (held) or be lost (unheld).
struct StateHome {
    State *state = nullptr;
    uintptr_t begin = 0;
    uintptr_t end = 0;
};

void forkPrepare();
void forkParent();
void forkChild();

StateHome &home() {
    static StateHome h = [] {
        StateHome r;
        size_t len = (sizeof(State) + pageSize() - 1) & ~(pageSize() - 1);
        void *p = rawMmap(nullptr, len, kReadWrite, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return r;
        }
        r.state = new (p) State;  // never destroyed: static destructors may still release
#ifdef IBVX_LSAN_ROOTS
        // The registry's nodes are reachable from this page only, which LeakSanitizer does not
        // scan by itself: registrations alive at exit are not leaks.
        __lsan_register_root_region(p, len);
#endif
        r.begin = reinterpret_cast<uintptr_t>(p);
        r.end = r.begin + len;
        // Registered at load (below), before other libraries' handlers as far as we can: prepare
        // handlers run in reverse order, so ours copies the pages after theirs have run, and
        // ours is the first child handler, before any other can write a still-shared page.
        pthread_atfork(forkPrepare, forkParent, forkChild);
        return r;
    }();
    return h;
}

bool ours(const State &s, const Vma &v) {
    return s.fd >= 0 && v.dev == s.dev && v.inode == static_cast<uint64_t>(s.ino);
}

// Ours and at home: the file offset of every page is its address.
bool atHome(const State &s, const Vma &v) {
    return ours(s, v) && v.offset == v.start;
}

// Makes `at` a run boundary.
void splitAt(std::map<uintptr_t, Run> &runs, uintptr_t at) {
    auto it = runs.upper_bound(at);
    if (it == runs.begin()) {
        return;
    }
    --it;
    if (it->first < at && at < it->second.end) {
        Run tail{it->second.end, it->second.count};
        it->second.end = at;
        runs.emplace(at, tail);
    }
}

// Joins touching runs of equal count in [from, to] so big registrations stay a few nodes.
void mergeAround(std::map<uintptr_t, Run> &runs, uintptr_t from, uintptr_t to) {
    auto it = runs.upper_bound(from);
    if (it != runs.begin()) {
        --it;
    }
    while (it != runs.end() && it->first <= to) {
        auto next = std::next(it);
        if (next != runs.end() && it->second.end == next->first && it->second.count == next->second.count) {
            it->second.end = next->second.end;
            runs.erase(next);
        } else {
            it = next;
        }
    }
}

void eraseRange(std::map<uintptr_t, Run> &runs, uintptr_t begin, uintptr_t end) {
    splitAt(runs, begin);
    splitAt(runs, end);
    runs.erase(runs.lower_bound(begin), runs.lower_bound(end));
}

// Releases the file space of [begin, end) but not of pages a run still names.
void punchUnheld(const State &s, uint64_t begin, uint64_t end) {
    uint64_t cur = begin;
    auto it = s.runs.upper_bound(static_cast<uintptr_t>(begin));
    if (it != s.runs.begin() && std::prev(it)->second.end > begin) {
        --it;
    }
    while (cur < end) {
        uint64_t hole_end = (it == s.runs.end()) ? end : std::min<uint64_t>(end, it->first);
        if (hole_end > cur) {
            ::fallocate(s.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(cur),
                        static_cast<off_t>(hole_end - cur));
        }
        if (it == s.runs.end()) {
            break;
        }
        cur = std::max<uint64_t>(cur, it->second.end);
        ++it;
    }
}

// A mapping of our memfd away from its home exists only if the program moved our pages
// (mremap, as realloc() does with a big chunk). Those pages are the program's memory now, no
// longer the registered pages, just as real pinned pages would stay with the MR: they become
// private again, and their file space goes unless a registration still holds it.
bool takeStraysPrivate(State &s, std::vector<Vma> *vmas) {
    bool changed = false;
    for (const Vma &v : *vmas) {
        if (ours(s, v) && !atHome(s, v) &&
            moveToPrivate(s.fd, v.start, v.end - v.start, v.prot, v.offset) == 0) {
            punchUnheld(s, v.offset, v.offset + (v.end - v.start));
            changed = true;
        }
    }
    return !changed || readMaps(vmas);
}

// The calling thread's own memory, which it writes while it moves pages: its stack (found by an
// address in it, `frame`) and its thread-local storage, from errno (which a failed system call
// writes) to its thread descriptor. A move of such a page would wait for itself (held, forever)
// or lose the write (unheld). Other threads' stacks and TLS move like any memory.
struct Caller {
    uintptr_t frame = 0;
    uintptr_t errno_at = 0;
    uintptr_t self_at = 0;
    uintptr_t tls_begin = 0;  // the pages from one to the other
    uintptr_t tls_end = 0;
};

Caller callerOf(uintptr_t frame) {
    const auto err = reinterpret_cast<uintptr_t>(&errno);
    const auto self = static_cast<uintptr_t>(pthread_self());
    // The descriptor starts at `self` and is under a page long.
    const uintptr_t last = std::max(err, self) + pageSize();
    return {frame, err, self, std::min(err, self) & ~(pageSize() - 1),
            (last + pageSize() - 1) & ~(pageSize() - 1)};
}

// Why v's pages [begin, end) cannot move onto shared memory, or "" when they can.
std::string unmovable(const Vma &v, uintptr_t begin, uintptr_t end, const Caller &caller,
                      const StateHome &h) {
    std::string where = span(begin, end);
    if (v.shared) {
        if (v.path.rfind("/dev/zero", 0) == 0 || v.path.rfind("[anon_shmem", 0) == 0) {
            return where +
                   " is shared anonymous memory (MAP_SHARED|MAP_ANONYMOUS): its pages are shared with "
                   "other processes and cannot move; allocate it with ibvx_alloc_buf() instead";
        }
        return where + " is a shared mapping of " +
               (v.path.empty() ? std::string("an unnamed object") : v.path) +
               ": its pages belong to that object and cannot move; register the object's fd with "
               "ibvx_reg_mr_fd() instead";
    }
    if (v.path.rfind("/dev/", 0) == 0) {
        return where + " maps the device " + v.path + ": device memory cannot move onto shared memory";
    }
    if (v.path.rfind("/anon_hugepage", 0) == 0) {
        return where + " is hugetlb memory: it cannot be remapped with ordinary pages";
    }
    if (v.path.rfind("[stack", 0) == 0 || (caller.frame >= v.start && caller.frame < v.end)) {
        return where + " is on " +
               (v.path.rfind("[stack", 0) == 0 ? "the main thread's" : "the calling thread's") +
               " stack, whose pages are written while they would move; register heap or mmap'd memory";
    }
    if (!v.path.empty() && v.path[0] == '[' && v.path != "[heap]" && v.path.rfind("[anon:", 0) != 0) {
        return where + " is the kernel's " + v.path + " mapping";
    }
    if ((v.prot & PROT_READ) == 0) {
        return where + " is not readable (PROT_NONE)";
    }
    if ((v.prot & PROT_EXEC) != 0) {
        return where + " is executable code";
    }
    if (begin < h.end && h.begin < end) {
        return where + " holds the shared-pages bookkeeping itself";
    }
    // The span may reach past the TLS into a neighbouring mapping: only the mapping holding it.
    const bool holds_tls = (caller.errno_at >= v.start && caller.errno_at < v.end) ||
                           (caller.self_at >= v.start && caller.self_at < v.end);
    if (holds_tls && begin < caller.tls_end && caller.tls_begin < end) {
        return where + " holds the calling thread's thread-local storage, which the move itself writes";
    }
    return "";
}

int errnoResult(int err) {
    // What the environment refuses to give (file size, memory, mappings) is -ENOMEM; the rest
    // means the memory itself was not what it looked like.
    return (err == EFAULT || err == EINVAL || err == EACCES || err == EPERM) ? -EINVAL : -ENOMEM;
}

int ensureFd(State &s, std::string *why) {
    if (s.fd >= 0) {
        return 0;
    }
    // It only grows (ensureSize): sealed against shrinking, as the broker requires of memory it
    // maps, since this process holds the fd and could otherwise truncate it under the broker.
    int fd = ::memfd_create("ibvx-shared-pages", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        *why = std::string("cannot create the memfd registered memory moves onto: ") + std::strerror(errno);
        return -ENOMEM;
    }
    if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
        *why = std::string("cannot seal the shared-pages memfd against shrinking: ") + std::strerror(errno);
        ::close(fd);
        return -ENOMEM;
    }
    struct stat st {};
    if (::fstat(fd, &st) < 0) {
        *why = std::string("cannot stat the shared-pages memfd: ") + std::strerror(errno);
        ::close(fd);
        return -ENOMEM;
    }
    s.fd = fd;
    s.dev = st.st_dev;
    s.ino = st.st_ino;
    s.size = 0;
    openWriteHolds();  // lives as long as the memfd: no descriptor stays while nothing is moved
    return 0;
}

void closeIfUnused(State &s) {
    if (s.runs.empty() && s.fd >= 0) {
        closeWriteHolds();
        ::close(s.fd);
        s.fd = -1;
        s.size = 0;
    }
}

struct Piece {
    uintptr_t begin = 0;
    uintptr_t end = 0;
    int prot = 0;
};

// Puts back pieces already moved by a failed acquisition.
void rollBack(State &s, const std::vector<Piece> &moved) {
    for (const Piece &p : moved) {
        moveToPrivate(s.fd, p.begin, p.end - p.begin, p.prot, p.begin);
        punchUnheld(s, p.begin, p.end);
    }
}

// The pieces of [begin, end) an acquisition moves: every page must be mapped and movable, and
// pages at home already are where they must be. 0, or -EINVAL with *why. `caller` is what the
// calling thread writes itself.
int piecesToMove(const State &s, const StateHome &h, const std::vector<Vma> &vmas, uintptr_t begin,
                 uintptr_t end, const Caller &caller, std::vector<Piece> *pieces, std::string *why) {
    auto it = std::upper_bound(vmas.begin(), vmas.end(), begin,
                               [](uintptr_t a, const Vma &v) { return a < v.end; });
    for (uintptr_t cur = begin; cur < end; ++it) {
        if (it == vmas.end() || it->start > cur) {
            uintptr_t hole_end = it == vmas.end() ? end : std::min(end, it->start);
            *why = span(cur, hole_end) + " is not mapped";
            return -EINVAL;
        }
        uintptr_t piece_end = std::min(end, it->end);
        if (!atHome(s, *it)) {
            if (std::string no = unmovable(*it, cur, piece_end, caller, h); !no.empty()) {
                *why = std::move(no);
                return -EINVAL;
            }
            pieces->push_back({cur, piece_end, it->prot});
        }
        cur = piece_end;
    }
    return 0;
}

// Makes the memfd reach `end`, the highest address about to move home. 0, or -ENOMEM with *why.
int growFileTo(State &s, uintptr_t end, std::string *why) {
    if (s.size < end) {
        if (::ftruncate(s.fd, static_cast<off_t>(end)) < 0) {
            *why = "cannot grow the shared-pages memfd to " + std::to_string(end) +
                   " bytes: " + std::strerror(errno);
            return -ENOMEM;
        }
        s.size = end;
    }
    return 0;
}

// Moves every piece onto its home in the memfd. 0; or, when one cannot move, the pieces already
// moved go back and the answer is a negative errno (errnoResult) with *why.
int moveAllToShared(State &s, const std::vector<Piece> &pieces, std::string *why) {
    std::vector<Piece> moved;
    for (const Piece &p : pieces) {
        bool mapped = false;
        if (int err = moveToShared(s.fd, p.begin, p.end - p.begin, p.prot, &mapped); err != 0) {
            if (mapped) {
                moved.push_back(p);
            } else {
                punchUnheld(s, p.begin, p.end);
            }
            rollBack(s, moved);
            *why = "cannot move " + span(p.begin, p.end) + " onto shared memory: " + std::strerror(err);
            return errnoResult(err);
        }
        moved.push_back(p);
    }
    return 0;
}

// Counts one more holder on every page of [begin, end).
void holdPages(std::map<uintptr_t, Run> &runs, uintptr_t begin, uintptr_t end) {
    splitAt(runs, begin);
    splitAt(runs, end);
    uintptr_t cur = begin;
    for (auto r = runs.lower_bound(begin); cur < end;) {
        if (r == runs.end() || r->first > cur) {
            uintptr_t gap_end = r == runs.end() ? end : std::min(end, r->first);
            runs.emplace(cur, Run{gap_end, 1});
            cur = gap_end;
            continue;
        }
        ++r->second.count;
        cur = r->second.end;
        ++r;
    }
    mergeAround(runs, begin, end);
}

bool pageRange(void *addr, size_t length, uintptr_t *begin, uintptr_t *end) {
    auto a = reinterpret_cast<uintptr_t>(addr);
    const uintptr_t page = pageSize();
    if (length == 0 || a > UINTPTR_MAX - length || a + length > UINTPTR_MAX - (page - 1)) {
        return false;
    }
    *begin = a & ~(page - 1);
    *end = (a + length + page - 1) & ~(page - 1);
    // File offsets are off_t: no user address reaches that far, but a forged one must not wrap.
    return *end <= static_cast<uintptr_t>(INT64_MAX);
}

void forgetForkPlan(State &s) {
    if (s.snapshot != nullptr) {
        rawMunmap(s.snapshot, s.snapshot_len);  // in the child, what is left: moved slices are holes
    }
    if (s.fork_pieces != nullptr) {
        rawMunmap(s.fork_pieces, s.fork_plan_len);
    }
    s.snapshot = nullptr;
    s.snapshot_len = 0;
    s.fork_pieces = nullptr;
    s.fork_piece_count = 0;
    s.fork_plan_len = 0;
}

void forkPrepare() {
    State &s = *home().state;
    s.mu.lock();
    if (s.fd < 0) {
        return;
    }
    size_t total = 0;
    {
        std::vector<ForkPiece> pieces;
        std::vector<Vma> vmas;
        if (readMaps(&vmas)) {
            for (const Vma &v : vmas) {
                if (ours(s, v)) {
                    pieces.push_back({v.start, v.end - v.start, v.prot, v.offset, total});
                    total += v.end - v.start;
                }
            }
        } else {
            // Without the maps, the registry still knows the pages at home (not their
            // protection): a writable private copy beats a child writing into the parent's memory.
            for (const auto &[start, run] : s.runs) {
                pieces.push_back({start, run.end - start, kReadWrite, start, total});
                total += run.end - start;
            }
        }
        if (pieces.empty()) {
            return;
        }
        size_t plan_len = (pieces.size() * sizeof(ForkPiece) + pageSize() - 1) & ~(pageSize() - 1);
        void *plan = rawMmap(nullptr, plan_len, kReadWrite, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (plan == MAP_FAILED) {
            return;  // the child keeps sharing the pages with the parent: nothing better is possible
        }
        std::memcpy(plan, pieces.data(), pieces.size() * sizeof(ForkPiece));
        s.fork_pieces = static_cast<ForkPiece *>(plan);
        s.fork_piece_count = pieces.size();
        s.fork_plan_len = plan_len;
    }  // freed before the copy: heap pages in the copy must agree with malloc's own state
    // The child's private copies are taken here, in the parent, before fork(): a copy made in
    // the child could already hold what the parent wrote after its fork() returned. fork()
    // shares the snapshot copy-on-write, so the child only has to mremap it into place. From
    // here to fork() nothing of ours writes memory (a free() would change heap pages the copy
    // holds); our prepare handler runs last, as it was registered first (at load).
    // Populated in one go: faulting the copy in page by page during the pread() cost as much as
    // the copy itself (ibv-extend-perf --only fork: 256 MiB registered, ~1,500 -> ~740 ms).
    void *snap = rawMmap(nullptr, total, kReadWrite, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (snap == MAP_FAILED) {
        return;  // the child copies from the file itself
    }
    for (size_t i = 0; i < s.fork_piece_count; ++i) {
        const ForkPiece &p = s.fork_pieces[i];
        copyFromFile(s.fd, reinterpret_cast<uintptr_t>(snap) + p.snapshot_offset, p.len, p.file_offset);
    }
    s.snapshot = snap;
    s.snapshot_len = total;
}

void forkParent() {
    State &s = *home().state;
    forgetForkPlan(s);
    s.mu.unlock();
}

// The child has no registrations (its MRs are the parent's): every shared page becomes private
// memory holding the bytes as at fork(), and the child's own registrations start a new memfd.
// Until its pages are in place it reads nothing but the state page and the plan.
void forkChild() {
    State &s = *home().state;
    closeWriteHolds();  // the parent's: its ioctls would act on the parent's memory (one thread here)
    for (size_t i = 0; i < s.fork_piece_count; ++i) {
        const ForkPiece &p = s.fork_pieces[i];
        bool placed = false;
        if (s.snapshot != nullptr) {
            void *slice = static_cast<char *>(s.snapshot) + p.snapshot_offset;
            placed = (p.prot == kReadWrite || rawMprotect(slice, p.len, p.prot) == 0) &&
                     rawMremap(slice, p.len, p.len, MREMAP_MAYMOVE | MREMAP_FIXED,
                               reinterpret_cast<void *>(p.addr)) != MAP_FAILED;
        }
        if (!placed) {
            moveToPrivate(s.fd, p.addr, p.len, p.prot, p.file_offset);
        }
    }
    forgetForkPlan(s);
    if (s.fd >= 0) {
        ::close(s.fd);
    }
    s.fd = -1;
    s.size = 0;
    s.runs.clear();
    s.mu.unlock();
}

// The state and the fork handlers exist from load on: no fork() can fall between a first
// acquisition's start and the handlers' registration.
[[maybe_unused]] const bool g_registered_at_load = home().state != nullptr;

}  // namespace

bool inSharedMapping(const void *addr, size_t length) {
    std::vector<Vma> vmas;
    const auto begin = reinterpret_cast<uintptr_t>(addr);
    if (length == 0 || begin > UINTPTR_MAX - length || !readMaps(&vmas)) {
        return false;
    }
    const Vma *v = findMapping(vmas, begin);
    return v != nullptr && v->shared && begin + length <= v->end &&
           (v->prot & (PROT_READ | PROT_WRITE)) == (PROT_READ | PROT_WRITE);
}

int acquireShared(void *addr, size_t length, SharedWindow *out, std::string *why) {
    std::string reason;
    std::string &msg = why != nullptr ? *why : reason;
    uintptr_t begin = 0, end = 0;
    if (length == 0) {
        msg = "the length is 0";
        return -EINVAL;
    }
    if (!pageRange(addr, length, &begin, &end)) {
        msg = "[" + hex(reinterpret_cast<uintptr_t>(addr)) + ", +" + std::to_string(length) +
              ") runs past the end of the address space";
        return -EINVAL;
    }
    StateHome &h = home();
    if (h.state == nullptr) {
        msg = "cannot map the shared-pages bookkeeping";
        return -ENOMEM;
    }
    State &s = *h.state;
    std::lock_guard lock(s.mu);
    if (int rc = ensureFd(s, &msg); rc != 0) {
        return rc;
    }
    std::vector<Vma> vmas;
    if (!readMaps(&vmas) || !takeStraysPrivate(s, &vmas)) {
        msg = std::string("cannot read /proc/self/maps: ") + std::strerror(errno);
        closeIfUnused(s);
        return -ENOMEM;
    }

    const Caller caller = callerOf(reinterpret_cast<uintptr_t>(__builtin_frame_address(0)));
    std::vector<Piece> pieces;
    int rc = piecesToMove(s, h, vmas, begin, end, caller, &pieces, &msg);
    if (rc == 0) {
        rc = growFileTo(s, end, &msg);
    }
    if (rc == 0) {
        rc = moveAllToShared(s, pieces, &msg);
    }
    if (rc != 0) {
        closeIfUnused(s);
        return rc;
    }
    holdPages(s.runs, begin, end);
    if (out != nullptr) {
        out->fd = s.fd;
        out->offset = reinterpret_cast<uintptr_t>(addr);
    }
    return 0;
}

void releaseShared(void *addr, size_t length) {
    uintptr_t begin = 0, end = 0;
    if (!pageRange(addr, length, &begin, &end)) {
        return;
    }
    StateHome &h = home();
    if (h.state == nullptr) {
        return;
    }
    State &s = *h.state;
    std::lock_guard lock(s.mu);
    if (s.fd < 0) {
        return;
    }
    splitAt(s.runs, begin);
    splitAt(s.runs, end);
    for (auto r = s.runs.lower_bound(begin); r != s.runs.end() && r->first < end; ++r) {
        if (r->second.count > 0) {
            --r->second.count;
        }
    }
    mergeAround(s.runs, begin, end);

    std::vector<Vma> vmas;
    if (!readMaps(&vmas) || !takeStraysPrivate(s, &vmas)) {
        return;  // the pages stay shared with no holder; the next release retries
    }
    // Every unheld run (this release's, and earlier ones whose move back failed) goes private.
    std::vector<Piece> unheld;
    for (const auto &[start, run] : s.runs) {
        if (run.count == 0) {
            unheld.push_back({start, run.end, 0});
        }
    }
    std::vector<Piece> done;
    for (const Piece &u : unheld) {
        auto it = std::upper_bound(vmas.begin(), vmas.end(), u.begin,
                                   [](uintptr_t a, const Vma &v) { return a < v.end; });
        for (uintptr_t cur = u.begin; cur < u.end;) {
            bool mapped_here = it != vmas.end() && it->start <= cur;
            uintptr_t piece_end = !mapped_here ? (it == vmas.end() ? u.end : std::min(u.end, it->start))
                                               : std::min(u.end, it->end);
            // Unmapped or remapped by the program meanwhile: only the file space is ours to free.
            if (!mapped_here || !atHome(s, *it) ||
                moveToPrivate(s.fd, cur, piece_end - cur, it->prot, cur) == 0) {
                done.push_back({cur, piece_end, 0});
            }
            cur = piece_end;
            if (mapped_here && cur == it->end) {
                ++it;
            }
        }
    }
    for (const Piece &d : done) {
        eraseRange(s.runs, d.begin, d.end);
        punchUnheld(s, d.begin, d.end);
    }
    closeIfUnused(s);
}

size_t sharedPageCount() {
    StateHome &h = home();
    if (h.state == nullptr) {
        return 0;
    }
    std::lock_guard lock(h.state->mu);
    size_t pages = 0;
    for (const auto &[start, run] : h.state->runs) {
        pages += (run.end - start) / pageSize();
    }
    return pages;
}

}  // namespace ibvx::client::broker
