#include "providers/mlx5/translate.h"

#include <cerrno>
#include <cstring>

namespace ibvx::mlx5 {
namespace {

bool isPowerOfTwo(uint64_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

uint64_t address(const void *p) {
    return reinterpret_cast<uintptr_t>(p);
}

// One ring: entries must be a power of two (device code wraps indexes with cnt - 1) and the
// ring's byte size must fit the address space without wrapping.
bool validRing(const void *buf, uint32_t cnt, uint32_t stride, uint32_t min_stride) {
    if (cnt == 0) {
        return true;  // an absent queue (e.g. a QP without RQ)
    }
    if (buf == nullptr || !isPowerOfTwo(cnt) || !isPowerOfTwo(stride) || stride < min_stride) {
        return false;
    }
    uint64_t bytes = uint64_t{cnt} * stride;
    return address(buf) <= UINTPTR_MAX - bytes;
}

bool overlaps(uint64_t a, uint64_t a_len, uint64_t b, uint64_t b_len) {
    return a_len != 0 && b_len != 0 && a < b + b_len && b < a + a_len;
}

queue_info ring(const void *buf, uint32_t cnt, uint32_t stride) {
    queue_info q{};
    if (cnt != 0) {
        q.qbuf.base = address(buf);
        q.qbuf.entry_cnt = cnt;
        q.qbuf.entry_size = stride;
    }
    return q;
}

iov_addr_desc record(__be32 *rec) {
    return iov_addr_desc{rec, kDoorbellRecordSize};
}

}  // namespace

DoorbellWindow doorbellWindow(const void *reg, uint32_t length) {
    DoorbellWindow w{};
    uint64_t start = address(reg) & ~(kUarPageSize - 1);
    uint64_t end = (address(reg) + length + kUarPageSize - 1) & ~(kUarPageSize - 1);
    w.desc.hva = start;
    w.desc.size = end - start;
    w.desc.type = DB_MAP_MODE_HOST_VA;
    w.offset = address(reg) - start;
    w.length = length;
    return w;
}

iov_addr_desc mappedRegister(void *mapped, const DoorbellWindow &window) {
    return iov_addr_desc{static_cast<char *>(mapped) + window.offset, window.length};
}

int translateQp(const mlx5dv_qp &qp, bool direct_wqe, QpQueues *out) {
    if (out == nullptr || qp.dbrec == nullptr) {
        return -EINVAL;
    }
    if (!validRing(qp.sq.buf, qp.sq.wqe_cnt, qp.sq.stride, kSendWqeBasicBlock) ||
        !validRing(qp.rq.buf, qp.rq.wqe_cnt, qp.rq.stride, kMinRecvStride)) {
        return -EINVAL;
    }
    uint64_t sq_bytes = uint64_t{qp.sq.wqe_cnt} * qp.sq.stride;
    uint64_t rq_bytes = uint64_t{qp.rq.wqe_cnt} * qp.rq.stride;
    if (overlaps(address(qp.sq.buf), sq_bytes, address(qp.rq.buf), rq_bytes)) {
        return -EINVAL;
    }
    if (qp.sq.wqe_cnt != 0 && qp.bf.reg == nullptr) {
        return -EINVAL;
    }

    *out = QpQueues{};
    out->sq = ring(qp.sq.buf, qp.sq.wqe_cnt, qp.sq.stride);
    out->rq = ring(qp.rq.buf, qp.rq.wqe_cnt, qp.rq.stride);
    if (qp.sq.wqe_cnt != 0) {
        out->sq.dbr_pi_va = record(&qp.dbrec[MLX5_SND_DBR]);
        out->blueflame = direct_wqe && qp.bf.size != 0;
        out->has_sq_doorbell = true;
        if (out->blueflame) {
            // Successive BlueFlame writes alternate between two bf.size halves (as rdma-core
            // does, so write-combining never merges two WQEs): map both, report one.
            out->sq_doorbell = doorbellWindow(qp.bf.reg, 2 * qp.bf.size);
            out->sq_doorbell.length = qp.bf.size;
        } else {
            out->sq_doorbell = doorbellWindow(qp.bf.reg, kDoorbellWriteSize);
        }
    }
    if (qp.rq.wqe_cnt != 0) {
        out->rq.dbr_pi_va = record(&qp.dbrec[MLX5_RCV_DBR]);
    }
    return 0;
}

int translateCq(const mlx5dv_cq &cq, CqQueue *out) {
    if (out == nullptr || cq.dbrec == nullptr || cq.cq_uar == nullptr || cq.cqe_cnt == 0) {
        return -EINVAL;
    }
    if (cq.cqe_size != 64 && cq.cqe_size != 128) {
        return -EINVAL;
    }
    if (!validRing(cq.buf, cq.cqe_cnt, cq.cqe_size, 64)) {
        return -EINVAL;
    }
    *out = CqQueue{};
    out->cq = ring(cq.buf, cq.cqe_cnt, cq.cqe_size);
    out->cq.dbr_ci_va = record(&cq.dbrec[0]);  // MLX5_CQ_SET_CI
    out->arm_doorbell = doorbellWindow(static_cast<char *>(cq.cq_uar) + MLX5_CQ_DOORBELL, kDoorbellWriteSize);
    return 0;
}

int translateSrq(const mlx5dv_srq &srq, queue_info *out) {
    if (out == nullptr || srq.dbrec == nullptr || srq.tail == UINT32_MAX) {
        return -EINVAL;
    }
    uint32_t cnt = srq.tail + 1;
    if (!validRing(srq.buf, cnt, srq.stride, kMinSrqStride)) {
        return -EINVAL;
    }
    *out = ring(srq.buf, cnt, srq.stride);
    out->dbr_pi_va = record(&srq.dbrec[0]);
    return 0;
}

}  // namespace ibvx::mlx5
