// The broker's health as its gRPC health service (grpc.health.v1.Health/Check, service "") says.
#pragma once

#include <chrono>
#include <string>

namespace ibvx::device_plugin {

enum class BrokerHealth { kServing, kNotServing, kUnreachable };
const char *healthName(BrokerHealth h);

// One Check on a fresh connection to the broker's socket, bounded by timeout. A fresh connection
// each time: a long-lived channel would wait out gRPC's reconnect backoff (up to minutes) before
// it noticed a broker that came back.
BrokerHealth checkBroker(const std::string &socket, std::chrono::milliseconds timeout);

}  // namespace ibvx::device_plugin
