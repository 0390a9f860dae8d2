// Thread domains and parent domains (ibv_alloc_td, ibv_alloc_parent_domain): objects of this
// process alone, as rdma-core's providers keep them (no kernel object stands behind either).
// A thread domain is the program's promise that one thread uses the objects made under it; the
// face keeps its locks anyway (a hint, nothing to serve). A parent domain is an ibv_pd that
// stands for its PD: every verb taking a PD takes one and acts on the PD it names
// (underlyingPd), and the objects made keep it as their pd, as rdma-core's providers answer.
// Custom allocators (IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) are refused: a queue's memory is
// the broker's (arena regions it maps into this process), never the program's, so the face has
// nothing to ask them for (docs/verbs.md).
#include <cerrno>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "client/verbs/face.h"

namespace ibvx::client::verbs {
namespace {

struct FaceTd {
    ibv_td td{};
    int parents = 0;  // parent domains naming it: it cannot go before them
};

struct FaceParentDomain {
    ibv_pd pd{};
    ibv_pd *base = nullptr;
    FaceTd *td = nullptr;
    void *pd_context = nullptr;  // IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT (only allocators read it)
};

struct Domains {
    std::mutex mu;
    std::unordered_map<const ibv_td *, std::unique_ptr<FaceTd>> tds;
    std::unordered_map<const ibv_pd *, std::unique_ptr<FaceParentDomain>> parents;
    std::unordered_map<const ibv_pd *, int> parents_of;  // PD -> parent domains naming it
};

Domains &domains() {
    static Domains *d = new Domains;  // never destroyed: verbs may run during exit
    return *d;
}

}  // namespace

ibv_pd *underlyingPd(ibv_pd *pd) {
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    auto it = d.parents.find(pd);
    return it != d.parents.end() ? it->second->base : pd;
}

bool isParentDomain(const ibv_pd *pd) {
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    return d.parents.count(pd) != 0;
}

int releaseParentDomain(ibv_pd *pd, bool *was_parent) {
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    auto it = d.parents.find(pd);
    *was_parent = it != d.parents.end();
    if (!*was_parent) {
        auto uses = d.parents_of.find(pd);
        return uses != d.parents_of.end() && uses->second > 0 ? EBUSY : 0;
    }
    FaceParentDomain &p = *it->second;
    if (--d.parents_of[p.base] == 0) {
        d.parents_of.erase(p.base);
    }
    if (p.td != nullptr) {
        --p.td->parents;
    }
    d.parents.erase(it);
    return 0;
}

void dropDomains(const ShadowContext *c) {
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    for (auto it = d.parents.begin(); it != d.parents.end();) {
        if (it->second->pd.context == &c->ctx) {
            if (--d.parents_of[it->second->base] == 0) {
                d.parents_of.erase(it->second->base);
            }
            it = d.parents.erase(it);
        } else {
            ++it;
        }
    }
    for (auto it = d.tds.begin(); it != d.tds.end();) {
        it = it->second->td.context == &c->ctx ? d.tds.erase(it) : std::next(it);
    }
}

ibv_td *faceAllocTd(ibv_context *context, ibv_td_init_attr *init_attr) {
    if (faceContext(context) == nullptr || init_attr == nullptr || init_attr->comp_mask != 0) {
        return failNull<ibv_td>(EINVAL);
    }
    auto td = std::make_unique<FaceTd>();
    td->td.context = context;
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    ibv_td *out = &td->td;
    d.tds.emplace(out, std::move(td));
    return out;
}

int faceDeallocTd(ibv_td *td) {
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    auto it = d.tds.find(td);
    if (it == d.tds.end()) {
        return EINVAL;
    }
    if (it->second->parents != 0) {
        return EBUSY;  // a parent domain still names it
    }
    d.tds.erase(it);
    return 0;
}

ibv_pd *faceAllocParentDomain(ibv_context *context, ibv_parent_domain_init_attr *attr) {
    constexpr uint32_t kKnown =
        IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr || attr->pd == nullptr || (attr->comp_mask & ~kKnown) != 0) {
        return failNull<ibv_pd>(EINVAL);
    }
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) != 0) {
        warn("ibv_alloc_parent_domain: custom allocators are not served (queue memory is the broker's)");
        return failNull<ibv_pd>(EOPNOTSUPP);
    }
    Domains &d = domains();
    std::lock_guard lock(d.mu);
    // A PD of this context (not itself a parent domain), and a thread domain of it if any.
    if (d.parents.count(attr->pd) != 0 || broker::livePd(attr->pd, c) == nullptr) {
        return failNull<ibv_pd>(EINVAL);
    }
    FaceTd *td = nullptr;
    if (attr->td != nullptr) {
        auto it = d.tds.find(attr->td);
        if (it == d.tds.end() || attr->td->context != context) {
            return failNull<ibv_pd>(EINVAL);
        }
        td = it->second.get();
    }
    auto p = std::make_unique<FaceParentDomain>();
    p->pd.context = context;
    p->pd.handle = attr->pd->handle;
    p->base = attr->pd;
    p->td = td;
    if ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT) != 0) {
        p->pd_context = attr->pd_context;
    }
    if (td != nullptr) {
        ++td->parents;
    }
    ++d.parents_of[attr->pd];
    ibv_pd *out = &p->pd;
    d.parents.emplace(out, std::move(p));
    return out;
}

}  // namespace ibvx::client::verbs
