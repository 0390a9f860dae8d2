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

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "client/broker/session.h"

namespace ibvx::client::broker {

struct ShadowContext;

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

// Ordinary memory an MR moved onto shared pages (client/shared_pages.h), given back with the MR.
struct SharedHold {
    void *addr = nullptr;
    size_t length = 0;
    SharedHold() = default;
    SharedHold(const SharedHold &) = delete;
    SharedHold &operator=(const SharedHold &) = delete;
    ~SharedHold();
};

struct ShadowPd {
    ibv_pd pd;
    ShadowContext *owner;
    uint64_t handle;
};

struct ShadowMr {
    ibv_mr mr;
    ShadowContext *owner;
    uint64_t handle;
    SharedHold shared;
};

struct ShadowCq {
    ibv_cq_extend ext;
    ibv_cq cq;
    ShadowContext *owner;
    uint64_t handle;
    DoorbellMapping db;
};

struct ShadowSrq {
    ibv_srq_extend ext;
    ibv_srq srq;
    ShadowContext *owner;
    uint64_t handle;
    DoorbellMapping db;
};

struct ShadowQp {
    ibv_qp_extend ext;
    ibv_qp qp;
    ShadowContext *owner;
    uint64_t handle;
    ibv_qp_cap cap;  // what the broker granted, for ibvx_query_qp's init_attr
    int sq_sig_all;
    DoorbellMapping sq_db, rq_db;
};

// An address handle: checked and kept in this process (the broker has no object for it; see
// docs/verbs.md).
struct ShadowAh {
    ibv_ah ah;
    ShadowContext *owner;
    ibv_ah_attr attr;
};

// Recover a shadow from the public struct embedded in it. Only dereference the result after
// ShadowContext::isLive() said yes.
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

    std::mutex mu;
    std::set<ibv_context_extend *> aliases;  // guarded by mu: further ibv_open_extend() results
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

void trackRaw(const void *shadow, ShadowContext *owner, void (*destroy)(void *));
template <typename Shadow>
void track(Shadow *s, ShadowContext *owner) {
    trackRaw(s, owner, [](void *p) { delete static_cast<Shadow *>(p); });
}
// The owner of a live shadow, nullptr when the registry does not know it.
ShadowContext *ownerOf(const void *shadow);
// Removes a shadow from the registry (the caller frees it). False when it was not live.
bool untrack(const void *shadow);

// Destroys a broker object behind a shadow: claims the shadow first so a racing destroy of the
// same object cannot free it twice, and gives it back when the broker refuses.
template <typename Shadow, typename Req, typename Resp>
int destroyTracked(Shadow *s, const char *what,
                   grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                   void (Req::*set_handle)(uint64_t)) {
    ShadowContext *c = ownerOf(s);
    if (c == nullptr || !untrack(s)) {
        return -EINVAL;
    }
    Req req;
    (req.*set_handle)(s->handle);
    Resp resp;
    int rc = c->session->call(what, method, req, &resp);
    if (rc != 0 && !c->session->gone()) {
        track(s, c);
        return rc;
    }
    if constexpr (requires { resp.released_regions(); }) {
        if (rc == 0) {
            c->session->releaseRegions(resp.released_regions());
        }
    }
    delete s;
    return rc;
}

// Builds the shadow context (device, ops table per driver version and driver_ops_present).
ShadowContext *makeContext(Session *session, const pb::OpenContextResponse &resp);

}  // namespace ibvx::client::broker
