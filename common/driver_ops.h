// The one definition of OpenContextResponse.driver_ops_present: bit i says that entry i of a
// driver's ibv_context_extend_ops (in the header's order, from create_qp) is set. The broker
// computes the bits from the driver's table; the client's forwarding table sets exactly the
// entries whose bit is set, so a call the driver lacks answers EOPNOTSUPP on the client side
// without a round trip. Both sides include this header, so they cannot disagree.
#pragma once

#include <cstddef>
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

// Entry op of ops, as an untyped pointer (nullptr when the driver does not set it).
inline const void *driverOpEntry(const ibv_context_extend_ops &ops, DriverOp op) {
    const void *entries[] = {
        reinterpret_cast<const void *>(ops.create_qp),
        reinterpret_cast<const void *>(ops.create_cq),
        reinterpret_cast<const void *>(ops.create_srq),
        reinterpret_cast<const void *>(ops.destroy_qp),
        reinterpret_cast<const void *>(ops.destroy_cq),
        reinterpret_cast<const void *>(ops.destroy_srq),
        reinterpret_cast<const void *>(ops.query_device),
        reinterpret_cast<const void *>(ops.modify_qp),
        reinterpret_cast<const void *>(ops.query_qp),
        reinterpret_cast<const void *>(ops.query_qp_supported_hyroce_feature),
        reinterpret_cast<const void *>(ops.nego_qp_hyroce_feature),
    };
    static_assert(sizeof(entries) / sizeof(entries[0]) == static_cast<size_t>(DriverOp::kCount),
                  "one bit per entry of ibv_context_extend_ops");
    return entries[static_cast<uint32_t>(op)];
}

// The bits of the entries ops sets; 0 for a NULL table.
inline uint32_t driverOpsPresent(const ibv_context_extend_ops *ops) {
    if (ops == nullptr) {
        return 0;
    }
    uint32_t bits = 0;
    for (uint32_t i = 0; i < static_cast<uint32_t>(DriverOp::kCount); ++i) {
        if (driverOpEntry(*ops, static_cast<DriverOp>(i)) != nullptr) {
            bits |= 1u << i;
        }
    }
    return bits;
}

// The driver version that introduced op: the reference calls an entry of a newer version than
// the driver announces unsupported even when the table has it. V1 entries are not gated (the
// reference never tested the version for them).
constexpr int driverOpMinVersion(DriverOp op) {
    switch (op) {
        case DriverOp::kModifyQp:
        case DriverOp::kQueryQp:
            return IBV_EXTEND_DRIVER_VERSION_V2;
        case DriverOp::kQueryHyroceFeature:
        case DriverOp::kNegoHyroceFeature:
            return IBV_EXTEND_DRIVER_VERSION_V3;
        default:
            return IBV_EXTEND_DRIVER_VERSION_UNUSED;
    }
}

// Whether a call of op may go to the driver: a table, new enough, with the entry set. The one
// decision of ibv_extend.h's functions (direct mode) and the broker's extend calls.
inline bool driverOpAvailable(const ibv_context_extend_ops *ops, DriverOp op) {
    return ops != nullptr && ops->version >= driverOpMinVersion(op) && driverOpEntry(*ops, op) != nullptr;
}

// Mask bits at or above IBV_QP_ATTR_EXTEND_MAX belong to a newer header than this library knows:
// modify/query_qp_extend refuse them (EOPNOTSUPP) rather than pass them to the driver.
constexpr bool knownExtendMask(int attr_mask) {
    return (static_cast<unsigned>(attr_mask) & ~(static_cast<unsigned>(IBV_QP_ATTR_EXTEND_MAX) - 1U)) == 0;
}

}  // namespace ibvx
