// The Broker service's one method table: each method's name, request and response types and
// whether it mutates, as broker.proto says them (option idempotency_level), generated at build
// time (proto/gen_broker_methods.py -> broker_methods.inc). The daemon (its Method enum, names,
// stored-reply keys, arena allocators, statistics), the client (which calls carry an idempotency
// key) and the tests read it; nothing else lists the methods. docs/architecture.md, "Adding a
// broker method", says what a new method touches.
//
// Header-only and free of the generated message classes, so the daemon (full protobuf) and the
// client (its lite copy) share it.
#pragma once

#include <cstddef>
#include <iterator>
#include <string_view>

#include "ibv_extend/v1/broker_methods.inc"

namespace ibvx {

// The methods in declaration order: Method::kHello == 0 is method(0) of the service descriptor.
enum class BrokerMethod {
#define IBVX_BROKER_METHOD_ENUM(name, request, response, mutating) k##name,
    IBVX_BROKER_METHODS(IBVX_BROKER_METHOD_ENUM)
#undef IBVX_BROKER_METHOD_ENUM
        kCount
};

struct BrokerMethodInfo {
    std::string_view name;     // as in broker.proto ("CreateQp")
    std::string_view request;  // its request message ("CreateQpRequest")
    bool mutating;             // changes the broker's state: carries an idempotency key
};

inline constexpr BrokerMethodInfo kBrokerMethods[] = {
#define IBVX_BROKER_METHOD_INFO(name, request, response, mutating) {#name, #request, mutating},
    IBVX_BROKER_METHODS(IBVX_BROKER_METHOD_INFO)
#undef IBVX_BROKER_METHOD_INFO
};
static_assert(std::size(kBrokerMethods) == static_cast<size_t>(BrokerMethod::kCount));

constexpr const BrokerMethodInfo &brokerMethod(BrokerMethod m) {
    return kBrokerMethods[static_cast<size_t>(m)];
}

}  // namespace ibvx

// The request classes, declared (their definitions are the daemon's full or the client's lite
// broker.pb.h).
namespace ibv_extend::v1 {
#define IBVX_BROKER_REQUEST_DECLARE(request, mutating) class request;
IBVX_BROKER_REQUESTS(IBVX_BROKER_REQUEST_DECLARE)
#undef IBVX_BROKER_REQUEST_DECLARE
}  // namespace ibv_extend::v1

namespace ibvx {

// Whether a call with this request changes the broker's state, so that it carries an idempotency
// key (the generator checks that every method of one request type agrees):
// kMutatingRequest<pb::CreateQpRequest>. A type no method takes does not compile.
template <typename Request>
struct BrokerRequest;
#define IBVX_BROKER_REQUEST_TRAIT(request, is_mutating) \
    template <>                                         \
    struct BrokerRequest<ibv_extend::v1::request> {     \
        static constexpr bool mutating = is_mutating;   \
    };
IBVX_BROKER_REQUESTS(IBVX_BROKER_REQUEST_TRAIT)
#undef IBVX_BROKER_REQUEST_TRAIT

template <typename Request>
inline constexpr bool kMutatingRequest = BrokerRequest<Request>::mutating;

}  // namespace ibvx
