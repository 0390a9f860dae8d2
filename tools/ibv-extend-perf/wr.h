// Work requests as the scenarios post them, through softnda_device.h as a device kernel would.
#pragma once

#include <cstdint>

#include "common/cpu.h"
#include "providers/softnda/include/softnda_device.h"

namespace ibvx::perf {

// An RDMA WRITE of *sge to (remote, rkey); sge must outlive the post.
inline softnda_send_wr rdmaWrite(const softnda_sge *sge, uint64_t remote, uint32_t rkey, uint8_t flags,
                                 uint64_t wr_id) {
    softnda_send_wr w{};
    w.opcode = SOFTNDA_OP_RDMA_WRITE;
    w.flags = flags;
    w.wr_id = wr_id;
    w.sg_list = sge;
    w.num_sge = 1;
    w.remote_addr = remote;
    w.rkey = rkey;
    return w;
}

// Spins for one CQE; its status (IBV_WC_SUCCESS = 0), or -1 when the CQ is in error.
inline int waitOneCqe(softnda_cq *cq) {
    softnda_cqe e;
    int n;
    while ((n = softnda_cq_poll(cq, &e, 1)) == 0) {
        ibvx_cpu_relax();
    }
    return n < 0 ? -1 : static_cast<int>(e.status);
}

}  // namespace ibvx::perf
