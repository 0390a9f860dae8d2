/*
 * ibv_extend_vdev.h - south-bound addition for virtual devices.
 *
 * The reference ABI matches extension drivers to rdma-core devices by provider name. A software
 * NIC such as softnda has no rdma-core ibv_device, so it brings its devices itself: it registers
 * one struct ibv_extend_vdev_ops (next to its ordinary struct verbs_device_extend_ops, with the
 * same provider name) that lists its devices, opens an ibv_context for one, and provides the
 * standard verbs the library cannot get from libibverbs for such a context (PD, MR, QP state).
 *
 * The contexts a virtual device hands out are not libibverbs contexts: libibverbs functions must
 * not be called on them or on objects created from them; use the ops below instead. The
 * reference functions (ibv_open_extend() on such a context, ibv_create_qp_extend(), ...) work
 * unchanged. Nothing in ibv_extend.h changes: this addition is purely additive.
 *
 * Every ibv_pd, ibv_mr, ibv_qp, ibv_cq and ibv_srq a provider returns for such a context must have
 * its `context` member set: the library dispatches calls on them by it.
 *
 * Return conventions follow ibv_extend.h: negative errno from int functions, NULL + errno from
 * pointer functions. Plain C; compiles on its own in C and C++.
 */
#ifndef IBV_EXTEND_VDEV_H
#define IBV_EXTEND_VDEV_H

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI a provider's struct ibv_extend_vdev_ops was built against. V1 ends at export_mmio;
 * V2 adds query_counters; V3 adds query_device, query_port, query_gid (what the libibverbs
 * face answers ibv_query_device/_port/_gid with) and the event fds; V4 adds the restart entries
 * (export_object, import_object, set_paused: the broker keeps live queues across its own
 * restart, docs/restart.md); V5 adds guarantees (below). The library reads an entry only when
 * the provider's abi has it, so an older provider (a shorter struct) keeps working unchanged. */
#define IBV_EXTEND_VDEV_ABI_V1 1
#define IBV_EXTEND_VDEV_ABI_V2 2
#define IBV_EXTEND_VDEV_ABI_V3 3
#define IBV_EXTEND_VDEV_ABI_V4 4
#define IBV_EXTEND_VDEV_ABI_V5 5
#define IBV_EXTEND_VDEV_ABI_V6 6   /* XRC: the entries of "XRC (ABI V6)" below */
#define IBV_EXTEND_VDEV_ABI_V7 7   /* resize_cq, rereg_mr */
#define IBV_EXTEND_VDEV_ABI_V8 8   /* attach_mcast, detach_mcast */
#define IBV_EXTEND_VDEV_ABI_V9 9   /* alloc_mw, dealloc_mw */
#define IBV_EXTEND_VDEV_ABI_V10 10 /* device memory: alloc_dm, free_dm, reg_dm_mr, dm_memory */
#define IBV_EXTEND_VDEV_ABI_MAX IBV_EXTEND_VDEV_ABI_V10
#define IBV_EXTEND_VDEV_NAME_MAX 64

/* ---- What a driver guarantees ----
 * The reference promises nothing about an extension driver's thread-safety, so a caller that
 * shares one device among threads (the broker serves many tenants on it) serializes every call
 * into the driver per device. A driver that guarantees more says so with these bits, once:
 *  - a virtual-device provider in its struct ibv_extend_vdev_ops (guarantees, ABI V5), for
 *    itself and the struct verbs_device_extend_ops of the same name;
 *  - any other extension driver (one rdma-core devices are matched to, registered with the
 *    reference PROVIDER_EXTEND_DRIVER) with PROVIDER_EXTEND_GUARANTEES(ops, bits) next to it.
 * A driver that declares nothing gets the safe default; bits a library does not know are
 * ignored. */

/* Calls on different contexts of one device may run at the same time, from any threads: the
 * driver locks what its contexts share (calls on one context are never concurrent). */
#define IBV_EXTEND_GUARANTEE_CONCURRENT_CONTEXTS (1u << 0)

/* A QP's modify from RESET to INIT only stores its attributes: before the QP leaves INIT nothing
 * a peer, the engine or another call sees has changed (a peer's requests find it not ready, as
 * in RESET; receives may be posted in either). And it refuses exactly:
 *  - with EINVAL, a mask other than IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT and, for a
 *    UD QP, IBV_QP_QKEY, for any other type IBV_QP_ACCESS_FLAGS (IBV_QP_CUR_STATE may be added,
 *    naming RESET); a port outside 1..phys_port_cnt; a pkey_index other than 0 (a one-entry
 *    P_Key table); access flags outside IBV_ACCESS_LOCAL_WRITE, _REMOTE_WRITE, _REMOTE_READ,
 *    _REMOTE_ATOMIC, _MW_BIND and _RELAXED_ORDERING;
 *  - with EPERM, a privileged Q_Key (its top bit set).
 * XRC target QPs are not covered. A broker client may then answer such a modify itself and
 * carry it with the QP's next call (docs/verbs.md, "Bring-up"). */
#define IBV_EXTEND_GUARANTEE_PLAIN_INIT (1u << 1)

/* ---- Restart (ABI V4) ----
 * A broker that restarts (or crashes and is restarted) keeps its tenants' queues. What carries
 * them across is fds and serialized state: the queue memory (the broker's arena, memfds), the
 * tenants' registered memory, the doorbell pages, the event fds, and one small state blob per
 * driver object. The broker takes a blob with export_object() after every control operation on
 * an object (create, modify), keeps it with the fds in memory that outlives its process, and in
 * the new process calls import_object() for every object, parents first, with the engine paused.
 *
 * So the blob of the last control operation plus the queue memory must be the whole state of an
 * object: whatever the device changes on its own between control operations (cursors, PSNs, a
 * QP's move to ERR) must live in queue memory, where it survives. softnda's SPEC.md §10 says how
 * it does this. */
enum ibv_extend_vdev_obj {
    IBV_EXTEND_VDEV_OBJ_CONTEXT = 1, /* struct ibv_context * */
    IBV_EXTEND_VDEV_OBJ_PD = 2,      /* struct ibv_pd * */
    IBV_EXTEND_VDEV_OBJ_MR = 3,      /* struct ibv_mr * */
    IBV_EXTEND_VDEV_OBJ_CQ = 4,      /* struct ibv_cq_extend * (create_cq_extend's result) */
    IBV_EXTEND_VDEV_OBJ_SRQ = 5,     /* struct ibv_srq_extend * */
    IBV_EXTEND_VDEV_OBJ_QP = 6,      /* struct ibv_qp_extend * */
    IBV_EXTEND_VDEV_OBJ_XRCD = 7,    /* struct ibv_xrcd * (ABI V6) */
    IBV_EXTEND_VDEV_OBJ_MW = 8,      /* struct ibv_mw * (ABI V9) */
    IBV_EXTEND_VDEV_OBJ_DM = 9,      /* struct ibv_dm * (ABI V10) */
};

#define IBV_EXTEND_VDEV_STATE_MAX 2048 /* bytes of one object's blob */
#define IBV_EXTEND_VDEV_STATE_FDS 4    /* fds one object's state may need */

/* One object's state. data is the driver's own format: it must carry its own version, since the
 * importing process may run a newer driver (an upgrade). */
struct ibv_extend_vdev_state {
    uint32_t len;    /* bytes of data used */
    uint32_t fd_cnt; /* fds used */
    int fds[IBV_EXTEND_VDEV_STATE_FDS];
    uint8_t data[IBV_EXTEND_VDEV_STATE_MAX];
};

/* What import_object needs besides the blob: the object's parents, already imported, and where
 * the memory it used now lives. */
struct ibv_extend_vdev_import {
    const char *device;          /* CONTEXT: the device name it was opened on */
    struct ibv_context *context; /* every other kind: its restored context */
    struct ibv_pd *pd;           /* MR, SRQ, QP */
    struct ibv_cq *send_cq;      /* QP (for a CQ: NULL) */
    struct ibv_cq *recv_cq;      /* QP */
    struct ibv_srq *srq;         /* QP, or NULL */
    struct ibv_extend_ops *ops;  /* CQ, SRQ, QP: the queue-memory callbacks, as at create */
    /* The new address of [old_addr, old_addr + length) of memory the object used in the old
     * process (queue memory from ops->alloc, a doorbell db_mmap returned, a registered MR's
     * address), or NULL when the caller does not know it (import then fails with EINVAL). */
    void *(*relocate)(void *arg, uint64_t old_addr, uint64_t length);
    void *arg;
    /* ABI V6 (XRC): the domain of an XRC SRQ or XRC target QP, and an XRC SRQ's CQ. NULL
     * otherwise. */
    struct ibv_xrcd *xrcd;
    struct ibv_cq *srq_cq;
    /* ABI V10: the device memory an MR registered with reg_dm_mr is on. NULL otherwise. */
    struct ibv_dm *dm;
    uint64_t resv[1];
};

/* What a virtual device announces about itself. */
struct ibv_extend_vdev_attr {
    char name[IBV_EXTEND_VDEV_NAME_MAX]; /* unique device name, e.g. "softnda0" */
    uint32_t phys_port_cnt;
    uint32_t max_pd;
    uint32_t max_mr;
    uint32_t max_qp;
    uint32_t max_cq;
    uint32_t max_srq;
    uint32_t max_qp_wr;  /* max SQ/RQ depth */
    uint32_t max_cqe;    /* max CQ depth */
    uint32_t max_srq_wr; /* max SRQ depth */
    uint32_t max_sge;
    uint32_t max_inline_data; /* bytes */
    uint32_t max_msg_sz;      /* bytes */
    uint64_t max_mr_size;     /* bytes */
    uint64_t max_dm_size;     /* bytes of device memory (ABI V10; read as 0 from an older provider) */
    uint64_t resv[7];
};

struct ibv_extend_vdev_ops {
    uint32_t abi;         /* IBV_EXTEND_VDEV_ABI_V1 .. _V4 (see above) */
    const char *provider; /* provider name; equals the name of the matching verbs_device_extend_ops */

    /* Sets a provider option before its devices are opened ("devices", "max_qp", ...).
     * -EINVAL for an unknown key or bad value, -EBUSY once a device is open. May be NULL. */
    int (*configure)(const char *key, const char *value);

    /* Fills up to max entries; returns the number of devices the provider has (may exceed max). */
    int (*query_devices)(struct ibv_extend_vdev_attr *attrs, int max);

    /* Opens a device by name; ibv_open_extend() accepts the result. NULL + errno on failure. */
    struct ibv_context *(*open_device)(const char *name);
    int (*close_device)(struct ibv_context *context);

    /* Non-zero when dev is one of this provider's virtual devices. */
    int (*is_own_device)(const struct ibv_device *dev);

    struct ibv_pd *(*alloc_pd)(struct ibv_context *context);
    int (*dealloc_pd)(struct ibv_pd *pd);

    /* Registers [addr, addr+length) of the calling process's memory, addressed by work
     * requests (local SGEs and remote RDMA addresses alike) as [iova, iova+length), as
     * ibv_reg_mr_iova() does. Direct mode passes iova == (uintptr_t)addr; a broker passes the
     * tenant's own address of the same memory, so tenants post the addresses they know.
     * mr->addr reports iova. */
    struct ibv_mr *(*reg_mr)(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
    int (*dereg_mr)(struct ibv_mr *mr);

    /* Standard QP state machine (RESET->INIT->RTR->RTS->SQD/SQE/ERR) on QPs created through
     * ibv_create_qp_extend() on this provider's contexts. */
    int (*modify_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
    int (*query_qp)(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
                    struct ibv_qp_init_attr *init_attr);

    /* Device memory-mapped I/O (doorbell registers) is ordinary shared memory in a virtual
     * device. Given an address inside such a page, returns a new fd (the caller closes it) and
     * the offset of the page-aligned range [addr & ~4095, ...) in it, so a broker can map the
     * same doorbell into another process. -ENOENT when addr is not device MMIO. May be NULL. */
    int (*export_mmio)(const void *addr, int *fd, uint64_t *offset);

    /* Counters the provider keeps for one of its devices (an engine's WQEs, bytes, CQEs, ...),
     * for an operator: calls emit(arg, name, value) once per counter, in a stable order, before
     * returning. name is valid only during the call. 0, or -ENODEV (not one of its devices) /
     * -EINVAL (NULL argument). May be NULL: the provider reports no counters. ABI V2 and later
     * only: it is never read from a V1 provider. */
    int (*query_counters)(const char *device, void (*emit)(void *arg, const char *name, uint64_t value),
                          void *arg);

    /* ---- ABI V3 and later (never read from an older provider) ----
     * The standard queries, so a virtual device answers ibv_query_device(), ibv_query_port() and
     * ibv_query_gid() like an rdma-core device (a broker serves them to tenants through the
     * libibverbs face). Each fills the whole struct (zero what does not apply) and returns 0 or a
     * negative errno: -EINVAL for a port outside 1..phys_port_cnt or a GID index outside
     * 0..gid_tbl_len-1. May be NULL: the call then answers -EOPNOTSUPP. A virtual device's P_Key
     * table is the default one: pkey_tbl_len entries of full-membership 0xffff. */
    int (*query_device)(struct ibv_context *context, struct ibv_device_attr *attr);
    int (*query_port)(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *attr);
    /* entry->gid, gid_index, port_num and gid_type (enum ibv_gid_type); ndev_ifindex the
     * interface of a RoCE GID, else 0. -ENODATA for an empty slot, as the kernel answers. */
    int (*query_gid)(struct ibv_context *context, uint8_t port_num, uint32_t index,
                     struct ibv_gid_entry *entry);

    /* Event delivery (ABI V3). The device signals fd (adds 1 to an eventfd) when it raises a
     * completion event on cq (set_cq_event_fd) or an async event on any object of context
     * (set_async_event_fd); which object, the consumer reads from the queues' memory (the
     * driver's spec says how). The provider dups fd; fd = -1 detaches. 0 or a negative errno.
     * May be NULL: events are then not raised. */
    int (*set_cq_event_fd)(struct ibv_cq *cq, int fd);
    int (*set_async_event_fd)(struct ibv_context *context, int fd);

    /* ---- ABI V4 and later (never read from an older provider); all three or none ----
     * export_object: fills *out with the state of object (of kind) as of now, the fds as new
     * dups the caller owns. Called between control operations on the object (the caller
     * serializes them), with the engine running; it changes nothing. 0 or a negative errno
     * (-ENOSPC: the state does not fit; -EINVAL: not one of this provider's objects).
     * import_object: in a new process, makes the object again from a blob export_object wrote
     * (maybe in an older version of the driver) and returns it as create returned it (see enum
     * ibv_extend_vdev_obj), NULL + errno on failure. On success the object owns in->fds (it keeps
     * or closes them); on failure they stay the caller's. The caller destroys imported objects
     * with the ordinary destroy calls.
     * set_paused: paused != 0 stops the device's engine after the pass it is in (it returns when
     * no WQE is executing), 0 lets it run again. A restoring broker pauses every device before
     * its first import and resumes each once all its objects are back, so no QP runs before its
     * peer exists. 0, -ENODEV. */
    int (*export_object)(enum ibv_extend_vdev_obj kind, const void *object,
                         struct ibv_extend_vdev_state *out);
    void *(*import_object)(enum ibv_extend_vdev_obj kind, const struct ibv_extend_vdev_state *in,
                           const struct ibv_extend_vdev_import *env);
    int (*set_paused)(const char *device, int paused);

    /* ---- ABI V5 and later (never read from an older provider) ----
     * What the provider and its extension driver guarantee: IBV_EXTEND_GUARANTEE_* bits (see
     * "What a driver guarantees" above). 0: nothing beyond the reference. */
    uint32_t guarantees;

    /* ---- XRC (ABI V6 and later; never read from an older provider; all five or none) ----
     * XRC domains, XRC SRQs and XRC target QPs (softnda's SPEC.md, §14), which the reference's
     * create structs cannot name. An XRC domain belongs to the device, not to the context that
     * opened it: SRQs and target QPs of any context of the device may use it, which is how two
     * processes share one (the fd/oflags sharing of ibv_open_xrcd is the caller's business: it
     * opens one domain per file and hands it to every opener). Initiator QPs (IBV_QPT_XRC_SEND)
     * are made by the ordinary create_qp_extend, with no recv_cq and no SRQ. */
    struct ibv_xrcd *(*open_xrcd)(struct ibv_context *context);
    /* 0, -EBUSY while an SRQ or QP uses it, -EINVAL. */
    int (*close_xrcd)(struct ibv_xrcd *xrcd);
    /* An SRQ of type IBV_SRQT_XRC in xrcd, completing its receives on cq (a CQ of the same
     * context); attr as for create_srq_extend (pd: the PD its receives' lkeys and the requests'
     * rkeys must belong to). NULL + errno. */
    struct ibv_srq_extend *(*create_xrc_srq)(struct ibv_context *context,
                                             struct ibv_srq_init_attr_extend *attr, struct ibv_xrcd *xrcd,
                                             struct ibv_cq *cq);
    /* An XRC target QP (IBV_QPT_XRC_RECV) in xrcd: attr->pd and the CQs and SRQ are ignored
     * (a target has none), attr->ops as for create_qp_extend. NULL + errno. */
    struct ibv_qp_extend *(*create_xrc_tgt_qp)(struct ibv_context *context,
                                               struct ibv_qp_init_attr_extend *attr, struct ibv_xrcd *xrcd);
    /* The SRQ number of an XRC SRQ (what initiators name in their work requests). 0 or -EINVAL
     * (not an XRC SRQ). */
    int (*get_srq_num)(struct ibv_srq *srq, uint32_t *srq_num);

    /* ---- ABI V7 and later (never read from an older provider) ----
     * ibv_resize_cq on a CQ create_cq_extend made: at least cqe entries, keeping every completion
     * not yet polled (-EINVAL when cqe is 0, above the device's max_cqe, or below the number of
     * completions the CQ holds; the CQ is then unchanged). On success cq->cq->cqe is the new
     * depth and cq->cq_info describes the CQ's new queue memory (from the create's ops; the old
     * is freed): whoever polls it re-reads cq_info, and must not poll during the call. May be
     * NULL: resizing answers -EOPNOTSUPP. */
    int (*resize_cq)(struct ibv_cq_extend *cq, uint32_t cqe);
    /* ibv_rereg_mr on an MR reg_mr made: flags (enum ibv_rereg_mr_flags, at least one) say which
     * of the translation ([addr, addr+length) addressed as [iova, iova+length), as reg_mr takes
     * them), the PD (one of the same context) and the access flags change; the others are
     * ignored. On success mr's fields (pd, addr = iova, length, lkey, rkey) say what it is now;
     * keys may change (the driver documents how). 0, or a negative errno with the MR unchanged
     * (-EINVAL: no or unknown flags, a foreign PD, bad access or range). May be NULL: -EOPNOTSUPP. */
    int (*rereg_mr)(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                    int access);

    /* ---- ABI V8 and later ----
     * ibv_attach_mcast / ibv_detach_mcast on a UD QP create_qp_extend made: the QP joins (leaves)
     * the multicast group gid (a multicast GID: first byte 0xff) with multicast LID lid
     * (0xc000-0xfffe), and receives the datagrams sent to it (the driver documents how it tells
     * groups apart). Attaching a group the QP has is 0 and changes nothing, as the kernel
     * answers. 0 or a negative errno: -EINVAL (not a UD QP, not a multicast GID or LID, a
     * detach of a group the QP does not have), -ENOMEM (the device's attach limits,
     * max_mcast_qp_attach and max_total_mcast_qp_attach). A destroyed QP leaves its groups. May
     * be NULL: -EOPNOTSUPP. */
    int (*attach_mcast)(struct ibv_qp_extend *qp, const union ibv_gid *gid, uint16_t lid);
    int (*detach_mcast)(struct ibv_qp_extend *qp, const union ibv_gid *gid, uint16_t lid);

    /* ---- ABI V9 and later ----
     * ibv_alloc_mw / ibv_dealloc_mw: a memory window of type (IBV_MW_TYPE_1 or _2) in pd, unbound,
     * its rkey in mw->rkey. Binding and invalidation are work requests the driver's data path
     * posts (the driver's spec says how). dealloc_mw of a bound window invalidates it; while a
     * window is bound to an MR, dereg_mr and rereg_mr of that MR answer -EBUSY, and the PD
     * stays busy while it has windows. alloc: NULL + errno (EINVAL, ENOMEM); dealloc: 0 or a
     * negative errno. Both or none; NULL: -EOPNOTSUPP. */
    struct ibv_mw *(*alloc_mw)(struct ibv_pd *pd, enum ibv_mw_type type);
    int (*dealloc_mw)(struct ibv_mw *mw);
    /* ---- ABI V10 and later: device memory (never read from an older provider; all four or none) ----
     * ibv_alloc_dm and friends (softnda's SPEC.md §17). A device has max_dm_size bytes of device
     * memory (ibv_extend_vdev_attr); an allocation takes part of it, and its bytes live where
     * ops->alloc puts them, as a queue's do (a broker: the session's own memory, which the
     * tenant maps; nobody else's). The struct ibv_dm returned has context, memcpy_to_dm and
     * memcpy_from_dm set, which copy in the calling process. NULL + errno: EINVAL (length 0 or
     * above max_dm_size, unknown comp_mask bits, an alignment the driver cannot give, incomplete
     * ops), ENOMEM (the device memory is full). */
    struct ibv_dm *(*alloc_dm)(struct ibv_context *context, const struct ibv_alloc_dm_attr *attr,
                               struct ibv_extend_ops *ops);
    /* 0, -EBUSY while an MR is registered on it (nothing freed), -EINVAL. */
    int (*free_dm)(struct ibv_dm *dm);
    /* [offset, offset+length) of dm as an MR of pd, addressed zero-based (iova 0 is dm's byte
     * offset): access must hold IBV_ACCESS_ZERO_BASED; the driver documents what else it allows.
     * NULL + errno (EINVAL: bad access, range, or a dm of another device). dereg_mr frees it. */
    struct ibv_mr *(*reg_dm_mr)(struct ibv_pd *pd, struct ibv_dm *dm, uint64_t offset, size_t length,
                                unsigned int access);
    /* Where dm's bytes are in the calling process (what ops->alloc returned) and how many
     * (*length may exceed the length asked for: the driver's allocation unit). 0 or -EINVAL. */
    int (*dm_memory)(struct ibv_dm *dm, void **addr, uint64_t *length);
};

void verbs_register_vdev_extend(const struct ibv_extend_vdev_ops *ops);

/* Declares what the extension driver whose ops are drv (registered by its own
 * PROVIDER_EXTEND_DRIVER) guarantees: IBV_EXTEND_GUARANTEE_* bits. For drivers without a struct
 * ibv_extend_vdev_ops (a vdev provider declares them there). The first declaration for a table
 * counts. PROVIDER_EXTEND_GUARANTEES refers to it weakly: a driver that declares still loads in
 * a library without it (the reference's, which knows only verbs_register_driver_extend), and
 * declares nothing there. */
void verbs_declare_guarantees_extend(const struct verbs_device_extend_ops *drv, uint32_t guarantees);

#define PROVIDER_EXTEND_VDEV(vops)                                                \
    static __attribute__((constructor)) void vops##__register_extend_vdev(void) { \
        verbs_register_vdev_extend(&(vops));                                      \
    }

/* The pragma on a line of its own (clang-format would run it into the definition). */
/* clang-format off */
#define PROVIDER_EXTEND_GUARANTEES(drv, bits)                                         \
    _Pragma("weak verbs_declare_guarantees_extend")                                   \
    static __attribute__((constructor)) void drv##__declare_extend_guarantees(void) { \
        if (verbs_declare_guarantees_extend != NULL) {                                \
            verbs_declare_guarantees_extend(&(drv), (bits));                          \
        }                                                                             \
    }
/* clang-format on */

#ifdef __cplusplus
}
#endif

#endif /* IBV_EXTEND_VDEV_H */
