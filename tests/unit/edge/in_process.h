// What the in-process edge tests share: the real core over softnda, and a connection to an
// in-process gRPC server over a socketpair, its server end registered as the broker would.
#pragma once

#include <grpcpp/create_channel_posix.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <memory>

#include "daemon/core/broker.h"
#include "daemon/edge/connections.h"
#include "providers/softnda/include/softnda_ops.h"

namespace ibvx::daemon {

// A Broker over softnda's devices; its regions go nowhere (no fd channel in these tests).
class InProcessCore {
  public:
    explicit InProcessCore(Broker::Options options = {}) {
        verbs_register_driver_extend(&softnda_driver_ops);
        verbs_register_vdev_extend(&softnda_vdev_ops);
        devices_.scan();
        broker_ = std::make_unique<Broker>(options, &devices_);
        broker_->setRegionSender([](Session &, std::vector<RegionToSend> &) { return Status::ok(); });
    }
    Broker &broker() { return *broker_; }

  private:
    DeviceRegistry devices_;
    std::unique_ptr<Broker> broker_;
};

// A client channel to server; the server end's kernel identity goes into connections (and *peer).
inline std::shared_ptr<grpc::Channel> connectInProcess(grpc::Server &server, ConnectionRegistry &connections,
                                                       PeerIdentity *peer = nullptr) {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    auto id = peerIdentity(sv[0]);
    EXPECT_TRUE(id.isOk());
    if (peer != nullptr) {
        *peer = *id;
    }
    connections.set(sv[0], *id);
    grpc::AddInsecureChannelFromFd(&server, sv[0]);
    return grpc::CreateInsecureChannelFromFd("in-process", sv[1]);
}

}  // namespace ibvx::daemon
