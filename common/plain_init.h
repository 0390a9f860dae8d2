// The rule of IBV_EXTEND_GUARANTEE_PLAIN_INIT (ibv_extend_vdev.h) as code: what a driver that
// declares it answers a QP's modify from RESET to INIT. The broker's face answers such a modify
// itself with it (client/broker/held_init.h); softnda's test checks softnda refuses exactly so.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>

namespace ibvx {

// The access flags a plain-INIT driver knows (the guarantee's list).
inline constexpr unsigned kPlainInitAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                             IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                             IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING;
inline constexpr uint32_t kPrivilegedQkey = 0x80000000u;  // IB: a Q_Key with its top bit set

// What a plain-INIT driver answers a modify from RESET that names INIT (0: it takes it), in the
// guarantee's order: the mask, the current state named, the Q_Key (EPERM), then the values.
inline int plainInitRefusal(ibv_qp_type type, const ibv_qp_attr &attr, int mask, uint32_t phys_port_cnt) {
    const int required = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                         (type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
    if ((mask & ~IBV_QP_CUR_STATE) != required ||
        ((mask & IBV_QP_CUR_STATE) != 0 && attr.cur_qp_state != IBV_QPS_RESET)) {
        return EINVAL;
    }
    if ((mask & IBV_QP_QKEY) != 0 && (attr.qkey & kPrivilegedQkey) != 0) {
        return EPERM;
    }
    if (attr.port_num < 1 || attr.port_num > phys_port_cnt || attr.pkey_index != 0 ||
        ((mask & IBV_QP_ACCESS_FLAGS) != 0 && (attr.qp_access_flags & ~kPlainInitAccess) != 0)) {
        return EINVAL;
    }
    return 0;
}

}  // namespace ibvx
