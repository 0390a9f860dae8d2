// The argument rules of a queue create, shared by the broker (Broker::createCq/createQp/createSrq)
// and libibv_extend.so's direct mode (ibv_create_*_extend on a context whose device limits it
// knows), so the in-process baseline refuses what the broker refuses. Each check answers nullopt
// when the value is acceptable, else a message naming the field and the limit; both callers
// report it as an invalid argument (EINVAL).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include <ibv_extend.h>

namespace ibvx::loader {

using RuleError = std::optional<std::string>;

// The device limits the checks need; 0 means "not announced" and is not enforced.
struct QueueLimits {
    uint32_t max_qp_wr = 0;
    uint32_t max_cqe = 0;
    uint32_t max_srq_wr = 0;
    uint32_t max_sge = 0;
    uint32_t max_inline_data = 0;
};

// Any create: a buffer DMA mode this version knows. Takes the raw value: a C caller may store any
// int in the enum field, which C++ must not load as the enum (rawEnumValue()).
RuleError checkDmaMode(int mode);

// A C enum field as the integer the caller stored in it.
template <typename E>
int rawEnumValue(const E &field) {
    static_assert(sizeof(E) == sizeof(int));
    int v;
    std::memcpy(&v, &field, sizeof(v));
    return v;
}
// Checks of the request alone (before anything is looked up).
RuleError checkCqRequest(uint32_t cqe);
RuleError checkQpType(ibv_qp_type type);
RuleError checkSrqRequest(uint32_t max_wr);
// Checks against the device's limits.
RuleError checkCqLimits(uint32_t cqe, const QueueLimits &limits);
RuleError checkQpLimits(const ibv_qp_cap &cap, const QueueLimits &limits);
RuleError checkSrqLimits(uint32_t max_wr, uint32_t max_sge, const QueueLimits &limits);

// What the membership rule says: everything a queue uses belongs to the queue's context.
inline constexpr char kQpMembership[] = "the PD, CQs and SRQ must belong to the QP's context";
inline constexpr char kSrqMembership[] = "the PD must belong to the SRQ's context";

}  // namespace ibvx::loader

namespace ibvx::loader {

// Direct mode: the limits of dev when it is a virtual device (its provider announces them in
// query_devices), learned on the first call for dev and cached; nullptr when unknown (an
// rdma-core device: its ibv_context is the application's, and asking it is not ours to do).
const QueueLimits *knownQueueLimits(const ibv_device *dev);

}  // namespace ibvx::loader
