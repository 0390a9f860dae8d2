// What every softnda test uses, with the SoftndaTest fixture (fixture.h) or without it (the
// restart test, whose processes make and import their objects themselves): the configuration
// reset, the RC state steps, work-request builders and CQ waits. Device-side work goes through
// softnda_device.h only.
#pragma once

#include <dirent.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"

namespace softnda_test {

// Restores every option to its documented default (the registry outlives a test).
inline void resetConfig() {
    const char *kv[][2] = {
        {"devices", "1"},           {"max_pd", "65536"},
        {"max_mr", "1048576"},      {"max_qp", "131072"},
        {"max_cq", "131072"},       {"max_srq", "65536"},
        {"max_qp_wr", "32768"},     {"max_cqe", "4194304"},
        {"max_srq_wr", "32768"},    {"max_sge", "29"},
        {"max_inline_data", "464"}, {"max_msg_sz", "2147483648"},
        {"phys_port_cnt", "1"},     {"engine_threads", "1"},
        {"spin_us", "50"},          {"sleep_us", "1000"},
        {"futex_waitv", "1"},       {"max_mr_size", "1099511627776"},
        {"dm_size", "262144"},      {"netdev", ""},
    };
    for (auto &p : kv) {
        ASSERT_EQ(softnda_vdev_ops.configure(p[0], p[1]), 0) << p[0];
    }
}

inline constexpr int kAllAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// The RC steps RESET -> INIT -> RTR -> RTS with the attributes the IB state table requires.
inline int toInit(ibv_qp *qp, int access) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = static_cast<unsigned>(access);
    return softnda_vdev_ops.modify_qp(qp, &a,
                                      IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}
inline int toRtr(ibv_qp *qp, uint32_t dest, uint32_t rq_psn = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    a.ah_attr.port_num = 1;
    return softnda_vdev_ops.modify_qp(qp, &a,
                                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}
inline int toRts(ibv_qp *qp, uint32_t sq_psn = 0, uint8_t rnr_retry = 7) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 16;
    return softnda_vdev_ops.modify_qp(qp, &a,
                                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

inline softnda_send_wr wr(uint8_t opcode, uint64_t wr_id, const softnda_sge *sge, uint32_t nsge,
                          uint8_t flags = SOFTNDA_WQE_SIGNALED) {
    softnda_send_wr w{};
    w.wr_id = wr_id;
    w.opcode = opcode;
    w.flags = flags;
    w.sg_list = sge;
    w.num_sge = nsge;
    return w;
}

inline softnda_sge sge(const void *addr, uint32_t len, const ibv_mr *mr) {
    return softnda_sge{reinterpret_cast<uintptr_t>(addr), len, mr->lkey};
}

// Posts w and rings the SQ's doorbell; the post's result.
inline int postAndRing(softnda_sq *sq, const softnda_send_wr &w) {
    int rc = softnda_sq_post(sq, &w);
    if (rc == 0) {
        softnda_sq_doorbell(sq);
    }
    return rc;
}

// Polls until n CQEs arrived (or 20 s passed, which only a broken engine takes).
inline std::vector<softnda_cqe> waitCqes(softnda_cq &cq, size_t n) {
    std::vector<softnda_cqe> out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    softnda_cqe buf[64];
    while (out.size() < n && std::chrono::steady_clock::now() < deadline) {
        int got = softnda_cq_poll(&cq, buf, static_cast<int>(std::min<size_t>(64, n - out.size())));
        if (got > 0) {
            out.insert(out.end(), buf, buf + got);
        } else if (got < 0) {
            break;
        } else {
            std::this_thread::yield();
        }
    }
    return out;
}

inline softnda_cqe waitOne(softnda_cq &cq) {
    auto v = waitCqes(cq, 1);
    EXPECT_EQ(v.size(), 1u);
    return v.empty() ? softnda_cqe{} : v[0];
}

// Nothing more arrives within a short settle time (used after an expected completion).
inline bool staysEmpty(softnda_cq &cq) {
    softnda_cqe c;
    for (int i = 0; i < 50; ++i) {
        if (softnda_cq_poll(&cq, &c, 1) != 0) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
}

// The open fds of this process (with the one counting them).
// The next key byte of an rkey, as rdma-core's ibv_inc_rkey makes it.
inline uint32_t incKey(uint32_t rkey) {
    return (rkey & ~0xffu) | ((rkey + 1) & 0xffu);
}

inline int countFds() {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    while (readdir(d) != nullptr) {
        n++;
    }
    closedir(d);
    return n;
}

}  // namespace softnda_test
