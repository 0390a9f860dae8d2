#include "common/event_signal.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <mutex>

namespace ibvx {
namespace {

void interrupted(int) {}

// Whether the interrupting signal has a handler that lets a blocked write return EINTR: ours, or
// none we could install because the program handles it itself (then a write may wait; the poll()
// check still keeps that to the tenant's race).
bool installHandler() {
    static bool ours = false;
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction old {};
        if (::sigaction(eventSignalInterrupt(), nullptr, &old) < 0 || old.sa_handler != SIG_DFL) {
            return;
        }
        struct sigaction sa {};
        sa.sa_handler = interrupted;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = 0;  // no SA_RESTART: the write must come back with EINTR
        ours = ::sigaction(eventSignalInterrupt(), &sa, nullptr) == 0;
    });
    return ours;
}

// A one-shot timer aimed at the thread that made it alone (a process-wide signal could land on
// any thread), deleted with the thread: engine threads come and go with their devices.
class ThreadTimer {
  public:
    ThreadTimer() {
        if (!installHandler()) {
            return;
        }
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, eventSignalInterrupt());
        ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
        sigevent ev{};
        ev.sigev_notify = SIGEV_THREAD_ID;
        ev.sigev_signo = eventSignalInterrupt();
        ev._sigev_un._tid = static_cast<pid_t>(::syscall(SYS_gettid));
        made_ = ::timer_create(CLOCK_MONOTONIC, &ev, &timer_) == 0;
    }
    ~ThreadTimer() {
        if (made_) {
            ::timer_delete(timer_);
        }
    }
    ThreadTimer(const ThreadTimer &) = delete;
    ThreadTimer &operator=(const ThreadTimer &) = delete;
    timer_t *get() { return made_ ? &timer_ : nullptr; }

  private:
    timer_t timer_{};
    bool made_ = false;
};

// This thread's timer, made on first use. Null when it cannot be made.
timer_t *threadTimer() {
    thread_local ThreadTimer timer;
    return timer.get();
}

void arm(timer_t *t, long ns) {
    itimerspec spec{};
    spec.it_value.tv_sec = ns / 1'000'000'000;
    spec.it_value.tv_nsec = ns % 1'000'000'000;
    ::timer_settime(*t, 0, &spec, nullptr);
}

}  // namespace

int eventSignalInterrupt() {
    return SIGRTMIN + 3;
}

bool signalEventFd(int fd) {
    if (fd < 0) {
        return false;
    }
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, 0) != 1 || (p.revents & POLLOUT) == 0) {
        return false;  // the counter is at its maximum: the consumer is woken anyway
    }
    timer_t *timer = threadTimer();
    if (timer != nullptr) {
        arm(timer, kEventWriteBoundNs);
    }
    const uint64_t one = 1;
    const bool added = ::write(fd, &one, sizeof(one)) == static_cast<ssize_t>(sizeof(one));
    if (timer != nullptr) {
        arm(timer, 0);  // disarms; a signal already sent is taken by the empty handler
    }
    return added;
}

}  // namespace ibvx
