#include "providers/loader/device_verbs.h"

#include <cerrno>
#include <map>
#include <mutex>

#include "providers/loader/loader.h"

namespace ibvx::loader {
namespace {

// ---- the defaults: what a provider lacks ----

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
    return -EOPNOTSUPP;
}
ibv_mr *noRegMr(ibv_pd *, void *, size_t, uint64_t, int) {
    errno = EOPNOTSUPP;
    return nullptr;
}
int noDeregMr(ibv_mr *) {
    return -EOPNOTSUPP;
}
int noModifyQp(ibv_qp *, ibv_qp_attr *, int) {
    return -EOPNOTSUPP;
}
int noQueryQp(ibv_qp *, ibv_qp_attr *, int, ibv_qp_init_attr *) {
    return -EOPNOTSUPP;
}

constexpr DeviceVerbs::Ops kDummyOps = {noOpen,  noClose,   noAllocPd,  noDeallocPd,
                                        noRegMr, noDeregMr, noModifyQp, noQueryQp};

// ---- a virtual device: its provider's entries already follow our convention ----

ibv_context *vdevOpen(const DeviceVerbs &self) {
    return self.provider()->open_device(self.name().c_str());
}

// ---- libibverbs: positive errno translated ----

ibv_context *verbsOpen(const DeviceVerbs &self) {
    return ibv_open_device(self.verbsDevice());
}
int verbsClose(ibv_context *context) {
    return verbsRc(ibv_close_device(context));
}
int verbsDeallocPd(ibv_pd *pd) {
    return verbsRc(ibv_dealloc_pd(pd));
}
ibv_mr *verbsRegMr(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return ibv_reg_mr_iova(pd, addr, length, iova, access);
}
int verbsDeregMr(ibv_mr *mr) {
    return verbsRc(ibv_dereg_mr(mr));
}
int verbsModifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) {
    return verbsRc(ibv_modify_qp(qp, attr, attr_mask));
}
int verbsQueryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) {
    return verbsRc(ibv_query_qp(qp, attr, attr_mask, init_attr));
}

// Overrides entry with the provider's when it has one (verbs_set_ops' SET_OP).
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

DeviceVerbs DeviceVerbs::forVirtual(const ibv_extend_vdev_ops *provider, std::string name) {
    DeviceVerbs v;
    v.vdev_ = provider;
    v.name_ = std::move(name);
    if (provider->open_device != nullptr) {
        v.ops_.open_device = vdevOpen;
    }
    setOp(v.ops_.close_device, provider->close_device);
    setOp(v.ops_.alloc_pd, provider->alloc_pd);
    setOp(v.ops_.dealloc_pd, provider->dealloc_pd);
    setOp(v.ops_.reg_mr, provider->reg_mr);
    setOp(v.ops_.dereg_mr, provider->dereg_mr);
    setOp(v.ops_.modify_qp, provider->modify_qp);
    setOp(v.ops_.query_qp, provider->query_qp);
    return v;
}

DeviceVerbs DeviceVerbs::forVerbs(ibv_device *device) {
    DeviceVerbs v;
    v.device_ = device;
    v.name_ = device != nullptr ? ibv_get_device_name(device) : "";
    v.ops_ = {verbsOpen,  verbsClose,   ibv_alloc_pd,  verbsDeallocPd,
              verbsRegMr, verbsDeregMr, verbsModifyQp, verbsQueryQp};
    return v;
}

ibv_context *DeviceVerbs::openDevice() const {
    errno = 0;
    return ops_.open_device(*this);
}

int DeviceVerbs::closeDevice(ibv_context *context) const {
    errno = 0;
    return ops_.close_device(context);
}

ibv_pd *DeviceVerbs::allocPd(ibv_context *context) const {
    errno = 0;
    return ops_.alloc_pd(context);
}

int DeviceVerbs::deallocPd(ibv_pd *pd) const {
    errno = 0;
    return ops_.dealloc_pd(pd);
}

ibv_mr *DeviceVerbs::regMr(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) const {
    errno = 0;
    return ops_.reg_mr(pd, addr, length, iova, access);
}

int DeviceVerbs::deregMr(ibv_mr *mr) const {
    errno = 0;
    return ops_.dereg_mr(mr);
}

int DeviceVerbs::modifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) const {
    errno = 0;
    int rc = ops_.modify_qp(qp, attr, attr_mask);
    if (rc == 0 && (attr_mask & IBV_QP_STATE) != 0) {
        qp->state = attr->qp_state;
    }
    return rc;
}

int DeviceVerbs::queryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) const {
    errno = 0;
    return ops_.query_qp(qp, attr, attr_mask, init_attr);
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
