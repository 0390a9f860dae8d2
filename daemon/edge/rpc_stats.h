// Per-method call and error counters of the Broker service (lock-free: relaxed atomics).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ibvx::daemon {

// ibv_extend.v1.Broker methods in declaration order.
enum class Method {
    kHello,
    kListDevices,
    kOpenContext,
    kCloseContext,
    kQueryDevice,
    kAllocPd,
    kDeallocPd,
    kRegMr,
    kDeregMr,
    kCreateCq,
    kDestroyCq,
    kCreateQp,
    kDestroyQp,
    kCreateSrq,
    kDestroySrq,
    kModifyQp,
    kQueryQp,
    kModifyQpExtend,
    kQueryQpExtend,
    kQueryQpSupportedHyroceFeature,
    kNegoQpHyroceFeature,
    kCount
};

const char *methodName(Method m);

class RpcStats {
  public:
    void record(Method m, bool ok) {
        auto i = static_cast<size_t>(m);
        calls_[i].fetch_add(1, std::memory_order_relaxed);
        if (!ok) {
            errors_[i].fetch_add(1, std::memory_order_relaxed);
        }
    }
    uint64_t calls(Method m) const { return calls_[static_cast<size_t>(m)].load(std::memory_order_relaxed); }
    uint64_t errors(Method m) const {
        return errors_[static_cast<size_t>(m)].load(std::memory_order_relaxed);
    }
    uint64_t total() const {
        uint64_t t = 0;
        for (auto &c : calls_) {
            t += c.load(std::memory_order_relaxed);
        }
        return t;
    }

  private:
    static constexpr size_t kN = static_cast<size_t>(Method::kCount);
    std::array<std::atomic<uint64_t>, kN> calls_{};
    std::array<std::atomic<uint64_t>, kN> errors_{};
};

}  // namespace ibvx::daemon
