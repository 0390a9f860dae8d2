// Restart with live queues (SPEC.md §10): a forked child plays the old broker (creates
// everything over one memfd, runs traffic, exports every object, posts more work and dies with
// SIGKILL); the parent plays the new one (maps the memfd and the doorbell BAR elsewhere, imports
// with relocation, resumes) and checks that the queues carry on exactly where they were.
#include <fcntl.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "common/qp_init_attr.h"
#include "tests/unit/softnda/fixture.h"

namespace softnda_test {
namespace {

constexpr size_t kArenaSize = 8u << 20;

// ibv_extend_ops over one memfd, so that the successor maps all queue memory again with one
// mmap: a bump allocator (the callbacks have no context pointer, so the arena is global),
// doorbells mapped through export_mmio, every free and unmap recorded; memset and memcpy are
// the memfd test ops' (memfd_ops.h).
struct Arena {
    int fd = -1;
    uint8_t *base = nullptr;
    size_t used = 0;
    std::set<uintptr_t> live;                // allocations
    std::vector<uintptr_t> freed;            // what ops->free got
    std::map<uintptr_t, uint64_t> db_pages;  // page va -> offset in the BAR fd
    std::vector<uintptr_t> unmapped;         // what ops->db_unmap got
    int bar_fd = -1;                         // the parent's BAR fd (relocated doorbells)
};
Arena g;

void *arenaAlloc(size_t size) {
    size_t at = (g.used + 4095) & ~size_t{4095};
    if (at + size > kArenaSize) {
        return nullptr;
    }
    g.used = at + size;
    g.live.insert(reinterpret_cast<uintptr_t>(g.base + at));
    return g.base + at;
}
void arenaFree(void *p) {
    g.freed.push_back(reinterpret_cast<uintptr_t>(p));
    g.live.erase(reinterpret_cast<uintptr_t>(p));
}
void *arenaDbMmap(doorbell_map_desc *desc) {
    int fd;
    uint64_t off;
    if (desc->type != DB_MAP_MODE_HOST_VA ||
        softnda_vdev_ops.export_mmio(reinterpret_cast<void *>(desc->hva), &fd, &off) != 0) {
        return nullptr;
    }
    void *va = mapDoorbellPage(fd, off);
    close(fd);
    if (va == nullptr) {
        return nullptr;
    }
    g.db_pages[reinterpret_cast<uintptr_t>(va)] = off;
    return static_cast<uint8_t *>(va) + (desc->hva & (SOFTNDA_DB_PAGE_SIZE - 1));
}
int arenaDbUnmap(void *p, doorbell_map_desc *) {
    uintptr_t page = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{SOFTNDA_DB_PAGE_SIZE - 1};
    g.unmapped.push_back(reinterpret_cast<uintptr_t>(p));
    g.db_pages.erase(page);
    return munmap(reinterpret_cast<void *>(page), SOFTNDA_DB_PAGE_SIZE);
}
ibv_extend_ops g_ops = {arenaAlloc,          arenaFree,   MemfdArena::memsetS,
                        MemfdArena::memcpyS, arenaDbMmap, arenaDbUnmap};

// What the child leaves for the parent, in shared memory.
enum Obj {
    kCtx,
    kPd,
    kMrSrc,
    kMrDst,
    kMrRecv,
    kCqA,
    kCqB,
    kQpA,
    kQpB,
    kQpC,
    kCqD,
    kSrq,
    kQpD,
    kQpE,
    kXrcd,
    kXsrq,
    kQpI,
    kQpT,
    kMw1,  // a type 1 and a type 2 memory window of the PD (SPEC.md §16)
    kMw2,
    kObjs
};
constexpr int kWrites = 16, kSends = 4;
struct Shared {
    ibv_extend_vdev_state st[kObjs];
    uint64_t old_base;
    struct {
        uint64_t va, off;
    } db[32];
    int n_db;
    uint32_t qpn[3];
    uint32_t qpn_d;
    uint32_t qpn_e;
    uint32_t qpn_i, qpn_t, srqn;  // the XRC initiator and target, and the XRC SRQ's number
    uint32_t key[3];
    uint32_t mw_key[2];       // the windows' rkeys after the binds before the kill
    uint64_t src, dst, recv;  // old addresses (= iovas) of the MR buffers
    int ready;
    ibv_qp_extend *qp_ext[3];  // the child's own pointers (used in the child only)
};

// An 8-byte WRITE, READ or atomic between the child's source buffer at src_off and its
// destination buffer at dst_off, addressed by their old addresses (the iovas); *s receives the
// SGE, which must outlive the post.
softnda_send_wr toDst(const Shared *sh, uint8_t op, uint64_t id, softnda_sge *s, uint64_t src_off,
                      uint64_t dst_off, uint8_t flags = SOFTNDA_WQE_SIGNALED) {
    *s = softnda_sge{sh->src + src_off, 8, sh->key[0]};
    auto w = wr(op, id, s, 1, flags);
    w.remote_addr = sh->dst + dst_off;
    w.rkey = sh->key[1];
    return w;
}

// The child's check: a step that fails ends it with that step's code (it has no test to fail).
void need(bool ok, int code) {
    if (!ok) {
        _exit(code);
    }
}

// Posts and rings; a post that fails ends the process.
void post(softnda_sq *sq, const softnda_send_wr &w) {
    need(postAndRing(sq, w) == 0, 3);
}

// Posts and publishes the producer index without ringing: work a doorbell never announced.
void postUnrung(softnda_sq *sq, const softnda_send_wr &w, int code) {
    need(softnda_sq_post(sq, &w) == 0, code);
    __atomic_store_n(sq->dbr_pi, sq->pi, __ATOMIC_RELEASE);
}

// The fds go to the parent first (the broker's fd store): the states' own, and one more end of
// each eventfd for the test to read.
void handOver(Shared *sh, int sock, int efd, int afd) {
    sh->n_db = 0;
    for (auto &[va, off] : g.db_pages) {
        sh->db[sh->n_db++] = {va, off};
    }
    std::vector<int> fds;
    for (auto &st : sh->st) {
        for (uint32_t i = 0; i < st.fd_cnt; ++i) {
            fds.push_back(st.fds[i]);
        }
    }
    fds.push_back(efd);
    fds.push_back(afd);
    char cbuf[CMSG_SPACE(sizeof(int) * 16)] = {};
    char one = 1;
    iovec iov{&one, 1};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    if (sendmsg(sock, &m, 0) != 1) {
        _exit(22);
    }
}

constexpr int kNormal = 0, kDoctored = 1, kDiedBeforeCommit = 2, kInvalidatedBeforeCi = 3;

// The windows' ranges of the destination buffer (offsets), bound before the kill.
constexpr uint64_t kMw1At = 2048, kMw2At = 2560, kMwLen = 512;

// Record words as u32 indexes from dbr_pi (SPEC.md §1.1, §10).
constexpr unsigned kWCi = 16, kWSqPsn = 18, kWExec = 21;
uint32_t *rec(const ibv_qp_extend *q) {
    return static_cast<uint32_t *>(q->sq_info.dbr_pi_va.iov_base);
}

// A UD QP's Q_Key (SPEC.md §11.1), which only queue memory carries across a restart.
constexpr uint32_t kUdQkey = 0x5eed;

// The multicast group UD QP E joins before the export (SPEC.md §11.3).
constexpr uint16_t kUdMlid = 0xc00e;
ibv_gid udGroup() {
    ibv_gid g{};
    g.raw[0] = 0xff;
    g.raw[1] = 0x12;
    g.raw[15] = 0x0e;
    return g;
}

// UD: RESET -> INIT (P_Key index, port, Q_Key) -> RTR -> RTS.
int udUp(ibv_qp *qp, uint32_t qkey) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qkey = qkey;
    int rc = softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
    a.qp_state = IBV_QPS_RTR;
    rc = rc != 0 ? rc : softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE);
    a.qp_state = IBV_QPS_RTS;
    return rc != 0 ? rc : softnda_vdev_ops.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
}

// The old broker's objects, made in the child over the one-memfd arena: three MRs (source,
// destination, receive buffer), CQ 0 for QPs A and C, CQ 1 for B; A and B connected, C to
// itself; an eventfd on CQ 1 and the context's async one; QP D on an SRQ, with a CQ of its
// own (resized from 64 to 128 entries), connected to itself; and UD QP E on D's CQ. Every step that fails
// ends the child.
struct OldBroker {
    explicit OldBroker(Shared *shared) : sh(shared) {}

    void makeObjects() {
        sh->old_base = reinterpret_cast<uintptr_t>(g.base);
        ctx = softnda_vdev_ops.open_device("softnda0");
        need(ctx != nullptr, 10);
        ext = softnda_driver_ops.alloc_context(ctx);
        pd = softnda_vdev_ops.alloc_pd(ctx);
        src = static_cast<uint64_t *>(arenaAlloc(4096));
        auto *dst = static_cast<uint64_t *>(arenaAlloc(4096));
        auto *recv = static_cast<uint64_t *>(arenaAlloc(4096));
        sh->src = reinterpret_cast<uintptr_t>(src);
        sh->dst = reinterpret_cast<uintptr_t>(dst);
        sh->recv = reinterpret_cast<uintptr_t>(recv);
        uint64_t *bufs[3] = {src, dst, recv};
        for (int i = 0; i < 3; ++i) {
            // The destination takes windows (SPEC.md §16).
            const int access = i == 1 ? kAllAccess | IBV_ACCESS_MW_BIND : kAllAccess;
            mr[i] = softnda_vdev_ops.reg_mr(pd, bufs[i], 4096, reinterpret_cast<uintptr_t>(bufs[i]), access);
            need(mr[i] != nullptr, 11);
            sh->key[i] = mr[i]->lkey;
        }
        for (int i = 0; i < 2; ++i) {
            ibv_cq_init_attr_extend a{};
            a.attr.cqe = 64;
            a.ops = &g_ops;
            cq[i] = ext->ops->create_cq(ctx, &a);
            need(cq[i] != nullptr, 12);
            softnda_cq_init(&cqs[i], &cq[i]->cq_info);
        }
        for (int i = 0; i < 3; ++i) {
            makeQp(i);
        }
        uint32_t dest[3] = {sh->qpn[1], sh->qpn[0], sh->qpn[2]};
        for (int i = 0; i < 3; ++i) {
            need(
                toInit(qp[i]->qp, kAllAccess) == 0 && toRtr(qp[i]->qp, dest[i]) == 0 && toRts(qp[i]->qp) == 0,
                14);
        }
        efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        afd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        need(softnda_vdev_ops.set_cq_event_fd(cq[1]->cq, efd) == 0, 15);
        need(softnda_vdev_ops.set_async_event_fd(ctx, afd) == 0, 15);
        makeSrqQp();
        auto ua = ibvx::qpInitAttr({.pd = pd, .send_cq = cq_d->cq, .qp_type = IBV_QPT_UD, .ops = &g_ops});
        qp_e = ext->ops->create_qp(ctx, &ua);
        need(qp_e != nullptr && udUp(qp_e->qp, kUdQkey) == 0, 56);
        const ibv_gid mgid = udGroup();
        need(softnda_vdev_ops.attach_mcast(qp_e, &mgid, kUdMlid) == 0, 57);
        sh->qpn_e = qp_e->qp->qp_num;
        makeXrc();
        mw[0] = softnda_vdev_ops.alloc_mw(pd, IBV_MW_TYPE_1);
        mw[1] = softnda_vdev_ops.alloc_mw(pd, IBV_MW_TYPE_2);
        need(mw[0] != nullptr && mw[1] != nullptr, 66);
    }

    // An XRC domain, an XRC SRQ completing on D's CQ, initiator I (sending on D's CQ) connected
    // to target T (SPEC.md §14).
    void makeXrc() {
        xrcd = softnda_vdev_ops.open_xrcd(ctx);
        need(xrcd != nullptr, 60);
        ibv_srq_init_attr_extend sa{};
        sa.pd = pd;
        sa.attr.attr.max_wr = 8;
        sa.attr.attr.max_sge = 1;
        sa.ops = &g_ops;
        xsrq = softnda_vdev_ops.create_xrc_srq(ctx, &sa, xrcd, cq_d->cq);
        need(xsrq != nullptr && softnda_vdev_ops.get_srq_num(xsrq->srq, &sh->srqn) == 0, 61);
        softnda_rq_init(&xsrq_rq, &xsrq->srq_info);
        auto ia = ibvx::qpInitAttr({.pd = pd,
                                    .send_cq = cq_d->cq,
                                    .qp_type = IBV_QPT_XRC_SEND,
                                    .send_wr = 8,
                                    .recv_wr = 0,
                                    .ops = &g_ops});
        qp_i = ext->ops->create_qp(ctx, &ia);
        ibv_qp_init_attr_extend ta{};
        ta.ops = &g_ops;
        qp_t = softnda_vdev_ops.create_xrc_tgt_qp(ctx, &ta, xrcd);
        need(qp_i != nullptr && qp_t != nullptr && softnda_sq_init_xrc(&sq_i, &qp_i->sq_info) == 0, 62);
        sh->qpn_i = qp_i->qp->qp_num;
        sh->qpn_t = qp_t->qp->qp_num;
        need(toInit(qp_i->qp, 0) == 0 && toInit(qp_t->qp, kAllAccess) == 0 &&
                 toRtr(qp_i->qp, sh->qpn_t) == 0 && toRtr(qp_t->qp, sh->qpn_i) == 0 && toRts(qp_i->qp) == 0 &&
                 toRts(qp_t->qp) == 0,
             63);
    }

    void makeSrqQp() {
        ibv_cq_init_attr_extend ca{};
        ca.attr.cqe = 64;
        ca.attr.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;  // 64-byte entries (SPEC.md §15)
        ca.ops = &g_ops;
        cq_d = ext->ops->create_cq(ctx, &ca);
        // Resized before its export (SPEC.md §12): the successor must find the new ring.
        need(cq_d != nullptr && softnda_vdev_ops.resize_cq(cq_d, 128) == 0, 50);
        softnda_cq_init(&cqs_d, &cq_d->cq_info);
        ibv_srq_init_attr_extend sa{};
        sa.pd = pd;
        sa.attr.attr.max_wr = 16;
        sa.attr.attr.max_sge = 1;
        sa.ops = &g_ops;
        srq = ext->ops->create_srq(ctx, &sa);
        need(srq != nullptr, 51);
        softnda_rq_init(&srq_rq, &srq->srq_info);
        auto a = ibvx::qpInitAttr(
            {.pd = pd, .send_cq = cq_d->cq, .srq = srq->srq, .send_wr = 16, .recv_wr = 0, .ops = &g_ops});
        qp_d = ext->ops->create_qp(ctx, &a);
        need(qp_d != nullptr, 52);
        sh->qpn_d = qp_d->qp->qp_num;
        softnda_sq_init(&sq_d, &qp_d->sq_info);
        need(toInit(qp_d->qp, kAllAccess) == 0 && toRtr(qp_d->qp, sh->qpn_d) == 0 && toRts(qp_d->qp) == 0,
             53);
    }

    void makeQp(int i) {
        auto a = ibvx::qpInitAttr({.pd = pd,
                                   .send_cq = cq[i == 1 ? 1 : 0]->cq,
                                   .recv_cq = cq[i == 1 ? 1 : 0]->cq,
                                   .srq = nullptr,
                                   .send_wr = 64,
                                   .recv_wr = 64,
                                   .send_sge = 2,
                                   .recv_sge = 2,
                                   .inline_data = 0,
                                   .sq_sig_all = 0,
                                   .ops = &g_ops});
        qp[i] = ext->ops->create_qp(ctx, &a);
        need(qp[i] != nullptr, 13);
        sh->qpn[i] = qp[i]->qp->qp_num;
        sh->qp_ext[i] = qp[i];
        softnda_sq_init(&sq[i], &qp[i]->sq_info);
        softnda_rq_init(&rq[i], &qp[i]->rq_info);
    }

    // Blobs after each object's last control operation, as the broker takes them.
    void exportAll() {
        const void *objs[kObjs] = {ctx,  pd,  mr[0], mr[1], mr[2], cq[0], cq[1], qp[0], qp[1], qp[2],
                                   cq_d, srq, qp_d,  qp_e,  xrcd,  xsrq,  qp_i,  qp_t,  mw[0], mw[1]};
        ibv_extend_vdev_obj kinds[kObjs] = {
            IBV_EXTEND_VDEV_OBJ_CONTEXT, IBV_EXTEND_VDEV_OBJ_PD, IBV_EXTEND_VDEV_OBJ_MR,
            IBV_EXTEND_VDEV_OBJ_MR,      IBV_EXTEND_VDEV_OBJ_MR, IBV_EXTEND_VDEV_OBJ_CQ,
            IBV_EXTEND_VDEV_OBJ_CQ,      IBV_EXTEND_VDEV_OBJ_QP, IBV_EXTEND_VDEV_OBJ_QP,
            IBV_EXTEND_VDEV_OBJ_QP,      IBV_EXTEND_VDEV_OBJ_CQ, IBV_EXTEND_VDEV_OBJ_SRQ,
            IBV_EXTEND_VDEV_OBJ_QP,      IBV_EXTEND_VDEV_OBJ_QP, IBV_EXTEND_VDEV_OBJ_XRCD,
            IBV_EXTEND_VDEV_OBJ_SRQ,     IBV_EXTEND_VDEV_OBJ_QP, IBV_EXTEND_VDEV_OBJ_QP,
            IBV_EXTEND_VDEV_OBJ_MW,      IBV_EXTEND_VDEV_OBJ_MW};
        for (int i = 0; i < kObjs; ++i) {
            need(softnda_vdev_ops.export_object(kinds[i], objs[i], &sh->st[i]) == 0, 16);
        }
    }

    // Traffic before the crash, waited for: a WRITE and a SEND A -> B, C's WRITE with a bad rkey,
    // which moves C to ERR after its last control operation, and a SEND D -> D into the first of
    // two receives on the SRQ.
    void trafficBeforeKill() {
        src[0] = 0x1111;
        softnda_sge s;
        post(&sq[0], toDst(sh, SOFTNDA_OP_RDMA_WRITE, 100, &s, 0, 0));
        softnda_sge r{sh->recv, 8, sh->key[2]};
        need(softnda_rq_post(&rq[1], 200, &r, 1) == 0, 17);
        softnda_rq_doorbell(&rq[1]);
        post(&sq[0], wr(SOFTNDA_OP_SEND, 101, &s, 1));
        need(waitCqes(cqs[0], 2).size() == 2 && waitCqes(cqs[1], 1).size() == 1, 18);
        auto bad = toDst(sh, SOFTNDA_OP_RDMA_WRITE, 300, &s, 0, 0);
        bad.rkey = 0xdead00;
        post(&sq[2], bad);
        need(waitCqes(cqs[0], 1).size() == 1, 19);
        for (int i = 0; i < 2; ++i) {
            softnda_sge rr{sh->recv + 1536 + 8u * i, 8, sh->key[2]};
            need(softnda_rq_post(&srq_rq, 7000 + i, &rr, 1) == 0, 54);
        }
        softnda_rq_doorbell(&srq_rq);
        src[190] = 0xd000;
        softnda_sge ds{sh->src + 1520, 8, sh->key[0]};
        post(&sq_d, wr(SOFTNDA_OP_SEND, 7100, &ds, 1));
        need(waitCqes(cqs_d, 2).size() == 2, 55);
        // XRC: two receives on the XRC SRQ, the first taken by I's SEND through T.
        for (int i = 0; i < 2; ++i) {
            softnda_sge rr{sh->recv + 2560 + 8u * i, 8, sh->key[2]};
            need(softnda_rq_post(&xsrq_rq, 9000 + i, &rr, 1) == 0, 64);
        }
        softnda_rq_doorbell(&xsrq_rq);
        src[200] = 0xa000;
        softnda_sge xs{sh->src + 1600, 8, sh->key[0]};
        auto xw = wr(SOFTNDA_OP_SEND, 9100, &xs, 1);
        xw.remote_srqn = sh->srqn;
        post(&sq_i, xw);
        need(waitCqes(cqs_d, 2).size() == 2, 65);
        bindWindows();
    }

    // After the blobs were taken, as a data path binds: the type 1 window through A, the type 2
    // through B (the responder of A's requests, the only QP that may use it). Only the windows'
    // records can tell the successor.
    void bindWindows() {
        const ibv_qp_extend *through[2] = {qp[0], qp[1]};
        const uint64_t at[2] = {kMw1At, kMw2At};
        for (int i = 0; i < 2; ++i) {
            sh->mw_key[i] = incKey(mw[i]->rkey);
            auto b = wr(0, 9500 + i, nullptr, 0);
            softnda_send_wr_set_bind(&b, mw[i]->rkey, sh->mw_key[i], sh->key[1], sh->dst + at[i], kMwLen,
                                     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
            post(&sq[through[i] == qp[0] ? 0 : 1], b);
            auto done = waitCqes(cqs[i], 1);
            need(done.size() == 1 && done[0].status == IBV_WC_SUCCESS && done[0].opcode == IBV_WC_BIND_MW,
                 67);
        }
    }

    // B invalidated the type 2 window (wr 9600) and the process died after the window's record
    // said so but before B's CI, PSN and CQE: B's CI goes back one and the CQE is unwritten. Run
    // again, the invalidation would fail (the window is no longer bound).
    void invalidateThenDieBeforeCi() {
        auto *cq_rec = static_cast<uint32_t *>(cq[1]->cq_info.dbr_pi_va.iov_base);
        uint32_t cq_pi = __atomic_load_n(cq_rec, __ATOMIC_ACQUIRE);
        auto inv = wr(SOFTNDA_OP_LOCAL_INV, 9600, nullptr, 0);
        inv.rkey = sh->mw_key[1];
        post(&sq[1], inv);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (__atomic_load_n(cq_rec, __ATOMIC_ACQUIRE) == cq_pi) {
            need(std::chrono::steady_clock::now() < deadline, 68);
            std::this_thread::yield();
        }
        uint32_t *b = rec(sh->qp_ext[1]);
        __atomic_store_n(b + kWCi, b[kWCi] - 1, __ATOMIC_RELEASE);
        need(b[kWExec] == b[kWCi] + 1, 69);
        auto *e =
            reinterpret_cast<softnda_cqe *>(cqs[1].buf + (cq_pi & (cqs[1].entry_cnt - 1)) * SOFTNDA_CQE_SIZE);
        need(e->wr_id == 9600 && e->status == IBV_WC_SUCCESS, 70);
        e->owner ^= 1;
        __atomic_store_n(cq_rec, cq_pi, __ATOMIC_RELEASE);
    }

    // A SEND the engine had started (exec one ahead of CI) but that never reached its commit
    // point: in queue memory nothing else of it is visible, so the successor runs it.
    void startSendThatDoesNotCommit() {
        softnda_sge rr{sh->recv + 1024, 8, sh->key[2]};
        need(softnda_rq_post(&rq[1], 6100, &rr, 1) == 0, 40);
        softnda_rq_doorbell(&rq[1]);
        src[250] = 0x6000;
        static softnda_sge ss{sh->src + 2000, 8, sh->key[0]};
        postUnrung(&sq[0], wr(SOFTNDA_OP_SEND, 6000, &ss, 1), 41);
        uint32_t *a = rec(sh->qp_ext[0]);
        __atomic_store_n(a + kWExec, a[kWCi] + 1, __ATOMIC_RELEASE);
    }

    // Makes queue memory look as a kill at the worst moments would leave it, deterministically:
    //  - A's FETCH_ADD (wr 5000) took effect at B (B's rq_psn committed) but the process died
    //    before A's CI, PSN and CQE: A's CI and PSN go back one and the CQE is unwritten;
    //  - B's WRITE (wr 5100) finished, but its PSN store was lost: B's PSN goes back one;
    //  - A's WRITE (wr 5200) is posted (pi) but never rung.
    void doctor() {
        auto *cq_rec = static_cast<uint32_t *>(cq[0]->cq_info.dbr_pi_va.iov_base);
        uint32_t cq_pi = __atomic_load_n(cq_rec, __ATOMIC_ACQUIRE);
        softnda_sge fs;
        auto fa = toDst(sh, SOFTNDA_OP_ATOMIC_FETCH_AND_ADD, 5000, &fs, 1600, 1600);
        fa.compare_add = 5;
        post(&sq[0], fa);
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (__atomic_load_n(cq_rec, __ATOMIC_ACQUIRE) == cq_pi) {
            need(std::chrono::steady_clock::now() < deadline, 30);
            std::this_thread::yield();
        }
        uint32_t *a = rec(sh->qp_ext[0]);
        __atomic_store_n(a + kWCi, a[kWCi] - 1, __ATOMIC_RELEASE);
        __atomic_store_n(a + kWSqPsn, a[kWSqPsn] - 1, __ATOMIC_RELEASE);
        need(a[kWExec] == a[kWCi] + 1, 31);
        auto *e =
            reinterpret_cast<softnda_cqe *>(cqs[0].buf + (cq_pi & (cqs[0].entry_cnt - 1)) * SOFTNDA_CQE_SIZE);
        need(e->wr_id == 5000, 32);
        e->owner ^= 1;
        __atomic_store_n(cq_rec, cq_pi, __ATOMIC_RELEASE);

        src[210] = 0x77;
        softnda_sge bs;
        post(&sq[1], toDst(sh, SOFTNDA_OP_RDMA_WRITE, 5100, &bs, 1680, 1680));
        need(waitCqes(cqs[1], 1).size() == 1, 33);
        uint32_t *b = rec(sh->qp_ext[1]);
        __atomic_store_n(b + kWSqPsn, b[kWSqPsn] - 1, __ATOMIC_RELEASE);

        src[220] = 0x88;
        static softnda_sge ws;
        postUnrung(&sq[0], toDst(sh, SOFTNDA_OP_RDMA_WRITE, 5200, &ws, 1760, 1760), 34);
    }

    // Work the new broker must finish, posted and not rung yet: WRITEs of distinct values into
    // distinct words (every other one unsignalled) and SENDs into posted receives.
    void postWorkForTheSuccessor() {
        for (int i = 0; i < kSends; ++i) {
            softnda_sge rr{sh->recv + 64 + 8u * i, 8, sh->key[2]};
            softnda_rq_post(&rq[1], 210 + i, &rr, 1);
        }
        softnda_rq_doorbell(&rq[1]);
        static softnda_sge ws[kWrites + kSends];
        for (int i = 0; i < kWrites; ++i) {
            src[8 + i] = 0xa000 + i;
            auto x = toDst(sh, SOFTNDA_OP_RDMA_WRITE, 1000 + i, &ws[i], 64 + 8u * i, 64 + 8u * i,
                           i % 2 == 0 ? SOFTNDA_WQE_SIGNALED : 0);
            need(softnda_sq_post(&sq[0], &x) == 0, 20);
        }
        for (int i = 0; i < kSends; ++i) {
            src[40 + i] = 0xb000 + i;
            ws[kWrites + i] = softnda_sge{sh->src + 320 + 8u * i, 8, sh->key[0]};
            auto x = wr(SOFTNDA_OP_SEND, 2000 + i, &ws[kWrites + i], 1);
            need(softnda_sq_post(&sq[0], &x) == 0, 21);
        }
    }

    Shared *sh;
    ibv_context *ctx = nullptr;
    ibv_context_extend *ext = nullptr;
    ibv_pd *pd = nullptr;
    ibv_mr *mr[3] = {};
    ibv_cq_extend *cq[2] = {};
    softnda_cq cqs[2] = {};
    ibv_qp_extend *qp[3] = {};
    softnda_sq sq[3] = {};
    softnda_rq rq[3] = {};
    ibv_cq_extend *cq_d = nullptr;
    softnda_cq cqs_d = {};
    ibv_srq_extend *srq = nullptr;
    softnda_rq srq_rq = {};
    ibv_qp_extend *qp_d = nullptr;
    softnda_sq sq_d = {};
    ibv_qp_extend *qp_e = nullptr;
    ibv_xrcd *xrcd = nullptr;
    ibv_srq_extend *xsrq = nullptr;
    softnda_rq xsrq_rq{};
    ibv_qp_extend *qp_i = nullptr, *qp_t = nullptr;
    softnda_sq sq_i{};
    ibv_mw *mw[2] = {};
    uint64_t *src = nullptr;
    int efd = -1, afd = -1;
};

// The old broker. Exits with SIGKILL after handing its fds over, in the middle of the work the
// mode sets up; any other exit status is a failure (the code says which step).
[[noreturn]] void oldBroker(Shared *sh, int sock, int mode) {
    OldBroker old(sh);
    old.makeObjects();
    old.exportAll();
    old.trafficBeforeKill();
    if (mode == kDiedBeforeCommit) {
        old.startSendThatDoesNotCommit();
        handOver(sh, sock, old.efd, old.afd);
    } else if (mode == kDoctored) {
        old.doctor();
        handOver(sh, sock, old.efd, old.afd);
    } else if (mode == kInvalidatedBeforeCi) {
        old.invalidateThenDieBeforeCi();
        handOver(sh, sock, old.efd, old.afd);
    } else {
        old.postWorkForTheSuccessor();
        handOver(sh, sock, old.efd, old.afd);
        // Ring and die: some of this work runs here, the rest in the successor.
        softnda_sq_doorbell(&old.sq[0]);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    kill(getpid(), SIGKILL);
    _exit(23);
}

// The new broker's relocation: the arena at its new address, doorbells through the BAR fd.
struct Reloc {
    Shared *sh;
    int bar_fd;
    std::vector<uintptr_t> db_mapped;  // what relocation returned for doorbells
};
void *relocate(void *arg, uint64_t old, uint64_t len) {
    auto *r = static_cast<Reloc *>(arg);
    if (old >= r->sh->old_base && old + len <= r->sh->old_base + kArenaSize) {
        return g.base + (old - r->sh->old_base);
    }
    uint64_t page = old & ~uint64_t{SOFTNDA_DB_PAGE_SIZE - 1};
    for (int i = 0; i < r->sh->n_db; ++i) {
        if (r->sh->db[i].va == page) {
            void *va = mapDoorbellPage(r->bar_fd, r->sh->db[i].off);
            if (va == nullptr) {
                return nullptr;
            }
            g.db_pages[reinterpret_cast<uintptr_t>(va)] = r->sh->db[i].off;
            auto *p = static_cast<uint8_t *>(va) + (old & (SOFTNDA_DB_PAGE_SIZE - 1));
            r->db_mapped.push_back(reinterpret_cast<uintptr_t>(p));
            return p;
        }
    }
    return nullptr;
}

// Completions by wr_id, each expected to have succeeded (the order two queues finish in is free).
std::map<uint64_t, softnda_cqe> successfulById(const std::vector<softnda_cqe> &done) {
    std::map<uint64_t, softnda_cqe> by_id;
    for (const softnda_cqe &e : done) {
        EXPECT_EQ(e.status, IBV_WC_SUCCESS) << e.wr_id;
        by_id[e.wr_id] = e;
    }
    return by_id;
}

// The successor's side: receive the fds, map everything elsewhere, import, resume.
class SoftndaRestart : public ::testing::Test {
  protected:
    // The old broker runs in a child and dies; this process becomes its successor.
    void restore(int mode) {
        resetConfig();
        fds_before = countFds();
        ASSERT_NO_FATAL_FAILURE(runOldBroker(mode));
        ASSERT_NO_FATAL_FAILURE(moveArena());
        ASSERT_NO_FATAL_FAILURE(importAll());
        for (int i = 0; i < 2; ++i) {
            ASSERT_EQ(softnda_cq_init(&cqs[i], &cq[i]->cq_info), 0);
        }
        src = reinterpret_cast<uint64_t *>(g.base + (sh->src - sh->old_base));
        dst = reinterpret_cast<uint64_t *>(g.base + (sh->dst - sh->old_base));
        recv = reinterpret_cast<uint64_t *>(g.base + (sh->recv - sh->old_base));
    }

    // Forks the old broker over a new arena, takes the fds it hands over and sees it killed.
    void runOldBroker(int mode) {
        g.fd = memfd_create("restart-arena", MFD_CLOEXEC);
        ASSERT_GE(g.fd, 0);
        ASSERT_EQ(ftruncate(g.fd, kArenaSize), 0);
        g.base =
            static_cast<uint8_t *>(mmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0));
        ASSERT_NE(g.base, MAP_FAILED);
        sh = static_cast<Shared *>(
            mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        ASSERT_NE(sh, MAP_FAILED);
        int sp[2];
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp), 0);
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            close(sp[0]);
            oldBroker(sh, sp[1], mode);
        }
        close(sp[1]);
        char cbuf[CMSG_SPACE(sizeof(int) * 16)] = {};
        char one;
        iovec iov{&one, 1};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = cbuf;
        m.msg_controllen = sizeof(cbuf);
        ssize_t got = recvmsg(sp[0], &m, MSG_CMSG_CLOEXEC);
        int status = 0;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        close(sp[0]);
        ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
        ASSERT_EQ(got, 1);
        cmsghdr *c = CMSG_FIRSTHDR(&m);
        ASSERT_NE(c, nullptr);
        std::vector<int> fds((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        std::memcpy(fds.data(), CMSG_DATA(c), fds.size() * sizeof(int));
        size_t k = 0;
        for (auto &st : sh->st) {
            for (uint32_t i = 0; i < st.fd_cnt; ++i) {
                st.fds[i] = fds[k++];
            }
        }
        ASSERT_EQ(k + 2, fds.size());
        efd = fds[k];
        afd = fds[k + 1];
    }

    // The successor's view: the arena at another address (the old mapping goes away) and the
    // relocation that finds everything there, doorbells through a dup of the BAR fd (the BAR fd
    // itself is the context's once imported).
    void moveArena() {
        auto *old_map = g.base;
        g.base =
            static_cast<uint8_t *>(mmap(nullptr, kArenaSize, PROT_READ | PROT_WRITE, MAP_SHARED, g.fd, 0));
        ASSERT_NE(g.base, MAP_FAILED);
        ASSERT_NE(g.base, old_map);
        munmap(old_map, kArenaSize);
        g.db_pages.clear();
        g.live.clear();
        rel = Reloc{sh, -1, {}};
        rel.bar_fd = fcntl(sh->st[kCtx].fds[0], F_DUPFD_CLOEXEC, 0);
        env = ibv_extend_vdev_import{};
        env.device = "softnda0";
        env.relocate = relocate;
        env.arg = &rel;
        env.ops = &g_ops;
    }

    // Every object again, parents first, only while the device is paused.
    void importAll() {
        errno = 0;
        EXPECT_EQ(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_CONTEXT, &sh->st[kCtx], &env), nullptr);
        EXPECT_EQ(errno, EBUSY);
        ASSERT_EQ(softnda_vdev_ops.set_paused("softnda0", 1), 0);
        EXPECT_EQ(softnda_vdev_ops.set_paused("nosuch", 1), -ENODEV);
        ctx = static_cast<ibv_context *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_CONTEXT, &sh->st[kCtx], &env));
        ASSERT_NE(ctx, nullptr) << errno;
        ext = softnda_driver_ops.alloc_context(ctx);
        env.context = ctx;
        pd =
            static_cast<ibv_pd *>(softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_PD, &sh->st[kPd], &env));
        ASSERT_NE(pd, nullptr);
        env.pd = pd;
        for (int i = 0; i < 3; ++i) {
            mr[i] = static_cast<ibv_mr *>(
                softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_MR, &sh->st[kMrSrc + i], &env));
            ASSERT_NE(mr[i], nullptr);
            EXPECT_EQ(mr[i]->lkey, sh->key[i]);
        }
        for (int i = 0; i < 2; ++i) {
            cq[i] = static_cast<ibv_cq_extend *>(
                softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_CQ, &sh->st[kCqA + i], &env));
            ASSERT_NE(cq[i], nullptr) << errno;
        }
        for (int i = 0; i < 3; ++i) {
            env.send_cq = env.recv_cq = cq[i == 1 ? 1 : 0]->cq;
            qp[i] = static_cast<ibv_qp_extend *>(
                softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_QP, &sh->st[kQpA + i], &env));
            ASSERT_NE(qp[i], nullptr) << errno;
            EXPECT_EQ(qp[i]->qp->qp_num, sh->qpn[i]);
        }
        cq_d = static_cast<ibv_cq_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_CQ, &sh->st[kCqD], &env));
        ASSERT_NE(cq_d, nullptr) << errno;
        srq = static_cast<ibv_srq_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_SRQ, &sh->st[kSrq], &env));
        ASSERT_NE(srq, nullptr) << errno;
        env.send_cq = env.recv_cq = cq_d->cq;
        env.srq = srq->srq;
        qp_d = static_cast<ibv_qp_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_QP, &sh->st[kQpD], &env));
        ASSERT_NE(qp_d, nullptr) << errno;
        EXPECT_EQ(qp_d->qp->qp_num, sh->qpn_d);
        env.srq = nullptr;
        qp_e = static_cast<ibv_qp_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_QP, &sh->st[kQpE], &env));
        ASSERT_NE(qp_e, nullptr) << errno;
        EXPECT_EQ(qp_e->qp->qp_num, sh->qpn_e);
        ASSERT_NO_FATAL_FAILURE(importXrc());
        // The windows last, after the QP that bound one: their bindings are taken up at the
        // resume, whatever the order.
        for (int i = 0; i < 2; ++i) {
            mw[i] = static_cast<ibv_mw *>(
                softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_MW, &sh->st[kMw1 + i], &env));
            ASSERT_NE(mw[i], nullptr) << errno;
            EXPECT_EQ(mw[i]->type, i == 0 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
        }
        ASSERT_EQ(softnda_vdev_ops.set_paused("softnda0", 0), 0);
    }

    // The XRC objects: the domain first, then the SRQ (its domain and CQ as parents), the
    // initiator (PD and send CQ) and the target (its domain alone).
    void importXrc() {
        xrcd = static_cast<ibv_xrcd *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_XRCD, &sh->st[kXrcd], &env));
        ASSERT_NE(xrcd, nullptr) << errno;
        env.xrcd = xrcd;
        env.srq_cq = cq_d->cq;
        xsrq = static_cast<ibv_srq_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_SRQ, &sh->st[kXsrq], &env));
        ASSERT_NE(xsrq, nullptr) << errno;
        env.send_cq = cq_d->cq;
        env.recv_cq = nullptr;
        qp_i = static_cast<ibv_qp_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_QP, &sh->st[kQpI], &env));
        ASSERT_NE(qp_i, nullptr) << errno;
        env.send_cq = nullptr;
        env.pd = nullptr;
        qp_t = static_cast<ibv_qp_extend *>(
            softnda_vdev_ops.import_object(IBV_EXTEND_VDEV_OBJ_QP, &sh->st[kQpT], &env));
        ASSERT_NE(qp_t, nullptr) << errno;
        env.pd = pd;
        env.xrcd = nullptr;
        env.srq_cq = nullptr;
    }

    // Destroys every imported object and checks that each gave back what it used.
    void teardown() {
        // Destroying imported objects frees the relocated memory and doorbells.
        std::set<uintptr_t> rings;
        for (auto *q : qp) {
            rings.insert(q->sq_info.qbuf.base);
            rings.insert(q->rq_info.qbuf.base);
        }
        for (auto *x : cq) {
            rings.insert(x->cq_info.qbuf.base);
        }
        rings.insert(qp_d->sq_info.qbuf.base);  // no RQ: it receives from the SRQ
        rings.insert(srq->srq_info.qbuf.base);
        rings.insert(cq_d->cq_info.qbuf.base);
        rings.insert(qp_e->sq_info.qbuf.base);
        rings.insert(qp_e->rq_info.qbuf.base);
        rings.insert(xsrq->srq_info.qbuf.base);
        rings.insert(qp_i->sq_info.qbuf.base);
        rings.insert(qp_t->sq_info.qbuf.base);
        g.freed.clear();
        g.unmapped.clear();
        for (auto *w : mw) {
            EXPECT_EQ(softnda_vdev_ops.dealloc_mw(w), 0);
        }
        for (auto *q : qp) {
            EXPECT_EQ(ext->ops->destroy_qp(q), 0);
        }
        EXPECT_EQ(ext->ops->destroy_qp(qp_d), 0);
        EXPECT_EQ(ext->ops->destroy_qp(qp_e), 0);
        EXPECT_EQ(ext->ops->destroy_qp(qp_t), 0);
        EXPECT_EQ(ext->ops->destroy_qp(qp_i), 0);
        EXPECT_EQ(ext->ops->destroy_srq(xsrq), 0);
        EXPECT_EQ(softnda_vdev_ops.close_xrcd(xrcd), 0);
        EXPECT_EQ(ext->ops->destroy_srq(srq), 0);
        EXPECT_EQ(ext->ops->destroy_cq(cq_d), 0);
        for (auto *x : cq) {
            EXPECT_EQ(ext->ops->destroy_cq(x), 0);
        }
        for (auto *x : mr) {
            EXPECT_EQ(softnda_vdev_ops.dereg_mr(x), 0);
        }
        EXPECT_EQ(softnda_vdev_ops.dealloc_pd(pd), 0);
        softnda_driver_ops.free_context(ext);
        EXPECT_EQ(softnda_vdev_ops.close_device(ctx), 0);
        EXPECT_EQ(std::set<uintptr_t>(g.freed.begin(), g.freed.end()), rings);
        EXPECT_EQ(g.freed.size(), rings.size());
        std::sort(rel.db_mapped.begin(), rel.db_mapped.end());
        std::sort(g.unmapped.begin(), g.unmapped.end());
        EXPECT_EQ(g.unmapped, rel.db_mapped);
        EXPECT_TRUE(g.db_pages.empty());

        close(efd);
        close(afd);
        close(rel.bar_fd);
        munmap(g.base, kArenaSize);
        close(g.fd);
        munmap(sh, sizeof(Shared));
        EXPECT_EQ(countFds(), fds_before);  // bar_fd and the event fd dups went with their objects
    }

    int fds_before = 0;
    Shared *sh = nullptr;
    int efd = -1, afd = -1;
    Reloc rel{};
    ibv_extend_vdev_import env{};
    ibv_context *ctx = nullptr;
    ibv_context_extend *ext = nullptr;
    ibv_pd *pd = nullptr;
    ibv_mr *mr[3] = {};
    ibv_cq_extend *cq[2] = {};
    ibv_qp_extend *qp[3] = {};
    softnda_cq cqs[2] = {};
    ibv_cq_extend *cq_d = nullptr;
    ibv_srq_extend *srq = nullptr;
    ibv_qp_extend *qp_d = nullptr;
    ibv_qp_extend *qp_e = nullptr;
    ibv_xrcd *xrcd = nullptr;
    ibv_srq_extend *xsrq = nullptr;
    softnda_rq xsrq_rq{};
    ibv_qp_extend *qp_i = nullptr, *qp_t = nullptr;
    softnda_sq sq_i{};
    ibv_mw *mw[2] = {};
    uint64_t *src = nullptr, *dst = nullptr, *recv = nullptr;
};

TEST_F(SoftndaRestart, QueuesCarryOnInTheSuccessorAfterAKill) {
    restore(kNormal);
    ASSERT_FALSE(HasFatalFailure());
    // Exactly once: every signalled WRITE and every SEND of the work posted before the kill
    // completes once (the child polled nothing after posting it), the data is there, and B got
    // each SEND once, in order.
    auto sent = waitCqes(cqs[0], kWrites / 2 + kSends);
    std::map<uint64_t, int> seen;
    for (auto &e : sent) {
        EXPECT_EQ(e.status, IBV_WC_SUCCESS) << e.wr_id;
        seen[e.wr_id]++;
    }
    for (int i = 0; i < kWrites; i += 2) {
        EXPECT_EQ(seen[1000 + i], 1) << i;
    }
    for (int i = 0; i < kSends; ++i) {
        EXPECT_EQ(seen[2000 + i], 1) << i;
    }
    auto recvd = waitCqes(cqs[1], kSends);
    ASSERT_EQ(recvd.size(), static_cast<size_t>(kSends));
    for (int i = 0; i < kSends; ++i) {
        EXPECT_EQ(recvd[i].wr_id, 210u + i);
        EXPECT_EQ(recvd[i].src_qp, sh->qpn[0]);
    }
    for (int i = 0; i < kWrites; ++i) {
        EXPECT_EQ(dst[8 + i], 0xa000u + i) << i;
    }
    for (int i = 0; i < kSends; ++i) {
        EXPECT_EQ(recv[8 + i], 0xb000u + i) << i;
    }
    softnda_cqe extra{};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(softnda_cq_poll(&cqs[0], &extra, 1), 0) << "a completion twice: " << extra.wr_id;

    // The PSNs continued: 2 WQEs before, 20 after; C stayed in ERR.
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[0]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(a.sq_psn, 2u + kWrites + kSends);
    EXPECT_EQ(a.dest_qp_num, sh->qpn[1]);
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[1]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.rq_psn, 2u + kWrites + kSends);
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[2]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_ERR);

    // Both directions work on: READ, atomic and SEND from B to A, with B's CQ event fd armed.
    softnda_sq sqA, sqB;
    softnda_rq rqA;
    ASSERT_EQ(softnda_sq_init(&sqA, &qp[0]->sq_info), 0);
    ASSERT_EQ(softnda_sq_init(&sqB, &qp[1]->sq_info), 0);
    ASSERT_EQ(softnda_rq_init(&rqA, &qp[0]->rq_info), 0);
    uint64_t ev;
    while (read(efd, &ev, 8) == 8) {
    }
    __atomic_store_n(reinterpret_cast<uint32_t *>(cq[1]->cq_info.dbr_pi_va.iov_base) + 2, 1u,
                     __ATOMIC_RELEASE);
    dst[100] = 41;
    softnda_sge rs;
    post(&sqB, toDst(sh, SOFTNDA_OP_RDMA_READ, 3000, &rs, 800, 800));  // B reads A's src: both in one PD
    softnda_sge fs;
    auto fa = toDst(sh, SOFTNDA_OP_ATOMIC_FETCH_AND_ADD, 3001, &fs, 808, 800);
    fa.compare_add = 1;
    post(&sqB, fa);
    softnda_sge ar{sh->recv + 512, 8, sh->key[2]};
    ASSERT_EQ(softnda_rq_post(&rqA, 4000, &ar, 1), 0);
    softnda_rq_doorbell(&rqA);
    src[120] = 0x5e5e;
    softnda_sge ss{sh->src + 960, 8, sh->key[0]};
    post(&sqB, wr(SOFTNDA_OP_SEND, 3002, &ss, 1));
    auto bdone = waitCqes(cqs[1], 3);
    ASSERT_EQ(bdone.size(), 3u);
    for (auto &e : bdone) {
        EXPECT_EQ(e.status, IBV_WC_SUCCESS) << e.wr_id;
    }
    EXPECT_EQ(src[100], 41u);
    EXPECT_EQ(src[101], 41u);
    EXPECT_EQ(dst[100], 42u);
    auto arecv = waitCqes(cqs[0], 1);
    ASSERT_EQ(arecv.size(), 1u);
    EXPECT_EQ(arecv[0].wr_id, 4000u);
    EXPECT_EQ(recv[64], 0x5e5eu);
    ASSERT_EQ(read(efd, &ev, 8), 8);  // the imported dup of the child's eventfd signalled
    EXPECT_GE(ev, 1u);
    // A WRITE A -> B after the restart.
    src[130] = 77;
    softnda_sge w2;
    post(&sqA, toDst(sh, SOFTNDA_OP_RDMA_WRITE, 3003, &w2, 1040, 1040));
    ASSERT_EQ(waitCqes(cqs[0], 1).size(), 1u);
    EXPECT_EQ(dst[130], 77u);

    // New objects do not collide with imported ones.
    auto na = ibvx::qpInitAttr({.pd = pd,
                                .send_cq = cq[0]->cq,
                                .recv_cq = cq[0]->cq,
                                .srq = nullptr,
                                .send_wr = 4,
                                .recv_wr = 4,
                                .send_sge = 1,
                                .recv_sge = 1,
                                .inline_data = 0,
                                .sq_sig_all = 0,
                                .ops = &g_ops});
    ibv_qp_extend *nq = ext->ops->create_qp(ctx, &na);
    ASSERT_NE(nq, nullptr);
    for (uint32_t q : sh->qpn) {
        EXPECT_NE(nq->qp->qp_num, q);
    }
    ibv_mr *nm = softnda_vdev_ops.reg_mr(pd, src, 64, reinterpret_cast<uintptr_t>(src), kAllAccess);
    ASSERT_NE(nm, nullptr);
    for (uint32_t key : sh->key) {
        EXPECT_NE(nm->lkey, key);
    }
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(nm), 0);
    EXPECT_EQ(ext->ops->destroy_qp(nq), 0);

    teardown();
}

// An SRQ and the QP that receives from it come back as they were: the receive the old process
// left on the SRQ takes the next SEND, the one it consumed is not taken again.
TEST_F(SoftndaRestart, AnSrqAndTheQpOnItCarryOn) {
    restore(kNormal);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(qp_d->rq_info.qbuf.base, 0u);
    softnda_sq sqD;
    softnda_cq cqD;
    ASSERT_EQ(softnda_sq_init(&sqD, &qp_d->sq_info), 0);
    ASSERT_EQ(softnda_cq_init(&cqD, &cq_d->cq_info), 0);
    EXPECT_EQ(cqD.entry_size, SOFTNDA_CQE_TS_SIZE);  // the timed CQ stays timed, resized and restored
    src[191] = 0xd001;
    softnda_sge ds{sh->src + 1528, 8, sh->key[0]};
    post(&sqD, wr(SOFTNDA_OP_SEND, 7101, &ds, 1));
    auto done = waitCqes(cqD, 2);
    ASSERT_EQ(done.size(), 2u);
    std::map<uint64_t, softnda_cqe> by_id = successfulById(done);
    ASSERT_EQ(by_id.count(7101), 1u);
    ASSERT_EQ(by_id.count(7001), 1u);
    EXPECT_EQ(by_id[7001].opcode, IBV_WC_RECV);
    EXPECT_EQ(by_id[7001].byte_len, 8u);
    EXPECT_EQ(by_id[7001].src_qp, sh->qpn_d);
    EXPECT_EQ(recv[192], 0xd000u);  // the SEND before the kill, in the first receive
    EXPECT_EQ(recv[193], 0xd001u);
    EXPECT_TRUE(staysEmpty(cqD));
    teardown();
}

// XRC comes back whole (SPEC.md §14, §10): the SRQ keeps its number and the receive the
// SEND before the kill took; the initiator's next SEND lands in the SRQ's second receive, through
// the target, with the target's QPN in the completion.
TEST_F(SoftndaRestart, AnXrcInitiatorTargetAndSrqCarryOn) {
    restore(kNormal);
    ASSERT_FALSE(HasFatalFailure());
    uint32_t srqn = 0;
    ASSERT_EQ(softnda_vdev_ops.get_srq_num(xsrq->srq, &srqn), 0);
    EXPECT_EQ(srqn, sh->srqn);
    EXPECT_EQ(qp_i->qp->qp_num, sh->qpn_i);
    EXPECT_EQ(qp_t->qp->qp_num, sh->qpn_t);
    EXPECT_EQ(qp_t->qp->qp_type, IBV_QPT_XRC_RECV);
    EXPECT_EQ(recv[2560 / 8], 0xa000u);
    softnda_sq sqI;
    softnda_cq cqD;
    ASSERT_EQ(softnda_sq_init_xrc(&sqI, &qp_i->sq_info), 0);
    ASSERT_EQ(softnda_cq_init(&cqD, &cq_d->cq_info), 0);
    src[201] = 0xa001;
    softnda_sge xs{sh->src + 1608, 8, sh->key[0]};
    auto w = wr(SOFTNDA_OP_SEND, 9101, &xs, 1);
    w.remote_srqn = sh->srqn;
    ASSERT_EQ(postAndRing(&sqI, w), 0);
    auto done = waitCqes(cqD, 2);
    std::map<uint64_t, softnda_cqe> by_id = successfulById(done);
    ASSERT_EQ(by_id.count(9101), 1u);
    ASSERT_EQ(by_id.count(9001), 1u);
    EXPECT_EQ(by_id[9001].qp_num, sh->qpn_t);
    EXPECT_EQ(by_id[9001].src_qp, sh->qpn_i);
    EXPECT_EQ(recv[2568 / 8], 0xa001u);
    EXPECT_TRUE(staysEmpty(cqD));
    teardown();
}

// A UD QP comes back as UD, in RTS, with its Q_Key and its multicast group: a datagram to
// itself with that Q_Key arrives behind its GRH (an RC QP, or a lost Q_Key, would not take it),
// and so does one to the group, with the group's GID.
TEST_F(SoftndaRestart, AUdQpKeepsItsTransportQkeyAndGroup) {
    restore(kNormal);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_EQ(qp_e->qp->qp_type, IBV_QPT_UD);
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp_e->qp, &a, IBV_QP_STATE | IBV_QP_QKEY, &ia), 0);
    EXPECT_EQ(a.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(a.qkey, kUdQkey);
    EXPECT_EQ(ia.qp_type, IBV_QPT_UD);
    softnda_sq sqE;
    softnda_rq rqE;
    softnda_cq cqD;
    ASSERT_EQ(softnda_sq_init(&sqE, &qp_e->sq_info), 0);
    ASSERT_EQ(softnda_rq_init(&rqE, &qp_e->rq_info), 0);
    ASSERT_EQ(softnda_cq_init(&cqD, &cq_d->cq_info), 0);
    EXPECT_EQ(cqD.entry_cnt, 128u);  // as resized before the export
    softnda_sge r{sh->recv + 2048, 64, sh->key[2]};
    ASSERT_EQ(softnda_rq_post(&rqE, 8100, &r, 1), 0);
    softnda_rq_doorbell(&rqE);
    src[300] = 0xe0e0;
    softnda_sge s{sh->src + 2400, 8, sh->key[0]};
    ibv_port_attr port{};
    ASSERT_EQ(softnda_vdev_ops.query_port(ctx, 1, &port), 0);
    auto w = wr(SOFTNDA_OP_SEND, 8000, &s, 1);
    softnda_send_wr_set_ud(&w, sh->qpn_e, kUdQkey, port.lid);
    ASSERT_EQ(postAndRing(&sqE, w), 0);
    auto done = waitCqes(cqD, 2);
    ASSERT_EQ(done.size(), 2u);
    std::map<uint64_t, softnda_cqe> by_id = successfulById(done);
    ASSERT_EQ(by_id.count(8100), 1u);
    EXPECT_EQ(by_id[8100].byte_len, SOFTNDA_GRH_SIZE + 8);
    EXPECT_NE(by_id[8100].flags & SOFTNDA_CQE_GRH, 0);
    EXPECT_EQ(by_id[8100].src_qp, sh->qpn_e);
    EXPECT_EQ(recv[(2048 + SOFTNDA_GRH_SIZE) / 8], 0xe0e0u);
    softnda_sge r2{sh->recv + 2048 + 64, 64, sh->key[2]};
    ASSERT_EQ(softnda_rq_post(&rqE, 8101, &r2, 1), 0);
    softnda_rq_doorbell(&rqE);
    auto m = wr(SOFTNDA_OP_SEND, 8001, &s, 1);
    softnda_send_wr_set_ud(&m, 0xffffff, kUdQkey, kUdMlid);
    ASSERT_EQ(postAndRing(&sqE, m), 0);
    by_id = successfulById(waitCqes(cqD, 2));
    ASSERT_EQ(by_id.count(8101), 1u);
    const ibv_gid mgid = udGroup();
    EXPECT_EQ(std::memcmp(reinterpret_cast<const uint8_t *>(recv) + 2048 + 64 + 24, mgid.raw, 16), 0);
    teardown();
}

// A WRITE of value through rkey at offset `at` of the destination, from A (B responds); its
// completion status.
uint8_t writeThrough(softnda_cq &cq, ibv_qp_extend *a, const Shared *sh, uint64_t *src, uint32_t rkey,
                     uint64_t at, uint64_t value, uint64_t id) {
    softnda_sq sqA;
    EXPECT_EQ(softnda_sq_init(&sqA, &a->sq_info), 0);
    src[500] = value;
    softnda_sge s{sh->src + 4000, 8, sh->key[0]};
    auto w = wr(SOFTNDA_OP_RDMA_WRITE, id, &s, 1);
    w.remote_addr = sh->dst + at;
    w.rkey = rkey;
    EXPECT_EQ(postAndRing(&sqA, w), 0);
    auto done = waitCqes(cq, 1);
    EXPECT_EQ(done.size(), 1u);
    return done.empty() ? 0xff : done[0].status;
}

// Windows bound by the data path after the blobs were taken come back bound (SPEC.md §16): a
// WRITE through each lands, and the MR under them is busy. Blobs alone would bring them back
// unbound, and both WRITEs would fail.
TEST_F(SoftndaRestart, WindowsBoundAfterTheLastBlobKeepTheirBindings) {
    restore(kNormal);
    ASSERT_FALSE(HasFatalFailure());
    (void)waitCqes(cqs[0], kWrites / 2 + kSends);  // the work the test above checks
    (void)waitCqes(cqs[1], kSends);
    EXPECT_EQ(writeThrough(cqs[0], qp[0], sh, src, sh->mw_key[1], kMw2At + 8, 0x2222, 9700), IBV_WC_SUCCESS);
    EXPECT_EQ(dst[(kMw2At + 8) / 8], 0x2222u);
    EXPECT_EQ(writeThrough(cqs[0], qp[0], sh, src, sh->mw_key[0], kMw1At + 16, 0x1111, 9701), IBV_WC_SUCCESS);
    EXPECT_EQ(dst[(kMw1At + 16) / 8], 0x1111u);
    EXPECT_EQ(softnda_vdev_ops.dereg_mr(mr[1]), -EBUSY);
    teardown();
}

// An invalidation that took effect before the kill but not its CI is retired, not run again
// (which would fail: the window is no longer bound): B completes it once, SUCCESS, and the
// window is free, so B can bind it again.
TEST_F(SoftndaRestart, AnInvalidationRecordedBeforeTheKillIsRetiredNotRunAgain) {
    restore(kInvalidatedBeforeCi);
    ASSERT_FALSE(HasFatalFailure());
    auto done = waitCqes(cqs[1], 1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].wr_id, 9600u);
    EXPECT_EQ(done[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(done[0].opcode, IBV_WC_LOCAL_INV);
    EXPECT_TRUE(staysEmpty(cqs[1]));
    softnda_sq sqB;
    ASSERT_EQ(softnda_sq_init(&sqB, &qp[1]->sq_info), 0);
    auto b = wr(0, 9601, nullptr, 0);
    const uint32_t key = incKey(sh->mw_key[1]);
    softnda_send_wr_set_bind(&b, sh->mw_key[1], key, sh->key[1], sh->dst + kMw2At, kMwLen,
                             IBV_ACCESS_REMOTE_WRITE);
    ASSERT_EQ(postAndRing(&sqB, b), 0);
    auto bound = waitCqes(cqs[1], 1);
    ASSERT_EQ(bound.size(), 1u);
    EXPECT_EQ(bound[0].status, IBV_WC_SUCCESS) << "a type 2 window binds only when free";
    EXPECT_EQ(writeThrough(cqs[0], qp[0], sh, src, key, kMw2At, 0x3333, 9702), IBV_WC_SUCCESS);
    EXPECT_EQ(dst[kMw2At / 8], 0x3333u);
    teardown();
}

// The worst moments of a kill, made deterministic (doctor() above): a WQE that took effect at
// the responder but not at the requester is retired without running again (an atomic applied
// once, its CQE once), a lost PSN store is repaired from the peer, and work posted but never rung
// runs after the resume.
TEST_F(SoftndaRestart, AWqeCommittedAtTheResponderIsRetiredNotRunAgain) {
    restore(kDoctored);
    ASSERT_FALSE(HasFatalFailure());
    auto done = waitCqes(cqs[0], 2);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].wr_id, 5000u);
    EXPECT_EQ(done[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(done[0].opcode, IBV_WC_FETCH_ADD);
    EXPECT_EQ(done[0].byte_len, 8u);
    EXPECT_EQ(done[1].wr_id, 5200u);
    EXPECT_EQ(done[1].status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst[200], 5u);  // added once
    EXPECT_EQ(dst[220], 0x88u);
    softnda_cqe extra{};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(softnda_cq_poll(&cqs[0], &extra, 1), 0) << "a completion twice: " << extra.wr_id;
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[0]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.sq_psn, 4u);  // WRITE, SEND, FETCH_ADD, WRITE
    // B's next WRITE uses the repaired PSN: A's responder expects 1, not the lost 0.
    softnda_sq sqB;
    ASSERT_EQ(softnda_sq_init(&sqB, &qp[1]->sq_info), 0);
    src[230] = 0x99;
    softnda_sge bs;
    post(&sqB, toDst(sh, SOFTNDA_OP_RDMA_WRITE, 5101, &bs, 1840, 1840));
    auto b = waitCqes(cqs[1], 1);
    ASSERT_EQ(b.size(), 1u);
    EXPECT_EQ(b[0].wr_id, 5101u);
    EXPECT_EQ(b[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst[230], 0x99u);
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[1]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.sq_psn, 2u);
    EXPECT_EQ(a.rq_psn, 4u);
    teardown();
}

// The other side of the same question: a WQE that started but did not commit runs (once).
TEST_F(SoftndaRestart, AWqeThatDidNotCommitRunsOnce) {
    restore(kDiedBeforeCommit);
    ASSERT_FALSE(HasFatalFailure());
    auto sent = waitCqes(cqs[0], 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].wr_id, 6000u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
    auto got = waitCqes(cqs[1], 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].wr_id, 6100u);
    EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(recv[128], 0x6000u);
    softnda_cqe extra{};
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(softnda_cq_poll(&cqs[0], &extra, 1), 0) << extra.wr_id;
    EXPECT_EQ(softnda_cq_poll(&cqs[1], &extra, 1), 0) << extra.wr_id;
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    ASSERT_EQ(softnda_vdev_ops.query_qp(qp[1]->qp, &a, IBV_QP_STATE, &ia), 0);
    EXPECT_EQ(a.rq_psn, 3u);
    teardown();
}

// Relocation in one process: only the exact ranges the test knows map (to themselves).
struct Known {
    std::map<uint64_t, uint64_t> ranges;  // old address -> length
};
void *knownOnly(void *arg, uint64_t old, uint64_t len) {
    auto *k = static_cast<Known *>(arg);
    auto it = k->ranges.find(old);
    return it != k->ranges.end() && it->second == len ? reinterpret_cast<void *>(old) : nullptr;
}

class SoftndaRestartBlob : public SoftndaTest {
  protected:
    void TearDown() override {
        EXPECT_EQ(softnda_vdev_ops.set_paused("softnda0", 0), 0);
        SoftndaTest::TearDown();
    }
};

// Garbage never imports: truncated, foreign, other-version or other-kind blobs, bodies of noise,
// missing relocations and fd counts that do not match answer EINVAL, and leave no fd or memory.
TEST_F(SoftndaRestartBlob, CorruptedTruncatedAndForeignBlobsAnswerEinval) {
    auto cq = makeCq(16);
    auto qp = makeQp(cq, cq);
    uint64_t buf[8];
    ibv_mr *mr = reg(buf, sizeof(buf));
    struct Item {
        ibv_extend_vdev_obj kind;
        const void *obj;
        ibv_extend_vdev_state st;
    };
    std::vector<Item> items = {{IBV_EXTEND_VDEV_OBJ_CONTEXT, ctx_, {}},
                               {IBV_EXTEND_VDEV_OBJ_PD, pd_, {}},
                               {IBV_EXTEND_VDEV_OBJ_MR, mr, {}},
                               {IBV_EXTEND_VDEV_OBJ_CQ, cq.ext, {}},
                               {IBV_EXTEND_VDEV_OBJ_QP, qp.ext, {}}};
    for (auto &it : items) {
        ASSERT_EQ(softnda_vdev_ops.export_object(it.kind, it.obj, &it.st), 0) << it.kind;
        ASSERT_GE(it.st.len, 16u);
    }
    // Not one of ours / wrong kind for the pointer.
    ibv_extend_vdev_state junk{};
    EXPECT_EQ(softnda_vdev_ops.export_object(IBV_EXTEND_VDEV_OBJ_QP, nullptr, &junk), -EINVAL);
    EXPECT_EQ(softnda_vdev_ops.export_object(static_cast<ibv_extend_vdev_obj>(99), pd_, &junk), -EINVAL);

    ibv_extend_vdev_import env{};
    Known known;
    env.device = "softnda0";
    env.context = ctx_;
    env.pd = pd_;
    env.send_cq = env.recv_cq = cq.ext->cq;
    env.ops = arena().ops();
    env.relocate = knownOnly;
    env.arg = &known;
    int fds = countFds();
    size_t allocs = arena().liveAllocs();

    // Not paused: EBUSY, whatever the blob.
    for (auto &it : items) {
        errno = 0;
        EXPECT_EQ(softnda_vdev_ops.import_object(it.kind, &it.st, &env), nullptr);
        EXPECT_EQ(errno, EBUSY) << it.kind;
    }
    ASSERT_EQ(softnda_vdev_ops.set_paused("softnda0", 1), 0);
    auto refuse = [&](ibv_extend_vdev_obj kind, const ibv_extend_vdev_state &st, const char *what) {
        errno = 0;
        void *o = softnda_vdev_ops.import_object(kind, &st, &env);
        EXPECT_EQ(o, nullptr) << what << " kind " << kind;
        EXPECT_EQ(errno, EINVAL) << what << " kind " << kind;
    };
    uint32_t seed = 12345;
    auto rnd = [&seed] {
        seed = seed * 1103515245u + 12345u;
        return seed >> 8;
    };
    for (auto &it : items) {
        ibv_extend_vdev_state s = it.st;
        for (uint32_t len : {0u, 1u, 15u, 16u, it.st.len - 1, it.st.len + 1}) {
            s = it.st;
            s.len = len;
            refuse(it.kind, s, "length");
        }
        s = it.st;
        s.data[0] ^= 1;
        refuse(it.kind, s, "magic");
        s = it.st;
        s.data[4] = 2;
        refuse(it.kind, s, "version");
        s = it.st;
        s.len = 5000;
        refuse(it.kind, s, "beyond the buffer");
        s = it.st;
        s.fd_cnt = it.st.fd_cnt + 1;
        refuse(it.kind, s, "fd count");
        for (auto &other : items) {
            if (other.kind != it.kind) {
                refuse(other.kind, it.st, "another kind's blob");
            }
        }
        // Noise behind a valid header.
        for (int round = 0; round < 200; ++round) {
            s = it.st;
            for (uint32_t i = 16; i < s.len; ++i) {
                s.data[i] = static_cast<uint8_t>(rnd());
            }
            refuse(it.kind, s, "noise");
        }
    }
    // No relocation for the memory: EINVAL (the blobs are otherwise good ones).
    refuse(IBV_EXTEND_VDEV_OBJ_MR, items[2].st, "MR without relocation");
    refuse(IBV_EXTEND_VDEV_OBJ_CQ, items[3].st, "CQ without relocation");
    refuse(IBV_EXTEND_VDEV_OBJ_QP, items[4].st, "QP without relocation");
    env.relocate = nullptr;
    refuse(IBV_EXTEND_VDEV_OBJ_PD, items[1].st, "no relocate callback");
    // A QP whose number is in use here, and MR whose key is: refused even with relocation.
    env.relocate = knownOnly;
    known.ranges[reinterpret_cast<uintptr_t>(buf)] = sizeof(buf);
    refuse(IBV_EXTEND_VDEV_OBJ_MR, items[2].st, "MR key in use");
    for (auto &it : items) {
        for (uint32_t i = 0; i < it.st.fd_cnt; ++i) {
            close(it.st.fds[i]);
        }
    }
    EXPECT_EQ(countFds(), fds - static_cast<int>(items[0].st.fd_cnt));
    EXPECT_EQ(arena().liveAllocs(), allocs);
}

}  // namespace
}  // namespace softnda_test
