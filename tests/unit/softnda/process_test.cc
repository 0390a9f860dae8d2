// The tenant is another process: a forked child maps the queue memory, the doorbell page and the
// data buffers again, at addresses of its own, and drives the queues with softnda_device.h
// only, while this process's engine executes. This is what the broker does for its tenants.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

// Maps the page-aligned range of arena memory holding [addr, addr+len) once more; returns the
// new address of addr (nullptr on failure). Runs in the child: syscalls only.
void *remap(const void *addr) {
    int fd = -1;
    uint64_t off = 0;
    size_t len = 0;
    const void *base = nullptr;
    if (!MemfdArena::instance().lookup(addr, &fd, &off, &len, &base)) {
        return nullptr;
    }
    void *m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return m == MAP_FAILED ? nullptr : static_cast<uint8_t *>(m) + off;
}

// A queue_info rewritten for the child's own mappings of the same memory.
bool remapQueue(const queue_info &in, queue_info *out) {
    *out = in;
    void *ring = remap(reinterpret_cast<void *>(in.qbuf.base));
    if (ring == nullptr) {
        return false;
    }
    auto delta = reinterpret_cast<uintptr_t>(ring) - in.qbuf.base;
    out->qbuf.base += delta;
    // Moved as integers: the child's mapping may lie below the parent's, and a pointer plus a
    // wrapped-around unsigned delta is undefined (UBSan under clang says so).
    out->dbr_pi_va.iov_base =
        reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(in.dbr_pi_va.iov_base) + delta);
    out->dbr_ci_va.iov_base =
        reinterpret_cast<void *>(reinterpret_cast<uintptr_t>(in.dbr_ci_va.iov_base) + delta);
    return true;
}

// The doorbell page again from the export_mmio fd the db_mmap callback used.
bool remapDoorbell(queue_info *qi) {
    int fd = -1;
    uint64_t off = 0;
    if (!MemfdArena::instance().lookupDb(qi->db_hw_va.iov_base, &fd, &off)) {
        return false;
    }
    void *m = mapDoorbellPage(fd, off);
    if (m == nullptr) {
        return false;
    }
    qi->db_hw_va.iov_base =
        static_cast<uint8_t *>(m) + (reinterpret_cast<uintptr_t>(qi->db_hw_va.iov_base) & 4095);
    return true;
}

class Process : public SoftndaTest {};

TEST_F(Process, ChildProcessDrivesQueuesThroughItsOwnMappings) {
    CqH scq = makeCq();
    CqH rcq = makeCq();
    QpH a = makeQp(scq, rcq);
    QpH b = makeQp(scq, rcq);
    connect(a, b);
    // Data buffers in shared memory; registered under fixed iovas, as a broker registers a
    // tenant's memory under the tenant's addresses.
    auto *src = static_cast<uint8_t *>(MemfdArena::alloc(4096));
    auto *dst = static_cast<uint8_t *>(MemfdArena::alloc(4096));
    auto *rbuf = static_cast<uint8_t *>(MemfdArena::alloc(4096));
    ASSERT_TRUE(src && dst && rbuf);
    std::memset(dst, 0, 4096);
    std::memset(rbuf, 0, 4096);
    constexpr uint64_t kSrcIova = 0x7000000000, kDstIova = 0x7100000000, kRecvIova = 0x7200000000;
    ibv_mr *sm = softnda_vdev_ops.reg_mr(pd_, src, 4096, kSrcIova, kAllAccess);
    ibv_mr *dm = softnda_vdev_ops.reg_mr(pd_, dst, 4096, kDstIova, kAllAccess);
    ibv_mr *rm = softnda_vdev_ops.reg_mr(pd_, rbuf, 4096, kRecvIova, kAllAccess);
    ASSERT_TRUE(sm && dm && rm);
    mrs_.insert(mrs_.end(), {sm, dm, rm});

    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        // Child: everything through fresh mappings; the parent's addresses are never used.
        queue_info sq{}, rq{}, cq{}, rcqi{};
        if (!remapQueue(a.ext->sq_info, &sq) || !remapQueue(b.ext->rq_info, &rq) ||
            !remapQueue(scq.ext->cq_info, &cq) || !remapQueue(rcq.ext->cq_info, &rcqi)) {
            _exit(10);
        }
        if (!remapDoorbell(&sq) || !remapDoorbell(&rq)) {
            _exit(18);
        }
        auto *my_src = static_cast<uint8_t *>(remap(src));
        if (my_src == nullptr) {
            _exit(11);
        }
        for (int i = 0; i < 4096; ++i) {
            my_src[i] = static_cast<uint8_t>(i * 13 + 1);
        }
        softnda_sq s;
        softnda_rq r;
        softnda_cq c, rc;
        if (softnda_sq_init(&s, &sq) != 0 || softnda_rq_init(&r, &rq) != 0 || softnda_cq_init(&c, &cq) != 0 ||
            softnda_cq_init(&rc, &rcqi) != 0) {
            _exit(12);
        }
        softnda_sge rs{kRecvIova, 4096, rm->lkey};
        if (softnda_rq_post(&r, 1, &rs, 1) != 0) {
            _exit(13);
        }
        softnda_rq_doorbell(&r);
        softnda_sge ws{kSrcIova, 4096, sm->lkey};
        softnda_send_wr w{};
        w.opcode = SOFTNDA_OP_RDMA_WRITE;
        w.flags = SOFTNDA_WQE_SIGNALED;
        w.wr_id = 21;
        w.sg_list = &ws;
        w.num_sge = 1;
        w.remote_addr = kDstIova;
        w.rkey = dm->rkey;
        softnda_sge ss{kSrcIova + 100, 1000, sm->lkey};
        softnda_send_wr snd = w;
        snd.opcode = SOFTNDA_OP_SEND;
        snd.wr_id = 22;
        snd.sg_list = &ss;
        if (softnda_sq_post(&s, &w) != 0 || softnda_sq_post(&s, &snd) != 0) {
            _exit(14);
        }
        softnda_sq_doorbell(&s);
        softnda_cqe e[2];
        int got = 0;
        for (long spin = 0; got < 2 && spin < 4000000000L; ++spin) {
            int n = softnda_cq_poll(&c, e + got, 2 - got);
            if (n < 0) {
                _exit(15);
            }
            got += n;
        }
        if (got != 2 || e[0].wr_id != 21 || e[1].wr_id != 22 || e[0].status != 0 || e[1].status != 0) {
            _exit(16);
        }
        softnda_cqe re;
        got = 0;
        for (long spin = 0; got < 1 && spin < 4000000000L; ++spin) {
            got = softnda_cq_poll(&rc, &re, 1);
        }
        if (got != 1 || re.byte_len != 1000 || re.status != 0) {
            _exit(17);
        }
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    for (int i = 0; i < 4096; ++i) {
        ASSERT_EQ(dst[i], static_cast<uint8_t>(i * 13 + 1)) << i;
    }
    for (int i = 0; i < 1000; ++i) {
        ASSERT_EQ(rbuf[i], static_cast<uint8_t>((i + 100) * 13 + 1)) << i;
    }
    EXPECT_EQ(rbuf[1000], 0);
    // The parent's view of the queues moved too (same memory).
    EXPECT_EQ(__atomic_load_n(a.sq.dbr_ci, __ATOMIC_ACQUIRE), 2u);
    MemfdArena::free(src);
    MemfdArena::free(dst);
    MemfdArena::free(rbuf);
}

}  // namespace
}  // namespace softnda_test
