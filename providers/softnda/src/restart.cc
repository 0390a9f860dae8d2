// Restart with live queues (vdev ABI V4, SPEC.md §10): one versioned blob per object, taken after
// each control operation, and the import that makes the object again in a new process from the
// blob, the object's queue memory (relocated) and the words the engine keeps in that memory.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/fd_kind.h"
#include "providers/softnda/src/netdev.h"
#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

constexpr uint32_t kBlobMagic = 0x41444e53;  // "SNDA"
constexpr uint16_t kBlobVersion = 1;

struct BlobHdr {
    uint32_t magic;
    uint16_t version;
    uint16_t kind;
    uint32_t size;  // header included
    uint32_t resv;
};

struct SlotBlob {
    uint64_t mapped;  // what db_mmap returned in the old process
    uint32_t page_no;
    uint8_t index;
    uint8_t ub_res;
    uint16_t resv;
};

struct RingBlob {
    uint64_t buf;  // what ops->alloc returned in the old process
    uint32_t cnt;
    uint32_t stride;
};

struct CtxBlob {
    uint32_t flags;  // kCtxBar, kCtxAsync, kCtxWindows: which fds follow, in that order
    uint32_t bar_pages;
    uint64_t stride;
    // then bar_pages u32 device page numbers, page i at offset i * stride of the BAR fd
};
constexpr uint32_t kCtxBar = 1, kCtxAsync = 2, kCtxWindows = 4;

struct PdBlob {
    uint32_t handle;
    uint32_t resv;
};

struct MrBlob {
    uint64_t addr;
    uint64_t iova;
    uint64_t len;
    uint32_t key;
    int32_t access;
    uint32_t handle;
    uint32_t on_dm;  // 1: a region on device memory, addr inside the importer's env->dm (SPEC.md §17)
};

// An allocation of device memory (SPEC.md §17): its range of the region and its memory.
struct DmBlob {
    uint64_t mem;  // what ops->alloc returned in the old process
    uint64_t offset;
    uint64_t len;
    uint64_t asked;
};

struct CqBlob {
    RingBlob ring;
    SlotBlob db;
    uint64_t cq_context;
    uint32_t handle;
    uint32_t has_event_fd;  // fds[0]
};

struct SrqBlob {
    RingBlob ring;
    SlotBlob db;
    uint64_t srq_context;
    uint32_t max_sge;
    uint32_t handle;
};

// An XRC SRQ's blob: a basic SRQ's, then its number (SPEC.md §14).
struct XrcSrqBlob {
    SrqBlob srq;
    uint32_t srqn;
    uint32_t resv;
};

struct XrcdBlob {
    uint32_t resv[2];
};

// A memory window (SPEC.md §16): what alloc_mw made; its binding is in its context's window
// file, at record `rec`.
struct MwBlob {
    uint32_t rkey;  // as allocated (bits 8-30: its slot)
    uint32_t type;  // enum ibv_mw_type
    uint32_t handle;
    uint32_t rec;
};

struct QpBlob {
    uint32_t qpn;
    uint32_t handle;
    uint64_t qp_context;
    RingBlob sq, rq;
    SlotBlob sq_db, rq_db;
    uint32_t has_rq;
    uint32_t rq_max_sge;
    ibv_qp_cap cap;
    int32_t sq_sig_all;
    // QpAttrs as set by the control path (the live PSNs and state are in the SQ record)
    uint32_t dest_qpn, sq_psn, rq_psn;
    int32_t access;
    uint32_t path_mtu;
    uint16_t pkey_index;
    uint8_t port, timeout, retry_cnt, rnr_retry, min_rnr_timer, max_rd_atomic, max_dest_rd_atomic;
    uint8_t has_ext, feature_set;
    uint8_t qp_type;  // enum ibv_qp_type; 0 (a process that served RC only) reads as RC
    ibv_ah_attr ah;
    uint32_t udp_src_port, lb_mode, lag_port;
    ibv_hyroce_feature feature;
    ibv_mpath_config mpath;
    ibv_ar_config ar;
    ibv_sack_config sack;
};
// A UD QP's blob ends with its multicast groups (SPEC.md §11.3), in joining order.
struct McastBlob {
    uint8_t gid[16];
    uint16_t lid;
    uint16_t resv;
};
static_assert(sizeof(BlobHdr) + sizeof(QpBlob) + kMaxQpGroups * sizeof(McastBlob) <=
                  IBV_EXTEND_VDEV_STATE_MAX,
              "a QP's blob fits, with its groups");

constexpr uint32_t kMaxCtxPages =
    (IBV_EXTEND_VDEV_STATE_MAX - sizeof(BlobHdr) - sizeof(CtxBlob)) / sizeof(uint32_t);

template <typename T>
void put(ibv_extend_vdev_state *out, ibv_extend_vdev_obj kind, const T &body, const void *tail = nullptr,
         size_t tail_len = 0) {
    BlobHdr h{kBlobMagic, kBlobVersion, static_cast<uint16_t>(kind),
              static_cast<uint32_t>(sizeof(h) + sizeof(body) + tail_len), 0};
    std::memcpy(out->data, &h, sizeof(h));
    std::memcpy(out->data + sizeof(h), &body, sizeof(body));
    if (tail_len != 0) {
        std::memcpy(out->data + sizeof(h) + sizeof(body), tail, tail_len);
    }
    out->len = h.size;
}

// Dups fd into the next slot of out; false (and errno) on failure.
bool putFd(ibv_extend_vdev_state *out, int fd) {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) {
        return false;
    }
    out->fds[out->fd_cnt++] = d;
    return true;
}

void closeFds(ibv_extend_vdev_state *out) {
    for (uint32_t i = 0; i < out->fd_cnt; ++i) {
        ::close(out->fds[i]);
        out->fds[i] = -1;
    }
    out->fd_cnt = 0;
}

SlotBlob slotBlob(const DbSlot &s) {
    return SlotBlob{reinterpret_cast<uintptr_t>(s.mapped), s.page != nullptr ? s.page->page_no : 0, s.index,
                    static_cast<uint8_t>(s.ub_res ? 1 : 0), 0};
}

RingBlob ringBlob(const Ring &r) {
    return RingBlob{reinterpret_cast<uintptr_t>(r.buf), r.cnt, r.stride};
}

// The blob of each kind, written under the device's ctl after the object is checked (asX) and
// before anything behind its pointer is read. 0 or -errno, as export_object answers.
int exportContext(ibv_context *ib, ibv_extend_vdev_state *out) {
    Context *ctx = asContext(ib);
    if (ctx == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    if (ctx->pages.size() > kMaxCtxPages) {
        return -ENOSPC;
    }
    std::vector<uint32_t> nos;
    for (DbPage *p : ctx->pages) {
        nos.push_back(p->page_no);
    }
    CtxBlob b{0, static_cast<uint32_t>(nos.size()), dbPageStride()};
    if (ctx->bar_fd >= 0) {
        b.flags |= kCtxBar;
        if (!putFd(out, ctx->bar_fd)) {
            return -errno;
        }
    }
    if (ctx->async_fd >= 0) {
        b.flags |= kCtxAsync;
        if (!putFd(out, ctx->async_fd)) {
            int err = errno;
            closeFds(out);
            return -err;
        }
    }
    if (ctx->windows.fd.valid()) {
        b.flags |= kCtxWindows;
        if (!putFd(out, ctx->windows.fd.get())) {
            int err = errno;
            closeFds(out);
            return -err;
        }
    }
    put(out, IBV_EXTEND_VDEV_OBJ_CONTEXT, b, nos.data(), nos.size() * sizeof(uint32_t));
    return 0;
}

int exportPd(ibv_pd *ib, ibv_extend_vdev_state *out) {
    Pd *pd = asPd(ib);
    if (pd == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(pd->ctx->dev->ctl);
    put(out, IBV_EXTEND_VDEV_OBJ_PD, PdBlob{pd->ib.handle, 0});
    return 0;
}

int exportMr(ibv_mr *ib, ibv_extend_vdev_state *out) {
    Mr *mr = asMr(ib);
    if (mr == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(mr->pd->ctx->dev->ctl);
    put(out, IBV_EXTEND_VDEV_OBJ_MR,
        MrBlob{reinterpret_cast<uintptr_t>(mr->addr), mr->iova, mr->len, mr->key, mr->access, mr->ib.handle,
               mr->dm != nullptr ? 1u : 0u});
    return 0;
}

int exportDm(ibv_dm *ib, ibv_extend_vdev_state *out) {
    Dm *dm = asDm(ib);
    if (dm == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(dm->ctx->dev->ctl);
    put(out, IBV_EXTEND_VDEV_OBJ_DM,
        DmBlob{reinterpret_cast<uintptr_t>(dm->mem), dm->offset, dm->len, dm->asked});
    return 0;
}

int exportMw(ibv_mw *ib, ibv_extend_vdev_state *out) {
    Mw *mw = asMw(ib);
    if (mw == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(mw->ctx->dev->ctl);
    put(out, IBV_EXTEND_VDEV_OBJ_MW,
        MwBlob{mw->ib.rkey, static_cast<uint32_t>(mw->type), mw->ib.handle, mw->rec_index});
    return 0;
}

int exportCq(const ibv_cq_extend *ext, ibv_extend_vdev_state *out) {
    Cq *cq = asCq(ext->cq);
    if (cq == nullptr || &cq->ext != ext) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(cq->ctx->dev->ctl);
    CqBlob b{ringBlob(cq->ring), slotBlob(cq->db), reinterpret_cast<uintptr_t>(cq->ib.cq_context),
             cq->ib.handle, cq->event_fd >= 0 ? 1u : 0u};
    if (cq->event_fd >= 0 && !putFd(out, cq->event_fd)) {
        return -errno;
    }
    put(out, IBV_EXTEND_VDEV_OBJ_CQ, b);
    return 0;
}

int exportSrq(const ibv_srq_extend *ext, ibv_extend_vdev_state *out) {
    Srq *srq = asSrq(ext->srq);
    if (srq == nullptr || &srq->ext != ext) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(srq->ctx->dev->ctl);
    SrqBlob b{ringBlob(srq->ring), slotBlob(srq->db), reinterpret_cast<uintptr_t>(srq->ib.srq_context),
              srq->max_sge, srq->ib.handle};
    if (srq->xrcd != nullptr) {
        put(out, IBV_EXTEND_VDEV_OBJ_SRQ, XrcSrqBlob{b, srq->srqn, 0});
    } else {
        put(out, IBV_EXTEND_VDEV_OBJ_SRQ, b);
    }
    return 0;
}

int exportXrcd(ibv_xrcd *ib, ibv_extend_vdev_state *out) {
    Xrcd *x = asXrcd(ib);
    if (x == nullptr) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(x->dev->ctl);
    put(out, IBV_EXTEND_VDEV_OBJ_XRCD, XrcdBlob{});
    return 0;
}

// The attributes the control path set, as a QP's blob carries them (the live PSNs and state are
// in the SQ record).
void putAttrs(const QpAttrs &q, QpBlob *b) {
    b->dest_qpn = q.dest_qpn;
    b->sq_psn = q.sq_psn;
    b->rq_psn = q.rq_psn;
    b->access = q.access;
    b->path_mtu = q.path_mtu;
    b->pkey_index = q.pkey_index;
    b->port = q.port;
    b->timeout = q.timeout;
    b->retry_cnt = q.retry_cnt;
    b->rnr_retry = q.rnr_retry;
    b->min_rnr_timer = q.min_rnr_timer;
    b->max_rd_atomic = q.max_rd_atomic;
    b->max_dest_rd_atomic = q.max_dest_rd_atomic;
    b->ah = q.ah;
    b->udp_src_port = q.udp_src_port;
    b->lb_mode = q.lb_mode;
    b->lag_port = q.lag_port;
    if (q.ext) {
        b->has_ext = 1;
        b->feature_set = q.ext->feature_set ? 1 : 0;
        b->feature = q.ext->feature;
        b->mpath = q.ext->mpath;
        b->ar = q.ext->ar;
        b->sack = q.ext->sack;
    }
}

int exportQp(const ibv_qp_extend *ext, ibv_extend_vdev_state *out) {
    Qp *qp = asQp(ext->qp);
    if (qp == nullptr || &qp->ext != ext) {
        return -EINVAL;
    }
    std::lock_guard<std::mutex> ctl(qp->ctx->dev->ctl);
    QpBlob b{};
    b.qpn = qp->qpn;
    b.handle = qp->ib.handle;
    b.qp_context = reinterpret_cast<uintptr_t>(qp->ib.qp_context);
    b.sq = ringBlob(qp->sq);
    b.rq = ringBlob(qp->rq);
    b.sq_db = slotBlob(qp->sq_db);
    b.rq_db = slotBlob(qp->rq_db);
    b.has_rq = qp->hasRq() ? 1 : 0;
    b.rq_max_sge = qp->rq_max_sge;
    b.cap = qp->init.cap;
    b.sq_sig_all = qp->init.sq_sig_all;
    b.qp_type = static_cast<uint8_t>(qp->init.qp_type);
    putAttrs(qp->attrs, &b);
    std::vector<McastBlob> groups(qp->mcast.size());
    for (size_t i = 0; i < groups.size(); ++i) {
        std::memcpy(groups[i].gid, qp->mcast[i].gid.raw, sizeof(groups[i].gid));
        groups[i].lid = qp->mcast[i].lid;
    }
    put(out, IBV_EXTEND_VDEV_OBJ_QP, b, groups.data(), groups.size() * sizeof(McastBlob));
    return 0;
}

int exportObject(ibv_extend_vdev_obj kind, const void *object, ibv_extend_vdev_state *out) {
    if (object == nullptr || out == nullptr) {
        return -EINVAL;
    }
    std::memset(out, 0, sizeof(*out));
    for (int &fd : out->fds) {
        fd = -1;
    }
    auto *obj = const_cast<void *>(object);
    switch (kind) {
        case IBV_EXTEND_VDEV_OBJ_CONTEXT:
            return exportContext(static_cast<ibv_context *>(obj), out);
        case IBV_EXTEND_VDEV_OBJ_PD:
            return exportPd(static_cast<ibv_pd *>(obj), out);
        case IBV_EXTEND_VDEV_OBJ_MR:
            return exportMr(static_cast<ibv_mr *>(obj), out);
        case IBV_EXTEND_VDEV_OBJ_CQ:
            return exportCq(static_cast<const ibv_cq_extend *>(object), out);
        case IBV_EXTEND_VDEV_OBJ_SRQ:
            return exportSrq(static_cast<const ibv_srq_extend *>(object), out);
        case IBV_EXTEND_VDEV_OBJ_QP:
            return exportQp(static_cast<const ibv_qp_extend *>(object), out);
        case IBV_EXTEND_VDEV_OBJ_XRCD:
            return exportXrcd(static_cast<ibv_xrcd *>(obj), out);
        case IBV_EXTEND_VDEV_OBJ_MW:
            return exportMw(static_cast<ibv_mw *>(obj), out);
        case IBV_EXTEND_VDEV_OBJ_DM:
            return exportDm(static_cast<ibv_dm *>(obj), out);
    }
    return -EINVAL;
}

// ---- import ----

// The blob's body of kind, or nullptr (EINVAL) for anything but a blob of this version and kind
// whose sizes add up.
const uint8_t *body(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in, size_t fixed) {
    BlobHdr h;
    if (in == nullptr || in->len < sizeof(h) || in->len > sizeof(in->data) ||
        in->fd_cnt > IBV_EXTEND_VDEV_STATE_FDS) {
        return nullptr;
    }
    std::memcpy(&h, in->data, sizeof(h));
    if (h.magic != kBlobMagic || h.version != kBlobVersion || h.kind != kind || h.size != in->len ||
        h.resv != 0 || in->len < sizeof(h) + fixed) {
        return nullptr;
    }
    return in->data + sizeof(h);
}

template <typename T>
bool readBody(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in, T *out) {
    const uint8_t *b = body(kind, in, sizeof(T));
    if (b == nullptr || in->len != sizeof(BlobHdr) + sizeof(T)) {
        return false;
    }
    std::memcpy(out, b, sizeof(T));
    return true;
}

void *reloc(const ibv_extend_vdev_import *env, uint64_t old, uint64_t len) {
    return old != 0 ? env->relocate(env->arg, old, len) : nullptr;
}

bool pow2(uint32_t v) {
    return v != 0 && (v & (v - 1)) == 0;
}

// A ring of the old process at its new address; false for geometry no create makes.
bool importRing(const ibv_extend_vdev_import *env, const RingBlob &b, uint32_t max_cnt, uint32_t min_stride,
                uint32_t max_stride, Ring *r) {
    if (!pow2(b.cnt) || b.cnt > max_cnt || !pow2(b.stride) || b.stride < min_stride ||
        b.stride > max_stride) {
        return false;
    }
    uint64_t ring_bytes = static_cast<uint64_t>(b.cnt) * b.stride;
    auto *buf = static_cast<uint8_t *>(reloc(env, b.buf, ring_bytes + kRecordSize));
    if (buf == nullptr || reinterpret_cast<uintptr_t>(buf) % 64 != 0) {
        return false;
    }
    r->place(buf, b.cnt, b.stride);
    return true;
}

// The doorbell slot b names, checked against ctx (caller holds dev->ctl): its page is one of
// ctx's and the register is free.
bool importSlot(Context *ctx, const ibv_extend_vdev_import *env, const SlotBlob &b, DbSlot *out) {
    if (b.index >= SOFTNDA_DB_REGS_PER_PAGE || b.ub_res > 1 || b.resv != 0) {
        return false;
    }
    DbPage *page = nullptr;
    for (DbPage *p : ctx->pages) {
        if (p->page_no == b.page_no) {
            page = p;
        }
    }
    if (page == nullptr || (page->used & (1ull << b.index)) != 0) {
        return false;
    }
    void *mapped = reloc(env, b.mapped, SOFTNDA_DB_REG_STRIDE);
    if (mapped == nullptr) {
        return false;
    }
    out->page = page;
    out->mapped = mapped;
    out->index = b.index;
    out->ub_res = b.ub_res != 0;
    return true;
}

void *importContextBlob(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    const uint8_t *b = body(IBV_EXTEND_VDEV_OBJ_CONTEXT, in, sizeof(CtxBlob));
    if (b == nullptr || env->device == nullptr) {
        return failNull<void>(EINVAL);
    }
    CtxBlob c;
    std::memcpy(&c, b, sizeof(c));
    const uint32_t want_fds =
        ((c.flags & kCtxBar) ? 1 : 0) + ((c.flags & kCtxAsync) ? 1 : 0) + ((c.flags & kCtxWindows) ? 1 : 0);
    if ((c.flags & ~(kCtxBar | kCtxAsync | kCtxWindows)) != 0 || c.bar_pages > kMaxCtxPages ||
        in->len != sizeof(BlobHdr) + sizeof(CtxBlob) + c.bar_pages * sizeof(uint32_t) ||
        in->fd_cnt != want_fds || c.stride != dbPageStride() ||
        (c.bar_pages > 0 && (c.flags & kCtxBar) == 0)) {
        return failNull<void>(EINVAL);
    }
    std::vector<uint32_t> nos(c.bar_pages);
    if (!nos.empty()) {  // a context with no doorbell page yet: no data() to copy into
        std::memcpy(nos.data(), b + sizeof(CtxBlob), nos.size() * sizeof(uint32_t));
    }
    uint32_t next_fd = 0;
    const int bar_fd = (c.flags & kCtxBar) ? in->fds[next_fd++] : -1;
    const int async_fd = (c.flags & kCtxAsync) ? in->fds[next_fd++] : -1;
    WindowFile windows;
    if ((c.flags & kCtxWindows) && !openWindowFile(in->fds[next_fd], &windows)) {
        return failNull<void>(EINVAL);
    }
    auto *ib =
        static_cast<ibv_context *>(importContext(env->device, bar_fd, async_fd, nos.data(), c.bar_pages));
    if (ib == nullptr) {
        int err = errno;
        (void)windows.fd.release();  // still the caller's, as the other fds are
        errno = err;
        return nullptr;
    }
    asContext(ib)->windows = std::move(windows);  // nothing else knows the context yet
    return ib;
}

void *importPd(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    PdBlob p;
    Context *ctx = asContext(env->context);
    if (!readBody(IBV_EXTEND_VDEV_OBJ_PD, in, &p) || ctx == nullptr || in->fd_cnt != 0 || p.resv != 0) {
        return failNull<void>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    if (!devicePaused(ctx->dev)) {
        return failNull<void>(EBUSY);
    }
    return buildPd(ctx, p.handle);
}

void *importMr(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    MrBlob m;
    Pd *pd = asPd(env->pd);
    if (!readBody(IBV_EXTEND_VDEV_OBJ_MR, in, &m)) {
        return failNull<void>(EINVAL);
    }
    Dm *dm = m.on_dm == 1 ? asDm(env->dm) : nullptr;
    if (pd == nullptr || in->fd_cnt != 0 || m.len == 0 || m.iova + m.len < m.iova ||
        (m.access & ~kKnownAccess) != 0 || m.on_dm > 1 ||
        (m.on_dm == 1 && (dm == nullptr || dm->ctx->dev != pd->ctx->dev))) {
        return failNull<void>(EINVAL);
    }
    Device *dev = pd->ctx->dev;
    if (m.len > dev->cfg.max_mr_size || (m.key >> 8) >= dev->cfg.max_mr) {
        return failNull<void>(EINVAL);
    }
    auto *addr = static_cast<uint8_t *>(reloc(env, m.addr, m.len));
    // A region on device memory lies inside its allocation's (already relocated) memory.
    if (addr == nullptr || (dm != nullptr && (addr < dm->mem || m.len > dm->asked ||
                                              static_cast<uint64_t>(addr - dm->mem) > dm->asked - m.len))) {
        return failNull<void>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (!devicePaused(dev)) {
        return failNull<void>(EBUSY);
    }
    auto mr = std::make_unique<Mr>();
    mr->addr = addr;
    mr->iova = m.iova;
    mr->len = m.len;
    mr->access = m.access;
    mr->key = m.key;
    mr->dm = dm;
    if (!claimSlot(dev->mrs, dev->free_mr_slots, m.key >> 8, dev->gate)) {
        return failNull<void>(EINVAL);  // the key is taken in this process
    }
    if (dm != nullptr) {
        dm->mrs++;
    }
    return buildMr(std::move(mr), pd, m.handle);
}

void *importMw(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    MwBlob b;
    Pd *pd = asPd(env->pd);
    // The type is checked as the integer it is in the blob: a cast to the enum first would make
    // an out-of-range value of it.
    if (!readBody(IBV_EXTEND_VDEV_OBJ_MW, in, &b) || in->fd_cnt != 0 || pd == nullptr ||
        pd->ctx != asContext(env->context) || (b.type != IBV_MW_TYPE_1 && b.type != IBV_MW_TYPE_2)) {
        return failNull<void>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(pd->ctx->dev->ctl);
    if (!devicePaused(pd->ctx->dev)) {
        return failNull<void>(EBUSY);
    }
    ibv_mw *mw = restoreMw(pd, static_cast<ibv_mw_type>(b.type), b.rkey, b.rec);
    if (mw != nullptr) {
        mw->handle = b.handle;
    }
    return mw;
}

void *importDm(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    DmBlob b;
    Context *ctx = asContext(env->context);
    ibv_extend_ops *ops = env->ops;
    if (!readBody(IBV_EXTEND_VDEV_OBJ_DM, in, &b) || ctx == nullptr || in->fd_cnt != 0 || ops == nullptr ||
        ops->alloc == nullptr || ops->free == nullptr || ops->memset_s == nullptr) {
        return failNull<void>(EINVAL);
    }
    auto *mem = static_cast<uint8_t *>(reloc(env, b.mem, b.len));
    if (mem == nullptr) {
        return failNull<void>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    if (!devicePaused(ctx->dev)) {
        return failNull<void>(EBUSY);
    }
    int err = 0;
    ibv_dm *dm = buildImportedDm(ctx, ops, mem, b.offset, b.len, b.asked, &err);
    return dm != nullptr ? static_cast<void *>(dm) : failNull<void>(-err);
}

void *importCq(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    CqBlob b;
    Context *ctx = asContext(env->context);
    if (!readBody(IBV_EXTEND_VDEV_OBJ_CQ, in, &b) || ctx == nullptr || !opsComplete(env->ops) ||
        b.has_event_fd > 1 || in->fd_cnt != b.has_event_fd ||
        (b.has_event_fd != 0 && !ibvx::isEventFd(in->fds[0]))) {
        return failNull<void>(EINVAL);
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (!devicePaused(dev)) {
        return failNull<void>(EBUSY);
    }
    auto cq = std::make_unique<Cq>();
    // 32- or 64-byte entries: a CQ keeps its timestamps across a restart (SPEC.md §15).
    if (!importRing(env, b.ring, std::max<uint32_t>(2, dev->cfg.max_cqe) * 2, SOFTNDA_CQE_SIZE,
                    SOFTNDA_CQE_TS_SIZE, &cq->ring) ||
        !importSlot(ctx, env, b.db, &cq->db)) {
        return failNull<void>(EINVAL);
    }
    cq->event_fd = b.has_event_fd != 0 ? in->fds[0] : -1;
    return buildCq(std::move(cq), ctx, env->ops,
                   reinterpret_cast<void *>(static_cast<uintptr_t>(b.cq_context)), b.handle,
                   Origin::Imported);
}

void *importXrcd(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    XrcdBlob b;
    Context *ctx = asContext(env->context);
    if (!readBody(IBV_EXTEND_VDEV_OBJ_XRCD, in, &b) || ctx == nullptr || in->fd_cnt != 0 || b.resv[0] != 0 ||
        b.resv[1] != 0) {
        return failNull<void>(EINVAL);
    }
    std::lock_guard<std::mutex> ctl(ctx->dev->ctl);
    if (!devicePaused(ctx->dev)) {
        return failNull<void>(EBUSY);
    }
    return buildXrcd(ctx);
}

// Whether a recorded receive SGE count fits a ring of this stride: what this version records
// (recvSgeCap), or what versions before the engine's bound recorded, the entry's whole room (31 in
// a 512 B entry); either is imported as recvSgeCap.
bool recordedRecvSge(uint32_t recorded, uint32_t stride) {
    return recorded == recvSgeCap(stride) || recorded == recvSgeRoom(stride);
}

void *importSrq(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    XrcSrqBlob xb{};
    const bool xrc = readBody(IBV_EXTEND_VDEV_OBJ_SRQ, in, &xb);
    SrqBlob &b = xb.srq;
    Context *ctx = asContext(env->context);
    Pd *pd = asPd(env->pd);
    Xrcd *xrcd = xrc ? asXrcd(env->xrcd) : nullptr;
    Cq *cq = xrc ? asCq(env->srq_cq) : nullptr;
    if ((!xrc && !readBody(IBV_EXTEND_VDEV_OBJ_SRQ, in, &b)) || ctx == nullptr || pd == nullptr ||
        pd->ctx != ctx || !opsComplete(env->ops) || in->fd_cnt != 0 ||
        (xrc && (xrcd == nullptr || xrcd->dev != ctx->dev || cq == nullptr || cq->ctx != ctx ||
                 xb.srqn == 0 || xb.srqn > 0xffffff))) {
        return failNull<void>(EINVAL);
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (!devicePaused(dev)) {
        return failNull<void>(EBUSY);
    }
    if (xrc && dev->xrc_srqs.count(xb.srqn) != 0) {
        return failNull<void>(EINVAL);  // an SRQ of this process has the number
    }
    auto srq = std::make_unique<Srq>();
    if (xrc) {
        srq->xrcd = xrcd;
        srq->cq = cq;
        srq->srqn = xb.srqn;
    }
    if (!importRing(env, b.ring, dev->cfg.max_srq_wr * 2, 32, 1024, &srq->ring) ||
        !recordedRecvSge(b.max_sge, b.ring.stride) || !importSlot(ctx, env, b.db, &srq->db)) {
        return failNull<void>(EINVAL);
    }
    srq->max_sge = recvSgeCap(b.ring.stride);
    return buildSrq(std::move(srq), ctx, pd, env->ops,
                    reinterpret_cast<void *>(static_cast<uintptr_t>(b.srq_context)), b.handle,
                    Origin::Imported);
}

// Whether a QP's blob holds what a create could have made on this device.
bool validQpBlob(const QpBlob &b, const Config &cfg) {
    return b.qpn != 0 && b.qpn <= 0xffffff && b.has_ext <= 1 && b.feature_set <= 1 &&
           b.path_mtu >= IBV_MTU_256 && b.path_mtu <= IBV_MTU_4096 && b.cap.max_send_sge <= cfg.max_sge &&
           b.cap.max_inline_data <= cfg.max_inline_data && b.cap.max_recv_sge <= cfg.max_sge &&
           b.rq_max_sge <= recvSgeRoom(1024) &&
           (b.qp_type == 0 || b.qp_type == IBV_QPT_RC || b.qp_type == IBV_QPT_UC || b.qp_type == IBV_QPT_UD ||
            b.qp_type == IBV_QPT_XRC_SEND || b.qp_type == IBV_QPT_XRC_RECV) &&
           ((b.qp_type != IBV_QPT_XRC_SEND && b.qp_type != IBV_QPT_XRC_RECV) || b.has_rq == 0);
}

// The attributes the blob carries (putAttrs' counterpart).
void takeAttrs(const QpBlob &b, QpAttrs *q) {
    q->dest_qpn = b.dest_qpn;
    q->sq_psn = b.sq_psn;
    q->rq_psn = b.rq_psn;
    q->access = b.access;
    q->path_mtu = b.path_mtu;
    q->pkey_index = b.pkey_index;
    q->port = b.port;
    q->timeout = b.timeout;
    q->retry_cnt = b.retry_cnt;
    q->rnr_retry = b.rnr_retry;
    q->min_rnr_timer = b.min_rnr_timer;
    q->max_rd_atomic = b.max_rd_atomic;
    q->max_dest_rd_atomic = b.max_dest_rd_atomic;
    q->ah = b.ah;
    q->udp_src_port = b.udp_src_port;
    q->lb_mode = b.lb_mode;
    q->lag_port = b.lag_port;
    if (b.has_ext != 0) {
        q->ext = std::make_unique<QpExtAttrs>();
        q->ext->feature = b.feature;
        q->ext->feature_set = b.feature_set != 0;
        q->ext->mpath = b.mpath;
        q->ext->ar = b.ar;
        q->ext->sack = b.sack;
    }
}

// A QP's SQ and, without an SRQ, its RQ where the old process left them, with their doorbell
// registers (caller holds dev->ctl); false for geometry or registers no create makes.
bool importQpQueues(Context *ctx, const ibv_extend_vdev_import *env, const QpBlob &b, Qp *qp) {
    const Config &cfg = ctx->dev->cfg;
    if (!importRing(env, b.sq, cfg.max_qp_wr * 2, 64, 512, &qp->sq) ||
        !importSlot(ctx, env, b.sq_db, &qp->sq_db)) {
        return false;
    }
    qp->rq_max_sge = b.rq_max_sge;
    if (b.has_rq == 0) {
        return true;
    }
    qp->rq_max_sge = recvSgeCap(b.rq.stride);
    return importRing(env, b.rq, cfg.max_qp_wr * 2, 32, 1024, &qp->rq) &&
           recordedRecvSge(b.rq_max_sge, b.rq.stride) && importSlot(ctx, env, b.rq_db, &qp->rq_db) &&
           (qp->rq_db.page != qp->sq_db.page || qp->rq_db.index != qp->sq_db.index);
}

// What the QP hangs on, by its transport: an XRC target only on its domain (SPEC.md §14).
bool importParents(Context *ctx, const QpBlob &b, const ibv_extend_vdev_import *env, QpParents *out) {
    const auto type = b.qp_type == 0 ? IBV_QPT_RC : static_cast<ibv_qp_type>(b.qp_type);
    if (type == IBV_QPT_XRC_RECV) {
        out->xrcd = asXrcd(env->xrcd);
        return out->xrcd != nullptr && out->xrcd->dev == ctx->dev;
    }
    return qpParents(ctx, type, env->pd, env->send_cq, env->recv_cq, env->srq, out) &&
           b.has_rq == (out->srq == nullptr && type != IBV_QPT_XRC_SEND ? 1u : 0u);
}

// A QP blob's body and its multicast groups (the tail after the body); false for a blob whose
// tail is not a whole number of groups or has a non-zero reserved field.
bool readQpBlob(const ibv_extend_vdev_state *in, QpBlob *b, std::vector<McastGroup> *groups) {
    const uint8_t *p = body(IBV_EXTEND_VDEV_OBJ_QP, in, sizeof(QpBlob));
    if (p == nullptr) {
        return false;
    }
    std::memcpy(b, p, sizeof(*b));
    const size_t tail = in->len - sizeof(BlobHdr) - sizeof(QpBlob);
    if (tail % sizeof(McastBlob) != 0) {
        return false;
    }
    groups->resize(tail / sizeof(McastBlob));
    for (size_t i = 0; i < groups->size(); ++i) {
        McastBlob m;
        std::memcpy(&m, p + sizeof(QpBlob) + i * sizeof(McastBlob), sizeof(m));
        if (m.resv != 0) {
            return false;
        }
        std::memcpy((*groups)[i].gid.raw, m.gid, sizeof(m.gid));
        (*groups)[i].lid = m.lid;
    }
    return true;
}

void *importQp(const ibv_extend_vdev_state *in, const ibv_extend_vdev_import *env) {
    QpBlob b;
    std::vector<McastGroup> groups;
    Context *ctx = asContext(env->context);
    QpParents parents;
    if (!readQpBlob(in, &b, &groups) || ctx == nullptr || in->fd_cnt != 0 || !opsComplete(env->ops) ||
        !validQpBlob(b, ctx->dev->cfg) || !importParents(ctx, b, env, &parents)) {
        return failNull<void>(EINVAL);
    }
    Device *dev = ctx->dev;
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (!devicePaused(dev)) {
        return failNull<void>(EBUSY);
    }
    if (dev->qps.count(b.qpn) != 0) {
        return failNull<void>(EINVAL);  // a QP of this process has the number
    }
    const auto type = b.qp_type == 0 ? IBV_QPT_RC : static_cast<ibv_qp_type>(b.qp_type);
    if (int rc = checkImportedGroups(*dev, type, groups); rc != 0) {
        return failNull<void>(-rc);
    }
    auto qp = std::make_unique<Qp>();
    qp->srq = parents.srq;
    if (!importQpQueues(ctx, env, b, qp.get()) || recordedQpState(qp->sq) > IBV_QPS_ERR) {
        return failNull<void>(EINVAL);
    }
    qp->qpn = b.qpn;
    takeAttrs(b, &qp->attrs);
    ibv_qp_init_attr init{};
    init.qp_context = reinterpret_cast<void *>(static_cast<uintptr_t>(b.qp_context));
    init.send_cq = parents.scq != nullptr ? &parents.scq->ib : nullptr;
    init.recv_cq = parents.rcq != nullptr ? &parents.rcq->ib : nullptr;
    init.srq = parents.srq != nullptr ? &parents.srq->ib : nullptr;
    init.cap = b.cap;
    init.qp_type = type;
    init.sq_sig_all = b.sq_sig_all;
    // Not asQp(ext->qp): its ownership check takes Registry::mu, which is taken before ctl
    // (open_device), never under it. buildQp keeps the QP alive when it succeeds.
    Qp *made = qp.get();
    ibv_qp_extend *ext = buildQp(std::move(qp), ctx, parents, env->ops, init, b.handle, Origin::Imported);
    if (ext != nullptr) {
        joinImportedGroups(made, groups);  // checked above, under the same ctl
        if (dev->netdev) {
            dev->netdev->refresh();
            std::lock_guard<Gate> gate(dev->gate);
            bindWire(dev, made);  // a peer on another host: its path again (SPEC.md §18)
            restoreSavedAtomics(made);
        }
        reholdSrqRecv(made);  // an SRQ receive a message the restart cut had taken
    }
    return ext;
}

}  // namespace

int vdevExportObject(ibv_extend_vdev_obj kind, const void *object, ibv_extend_vdev_state *out) {
    return exportObject(kind, object, out);
}

void *vdevImportObject(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in,
                       const ibv_extend_vdev_import *env) {
    if (in == nullptr || env == nullptr ||
        (kind != IBV_EXTEND_VDEV_OBJ_CONTEXT && env->relocate == nullptr)) {
        return failNull<void>(EINVAL);
    }
    // Only while paused, before anything else is looked at (the per-kind imports check again
    // under Device::ctl).
    if (Context *ctx = asContext(env->context);
        kind != IBV_EXTEND_VDEV_OBJ_CONTEXT && ctx != nullptr && !devicePaused(ctx->dev)) {
        return failNull<void>(EBUSY);
    }
    switch (kind) {
        case IBV_EXTEND_VDEV_OBJ_CONTEXT:
            return importContextBlob(in, env);
        case IBV_EXTEND_VDEV_OBJ_PD:
            return importPd(in, env);
        case IBV_EXTEND_VDEV_OBJ_MR:
            return importMr(in, env);
        case IBV_EXTEND_VDEV_OBJ_CQ:
            return importCq(in, env);
        case IBV_EXTEND_VDEV_OBJ_SRQ:
            return importSrq(in, env);
        case IBV_EXTEND_VDEV_OBJ_QP:
            return importQp(in, env);
        case IBV_EXTEND_VDEV_OBJ_XRCD:
            return importXrcd(in, env);
        case IBV_EXTEND_VDEV_OBJ_MW:
            return importMw(in, env);
        case IBV_EXTEND_VDEV_OBJ_DM:
            return importDm(in, env);
    }
    return failNull<void>(EINVAL);
}

}  // namespace softnda
