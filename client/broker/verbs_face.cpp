// The verbs the libibverbs face serves (client/verbs_private.h), on this library's broker session
// and shadow objects: a face context IS a broker shadow context (a complete verbs_context), its
// PDs, MRs and queues are the same shadows ibv_extend.h and ibvx_* calls hand out, so the two
// APIs mix freely in one process and share one session.
//
// Return conventions are libibverbs' per verb (positive errno, -1 + errno, or NULL + errno); the
// broker seam answers negative errnos, flipped here. Every pointer a program hands in is checked
// against the registries before it is dereferenced (EINVAL otherwise).
//
// What is served and what is not, and why: docs/verbs.md.
#include <dlfcn.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "client/broker/convert.h"
#include "client/broker/shadow.h"
#include "client/broker_seam.h"
#include "client/verbs_private.h"
#include "common/c_abi.h"
#include "providers/loader/datapath_loader.h"

namespace ibvx::client::broker {
namespace {

// ---- devices ---------------------------------------------------------------------------------

// One ibv_device per broker device name, for the process lifetime (libibverbs keeps devices
// alive as long as contexts on them may exist; ours never go, which costs one struct per name).
struct FaceDevice {
    ibv_device dev{};
    std::string name;
    int index = 0;
    bool guid_known = false;  // guarded by Devices::mu
    uint64_t guid = 0;        // host order; guarded by Devices::mu
};

struct Devices {
    std::mutex mu;
    std::map<std::string, std::unique_ptr<FaceDevice>> by_name;  // guarded by mu
    std::set<const ibv_device *> known;                          // guarded by mu
    std::set<ibv_device **> lists;                               // guarded by mu: handed out
};

Devices &devices() {
    static auto *d = new Devices;  // outlives static destructors and atexit handlers
    return *d;
}

FaceDevice *faceDevice(const ibv_device *dev) {
    Devices &d = devices();
    std::lock_guard lock(d.mu);
    if (dev == nullptr || d.known.count(dev) == 0) {
        return nullptr;
    }
    return d.by_name.at(dev->name).get();
}

FaceDevice *deviceNamed(Devices &d, const std::string &name) {
    auto &slot = d.by_name[name];
    if (!slot) {
        slot = std::make_unique<FaceDevice>();
        FaceDevice &f = *slot;
        f.name = name;
        f.index = static_cast<int>(d.by_name.size()) - 1;
        // As libibverbs fills it from sysfs; the paths do not exist for a brokered device.
        snprintf(f.dev.name, sizeof(f.dev.name), "%s", name.c_str());
        snprintf(f.dev.dev_name, sizeof(f.dev.dev_name), "uverbs%d", f.index);
        snprintf(f.dev.dev_path, sizeof(f.dev.dev_path), "/sys/class/infiniband_verbs/uverbs%d", f.index);
        snprintf(f.dev.ibdev_path, sizeof(f.dev.ibdev_path), "/sys/class/infiniband/%s", name.c_str());
        f.dev.node_type = IBV_NODE_CA;
        f.dev.transport_type = IBV_TRANSPORT_IB;
        d.known.insert(&f.dev);
    }
    return slot.get();
}

// ---- contexts --------------------------------------------------------------------------------

ShadowContext *faceContext(const ibv_context *ctx) {
    return ctx != nullptr ? contextOf(ctx) : nullptr;
}

template <typename T>
T *failNullErrno(int err) {
    errno = err;
    return nullptr;
}

int queryDeviceAttr(ShadowContext *c, ibv_device_attr *attr) {
    pb::QueryDeviceAttrRequest req;
    req.set_context(c->handle);
    pb::QueryDeviceAttrResponse resp;
    int rc = c->session->call("QueryDeviceAttr", &pb::Broker::Stub::QueryDeviceAttr, req, &resp);
    if (rc == 0) {
        wire::fromProto(resp.attr(), attr);
    }
    return rc;
}

int queryPortInfo(ShadowContext *c, uint8_t port, pb::QueryPortResponse *resp) {
    pb::QueryPortRequest req;
    req.set_context(c->handle);
    req.set_port_num(port);
    return c->session->call("QueryPort", &pb::Broker::Stub::QueryPort, req, resp);
}

// verbs_context.query_port: what the ibv_query_port() macro calls.
int faceQueryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr, size_t attr_len) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    pb::QueryPortResponse resp;
    if (int rc = queryPortInfo(c, port, &resp); rc != 0) {
        return -rc;
    }
    ibv_port_attr full{};
    wire::fromProto(resp.attr(), &full);
    memcpy(attr, &full, std::min(attr_len, sizeof(full)));
    return 0;
}

// verbs_context.query_device_ex: the standard attributes; no extended capability is announced.
int faceQueryDeviceEx(ibv_context *context, const ibv_query_device_ex_input *, ibv_device_attr_ex *attr,
                      size_t attr_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    ibv_device_attr_ex ex{};
    if (int rc = queryDeviceAttr(c, &ex.orig_attr); rc != 0) {
        return -rc;
    }
    ex.phys_port_cnt_ex = ex.orig_attr.phys_port_cnt;
    memcpy(attr, &ex, std::min(attr_size, sizeof(ex)));
    return 0;
}

// ---- the data path: the inline verbs reach these through ctx.ops -------------------------------

// Queues without a data path state (made through the extend API, or on a driver that ships no
// data path) fail the libibverbs way. The shadow is found from the public struct without a
// registry lookup: these are the fast path, and only our context's ops lead here.
ShadowQp *qpShadow(ibv_qp *qp) {
    return shadowOf<ShadowQp>(qp, offsetof(ShadowQp, qp));
}
ShadowCq *cqShadow(ibv_cq *cq) {
    return shadowOf<ShadowCq>(cq, offsetof(ShadowCq, cq));
}
ShadowSrq *srqShadow(ibv_srq *srq) {
    return shadowOf<ShadowSrq>(srq, offsetof(ShadowSrq, srq));
}

int facePostSend(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    ShadowQp *s = qpShadow(qp);
    if (s->dp.state == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    return s->owner->datapath->post_send(s->dp.state, wr, bad_wr);
}
int facePostRecv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    ShadowQp *s = qpShadow(qp);
    if (s->dp.state == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    return s->owner->datapath->post_recv(s->dp.state, wr, bad_wr);
}
int facePostSrqRecv(ibv_srq *srq, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    ShadowSrq *s = srqShadow(srq);
    if (s->dp.state == nullptr || s->owner->datapath->post_srq_recv == nullptr) {
        *bad_wr = wr;
        return EOPNOTSUPP;
    }
    return s->owner->datapath->post_srq_recv(s->dp.state, wr, bad_wr);
}
int facePollCq(ibv_cq *cq, int n, ibv_wc *wc) {
    ShadowCq *s = cqShadow(cq);
    if (s->dp.state == nullptr) {
        return -EOPNOTSUPP;
    }
    return s->owner->datapath->poll_cq(s->dp.state, n, wc);
}
int faceReqNotifyCq(ibv_cq *cq, int solicited_only) {
    ShadowCq *s = cqShadow(cq);
    if (s->dp.state == nullptr || s->owner->datapath->req_notify_cq == nullptr) {
        return EOPNOTSUPP;
    }
    return s->owner->datapath->req_notify_cq(s->dp.state, solicited_only);
}

// ---- ibv_cq_ex's poll API, over the data path's poll_cq (one completion at a time) ----

ShadowCq *cqExShadow(ibv_cq_ex *cq) {
    return shadowOf<ShadowCq>(reinterpret_cast<ibv_cq *>(cq), offsetof(ShadowCq, cq));
}
int exTake(ibv_cq_ex *cq) {
    ShadowCq *s = cqExShadow(cq);
    int n = facePollCq(&s->cq, 1, &s->ex_wc);
    if (n < 0) {
        return -n;
    }
    if (n == 0) {
        return ENOENT;
    }
    cq->wr_id = s->ex_wc.wr_id;
    cq->status = s->ex_wc.status;
    return 0;
}
int exStartPoll(ibv_cq_ex *cq, ibv_poll_cq_attr *attr) {
    return attr != nullptr && attr->comp_mask != 0 ? EINVAL : exTake(cq);
}
int exNextPoll(ibv_cq_ex *cq) {
    return exTake(cq);
}
void exEndPoll(ibv_cq_ex *) {}
enum ibv_wc_opcode exReadOpcode(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.opcode;
}
uint32_t exReadVendorErr(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.vendor_err;
}
uint32_t exReadByteLen(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.byte_len;
}
__be32 exReadImmData(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.imm_data;
}
uint32_t exReadQpNum(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.qp_num;
}
uint32_t exReadSrcQp(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.src_qp;
}
unsigned int exReadWcFlags(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.wc_flags;
}
uint32_t exReadSlid(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.slid;
}
uint8_t exReadSl(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.sl;
}
uint8_t exReadDlidPathBits(ibv_cq_ex *cq) {
    return cqExShadow(cq)->ex_wc.dlid_path_bits;
}

// What ibv_create_cq_ex serves: the standard work-completion fields.
constexpr uint64_t kCqExWcFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                                  IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                                  IBV_WC_EX_WITH_DLID_PATH_BITS;

void fillCqEx(ShadowCq *s) {
    ibv_cq_ex &x = s->cq_ex;
    x.start_poll = exStartPoll;
    x.next_poll = exNextPoll;
    x.end_poll = exEndPoll;
    x.read_opcode = exReadOpcode;
    x.read_vendor_err = exReadVendorErr;
    x.read_byte_len = exReadByteLen;
    x.read_imm_data = exReadImmData;
    x.read_qp_num = exReadQpNum;
    x.read_src_qp = exReadSrcQp;
    x.read_wc_flags = exReadWcFlags;
    x.read_slid = exReadSlid;
    x.read_sl = exReadSl;
    x.read_dlid_path_bits = exReadDlidPathBits;
}

ibv_cq_ex *faceCreateCqEx(ibv_context *context, ibv_cq_init_attr_ex *attr);
ibv_qp *faceCreateQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr);

// The size of the data path's table, from IBV_EXTEND_DATAPATH_SIZE_SYMBOL of the object that
// holds it (the loader keeps that object loaded; RTLD_NOLOAD only takes one more reference, given
// back at once). A library without the symbol has the table up to query_srq.
uint32_t datapathSize(const ibv_extend_datapath_ops *dp) {
    constexpr auto kV1 = static_cast<uint32_t>(offsetof(ibv_extend_datapath_ops, query_srq) + sizeof(void *));
    Dl_info info{};
    if (dladdr(dp, &info) == 0 || info.dli_fname == nullptr) {
        return kV1;
    }
    void *handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (handle == nullptr) {
        return kV1;
    }
    const auto *size = static_cast<const uint32_t *>(dlsym(handle, IBV_EXTEND_DATAPATH_SIZE_SYMBOL));
    uint32_t n = size != nullptr && *size >= kV1 ? *size : kV1;
    dlclose(handle);
    return n;
}

void makeFaceContext(ShadowContext *c, FaceDevice *dev, int async_fd) {
    ibv_context &ctx = c->ctx;
    ctx.device = &dev->dev;
    ctx.async_fd = async_fd;
    ctx.num_comp_vectors = 1;
    ctx.abi_compat = __VERBS_ABI_IS_EXTENDED;
    c->vctx.sz = sizeof(c->vctx);
    c->vctx.query_port = faceQueryPort;
    c->vctx.query_device_ex = faceQueryDeviceEx;
    c->vctx.create_cq_ex = faceCreateCqEx;
    c->vctx.create_qp_ex = faceCreateQpEx;
    ctx.ops.post_send = facePostSend;
    ctx.ops.post_recv = facePostRecv;
    ctx.ops.post_srq_recv = facePostSrqRecv;
    ctx.ops.poll_cq = facePollCq;
    ctx.ops.req_notify_cq = faceReqNotifyCq;
    c->datapath = loader::datapathFor(c->info.provider);
    c->datapath_size = c->datapath != nullptr ? datapathSize(c->datapath) : 0;
}

// ---- completion channels -------------------------------------------------------------------

// A completion channel: an eventfd a program may poll(); the broker's device adds to it when it
// raises an event on a CQ of the channel (softnda SPEC.md §9). Which CQ, the data path's event
// counters tell: each CQ's count is compared with what was last delivered.
struct FaceChannel {
    ibv_comp_channel ch{};
    std::mutex mu;
    std::vector<ShadowCq *> cqs;    // guarded by mu: CQs on this channel
    std::vector<ShadowCq *> fired;  // guarded by mu: events counted, not yet returned
    bool ended = false;             // guarded by mu: the context's session ended
};

struct Channels {
    std::mutex mu;
    std::set<ibv_comp_channel *> live;  // guarded by mu
};

Channels &channels() {
    static auto *c = new Channels;
    return *c;
}

FaceChannel *faceChannel(ibv_comp_channel *ch) {
    Channels &cs = channels();
    std::lock_guard lock(cs.mu);
    return ch != nullptr && cs.live.count(ch) != 0 ? reinterpret_cast<FaceChannel *>(ch) : nullptr;
}
static_assert(offsetof(FaceChannel, ch) == 0);

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

// ---- the end of the session: a fatal device error, as the tenant sees it ----------------------

// What the data path, the event reads and ibv_req_notify_cq answer once the session ended: the
// errno the kernel gives a program whose RDMA device was disassociated (control verbs keep the
// session's ECONNRESET).
constexpr int kEndedErrno = EIO;

// The contexts opened through ibv_open_device. mu is held while a session's end is handled, so
// ibv_close_device (which leaves the set first) cannot free a context that is being handled.
// Lock order: FaceContexts::mu, then a context's mu, then Channels::mu, then a FaceChannel's mu;
// the data path's own locks are innermost.
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

// Whether the data path's table reaches its fatal entries (include/ibv_extend_datapath.h: the
// size it was built with is exported beside it, by the same object).
bool hasFatalEntries(const ShadowContext *c) {
    constexpr size_t kEnd = offsetof(ibv_extend_datapath_ops, srq_fatal) + sizeof(void *);
    return c->datapath != nullptr && c->datapath_size >= kEnd;
}

// The data path state of a CQ of context c, nullptr unless it is one of c's live data path CQs.
void *cqStateLocked(ShadowContext *c, ibv_cq *cq) {
    if (cq == nullptr) {
        return nullptr;
    }
    auto *s = shadowOf<ShadowCq>(cq, offsetof(ShadowCq, cq));
    return c->dp_cqs.count(s) != 0 ? s->dp.state : nullptr;
}

// Each object of an ended context, as the device's fatal error leaves it (the broker destroyed the
// queues before it closed the fd channel, so nothing else writes them): outstanding work flushed,
// later posts refused. The caller holds c->mu.
void endQpLocked(ShadowContext *c, ShadowQp *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->qp_fatal != nullptr) {
        (void)dp->qp_fatal(q->dp.state, cqStateLocked(c, q->qp.send_cq), cqStateLocked(c, q->qp.recv_cq),
                           kEndedErrno);
    }
}
void endSrqLocked(ShadowContext *c, ShadowSrq *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->srq_fatal != nullptr) {
        dp->srq_fatal(q->dp.state, kEndedErrno);
    }
}
void endCqLocked(ShadowContext *c, ShadowCq *q) {
    const ibv_extend_datapath_ops *dp = c->datapath;
    if (hasFatalEntries(c) && dp->cq_fatal != nullptr) {
        (void)dp->cq_fatal(q->dp.state, kEndedErrno);
    }
}
void endChannelLocked(FaceChannel *f) {
    {
        std::lock_guard lock(f->mu);
        f->ended = true;
    }
    signalEventFd(f->ch.fd);
}

// Moves the context to the state a NIC's fatal error leaves: every QP's outstanding work requests
// completed with IBV_WC_WR_FLUSH_ERR (QPs first, so armed CQs raise their event after the flushed
// completions are there), every completion channel woken, IBV_EVENT_DEVICE_FATAL owed to
// ibv_get_async_event and the async fd woken. Once per context; the caller holds c->mu.
void endContextLocked(ShadowContext *c) {
    if (c->end != ShadowContext::End::kLive) {
        return;
    }
    c->end = ShadowContext::End::kFatalPending;
    for (ShadowQp *q : c->dp_qps) {
        endQpLocked(c, q);
    }
    for (ShadowSrq *q : c->dp_srqs) {
        endSrqLocked(c, q);
    }
    for (ShadowCq *q : c->dp_cqs) {
        endCqLocked(c, q);
    }
    {
        Channels &cs = channels();
        std::lock_guard lock(cs.mu);
        for (ibv_comp_channel *ch : cs.live) {
            if (ch->context == &c->ctx) {
                endChannelLocked(reinterpret_cast<FaceChannel *>(ch));
            }
        }
    }
    signalEventFd(c->ctx.async_fd);
}

bool endedLocked(const ShadowContext *c) {
    return c->end != ShadowContext::End::kLive;
}

// The session's end handler (client/broker/session.h), on its watcher thread.
void onSessionEnd(Session *session) {
    FaceContexts &fc = faceContexts();
    std::lock_guard lock(fc.mu);
    for (ShadowContext *c : fc.live) {
        if (c->session == session) {
            std::lock_guard clock(c->mu);
            endContextLocked(c);
        }
    }
}

// ---- objects ---------------------------------------------------------------------------------

// Access flags libibverbs treats as hints (IBV_ACCESS_OPTIONAL_RANGE) are dropped, as a provider
// that lacks them does; relaxed ordering is the one softnda knows.
int mrAccess(unsigned int access) {
    unsigned int optional = access & IBV_ACCESS_OPTIONAL_RANGE;
    return static_cast<int>((access & ~optional) | (optional & IBV_ACCESS_RELAXED_ORDERING));
}

}  // namespace
}  // namespace ibvx::client::broker

using namespace ibvx::client;          // NOLINT: the seam's broker* functions
using namespace ibvx::client::broker;  // NOLINT: this file is the face's half of the library

extern "C" {

// ---- devices and contexts ----------------------------------------------------------------------

ibv_device **ibvx_verbs_get_device_list(int *num_devices) {
    Session *s = nullptr;
    if (int rc = currentSession(&s); rc != 0) {
        warn("ibv_get_device_list: no broker session (%s)", strerror(-rc));
        return failNullErrno<ibv_device *>(-rc);
    }
    pb::ListDevicesResponse resp;
    if (int rc = s->call("ListDevices", &pb::Broker::Stub::ListDevices, pb::ListDevicesRequest{}, &resp);
        rc != 0) {
        return failNullErrno<ibv_device *>(-rc);
    }
    const int n = resp.devices_size();
    auto **list = static_cast<ibv_device **>(calloc(static_cast<size_t>(n) + 1, sizeof(ibv_device *)));
    if (list == nullptr) {
        return failNullErrno<ibv_device *>(ENOMEM);
    }
    Devices &d = devices();
    std::lock_guard lock(d.mu);
    for (int i = 0; i < n; ++i) {
        list[i] = &deviceNamed(d, resp.devices(i).name())->dev;
    }
    d.lists.insert(list);
    if (num_devices != nullptr) {
        *num_devices = n;
    }
    return list;
}

void ibvx_verbs_free_device_list(ibv_device **list) {
    Devices &d = devices();
    {
        std::lock_guard lock(d.mu);
        if (list == nullptr || d.lists.erase(list) == 0) {
            warn("ibv_free_device_list: %p is not a list ibv_get_device_list() returned; ignored",
                 static_cast<void *>(list));
            return;
        }
    }
    free(list);
}

const char *ibvx_verbs_get_device_name(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    return f != nullptr ? f->dev.name : failNullErrno<const char>(EINVAL);
}

__be64 ibvx_verbs_get_device_guid(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        errno = EINVAL;
        return 0;
    }
    {
        std::lock_guard lock(devices().mu);
        if (f->guid_known) {
            return htobe64(f->guid);
        }
    }
    // The GUID is a device attribute: asked once, on a context opened for the purpose.
    ibv_context_extend *ext = brokerOpenByName(f->name.c_str());
    if (ext == nullptr) {
        return 0;
    }
    ibv_device_attr attr{};
    int rc = queryDeviceAttr(contextOf(ext->context), &attr);
    (void)brokerCloseDevice(ext);
    if (rc != 0) {
        errno = -rc;
        return 0;
    }
    std::lock_guard lock(devices().mu);
    f->guid = be64toh(attr.node_guid);
    f->guid_known = true;
    return attr.node_guid;
}

int ibvx_verbs_get_device_index(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        errno = EINVAL;
        return -1;
    }
    return f->index;
}

ibv_context *ibvx_verbs_open_device(ibv_device *device) {
    FaceDevice *f = faceDevice(device);
    if (f == nullptr) {
        warn("ibv_open_device: %p is not a device of ibv_get_device_list()", static_cast<void *>(device));
        return failNullErrno<ibv_context>(EINVAL);
    }
    // async_fd: blocking, as libibverbs' (programs set O_NONBLOCK themselves).
    int async_fd = eventfd(0, EFD_CLOEXEC);
    if (async_fd < 0) {
        return nullptr;
    }
    ibv_context_extend *ext = brokerOpenByName(f->name.c_str());
    if (ext == nullptr) {
        int err = errno;
        close(async_fd);
        return failNullErrno<ibv_context>(err);
    }
    ShadowContext *c = contextOf(ext->context);
    makeFaceContext(c, f, async_fd);
    setSessionEndHandler(onSessionEnd);
    {
        FaceContexts &fc = faceContexts();
        std::lock_guard lock(fc.mu);
        fc.live.insert(c);
        if (!c->session->alive()) {  // ended while opening: its watcher may have run already
            std::lock_guard clock(c->mu);
            endContextLocked(c);
        }
    }
    // The device signals async events on this fd; a broker or driver without events leaves it
    // silent (ibv_get_async_event then waits, as on a device with nothing to report).
    uint64_t xfer = 0;
    if (c->session->sendFd(async_fd, &xfer) == 0) {
        pb::SetAsyncEventFdRequest req;
        req.set_context(c->handle);
        req.set_xfer_id(xfer);
        pb::SetAsyncEventFdResponse resp;
        if (int rc = c->session->call("SetAsyncEventFd", &pb::Broker::Stub::SetAsyncEventFd, req, &resp);
            rc != 0) {
            warn("ibv_open_device: the broker raises no async events for %s (%s)", f->name.c_str(),
                 strerror(-rc));
        }
    }
    return &c->ctx;
}

int ibvx_verbs_close_device(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr) {
        errno = EINVAL;
        return -1;
    }
    {
        // Out of reach of a session end handled from now on (it may be running: this waits).
        FaceContexts &fc = faceContexts();
        std::lock_guard lock(fc.mu);
        fc.live.erase(c);
    }
    // What the program left is destroyed first, as the kernel frees it behind libibverbs'
    // ibv_close_device (perftest, for one, closes with a CQ still open).
    size_t left = 0;
    for (ShadowKind kind : {ShadowKind::kAh, ShadowKind::kQp, ShadowKind::kSrq, ShadowKind::kCq,
                            ShadowKind::kMr, ShadowKind::kPd}) {
        for (void *o : shadowsOf(c, kind)) {
            ++left;
            switch (kind) {
                case ShadowKind::kAh:
                    (void)ibvx_verbs_destroy_ah(&static_cast<ShadowAh *>(o)->ah);
                    break;
                case ShadowKind::kQp:
                    (void)ibvx_verbs_destroy_qp(&static_cast<ShadowQp *>(o)->qp);
                    break;
                case ShadowKind::kSrq:
                    (void)ibvx_verbs_destroy_srq(&static_cast<ShadowSrq *>(o)->srq);
                    break;
                case ShadowKind::kCq:
                    (void)ibvx_verbs_destroy_cq(&static_cast<ShadowCq *>(o)->cq);
                    break;
                case ShadowKind::kMr:
                    (void)ibvx_verbs_dereg_mr(&static_cast<ShadowMr *>(o)->mr);
                    break;
                case ShadowKind::kPd:
                    (void)ibvx_verbs_dealloc_pd(&static_cast<ShadowPd *>(o)->pd);
                    break;
            }
        }
    }
    if (left != 0) {
        warn("ibv_close_device: destroyed %zu object(s) the program left on the context", left);
    }
    int async_fd = c->ctx.async_fd;
    int rc = brokerCloseDevice(&c->ext);
    if (rc != 0 && contextOf(context) == c) {  // refused: the context lives on
        FaceContexts &fc = faceContexts();
        std::lock_guard lock(fc.mu);
        fc.live.insert(c);
    }
    if (rc != 0) {
        errno = -rc;
        return -1;
    }
    if (async_fd >= 0) {
        close(async_fd);
    }
    return 0;
}

// ---- queries -------------------------------------------------------------------------------------

int ibvx_verbs_query_device(ibv_context *context, ibv_device_attr *attr) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    return -queryDeviceAttr(c, attr);
}

int ibvx_verbs_query_port(ibv_context *context, uint8_t port_num, ibv_port_attr *attr) {
    return faceQueryPort(context, port_num, attr, sizeof(*attr));
}

int ibvx_verbs_query_gid_ex(ibv_context *context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry *entry,
                            uint32_t flags, size_t entry_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || entry == nullptr || flags != 0 || entry_size < sizeof(ibv_gid_entry) ||
        port_num == 0 || port_num > 255) {
        return EINVAL;
    }
    pb::QueryPortResponse resp;
    if (int rc = queryPortInfo(c, static_cast<uint8_t>(port_num), &resp); rc != 0) {
        return -rc;
    }
    for (const pb::GidEntry &g : resp.gids()) {
        if (g.index() == gid_index) {
            (void)ibvx::wire::fromProto(g, entry);
            entry->port_num = port_num;
            return 0;
        }
    }
    return ENODATA;  // as libibverbs answers an empty GID slot
}

int ibvx_verbs_query_gid(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid) {
    ibv_gid_entry e{};
    if (gid == nullptr || index < 0) {
        errno = EINVAL;
        return -1;
    }
    int rc = ibvx_verbs_query_gid_ex(context, port_num, static_cast<uint32_t>(index), &e, 0, sizeof(e));
    if (rc == ENODATA) {
        *gid = ibv_gid{};  // libibverbs reads an empty slot as the zero GID
        return 0;
    }
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    *gid = e.gid;
    return 0;
}

ssize_t ibvx_verbs_query_gid_table(ibv_context *context, ibv_gid_entry *entries, size_t max_entries,
                                   uint32_t flags, size_t entry_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || (entries == nullptr && max_entries != 0) || flags != 0 ||
        entry_size < sizeof(ibv_gid_entry)) {
        return -EINVAL;
    }
    size_t n = 0;
    for (uint32_t port = 1; port <= c->info.phys_port_cnt && port <= 255; ++port) {
        pb::QueryPortResponse resp;
        if (int rc = queryPortInfo(c, static_cast<uint8_t>(port), &resp); rc != 0) {
            return rc;
        }
        for (const pb::GidEntry &g : resp.gids()) {
            if (n == max_entries) {
                return -EINVAL;  // the table does not fit, as libibverbs answers
            }
            auto *e = reinterpret_cast<ibv_gid_entry *>(reinterpret_cast<char *>(entries) + n * entry_size);
            (void)ibvx::wire::fromProto(g, e);
            e->port_num = port;
            ++n;
        }
    }
    return static_cast<ssize_t>(n);
}

int ibvx_verbs_query_gid_type(ibv_context *context, uint8_t port_num, unsigned int index, int *type) {
    ibv_gid_entry e{};
    if (type == nullptr) {
        errno = EINVAL;
        return -1;
    }
    int rc = ibvx_verbs_query_gid_ex(context, port_num, index, &e, 0, sizeof(e));
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    *type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;  // rdma-core's IBV_GID_TYPE_SYSFS_*
    return 0;
}

// The P_Key table is not carried by the broker: every device answers the default table, one
// full-membership 0xffff entry (what softnda has and what an unpartitioned fabric uses).
int ibvx_verbs_query_pkey(ibv_context *context, uint8_t port_num, int index, __be16 *pkey) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || pkey == nullptr || index != 0 || port_num == 0 || port_num > c->info.phys_port_cnt) {
        errno = EINVAL;
        return -1;
    }
    *pkey = htobe16(0xffff);
    return 0;
}

int ibvx_verbs_get_pkey_index(ibv_context *context, uint8_t port_num, __be16 pkey) {
    __be16 p0 = 0;
    if (ibvx_verbs_query_pkey(context, port_num, 0, &p0) != 0) {
        return -1;
    }
    if (p0 != pkey) {
        errno = ENOENT;
        return -1;
    }
    return 0;
}

// ---- PDs and MRs ---------------------------------------------------------------------------------

ibv_pd *ibvx_verbs_alloc_pd(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    return c != nullptr ? brokerAllocPd(&c->ext) : failNullErrno<ibv_pd>(EINVAL);
}

int ibvx_verbs_dealloc_pd(ibv_pd *pd) {
    return livePd(pd) != nullptr ? -brokerDeallocPd(pd) : EINVAL;
}

ibv_mr *ibvx_verbs_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
    if (livePd(pd) == nullptr) {
        return failNullErrno<ibv_mr>(EINVAL);
    }
    return brokerRegMrIova(pd, addr, length, iova, mrAccess(access));
}

int ibvx_verbs_dereg_mr(ibv_mr *mr) {
    return -brokerDeregMr(mr);  // EINVAL for a pointer the seam does not know
}

// ---- completion channels and CQs -----------------------------------------------------------------

ibv_comp_channel *ibvx_verbs_create_comp_channel(ibv_context *context) {
    if (faceContext(context) == nullptr) {
        return failNullErrno<ibv_comp_channel>(EINVAL);
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
    ShadowContext *c = faceContext(context);
    std::lock_guard lock(c->mu);
    if (endedLocked(c)) {
        endChannelLocked(f);
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

ibv_cq *ibvx_verbs_create_cq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel,
                             int comp_vector) {
    ShadowContext *c = faceContext(context);
    FaceChannel *f = channel != nullptr ? faceChannel(channel) : nullptr;
    if (c == nullptr || cqe <= 0 || comp_vector < 0 || comp_vector >= context->num_comp_vectors ||
        (channel != nullptr && (f == nullptr || channel->context != context))) {
        return failNullErrno<ibv_cq>(EINVAL);
    }
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = static_cast<uint32_t>(cqe);
    a.attr.cq_context = cq_context;
    a.attr.channel = channel;
    a.attr.comp_vector = static_cast<uint32_t>(comp_vector);
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *ext = createCqWithEvents(c, &a, f != nullptr ? f->ch.fd : -1);
    if (ext == nullptr) {
        return nullptr;
    }
    ShadowCq *s = IBVX_SHADOW_OF(ShadowCq, ext, ext);
    ibv_cq *cq = ext->cq;
    cq->channel = channel;
    cq->cq_context = cq_context;
    pthread_mutex_init(&cq->mutex, nullptr);
    pthread_cond_init(&cq->cond, nullptr);
    if (c->datapath != nullptr) {
        void *state = c->datapath->cq_open(ext, cq->cqe);
        if (state == nullptr) {
            int err = errno != 0 ? errno : EINVAL;
            warn("ibv_create_cq: the %s data path refused the CQ (%s)", c->info.provider, strerror(err));
            (void)ibv_destroy_cq_extend(&c->ext, ext);
            return failNullErrno<ibv_cq>(err);
        }
        s->dp.close = c->datapath->cq_close;
        s->dp.state = state;
        std::lock_guard lock(c->mu);
        c->dp_cqs.insert(s);
        if (endedLocked(c)) {
            endCqLocked(c, s);
        }
    }
    if (f != nullptr) {
        {
            std::lock_guard lock(channels().mu);
            channel->refcnt++;
        }
        std::lock_guard lock(f->mu);
        f->cqs.push_back(s);
    }
    return cq;
}

int ibvx_verbs_destroy_cq(ibv_cq *cq) {
    ShadowCq *s = liveCq(cq);
    if (s == nullptr) {
        return EINVAL;
    }
    ibv_comp_channel *channel = cq->channel;
    FaceChannel *f = channel != nullptr ? faceChannel(channel) : nullptr;
    // As libibverbs: every event returned by ibv_get_cq_event must be acknowledged first.
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
    ShadowContext *c = s->owner;
    const bool has_dp = s->dp.state != nullptr;
    {
        std::lock_guard lock(c->mu);
        c->dp_cqs.erase(s);
    }
    int rc = ibv_destroy_cq_extend(&c->ext, &s->ext);
    // Gone either way when the broker destroyed it or the session ended (the shadow is freed).
    const bool gone = rc == 0 || ownerOf(s) == nullptr;
    if (!gone && has_dp) {
        std::lock_guard lock(c->mu);
        c->dp_cqs.insert(s);
    }
    if (f != nullptr) {
        if (gone) {
            std::lock_guard lock(channels().mu);
            channel->refcnt--;
        } else {  // refused: still live
            std::lock_guard lock(f->mu);
            f->cqs.push_back(s);
        }
    }
    return -rc;
}

int ibvx_verbs_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context) {
    FaceChannel *f = faceChannel(channel);
    if (f == nullptr || cq == nullptr || cq_context == nullptr) {
        errno = EINVAL;
        return -1;
    }
    auto take = [&] {
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
    };
    for (;;) {
        if (take()) {
            return 0;
        }
        bool ended = false;
        {
            std::lock_guard lock(f->mu);
            ended = f->ended;
        }
        if (ended) {
            // The session ended: the events its end raised (armed CQs) first, then EIO, as the
            // kernel answers a read of a disassociated device's channel. The wake is passed on,
            // so every other waiter and poll() learns it too.
            collectFired(f);
            if (take()) {
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

// ---- QPs, SRQs, AHs ------------------------------------------------------------------------------

ibv_qp *ibvx_verbs_create_qp(ibv_pd *pd, ibv_qp_init_attr *attr) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || attr == nullptr) {
        return failNullErrno<ibv_qp>(EINVAL);
    }
    ShadowContext *c = p->owner;
    ibv_qp_init_attr_extend a{};
    a.pd = pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_qp_extend *ext = ibv_create_qp_extend(&c->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->cap = a.attr.cap;  // what the broker granted, as ibv_create_qp() reports
    ShadowQp *s = IBVX_SHADOW_OF(ShadowQp, ext, ext);
    if (c->datapath != nullptr) {
        ibv_extend_datapath_qp_attr dattr{};
        dattr.qp = ext;
        dattr.qp_type = attr->qp_type;
        dattr.cap = s->cap;
        dattr.sq_sig_all = attr->sq_sig_all;
        dattr.has_srq = attr->srq != nullptr;
        void *state = c->datapath->qp_open(&dattr);
        if (state == nullptr) {
            int err = errno != 0 ? errno : EINVAL;
            warn("ibv_create_qp: the %s data path refused the QP (%s)", c->info.provider, strerror(err));
            (void)ibv_destroy_qp_extend(&c->ext, ext);
            return failNullErrno<ibv_qp>(err);
        }
        s->dp.close = c->datapath->qp_close;
        s->dp.state = state;
        std::lock_guard lock(c->mu);
        c->dp_qps.insert(s);
        if (endedLocked(c)) {
            endQpLocked(c, s);
        }
    }
    return ext->qp;
}

int ibvx_verbs_destroy_qp(ibv_qp *qp) {
    ShadowQp *s = liveQp(qp);
    if (s == nullptr) {
        return EINVAL;
    }
    ShadowContext *c = s->owner;
    {
        std::lock_guard lock(c->mu);
        c->dp_qps.erase(s);
    }
    int rc = ibv_destroy_qp_extend(&c->ext, &s->ext);
    if (rc != 0 && ownerOf(s) != nullptr && s->dp.state != nullptr) {  // refused, still live
        std::lock_guard lock(c->mu);
        c->dp_qps.insert(s);
    }
    return -rc;
}

int ibvx_verbs_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) {
    if (attr == nullptr) {
        return EINVAL;
    }
    return -brokerModifyQp(qp, attr, attr_mask);  // EINVAL for a QP the seam does not know
}

int ibvx_verbs_query_qp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) {
    if (attr == nullptr || init_attr == nullptr) {
        return EINVAL;
    }
    ShadowQp *s = liveQp(qp);
    if (s != nullptr && !s->owner->session->alive()) {
        // The session ended: the QP is in ERR, as after a device's fatal error, and what else the
        // tenant can still be told is what it was granted.
        *attr = ibv_qp_attr{};
        attr->qp_state = IBV_QPS_ERR;
        attr->cur_qp_state = IBV_QPS_ERR;
        attr->cap = s->cap;
        *init_attr = grantedInitAttr(*s);
        qp->state = IBV_QPS_ERR;
        return 0;
    }
    return -brokerQueryQp(qp, attr, attr_mask, init_attr);
}

ibv_srq *ibvx_verbs_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || attr == nullptr) {
        return failNullErrno<ibv_srq>(EINVAL);
    }
    ShadowContext *c = p->owner;
    ibv_srq_init_attr_extend a{};
    a.pd = pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_srq_extend *ext = ibv_create_srq_extend(&c->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->attr = a.attr.attr;  // granted max_wr / max_sge
    ShadowSrq *s = IBVX_SHADOW_OF(ShadowSrq, ext, ext);
    if (c->datapath != nullptr && c->datapath->srq_open != nullptr) {
        void *state = c->datapath->srq_open(ext, &attr->attr);
        if (state == nullptr) {
            int err = errno != 0 ? errno : EINVAL;
            warn("ibv_create_srq: the %s data path refused the SRQ (%s)", c->info.provider, strerror(err));
            (void)ibv_destroy_srq_extend(&c->ext, ext);
            return failNullErrno<ibv_srq>(err);
        }
        s->dp.close = c->datapath->srq_close;
        s->dp.state = state;
        std::lock_guard lock(c->mu);
        c->dp_srqs.insert(s);
        if (endedLocked(c)) {
            endSrqLocked(c, s);
        }
    }
    return ext->srq;
}

int ibvx_verbs_destroy_srq(ibv_srq *srq) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr) {
        return EINVAL;
    }
    ShadowContext *c = s->owner;
    {
        std::lock_guard lock(c->mu);
        c->dp_srqs.erase(s);
    }
    int rc = ibv_destroy_srq_extend(&c->ext, &s->ext);
    if (rc != 0 && ownerOf(s) != nullptr && s->dp.state != nullptr) {  // refused, still live
        std::lock_guard lock(c->mu);
        c->dp_srqs.insert(s);
    }
    return -rc;
}

// Answered by the driver's data path where it can (an SRQ limit is a store to the queue's memory
// on softnda); the broker has no SRQ modify/query call.
int ibvx_verbs_modify_srq(ibv_srq *srq, ibv_srq_attr *attr, int attr_mask) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr || attr == nullptr) {
        return EINVAL;
    }
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (s->dp.state == nullptr || dp->modify_srq == nullptr) {
        return EOPNOTSUPP;
    }
    return dp->modify_srq(s->dp.state, attr, attr_mask);
}

int ibvx_verbs_query_srq(ibv_srq *srq, ibv_srq_attr *attr) {
    ShadowSrq *s = liveSrq(srq);
    if (s == nullptr || attr == nullptr) {
        return EINVAL;
    }
    const ibv_extend_datapath_ops *dp = s->owner->datapath;
    if (s->dp.state == nullptr || dp->query_srq == nullptr) {
        return EOPNOTSUPP;
    }
    return dp->query_srq(s->dp.state, attr);
}

// An address handle is checked and kept here: softnda connects RC QPs by QP number and serves no
// UD, so the broker has no AH resource to hold (docs/verbs.md).
ibv_ah *ibvx_verbs_create_ah(ibv_pd *pd, ibv_ah_attr *attr) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || attr == nullptr || attr->port_num == 0 ||
        attr->port_num > p->owner->info.phys_port_cnt || (!attr->is_global && attr->dlid == 0)) {
        return failNullErrno<ibv_ah>(EINVAL);
    }
    auto *a = new ShadowAh{};
    a->owner = p->owner;
    a->attr = *attr;
    a->ah.context = pd->context;
    a->ah.pd = pd;
    track(a, p->owner);
    return &a->ah;
}

int ibvx_verbs_destroy_ah(ibv_ah *ah) {
    if (ah == nullptr) {
        return EINVAL;
    }
    auto *a = shadowOf<ShadowAh>(ah, offsetof(ShadowAh, ah));
    if (!untrack(a)) {
        return EINVAL;
    }
    delete a;
    return 0;
}

// ---- async events ----------------------------------------------------------------------------------

// Async events: the context's eventfd fires when the device raised one; the data path's counters
// say on which QP (fatal) or SRQ (limit reached). Events found together are queued and returned
// one per call.
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
            const ibv_extend_datapath_ops *dp = c->datapath;
            for (ShadowQp *q : c->dp_qps) {
                if (dp->qp_fatal_events != nullptr &&
                    dp->qp_fatal_events(q->dp.state) != q->fatal_events_seen) {
                    q->fatal_events_seen++;
                    *event = ibv_async_event{};
                    event->element.qp = &q->qp;
                    event->event_type = IBV_EVENT_QP_FATAL;
                    return 0;
                }
            }
            for (ShadowSrq *q : c->dp_srqs) {
                if (dp->srq_limit_events != nullptr &&
                    dp->srq_limit_events(q->dp.state) != q->limit_events_seen) {
                    q->limit_events_seen++;
                    *event = ibv_async_event{};
                    event->element.srq = &q->srq;
                    event->event_type = IBV_EVENT_SRQ_LIMIT_REACHED;
                    return 0;
                }
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

ibv_qp_ex *ibvx_verbs_qp_to_qp_ex(ibv_qp *qp) {
    ShadowQp *s = liveQp(qp);
    if (s == nullptr) {
        return failNullErrno<ibv_qp_ex>(EINVAL);
    }
    return s->has_qp_ex ? &s->qp_ex : failNullErrno<ibv_qp_ex>(EOPNOTSUPP);
}

// ---- fork ------------------------------------------------------------------------------------------

// Registered memory needs no madvise(MADV_DONTFORK): a child gets private copies of shared pages
// (client/broker/shared_pages.h), as the kernel gives it of pinned pages when fork is "unneeded".
int ibvx_verbs_fork_init(void) {
    return 0;
}

ibv_fork_status ibvx_verbs_is_fork_initialized(void) {
    return IBV_FORK_UNNEEDED;
}

}  // extern "C"

namespace ibvx::client::broker {
namespace {

ibv_cq_ex *faceCreateCqEx(ibv_context *context, ibv_cq_init_attr_ex *attr) {
    if (attr == nullptr || (attr->wc_flags & ~kCqExWcFlags) != 0 || attr->comp_mask != 0) {
        warn("ibv_create_cq_ex: only the standard completion fields are served (wc_flags 0x%llx)",
             attr != nullptr ? static_cast<unsigned long long>(attr->wc_flags) : 0ull);
        return failNullErrno<ibv_cq_ex>(EOPNOTSUPP);
    }
    ibv_cq *cq = ibvx_verbs_create_cq(context, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                                      static_cast<int>(attr->comp_vector));
    if (cq == nullptr) {
        return nullptr;
    }
    ShadowCq *s = cqShadow(cq);
    fillCqEx(s);
    return &s->cq_ex;
}

// ---- ibv_qp_ex's ibv_wr_* post API, over the data path's post_send ----------------------------

// The work requests between ibv_wr_start() and ibv_wr_complete(), posted as one chain (one
// doorbell). Inline data is copied when it is set, as providers copy it into the WQE.
struct WrBatch {
    std::deque<ibv_send_wr> wrs;
    std::deque<std::vector<ibv_sge>> sges;
    std::deque<std::string> inline_data;
    int error = 0;  // the first misuse (an SGE with no work request): wr_complete answers it
};

WrBatch *batchOf(ibv_qp_ex *qpx) {
    ShadowQp *s = shadowOf<ShadowQp>(&qpx->qp_base, offsetof(ShadowQp, qp));
    if (s->wr_batch.state == nullptr) {
        s->wr_batch.state = new WrBatch;
        s->wr_batch.close = [](void *b) { delete static_cast<WrBatch *>(b); };
    }
    return static_cast<WrBatch *>(s->wr_batch.state);
}

ibv_send_wr &addWr(ibv_qp_ex *qpx, ibv_wr_opcode opcode) {
    WrBatch *b = batchOf(qpx);
    ibv_send_wr &wr = b->wrs.emplace_back();
    wr.wr_id = qpx->wr_id;
    wr.send_flags = qpx->wr_flags;
    wr.opcode = opcode;
    return wr;
}

ibv_send_wr *lastWr(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    if (b->wrs.empty()) {
        b->error = EINVAL;
        return nullptr;
    }
    return &b->wrs.back();
}

void wrStart(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    b->wrs.clear();
    b->sges.clear();
    b->inline_data.clear();
    b->error = 0;
}
int wrComplete(ibv_qp_ex *qpx) {
    WrBatch *b = batchOf(qpx);
    int rc = b->error;
    if (rc == 0 && !b->wrs.empty()) {
        for (size_t i = 0; i + 1 < b->wrs.size(); ++i) {
            b->wrs[i].next = &b->wrs[i + 1];
        }
        b->wrs.back().next = nullptr;
        ibv_send_wr *bad = nullptr;
        rc = facePostSend(&qpx->qp_base, &b->wrs.front(), &bad);
    }
    wrStart(qpx);
    return rc;
}
void wrAbort(ibv_qp_ex *qpx) {
    wrStart(qpx);
}
void wrSend(ibv_qp_ex *qpx) {
    addWr(qpx, IBV_WR_SEND);
}
void wrSendImm(ibv_qp_ex *qpx, __be32 imm) {
    addWr(qpx, IBV_WR_SEND_WITH_IMM).imm_data = imm;
}
void wrRdmaWrite(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_WRITE);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
}
void wrRdmaWriteImm(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, __be32 imm) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_WRITE_WITH_IMM);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
    wr.imm_data = imm;
}
void wrRdmaRead(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_RDMA_READ);
    wr.wr.rdma.rkey = rkey;
    wr.wr.rdma.remote_addr = addr;
}
void wrCmpSwp(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_ATOMIC_CMP_AND_SWP);
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.compare_add = compare;
    wr.wr.atomic.swap = swap;
}
void wrFetchAdd(ibv_qp_ex *qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
    ibv_send_wr &wr = addWr(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD);
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.compare_add = add;
}
void wrSetSgeList(ibv_qp_ex *qpx, size_t n, const ibv_sge *list) {
    ibv_send_wr *wr = lastWr(qpx);
    if (wr == nullptr) {
        return;
    }
    auto &sges = batchOf(qpx)->sges.emplace_back(list, list + n);
    wr->sg_list = sges.data();
    wr->num_sge = static_cast<int>(n);
}
void wrSetSge(ibv_qp_ex *qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
    ibv_sge sge{addr, length, lkey};
    wrSetSgeList(qpx, 1, &sge);
}
void wrSetInlineDataList(ibv_qp_ex *qpx, size_t n, const ibv_data_buf *bufs) {
    ibv_send_wr *wr = lastWr(qpx);
    if (wr == nullptr) {
        return;
    }
    WrBatch *b = batchOf(qpx);
    std::string &data = b->inline_data.emplace_back();
    for (size_t i = 0; i < n; ++i) {
        data.append(static_cast<const char *>(bufs[i].addr), bufs[i].length);
    }
    ibv_sge sge{reinterpret_cast<uintptr_t>(data.data()), static_cast<uint32_t>(data.size()), 0};
    wrSetSgeList(qpx, 1, &sge);
    wr->send_flags |= IBV_SEND_INLINE;
}
void wrSetInlineData(ibv_qp_ex *qpx, void *addr, size_t length) {
    ibv_data_buf buf{addr, length};
    wrSetInlineDataList(qpx, 1, &buf);
}

// The send operations the batch API serves (what ibv_post_send serves on softnda).
constexpr uint64_t kQpExSendOps = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                                  IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
                                  IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

void fillQpEx(ShadowQp *s) {
    ibv_qp_ex &x = s->qp_ex;
    x.wr_start = wrStart;
    x.wr_complete = wrComplete;
    x.wr_abort = wrAbort;
    x.wr_send = wrSend;
    x.wr_send_imm = wrSendImm;
    x.wr_rdma_write = wrRdmaWrite;
    x.wr_rdma_write_imm = wrRdmaWriteImm;
    x.wr_rdma_read = wrRdmaRead;
    x.wr_atomic_cmp_swp = wrCmpSwp;
    x.wr_atomic_fetch_add = wrFetchAdd;
    x.wr_set_sge = wrSetSge;
    x.wr_set_sge_list = wrSetSgeList;
    x.wr_set_inline_data = wrSetInlineData;
    x.wr_set_inline_data_list = wrSetInlineDataList;
    s->has_qp_ex = true;
}

ibv_qp *faceCreateQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr) {
    constexpr uint32_t kServed = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if (attr == nullptr || (attr->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attr->pd == nullptr ||
        attr->pd->context != context) {
        return failNullErrno<ibv_qp>(EINVAL);
    }
    if ((attr->comp_mask & ~kServed) != 0 || attr->create_flags != 0 ||
        ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 &&
         (attr->send_ops_flags & ~kQpExSendOps) != 0)) {
        warn("ibv_create_qp_ex: only a PD and the standard send operations are served (comp_mask 0x%x)",
             attr->comp_mask);
        return failNullErrno<ibv_qp>(EOPNOTSUPP);
    }
    ibv_qp_init_attr a{};
    a.qp_context = attr->qp_context;
    a.send_cq = attr->send_cq;
    a.recv_cq = attr->recv_cq;
    a.srq = attr->srq;
    a.cap = attr->cap;
    a.qp_type = attr->qp_type;
    a.sq_sig_all = attr->sq_sig_all;
    ibv_qp *qp = ibvx_verbs_create_qp(attr->pd, &a);
    if (qp == nullptr) {
        return nullptr;
    }
    attr->cap = a.cap;
    if ((attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0) {
        fillQpEx(qpShadow(qp));
    }
    return qp;
}

}  // namespace
}  // namespace ibvx::client::broker
