#include "tools/ibv-extend-device-plugin/broker_health.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <vector>

namespace ibvx::device_plugin {
namespace {

// HealthCheckResponse { ServingStatus status = 1; }: the first field-1 varint, 0 (UNKNOWN) when
// absent as proto3 encodes a default. Only this one message is read, so a hand decoder spares
// the plugin a copy of health.proto.
int servingStatus(const std::string &bytes) {
    size_t i = 0;
    while (i < bytes.size()) {
        uint64_t key = 0;
        int shift = 0;
        while (i < bytes.size() && shift < 64) {
            auto b = static_cast<uint8_t>(bytes[i++]);
            key |= static_cast<uint64_t>(b & 0x7f) << shift;
            shift += 7;
            if ((b & 0x80) == 0) {
                break;
            }
        }
        if ((key & 7) != 0) {
            return -1;  // only varint fields are expected in this message
        }
        uint64_t value = 0;
        shift = 0;
        while (i < bytes.size() && shift < 64) {
            auto b = static_cast<uint8_t>(bytes[i++]);
            value |= static_cast<uint64_t>(b & 0x7f) << shift;
            shift += 7;
            if ((b & 0x80) == 0) {
                break;
            }
        }
        if ((key >> 3) == 1) {
            return static_cast<int>(value);
        }
    }
    return 0;
}

}  // namespace

const char *healthName(BrokerHealth h) {
    switch (h) {
        case BrokerHealth::kServing:
            return "SERVING";
        case BrokerHealth::kNotServing:
            return "NOT_SERVING";
        case BrokerHealth::kUnreachable:
            return "unreachable";
    }
    return "?";
}

BrokerHealth checkBroker(const std::string &socket, std::chrono::milliseconds timeout) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
    auto channel = grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args);
    grpc::GenericStub stub(channel);
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::Slice req_slice(std::string("\x0a\x00", 2));  // HealthCheckRequest { service: "" }
    grpc::ByteBuffer req(&req_slice, 1);
    auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", req, &cq);
    call->StartCall();
    grpc::ByteBuffer resp;
    grpc::Status st;
    call->Finish(&resp, &st, reinterpret_cast<void *>(1));
    void *tag = nullptr;
    bool ok = false;
    bool got = cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (!got || !st.ok()) {
        // The health service answers NOT_FOUND for an unknown service and the status for ""; any
        // failure here means no broker answers.
        return BrokerHealth::kUnreachable;
    }
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (resp.Dump(&slices).ok()) {
        for (const grpc::Slice &s : slices) {
            bytes.append(reinterpret_cast<const char *>(s.begin()), s.size());
        }
    }
    return servingStatus(bytes) == 1 ? BrokerHealth::kServing : BrokerHealth::kNotServing;
}

}  // namespace ibvx::device_plugin
