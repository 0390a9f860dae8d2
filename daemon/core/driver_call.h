// One call into a driver, as every core call makes it (broker.cpp creates and changes objects
// this way, broker_restart.cpp exports and imports them): the thread bound to the session, the
// device's driver lock when its driver needs one, and the driver's error convention read in one
// place. Internal to the core.
#pragma once

#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>

#include "common/status.h"
#include "daemon/core/device.h"
#include "daemon/core/mapping.h"

namespace ibvx::daemon {

// A driver's errno as a Status saying what failed (EIO when the driver said nothing).
inline Status fromDriver(int err, const std::string &what) {
    if (err == 0) {
        err = EIO;
    }
    return Status::fromErrno(err, what + ": " + std::strerror(err));
}

// Driver int calls return a negative errno (the reference's convention, and what the device's
// verbs table makes of libibverbs' answers); an old driver may still answer -1 with errno.
inline int driverErr(int rc) {
    if (rc < 0) {
        return rc == -1 && errno != 0 ? errno : -rc;
    }
    return rc;
}

// One driver call: binds the thread to the session, so the driver's alloc/db_mmap callbacks
// (MappingManager::ops()) reach the session's memory (a thread-local binding, invisible at the
// call sites), and holds the device's driver lock when the driver needs its calls serialised
// (device.h).
class DriverCall {
  public:
    DriverCall(SessionMemory &mem, Device *dev)
        : lock_(dev->driver_mu, std::defer_lock), binding_(&mem, dev->verbs.provider()) {
        if (dev->serialize_calls) {
            lock_.lock();
        }
    }

  private:
    std::unique_lock<std::mutex> lock_;
    ScopedBinding binding_;
};

// A driver call returning a pointer: NULL + errno (fallback when the driver left errno 0).
template <typename Fn>
auto createOnDriver(SessionMemory &mem, Device *dev, int fallback, const std::string &what, Fn fn)
    -> StatusOr<decltype(fn())> {
    DriverCall call(mem, dev);
    errno = 0;
    auto *made = fn();
    if (made == nullptr) {
        return fromDriver(errno != 0 ? errno : fallback, what);
    }
    return made;
}

// A driver call returning an int: 0, or the driver's error.
template <typename Fn>
Status callDriver(SessionMemory &mem, Device *dev, const std::string &what, Fn fn) {
    DriverCall call(mem, dev);
    int rc = fn();
    if (rc != 0) {
        return fromDriver(driverErr(rc), what);
    }
    return Status::ok();
}

}  // namespace ibvx::daemon
