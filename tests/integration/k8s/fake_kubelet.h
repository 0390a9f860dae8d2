// The kubelet's side of the device-plugin API, played by the test: a Registration server on
// <dir>/kubelet.sock that, on each Register, dials the plugin's endpoint and follows its
// ListAndWatch stream (as the kubelet's device manager does), and an Allocate caller.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"

namespace ibvx::test {

class FakeKubelet final : public ::v1beta1::Registration::Service {
  public:
    explicit FakeKubelet(std::string dir);
    ~FakeKubelet() override;
    FakeKubelet(const FakeKubelet &) = delete;
    FakeKubelet &operator=(const FakeKubelet &) = delete;

    bool started() const { return server_ != nullptr; }
    // Stops serving and removes kubelet.sock, as a kubelet that goes away.
    void stop();
    // The next n Register calls answer INVALID_ARGUMENT.
    void refuseNext(int n);

    std::vector<::v1beta1::RegisterRequest> registrations() const;
    // The last device list the plugin sent (empty before the first).
    std::vector<::v1beta1::Device> devices() const;
    // "Healthy" or "Unhealthy" when n devices were listed and all say so, else "".
    std::string healthOf(int n) const;

    grpc::Status allocate(const std::vector<std::vector<std::string>> &containers,
                          ::v1beta1::AllocateResponse *out) const;

    grpc::Status Register(grpc::ServerContext *ctx, const ::v1beta1::RegisterRequest *req,
                          ::v1beta1::Empty *out) override;

  private:
    void watch(std::string endpoint, std::shared_ptr<grpc::ClientContext> ctx);

    std::string dir_;
    std::unique_ptr<grpc::Server> server_;
    // mu_ guards everything below it.
    mutable std::mutex mu_;
    int refuse_ = 0;
    std::vector<::v1beta1::RegisterRequest> registrations_;
    std::vector<::v1beta1::Device> devices_;
    std::string endpoint_;  // of the last accepted registration
    std::vector<std::shared_ptr<grpc::ClientContext>> watches_;
    std::vector<std::thread> watchers_;
};

}  // namespace ibvx::test
