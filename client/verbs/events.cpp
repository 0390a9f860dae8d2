// Events, as softnda SPEC.md §9 raises them: a completion channel and a context's async_fd are
// eventfds in this process, handed to the broker, whose device adds to them; which CQ, QP or SRQ
// raised an event the face reads from the data path's counters in the queues' memory. And the end
// of a session, which to the program is a NIC's fatal error (docs/verbs.md, "When the session
// ends").
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <mutex>
#include <set>
#include <vector>

#include "client/broker/session_end.h"
#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {

// A completion channel: an eventfd a program may poll(); the broker's device adds to it when it
// raises an event on a CQ of the channel. Which CQ, the data path's event counters tell: each
// CQ's count is compared with what was last delivered.
struct FaceChannel {
    ibv_comp_channel ch{};
    std::mutex mu;
    std::vector<ShadowCq *> cqs;    // guarded by mu: CQs on this channel
    std::vector<ShadowCq *> fired;  // guarded by mu: events counted, not yet returned
    bool ended = false;             // guarded by mu: the context's session ended
};
static_assert(offsetof(FaceChannel, ch) == 0);

namespace {

struct Channels {
    std::mutex mu;
    std::set<ibv_comp_channel *> live;  // guarded by mu; so is each live channel's refcnt
};

Channels &channels() {
    static auto *c = new Channels;
    return *c;
}

// The contexts opened through ibv_open_device. mu is held while a session's end is handled, so
// ibv_close_device (which leaves the set first) cannot free a context that is being handled.
struct FaceContexts {
    std::mutex mu;
    std::set<ShadowContext *> live;  // guarded by mu
};

FaceContexts &faceContexts() {
    static auto *f = new FaceContexts;
    return *f;
}

void signalEventFd(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
}

// Moves every CQ of the channel whose event counter advanced to fired (one entry per event).
void collectFired(FaceChannel *f) {
    std::lock_guard lock(f->mu);
    for (ShadowCq *cq : f->cqs) {
        const ibv_extend_datapath_ops *dp = cq->owner->datapath;
        if (cq->dp.state == nullptr || dp->cq_events == nullptr) {
            continue;
        }
        uint32_t now = dp->cq_events(cq->dp.state);
        for (; cq->events_seen != now; ++cq->events_seen) {
            f->fired.push_back(cq);
        }
    }
}

// The oldest event of the channel not returned yet, counted as delivered to the program.
bool takeFired(FaceChannel *f, ibv_cq **cq, void **cq_context) {
    std::lock_guard lock(f->mu);
    if (f->fired.empty()) {
        return false;
    }
    ShadowCq *s = f->fired.front();
    f->fired.erase(f->fired.begin());
    s->events_delivered++;
    *cq = &s->cq;
    *cq_context = s->cq.cq_context;
    return true;
}

bool channelEnded(FaceChannel *f) {
    std::lock_guard lock(f->mu);
    return f->ended;
}

void endChannel(FaceChannel *f) {
    {
        std::lock_guard lock(f->mu);
        f->ended = true;
    }
    signalEventFd(f->ch.fd);
}

// Moves the context to the state a NIC's fatal error leaves: every attached queue flushed,
// every completion channel woken, IBV_EVENT_DEVICE_FATAL owed to ibv_get_async_event and the
// async fd woken. Once per context; the caller holds c->mu.
void endContextLocked(ShadowContext *c) {
    if (c->end != ShadowContext::End::kLive) {
        return;
    }
    c->end = ShadowContext::End::kFatalPending;
    flushAttachedLocked(c);
    {
        Channels &cs = channels();
        std::lock_guard lock(cs.mu);
        for (ibv_comp_channel *ch : cs.live) {
            if (ch->context == &c->ctx) {
                endChannel(reinterpret_cast<FaceChannel *>(ch));
            }
        }
    }
    signalEventFd(c->ctx.async_fd);
}

// The session's end handler (client/broker/session.h), on its watcher thread.
void onSessionEnd(broker::Session *session) {
    FaceContexts &fc = faceContexts();
    std::lock_guard lock(fc.mu);
    for (ShadowContext *c : fc.live) {
        if (c->session == session) {
            std::lock_guard clock(c->mu);
            endContextLocked(c);
        }
    }
}

// The next async event the data path's counters show on the context's attached queues: a QP
// moved to ERR by an error, an SRQ below its limit, a CQ in its error state (once). The caller
// holds c->mu.
bool takeQueueEventLocked(ShadowContext *c, ibv_async_event *event) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (auto cq_error = IBVX_DATAPATH_ENTRY(c, cq_error); cq_error != nullptr) {
        for (ShadowCq *q : c->dp_cqs) {
            if (!q->error_reported && cq_error(q->dp.state) != 0) {
                q->error_reported = true;
                *event = ibv_async_event{};
                event->element.cq = &q->cq;
                event->event_type = IBV_EVENT_CQ_ERR;
                return true;
            }
        }
    }
    for (ShadowQp *q : c->dp_qps) {
        if (dp->qp_fatal_events != nullptr && dp->qp_fatal_events(q->dp.state) != q->fatal_events_seen) {
            q->fatal_events_seen++;
            *event = ibv_async_event{};
            event->element.qp = &q->qp;
            event->event_type = IBV_EVENT_QP_FATAL;
            return true;
        }
    }
    for (ShadowSrq *q : c->dp_srqs) {
        if (dp->srq_limit_events != nullptr && dp->srq_limit_events(q->dp.state) != q->limit_events_seen) {
            q->limit_events_seen++;
            *event = ibv_async_event{};
            event->element.srq = &q->srq;
            event->event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
            return true;
        }
    }
    return false;
}

}  // namespace

void followSessionEnd(ShadowContext *c) {
    broker::setSessionEndHandler(onSessionEnd);
    FaceContexts &fc = faceContexts();
    std::lock_guard lock(fc.mu);
    fc.live.insert(c);
    if (!broker::sessionAlive(c->session)) {  // ended already: its watcher may have run before c was here
        std::lock_guard clock(c->mu);
        endContextLocked(c);
    }
}

void unfollowSessionEnd(ShadowContext *c) {
    FaceContexts &fc = faceContexts();
    std::lock_guard lock(fc.mu);
    fc.live.erase(c);
}

FaceChannel *faceChannel(ibv_comp_channel *ch) {
    Channels &cs = channels();
    std::lock_guard lock(cs.mu);
    return ch != nullptr && cs.live.count(ch) != 0 ? reinterpret_cast<FaceChannel *>(ch) : nullptr;
}

int channelEventFd(const FaceChannel *f) {
    return f->ch.fd;
}

void channelAddCq(FaceChannel *f, ShadowCq *s) {
    {
        std::lock_guard lock(channels().mu);
        f->ch.refcnt++;
    }
    std::lock_guard lock(f->mu);
    f->cqs.push_back(s);
}

void channelSetAsideCq(FaceChannel *f, ShadowCq *s) {
    ibv_cq *cq = &s->cq;
    pthread_mutex_lock(&cq->mutex);
    while (cq->comp_events_completed < s->events_delivered) {
        pthread_cond_wait(&cq->cond, &cq->mutex);
    }
    pthread_mutex_unlock(&cq->mutex);
    if (f != nullptr) {
        std::lock_guard lock(f->mu);
        std::erase(f->cqs, s);
        std::erase(f->fired, s);
    }
}

void channelSettleCq(FaceChannel *f, ShadowCq *s, bool gone) {
    if (f == nullptr) {
        return;
    }
    if (gone) {
        std::lock_guard lock(channels().mu);
        f->ch.refcnt--;
    } else {  // refused: still live
        std::lock_guard lock(f->mu);
        f->cqs.push_back(s);
    }
}

}  // namespace ibvx::client::verbs

using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

extern "C" {

ibv_comp_channel *ibvx_verbs_create_comp_channel(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr) {
        return failNull<ibv_comp_channel>(EINVAL);
    }
    int fd = eventfd(0, EFD_CLOEXEC);
    if (fd < 0) {
        return nullptr;
    }
    auto *f = new FaceChannel;
    f->ch.context = context;
    f->ch.fd = fd;
    f->ch.refcnt = 0;
    {
        Channels &cs = channels();
        std::lock_guard lock(cs.mu);
        cs.live.insert(&f->ch);
    }
    // A channel made after the session ended is an ended one (a handler that runs from now on
    // finds it in the set).
    std::lock_guard lock(c->mu);
    if (endedLocked(c)) {
        endChannel(f);
    }
    return &f->ch;
}

int ibvx_verbs_destroy_comp_channel(ibv_comp_channel *channel) {
    Channels &cs = channels();
    FaceChannel *f = nullptr;
    {
        std::lock_guard lock(cs.mu);
        if (channel == nullptr || cs.live.count(channel) == 0) {
            return EINVAL;
        }
        if (channel->refcnt != 0) {
            return EBUSY;  // CQs still use it, as libibverbs refuses
        }
        cs.live.erase(channel);
        f = reinterpret_cast<FaceChannel *>(channel);
    }
    close(f->ch.fd);
    delete f;
    return 0;
}

int ibvx_verbs_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context) {
    FaceChannel *f = faceChannel(channel);
    if (f == nullptr || cq == nullptr || cq_context == nullptr) {
        errno = EINVAL;
        return -1;
    }
    for (;;) {
        if (takeFired(f, cq, cq_context)) {
            return 0;
        }
        if (channelEnded(f)) {
            // The session ended: the events its end raised (armed CQs) first, then EIO, as the
            // kernel answers a read of a disassociated device's channel. The wake is passed on,
            // so every other waiter and poll() learns it too.
            collectFired(f);
            if (takeFired(f, cq, cq_context)) {
                return 0;
            }
            signalEventFd(f->ch.fd);
            errno = kEndedErrno;
            return -1;
        }
        uint64_t n = 0;
        if (read(f->ch.fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) {
            return -1;  // errno from read: EAGAIN on a non-blocking channel
        }
        collectFired(f);
    }
}

void ibvx_verbs_ack_cq_events(ibv_cq *cq, unsigned int nevents) {
    if (liveCq(cq) == nullptr) {
        return;
    }
    pthread_mutex_lock(&cq->mutex);
    cq->comp_events_completed += nevents;
    pthread_cond_signal(&cq->cond);
    pthread_mutex_unlock(&cq->mutex);
}

// The context's eventfd fires when the device raised an event; events found together are
// returned one per call.
int ibvx_verbs_get_async_event(ibv_context *context, ibv_async_event *event) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || event == nullptr) {
        errno = EINVAL;
        return -1;
    }
    for (;;) {
        {
            std::lock_guard lock(c->mu);
            if (c->end == ShadowContext::End::kFatalPending) {
                c->end = ShadowContext::End::kFatalDelivered;
                *event = ibv_async_event{};
                event->element.port_num = 1;  // as mlx5 reports its catastrophic error
                event->event_type = IBV_EVENT_DEVICE_FATAL;
                return 0;
            }
            if (takeQueueEventLocked(c, event)) {
                return 0;
            }
            if (c->end == ShadowContext::End::kFatalDelivered) {
                // Nothing more will come: EIO, as the kernel answers once a disassociated
                // device's events are read; the wake is passed on to other waiters and poll().
                signalEventFd(c->ctx.async_fd);
                errno = kEndedErrno;
                return -1;
            }
        }
        uint64_t n = 0;
        if (read(c->ctx.async_fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) {
            return -1;  // errno from read: EAGAIN when the program made async_fd non-blocking
        }
    }
}

void ibvx_verbs_ack_async_event(ibv_async_event *) {}

}  // extern "C"
