#include "test_client.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/unix_socket.h"

namespace ibvx::test {

UniqueFd connectUnix(const std::string &path) {
    auto fd = ibvx::connectUnix(path);
    return fd.isOk() ? std::move(fd).value() : UniqueFd();
}

TestClient::TestClient(const std::string &socket_path) : socket_path_(socket_path) {
    grpc::ChannelArguments args;
    // A fresh connection per client: the broker binds credentials to connections.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channel_ = grpc::CreateCustomChannel("unix:" + socket_path, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::Broker::NewStub(channel_);
}

TestClient::~TestClient() {
    for (auto &[id, r] : regions_) {
        ::munmap(r.base, r.size);
    }
}

grpc::Status TestClient::hello(pb::HelloResponse *out) {
    pb::HelloRequest req;
    req.mutable_client_version()->set_major(4);
    req.mutable_client_version()->set_minor(2);
    req.set_client_name("integration-test");
    pb::HelloResponse resp;
    grpc::Status st = call(&pb::Broker::Stub::Hello, req, &resp);
    if (st.ok() && resp.session_token().size() == token_.size()) {
        std::memcpy(token_.data(), resp.session_token().data(), token_.size());
        token_hex_ = tokenToHex(token_);
    }
    if (out != nullptr) {
        *out = resp;
    }
    return st;
}

int TestClient::attach() {
    fdch_ = connectUnix(socket_path_);
    if (!fdch_) {
        return -errno;
    }
    return attachClient(fdch_.get(), token_, 5000);
}

bool TestClient::connect() {
    return hello().ok() && attach() == 0;
}

int TestClient::drainRegions() {
    int n = 0;
    for (;;) {
        Frame f;
        int r = recvFrame(fdch_.get(), &f, 0);
        if (r == -ETIMEDOUT) {
            return n;
        }
        if (r <= 0) {
            return r == 0 ? -ECONNRESET : r;
        }
        if (f.type != FrameType::kRegionAdd || !f.fd || f.payload.size() != sizeof(RegionPayload)) {
            return -EPROTO;
        }
        RegionPayload p;
        std::memcpy(&p, f.payload.data(), sizeof(p));
        void *base = ::mmap(nullptr, p.size, PROT_READ | PROT_WRITE, MAP_SHARED, f.fd.get(), 0);
        if (base == MAP_FAILED) {
            return -errno;
        }
        regions_[f.id] = {base, p.size};
        ++n;
    }
}

void *TestClient::address(const pb::RegionRef &ref) const {
    auto it = regions_.find(ref.region());
    if (it == regions_.end() || ref.offset() + ref.length() > it->second.size) {
        return nullptr;
    }
    return static_cast<uint8_t *>(it->second.base) + ref.offset();
}

void TestClient::unmap(uint64_t region) {
    auto it = regions_.find(region);
    if (it != regions_.end()) {
        ::munmap(it->second.base, it->second.size);
        regions_.erase(it);
    }
}

int TestClient::sendFd(uint64_t xfer_id, int fd) {
    return sendFrame(fdch_.get(), FrameType::kFdTransfer, xfer_id, nullptr, 0, fd, 5000);
}

grpc::Status getStats(const std::string &socket_path, pb::GetStatsResponse *out) {
    auto channel = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
    auto stub = pb::Admin::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->GetStats(&ctx, pb::GetStatsRequest(), out);
}

int errnoOf(const grpc::Status &status) {
    pb::ErrorDetail d;
    if (status.error_details().empty() || !d.ParseFromString(status.error_details())) {
        return 0;
    }
    return d.errno_value();
}

}  // namespace ibvx::test
