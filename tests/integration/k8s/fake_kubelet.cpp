#include "fake_kubelet.h"

#include <unistd.h>

#include <chrono>

namespace ibvx::test {

namespace pb = ::v1beta1;

FakeKubelet::FakeKubelet(std::string dir) : dir_(std::move(dir)) {
    std::string sock = dir_ + "/kubelet.sock";
    ::unlink(sock.c_str());
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + sock, grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
}

FakeKubelet::~FakeKubelet() {
    stop();
}

void FakeKubelet::stop() {
    if (server_) {
        server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
        server_->Wait();
        server_.reset();
        ::unlink((dir_ + "/kubelet.sock").c_str());
    }
    std::vector<std::thread> threads;
    {
        std::lock_guard lock(mu_);
        for (auto &ctx : watches_) {
            ctx->TryCancel();
        }
        threads.swap(watchers_);
    }
    for (std::thread &t : threads) {
        t.join();
    }
}

void FakeKubelet::refuseNext(int n) {
    std::lock_guard lock(mu_);
    refuse_ = n;
}

grpc::Status FakeKubelet::Register(grpc::ServerContext *, const pb::RegisterRequest *req, pb::Empty *) {
    std::lock_guard lock(mu_);
    registrations_.push_back(*req);
    if (refuse_ > 0) {
        --refuse_;
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "registration refused by the test's kubelet");
    }
    endpoint_ = req->endpoint();
    auto ctx = std::make_shared<grpc::ClientContext>();
    watches_.push_back(ctx);
    watchers_.emplace_back(&FakeKubelet::watch, this, endpoint_, ctx);
    return grpc::Status::OK;
}

void FakeKubelet::watch(std::string endpoint, std::shared_ptr<grpc::ClientContext> ctx) {
    auto channel = grpc::CreateChannel("unix:" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials());
    auto stub = pb::DevicePlugin::NewStub(channel);
    pb::DevicePluginOptions options;
    {
        grpc::ClientContext octx;
        octx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        (void)stub->GetDevicePluginOptions(&octx, pb::Empty(), &options);
    }
    auto reader = stub->ListAndWatch(ctx.get(), pb::Empty());
    pb::ListAndWatchResponse resp;
    while (reader->Read(&resp)) {
        std::lock_guard lock(mu_);
        devices_.assign(resp.devices().begin(), resp.devices().end());
    }
    (void)reader->Finish();
}

std::vector<pb::RegisterRequest> FakeKubelet::registrations() const {
    std::lock_guard lock(mu_);
    return registrations_;
}

std::vector<pb::Device> FakeKubelet::devices() const {
    std::lock_guard lock(mu_);
    return devices_;
}

std::string FakeKubelet::healthOf(int n) const {
    std::lock_guard lock(mu_);
    if (static_cast<int>(devices_.size()) != n || n == 0) {
        return "";
    }
    for (const pb::Device &d : devices_) {
        if (d.health() != devices_[0].health()) {
            return "";
        }
    }
    return devices_[0].health();
}

grpc::Status FakeKubelet::allocate(const std::vector<std::vector<std::string>> &containers,
                                   pb::AllocateResponse *out) const {
    std::string endpoint;
    {
        std::lock_guard lock(mu_);
        endpoint = endpoint_;
    }
    auto channel = grpc::CreateChannel("unix:" + dir_ + "/" + endpoint, grpc::InsecureChannelCredentials());
    auto stub = pb::DevicePlugin::NewStub(channel);
    pb::AllocateRequest req;
    for (const auto &ids : containers) {
        auto *c = req.add_container_requests();
        for (const std::string &id : ids) {
            c->add_devices_ids(id);
        }
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->Allocate(&ctx, req, out);
}

}  // namespace ibvx::test
