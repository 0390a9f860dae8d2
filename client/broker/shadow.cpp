#include "client/broker/shadow.h"

#include <cstdio>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "client/broker/convert.h"

namespace ibvx::client::broker {
namespace {

struct Entry {
    ShadowContext *owner;     // nullptr for a context itself
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

void trackRaw(const void *shadow, ShadowContext *owner, void (*destroy)(void *)) {
    Registry &r = registry();
    std::unique_lock lock(r.mu);
    r.objects[shadow] = Entry{owner, destroy};
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
