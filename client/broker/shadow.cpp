#include "client/broker/shadow.h"

#include <cstdio>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "client/broker/convert.h"
#include "client/broker/shared_pages.h"
#include "providers/loader/loader.h"

namespace ibvx::client::broker {

using loader::warn;

namespace {

struct Entry {
    ShadowContext *owner;  // nullptr for a context itself
    ShadowKind kind;
    void (*destroy)(void *);  // frees an object shadow
};

struct Registry {
    std::shared_mutex mu;
    std::unordered_map<const void *, Entry> objects;                    // guarded by mu
    std::unordered_map<const ibv_context *, ShadowContext *> contexts;  // guarded by mu
    std::atomic<size_t> context_count{0};
};

Registry &registry() {
    static Registry *r = new Registry;  // outlives static destructors and atexit handlers
    return *r;
}

}  // namespace

DoorbellMapping::~DoorbellMapping() {
    if (mapped != nullptr && ops != nullptr && ops->db_unmap != nullptr) {
        int rc = ops->db_unmap(mapped, &desc);
        if (rc != 0) {
            warn("db_unmap of the doorbell at %p failed (%d)", mapped, rc);
        }
    }
}

int mapDoorbell(ibv_extend_ops *ops, queue_info *q, DoorbellMapping *out) {
    void *local = q->db_hw_va.iov_base;
    if (ops == nullptr || ops->db_mmap == nullptr || local == nullptr) {
        return 0;  // no callback (the standard verbs, ibvx_*): the local address is the doorbell
    }
    DoorbellMapping &m = *out;
    m.desc = doorbell_map_desc{};
    m.desc.type = DB_MAP_MODE_HOST_VA;
    m.desc.hva = reinterpret_cast<uintptr_t>(local);
    m.desc.size = q->db_hw_va.iov_len;
    errno = 0;
    void *mapped = ops->db_mmap(&m.desc);
    if (mapped == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("the caller's db_mmap refused the doorbell at %p (errno %d)", local, err);
        return -err;
    }
    m.ops = ops;
    m.mapped = mapped;
    q->db_hw_va.iov_base = mapped;
    return 0;
}

SharedHold::~SharedHold() {
    if (addr != nullptr) {
        releaseShared(addr, length);
    }
}

void registerContext(ShadowContext *c) {
    Registry &r = registry();
    std::unique_lock lock(r.mu);
    r.contexts[&c->ctx] = c;
    r.context_count.store(r.contexts.size(), std::memory_order_release);
}

void unregisterContext(ShadowContext *c) {
    std::vector<std::pair<void *, void (*)(void *)>> orphans;
    {
        Registry &r = registry();
        std::unique_lock lock(r.mu);
        r.contexts.erase(&c->ctx);
        r.context_count.store(r.contexts.size(), std::memory_order_release);
        for (auto it = r.objects.begin(); it != r.objects.end();) {
            if (it->second.owner == c) {
                orphans.emplace_back(const_cast<void *>(it->first), it->second.destroy);
                it = r.objects.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (auto &[p, destroy] : orphans) {
        destroy(p);
    }
}

ShadowContext *contextOf(const ibv_context *ctx) {
    Registry &r = registry();
    if (r.context_count.load(std::memory_order_acquire) == 0) {
        return nullptr;
    }
    std::shared_lock lock(r.mu);
    auto it = r.contexts.find(ctx);
    return it == r.contexts.end() ? nullptr : it->second;
}

bool anyContext() {
    return registry().context_count.load(std::memory_order_acquire) != 0;
}

void trackRaw(const void *shadow, ShadowContext *owner, ShadowKind kind, void (*destroy)(void *)) {
    Registry &r = registry();
    std::unique_lock lock(r.mu);
    r.objects[shadow] = Entry{owner, kind, destroy};
}

std::vector<void *> shadowsOf(const ShadowContext *owner, ShadowKind kind) {
    Registry &r = registry();
    std::shared_lock lock(r.mu);
    std::vector<void *> out;
    for (const auto &[p, e] : r.objects) {
        if (e.owner == owner && e.kind == kind) {
            out.push_back(const_cast<void *>(p));
        }
    }
    return out;
}

ShadowContext *ownerOf(const void *shadow) {
    Registry &r = registry();
    std::shared_lock lock(r.mu);
    auto it = r.objects.find(shadow);
    return it == r.objects.end() ? nullptr : it->second.owner;
}

bool untrack(const void *shadow) {
    Registry &r = registry();
    std::unique_lock lock(r.mu);
    return r.objects.erase(shadow) != 0;
}

}  // namespace ibvx::client::broker
