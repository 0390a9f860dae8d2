// Pure translation from what mlx5dv_init_obj() reports about a QP, CQ or SRQ to the
// queue_info a device-side user drives the queue with. No libmlx5 calls: the functions read
// the mlx5dv structs only, so the unit tests feed them crafted values.
//
// mlx5 facts the translation encodes (rdma-core providers/mlx5, PRM):
//  - A QP's RQ and SQ share one buffer, RQ first; mlx5dv_qp already points sq.buf/rq.buf at
//    each ring. Entry counts are powers of two, so device code wraps an index with cnt - 1.
//  - QP doorbell record: dbrec[MLX5_RCV_DBR = 0] is the RQ producer counter,
//    dbrec[MLX5_SND_DBR = 1] the SQ producer counter; both 32-bit big-endian, written by
//    software, read by the NIC. mlx5 has no hardware-written consumer record for SQ/RQ/SRQ
//    (progress is reported by CQEs), so their dbr_ci_va is {NULL, 0}.
//  - CQ doorbell record: dbrec[MLX5_CQ_SET_CI = 0] is the consumer index software writes,
//    dbrec[MLX5_CQ_ARM_DB = 1] the arm record. mlx5 has no hardware producer-index record (the
//    CQE ownership bit tells a new entry), so the CQ's dbr_pi_va is {NULL, 0}.
//  - The SQ doorbell register is bf.reg in a UAR page. bf.size > 0 means the register is a
//    BlueFlame buffer (a whole WQE of up to bf.size bytes may be written there); bf.size == 0
//    means a doorbell-only register (the 8-byte control-segment prefix). The CQ arm doorbell is
//    at cq_uar + MLX5_CQ_DOORBELL. RQ and SRQ have no doorbell register: the record is the
//    doorbell.
#pragma once

#include <ibv_extend.h>
#include <infiniband/mlx5dv.h>

#include <cstdint>

namespace ibvx::mlx5 {

// UAR pages are 4 KiB on every mlx5 device whatever the host page size, and the reference
// consumer's db_mmap aligns to 4 KiB too.
inline constexpr uint64_t kUarPageSize = 4096;
// Bytes a doorbell-only write stores to the SQ register (the first 8 bytes of the WQE control
// segment) and to the CQ arm register.
inline constexpr uint32_t kDoorbellWriteSize = 8;
// mlx5 send WQE basic block.
inline constexpr uint32_t kSendWqeBasicBlock = 64;
// Smallest receive / SRQ WQE: one 16-byte scatter entry (plus the SRQ next segment).
inline constexpr uint32_t kMinRecvStride = 16;
// Smallest SRQ WQE: the 16-byte next segment plus one scatter entry.
inline constexpr uint32_t kMinSrqStride = 32;
inline constexpr uint32_t kDoorbellRecordSize = sizeof(uint32_t);

// A doorbell register to map through ibv_extend_ops.db_mmap.
struct DoorbellWindow {
    doorbell_map_desc desc;  // DB_MAP_MODE_HOST_VA, page-aligned hva and size
    uint64_t offset;         // of the register within the mapped range
    uint32_t length;         // bytes the device may store at the register
};

// The range [reg, reg + length) widened to whole UAR pages. `length` must be > 0.
DoorbellWindow doorbellWindow(const void *reg, uint32_t length);

// db_hw_va of a queue once its window is mapped at `mapped`.
iov_addr_desc mappedRegister(void *mapped, const DoorbellWindow &window);

struct QpQueues {
    queue_info sq;
    queue_info rq;
    bool has_sq_doorbell;  // false when the QP has no SQ
    DoorbellWindow sq_doorbell;
    bool blueflame;  // the SQ register is a BlueFlame buffer of sq_doorbell.length bytes
};

// Fills out from a QP's mlx5dv view (db_hw_va left empty: it comes from db_mmap). With
// direct_wqe and a BlueFlame register, the SQ window's length is the BlueFlame buffer (bf.size
// bytes) instead of the 8-byte doorbell, and its mapping covers both alternating halves. 0, or -EINVAL when
// the view is inconsistent (counts not powers of two, strides too small, overlapping rings, missing buffers
// or records).
int translateQp(const mlx5dv_qp &qp, bool direct_wqe, QpQueues *out);

struct CqQueue {
    queue_info cq;
    DoorbellWindow arm_doorbell;
};

// 0, or -EINVAL (CQE size not 64/128, count not a power of two, missing buffer/record/UAR).
int translateCq(const mlx5dv_cq &cq, CqQueue *out);

// SRQ depth is tail + 1 at creation (mlx5 keeps a free list from head to tail). 0, or -EINVAL.
int translateSrq(const mlx5dv_srq &srq, queue_info *out);

}  // namespace ibvx::mlx5
