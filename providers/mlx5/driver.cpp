#include "providers/mlx5/driver.h"

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstddef>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "common/c_abi.h"
#include "providers/mlx5/features.h"
#include "providers/mlx5/queue_memory.h"
#include "providers/mlx5/queue_resources.h"
#include "providers/mlx5/translate.h"
#include "providers/mlx5/warn.h"

namespace ibvx::mlx5 {
namespace {

// The handed-out struct comes first so a pointer to it is a pointer to the handle.
struct QpHandle {
    ibv_qp_extend ext;
    QueueResources *res;
    bool udp_sport_set;  // guarded by the registry mutex, like udp_sport
    uint16_t udp_sport;
};
struct CqHandle {
    ibv_cq_extend ext;
    QueueResources *res;
};
struct SrqHandle {
    ibv_srq_extend ext;
    QueueResources *res;
};
static_assert(std::is_standard_layout_v<QpHandle> && offsetof(QpHandle, ext) == 0);
static_assert(std::is_standard_layout_v<CqHandle> && offsetof(CqHandle, ext) == 0);
static_assert(std::is_standard_layout_v<SrqHandle> && offsetof(SrqHandle, ext) == 0);

// ---- process-wide registry ---------------------------------------------------------------

struct ContextState {
    ibv_pd *pd;  // base of the CQs' parent domains (a CQ has no PD of its own)
    uint32_t ext_cap;
    int opens;  // alloc_context calls not yet matched by free_context
};

struct Registry {
    std::mutex mu;  // guards every map below and QpHandle::udp_sport*
    std::unordered_map<ibv_context *, ContextState> contexts;
    std::unordered_map<ibv_qp *, QpHandle *> qps;
    std::unordered_map<ibv_cq_extend *, CqHandle *> cqs;
    std::unordered_map<ibv_srq_extend *, SrqHandle *> srqs;
};

// Never destroyed: a destroy call during process exit must still find a valid registry.
Registry &registry() {
    static Registry *r = new Registry;
    return *r;
}

bool usableOps(const ibv_extend_ops *ops) {
    return ops != nullptr && ops->alloc != nullptr && ops->free != nullptr && ops->db_mmap != nullptr &&
           ops->db_unmap != nullptr;
}

// Common checks of the three create calls; 0 or a negative errno.
int checkCreate(ibv_context *ctx, const ibv_extend_ops *ops, queue_buf_dma_mode type, const char *what) {
    if (!usableOps(ops)) {
        warn("create_%s: ops must provide alloc, free, db_mmap and db_unmap", what);
        return -EINVAL;
    }
    if (type != QU_BUF_DMA_MODE_DEFAULT) {
        warn("create_%s: mlx5 NICs reach queue memory over PCIe only (QU_BUF_DMA_MODE_DEFAULT)", what);
        return -EOPNOTSUPP;
    }
    if (ctx == nullptr) {
        return -EINVAL;
    }
    return 0;
}

// A create that fails after its verbs object exists destroys the object, then its resources.
// Should the destroy itself fail, the hardware may still use that memory: leak it rather than
// hand it back to ops->free.
void undoCreate(int destroy_rc, std::unique_ptr<QueueResources> *res) {
    if (destroy_rc != 0) {
        warn("cannot destroy a half-created queue (%d); its memory and doorbell stay held", destroy_rc);
        (void)res->release();
        return;
    }
    res->reset();
}

// Makes a created object known to the registry. False only when the map cannot grow (out of
// memory): the caller then undoes the create rather than hand out an unknown object.
template <typename Map, typename Key, typename Handle>
bool publish(Map &map, Key key, Handle *h) {
    Registry &reg = registry();
    try {
        std::lock_guard lock(reg.mu);
        map.emplace(key, h);
        return true;
    } catch (...) {
        return false;
    }
}

// ---- device probes -------------------------------------------------------------------------

int probeDmabuf(ibv_pd *pd) {
    errno = 0;
    ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, kUarPageSize, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    if (mr != nullptr) {  // cannot happen with fd -1; still, it did register
        ibv_dereg_mr(mr);
        return EBADF;
    }
    return errno;
}

bool probeCustomAllocators(ibv_context *ctx, ibv_pd *pd) {
    ibv_parent_domain_init_attr attr{};
    attr.pd = pd;
    attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
    attr.alloc = &QueueMemory::allocCallback;  // never called: nothing is created on it
    attr.free = &QueueMemory::freeCallback;
    attr.pd_context = nullptr;
    ibv_pd *domain = ibv_alloc_parent_domain(ctx, &attr);
    if (domain == nullptr) {
        return false;
    }
    ibv_dealloc_pd(domain);
    return true;
}

// ---- ops -------------------------------------------------------------------------------------

int queryDevice(ibv_context *ctx, ibv_device_attr_extend *attr) {
    if (ctx == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    Registry &reg = registry();
    std::lock_guard lock(reg.mu);
    auto it = reg.contexts.find(ctx);
    if (it == reg.contexts.end()) {
        return -EINVAL;
    }
    attr->ext_cap = it->second.ext_cap;
    return 0;
}

ibv_qp_extend *createQp(ibv_context *ctx, ibv_qp_init_attr_extend *init) {
    if (init == nullptr) {
        return ibvx::failNull<ibv_qp_extend>(EINVAL);
    }
    if (int rc = checkCreate(ctx, init->ops, init->type, "qp"); rc != 0) {
        return ibvx::failNull<ibv_qp_extend>(-rc);
    }
    if (init->pd == nullptr || init->pd->context != ctx) {
        warn("create_qp: the PD must belong to the context the QP is created on");
        return ibvx::failNull<ibv_qp_extend>(EINVAL);
    }
    bool direct_wqe = (init->qp_cap_flag & QP_ENABLE_DIRECT_WQE) != 0;
    if ((init->qp_cap_flag & ~uint32_t{QP_ENABLE_DIRECT_WQE}) != 0) {
        warn("create_qp: unknown qp_cap_flag bits %#x ignored",
             init->qp_cap_flag & ~uint32_t{QP_ENABLE_DIRECT_WQE});
    }

    // Everything that can run out of memory is allocated before the QP exists.
    auto h = std::make_unique<QpHandle>();
    auto res = std::make_unique<QueueResources>(init->ops);
    if (int rc = res->makeDomain(ctx, init->pd, direct_wqe); rc != 0) {
        return ibvx::failNull<ibv_qp_extend>(-rc);
    }
    ibv_qp_init_attr attr = init->attr;
    ibv_qp *qp = ibv_create_qp(res->domain(), &attr);
    if (qp == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("create_qp: ibv_create_qp failed (errno %d)", err);
        return ibvx::failNull<ibv_qp_extend>(err);
    }
    // From here on a failure destroys the QP before res goes (it frees through res's memory).
    auto fail = [&](int rc) {
        undoCreate(ibv_destroy_qp(qp), &res);
        return ibvx::failNull<ibv_qp_extend>(-rc);
    };

    mlx5dv_qp dv{};
    mlx5dv_obj obj{};
    obj.qp.in = qp;
    obj.qp.out = &dv;
    if (int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP); rc != 0) {
        warn("create_qp: mlx5dv_init_obj failed (%d)", rc);
        return fail(rc > 0 ? -rc : -EIO);
    }
    QpQueues queues{};
    if (int rc = translateQp(dv, direct_wqe, &queues); rc != 0) {
        warn("create_qp: mlx5dv reported an inconsistent QP layout");
        return fail(rc);
    }
    if (direct_wqe && !queues.blueflame) {
        warn("create_qp: no BlueFlame register for this QP; the SQ doorbell takes 8-byte writes only");
    }
    if (queues.has_sq_doorbell) {
        if (int rc = res->mapDoorbell(queues.sq_doorbell, &queues.sq.db_hw_va); rc != 0) {
            return fail(rc);
        }
    }

    h->ext.qp = qp;
    h->ext.sq_info = queues.sq;
    h->ext.rq_info = queues.rq;
    h->res = res.get();
    if (!publish(registry().qps, qp, h.get())) {
        return fail(-ENOMEM);
    }
    res.release();
    init->attr.cap = attr.cap;  // as ibv_create_qp does: the capacities actually granted
    return &h.release()->ext;
}

ibv_cq_extend *createCq(ibv_context *ctx, ibv_cq_init_attr_extend *init) {
    if (init == nullptr) {
        return ibvx::failNull<ibv_cq_extend>(EINVAL);
    }
    if (int rc = checkCreate(ctx, init->ops, init->type, "cq"); rc != 0) {
        return ibvx::failNull<ibv_cq_extend>(-rc);
    }
    if (init->attr.comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) {
        warn(
            "create_cq: the driver owns the CQ's parent domain (it routes the CQ's memory); "
            "leave IBV_CQ_INIT_ATTR_MASK_PD unset");
        return ibvx::failNull<ibv_cq_extend>(EINVAL);
    }
    ibv_pd *base = nullptr;
    {
        Registry &reg = registry();
        std::lock_guard lock(reg.mu);
        auto it = reg.contexts.find(ctx);
        if (it != reg.contexts.end()) {
            base = it->second.pd;
        }
    }
    if (base == nullptr) {
        warn("create_cq: context was not opened with ibv_open_extend");
        return ibvx::failNull<ibv_cq_extend>(EINVAL);
    }

    auto h = std::make_unique<CqHandle>();
    auto res = std::make_unique<QueueResources>(init->ops);
    if (int rc = res->makeDomain(ctx, base, false); rc != 0) {
        return ibvx::failNull<ibv_cq_extend>(-rc);
    }
    ibv_cq_init_attr_ex attr = init->attr;
    attr.comp_mask |= IBV_CQ_INIT_ATTR_MASK_PD;
    attr.parent_domain = res->domain();
    ibv_cq_ex *cqx = ibv_create_cq_ex(ctx, &attr);
    if (cqx == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("create_cq: ibv_create_cq_ex failed (errno %d)", err);
        return ibvx::failNull<ibv_cq_extend>(err);
    }
    ibv_cq *cq = ibv_cq_ex_to_cq(cqx);
    auto fail = [&](int rc) {
        undoCreate(ibv_destroy_cq(cq), &res);
        return ibvx::failNull<ibv_cq_extend>(-rc);
    };

    mlx5dv_cq dv{};
    mlx5dv_obj obj{};
    obj.cq.in = cq;
    obj.cq.out = &dv;
    if (int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_CQ); rc != 0) {
        warn("create_cq: mlx5dv_init_obj failed (%d)", rc);
        return fail(rc > 0 ? -rc : -EIO);
    }
    CqQueue queue{};
    if (int rc = translateCq(dv, &queue); rc != 0) {
        warn("create_cq: mlx5dv reported an inconsistent CQ layout");
        return fail(rc);
    }
    if (int rc = res->mapDoorbell(queue.arm_doorbell, &queue.cq.db_hw_va); rc != 0) {
        return fail(rc);
    }

    h->ext.cq = cq;
    h->ext.cq_info = queue.cq;
    h->res = res.get();
    if (!publish(registry().cqs, &h->ext, h.get())) {
        return fail(-ENOMEM);
    }
    res.release();
    return &h.release()->ext;
}

ibv_srq_extend *createSrq(ibv_context *ctx, ibv_srq_init_attr_extend *init) {
    if (init == nullptr) {
        return ibvx::failNull<ibv_srq_extend>(EINVAL);
    }
    if (int rc = checkCreate(ctx, init->ops, init->type, "srq"); rc != 0) {
        return ibvx::failNull<ibv_srq_extend>(-rc);
    }
    if (init->pd == nullptr || init->pd->context != ctx) {
        warn("create_srq: the PD must belong to the context the SRQ is created on");
        return ibvx::failNull<ibv_srq_extend>(EINVAL);
    }

    auto h = std::make_unique<SrqHandle>();
    auto res = std::make_unique<QueueResources>(init->ops);
    if (int rc = res->makeDomain(ctx, init->pd, false); rc != 0) {
        return ibvx::failNull<ibv_srq_extend>(-rc);
    }
    ibv_srq_init_attr attr = init->attr;
    ibv_srq *srq = ibv_create_srq(res->domain(), &attr);
    if (srq == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("create_srq: ibv_create_srq failed (errno %d)", err);
        return ibvx::failNull<ibv_srq_extend>(err);
    }
    mlx5dv_srq dv{};
    mlx5dv_obj obj{};
    obj.srq.in = srq;
    obj.srq.out = &dv;
    int rc = mlx5dv_init_obj(&obj, MLX5DV_OBJ_SRQ);
    queue_info info{};
    if (rc != 0 || (rc = translateSrq(dv, &info)) != 0) {
        warn("create_srq: cannot read the SRQ layout from mlx5dv (%d)", rc);
        undoCreate(ibv_destroy_srq(srq), &res);
        return ibvx::failNull<ibv_srq_extend>(rc > 0 ? rc : (rc < 0 ? -rc : EIO));
    }
    h->ext.srq = srq;
    h->ext.srq_info = info;  // no doorbell register: the record is the SRQ's doorbell
    h->res = res.get();
    if (!publish(registry().srqs, &h->ext, h.get())) {
        undoCreate(ibv_destroy_srq(srq), &res);
        return ibvx::failNull<ibv_srq_extend>(ENOMEM);
    }
    res.release();
    init->attr.attr = attr.attr;
    return &h.release()->ext;
}

// Destroys the verbs object first: if that fails (EBUSY: a QP still uses the CQ) nothing else
// is touched and the object stays usable. Only then the doorbell is unmapped and the memory
// freed (db_unmap, parent domain, ops->free), the reverse of creation.
int destroyQp(ibv_qp_extend *ext) {
    if (ext == nullptr || ext->qp == nullptr) {
        return -EINVAL;
    }
    Registry &reg = registry();
    QpHandle *h = nullptr;
    {
        std::lock_guard lock(reg.mu);
        auto it = reg.qps.find(ext->qp);
        if (it == reg.qps.end() || &it->second->ext != ext) {
            return -EINVAL;
        }
        h = it->second;
        reg.qps.erase(it);
    }
    if (int rc = ibv_destroy_qp(h->ext.qp); rc != 0) {
        publish(reg.qps, h->ext.qp, h);
        return -rc;
    }
    delete h->res;
    delete h;
    return 0;
}

int destroyCq(ibv_cq_extend *ext) {
    if (ext == nullptr) {
        return -EINVAL;
    }
    Registry &reg = registry();
    CqHandle *h = nullptr;
    {
        std::lock_guard lock(reg.mu);
        auto it = reg.cqs.find(ext);
        if (it == reg.cqs.end()) {
            return -EINVAL;
        }
        h = it->second;
        reg.cqs.erase(it);
    }
    if (int rc = ibv_destroy_cq(h->ext.cq); rc != 0) {
        publish(reg.cqs, ext, h);
        return -rc;
    }
    delete h->res;
    delete h;
    return 0;
}

int destroySrq(ibv_srq_extend *ext) {
    if (ext == nullptr) {
        return -EINVAL;
    }
    Registry &reg = registry();
    SrqHandle *h = nullptr;
    {
        std::lock_guard lock(reg.mu);
        auto it = reg.srqs.find(ext);
        if (it == reg.srqs.end()) {
            return -EINVAL;
        }
        h = it->second;
        reg.srqs.erase(it);
    }
    if (int rc = ibv_destroy_srq(h->ext.srq); rc != 0) {
        publish(reg.srqs, ext, h);
        return -rc;
    }
    delete h->res;
    delete h;
    return 0;
}

void warnUnsupportedAttrs(const char *op, uint32_t bits) {
    warn(
        "%s: extended QP attributes %#x are not supported by mlx5 (supported: UDP_SRC_PORT, "
        "HYROCE_FEATURE = RoCEv2/V0 without SACK)",
        op, bits);
}

int modifyQp(ibv_context *ctx, ibv_qp_attr_extend *attr, int attr_mask) {
    if (ctx == nullptr || attr == nullptr || attr->qp == nullptr) {
        return -EINVAL;
    }
    ModifyPlan plan{};
    int rc = planModify(*attr, attr_mask, &plan);
    if (rc == -EOPNOTSUPP) {
        warnUnsupportedAttrs("modify_qp", plan.unsupported);
    }
    if (rc != 0) {
        return rc;
    }
    Registry &reg = registry();
    {
        std::lock_guard lock(reg.mu);
        if (reg.qps.find(attr->qp) == reg.qps.end()) {
            warn("modify_qp: the QP was not created by this driver");
            return -EINVAL;
        }
    }
    if (!plan.set_udp_sport) {
        return 0;
    }
    // mlx5 changes the port with the firmware's RTS-to-RTS command only.
    ibv_qp_attr qattr{};
    ibv_qp_init_attr qinit{};
    if (ibv_query_qp(attr->qp, &qattr, IBV_QP_STATE, &qinit) == 0 && qattr.qp_state != IBV_QPS_RTS) {
        warn("modify_qp: mlx5 sets the UDP source port only in RTS; move the QP to RTS first");
        return -EINVAL;
    }
    rc = mlx5dv_modify_qp_udp_sport(attr->qp, plan.udp_sport);
    if (rc != 0) {
        warn("modify_qp: mlx5dv_modify_qp_udp_sport failed (%d)", rc);
        return rc > 0 ? -rc : rc;
    }
    std::lock_guard lock(reg.mu);
    auto it = reg.qps.find(attr->qp);
    if (it != reg.qps.end()) {
        it->second->udp_sport_set = true;
        it->second->udp_sport = plan.udp_sport;
    }
    return 0;
}

int queryQp(ibv_context *ctx, ibv_qp_attr_extend *attr, int attr_mask) {
    if (ctx == nullptr || attr == nullptr || attr->qp == nullptr) {
        return -EINVAL;
    }
    bool known = false;
    uint16_t port = 0;
    Registry &reg = registry();
    {
        std::lock_guard lock(reg.mu);
        auto it = reg.qps.find(attr->qp);
        if (it == reg.qps.end()) {
            warn("query_qp: the QP was not created by this driver");
            return -EINVAL;
        }
        known = it->second->udp_sport_set;
        port = it->second->udp_sport;
    }
    uint32_t unsupported = 0;
    int rc = planQuery(attr_mask, known, &unsupported);
    if (rc == -EOPNOTSUPP) {
        warnUnsupportedAttrs("query_qp", unsupported);
    }
    if (rc != 0) {
        return rc;
    }
    if (attr_mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) {
        attr->udp_src_port = port;
    }
    if (attr_mask & IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) {
        roceV2Feature(&attr->feature);
    }
    return 0;
}

// The answer is device-wide (mlx5 speaks RoCEv2 only), so any QP of the context gets it.
int queryHyroce(ibv_context *ctx, ibv_qp *qp, uint32_t, uint32_t, ibv_hyroce_feature *feature) {
    if (ctx == nullptr || qp == nullptr || feature == nullptr) {
        return -EINVAL;
    }
    roceV2Feature(feature);
    return 0;
}

// Whatever the peer offers, both ends can only meet at plain RoCEv2, in one round.
int negoHyroce(ibv_context *ctx, ibv_qp *qp, const ibv_hyroce_feature *input, ibv_hyroce_feature *output,
               uint32_t *need_more_nego) {
    if (ctx == nullptr || qp == nullptr || input == nullptr || output == nullptr ||
        need_more_nego == nullptr) {
        return -EINVAL;
    }
    roceV2Feature(output);
    *need_more_nego = 0;
    return 0;
}

// Every entry point is wrapped: nothing thrown inside (std::bad_alloc from a container) crosses
// into the C caller, and the warning says why the call failed.
void warnOutOfMemory() {
    warn("out of memory");
}

template <auto Fn>
using CAbi = ibvx::CEntry<Fn, warnOutOfMemory>;

ibv_context_extend_ops g_context_ops = {
    .version = IBV_EXTEND_DRIVER_VERSION_V3,
    .create_qp = CAbi<createQp>::call,
    .create_cq = CAbi<createCq>::call,
    .create_srq = CAbi<createSrq>::call,
    .destroy_qp = CAbi<destroyQp>::call,
    .destroy_cq = CAbi<destroyCq>::call,
    .destroy_srq = CAbi<destroySrq>::call,
    .query_device = CAbi<queryDevice>::call,
    .modify_qp = CAbi<modifyQp>::call,
    .query_qp = CAbi<queryQp>::call,
    .query_qp_supported_hyroce_feature = CAbi<queryHyroce>::call,
    .nego_qp_hyroce_feature = CAbi<negoHyroce>::call,
};

ibv_context_extend *allocContextImpl(ibv_context *ctx);
void freeContextImpl(ibv_context_extend *ext);

}  // namespace

const ibv_context_extend_ops &contextOps() {
    return g_context_ops;
}

ibv_context_extend *allocContext(ibv_context *ctx) {
    return CAbi<allocContextImpl>::call(ctx);
}

void freeContext(ibv_context_extend *ext) {
    // Only a warning can allocate here, and warn() does not throw.
    freeContextImpl(ext);
}

namespace {

ibv_context_extend *allocContextImpl(ibv_context *ctx) {
    if (ctx == nullptr || ctx->device == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    if (!mlx5dv_is_supported(ctx->device)) {
        warn("device %s is not driven by rdma-core's mlx5 provider", ibv_get_device_name(ctx->device));
        errno = EOPNOTSUPP;
        return nullptr;
    }
    auto ext = std::make_unique<ibv_context_extend>();
    ext->context = ctx;
    ext->ops = &g_context_ops;

    Registry &reg = registry();
    std::lock_guard lock(reg.mu);
    auto it = reg.contexts.find(ctx);
    if (it != reg.contexts.end()) {
        ++it->second.opens;
        return ext.release();
    }
    ibv_pd *pd = ibv_alloc_pd(ctx);
    if (pd == nullptr) {
        int err = errno != 0 ? errno : ENOMEM;
        warn("cannot allocate the context's PD (errno %d)", err);
        errno = err;
        return nullptr;
    }
    DeviceProbe probe{};
    probe.dmabuf_probe_errno = probeDmabuf(pd);
    probe.custom_allocators = probeCustomAllocators(ctx, pd);
    mlx5dv_context dv{};
    probe.mlx5dv_device = mlx5dv_query_device(ctx, &dv) == 0;
    try {
        reg.contexts.emplace(ctx, ContextState{pd, extCapFor(probe), 1});
    } catch (...) {
        ibv_dealloc_pd(pd);
        errno = ENOMEM;
        return nullptr;
    }
    return ext.release();
}

void freeContextImpl(ibv_context_extend *ext) {
    if (ext == nullptr) {
        return;
    }
    std::unique_ptr<ibv_context_extend> owned(ext);
    Registry &reg = registry();
    std::lock_guard lock(reg.mu);
    auto it = reg.contexts.find(ext->context);
    if (it == reg.contexts.end() || --it->second.opens > 0) {
        return;
    }
    if (int rc = ibv_dealloc_pd(it->second.pd); rc != 0) {
        // CQs still exist on it: close after destroying them, as the reference's users do.
        warn("closing a context with live CQs; its PD stays allocated (%d)", rc);
    }
    reg.contexts.erase(it);
}

}  // namespace

}  // namespace ibvx::mlx5
