// The standard verbs of one device, decided once when the device is found: a virtual device's
// go to its provider's ibv_extend_vdev_ops, an rdma-core device's to libibverbs. The table is
// complete, as rdma-core's verbs_set_ops() over verbs_dummy_ops (libibverbs/dummy_ops.c) makes
// it: an entry the provider lacks answers EOPNOTSUPP, so no caller tests for NULL.
//
// One error convention for both flavours: int calls return 0 or a negative errno (libibverbs'
// positive errno and its old "-1 + errno" are translated here, in one place); pointer calls
// return NULL with errno set (errno is cleared before the call, so 0 means the provider did not
// say why).
//
// Used by the broker daemon (Device holds one) and by libibv_extend.so's direct mode
// (deviceVerbsFor() by ibv_device). Threading: a table is immutable once built; every entry may
// be called from any thread, with whatever locking the provider needs left to the caller.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include <ibv_extend_vdev.h>

namespace ibvx::loader {

class DeviceVerbs {
  public:
    // What queryCounters() calls once per counter (name valid during the call only).
    using CounterFn = void (*)(void *arg, const char *name, uint64_t value);

    // The entries, in the provider's own error convention (see Convention). open_device receives
    // the table it belongs to (the device it is bound to).
    struct Ops {
        ibv_context *(*open_device)(const DeviceVerbs &self);
        int (*close_device)(ibv_context *context);
        ibv_pd *(*alloc_pd)(ibv_context *context);
        int (*dealloc_pd)(ibv_pd *pd);
        ibv_mr *(*reg_mr)(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
        int (*dereg_mr)(ibv_mr *mr);
        int (*modify_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
        int (*query_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr);
        int (*query_counters)(const DeviceVerbs &self, CounterFn emit, void *arg);
        int (*query_device)(ibv_context *context, ibv_device_attr *attr);
        int (*query_port)(ibv_context *context, uint8_t port, ibv_port_attr *attr);
        int (*query_gid)(ibv_context *context, uint8_t port, uint32_t index, ibv_gid_entry *entry);
        int (*set_cq_event_fd)(ibv_cq *cq, int fd);
        int (*set_async_event_fd)(ibv_context *context, int fd);
        // Restart (ABI V4): see ibv_extend_vdev.h.
        int (*export_object)(ibv_extend_vdev_obj kind, const void *object, ibv_extend_vdev_state *out);
        void *(*import_object)(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in,
                               const ibv_extend_vdev_import *env);
        int (*set_paused)(const DeviceVerbs &self, int paused);
        int (*resize_cq)(ibv_cq_extend *cq, uint32_t cqe);  // ABI V7
        int (*rereg_mr)(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                        int access);  // ABI V7
        // XRC (ABI V6, all five or none): see ibv_extend_vdev.h.
        ibv_xrcd *(*open_xrcd)(ibv_context *context);
        int (*close_xrcd)(ibv_xrcd *xrcd);
        ibv_srq_extend *(*create_xrc_srq)(ibv_context *context, ibv_srq_init_attr_extend *attr,
                                          ibv_xrcd *xrcd, ibv_cq *cq);
        ibv_qp_extend *(*create_xrc_tgt_qp)(ibv_context *context, ibv_qp_init_attr_extend *attr,
                                            ibv_xrcd *xrcd);
        int (*get_srq_num)(ibv_srq *srq, uint32_t *srq_num);
        // Multicast (ABI V8): see ibv_extend_vdev.h.
        int (*attach_mcast)(ibv_qp_extend *qp, const ibv_gid *gid, uint16_t lid);
        int (*detach_mcast)(ibv_qp_extend *qp, const ibv_gid *gid, uint16_t lid);
        // Memory windows (ABI V9): see ibv_extend_vdev.h.
        ibv_mw *(*alloc_mw)(ibv_pd *pd, ibv_mw_type type);
        int (*dealloc_mw)(ibv_mw *mw);
        // Device memory (ABI V10, all four or none): see ibv_extend_vdev.h.
        ibv_dm *(*alloc_dm)(ibv_context *context, const ibv_alloc_dm_attr *attr, ibv_extend_ops *ops);
        int (*free_dm)(ibv_dm *dm);
        ibv_mr *(*reg_dm_mr)(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access);
        int (*dm_memory)(ibv_dm *dm, void **addr, uint64_t *length);
    };
    enum class Convention {
        kExtend,      // ibv_extend.h: 0 or a negative errno (vdev providers)
        kLibibverbs,  // 0 or a positive errno, or -1 with errno (old paths)
    };

    // An empty table: every entry answers EOPNOTSUPP (close_device: 0, nothing was opened).
    DeviceVerbs();
    // The virtual device `name` of provider.
    static DeviceVerbs forVirtual(const ibv_extend_vdev_ops *provider, std::string name);
    // An rdma-core device (libibverbs).
    static DeviceVerbs forVerbs(ibv_device *device);
    // The table over ops (NULL entries answer EOPNOTSUPP), for the two above and for tests.
    static DeviceVerbs fromOps(const Ops &ops, Convention convention, const ibv_extend_vdev_ops *provider,
                               ibv_device *device, std::string name);

    bool isVirtual() const { return vdev_ != nullptr; }
    const ibv_extend_vdev_ops *provider() const { return vdev_; }
    ibv_device *verbsDevice() const { return device_; }
    const std::string &name() const { return name_; }

    ibv_context *openDevice() const;
    int closeDevice(ibv_context *context) const;
    ibv_pd *allocPd(ibv_context *context) const;
    int deallocPd(ibv_pd *pd) const;
    // [addr, addr+length) addressed by work requests as [iova, iova+length).
    ibv_mr *regMr(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) const;
    int deregMr(ibv_mr *mr) const;
    // On success with IBV_QP_STATE in the mask, qp->state follows attr->qp_state (a virtual
    // device's QP is no libibverbs object, so nobody else keeps that field).
    int modifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) const;
    int queryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr) const;
    // The provider's counters for this device (ibv_extend_vdev_ops.query_counters, read only
    // from a provider of ABI V2 or later): 0, or -EOPNOTSUPP when it keeps none.
    int queryCounters(CounterFn emit, void *arg) const;
    // The standard queries (a provider's from ABI V3 on): whole structs, 0 or a negative errno.
    int queryDevice(ibv_context *context, ibv_device_attr *attr) const;
    int queryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr) const;
    int queryGid(ibv_context *context, uint8_t port, uint32_t index, ibv_gid_entry *entry) const;
    // Event delivery (a provider's from ABI V3 on): the device signals the eventfd fd when it
    // raises a completion event on cq / an async event on context. The provider dups fd; -1
    // detaches. 0 or a negative errno; -EOPNOTSUPP when the device raises no events (an rdma-core
    // device has its own completion channels).
    int setCqEventFd(ibv_cq *cq, int fd) const;
    int setAsyncEventFd(ibv_context *context, int fd) const;
    // Restart (a provider's from ABI V4 on, all three entries or none): whether the device's
    // objects can be carried into a new broker process, and the calls that do it. Without them,
    // export/import answer EOPNOTSUPP and the device's sessions end on a restart.
    bool keepsAcrossRestart() const { return keeps_; }
    int exportObject(ibv_extend_vdev_obj kind, const void *object, ibv_extend_vdev_state *out) const;
    // NULL + errno on failure.
    void *importObject(ibv_extend_vdev_obj kind, const ibv_extend_vdev_state *in,
                       const ibv_extend_vdev_import *env) const;
    int setPaused(bool paused) const;
    // ibv_resize_cq on a CQ of the extend API (a provider's from ABI V7 on): 0 or a negative
    // errno; -EOPNOTSUPP when the provider cannot (an rdma-core device's CQs are not served).
    int resizeCq(ibv_cq_extend *cq, uint32_t cqe) const;
    // ibv_rereg_mr (a provider's from ABI V7 on; ibv_extend_vdev.h says what the arguments
    // mean): 0 or a negative errno, -EOPNOTSUPP when the provider cannot.
    int reregMr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                int access) const;

    // XRC (a provider's from ABI V6 on; ibv_extend_vdev.h, softnda SPEC.md §14): domains, XRC
    // SRQs and target QPs. Pointer calls NULL + errno, int calls 0 or a negative errno;
    // EOPNOTSUPP when the provider has none (an rdma-core device's XRC is not served).
    ibv_xrcd *openXrcd(ibv_context *context) const;
    int closeXrcd(ibv_xrcd *xrcd) const;
    ibv_srq_extend *createXrcSrq(ibv_context *context, ibv_srq_init_attr_extend *attr, ibv_xrcd *xrcd,
                                 ibv_cq *cq) const;
    ibv_qp_extend *createXrcTgtQp(ibv_context *context, ibv_qp_init_attr_extend *attr, ibv_xrcd *xrcd) const;
    int getSrqNum(ibv_srq *srq, uint32_t *srq_num) const;

    // ibv_attach_mcast / ibv_detach_mcast on a UD QP of the extend API (a provider's from ABI V8
    // on): 0 or a negative errno, -EOPNOTSUPP when the provider cannot.
    int attachMcast(ibv_qp_extend *qp, const ibv_gid &gid, uint16_t lid) const;
    int detachMcast(ibv_qp_extend *qp, const ibv_gid &gid, uint16_t lid) const;

    // ibv_alloc_mw / ibv_dealloc_mw (a provider's from ABI V9 on, libibverbs' for an rdma-core
    // device): NULL + errno, 0 or a negative errno; EOPNOTSUPP when the provider has none.
    ibv_mw *allocMw(ibv_pd *pd, ibv_mw_type type) const;
    int deallocMw(ibv_mw *mw) const;
    // Device memory (a provider's from ABI V10 on; ibv_extend_vdev.h, softnda SPEC.md §17).
    // Pointer calls NULL + errno, int calls 0 or a negative errno; EOPNOTSUPP when the device has
    // none. An rdma-core device's go to libibverbs (ops unused), and its memory is not reachable
    // (dmMemory answers -EOPNOTSUPP), so a broker cannot hand it to a tenant.
    ibv_dm *allocDm(ibv_context *context, const ibv_alloc_dm_attr &attr, ibv_extend_ops *ops) const;
    int freeDm(ibv_dm *dm) const;
    ibv_mr *regDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access) const;
    int dmMemory(ibv_dm *dm, void **addr, uint64_t *length) const;

  private:
    int result(int rc) const;

    Ops ops_;
    Convention convention_ = Convention::kExtend;
    const ibv_extend_vdev_ops *vdev_ = nullptr;
    ibv_device *device_ = nullptr;
    std::string name_;
    bool keeps_ = false;
};

// The libibverbs error convention translated to ours: 0, or a negative errno (a positive rc is
// the errno; a negative one is the old "-1 + errno" shape, -EIO when errno says nothing).
int verbsRc(int rc);

// Direct mode: the table of the device behind dev, its vdev provider's when one owns it (asked
// through is_own_device), else libibverbs'. Decided on the first call for dev and cached; the
// reference stays valid for the process lifetime.
const DeviceVerbs &deviceVerbsFor(const ibv_device *dev);

}  // namespace ibvx::loader
