// Shadow objects: client-side stand-ins for the broker's contexts, PDs, MRs and queues. Each
// carries the libibverbs/ibv_extend struct a program reads (qp_num, lkey, queue_info with local
// addresses, ...) and the broker handle it forwards to. None of them belongs to libibverbs.
//
// The per-object structs are standard-layout so a public pointer (ibv_qp *, ibv_cq_extend *,
// ...) leads back to its shadow; such a pointer is only trusted after the context's registry
// says the shadow is live, so foreign or stale pointers answer EINVAL instead of crashing.
//
// Threading: the process-wide context registry has its own shared mutex; each context's `mu`
// guards its set of live objects and aliases. Neither is held across a broker call.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>
#include <ibv_extend_datapath.h>

// No session.h here: it brings gRPC, and most of the face's files only need the shadows. What
// calls the broker includes client/broker/shadow_calls.h (or session.h) itself.

namespace ibv_extend::v1 {}  // namespace ibv_extend::v1

namespace ibvx::client::broker {

namespace pb = ::ibv_extend::v1;
class Session;
struct ShadowContext;

// What a tracked shadow is, in the order a context's objects are destroyed when a program closes
// it with objects left (libibverbs' ibv_close_device frees them, as the kernel does).
enum class ShadowKind { kAh, kQp, kSrq, kCq, kMw, kMr, kDm, kXrcd, kPd };

// A doorbell the caller's ibv_extend_ops.db_mmap mapped into its device (broker mode calls it on
// the locally mapped doorbell page, as a driver does in direct mode). Unmapped with db_unmap when
// the queue's shadow goes (after the broker destroyed the queue, or with its context).
struct DoorbellMapping {
    ibv_extend_ops *ops = nullptr;
    void *mapped = nullptr;
    doorbell_map_desc desc{};
    DoorbellMapping() = default;
    DoorbellMapping(const DoorbellMapping &) = delete;
    DoorbellMapping &operator=(const DoorbellMapping &) = delete;
    ~DoorbellMapping();
};

// Calls ops->db_mmap on q's local doorbell (DB_MAP_MODE_HOST_VA) when the caller gave one, and
// makes the result q->db_hw_va. 0, or a negative errno (the callback's errno, else -ENOMEM).
int mapDoorbell(ibv_extend_ops *ops, queue_info *q, DoorbellMapping *out);

// Ordinary memory an MR moved onto shared pages (client/broker/shared_pages.h), given back with the MR.
struct SharedHold {
    void *addr = nullptr;
    size_t length = 0;
    SharedHold() = default;
    SharedHold(const SharedHold &) = delete;
    SharedHold &operator=(const SharedHold &) = delete;
    ~SharedHold();
};

// A private state freed with its shadow: a queue's state in its driver's data path
// (include/ibv_extend_datapath.h; only queues made through the standard verbs have one, since
// their doorbell is the local page while extend-API queues may carry the caller's db_mmap address,
// which the CPU need not reach), or the face's ibv_wr_* batch of a QP.
struct OpaqueState {
    void (*close)(void *state) = nullptr;
    void *state = nullptr;
    OpaqueState() = default;
    OpaqueState(const OpaqueState &) = delete;
    OpaqueState &operator=(const OpaqueState &) = delete;
    ~OpaqueState() {
        if (state != nullptr && close != nullptr) {
            close(state);
        }
    }
};

struct ShadowPd {
    static constexpr ShadowKind kKind = ShadowKind::kPd;
    ibv_pd pd;
    ShadowContext *owner;
    uint64_t handle;
};

struct ShadowMr {
    static constexpr ShadowKind kKind = ShadowKind::kMr;
    ibv_mr mr;
    ShadowContext *owner;
    uint64_t handle;
    SharedHold shared;
};

struct ShadowCq {
    static constexpr ShadowKind kKind = ShadowKind::kCq;
    ibv_cq_extend ext;
    union {  // an ibv_cq_ex starts with the members of an ibv_cq (ibv_cq_ex_to_cq casts)
        ibv_cq cq;
        ibv_cq_ex cq_ex;
    };
    ShadowContext *owner;
    uint64_t handle;
    DoorbellMapping db;
    OpaqueState dp;
    uint32_t events_seen = 0;                 // the data path's event counter when last delivered
    uint32_t events_delivered = 0;            // ibv_get_cq_event() results, for ibv_destroy_cq's wait
    bool error_reported = false;              // IBV_EVENT_CQ_ERR delivered (the data path's cq_error)
    ibv_wc ex_wc{};                           // the completion ibv_start_poll/ibv_next_poll took
    ibv_extend_datapath_wc_times ex_times{};  // and its times, on a CQ created with timestamps
    bool timed = false;                       // created with a completion timestamp
};

struct ShadowSrq {
    static constexpr ShadowKind kKind = ShadowKind::kSrq;
    ibv_srq_extend ext;
    ibv_srq srq;
    ShadowContext *owner;
    uint64_t handle;
    DoorbellMapping db;
    OpaqueState dp;
    uint32_t limit_events_seen = 0;
    uint32_t srq_num = 0;  // an XRC SRQ's number (ibv_get_srq_num); 0 for a basic SRQ
};

// A memory window (AllocMw): the program holds &mw. Binds change mw.rkey (the data path's).
struct ShadowMw {
    static constexpr ShadowKind kKind = ShadowKind::kMw;
    ibv_mw mw;
    ShadowContext *owner;
    uint64_t handle;
};

// Device memory (AllocDm; softnda SPEC.md §17): the program holds &dm, whose memcpy_to_dm and
// memcpy_from_dm copy to and from mem, this process's mapping of the allocation's bytes (a region
// of the session's memory the broker sent), with no broker call.
struct ShadowDm {
    static constexpr ShadowKind kKind = ShadowKind::kDm;
    ibv_dm dm;
    ShadowContext *owner;
    uint64_t handle;
    uint8_t *mem;
    uint64_t length;  // as asked for: copies stay inside it
};

// An XRC domain (OpenXrcd): the program holds &xrcd.
struct ShadowXrcd {
    static constexpr ShadowKind kKind = ShadowKind::kXrcd;
    ibv_xrcd xrcd;
    ShadowContext *owner;
    uint64_t handle;
};

struct ShadowQp {
    static constexpr ShadowKind kKind = ShadowKind::kQp;
    ibv_qp_extend ext;
    union {  // an ibv_qp_ex starts with its ibv_qp (qp_base)
        ibv_qp qp;
        ibv_qp_ex qp_ex;
    };
    ShadowContext *owner;
    uint64_t handle;
    ibv_qp_cap cap;  // what the broker granted, for ibvx_query_qp's init_attr
    int sq_sig_all;
    DoorbellMapping sq_db, rq_db;
    OpaqueState dp;
    uint32_t fatal_events_seen = 0;
    bool has_qp_ex = false;  // made by ibv_create_qp_ex with send ops: qp_ex is filled
    OpaqueState wr_batch;    // the ibv_wr_start() batch being built (the libibverbs face)
    // A RESET -> INIT answered here and not yet sent (held_init_mask 0: none; held_init.h).
    // modify_mu orders the QP's modifies and queries with it.
    std::mutex modify_mu;
    ibv_qp_attr held_init{};
    int held_init_mask = 0;  // guarded by modify_mu
};

// A QP's ibv_qp_init_attr as the tenant can be told it without the broker: its CQs, SRQ, type and
// what the broker granted at create.
inline ibv_qp_init_attr grantedInitAttr(const ShadowQp &s) {
    ibv_qp_init_attr out{};
    out.qp_context = s.qp.qp_context;
    out.send_cq = s.qp.send_cq;
    out.recv_cq = s.qp.recv_cq;
    out.srq = s.qp.srq;
    out.cap = s.cap;
    out.qp_type = s.qp.qp_type;
    out.sq_sig_all = s.sq_sig_all;
    return out;
}

// An address handle: checked and kept in this process (the broker has no object for it; see
// docs/verbs.md).
struct ShadowAh {
    static constexpr ShadowKind kKind = ShadowKind::kAh;
    // dp.ah is what the program holds; the driver's data path reads dp.attr behind it for a UD
    // work request's destination (ibv_extend_datapath.h).
    ibv_extend_datapath_ah dp;
    ShadowContext *owner;
    uint64_t handle;  // the broker's AH (CreateAh)
};

// Recover a shadow from the public struct embedded in it. Only dereference the result after the
// registry said it is live (ownerOf, liveShadow).
template <typename Shadow, typename Member>
Shadow *shadowOf(Member *member, size_t offset) {
    return reinterpret_cast<Shadow *>(reinterpret_cast<char *>(member) - offset);
}
#define IBVX_SHADOW_OF(Type, field, ptr) shadowOf<Type>((ptr), offsetof(Type, field))

struct ShadowContext {
    // A complete verbs_context (its ibv_context last, extended entries before it), so the inline
    // wrappers of <infiniband/verbs.h> reach the libibverbs face's entries on it.
    verbs_context vctx{};
    ibv_context &ctx = vctx.context;
    ibv_device dev{};
    ibv_context_extend ext{};  // the primary extension context
    ibv_context_extend_ops ops{};
    Session *session = nullptr;
    uint64_t handle = 0;
    ibvx_device_info info{};
    bool from_open_device = false;  // ibvx_open_device() rather than ibv_open_extend()
    bool plain_init = false;        // DeviceInfo.plain_init: RESET -> INIT answered here (held_init.h)

    std::mutex mu;
    std::set<ibv_context_extend *> aliases;  // guarded by mu: further ibv_open_extend() results

    // The libibverbs face's part (client/verbs/): the driver's data path, and the queues that
    // have a data path state (their event counters are scanned when an event fd fires; they are
    // what the face moves to ERR when the session ends).
    const ibv_extend_datapath_ops *datapath = nullptr;
    uint32_t datapath_size = 0;     // of datapath's table (IBV_EXTEND_DATAPATH_SIZE_SYMBOL)
    std::set<ShadowQp *> dp_qps;    // guarded by mu
    std::set<ShadowSrq *> dp_srqs;  // guarded by mu
    std::set<ShadowCq *> dp_cqs;    // guarded by mu
    // Where the context is in its session's end (docs/verbs.md, "When the session ends"):
    // IBV_EVENT_DEVICE_FATAL is owed to ibv_get_async_event, then delivered.
    enum class End { kLive, kFatalPending, kFatalDelivered };
    End end = End::kLive;  // guarded by mu
    // ibv_import_device() results on this context (client/verbs/imports.cpp): each one more
    // ibv_close_device() before the context really closes, and the command fd it was given.
    std::vector<int> import_fds;  // guarded by mu
};

// The process-wide registry of live shadows (contexts by &ctx, objects by their shadow
// address). A pointer a program hands in is only dereferenced once the registry knows it.
void registerContext(ShadowContext *c);
// Forgets the context and frees every object shadow still registered under it.
void unregisterContext(ShadowContext *c);
// The shadow context behind a broker-owned ibv_context, nullptr for any other pointer.
ShadowContext *contextOf(const ibv_context *ctx);
// True when any broker context exists (lets direct mode skip the registry lock).
bool anyContext();

void trackRaw(const void *shadow, ShadowContext *owner, ShadowKind kind, void (*destroy)(void *));
template <typename Shadow>
void track(Shadow *s, ShadowContext *owner) {
    trackRaw(s, owner, Shadow::kKind, [](void *p) { delete static_cast<Shadow *>(p); });
}
// The live shadows of one kind owned by a context (a snapshot).
std::vector<void *> shadowsOf(const ShadowContext *owner, ShadowKind kind);
// The owner of a live shadow, nullptr when the registry does not know it.
ShadowContext *ownerOf(const void *shadow);
// Removes a shadow from the registry (the caller frees it). False when it was not live.
bool untrack(const void *shadow);

// The live shadow behind a public pointer a program handed in: nullptr for NULL, a pointer the
// registry does not know (foreign, or already destroyed), or, when `in` is given, a shadow of
// another context. The pointer is not dereferenced before the registry said yes.
template <typename Shadow, typename Member>
Shadow *liveShadow(Member *member, size_t offset, const ShadowContext *in = nullptr) {
    if (member == nullptr) {
        return nullptr;
    }
    Shadow *s = shadowOf<Shadow>(member, offset);
    ShadowContext *owner = ownerOf(s);
    return owner != nullptr && (in == nullptr || owner == in) ? s : nullptr;
}
inline ShadowPd *livePd(ibv_pd *pd, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowPd>(pd, offsetof(ShadowPd, pd), in);
}
inline ShadowMr *liveMr(ibv_mr *mr) {
    return liveShadow<ShadowMr>(mr, offsetof(ShadowMr, mr));
}
inline ShadowCq *liveCq(ibv_cq *cq, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowCq>(cq, offsetof(ShadowCq, cq), in);
}
inline ShadowQp *liveQp(ibv_qp *qp, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowQp>(qp, offsetof(ShadowQp, qp), in);
}
inline ShadowSrq *liveSrq(ibv_srq *srq, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowSrq>(srq, offsetof(ShadowSrq, srq), in);
}
inline ShadowXrcd *liveXrcd(ibv_xrcd *xrcd, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowXrcd>(xrcd, offsetof(ShadowXrcd, xrcd), in);
}
inline ShadowMw *liveMw(ibv_mw *mw) {
    return liveShadow<ShadowMw>(mw, offsetof(ShadowMw, mw));
}

inline ShadowDm *liveDm(ibv_dm *dm, const ShadowContext *in = nullptr) {
    return liveShadow<ShadowDm>(dm, offsetof(ShadowDm, dm), in);
}

// The create_cq entry of the forwarding ops, with a completion-event eventfd (-1: none) handed to
// the broker for the CQ (the libibverbs face's ibv_create_cq with a channel).
ibv_cq_extend *createCqWithEvents(ShadowContext *c, ibv_cq_init_attr_extend *a, int event_fd);

// ibv_resize_cq at the broker (ResizeCq): on success s->ext.cq_info describes the CQ's new memory
// and s->cq.cqe its depth, and the old memory is unmapped. Nobody may poll the CQ meanwhile (the
// face holds its data path's lock). 0 or a negative errno.
int resizeCq(ShadowCq *s, uint32_t cqe);

// ibv_attach_mcast (attach) / ibv_detach_mcast at the broker (AttachMcast / DetachMcast): 0 or a
// negative errno.
int mcast(ShadowQp *s, const ibv_gid &gid, uint16_t lid, bool attach);

// ---- memory windows (the libibverbs face's; softnda SPEC.md §16) ----
// A window of type in p's PD at the broker (AllocMw), tracked under p's context; NULL + errno.
ShadowMw *allocMw(ShadowPd *p, ibv_mw_type type);
// DeallocMw: 0 or a negative errno.
int deallocMw(ShadowMw *m);
// ---- device memory (the libibverbs face's; client/broker/dm.cpp) ----
// ibv_alloc_dm at the broker (AllocDm), its region mapped here, tracked under c; NULL + errno.
ShadowDm *allocDm(ShadowContext *c, const ibv_alloc_dm_attr &attr);
// FreeDm: 0 or a negative errno (-EBUSY while an MR is registered on it).
int freeDm(ShadowDm *d);
// ibv_reg_dm_mr at the broker (RegDmMr): an MR of pd on [offset, offset+length) of d, addressed
// zero-based; freed by the ordinary DeregMr. NULL + errno.
ibv_mr *regDmMr(ShadowPd *pd, ShadowDm *d, uint64_t offset, size_t length, unsigned int access);

// ---- XRC (the libibverbs face's; the extend API cannot name a domain) ----
// A handle on an XRC domain at the broker (OpenXrcd), tracked under c: the domain of the file fd
// (shared with every process opening it with the same file), or a private one for fd -1;
// oflags O_CREAT/O_EXCL. NULL + errno (EAGAIN: the file has no domain and no O_CREAT; EINVAL:
// it has one and O_EXCL).
ShadowXrcd *openXrcd(ShadowContext *c, int fd, int oflags);
// CloseXrcd: 0 or a negative errno (-EBUSY while an XRC SRQ or target QP uses it).
int closeXrcd(ShadowXrcd *x);
// The forwarding create_srq with, for an XRC SRQ, its domain and the CQ its receives complete on
// (both or neither); s->srq_num is the XRC SRQ's number.
ibv_srq_extend *createSrqIn(ShadowContext *c, ibv_srq_init_attr_extend *a, ShadowXrcd *xrcd, ShadowCq *cq);
// The forwarding create_qp, serving IBV_QPT_XRC_SEND (a PD and a send CQ; recv_cq and srq are
// ignored, as the kernel ignores them) and IBV_QPT_XRC_RECV (xrcd only) besides the others.
ibv_qp_extend *createQpIn(ShadowContext *c, ibv_qp_init_attr_extend *a, ShadowXrcd *xrcd);
// ibv_open_qp at the broker (OpenQp): a handle on the target qp_num of the domain x names,
// whichever process made it; it has no queue memory. NULL + errno (EINVAL: no such target).
ibv_qp_extend *openQpIn(ShadowContext *c, ShadowXrcd *xrcd, uint32_t qp_num, ibv_qp_type type,
                        void *qp_context);

}  // namespace ibvx::client::broker
