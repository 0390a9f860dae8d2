// The one definition of OpenContextResponse.driver_ops_present: bit i says that entry i of a
// driver's ibv_context_extend_ops (in the header's order, from create_qp) is set. The broker
// computes the bits from the driver's table; the client's forwarding table sets exactly the
// entries whose bit is set, so a call the driver lacks answers EOPNOTSUPP on the client side
// without a round trip. Both sides include this header, so they cannot disagree.
#pragma once

#include <cstdint>

#include <ibv_extend.h>

namespace ibvx {

enum class DriverOp : uint32_t {
    kCreateQp = 0,
    kCreateCq,
    kCreateSrq,
    kDestroyQp,
    kDestroyCq,
    kDestroySrq,
    kQueryDevice,
    kModifyQp,
    kQueryQp,
    kQueryHyroceFeature,
    kNegoHyroceFeature,
    kCount,
};

constexpr uint32_t driverOpBit(DriverOp op) {
    return 1u << static_cast<uint32_t>(op);
}

constexpr bool hasDriverOp(uint32_t present, DriverOp op) {
    return (present & driverOpBit(op)) != 0;
}

// The bits of the entries ops sets; 0 for a NULL table.
inline uint32_t driverOpsPresent(const ibv_context_extend_ops *ops) {
    if (ops == nullptr) {
        return 0;
    }
    const void *entries[] = {
        reinterpret_cast<const void *>(ops->create_qp),
        reinterpret_cast<const void *>(ops->create_cq),
        reinterpret_cast<const void *>(ops->create_srq),
        reinterpret_cast<const void *>(ops->destroy_qp),
        reinterpret_cast<const void *>(ops->destroy_cq),
        reinterpret_cast<const void *>(ops->destroy_srq),
        reinterpret_cast<const void *>(ops->query_device),
        reinterpret_cast<const void *>(ops->modify_qp),
        reinterpret_cast<const void *>(ops->query_qp),
        reinterpret_cast<const void *>(ops->query_qp_supported_hyroce_feature),
        reinterpret_cast<const void *>(ops->nego_qp_hyroce_feature),
    };
    static_assert(sizeof(entries) / sizeof(entries[0]) == static_cast<size_t>(DriverOp::kCount),
                  "one bit per entry of ibv_context_extend_ops");
    uint32_t bits = 0;
    for (uint32_t i = 0; i < static_cast<uint32_t>(DriverOp::kCount); ++i) {
        if (entries[i] != nullptr) {
            bits |= 1u << i;
        }
    }
    return bits;
}

}  // namespace ibvx
