// Other threads' writes held off while shared_pages.cpp moves a range of pages onto (or off) the
// memfd (docs/verbs.md, "Other threads' writes during a move"). A move copies the bytes, then
// replaces the mapping; a write by another thread in between would land in the old pages and be
// lost. While a WriteHold lives, the range is write-protected with a userfaultfd that nobody
// reads: another thread's user-mode write to it waits in the kernel, and when the hold ends it
// is woken and retries against whatever is mapped there then (the new pages), so it lands.
//
// The userfaultfd is UFFD_USER_MODE_ONLY (tenants are unprivileged and hosts set
// vm.unprivileged_userfaultfd = 0): a write the kernel makes on the program's behalf (read(2)
// into the range, any system call that stores into user memory) does not wait but fails with
// EFAULT, as for an unmapped address, and changes nothing.
//
// Not thread-safe: every function is called with the shared-pages mutex held.
#pragma once

#include <signal.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ibvx::client::broker {

class WriteHold {
  public:
    // Holds other threads' writes to the page-aligned [addr, addr + len), when it can: not
    // without a userfaultfd (openWriteHolds), nor on memory userfaultfd refuses (private file
    // mappings such as an executable's .data, memory another userfaultfd watches). Unheld, a
    // move goes on as without holds. While held, the calling thread's signals are blocked (a
    // handler writing the range on this thread would wait for itself) and the caller must write
    // nothing in the range itself; it must not allocate either (another thread may wait holding
    // malloc's lock).
    WriteHold(uintptr_t addr, size_t len);
    // Lets the held writes go: they retry against the mapping now in place.
    ~WriteHold();
    WriteHold(const WriteHold &) = delete;
    WriteHold &operator=(const WriteHold &) = delete;

    bool held() const { return held_; }

  private:
    uintptr_t addr_;
    size_t len_;
    bool held_ = false;
    sigset_t old_mask_{};
};

// Opens the userfaultfd holds use, if it is not open. Without one (the kernel or a seccomp
// filter refuses userfaultfd, the kernel lacks the write-protect features of Linux 6.4, or
// IBV_EXTEND_SHARED_PAGES_WP=0), moves go unheld, as before holds existed, and the first time
// this says why on stderr under IBV_EXTEND_SHOW_WARNINGS.
void openWriteHolds();

// Closes the userfaultfd: nothing is moved any more, or in a fork() child, whose inherited
// descriptor is the parent's (its ioctls would act on the parent's memory).
void closeWriteHolds();

// "" when holds work in this process (after openWriteHolds()), else why not.
std::string writeHoldsUnavailable();

}  // namespace ibvx::client::broker
