#include "providers/loader/device_verbs.h"

#include <cerrno>
#include <map>
#include <mutex>

#include "providers/loader/loader.h"

namespace ibvx::loader {
namespace {

// ---- the defaults: what a provider lacks (errno set too, so either convention reads it) ----

ibv_context *noOpen(const DeviceVerbs &) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noClose(ibv_context *) {
    return 0;
}
ibv_pd *noAllocPd(ibv_context *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noDeallocPd(ibv_pd *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
ibv_mr *noRegMr(ibv_pd *, void *, size_t, uint64_t, int) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noDeregMr(ibv_mr *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noModifyQp(ibv_qp *, ibv_qp_attr *, int) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noQueryQp(ibv_qp *, ibv_qp_attr *, int, ibv_qp_init_attr *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

int noQueryCounters(const DeviceVerbs &, DeviceVerbs::CounterFn, void *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

int noQueryDevice(ibv_context *, ibv_device_attr *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noQueryPort(ibv_context *, uint8_t, ibv_port_attr *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noQueryGid(ibv_context *, uint8_t, uint32_t, ibv_gid_entry *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

int noSetCqEventFd(ibv_cq *, int) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noSetAsyncEventFd(ibv_context *, int) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

int noExportObject(ibv_extend_vdev_obj, const void *, ibv_extend_vdev_state *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
void *noImportObject(ibv_extend_vdev_obj, const ibv_extend_vdev_state *, const ibv_extend_vdev_import *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noSetPaused(const DeviceVerbs &, int) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

int noResizeCq(ibv_cq_extend *, uint32_t) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noReregMr(ibv_mr *, int, ibv_pd *, void *, size_t, uint64_t, int) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

ibv_xrcd *noOpenXrcd(ibv_context *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noCloseXrcd(ibv_xrcd *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
ibv_srq_extend *noCreateXrcSrq(ibv_context *, ibv_srq_init_attr_extend *, ibv_xrcd *, ibv_cq *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
ibv_qp_extend *noCreateXrcTgtQp(ibv_context *, ibv_qp_init_attr_extend *, ibv_xrcd *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noGetSrqNum(ibv_srq *, uint32_t *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
int noMcast(ibv_qp_extend *, const ibv_gid *, uint16_t) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
ibv_mw *noAllocMw(ibv_pd *, ibv_mw_type) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noDeallocMw(ibv_mw *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

ibv_dm *noAllocDm(ibv_context *, const ibv_alloc_dm_attr *, ibv_extend_ops *) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noFreeDm(ibv_dm *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}
ibv_mr *noRegDmMr(ibv_pd *, ibv_dm *, uint64_t, size_t, unsigned int) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noDmMemory(ibv_dm *, void **, uint64_t *) {
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

constexpr DeviceVerbs::Ops kDummyOps = {
    noOpen,         noClose,           noAllocPd,       noDeallocPd,    noRegMr,          noDeregMr,
    noModifyQp,     noQueryQp,         noQueryCounters, noQueryDevice,  noQueryPort,      noQueryGid,
    noSetCqEventFd, noSetAsyncEventFd, noExportObject,  noImportObject, noSetPaused,      noResizeCq,
    noReregMr,      noOpenXrcd,        noCloseXrcd,     noCreateXrcSrq, noCreateXrcTgtQp, noGetSrqNum,
    noMcast,        noMcast,           noAllocMw,       noDeallocMw,    noAllocDm,        noFreeDm,
    noRegDmMr,      noDmMemory};

ibv_context *vdevOpen(const DeviceVerbs &self) {
    return self.provider()->open_device(self.name().c_str());
}

int vdevQueryCounters(const DeviceVerbs &self, DeviceVerbs::CounterFn emit, void *arg) {
    return self.provider()->query_counters(self.name().c_str(), emit, arg);
}

// query_counters is past the end of a V1 provider's struct: never read there.
bool hasQueryCounters(const ibv_extend_vdev_ops *provider) {
    return provider->abi >= IBV_EXTEND_VDEV_ABI_V2 && provider->query_counters != nullptr;
}

// The V3 entries are past the end of an older provider's struct: never read there.
template <typename Fn>
Fn v3Entry(const ibv_extend_vdev_ops *provider, Fn entry) {
    return provider->abi >= IBV_EXTEND_VDEV_ABI_V3 ? entry : nullptr;
}

// The V6 (XRC) entries are past the end of an older provider's struct: never read there.
template <typename Fn>
Fn v6Entry(const ibv_extend_vdev_ops *provider, Fn entry) {
    return provider->abi >= IBV_EXTEND_VDEV_ABI_V6 ? entry : nullptr;
}

ibv_context *verbsOpen(const DeviceVerbs &self) {
    return ibv_open_device(self.verbsDevice());
}

// ibv_reg_mr_iova is a macro over the exported function of the same name.
ibv_mr *verbsRegMr(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return ibv_reg_mr_iova(pd, addr, length, iova, access);
}

// ibv_query_port and ibv_query_gid_ex are inline wrappers in <infiniband/verbs.h>.
int verbsQueryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr) {
    return ibv_query_port(context, port, attr);
}
int verbsQueryGid(ibv_context *context, uint8_t port, uint32_t index, ibv_gid_entry *entry) {
    return ibv_query_gid_ex(context, port, index, entry, 0);
}

int vdevSetPaused(const DeviceVerbs &self, int paused) {
    return self.provider()->set_paused(self.name().c_str(), paused);
}

// The V4 restart entries, all three or none (past the end of an older provider's struct).
bool hasRestart(const ibv_extend_vdev_ops *provider) {
    return provider->abi >= IBV_EXTEND_VDEV_ABI_V4 && provider->export_object != nullptr &&
           provider->import_object != nullptr && provider->set_paused != nullptr;
}

// Takes the provider's entry when it has one (verbs_set_ops' SET_OP).
template <typename Fn>
void setOp(Fn &entry, Fn provided) {
    if (provided != nullptr) {
        entry = provided;
    }
}

}  // namespace

int verbsRc(int rc) {
    if (rc > 0) {
        return -rc;
    }
    if (rc < 0) {
        return errno != 0 ? -errno : -EIO;
    }
    return 0;
}

DeviceVerbs::DeviceVerbs() : ops_(kDummyOps) {}

DeviceVerbs DeviceVerbs::fromOps(const Ops &ops, Convention convention, const ibv_extend_vdev_ops *provider,
                                 ibv_device *device, std::string name) {
    DeviceVerbs v;
    v.convention_ = convention;
    v.vdev_ = provider;
    v.device_ = device;
    v.name_ = std::move(name);
    setOp(v.ops_.open_device, ops.open_device);
    setOp(v.ops_.close_device, ops.close_device);
    setOp(v.ops_.alloc_pd, ops.alloc_pd);
    setOp(v.ops_.dealloc_pd, ops.dealloc_pd);
    setOp(v.ops_.reg_mr, ops.reg_mr);
    setOp(v.ops_.dereg_mr, ops.dereg_mr);
    setOp(v.ops_.modify_qp, ops.modify_qp);
    setOp(v.ops_.query_qp, ops.query_qp);
    setOp(v.ops_.query_counters, ops.query_counters);
    setOp(v.ops_.query_device, ops.query_device);
    setOp(v.ops_.query_port, ops.query_port);
    setOp(v.ops_.query_gid, ops.query_gid);
    setOp(v.ops_.set_cq_event_fd, ops.set_cq_event_fd);
    setOp(v.ops_.set_async_event_fd, ops.set_async_event_fd);
    v.keeps_ = ops.export_object != nullptr && ops.import_object != nullptr && ops.set_paused != nullptr;
    setOp(v.ops_.export_object, ops.export_object);
    setOp(v.ops_.import_object, ops.import_object);
    setOp(v.ops_.set_paused, ops.set_paused);
    setOp(v.ops_.resize_cq, ops.resize_cq);
    setOp(v.ops_.rereg_mr, ops.rereg_mr);
    if (ops.open_xrcd != nullptr && ops.close_xrcd != nullptr && ops.create_xrc_srq != nullptr &&
        ops.create_xrc_tgt_qp != nullptr && ops.get_srq_num != nullptr) {  // all five or none
        setOp(v.ops_.open_xrcd, ops.open_xrcd);
        setOp(v.ops_.close_xrcd, ops.close_xrcd);
        setOp(v.ops_.create_xrc_srq, ops.create_xrc_srq);
        setOp(v.ops_.create_xrc_tgt_qp, ops.create_xrc_tgt_qp);
        setOp(v.ops_.get_srq_num, ops.get_srq_num);
    }
    if (ops.attach_mcast != nullptr && ops.detach_mcast != nullptr) {  // both or none
        setOp(v.ops_.attach_mcast, ops.attach_mcast);
        setOp(v.ops_.detach_mcast, ops.detach_mcast);
    }
    if (ops.alloc_mw != nullptr && ops.dealloc_mw != nullptr) {  // both or none
        setOp(v.ops_.alloc_mw, ops.alloc_mw);
        setOp(v.ops_.dealloc_mw, ops.dealloc_mw);
    }
    if (ops.alloc_dm != nullptr && ops.free_dm != nullptr && ops.reg_dm_mr != nullptr) {  // all or none
        setOp(v.ops_.alloc_dm, ops.alloc_dm);
        setOp(v.ops_.free_dm, ops.free_dm);
        setOp(v.ops_.reg_dm_mr, ops.reg_dm_mr);
        setOp(v.ops_.dm_memory, ops.dm_memory);  // an rdma-core device has none
    }
    return v;
}

DeviceVerbs DeviceVerbs::forVirtual(const ibv_extend_vdev_ops *provider, std::string name) {
    Ops ops = {provider->open_device != nullptr ? vdevOpen : nullptr,
               provider->close_device,
               provider->alloc_pd,
               provider->dealloc_pd,
               provider->reg_mr,
               provider->dereg_mr,
               provider->modify_qp,
               provider->query_qp,
               hasQueryCounters(provider) ? vdevQueryCounters : nullptr,
               v3Entry(provider, provider->query_device),
               v3Entry(provider, provider->query_port),
               v3Entry(provider, provider->query_gid),
               v3Entry(provider, provider->set_cq_event_fd),
               v3Entry(provider, provider->set_async_event_fd),
               hasRestart(provider) ? provider->export_object : nullptr,
               hasRestart(provider) ? provider->import_object : nullptr,
               hasRestart(provider) ? vdevSetPaused : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V7 ? provider->resize_cq : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V7 ? provider->rereg_mr : nullptr,
               v6Entry(provider, provider->open_xrcd),
               v6Entry(provider, provider->close_xrcd),
               v6Entry(provider, provider->create_xrc_srq),
               v6Entry(provider, provider->create_xrc_tgt_qp),
               v6Entry(provider, provider->get_srq_num),
               provider->abi >= IBV_EXTEND_VDEV_ABI_V8 ? provider->attach_mcast : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V8 ? provider->detach_mcast : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V9 ? provider->alloc_mw : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V9 ? provider->dealloc_mw : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V10 ? provider->alloc_dm : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V10 ? provider->free_dm : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V10 ? provider->reg_dm_mr : nullptr,
               provider->abi >= IBV_EXTEND_VDEV_ABI_V10 ? provider->dm_memory : nullptr};
    return fromOps(ops, Convention::kExtend, provider, nullptr, std::move(name));
}

namespace {

// An rdma-core device's QPs made by its extension driver are its own ibv_qp: libibverbs attaches
// them (its answer is a positive errno; result() makes it ours).
int verbsAttachMcast(ibv_qp_extend *qp, const ibv_gid *gid, uint16_t lid) {
    return ibv_attach_mcast(qp->qp, gid, lid);
}
int verbsDetachMcast(ibv_qp_extend *qp, const ibv_gid *gid, uint16_t lid) {
    return ibv_detach_mcast(qp->qp, gid, lid);
}
// ibv_alloc_mw and ibv_dealloc_mw are inline wrappers over the context's ops.
ibv_mw *verbsAllocMw(ibv_pd *pd, ibv_mw_type type) {
    return ibv_alloc_mw(pd, type);
}
int verbsDeallocMw(ibv_mw *mw) {
    return ibv_dealloc_mw(mw);
}

// libibverbs' device memory (its inline calls through the context's ops); ops are a vdev's.
ibv_dm *verbsAllocDm(ibv_context *context, const ibv_alloc_dm_attr *attr, ibv_extend_ops *) {
    ibv_alloc_dm_attr copy = *attr;
    return ibv_alloc_dm(context, &copy);
}
int verbsFreeDm(ibv_dm *dm) {
    return ibv_free_dm(dm);
}
ibv_mr *verbsRegDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access) {
    return ibv_reg_dm_mr(pd, dm, offset, length, access);
}

}  // namespace

DeviceVerbs DeviceVerbs::forVerbs(ibv_device *device) {
    Ops ops = {verbsOpen,        ibv_close_device, ibv_alloc_pd,   ibv_dealloc_pd, verbsRegMr,
               ibv_dereg_mr,     ibv_modify_qp,    ibv_query_qp,   nullptr,        ibv_query_device,
               verbsQueryPort,   verbsQueryGid,    nullptr,        nullptr,        nullptr,
               nullptr,          nullptr,          nullptr,        nullptr,        nullptr,
               nullptr,          nullptr,          nullptr,        nullptr,        verbsAttachMcast,
               verbsDetachMcast, verbsAllocMw,     verbsDeallocMw, verbsAllocDm,   verbsFreeDm,
               verbsRegDmMr,     nullptr};
    return fromOps(ops, Convention::kLibibverbs, nullptr, device,
                   device != nullptr ? ibv_get_device_name(device) : "");
}

int DeviceVerbs::result(int rc) const {
    return convention_ == Convention::kLibibverbs ? verbsRc(rc) : rc;
}

ibv_context *DeviceVerbs::openDevice() const {
    errno = 0;
    return ops_.open_device(*this);
}

int DeviceVerbs::closeDevice(ibv_context *context) const {
    errno = 0;
    return result(ops_.close_device(context));
}

ibv_pd *DeviceVerbs::allocPd(ibv_context *context) const {
    errno = 0;
    return ops_.alloc_pd(context);
}

int DeviceVerbs::deallocPd(ibv_pd *pd) const {
    errno = 0;
    return result(ops_.dealloc_pd(pd));
}

ibv_mr *DeviceVerbs::regMr(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) const {
    errno = 0;
    return ops_.reg_mr(pd, addr, length, iova, access);
}

int DeviceVerbs::deregMr(ibv_mr *mr) const {
    errno = 0;
    return result(ops_.dereg_mr(mr));
}

int DeviceVerbs::modifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) const {
    errno = 0;
    int rc = result(ops_.modify_qp(qp, attr, attr_mask));
    if (rc == 0 && (attr_mask & IBV_QP_STATE) != 0) {
        qp->state = attr->qp_state;
    }
    return rc;
}

int DeviceVerbs::queryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) const {
    errno = 0;
    return result(ops_.query_qp(qp, attr, attr_mask, init_attr));
}

int DeviceVerbs::queryCounters(CounterFn emit, void *arg) const {
    errno = 0;
    return ops_.query_counters(*this, emit, arg);
}

int DeviceVerbs::queryDevice(ibv_context *context, ibv_device_attr *attr) const {
    errno = 0;
    return result(ops_.query_device(context, attr));
}

int DeviceVerbs::queryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr) const {
    errno = 0;
    return result(ops_.query_port(context, port, attr));
}

int DeviceVerbs::queryGid(ibv_context *context, uint8_t port, uint32_t index, ibv_gid_entry *entry) const {
    errno = 0;
    return result(ops_.query_gid(context, port, index, entry));
}

int DeviceVerbs::setCqEventFd(ibv_cq *cq, int fd) const {
    errno = 0;
    return result(ops_.set_cq_event_fd(cq, fd));
}

int DeviceVerbs::setAsyncEventFd(ibv_context *context, int fd) const {
    errno = 0;
    return result(ops_.set_async_event_fd(context, fd));
}

int DeviceVerbs::exportObject(ibv_extend_vdev_obj kind, const void *object,
                              ibv_extend_vdev_state *out) const {
    errno = 0;
    return ops_.export_object(kind, object, out);
}

void *DeviceVerbs::importObject(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in,
                                const ibv_extend_vdev_import *env) const {
    errno = 0;
    return ops_.import_object(kind, in, env);
}

int DeviceVerbs::setPaused(bool paused) const {
    errno = 0;
    return ops_.set_paused(*this, paused ? 1 : 0);
}

int DeviceVerbs::resizeCq(ibv_cq_extend *cq, uint32_t cqe) const {
    errno = 0;
    return ops_.resize_cq(cq, cqe);
}

int DeviceVerbs::reregMr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                         int access) const {
    errno = 0;
    return ops_.rereg_mr(mr, flags, pd, addr, length, iova, access);
}

ibv_xrcd *DeviceVerbs::openXrcd(ibv_context *context) const {
    errno = 0;
    return ops_.open_xrcd(context);
}

int DeviceVerbs::closeXrcd(ibv_xrcd *xrcd) const {
    errno = 0;
    return ops_.close_xrcd(xrcd);
}

ibv_srq_extend *DeviceVerbs::createXrcSrq(ibv_context *context, ibv_srq_init_attr_extend *attr,
                                          ibv_xrcd *xrcd, ibv_cq *cq) const {
    errno = 0;
    return ops_.create_xrc_srq(context, attr, xrcd, cq);
}

ibv_qp_extend *DeviceVerbs::createXrcTgtQp(ibv_context *context, ibv_qp_init_attr_extend *attr,
                                           ibv_xrcd *xrcd) const {
    errno = 0;
    return ops_.create_xrc_tgt_qp(context, attr, xrcd);
}

int DeviceVerbs::getSrqNum(ibv_srq *srq, uint32_t *srq_num) const {
    errno = 0;
    return ops_.get_srq_num(srq, srq_num);
}

int DeviceVerbs::attachMcast(ibv_qp_extend *qp, const ibv_gid &gid, uint16_t lid) const {
    errno = 0;
    return result(ops_.attach_mcast(qp, &gid, lid));
}

int DeviceVerbs::detachMcast(ibv_qp_extend *qp, const ibv_gid &gid, uint16_t lid) const {
    errno = 0;
    return result(ops_.detach_mcast(qp, &gid, lid));
}

ibv_mw *DeviceVerbs::allocMw(ibv_pd *pd, ibv_mw_type type) const {
    errno = 0;
    return ops_.alloc_mw(pd, type);
}

int DeviceVerbs::deallocMw(ibv_mw *mw) const {
    errno = 0;
    return result(ops_.dealloc_mw(mw));
}

ibv_dm *DeviceVerbs::allocDm(ibv_context *context, const ibv_alloc_dm_attr &attr, ibv_extend_ops *ops) const {
    errno = 0;
    return ops_.alloc_dm(context, &attr, ops);
}

int DeviceVerbs::freeDm(ibv_dm *dm) const {
    errno = 0;
    return result(ops_.free_dm(dm));
}

ibv_mr *DeviceVerbs::regDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length,
                             unsigned int access) const {
    errno = 0;
    return ops_.reg_dm_mr(pd, dm, offset, length, access);
}

int DeviceVerbs::dmMemory(ibv_dm *dm, void **addr, uint64_t *length) const {
    errno = 0;
    return ops_.dm_memory(dm, addr, length);
}

const DeviceVerbs &deviceVerbsFor(const ibv_device *dev) {
    // Never destroyed: contexts may be closed from atexit handlers. Entries are never removed, so
    // references handed out stay valid (std::map nodes do not move).
    static auto *mu = new std::mutex;
    static auto *tables = new std::map<const ibv_device *, DeviceVerbs>;
    {
        std::lock_guard lock(*mu);
        auto it = tables->find(dev);
        if (it != tables->end()) {
            return it->second;
        }
    }
    // Asking the providers runs outside our lock: is_own_device is provider code.
    DeviceVerbs v;
    if (const ibv_extend_vdev_ops *provider = findVdevProvider(dev)) {
        v = DeviceVerbs::forVirtual(provider, dev->name);
    } else {
        v = DeviceVerbs::forVerbs(const_cast<ibv_device *>(dev));
    }
    std::lock_guard lock(*mu);
    return tables->emplace(dev, std::move(v)).first->second;
}

}  // namespace ibvx::loader
