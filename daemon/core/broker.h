// The broker core: sessions, handles, objects and the calls the tenant-facing service makes.
// No gRPC here: the edge converts proto <-> these types, and tests call them directly.
//
// Threading: every method may be called from any thread.
//  - sessions_mu_ guards the session maps (by token and id); held only for map operations.
//  - A call on a session holds Session::mu_ for its duration (see session.h for the order).
//  - endSession() may run concurrently with calls on that session: it unlinks the session,
//    marks it ended, then waits for the session's mutex and destroys everything; a call that
//    gets the mutex afterwards answers UNAVAILABLE.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/build_config.h"
#include "common/status.h"
#include "daemon/core/device.h"
#include "daemon/core/events.h"
#include "daemon/core/identity.h"
#include "daemon/core/mapping.h"
#include "daemon/core/policy.h"
#include "daemon/core/quota.h"
#include "daemon/core/session.h"

namespace ibvx::daemon {

struct Version {
    uint32_t major = 0, minor = 0, patch = 0;
};

struct QueueResult {
    RegionRef base;
    uint32_t entry_cnt = 0;
    uint32_t entry_size = 0;
    RegionRef dbr_pi, dbr_ci, db_hw;
    uint8_t qbuf_resv[32] = {};
    uint8_t info_resv[32] = {};
};

struct OpenContextResult {
    uint64_t context = 0;
    DeviceInfo device;
    uint32_t driver_version = 0;
    uint32_t driver_ops_present = 0;
};

struct RegMrArgs {
    uint64_t pd = 0;
    uint64_t xfer_id = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t access = 0;
    uint64_t iova = 0;  // 0: the broker's own address of the memory
    // Non-zero: the tenant's own shared mapping at this address, opened by the broker
    // (tenant_mapping.h); xfer_id and offset are then 0.
    uint64_t tenant_address = 0;
};

struct RegMrResult {
    uint64_t mr = 0;
    uint32_t lkey = 0, rkey = 0;
    uint64_t iova = 0;
};

// ibv_rereg_mr (softnda SPEC.md §13).
struct ReregMrArgs {
    uint64_t mr = 0;
    int flags = 0;        // enum ibv_rereg_mr_flags
    uint64_t pd = 0;      // IBV_REREG_MR_CHANGE_PD
    uint32_t access = 0;  // IBV_REREG_MR_CHANGE_ACCESS
    // IBV_REREG_MR_CHANGE_TRANSLATION: the new memory, named as a RegMr names it (its pd and
    // access are unused); all 0 without the flag.
    RegMrArgs memory;
};

struct CreateCqArgs {
    uint64_t context = 0;
    uint32_t cqe = 0;
    uint32_t comp_vector = 0;
    uint64_t wc_flags = 0;
    uint32_t cq_cap_flag = 0;
    queue_buf_dma_mode dma_mode = QU_BUF_DMA_MODE_DEFAULT;
    // Non-zero: the eventfd the tenant sent on the fd channel with this id, signalled by the
    // device when it raises a completion event on the CQ.
    uint64_t event_xfer_id = 0;
};

struct CqResult {
    uint64_t cq = 0;
    uint32_t cqe = 0;
    QueueResult info;
    uint8_t resv[256] = {};
};

// An XRC initiator (IBV_QPT_XRC_SEND) has a PD and a send CQ, no recv_cq and no SRQ; an XRC
// target (IBV_QPT_XRC_RECV) has its domain (xrcd) and nothing else (softnda SPEC.md §14).
struct CreateQpArgs {
    uint64_t context = 0, pd = 0, send_cq = 0, recv_cq = 0, srq = 0, xrcd = 0;
    ibv_qp_type qp_type = IBV_QPT_RC;
    ibv_qp_cap cap{};
    bool sq_sig_all = false;
    uint32_t qp_cap_flag = 0;
    queue_buf_dma_mode dma_mode = QU_BUF_DMA_MODE_DEFAULT;
};

struct QpResult {
    uint64_t qp = 0;
    uint32_t qp_num = 0;
    ibv_qp_state state = IBV_QPS_RESET;
    ibv_qp_cap cap{};
    QueueResult sq, rq;
    uint8_t resv[248] = {};
    uint64_t vendor_priv_info = 0;
};

// With xrcd: an XRC SRQ of that domain whose receives complete on cq (both or neither).
struct CreateSrqArgs {
    uint64_t context = 0, pd = 0, xrcd = 0, cq = 0;
    uint32_t max_wr = 0, max_sge = 0, srq_limit = 0, srq_cap_flag = 0;
    queue_buf_dma_mode dma_mode = QU_BUF_DMA_MODE_DEFAULT;
};

// ibv_open_xrcd: with file_xfer_id, the domain of the file the tenant sent on the fd channel
// under that id, shared with every session that opens it with the same file; without, a new
// private domain (fd -1). oflags: O_CREAT and O_EXCL only.
struct OpenXrcdArgs {
    uint64_t context = 0;
    uint64_t file_xfer_id = 0;
    uint32_t oflags = 0;
};

// ibv_open_qp: a handle on the XRC target qp_num of the domain xrcd (a handle of the session)
// names, on a context of the session (softnda SPEC.md §14, docs/verbs.md).
struct OpenQpArgs {
    uint64_t context = 0, xrcd = 0;
    uint32_t qp_num = 0;
    ibv_qp_type qp_type = IBV_QPT_XRC_RECV;
};

struct SrqResult {
    uint64_t srq = 0;
    uint32_t max_wr = 0, max_sge = 0;
    uint32_t srq_num = 0;  // an XRC SRQ's number; 0 for a basic SRQ
    QueueResult info;
    uint8_t resv[256] = {};
};

// What QueryPort answers: the port's attributes and the populated entries of its GID table
// (at most kMaxGidEntries are read).
struct PortInfo {
    ibv_port_attr attr{};
    std::vector<ibv_gid_entry> gids;
};
inline constexpr int kMaxGidEntries = 256;

struct QueryQpResult {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
};

struct NegoResult {
    ibv_hyroce_feature output{};
    uint32_t need_more_nego = 0;
};

// ibv_alloc_dm (softnda SPEC.md §17).
struct AllocDmArgs {
    uint64_t context = 0;
    uint64_t length = 0;
    uint32_t log_align_req = 0;
    uint32_t comp_mask = 0;
};

struct DmResult {
    uint64_t dm = 0;
    RegionRef memory;  // the allocation's bytes in the tenant's mapping of the region
};

struct RegDmMrArgs {
    uint64_t pd = 0, dm = 0;
    uint64_t offset = 0, length = 0;
    uint32_t access = 0;
};

// Regions the tenant may unmap after a destroy.
using Released = std::vector<RegionId>;

// A multicast group of a QP (AttachMcast, DetachMcast).
struct MwResult {
    uint64_t handle = 0;
    uint32_t rkey = 0;
};

struct McastArgs {
    uint64_t qp = 0;
    ibv_gid gid{};
    uint16_t lid = 0;
};

struct ResizeCqResult {
    uint32_t cqe = 0;   // the depth granted
    QueueResult info;   // the CQ's new queue memory
    Released released;  // arena regions the old memory freed (the tenant unmaps them)
};

// One object as a restarted broker's snapshot recorded it (daemon/restart reads it from the
// session's state file): what Broker::adopt() makes again in this process, under the same handle.
struct ObjectImport {
    uint64_t handle = 0;
    ObjectKind kind = ObjectKind::kContext;
    std::vector<uint64_t> uses;  // handles of objects adopted before it (kParentsFirst)
    std::string device;          // kContext: the device it was opened on
    QuotaValues quota{};         // what it held against its tenant's quotas
    uint64_t queue_bytes = 0;
    // The driver's own state (export_object's blob) and the fds that go with it.
    std::string driver_state;
    std::vector<UniqueFd> driver_fds;
    struct Mr {
        UniqueFd fd;  // the tenant's memfd
        uint64_t fd_offset = 0, length = 0, map_length = 0;
        uint64_t old_address = 0;  // of the old process's mapping (relocated for the driver)
    } mr;                          // kMr
    struct Qp {
        ibv_qp_type type = IBV_QPT_RC;
        bool sq_sig_all = false, has_srq = false;
        ibv_qp_cap cap{};
        uint32_t opened_num = 0;  // an OpenQp handle: the XRC target it names (no driver state)
    } qp;                         // kQp
    ibv_ah_attr ah{};             // kAh: all there is of it (no driver state)
    UniqueFd xrcd_file;           // kXrcd: the file of a shared domain (XrcdObject::file); invalid: private
};

// Called by Broker::commit with the session's mutex held, after the reply was stored: the
// restart layer writes the session's state there (daemon/restart). Tests leave it empty.
using CommitSink = std::function<Status(Session &)>;

// Sends regions to the tenant before a reply: the default writes kRegionAdd frames on the
// session's fd channel. Tests replace it.
using RegionSender = std::function<Status(Session &, std::vector<RegionToSend> &)>;

class Broker {
  public:
    struct Options {
        std::chrono::milliseconds attach_timeout{5000};
        std::chrono::milliseconds xfer_wait{2000};
        std::chrono::milliseconds channel_send_timeout{1000};
        size_t max_objects_per_session = 1u << 16;
        size_t max_sessions = 4096;
        Version version{IBVX_PROJECT_VERSION_MAJOR, IBVX_PROJECT_VERSION_MINOR, IBVX_PROJECT_VERSION_PATCH};
    };

    Broker(Options options, DeviceRegistry *devices);
    ~Broker();
    Broker(const Broker &) = delete;
    Broker &operator=(const Broker &) = delete;

    const Options &options() const { return options_; }
    DeviceRegistry &devices() { return *devices_; }
    void setRegionSender(RegionSender sender) { sender_ = std::move(sender); }
    // Set before serving (read without a lock).
    void setCommitSink(CommitSink sink) { commit_ = std::move(sink); }
    // Where object and quota events go (events.h); nullptr: nowhere. Set before serving: the
    // pointer is read without a lock, and events must outlive the broker's sessions.
    void setEvents(BrokerEvents *events) { events_ = events; }
    // Tenant policy ([policy], policy.h): checked by hello() and openContext(). Replaceable at
    // runtime (config reload); calls in flight keep the policy they started with.
    void setPolicy(std::shared_ptr<const Policy> policy);
    std::shared_ptr<const Policy> policy() const;
    // Per-tenant quotas ([quotas], quota.h): sessions, objects, registered and queue bytes. The
    // Admin API reads and overrides them here (snapshot(), setOverride()).
    QuotaManager &quotas() { return quotas_; }

    // ---- sessions ----
    StatusOr<std::shared_ptr<Session>> hello(const PeerIdentity &peer, const Version &client,
                                             std::string client_name);
    // The session of a call: the token must name a live session whose process is the caller.
    StatusOr<std::shared_ptr<Session>> authenticate(const std::string &token_hex, const Credentials &caller);
    // The fd-channel handshake. Returns 0 or a positive errno for AttachReply (EPERM wrong
    // peer, ENOENT unknown token, EBUSY already attached); on 0 the session owns fd.
    int attach(const SessionToken &token, const Credentials &caller, UniqueFd &fd,
               std::shared_ptr<Session> *out);
    // Destroys everything the session owns (QPs, SRQs, CQs, MRs, AHs, PDs, contexts) and its memory.
    void endSession(const std::shared_ptr<Session> &session);
    void endAllSessions();
    std::vector<std::shared_ptr<Session>> sessions();
    // Sessions that did not attach their fd channel within the attach timeout.
    std::vector<std::shared_ptr<Session>> unattachedExpired(std::chrono::steady_clock::time_point now);
    size_t sessionCount();
    size_t objectCount();

    // The commit point of a mutating call (docs/restart.md): stores the reply under its key
    // (key 0: none) and hands the session's state to the commit sink, before the reply is sent.
    // An error means the state could not be kept (the reply still goes out: the call did
    // happen; the session would then not survive a crash, which the sink logs).
    // reply_quota: the charge reserveReply() took for it, which the stored reply holds.
    Status commit(Session &s, StoredReply reply, QuotaCharge reply_quota = {});
    // Room for one more stored reply, before a mutating call with an idempotency key runs: one
    // of the tenant's "replies" quota. When the tenant has none left, the session gives up its
    // own oldest replies first (a client retries only its latest call); RESOURCE_EXHAUSTED when
    // it keeps none and there is still no room (the call does not run).
    StatusOr<QuotaCharge> reserveReply(Session &s);
    // The restart layer's count of the session's restart state (its state file, image and log),
    // after a commit or a restore, with the session's mutex held: charged to the tenant's
    // "state_bytes" without a check (the state is written already); while the tenant is at or
    // over its limit, checkRoom() refuses new objects, which are what the state grows with.
    void chargeStateBytes(Session &s, uint64_t bytes);

    // ---- restart (daemon/restart, docs/restart.md) ----
    // The commit's export (called by the commit sink, the session's mutex held): the driver
    // state (export_object) of the object `handle` when a control call changed it since its last
    // export, into Object::driver_state and driver_fds. Nothing to do (OK): the object is gone,
    // was exported already, or its driver cannot hand over (restart: drops, the restart plan
    // ends such sessions). An error: the driver failed, the object keeps no state (a restore of
    // the session would fail and end it). *changed (when given) says whether the export differs
    // from the last one: with keep_same, an export whose bytes equal the last one's keeps the
    // last one's fds (the new duplicates are closed), which is right only for an object touched
    // as a parent (no call of its own replaced its fds).
    Status exportObject(Session &s, uint64_t handle, bool keep_same = false, bool *changed = nullptr);
    // Once the commit logged the object's record: a leaf (isLeafKind: nothing compares a later
    // export with it) gives its kept driver state back (a softnda QP's is about 600 B); its fds stay.
    // keptState() exports it again, for a compaction that writes the record anew (the state of a
    // control call's object changes only with control calls, so that export is the logged one).
    // Both with the session's mutex held; keptState()'s error is exportObject()'s.
    void releaseLoggedState(Session &s, uint64_t handle);
    Status keptState(Session &s, uint64_t handle);
    // The restore's import, the counterpart of publish(): makes the object again from the state
    // exported in the old process (import_object), parents already adopted, and inserts it under
    // its old handle and quota charge; relocations maps the old process's addresses (arena,
    // doorbells, and the MR memory it maps here) to this one's. Takes the session's mutex; the
    // session is not live yet. On an error the caller ends the session (endSession destroys what
    // was adopted).
    Status adopt(Session &s, ObjectImport in, Relocations &relocations);
    // Makes a session rebuilt from a snapshot live, its objects adopted, under its own token and
    // id, charged again to its tenant's session quota.
    Status adoptSession(std::shared_ptr<Session> s);
    uint64_t nextSessionId();
    void raiseNextSessionId(uint64_t next);
    // Called by endSession once the session is torn down (the restart layer forgets its state).
    // Set before serving.
    void setEndSink(std::function<void(Session &)> sink) { end_sink_ = std::move(sink); }

    // ---- calls ----
    std::vector<DeviceInfo> listDevices();
    StatusOr<OpenContextResult> openContext(Session &s, const std::string &device_name);
    StatusOr<Released> closeContext(Session &s, uint64_t context);
    StatusOr<ibv_device_attr_extend> queryDevice(Session &s, uint64_t context);
    // The standard device and port queries of a context's device (DeviceVerbs).
    StatusOr<ibv_device_attr> queryDeviceAttr(Session &s, uint64_t context);
    StatusOr<PortInfo> queryPort(Session &s, uint64_t context, uint8_t port);
    // The context's async event fd: the eventfd sent on the fd channel with xfer_id, handed to
    // the driver (which keeps its own dup; the broker keeps none).
    Status setAsyncEventFd(Session &s, uint64_t context, uint64_t xfer_id);
    StatusOr<uint64_t> allocPd(Session &s, uint64_t context);
    Status deallocPd(Session &s, uint64_t pd);
    StatusOr<RegMrResult> regMr(Session &s, const RegMrArgs &args);
    Status deregMr(Session &s, uint64_t mr);
    // ibv_rereg_mr (softnda SPEC.md §13): the MR changes in place (its keys are the driver's:
    // softnda keeps them); a refusal changes nothing. A larger new range is charged to mr_bytes
    // (refused: nothing changes); a smaller one gives nothing back until the MR is deregistered,
    // as a CQ's shrink.
    StatusOr<RegMrResult> reregMr(Session &s, const ReregMrArgs &args);
    StatusOr<CqResult> createCq(Session &s, const CreateCqArgs &args);
    StatusOr<Released> destroyCq(Session &s, uint64_t cq);
    // ibv_resize_cq (softnda SPEC.md §12): at least cqe entries, every completion not yet polled
    // kept; the tenant must not poll the CQ during the call. Growth is charged to queue_bytes
    // (refused: the CQ keeps its depth); a shrink returns nothing until the CQ is destroyed.
    StatusOr<ResizeCqResult> resizeCq(Session &s, uint64_t cq, uint32_t cqe);
    StatusOr<QpResult> createQp(Session &s, const CreateQpArgs &args);
    StatusOr<Released> destroyQp(Session &s, uint64_t qp);
    StatusOr<SrqResult> createSrq(Session &s, const CreateSrqArgs &args);
    StatusOr<Released> destroySrq(Session &s, uint64_t srq);
    // A handle on an XRC domain of the context's device (driver: open_xrcd, vdev ABI V6), charged
    // to the tenant's "xrcds" quota. A domain opened with a file is shared by every session that
    // opens it with the same file (kernel semantics: EAGAIN without O_CREAT when the file has
    // none, EINVAL with O_EXCL when it has one); its driver domain is closed with its last
    // handle. Closing a handle its session's XRC SRQs or target QPs still use answers EBUSY.
    StatusOr<uint64_t> openXrcd(Session &s, const OpenXrcdArgs &args);
    Status closeXrcd(Session &s, uint64_t xrcd);
    // ibv_open_qp (broker_open_qp.cpp): a handle on a target QP any session made in the domain,
    // charged to the "qps" quota like any QP handle. The handle modifies, queries and destroys
    // as the target's own; the driver's target lives until its last handle, the creator's
    // included, goes (the kernel's usecnt). EINVAL for a type other than IBV_QPT_XRC_RECV or a
    // number that names no target of the domain.
    StatusOr<QpResult> openQp(Session &s, const OpenQpArgs &args);
    // A memory window of type 1 or 2 in a PD of the session (driver: alloc_mw, vdev ABI V9;
    // softnda SPEC.md §16), charged to the tenant's "mws" quota; the PD is busy while it has
    // windows. Binding is the data path's: the broker hands out the window's rkey as allocated.
    StatusOr<MwResult> allocMw(Session &s, uint64_t pd, ibv_mw_type type);
    Status deallocMw(Session &s, uint64_t mw);
    // An address handle of pd, its attributes checked against the PD's device (port, LID or
    // GRH, the port's GID table); the broker keeps them, no driver is asked to make anything.
    StatusOr<uint64_t> createAh(Session &s, uint64_t pd, const ibv_ah_attr &attr);
    Status destroyAh(Session &s, uint64_t ah);
    // ibv_attach_mcast (attach) / ibv_detach_mcast of a UD QP of the session (driver: attach_mcast /
    // detach_mcast, vdev ABI V8; softnda SPEC.md §11.3). The QP's restart record follows.
    Status mcast(Session &s, const McastArgs &args, bool attach);
    // Device memory (driver: alloc_dm, free_dm, reg_dm_mr, dm_memory, vdev ABI V10; softnda
    // SPEC.md §17; broker_dm.cpp): an allocation charged to "dm_bytes" whose bytes are in the
    // session's memory (sent as a region before the reply); free answers EBUSY while an MR is on
    // it; an MR on it is addressed zero-based and charged to "mrs" only.
    StatusOr<DmResult> allocDm(Session &s, const AllocDmArgs &args);
    StatusOr<Released> freeDm(Session &s, uint64_t dm);
    StatusOr<RegMrResult> regDmMr(Session &s, const RegDmMrArgs &args);
    // The device memory size of a context's device (ibv_device_attr_ex.max_dm_size).
    StatusOr<uint64_t> maxDmSize(Session &s, uint64_t context);
    // A RESET -> INIT the face held back (held_init_mask != 0; a plain_init device only,
    // DeviceInfo) is applied first; when the call's own modify is then refused, the QP stays in
    // INIT (the face asks, docs/verbs.md "Bring-up").
    StatusOr<ibv_qp_state> modifyQp(Session &s, uint64_t qp, ibv_qp_attr attr, int attr_mask,
                                    ibv_qp_attr held_init = {}, int held_init_mask = 0);
    StatusOr<QueryQpResult> queryQp(Session &s, uint64_t qp, int attr_mask);
    StatusOr<uint64_t> modifyQpExtend(Session &s, uint64_t qp, ibv_qp_attr_extend attr, int attr_mask);
    StatusOr<ibv_qp_attr_extend> queryQpExtend(Session &s, uint64_t qp, int attr_mask);
    StatusOr<ibv_hyroce_feature> queryQpSupportedHyroceFeature(Session &s, uint64_t qp, uint32_t sl,
                                                               uint32_t tc);
    StatusOr<NegoResult> negoQpHyroceFeature(Session &s, uint64_t qp, const ibv_hyroce_feature &input);

  private:
    using SessionLock = std::unique_lock<std::mutex>;
    // A queue's driver-side info and where its translation goes in the reply.
    struct QueueOut {
        const queue_info *info;
        QueueResult *out;
    };
    struct QpMembers;

    // Session::mu_ of a session that has not ended (UNAVAILABLE otherwise).
    static StatusOr<SessionLock> lockLive(Session &s);
    // RESOURCE_EXHAUSTED when the session holds max_objects_per_session objects.
    Status checkRoom(const Session &s);
    StatusOr<Object *> find(Session &s, uint64_t handle, ObjectKind kind);
    template <typename T>
    StatusOr<T *> lookup(Session &s, uint64_t handle);
    StatusOr<QpObject *> lookupQpWithVerbs(Session &s, uint64_t qp);
    StatusOr<QpMembers> qpMembers(Session &s, const CreateQpArgs &args);
    // An XRC target QP (create_xrc_tgt_qp): the create of createQp for IBV_QPT_XRC_RECV.
    StatusOr<QpResult> createXrcTargetQp(Session &s, const CreateQpArgs &args);
    // The driver's SRQ of an XRC SRQ create (create_xrc_srq) or a basic one (create_srq).
    StatusOr<ibv_srq_extend *> createDriverSrq(Session &s, ContextObject *ctx, ibv_srq_init_attr_extend &attr,
                                               XrcdObject *xrcd, CqObject *cq);
    // The memory a RegMr (or a ReregMr's new translation) names, mapped here: the fd sent on the
    // fd channel (waited for, so before the session lock), or the tenant's own shared mapping.
    // call names the RPC (the test-only crash point after the fd is taken).
    struct MrMemory;
    StatusOr<MrMemory> takeMrMemory(Session &s, const RegMrArgs &args, const char *call);
    Status openDriverContext(Session &s, ContextObject &obj);
    // EINVAL with the reason when attr names no usable destination from ctx's device.
    Status checkAhAttr(Session &s, ContextObject &ctx, const ibv_ah_attr &attr);
    // Hands a CreateCq's eventfd to the driver's new CQ (set_cq_event_fd).
    Status attachCqEventFd(Session &s, CqObject &cq, const UniqueFd &fd);
    uint64_t newHandle(Session &s);
    // A control call changed obj: its driver state is exported again at the next commit.
    static void touch(Session &s, Object *obj);
    // A child of obj was created or destroyed: exported again, logged only if that changed it.
    static void touchParent(Session &s, Object *obj);
    // Gives a new object a new handle and links it (an event reports it).
    uint64_t insert(Session &s, std::unique_ptr<Object> obj);
    // The bookkeeping of an object with its handle, new or adopted: its parents count it as a
    // user, the session holds it, and the next commit exports it and its parents.
    static void link(Session &s, std::unique_ptr<Object> obj);
    // The one publish step of every create: translate the queues' memory for the tenant, charge
    // their bytes, insert, send the new regions; any failure destroys the object again.
    StatusOr<uint64_t> publish(Session &s, std::unique_ptr<Object> obj,
                               std::initializer_list<QueueOut> queues);
    Status destroyLocked(Session &s, Object *obj);
    // Destroys the session's objects children first, as far as it can: what an XRC target other
    // sessions still hold needs (the target and its context) stays. True when something stayed.
    bool teardownLocked(Session &s);
    // ---- XRC targets with several handles (broker_open_qp.cpp) ----
    // Enters a new (or adopted) target in its device's table under its domain and number.
    void enterTarget(Session &s, QpObject &qp, const XrcdObject &xrcd);
    // Called by destroyLocked: lets go of obj's handle on a shared target. True when obj stays
    // (hidden) because other handles hold the driver's target it owns.
    bool keepsTarget(Session &s, Object *obj);
    // Called by closeContext: true when only hidden targets (see keepsTarget) still use ctx; it
    // is then hidden too, and destroyed after the last of them (finishTargets).
    bool keepsContextForTargets(Session &s, ContextObject &ctx);
    // Destroys the driver targets whose last handle went (their creators' hidden QpObjects) and
    // ends the parked sessions nothing keeps any more. Called with no session's mutex held.
    void finishTargets();
    // A session by id: a live one, or one parked at its end for a target others held.
    std::shared_ptr<Session> sessionById(uint64_t id, bool *parked);
    // Where the driver's target of an OpenQp handle lives (its creator's QpObject); none (0) for
    // any other QP. Called with the handle's session's mutex held.
    static TargetOwner creatorOf(const QpObject &qp);
    // After a handle changed the target (modify): the creator's record is exported and committed
    // again, as the restart restores the target from it. Called with no session's mutex held.
    void targetChanged(TargetOwner creator);
    // The destroy RPCs: look the handle up as `kind`, destroy it, hand back released regions.
    StatusOr<Released> destroyByHandle(Session &s, uint64_t handle, ObjectKind kind);
    void eraseLocked(Session &s, Object *obj);
    Status sendRegions(Session &s);
    StatusOr<QueueResult> translate(Session &s, const queue_info &qi);
    static TenantKey tenantOf(const PeerIdentity &peer);
    // Quota reservations; a refusal is reported to events_ (session 0: the session itself).
    StatusOr<QuotaCharge> reserve(const PeerIdentity &peer, uint64_t session,
                                  std::initializer_list<std::pair<Quota, uint64_t>> amounts);
    StatusOr<QuotaCharge> charge(const Session &s, std::initializer_list<std::pair<Quota, uint64_t>> amounts);
    Status chargeQueueBytes(const Session &s, Object &obj, uint64_t bytes);

    const Options options_;
    DeviceRegistry *devices_;
    RegionSender sender_;
    CommitSink commit_;
    std::function<void(Session &)> end_sink_;
    BrokerEvents *events_ = nullptr;
    QuotaManager quotas_;
    mutable std::mutex policy_mu_;
    std::shared_ptr<const Policy> policy_ = std::make_shared<const Policy>();

    std::mutex sessions_mu_;
    std::unordered_map<std::string, std::shared_ptr<Session>> by_token_;
    // Ended sessions whose XRC target another session still holds: their target, its context and
    // their memory stay until finishTargets() ends them. Guarded by sessions_mu_.
    std::unordered_map<uint64_t, std::shared_ptr<Session>> parked_;
    // Targets whose last handle went, for finishTargets(). Guarded by targets_mu_ (a leaf).
    std::mutex targets_mu_;
    std::vector<TargetOwner> finished_targets_;
    uint64_t next_session_id_ = 1;
};

// 8 random bytes of the kernel's (getrandom(), fetched in batches); never 0.
uint64_t randomHandle();

}  // namespace ibvx::daemon
