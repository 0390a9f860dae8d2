// Per-method call and error counters, error codes and latency histograms of a gRPC service
// (lock-free: relaxed atomics), and per-session call counts (one mutex). One table for Broker
// (RpcStats), one for Admin (AdminRpcStats).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "proto/broker_methods.h"

namespace ibvx::daemon {

// ibv_extend.v1.Broker methods in declaration order: the one method table (proto/broker_methods.h).
using Method = BrokerMethod;

const char *methodName(Method m);

// ibv_extend.v1.Admin methods in declaration order.
enum class AdminMethod {
    kGetStats,
    kGetStatus,
    kListDrivers,
    kListSessions,
    kListObjects,
    kEvictSession,
    kReloadDrivers,
    kWatch,
    kGetQuotas,
    kSetQuota,
    kRestart,
    kCount
};

const char *methodName(AdminMethod m);

// Latency buckets (upper bounds, microseconds) of the per-method histograms; one more bucket
// holds everything slower.
inline constexpr std::array<uint64_t, 16> kLatencyBoundsUs = {
    10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000};
inline constexpr size_t kGrpcCodes = 17;  // grpc::StatusCode OK .. UNAUTHENTICATED

// M: a method enum ending in kCount.
template <typename M>
class BasicRpcStats {
  public:
    using Method = M;

    void record(Method m, bool ok) { record(m, ok ? 0 : 2 /* UNKNOWN */, std::chrono::nanoseconds(0), 0); }
    // grpc_code: the reply's grpc::StatusCode; session_id 0 when the call had no session.
    void record(Method m, int grpc_code, std::chrono::nanoseconds took, uint64_t session_id) {
        auto i = static_cast<size_t>(m);
        calls_[i].fetch_add(1, std::memory_order_relaxed);
        bool ok = grpc_code == 0;
        if (!ok) {
            errors_[i].fetch_add(1, std::memory_order_relaxed);
        }
        if (grpc_code >= 0 && static_cast<size_t>(grpc_code) < kGrpcCodes) {
            codes_[i][static_cast<size_t>(grpc_code)].fetch_add(1, std::memory_order_relaxed);
        }
        auto us = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(took).count());
        size_t b = 0;
        while (b < kLatencyBoundsUs.size() && us > kLatencyBoundsUs[b]) {
            ++b;
        }
        buckets_[i][b].fetch_add(1, std::memory_order_relaxed);
        sum_us_[i].fetch_add(us, std::memory_order_relaxed);
        if (session_id != 0) {
            std::lock_guard lock(session_mu_);
            auto &c = by_session_[session_id];
            ++c.calls;
            c.errors += ok ? 0 : 1;
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
    uint64_t byCode(Method m, size_t code) const {
        return codes_[static_cast<size_t>(m)][code].load(std::memory_order_relaxed);
    }
    uint64_t bucket(Method m, size_t b) const {
        return buckets_[static_cast<size_t>(m)][b].load(std::memory_order_relaxed);
    }
    uint64_t sumUs(Method m) const { return sum_us_[static_cast<size_t>(m)].load(std::memory_order_relaxed); }

    struct SessionCalls {
        uint64_t calls = 0;
        uint64_t errors = 0;
    };
    SessionCalls ofSession(uint64_t session_id) {
        std::lock_guard lock(session_mu_);
        auto it = by_session_.find(session_id);
        return it == by_session_.end() ? SessionCalls{} : it->second;
    }
    void forgetSession(uint64_t session_id) {
        std::lock_guard lock(session_mu_);
        by_session_.erase(session_id);
    }

  private:
    static constexpr size_t kN = static_cast<size_t>(M::kCount);
    std::array<std::atomic<uint64_t>, kN> calls_{};
    std::array<std::atomic<uint64_t>, kN> errors_{};
    std::array<std::array<std::atomic<uint64_t>, kGrpcCodes>, kN> codes_{};
    std::array<std::array<std::atomic<uint64_t>, kLatencyBoundsUs.size() + 1>, kN> buckets_{};
    std::array<std::atomic<uint64_t>, kN> sum_us_{};
    std::mutex session_mu_;  // guards by_session_
    std::unordered_map<uint64_t, SessionCalls> by_session_;
};

using RpcStats = BasicRpcStats<Method>;
using AdminRpcStats = BasicRpcStats<AdminMethod>;

}  // namespace ibvx::daemon
