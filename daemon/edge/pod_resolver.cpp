#include "daemon/edge/pod_resolver.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "k8s/podresources/v1/api.grpc.pb.h"

namespace ibvx::daemon {

PodResolver::PodResolver(std::string socket, std::string resource)
    : socket_(std::move(socket)), resource_(std::move(resource)) {}

void PodResolver::annotate(PeerIdentity *id) {
    if (id->k8s_device.empty()) {
        return;  // not a container the device plugin equipped
    }
    std::lock_guard lock(mu_);
    auto it = by_device_.find(id->k8s_device);
    bool stale = it != by_device_.end() && !it->second.seen_container_id.empty() &&
                 it->second.seen_container_id != id->container_id;
    if ((it == by_device_.end() || stale) && refreshLocked()) {
        it = by_device_.find(id->k8s_device);
    } else if (stale) {
        return;  // not asked again yet: better no name than a neighbour's
    }
    if (it == by_device_.end()) {
        return;
    }
    if (it->second.seen_container_id.empty()) {
        it->second.seen_container_id = id->container_id;
    }
    id->pod_namespace = it->second.namespace_name;
    id->pod_name = it->second.pod;
    id->pod_container = it->second.container;
}

bool PodResolver::refreshLocked() {
    auto now = std::chrono::steady_clock::now();
    if (now - last_refresh_ < kMinRefresh || (failed_ && now - failed_at_ < kRetryAfterFailure)) {
        return false;
    }
    last_refresh_ = now;
    auto channel = grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials());
    auto stub = ::v1::PodResourcesLister::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    ::v1::ListPodResourcesResponse resp;
    grpc::Status st = stub->List(&ctx, ::v1::ListPodResourcesRequest(), &resp);
    if (!st.ok()) {
        failed_ = true;
        failed_at_ = now;
        if (!warned_ || now - warned_at_ >= std::chrono::minutes(1)) {
            warned_ = true;
            warned_at_ = now;
            spdlog::warn(
                "cannot ask the kubelet at {} which pod a session belongs to: {}; pod names stay "
                "empty (this warning repeats at most once a minute)",
                socket_, st.error_message());
        }
        return false;
    }
    failed_ = false;
    std::map<std::string, Pod> fresh;
    for (const ::v1::PodResources &p : resp.pod_resources()) {
        for (const ::v1::ContainerResources &c : p.containers()) {
            for (const ::v1::ContainerDevices &d : c.devices()) {
                if (d.resource_name() != resource_) {
                    continue;
                }
                for (const std::string &dev : d.device_ids()) {
                    fresh[dev] = Pod{p.namespace_(), p.name(), c.name(), ""};
                }
            }
        }
    }
    by_device_ = std::move(fresh);
    return true;
}

}  // namespace ibvx::daemon
