// Admin events (ibv_extend.v1.Admin.Watch): a hub that numbers events and hands each to every
// watcher. Watchers are the Watch calls' reactors; a slow watcher drops events beyond its queue
// (the seq gap shows it) instead of slowing the broker.
//
// Threading: mu_ guards the subscriber list and the sequence number; publish() calls each
// subscriber's push() under mu_ (order: hub mu_ -> the subscriber's own lock), so a subscriber
// that unsubscribed is never pushed to afterwards.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "daemon/core/session.h"
#include "daemon/edge/audit_log.h"
#include "ibv_extend/v1/admin.pb.h"

namespace ibvx::daemon {

class AdminEventSink {
  public:
    virtual ~AdminEventSink() = default;
    virtual void push(const ::ibv_extend::v1::AdminEvent &event) = 0;
    // The broker is stopping: finish the stream once queued events are written.
    virtual void close() = 0;
};

class AdminEvents {
  public:
    using Event = ::ibv_extend::v1::AdminEvent;

    uint64_t subscribe(AdminEventSink *sink) {
        std::lock_guard lock(mu_);
        if (closed_) {
            return 0;
        }
        uint64_t id = next_id_++;
        sinks_.emplace(id, sink);
        watching_ = sinks_.size();
        return id;
    }
    void unsubscribe(uint64_t id) {
        std::lock_guard lock(mu_);
        sinks_.erase(id);
        watching_ = sinks_.size();
    }
    // Whether any Watch is open: an event nobody would receive need not be built (a racing
    // subscribe sees the events after it, as it would a moment later).
    bool watched() const { return watching_.load(std::memory_order_relaxed) != 0; }
    void publish(Event event) {
        std::lock_guard lock(mu_);
        event.set_seq(++seq_);
        event.set_time_unix_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         std::chrono::system_clock::now().time_since_epoch())
                                                         .count()));
        for (auto &[id, sink] : sinks_) {
            sink->push(event);
        }
    }
    // Ends every Watch stream and refuses new ones (broker shutdown).
    void closeAll() {
        std::lock_guard lock(mu_);
        closed_ = true;
        for (auto &[id, sink] : sinks_) {
            sink->close();
        }
    }
    size_t watchers() {
        std::lock_guard lock(mu_);
        return sinks_.size();
    }

    // An event about a session (open, close, eviction, object create/destroy).
    static Event aboutSession(Event::Kind kind, const Session &s, std::string message = {}) {
        Event e;
        e.set_kind(kind);
        e.set_session(s.id());
        e.set_pid(s.identity().creds.pid);
        e.set_uid(s.identity().creds.uid);
        e.set_pod_namespace(s.identity().pod_namespace);
        e.set_pod_name(s.identity().pod_name);
        e.set_message(std::move(message));
        return e;
    }
    static Event simple(Event::Kind kind, std::string message) {
        Event e;
        e.set_kind(kind);
        e.set_message(std::move(message));
        return e;
    }

    // The audit trail's log lines and counters (the events themselves are published here).
    AuditLog &audit() { return audit_; }

  private:
    std::mutex mu_;
    std::atomic<size_t> watching_{0};
    AuditLog audit_;
    std::unordered_map<uint64_t, AdminEventSink *> sinks_;
    uint64_t next_id_ = 1;
    uint64_t seq_ = 0;
    bool closed_ = false;
};

}  // namespace ibvx::daemon
