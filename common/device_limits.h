// The limits a device reports, copied one way into every view of a device: the daemon's
// DeviceInfo and the client's ibvx_device_info name these fields alike, so a listing in direct
// mode and one through the broker cannot drift apart.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <type_traits>

#include "ibv_extend_vdev.h"

namespace ibvx {

// Attr is what a device reports: ibv_device_attr from rdma-core (limits as int, never negative)
// or ibv_extend_vdev_attr from a virtual device's provider. Verbs has no inline-data or
// message-size limit, so from it those two keep what the view had.
template <typename Attr, typename Info>
void copyDeviceLimits(const Attr &attr, Info &info) {
    static_assert(std::is_same_v<Attr, ibv_device_attr> || std::is_same_v<Attr, ibv_extend_vdev_attr>);
    info.phys_port_cnt = attr.phys_port_cnt;
    info.max_qp = static_cast<uint32_t>(attr.max_qp);
    info.max_cq = static_cast<uint32_t>(attr.max_cq);
    info.max_srq = static_cast<uint32_t>(attr.max_srq);
    info.max_mr = static_cast<uint32_t>(attr.max_mr);
    info.max_qp_wr = static_cast<uint32_t>(attr.max_qp_wr);
    info.max_cqe = static_cast<uint32_t>(attr.max_cqe);
    info.max_srq_wr = static_cast<uint32_t>(attr.max_srq_wr);
    info.max_sge = static_cast<uint32_t>(attr.max_sge);
    info.max_mr_size = attr.max_mr_size;
    if constexpr (std::is_same_v<Attr, ibv_extend_vdev_attr>) {
        info.max_inline_data = attr.max_inline_data;
        info.max_msg_sz = attr.max_msg_sz;
    }
}

}  // namespace ibvx
