// Device memory through the broker (softnda SPEC.md §17): the allocation is the broker's, its
// bytes a region of the session's own memory that the broker sends before answering AllocDm; the
// copies of ibv_memcpy_to_dm / ibv_memcpy_from_dm are loads and stores on this process's mapping.
#include <cerrno>
#include <cstring>

#include "client/broker/shadow_calls.h"
#include "common/c_abi.h"

namespace ibvx::client::broker {
namespace {

// Whether [offset, offset + length) lies inside the allocation, without overflow, in whole
// 4-byte words: device memory is copied a word at a time, and mlx5, whose rule consumers test
// against, refuses anything else (softnda SPEC.md §17).
bool inside(const ShadowDm &d, uint64_t offset, size_t length) {
    return offset % 4 == 0 && length % 4 == 0 && offset <= d.length && length <= d.length - offset;
}

// rdma-core's convention for these two: 0 or a positive errno.
int copyToDm(ibv_dm *dm, uint64_t offset, const void *src, size_t length) {
    ShadowDm *d = liveDm(dm);
    if (d == nullptr || (src == nullptr && length != 0) || !inside(*d, offset, length)) {
        return EINVAL;
    }
    std::memcpy(d->mem + offset, src, length);
    return 0;
}

int copyFromDm(void *dst, ibv_dm *dm, uint64_t offset, size_t length) {
    ShadowDm *d = liveDm(dm);
    if (d == nullptr || (dst == nullptr && length != 0) || !inside(*d, offset, length)) {
        return EINVAL;
    }
    std::memcpy(dst, d->mem + offset, length);
    return 0;
}

}  // namespace

ShadowDm *allocDm(ShadowContext *c, const ibv_alloc_dm_attr &attr) {
    pb::AllocDmRequest req;
    req.set_context(c->handle);
    req.set_length(attr.length);
    req.set_log_align_req(attr.log_align_req);
    req.set_comp_mask(attr.comp_mask);
    pb::AllocDmResponse resp;
    if (int rc = c->session->call("AllocDm", &pb::Broker::Stub::AllocDm, req, &resp); rc != 0) {
        return failNull<ShadowDm>(-rc);
    }
    auto *d = new ShadowDm{};
    d->owner = c;
    d->handle = resp.dm();
    d->length = attr.length;
    d->dm.context = &c->ctx;
    d->dm.memcpy_to_dm = copyToDm;
    d->dm.memcpy_from_dm = copyFromDm;
    d->dm.handle = static_cast<uint32_t>(resp.dm());
    track(d, c);
    void *mem = nullptr;
    int rc = c->session->resolve(resp.memory(), resp.has_memory(), &mem);
    if (rc == 0 && (mem == nullptr || resp.memory().length() < attr.length)) {
        rc = -EPROTO;  // the broker named no memory, or too little
    }
    if (rc != 0) {
        (void)freeDm(d);
        return failNull<ShadowDm>(-rc);
    }
    d->mem = static_cast<uint8_t *>(mem);
    return d;
}

int freeDm(ShadowDm *d) {
    return destroyTracked(d, "FreeDm", &pb::Broker::Stub::FreeDm, &pb::FreeDmRequest::set_dm);
}

ibv_mr *regDmMr(ShadowPd *pd, ShadowDm *d, uint64_t offset, size_t length, unsigned int access) {
    pb::RegDmMrRequest req;
    req.set_pd(pd->handle);
    req.set_dm(d->handle);
    req.set_offset(offset);
    req.set_length(length);
    req.set_access(access);
    pb::RegMrResponse resp;
    if (int rc = pd->owner->session->call("RegDmMr", &pb::Broker::Stub::RegDmMr, req, &resp); rc != 0) {
        return failNull<ibv_mr>(-rc);
    }
    auto *m = new ShadowMr{};
    m->owner = pd->owner;
    m->handle = resp.mr();
    m->mr.context = &pd->owner->ctx;
    m->mr.pd = &pd->pd;
    m->mr.addr = nullptr;  // zero-based: the MR's byte i is iova i
    m->mr.length = length;
    m->mr.handle = static_cast<uint32_t>(resp.mr());
    m->mr.lkey = resp.lkey();
    m->mr.rkey = resp.rkey();
    track(m, pd->owner);
    return &m->mr;
}

}  // namespace ibvx::client::broker
