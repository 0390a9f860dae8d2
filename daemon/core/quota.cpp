#include "daemon/core/quota.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace ibvx::daemon {

namespace {

const char *const kNames[] = {"contexts",    "pds",         "mrs",      "mr_bytes", "cqs",       "qps",
                              "srqs",        "queue_bytes", "sessions", "ahs",      "event_fds", "replies",
                              "state_bytes", "xrcds",       "mws",      "dm_bytes"};
static_assert(std::size(kNames) == kQuotaCount);

std::string limitText(uint64_t v) {
    return v == kUnlimited ? std::string("unlimited") : std::to_string(v);
}

}  // namespace

struct QuotaCharge::Tenant {
    TenantKey key;
    size_t charges = 0;  // live QuotaCharges pointing here
    // The state the tenant is interned in: kept while a charge of the tenant lives, so charges
    // outlive their QuotaManager. The tenant goes with its last charge, and so its hold.
    std::shared_ptr<State> state;
};

struct QuotaCharge::State {
    mutable std::mutex mu;
    QuotaConfig config;
    std::map<uid_t, QuotaValues> uid_used;
    std::map<std::string, QuotaValues> container_used;
    std::map<std::string, QuotaValues> namespace_used;
    // The runtime changes since the last configure() (runtimeEdits()).
    std::vector<QuotaEdit> edits;
    // The tenants of live charges, each held once (node addresses are stable).
    std::map<std::tuple<uid_t, std::string, std::string>, Tenant, std::less<>> tenants;

    // Called with mu held.
    Tenant *acquireTenant(const TenantKey &t) {
        // Found by views first: a container id is up to 64 characters, and the key's copies were
        // two allocations a charge (every object, every stored reply) for a tenant already here.
        auto it = tenants.find(
            std::tuple<uid_t, std::string_view, std::string_view>{t.uid, t.container, t.pod_namespace});
        if (it == tenants.end()) {
            it = tenants.try_emplace({t.uid, t.container, t.pod_namespace}).first;
            it->second.key = t;
        }
        ++it->second.charges;
        return &it->second;
    }
    void releaseTenant(Tenant *t) {
        if (--t->charges == 0) {
            tenants.erase({t->key.uid, t->key.container, t->key.pod_namespace});
        }
    }

    uint64_t limit(const QuotaOverride *o, size_t i) const {
        if (o != nullptr && o->max[i].has_value()) {
            return *o->max[i];
        }
        return config.defaults[i];
    }
    QuotaValues limits(const QuotaOverride *o) const {
        QuotaValues v{};
        for (size_t i = 0; i < kQuotaCount; ++i) {
            v[i] = limit(o, i);
        }
        return v;
    }
    const QuotaOverride *uidOverride(uid_t uid) const {
        auto it = config.uids.find(uid);
        return it == config.uids.end() ? nullptr : &it->second;
    }
    const QuotaOverride *containerOverride(const std::string &c) const {
        auto it = config.containers.find(c);
        return it == config.containers.end() ? nullptr : &it->second;
    }
    // A namespace is limited only by its own table (QuotaConfig::namespaces).
    QuotaValues namespaceLimits(const std::string &ns) const {
        QuotaValues v = QuotaConfig::unlimited();
        if (auto it = config.namespaces.find(ns); it != config.namespaces.end()) {
            for (size_t i = 0; i < kQuotaCount; ++i) {
                if (it->second.max[i].has_value()) {
                    v[i] = *it->second.max[i];
                }
            }
        }
        return v;
    }

    // Subtracts amounts; drops accounts that reach zero. Called with mu held.
    void give(const TenantKey &t, const QuotaValues &amounts) {
        auto sub = [&](QuotaValues &used) {
            bool zero = true;
            for (size_t i = 0; i < kQuotaCount; ++i) {
                used[i] -= std::min(used[i], amounts[i]);
                zero = zero && used[i] == 0;
            }
            return zero;
        };
        if (auto it = uid_used.find(t.uid); it != uid_used.end() && sub(it->second)) {
            uid_used.erase(it);
        }
        if (!t.container.empty()) {
            if (auto it = container_used.find(t.container); it != container_used.end() && sub(it->second)) {
                container_used.erase(it);
            }
        }
        if (!t.pod_namespace.empty()) {
            if (auto it = namespace_used.find(t.pod_namespace);
                it != namespace_used.end() && sub(it->second)) {
                namespace_used.erase(it);
            }
        }
    }
};

const char *quotaName(Quota q) {
    auto i = static_cast<size_t>(q);
    return i < kQuotaCount ? kNames[i] : "?";
}

std::optional<Quota> quotaFromName(const std::string &name) {
    for (size_t i = 0; i < kQuotaCount; ++i) {
        if (name == kNames[i]) {
            return static_cast<Quota>(i);
        }
    }
    return std::nullopt;
}

bool QuotaOverride::empty() const {
    for (const auto &m : max) {
        if (m.has_value()) {
            return false;
        }
    }
    return true;
}

QuotaValues QuotaConfig::unlimited() {
    QuotaValues v;
    v.fill(kUnlimited);
    return v;
}

// ---- QuotaCharge ----------------------------------------------------------------------------

QuotaValues QuotaCharge::amounts() const {
    if (spill_ != nullptr) {
        return *spill_;
    }
    QuotaValues v{};
    for (size_t s = 0; s < kSlots; ++s) {
        if (slot_quota_[s] < kQuotaCount) {
            v[slot_quota_[s]] += slot_amount_[s];
        }
    }
    return v;
}

void QuotaCharge::setAmounts(const QuotaValues &v) {
    size_t used = 0;
    for (uint64_t a : v) {
        used += a != 0 ? 1 : 0;
    }
    if (used > kSlots) {
        spill_ = std::make_unique<QuotaValues>(v);
        return;
    }
    spill_.reset();
    size_t s = 0;
    for (size_t i = 0; i < kQuotaCount; ++i) {
        if (v[i] != 0) {
            slot_quota_[s] = static_cast<uint8_t>(i);
            slot_amount_[s] = v[i];
            ++s;
        }
    }
    for (; s < kSlots; ++s) {
        slot_quota_[s] = kQuotaCount;
        slot_amount_[s] = 0;
    }
}

void QuotaCharge::clearAmounts() {
    spill_.reset();
    for (size_t s = 0; s < kSlots; ++s) {
        slot_quota_[s] = kQuotaCount;
        slot_amount_[s] = 0;
    }
}

uint64_t QuotaCharge::amount(Quota q) const {
    const auto i = static_cast<size_t>(q);
    if (spill_ != nullptr) {
        return i < kQuotaCount ? (*spill_)[i] : 0;
    }
    for (size_t s = 0; s < kSlots; ++s) {
        if (slot_quota_[s] == i) {
            return slot_amount_[s];
        }
    }
    return 0;
}

QuotaCharge::QuotaCharge(QuotaCharge &&o) noexcept
    : tenant_(std::exchange(o.tenant_, nullptr)), spill_(std::move(o.spill_)) {
    std::copy(std::begin(o.slot_amount_), std::end(o.slot_amount_), slot_amount_);
    std::copy(std::begin(o.slot_quota_), std::end(o.slot_quota_), slot_quota_);
    o.clearAmounts();
}

QuotaCharge &QuotaCharge::operator=(QuotaCharge &&o) noexcept {
    if (this != &o) {
        release();
        tenant_ = std::exchange(o.tenant_, nullptr);
        spill_ = std::move(o.spill_);
        std::copy(std::begin(o.slot_amount_), std::end(o.slot_amount_), slot_amount_);
        std::copy(std::begin(o.slot_quota_), std::end(o.slot_quota_), slot_quota_);
        o.clearAmounts();
    }
    return *this;
}

void QuotaCharge::release() {
    if (tenant_ != nullptr) {
        const QuotaValues held = amounts();
        // Our own hold: releaseTenant may erase the tenant and with it the last other one, and
        // the state must not go while its mutex is held.
        const std::shared_ptr<State> state = tenant_->state;
        std::lock_guard lock(state->mu);
        state->give(tenant_->key, held);
        state->releaseTenant(tenant_);
    }
    tenant_ = nullptr;
    clearAmounts();
}

void QuotaCharge::merge(QuotaCharge &&other) {
    if (other.tenant_ == nullptr) {
        return;
    }
    if (tenant_ == nullptr) {
        *this = std::move(other);
        return;
    }
    QuotaValues sum = amounts();
    const QuotaValues theirs = other.amounts();
    for (size_t i = 0; i < kQuotaCount; ++i) {
        sum[i] += theirs[i];
    }
    setAmounts(sum);  // may throw (a spill) before anything moved: both charges stay whole
    {
        // The amounts are ours now; only other's hold on the (same) tenant goes, which is never
        // the tenant's last (ours remains), so the state stays.
        State &state = *other.tenant_->state;
        std::lock_guard lock(state.mu);
        state.releaseTenant(other.tenant_);
    }
    other.tenant_ = nullptr;
    other.clearAmounts();
}

bool QuotaCharge::empty() const {
    for (uint64_t a : amounts()) {
        if (a != 0) {
            return false;
        }
    }
    return true;
}

// ---- QuotaManager ---------------------------------------------------------------------------

QuotaManager::QuotaManager(QuotaConfig config) : state_(std::make_shared<QuotaCharge::State>()) {
    state_->config = std::move(config);
}

QuotaManager::~QuotaManager() = default;

StatusOr<QuotaCharge> QuotaManager::reserve(const TenantKey &tenant,
                                            std::initializer_list<std::pair<Quota, uint64_t>> amounts) {
    std::lock_guard lock(state_->mu);
    QuotaValues want{};
    RETURN_IF_ERROR(checkLocked(*state_, tenant, amounts, &want));
    return chargeLocked(*state_, tenant, want);
}

Status QuotaManager::check(const TenantKey &tenant,
                           std::initializer_list<std::pair<Quota, uint64_t>> amounts) const {
    std::lock_guard lock(state_->mu);
    QuotaValues want{};
    return checkLocked(*state_, tenant, amounts, &want);
}

Status QuotaManager::checkLocked(const QuotaCharge::State &st, const TenantKey &tenant,
                                 std::initializer_list<std::pair<Quota, uint64_t>> amounts,
                                 QuotaValues *want_out) const {
    QuotaValues &want = *want_out;
    // The quotas asked for (an object charges one to three): only they are checked, and an
    // account's name is spelled out only for a refusal, not on every call's path.
    std::array<uint8_t, kQuotaCount> asked{};
    size_t n_asked = 0;
    for (auto [q, n] : amounts) {
        const auto i = static_cast<size_t>(q);
        if (n != 0 && want[i] == 0) {
            asked[n_asked++] = static_cast<uint8_t>(i);
        }
        want[i] += n;
    }
    enum class Scope { kUid, kContainer, kNamespace };
    auto check = [&](Scope scope, const QuotaValues *used, auto limit_of) -> Status {
        for (size_t k = 0; k < n_asked; ++k) {
            const size_t i = asked[k];
            const uint64_t in_use = used != nullptr ? (*used)[i] : 0;
            const uint64_t lim = limit_of(i);
            // used <= lim always holds for charges made here, but a lowered limit can be below it.
            if (in_use > lim || want[i] > lim - in_use) {
                const std::string account = scope == Scope::kUid ? "uid " + std::to_string(tenant.uid)
                                            : scope == Scope::kContainer
                                                ? "container " + tenant.container
                                                : "namespace " + tenant.pod_namespace;
                return Status(Code::kResourceExhausted, EDQUOT,
                              std::string("quota '") + kNames[i] + "' exceeded for " + account + ": limit " +
                                  limitText(lim) + ", in use " + std::to_string(in_use) + ", asked " +
                                  std::to_string(want[i]));
            }
        }
        return Status::ok();
    };
    auto usedIn = [](const auto &map, const auto &key) -> const QuotaValues * {
        auto it = map.find(key);
        return it == map.end() ? nullptr : &it->second;
    };
    const QuotaOverride *uid_override = st.uidOverride(tenant.uid);
    RETURN_IF_ERROR(check(Scope::kUid, usedIn(st.uid_used, tenant.uid),
                          [&](size_t i) { return st.limit(uid_override, i); }));
    if (!tenant.container.empty()) {
        const QuotaOverride *o = st.containerOverride(tenant.container);
        RETURN_IF_ERROR(check(Scope::kContainer, usedIn(st.container_used, tenant.container),
                              [&](size_t i) { return st.limit(o, i); }));
    }
    if (!tenant.pod_namespace.empty()) {
        const QuotaValues limits = st.namespaceLimits(tenant.pod_namespace);
        RETURN_IF_ERROR(check(Scope::kNamespace, usedIn(st.namespace_used, tenant.pod_namespace),
                              [&](size_t i) { return limits[i]; }));
    }
    return Status::ok();
}

QuotaCharge QuotaManager::restore(const TenantKey &tenant, const QuotaValues &amounts) {
    std::lock_guard lock(state_->mu);
    return chargeLocked(*state_, tenant, amounts);
}

void QuotaManager::resize(QuotaCharge &charge, const TenantKey &tenant, Quota q, uint64_t amount) {
    const auto i = static_cast<size_t>(q);
    QuotaValues now = charge.amounts();
    const uint64_t had = now[i];
    if (had == amount) {
        return;
    }
    now[i] = amount;
    const bool same_tenant = charge.tenant_ != nullptr && charge.tenant_->state == state_ &&
                             charge.tenant_->key.uid == tenant.uid &&
                             charge.tenant_->key.container == tenant.container &&
                             charge.tenant_->key.pod_namespace == tenant.pod_namespace;
    if (!same_tenant || had == 0 || amount == 0) {
        charge = restore(tenant, now);  // gives the old charge back
        return;
    }
    charge.setAmounts(now);  // may throw (a spill) before any account changed
    // Every account of the tenant holds at least `had` of q (this charge's), so each is there and
    // none reaches zero in q: no account is made or dropped.
    std::lock_guard lock(state_->mu);
    QuotaCharge::State &st = *state_;
    auto adjust = [&](QuotaValues &used) { used[i] = used[i] - std::min(used[i], had) + amount; };
    adjust(st.uid_used.find(tenant.uid)->second);
    if (!tenant.container.empty()) {
        adjust(st.container_used.find(tenant.container)->second);
    }
    if (!tenant.pod_namespace.empty()) {
        adjust(st.namespace_used.find(tenant.pod_namespace)->second);
    }
}

QuotaCharge QuotaManager::chargeLocked(QuotaCharge::State &st, const TenantKey &tenant,
                                       const QuotaValues &want) {
    // Everything that may throw (map nodes) before anything is charged.
    QuotaValues &u = st.uid_used[tenant.uid];
    QuotaValues *c = tenant.container.empty() ? nullptr : &st.container_used[tenant.container];
    QuotaValues *ns = tenant.pod_namespace.empty() ? nullptr : &st.namespace_used[tenant.pod_namespace];
    QuotaCharge charge;
    charge.setAmounts(want);
    charge.tenant_ = st.acquireTenant(tenant);
    if (charge.tenant_->state == nullptr) {
        charge.tenant_->state = state_;
    }
    for (size_t i = 0; i < kQuotaCount; ++i) {
        u[i] += want[i];
        if (c != nullptr) {
            (*c)[i] += want[i];
        }
        if (ns != nullptr) {
            (*ns)[i] += want[i];
        }
    }
    return charge;
}

QuotaSnapshot QuotaManager::snapshot() const {
    std::lock_guard lock(state_->mu);
    const QuotaCharge::State &st = *state_;
    QuotaSnapshot s;
    s.defaults = st.config.defaults;
    for (const auto &[uid, used] : st.uid_used) {
        s.uids[uid] = {used, st.limits(st.uidOverride(uid))};
    }
    for (const auto &[c, used] : st.container_used) {
        s.containers[c] = {used, st.limits(st.containerOverride(c))};
    }
    for (const auto &[ns, used] : st.namespace_used) {
        s.namespaces[ns] = {used, st.namespaceLimits(ns)};
    }
    s.uid_overrides = st.config.uids;
    s.container_overrides = st.config.containers;
    s.namespace_overrides = st.config.namespaces;
    return s;
}

QuotaValues QuotaManager::usage(QuotaScope scope, uid_t uid, const std::string &name) const {
    std::lock_guard lock(state_->mu);
    const QuotaCharge::State &st = *state_;
    auto find = [](const auto &accounts, const auto &key) {
        auto it = accounts.find(key);
        return it == accounts.end() ? QuotaValues{} : it->second;
    };
    switch (scope) {
        case QuotaScope::kUid:
            return find(st.uid_used, uid);
        case QuotaScope::kContainer:
            return find(st.container_used, name);
        case QuotaScope::kNamespace:
            return find(st.namespace_used, name);
        case QuotaScope::kDefault:
            break;
    }
    return QuotaValues{};
}

namespace {

// Sets or removes one quota of the override of key in overrides.
template <typename Key>
void setIn(std::map<Key, QuotaOverride> &overrides, const Key &key, size_t i, std::optional<uint64_t> limit) {
    QuotaOverride &o = overrides[key];
    o.max[i] = limit;
    if (o.empty()) {
        overrides.erase(key);
    }
}

bool sameTarget(const QuotaEdit &a, const QuotaEdit &b) {
    return a.scope == b.scope && a.uid == b.uid && a.name == b.name && a.quota == b.quota;
}

}  // namespace

Status QuotaManager::apply(const QuotaEdit &e) {
    const auto i = static_cast<size_t>(e.quota);
    if (i >= kQuotaCount) {
        return Status(Code::kInvalidArgument, EINVAL, "no quota number " + std::to_string(i));
    }
    if (e.scope == QuotaScope::kDefault && !e.limit) {
        return Status(Code::kInvalidArgument, EINVAL, "a default cannot be cleared; set it to unlimited");
    }
    if ((e.scope == QuotaScope::kContainer || e.scope == QuotaScope::kNamespace) && e.name.empty()) {
        return Status(Code::kInvalidArgument, EINVAL,
                      std::string("a ") + (e.scope == QuotaScope::kContainer ? "container" : "namespace") +
                          " override needs its name");
    }
    std::lock_guard lock(state_->mu);
    QuotaConfig &c = state_->config;
    switch (e.scope) {
        case QuotaScope::kDefault:
            c.defaults[i] = *e.limit;
            break;
        case QuotaScope::kUid:
            setIn(c.uids, e.uid, i, e.limit);
            break;
        case QuotaScope::kContainer:
            setIn(c.containers, e.name, i, e.limit);
            break;
        case QuotaScope::kNamespace:
            setIn(c.namespaces, e.name, i, e.limit);
            break;
    }
    auto &edits = state_->edits;
    auto same =
        std::find_if(edits.begin(), edits.end(), [&](const QuotaEdit &x) { return sameTarget(x, e); });
    if (same != edits.end()) {
        same->limit = e.limit;
    } else {
        edits.push_back(e);
    }
    return Status::ok();
}

std::vector<QuotaEdit> QuotaManager::runtimeEdits() const {
    std::lock_guard lock(state_->mu);
    return state_->edits;
}

void QuotaManager::configure(QuotaConfig config) {
    std::lock_guard lock(state_->mu);
    state_->config = std::move(config);
    state_->edits.clear();
}

}  // namespace ibvx::daemon
