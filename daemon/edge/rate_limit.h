// A per-second budget for log lines a client can cause, so a misbehaving tenant cannot flood
// the journal. Thread-safe (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>

namespace ibvx::daemon {

class RateLimiter {
  public:
    explicit RateLimiter(uint32_t per_second) : per_second_(per_second) {}
    // True when a line may be written now; *suppressed gets the count dropped since the last
    // allowed line (to be reported with it).
    bool allow(uint64_t *suppressed) {
        std::lock_guard lock(mu_);
        auto now = std::chrono::steady_clock::now();
        if (now - window_ >= std::chrono::seconds(1)) {
            window_ = now;
            used_ = 0;
        }
        if (used_ >= per_second_) {
            ++dropped_;
            return false;
        }
        ++used_;
        *suppressed = dropped_;
        dropped_ = 0;
        return true;
    }

  private:
    std::mutex mu_;
    const uint32_t per_second_;
    std::chrono::steady_clock::time_point window_{};
    uint32_t used_ = 0;
    uint64_t dropped_ = 0;
};

}  // namespace ibvx::daemon
