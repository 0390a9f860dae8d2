#include "client/broker/write_hold.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>

#include "common/warn.h"

// Linux 6.4's feature; Debian 12's headers (6.1) do not name it yet.
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif

namespace ibvx::client::broker {
namespace {

// Write protection of anonymous memory (the heap, the moves onto the memfd), of shmem (the
// memfd, the moves back), and of pages not populated yet: without the last, a write to a page
// never touched would take a missing-page fault that write protection does not see, and land in
// the old mapping.
constexpr uint64_t kFeatures =
    UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_WP_HUGETLBFS_SHMEM | UFFD_FEATURE_WP_UNPOPULATED;

// The kernel's sigset_t (rt_sigprocmask's last argument), not glibc's larger one.
constexpr size_t kKernelSigsetBytes = 8;

struct Holds {
    int fd = -1;
    std::string unavailable = "not opened yet";
    bool turned_off = false;  // IBV_EXTEND_SHARED_PAGES_WP=0: asked for, so no warning
    bool warned = false;
};

Holds &holds() {
    static Holds h;
    return h;
}

// Raw system calls: nothing between the program and the kernel (a sanitizer's or a hooking
// library's interceptor) may run code, allocate or take a lock while writes are held.
long uffdIoctl(unsigned long request, void *arg) {
    return ::syscall(SYS_ioctl, holds().fd, request, arg);
}

void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vwarn("", fmt, ap);
    va_end(ap);
}

// The userfaultfd, or -1 with h.unavailable set.
int openUffd(Holds &h) {
    const char *knob = secure_getenv("IBV_EXTEND_SHARED_PAGES_WP");
    h.turned_off = knob != nullptr && std::strcmp(knob, "0") == 0;
    if (h.turned_off) {
        h.unavailable = "IBV_EXTEND_SHARED_PAGES_WP=0";
        return -1;
    }
    int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
    if (fd < 0) {
        h.unavailable = std::string("userfaultfd(UFFD_USER_MODE_ONLY) failed: ") + std::strerror(errno);
        return -1;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = kFeatures;
    if (::ioctl(fd, UFFDIO_API, &api) != 0) {
        h.unavailable = errno == EINVAL ? "the kernel lacks userfaultfd write protection of shared and "
                                          "unpopulated memory (Linux 6.4)"
                                        : std::string("UFFDIO_API failed: ") + std::strerror(errno);
        ::close(fd);
        return -1;
    }
    return fd;
}

}  // namespace

void openWriteHolds() {
    Holds &h = holds();
    if (h.fd >= 0) {
        return;
    }
    h.fd = openUffd(h);
    if (h.fd >= 0) {
        h.unavailable.clear();
    } else if (!h.warned && !h.turned_off) {
        h.warned = true;
        warn(
            "registration moves pages without holding other threads' writes (%s): another thread's "
            "write to a page during its move can be lost",
            h.unavailable.c_str());
    }
}

void closeWriteHolds() {
    Holds &h = holds();
    if (h.fd >= 0) {
        ::close(h.fd);
        h.fd = -1;
        h.unavailable = "not opened yet";
    }
}

std::string writeHoldsUnavailable() {
    return holds().unavailable;
}

WriteHold::WriteHold(uintptr_t addr, size_t len) : addr_(addr), len_(len) {
    if (len == 0 || holds().fd < 0) {
        return;
    }
    uffdio_register reg{};
    reg.range.start = addr;
    reg.range.len = len;
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (uffdIoctl(UFFDIO_REGISTER, &reg) != 0) {
        return;  // memory userfaultfd refuses: the move goes unheld
    }
    uffdio_range range{addr, len};
    if ((reg.ioctls & (1ull << _UFFDIO_WRITEPROTECT)) == 0) {
        uffdIoctl(UFFDIO_UNREGISTER, &range);
        return;
    }
    sigset_t all;
    sigfillset(&all);
    ::syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &old_mask_, kKernelSigsetBytes);
    uffdio_writeprotect wp{};
    wp.range = range;
    wp.mode = UFFDIO_WRITEPROTECT_MODE_WP;
    if (uffdIoctl(UFFDIO_WRITEPROTECT, &wp) != 0) {
        uffdIoctl(UFFDIO_UNREGISTER, &range);
        ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old_mask_, nullptr, kKernelSigsetBytes);
        return;
    }
    held_ = true;
}

WriteHold::~WriteHold() {
    if (!held_) {
        return;
    }
    uffdio_range range{addr_, len_};
    // A replaced mapping took its registration with it; what is left (the old pages, when the
    // move failed) is unregistered, which also lifts its write protection. The waiting writers
    // are not woken by either: they wait on the userfaultfd until this wake, then retry their
    // fault against the mapping in place now.
    uffdIoctl(UFFDIO_UNREGISTER, &range);
    uffdIoctl(UFFDIO_WAKE, &range);
    ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old_mask_, nullptr, kKernelSigsetBytes);
}

}  // namespace ibvx::client::broker
