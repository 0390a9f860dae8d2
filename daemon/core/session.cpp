#include "daemon/core/session.h"

#include "common/zero_runs.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <utility>

namespace ibvx::daemon {
namespace {

uint64_t nowUnixMs() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
}

// The steady-clock instant of a wall-clock time in the past (now, if it is not in the past).
std::chrono::steady_clock::time_point steadyAt(uint64_t unix_ms) {
    uint64_t now = nowUnixMs();
    return std::chrono::steady_clock::now() - std::chrono::milliseconds(unix_ms < now ? now - unix_ms : 0);
}

// A reply read in place, copied out.
StoredReply owned(const StoredReplyView &v) {
    StoredReply r;
    r.key = v.key;
    r.method = v.method;
    r.code = v.code;
    r.message = v.message;
    r.details = v.details;
    r.response = v.response;
    return r;
}

}  // namespace

Session::Session(uint64_t id, const SessionToken &token, PeerIdentity identity, std::string client_name,
                 UniqueFd pidfd)
    : id_(id),
      token_(token),
      token_hex_(tokenToHex(token)),
      identity_(std::move(identity)),
      client_name_(std::move(client_name)),
      created_(std::chrono::steady_clock::now()),
      created_unix_ms_(nowUnixMs()),
      pidfd_(std::move(pidfd)),
      memory_(MappingManager::instance().createSession(id)) {}

Session::Session(uint64_t id, const SessionToken &token, PeerIdentity identity, std::string client_name,
                 UniqueFd pidfd, std::unique_ptr<SessionMemory> memory, UniqueFd channel,
                 SessionHistory history)
    : id_(id),
      token_(token),
      token_hex_(tokenToHex(token)),
      identity_(std::move(identity)),
      client_name_(std::move(client_name)),
      // A state from before created_unix_ms was recorded: the age starts at the restore.
      created_(history.created_unix_ms != 0 ? steadyAt(history.created_unix_ms)
                                            : std::chrono::steady_clock::now()),
      created_unix_ms_(history.created_unix_ms != 0 ? history.created_unix_ms : nowUnixMs()),
      earlier_calls_(history.calls),
      pidfd_(std::move(pidfd)),
      channel_(std::move(channel)),
      channel_fd_(channel_.get()),
      memory_(std::move(memory)) {
    for (StoredReply &r : history.replies) {
        addReply(std::move(r));
    }
}

Session::~Session() {
    MappingManager::instance().dropSession(memory_.get());
}

namespace {
// The first byte of a PackedReply's buffer: how the rest is kept.
constexpr char kPlain = 'p';
constexpr char kZeroRuns = 'z';
// A packed reply is this process's own encoding of what it stored: it decodes within any bound.
constexpr size_t kNoBound = std::numeric_limits<size_t>::max();
}  // namespace

Session::PackedReply Session::pack(const StoredReply &r) {
    PackedReply p;
    p.key = r.key;
    std::string raw;  // the buffer as kept when plain, less its first byte
    auto put = [&raw](const std::string &s) {
        uint32_t n = static_cast<uint32_t>(s.size());
        raw.append(reinterpret_cast<const char *>(&n), sizeof(n));
        raw += s;
    };
    int32_t code = r.code;
    raw.reserve(4 * sizeof(uint32_t) + r.method.size() + r.message.size() + r.details.size() +
                r.response.size());
    raw.append(reinterpret_cast<const char *>(&code), sizeof(code));
    put(r.method);
    put(r.message);
    put(r.details);
    raw += r.response;  // the rest
    std::string encoded;
    const bool zero_runs = encodeZeroRuns(raw, &encoded);
    const std::string &kept = zero_runs ? encoded : raw;
    p.bytes.reserve(1 + kept.size());
    p.bytes.push_back(zero_runs ? kZeroRuns : kPlain);
    p.bytes += kept;
    return p;
}

StoredReplyView Session::view(const PackedReply &p, std::string *scratch) {
    StoredReplyView v;
    v.key = p.key;
    std::string_view all = std::string_view(p.bytes).substr(1);
    if (p.bytes.front() == kZeroRuns) {
        // Encoded by pack(): it cannot fail.
        if (!decodeZeroRuns(all, kNoBound, scratch)) {
            std::abort();
        }
        all = *scratch;
    }
    size_t at = 0;
    auto take = [&](void *out, size_t n) {
        std::memcpy(out, all.data() + at, n);
        at += n;
    };
    auto get = [&]() {
        uint32_t n = 0;
        take(&n, sizeof(n));
        std::string_view s = all.substr(at, n);
        at += n;
        return s;
    };
    int32_t code = 0;
    take(&code, sizeof(code));
    v.code = code;
    v.method = get();
    v.message = get();
    v.details = get();
    v.response = all.substr(at);
    return v;
}

std::optional<StoredReply> Session::findReply(uint64_t key) const {
    std::lock_guard lock(replies_mu_);
    for (auto it = replies_.rbegin(); it != replies_.rend(); ++it) {
        if (it->key == key) {
            std::string scratch;
            return owned(view(*it, &scratch));
        }
    }
    return std::nullopt;
}

std::vector<StoredReply> Session::replies() const {
    uint64_t all = 0;
    return repliesSince(&all);
}

std::vector<StoredReply> Session::repliesSince(uint64_t *seq) const {
    std::vector<StoredReply> out;
    forEachReplySince(seq, [&out](const StoredReplyView &v) { out.push_back(owned(v)); });
    return out;
}

void Session::forEachReplySince(uint64_t *seq, const std::function<void(const StoredReplyView &)> &fn) const {
    std::lock_guard lock(replies_mu_);
    // Each reply's own number, not its place: a retired reply leaves a gap anywhere.
    auto first = replies_.end();
    while (first != replies_.begin() && std::prev(first)->seq > *seq) {
        --first;
    }
    *seq = reply_seq_;
    std::string scratch;
    for (auto it = first; it != replies_.end(); ++it) {
        fn(view(*it, &scratch));
    }
}

size_t Session::retireReplies(const std::vector<uint64_t> &keys) {
    std::deque<PackedReply> gone;  // their charges are given back outside the lock
    std::lock_guard lock(replies_mu_);
    for (uint64_t key : keys) {
        auto it = std::find_if(replies_.begin(), replies_.end(),
                               [key](const PackedReply &r) { return r.key == key; });
        if (it == replies_.end()) {
            continue;  // aged out, dropped for quota, or never stored (a call the broker refused early)
        }
        gone.push_back(std::move(*it));
        replies_.erase(it);
        if (retired_.size() >= kMaxReplies) {
            retired_.erase(retired_.begin());  // a restore keeps only the newest kMaxReplies anyway
        }
        retired_.push_back(key);
    }
    return gone.size();
}

std::vector<uint64_t> Session::takeRetired() {
    std::lock_guard lock(replies_mu_);
    return std::exchange(retired_, {});
}

void Session::untakeRetired(std::vector<uint64_t> keys) {
    std::lock_guard lock(replies_mu_);
    keys.insert(keys.end(), retired_.begin(), retired_.end());
    if (keys.size() > kMaxReplies) {
        keys.erase(keys.begin(), keys.end() - static_cast<std::ptrdiff_t>(kMaxReplies));
    }
    retired_ = std::move(keys);
}

size_t Session::storedReplyBytes() const {
    std::lock_guard lock(replies_mu_);
    size_t bytes = 0;
    for (const PackedReply &r : replies_) {
        bytes += sizeof(PackedReply) + r.bytes.capacity();
    }
    return bytes;
}

const Object *Session::object(uint64_t handle) const {
    auto it = objects_.find(handle);
    return it != objects_.end() ? it->second.get() : nullptr;
}

std::vector<const Object *> Session::objectsParentsFirst() const {
    std::vector<const Object *> all;
    all.reserve(objects_.size());
    for (const auto &[handle, obj] : objects_) {
        all.push_back(obj.get());
    }
    return inParentsFirstOrder(all, [](const Object *o) { return o->kind; });
}

SessionChanges Session::takeChanges() {
    return std::exchange(changes_, {});
}

void Session::takeChanges(SessionChanges *into) {
    into->touched.clear();
    into->erased.clear();
    into->parents.clear();
    std::swap(*into, changes_);
}

void Session::addReply(StoredReply reply, QuotaCharge quota) {
    PackedReply packed = pack(reply);
    packed.quota = std::move(quota);
    std::lock_guard lock(replies_mu_);
    if (replies_.size() >= kMaxReplies) {
        replies_.pop_front();
    }
    packed.seq = ++reply_seq_;
    replies_.push_back(std::move(packed));
}

bool Session::dropOldestReply() {
    std::lock_guard lock(replies_mu_);
    if (replies_.empty()) {
        return false;
    }
    replies_.pop_front();
    return true;
}

void Session::chargeReplies(const std::function<QuotaCharge()> &charge) {
    std::lock_guard lock(replies_mu_);
    for (PackedReply &r : replies_) {
        if (r.quota.empty()) {
            r.quota = charge();
        }
    }
}

void Session::dropReplies() {
    std::lock_guard lock(replies_mu_);
    replies_.clear();
}

bool Session::putXfer(uint64_t xfer_id, UniqueFd fd) {
    std::lock_guard lock(xfer_mu_);
    if (xfers_closed_ || xfers_.size() >= kMaxPendingXfers || xfers_.count(xfer_id) != 0) {
        return false;
    }
    xfers_.emplace(xfer_id, std::move(fd));
    xfer_cv_.notify_all();
    return true;
}

UniqueFd Session::takeXfer(uint64_t xfer_id, std::chrono::milliseconds timeout) {
    std::unique_lock lock(xfer_mu_);
    xfer_cv_.wait_for(lock, timeout, [&] { return xfers_closed_ || xfers_.count(xfer_id) != 0; });
    auto it = xfers_.find(xfer_id);
    if (it == xfers_.end()) {
        return UniqueFd();
    }
    UniqueFd fd = std::move(it->second);
    xfers_.erase(it);
    return fd;
}

}  // namespace ibvx::daemon
