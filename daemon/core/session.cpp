#include "daemon/core/session.h"

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
                 const SessionHistory &history)
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
      memory_(std::move(memory)) {}

Session::~Session() {
    MappingManager::instance().dropSession(memory_.get());
}

std::optional<StoredReply> Session::findReply(uint64_t key) const {
    std::lock_guard lock(replies_mu_);
    for (auto it = replies_.rbegin(); it != replies_.rend(); ++it) {
        if (it->key == key) {
            return *it;
        }
    }
    return std::nullopt;
}

std::vector<StoredReply> Session::replies() const {
    std::lock_guard lock(replies_mu_);
    return {replies_.begin(), replies_.end()};
}

void Session::addReply(StoredReply reply) {
    std::lock_guard lock(replies_mu_);
    if (replies_.size() >= kMaxReplies) {
        replies_.pop_front();
    }
    replies_.push_back(std::move(reply));
    ++reply_seq_;
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
