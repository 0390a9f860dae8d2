// A minimal tenant for the integration tests: the generated Broker/Admin stubs over a unix:
// channel, plus a raw fd channel (common/fd_channel.h) whose regions it maps like the client
// library does.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "ibv_extend/v1/admin.grpc.pb.h"
#include "ibv_extend/v1/broker.grpc.pb.h"

namespace ibvx::test {

namespace pb = ::ibv_extend::v1;

struct MappedRegion {
    void *base = nullptr;
    size_t size = 0;
};

class TestClient {
  public:
    explicit TestClient(const std::string &socket_path);
    ~TestClient();

    // Hello (fills token) then the fd channel attach. Returns the attach status (0 or -errno).
    grpc::Status hello(pb::HelloResponse *resp = nullptr);
    int attach();
    // Hello + attach; false on any failure.
    bool connect();

    template <typename Req, typename Resp>
    grpc::Status call(grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                      const Req &req, Resp *resp) {
        grpc::ClientContext ctx;
        ctx.AddMetadata("ibvx-session", token_hex_);
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        return ((*stub_).*method)(&ctx, req, resp);
    }

    // Reads every region frame already waiting on the fd channel (no waiting) and maps it.
    // Returns how many arrived, or -errno on a broken channel.
    int drainRegions();
    // Local address of a RegionRef (nullptr when the region was never received).
    void *address(const pb::RegionRef &ref) const;
    void unmap(uint64_t region);
    size_t mappedRegions() const { return regions_.size(); }

    // Sends an fd for RegMr.
    int sendFd(uint64_t xfer_id, int fd);

    pb::Broker::Stub &stub() { return *stub_; }
    std::shared_ptr<grpc::Channel> channel() { return channel_; }
    const std::string &tokenHex() const { return token_hex_; }
    const SessionToken &token() const { return token_; }
    int channelFd() const { return fdch_.get(); }
    void closeChannel() { fdch_.reset(); }

  private:
    std::string socket_path_;
    std::shared_ptr<grpc::Channel> channel_;
    std::unique_ptr<pb::Broker::Stub> stub_;
    SessionToken token_{};
    std::string token_hex_;
    UniqueFd fdch_;
    std::map<uint64_t, MappedRegion> regions_;
};

// A raw Unix-socket connection to path (-1 on failure).
UniqueFd connectUnix(const std::string &path);

// Admin.GetStats over its own channel.
grpc::Status getStats(const std::string &socket_path, pb::GetStatsResponse *out);

// errno from a failed status's ErrorDetail (0 when absent).
int errnoOf(const grpc::Status &status);

}  // namespace ibvx::test
