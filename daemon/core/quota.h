// Per-tenant quotas: like the RDMA cgroup's rdma.max, but per uid and per container, because the
// kernel charges every object to the broker that creates it.
//
// Accounts: every charge goes to the tenant's uid account and, when the tenant runs in a
// recognised container (PeerIdentity::container_id), to that container's account too; it must
// fit both. A limit comes from the per-uid (or per-container) override when one is set for that
// quota, else from the defaults ([quotas] in the daemon config). kUnlimited means no limit.
// A tenant whose Kubernetes namespace is known (PeerIdentity::pod_namespace) is charged to that
// namespace's account too, which only its own [quotas.namespace.<name>] table limits.
//
// Exactness: reserve() checks and adds under one mutex, so N threads racing past a limit never
// overshoot; a reservation is a QuotaCharge that gives its amounts back when destroyed (or
// release()d), so an object that is never created (driver failure, rollback) or is destroyed
// returns exactly what it took. Accounts with nothing charged are dropped: when every session has
// ended the snapshot has no usage left.
//
// Runtime changes (for the Admin API): setOverride()/setDefault() take effect for the next
// reserve(); lowering a limit below the current usage keeps existing objects and refuses new
// ones until usage drops below it. The manager remembers them (runtimeEdits()) until the next
// configure(), so a broker restart can apply them again over the new process's configuration
// (docs/restart.md): a runtime change outlives a restart, not a configuration reload.
//
// Threading: every method is thread-safe. A QuotaCharge may outlive the QuotaManager (it keeps
// the shared state alive).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace ibvx::daemon {

// Append only: a restart's state carries quotas by this value (QuotaEdit).
enum class Quota : int {
    kContexts,
    kPds,
    kMrs,
    kMrBytes,  // bytes of registered memory
    kCqs,
    kQps,
    kSrqs,
    kQueueBytes,  // bytes of queue buffers (CQ, SQ/RQ, SRQ rings) the driver allocated
    kSessions,
    kAhs,  // address handles
    // What the broker holds for a tenant beside its objects (issue 26, hole 7):
    kEventFds,  // eventfds it keeps for event delivery: a context's async fd, a CQ's completion fd
    kReplies,   // stored replies (idempotency, docs/restart.md): each session keeps its newest 64
    // bytes of its sessions' restart state (docs/restart.md: each session's state file, image and
    // log, a memfd the broker holds and hands to systemd's fd store)
    kStateBytes,
    kXrcds,    // XRC domains (ibv_open_xrcd)
    kMws,      // memory windows (ibv_alloc_mw)
    kDmBytes,  // bytes of device memory (ibv_alloc_dm), as the driver rounded them
    kCount
};
inline constexpr size_t kQuotaCount = static_cast<size_t>(Quota::kCount);
inline constexpr uint64_t kUnlimited = UINT64_MAX;

// The config/API name: "contexts", "pds", "mrs", "mr_bytes", "cqs", "qps", "srqs",
// "queue_bytes", "sessions", "ahs", "event_fds", "replies", "state_bytes", "xrcds", "mws",
// "dm_bytes".
const char *quotaName(Quota q);
std::optional<Quota> quotaFromName(const std::string &name);

using QuotaValues = std::array<uint64_t, kQuotaCount>;

// Limits with "unset" per quota (an override falls back to the default where unset).
struct QuotaOverride {
    std::array<std::optional<uint64_t>, kQuotaCount> max{};
    bool empty() const;
};

struct QuotaConfig {
    QuotaValues defaults = unlimited();
    std::map<uid_t, QuotaOverride> uids;
    std::map<std::string, QuotaOverride> containers;
    // [quotas.namespace.<name>]: one account for every session of the namespace's pods (pod
    // identity, docs/kubernetes.md). Only what such a table sets limits it: the defaults are per
    // uid and per container, not per namespace.
    std::map<std::string, QuotaOverride> namespaces;
    static QuotaValues unlimited();
};

// Who is charged.
struct TenantKey {
    uid_t uid = 0;
    std::string container;        // "" when not in a recognised container
    std::string pod_namespace{};  // "" when no pod is known
};

// Whose limits a runtime change sets: everyone's defaults, or one account's override.
enum class QuotaScope { kDefault, kUid, kContainer, kNamespace };

// One runtime change: quota of the account (uid for kUid, name for kContainer/kNamespace) set
// to limit, or its override removed (nullopt; never for kDefault).
struct QuotaEdit {
    QuotaScope scope = QuotaScope::kDefault;
    uid_t uid = 0;
    std::string name;
    Quota quota = Quota::kContexts;
    std::optional<uint64_t> limit;
    bool operator==(const QuotaEdit &) const = default;
};

struct QuotaAccount {
    QuotaValues used{};
    QuotaValues limit{};  // the effective limits (override or default)
};

struct QuotaSnapshot {
    QuotaValues defaults{};
    std::map<uid_t, QuotaAccount> uids;              // accounts with something charged
    std::map<std::string, QuotaAccount> containers;  // idem
    std::map<uid_t, QuotaOverride> uid_overrides;
    std::map<std::string, QuotaOverride> container_overrides;
    std::map<std::string, QuotaAccount> namespaces;            // accounts with something charged
    std::map<std::string, QuotaOverride> namespace_overrides;  // a namespace's only limits
};

class QuotaManager;

// What one object (or session) holds against the quotas. Move-only; gives everything back when
// destroyed or release()d.
class QuotaCharge {
  public:
    QuotaCharge() = default;
    QuotaCharge(QuotaCharge &&o) noexcept;
    QuotaCharge &operator=(QuotaCharge &&o) noexcept;
    QuotaCharge(const QuotaCharge &) = delete;
    QuotaCharge &operator=(const QuotaCharge &) = delete;
    ~QuotaCharge() { release(); }

    void release();
    // Takes over other's amounts (same tenant); other becomes empty.
    void merge(QuotaCharge &&other);
    uint64_t amount(Quota q) const;
    bool empty() const;

  private:
    friend class QuotaManager;
    struct State;
    struct Tenant;
    // Every quota's amount, and setting them: a charge's amounts fit its slots unless it holds
    // more quotas than kSlots (then they spill to the heap). setAmounts may throw (the spill).
    QuotaValues amounts() const;
    void setAmounts(const QuotaValues &v);
    void clearAmounts();

    // Interned in the quota state and refcounted under its mutex: a broker holds a charge per
    // object, and a copy of the tenant (its container id is up to 64 characters) in each was
    // most of it. The tenant holds the state (a charge may outlive its QuotaManager), so a
    // charge is one pointer; nullptr: it holds nothing.
    Tenant *tenant_ = nullptr;
    // The quotas charged, as (quota, amount) slots: an object charges one to three quotas, and
    // a broker holds a charge per object and per stored reply, so a word for each of the 16
    // quotas (128 bytes) was most of a charge (issue 25: bytes per QP). Unused slots hold
    // kQuotaCount.
    static constexpr size_t kSlots = 3;
    uint64_t slot_amount_[kSlots] = {};
    uint8_t slot_quota_[kSlots] = {kQuotaCount, kQuotaCount, kQuotaCount};
    std::unique_ptr<QuotaValues> spill_;  // set instead of the slots for more quotas
};

class QuotaManager {
  public:
    explicit QuotaManager(QuotaConfig config = {});
    ~QuotaManager();
    QuotaManager(const QuotaManager &) = delete;
    QuotaManager &operator=(const QuotaManager &) = delete;

    // All-or-nothing: every amount fits in the tenant's uid and container accounts, or nothing is
    // charged and RESOURCE_EXHAUSTED names the quota, the account, the limit and the usage.
    StatusOr<QuotaCharge> reserve(const TenantKey &tenant,
                                  std::initializer_list<std::pair<Quota, uint64_t>> amounts);
    // What reserve() would answer, charging nothing: a probe for room (every mutating call asks
    // whether one more byte of restart state fits).
    Status check(const TenantKey &tenant, std::initializer_list<std::pair<Quota, uint64_t>> amounts) const;
    // Sets what charge holds of q to amount, without checking limits (as restore()): a charge
    // that follows a size (a session's restart state, after every commit). In place when
    // charge already holds some of q for tenant and amount is not 0; otherwise charge is
    // replaced by a new one.
    void resize(QuotaCharge &charge, const TenantKey &tenant, Quota q, uint64_t amount);

    // A restored charge (broker restart, docs/restart.md): what the tenant held before, charged
    // again without checking limits (it was admitted once; a limit lowered since only refuses
    // new charges).
    QuotaCharge restore(const TenantKey &tenant, const QuotaValues &amounts);

    // Usage, effective limits, defaults and overrides, copied under the lock.
    QuotaSnapshot snapshot() const;
    // Usage of one account (zeros when nothing is charged): kUid uses uid, kContainer and
    // kNamespace name.
    QuotaValues usage(QuotaScope scope, uid_t uid, const std::string &name = {}) const;

    // A runtime change (Admin API): an override (kUid uses uid, kContainer and kNamespace name;
    // limit nullopt removes the override of that quota, the default applies again) or a default
    // (limit required). INVALID_ARGUMENT for a default without a limit or an account without a
    // name; nothing changes then.
    Status apply(const QuotaEdit &edit);
    void setOverride(QuotaScope scope, uid_t uid, const std::string &name, Quota q,
                     std::optional<uint64_t> limit) {
        (void)apply(QuotaEdit{scope, uid, name, q, limit});
    }
    void setDefault(Quota q, uint64_t limit) {
        (void)apply(QuotaEdit{QuotaScope::kDefault, 0, "", q, limit});
    }
    // The runtime changes since the last configure(), the latest per account and quota, in the
    // order they were first made: what a restart applies again.
    std::vector<QuotaEdit> runtimeEdits() const;
    // Replaces defaults and every override (config reload) and forgets the runtime changes;
    // usage is kept.
    void configure(QuotaConfig config);

  private:
    // reserve()'s limits check; the caller holds st.mu.
    Status checkLocked(const QuotaCharge::State &st, const TenantKey &tenant,
                       std::initializer_list<std::pair<Quota, uint64_t>> amounts, QuotaValues *want) const;
    // Adds want to the tenant's accounts; the caller holds st.mu and checked the limits.
    QuotaCharge chargeLocked(QuotaCharge::State &st, const TenantKey &tenant, const QuotaValues &want);

    std::shared_ptr<QuotaCharge::State> state_;
};

}  // namespace ibvx::daemon
