// Pod identity of sessions: which namespace, pod and container a tenant process belongs to, as
// the kubelet's PodResources API (v1 List) says for the device in the process's device marker
// (PeerIdentity::k8s_device, read from its mountinfo at connect time).
//
// The kubelet being slow or away never fails a tenant: the pod fields stay empty and one warning
// a minute says why. Threading: every member below mu_ is guarded by it; annotate() may be called
// from any gRPC thread.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/core/identity.h"

namespace ibvx::daemon {

class PodResolver {
  public:
    struct Pod {
        std::string namespace_name;
        std::string pod;
        std::string container;
        // The container (cgroup) that first presented this device after the refresh that listed
        // it: another container presenting it means the device moved on (its pod ended and the
        // kubelet gave it to a new one), so the entry is stale.
        std::string seen_container_id;
    };

    // socket: the kubelet's PodResources socket; resource: the device plugin's resource name.
    PodResolver(std::string socket, std::string resource);

    // Fills id's pod fields from the cache, asking the kubelet again on a miss (at most once per
    // kMinRefresh, and not for kRetryAfterFailure after a failed call).
    void annotate(PeerIdentity *id);

    static constexpr std::chrono::milliseconds kMinRefresh{100};
    static constexpr std::chrono::seconds kRetryAfterFailure{5};
    static constexpr std::chrono::milliseconds kCallDeadline{1000};

  private:
    bool refreshLocked();

    const std::string socket_;
    const std::string resource_;
    std::mutex mu_;
    std::map<std::string, Pod> by_device_;
    std::chrono::steady_clock::time_point last_refresh_{};
    std::chrono::steady_clock::time_point failed_at_{};
    bool failed_ = false;
    std::chrono::steady_clock::time_point warned_at_{};
    bool warned_ = false;
};

}  // namespace ibvx::daemon
