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
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// The data path of brokered queues through the standard verbs (ibv_post_send, ibv_poll_cq, ...)
// is not served yet: the inline wrappers reach these and fail the libibverbs way. The queues'
// queue_info (ibv_extend.h) is the data path that works.
int noPostSend(ibv_qp *, ibv_send_wr *wr, ibv_send_wr **bad_wr) {
    *bad_wr = wr;
    return EOPNOTSUPP;
}
int noPostRecv(ibv_qp *, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    *bad_wr = wr;
    return EOPNOTSUPP;
}
int noPostSrqRecv(ibv_srq *, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) {
    *bad_wr = wr;
    return EOPNOTSUPP;
}
int noPollCq(ibv_cq *, int, ibv_wc *) {
    return -EOPNOTSUPP;
}
int noReqNotifyCq(ibv_cq *, int) {
    return EOPNOTSUPP;
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
    ctx.ops.post_send = noPostSend;
    ctx.ops.post_recv = noPostRecv;
    ctx.ops.post_srq_recv = noPostSrqRecv;
    ctx.ops.poll_cq = noPollCq;
    ctx.ops.req_notify_cq = noReqNotifyCq;
}

// ---- completion channels -------------------------------------------------------------------

// A completion channel: an eventfd a program may poll(). Completion events are not raised yet
// (see noReqNotifyCq), so nothing is ever queued here.
struct FaceChannel {
    ibv_comp_channel ch{};
    std::mutex mu;
    std::vector<ibv_cq *> fired;  // guarded by mu
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

// ---- objects ---------------------------------------------------------------------------------

template <typename Shadow, typename Member>
Shadow *liveObject(Member *m, size_t offset) {
    if (m == nullptr) {
        return nullptr;
    }
    Shadow *s = shadowOf<Shadow>(m, offset);
    return ownerOf(s) != nullptr ? s : nullptr;
}

ShadowPd *livePd(ibv_pd *pd) {
    return liveObject<ShadowPd>(pd, offsetof(ShadowPd, pd));
}
ShadowCq *liveCq(ibv_cq *cq) {
    return liveObject<ShadowCq>(cq, offsetof(ShadowCq, cq));
}
ShadowQp *liveQp(ibv_qp *qp) {
    return liveObject<ShadowQp>(qp, offsetof(ShadowQp, qp));
}
ShadowSrq *liveSrq(ibv_srq *srq) {
    return liveObject<ShadowSrq>(srq, offsetof(ShadowSrq, srq));
}

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
    return &c->ctx;
}

int ibvx_verbs_close_device(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr) {
        errno = EINVAL;
        return -1;
    }
    int async_fd = c->ctx.async_fd;
    int rc = brokerCloseDevice(&c->ext);
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
    Channels &cs = channels();
    std::lock_guard lock(cs.mu);
    cs.live.insert(&f->ch);
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
    if (c == nullptr || cqe <= 0 || comp_vector < 0 || comp_vector >= context->num_comp_vectors ||
        (channel != nullptr && (faceChannel(channel) == nullptr || channel->context != context))) {
        return failNullErrno<ibv_cq>(EINVAL);
    }
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = static_cast<uint32_t>(cqe);
    a.attr.cq_context = cq_context;
    a.attr.channel = channel;
    a.attr.comp_vector = static_cast<uint32_t>(comp_vector);
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *ext = ibv_create_cq_extend(&c->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    ibv_cq *cq = ext->cq;
    cq->channel = channel;
    cq->cq_context = cq_context;
    pthread_mutex_init(&cq->mutex, nullptr);
    pthread_cond_init(&cq->cond, nullptr);
    if (channel != nullptr) {
        std::lock_guard lock(channels().mu);
        channel->refcnt++;
    }
    return cq;
}

int ibvx_verbs_destroy_cq(ibv_cq *cq) {
    ShadowCq *s = liveCq(cq);
    if (s == nullptr) {
        return EINVAL;
    }
    ibv_comp_channel *channel = cq->channel;
    ShadowContext *c = s->owner;
    int rc = ibv_destroy_cq_extend(&c->ext, &s->ext);
    if (rc == 0 && channel != nullptr) {
        std::lock_guard lock(channels().mu);
        channel->refcnt--;
    }
    return -rc;
}

int ibvx_verbs_get_cq_event(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context) {
    FaceChannel *f = faceChannel(channel);
    if (f == nullptr || cq == nullptr || cq_context == nullptr) {
        errno = EINVAL;
        return -1;
    }
    uint64_t n = 0;
    if (read(f->ch.fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) {
        return -1;  // errno from read (EAGAIN on a non-blocking channel)
    }
    std::lock_guard lock(f->mu);
    if (f->fired.empty()) {
        errno = EAGAIN;
        return -1;
    }
    *cq = f->fired.front();
    f->fired.erase(f->fired.begin());
    *cq_context = (*cq)->cq_context;
    return 0;
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
    ibv_qp_init_attr_extend a{};
    a.pd = pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_qp_extend *ext = ibv_create_qp_extend(&p->owner->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->cap = a.attr.cap;  // what the broker granted, as ibv_create_qp() reports
    return ext->qp;
}

int ibvx_verbs_destroy_qp(ibv_qp *qp) {
    ShadowQp *s = liveQp(qp);
    return s != nullptr ? -ibv_destroy_qp_extend(&s->owner->ext, &s->ext) : EINVAL;
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
    return -brokerQueryQp(qp, attr, attr_mask, init_attr);
}

ibv_srq *ibvx_verbs_create_srq(ibv_pd *pd, ibv_srq_init_attr *attr) {
    ShadowPd *p = livePd(pd);
    if (p == nullptr || attr == nullptr) {
        return failNullErrno<ibv_srq>(EINVAL);
    }
    ibv_srq_init_attr_extend a{};
    a.pd = pd;
    a.attr = *attr;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_srq_extend *ext = ibv_create_srq_extend(&p->owner->ext, &a);
    if (ext == nullptr) {
        return nullptr;
    }
    attr->attr = a.attr.attr;  // granted max_wr / max_sge
    return ext->srq;
}

int ibvx_verbs_destroy_srq(ibv_srq *srq) {
    ShadowSrq *s = liveSrq(srq);
    return s != nullptr ? -ibv_destroy_srq_extend(&s->owner->ext, &s->ext) : EINVAL;
}

// The broker has no SRQ modify/query call yet (the extend API has none either).
int ibvx_verbs_modify_srq(ibv_srq *srq, ibv_srq_attr *, int) {
    return liveSrq(srq) != nullptr ? EOPNOTSUPP : EINVAL;
}
int ibvx_verbs_query_srq(ibv_srq *srq, ibv_srq_attr *) {
    return liveSrq(srq) != nullptr ? EOPNOTSUPP : EINVAL;
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

// No async event is raised yet: the read blocks (or fails with EAGAIN on a non-blocking fd), as
// on a device with nothing to report.
int ibvx_verbs_get_async_event(ibv_context *context, ibv_async_event *event) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || event == nullptr) {
        errno = EINVAL;
        return -1;
    }
    uint64_t n = 0;
    if (read(c->ctx.async_fd, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) {
        return -1;
    }
    errno = EAGAIN;
    return -1;
}

void ibvx_verbs_ack_async_event(ibv_async_event *) {}

// ---- fork ------------------------------------------------------------------------------------------

// Registered memory needs no madvise(MADV_DONTFORK): a child gets private copies of shared pages
// (client/shared_pages.h), as the kernel gives it of pinned pages when fork is "unneeded".
int ibvx_verbs_fork_init(void) {
    return 0;
}

ibv_fork_status ibvx_verbs_is_fork_initialized(void) {
    return IBV_FORK_UNNEEDED;
}

}  // extern "C"
