// Waking a consumer through an eventfd that someone else holds too: a tenant's completion
// channel or async-event fd, which a device's engine writes to. Header of event_signal.cpp.
#pragma once

namespace ibvx {

// Adds 1 to the eventfd fd without ever blocking for long: a tenant that set the counter to its
// maximum (0xfffffffffffffffe) would otherwise block the write (eventfd(2)), and O_NONBLOCK is
// no defence, since it lives in the file description the tenant shares and can clear. So the
// write is made only when poll() says it cannot block (a full counter already wakes the
// consumer), and a per-thread timer signal interrupts it should the tenant refill the counter
// in between. False when nothing was added (full, refilled, or fd < 0).
bool signalEventFd(int fd);

// What signalEventFd interrupts a blocked write with (a real-time signal whose handler does
// nothing, installed without SA_RESTART unless the program already handles it), and how long
// it lets one write wait.
int eventSignalInterrupt();
inline constexpr long kEventWriteBoundNs = 20'000'000;

}  // namespace ibvx
