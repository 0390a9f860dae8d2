// The libibverbs face's logic: the verbs of verbs_private.h, served inside libibv_extend.so on
// broker mode's session and shadow objects (client/broker). A face context IS a broker shadow
// context (a complete verbs_context); its PDs, MRs and queues are the same shadows ibv_extend.h and
// ibvx_* hand out, so the two APIs mix freely in one process and share one session. The face uses
// broker mode; broker mode knows nothing of the face (it calls back only through the session-end
// handler of client/broker/session.h).
//
// The files, by concern:
//   devices.cpp   the device list, and the contexts ibv_open_device() opens and closes
//   queries.cpp   device, port, GID and P_Key queries
//   objects.cpp   PDs, MRs, AHs, fork status
//   queues.cpp    CQs, QPs and SRQs of the standard verbs
//   extended.cpp  ibv_cq_ex (create, poll API) and ibv_qp_ex (create, the ibv_wr_* post API)
//   mw.cpp        memory windows (alloc, dealloc, ibv_bind_mw over the data path)
//   dm.cpp        device memory (ibv_alloc_dm, ibv_reg_dm_mr)
//   xrc.cpp       XRC domains, XRC SRQs (ibv_create_srq_ex, ibv_get_srq_num), XRC QPs' attributes
//   datapath.cpp  a queue's attachment to its driver's data path, and the data verbs behind it
//   events.cpp    completion channels, async events, and the end of a session
//
// Return conventions are libibverbs' per verb (positive errno, -1 + errno, or NULL + errno); the
// broker seam answers negative errnos, flipped here. Every pointer a program hands in is checked
// against the registries before it is dereferenced (EINVAL otherwise). What is served and what is
// not, and why: docs/verbs.md.
//
// Threading. Each file's registries have their own mutex (said where they are defined); a
// context's mu guards its data path sets and its end state (client/broker/shadow.h). Lock order:
// the registry of face contexts (events.cpp), then a context's mu, then the channel registry,
// then a channel's own mutex; the data path's locks are innermost. None is held across a broker
// call.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>

#include "client/broker/shadow.h"
#include "common/c_abi.h"
#include "providers/loader/loader.h"

namespace ibvx::client::verbs {

namespace pb = broker::pb;
using broker::liveCq;
using broker::livePd;
using broker::liveQp;
using broker::liveSrq;
using broker::ShadowAh;
using broker::ShadowContext;
using broker::ShadowCq;
using broker::ShadowMr;
using broker::shadowOf;
using broker::ShadowPd;
using broker::ShadowQp;
using broker::ShadowSrq;
using broker::ShadowXrcd;
using ibvx::failNull;
using loader::warn;  // the one the library prints every warning with

// ---- devices and contexts (devices.cpp) --------------------------------------------------------

// The broker context behind an ibv_context a program handed in, nullptr for any other pointer.
inline ShadowContext *faceContext(const ibv_context *ctx) {
    return ctx != nullptr ? broker::contextOf(ctx) : nullptr;
}

// ---- queries (queries.cpp) -----------------------------------------------------------------------

// The device's attributes (QueryDeviceAttr). 0 or a negative errno.
int queryDeviceAttr(ShadowContext *c, ibv_device_attr *attr, uint64_t *max_dm_size = nullptr);
// The verbs_context entries the inline ibv_query_port() and ibv_query_device_ex() reach.
int faceQueryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr, size_t attr_len);
int faceQueryDeviceEx(ibv_context *context, const ibv_query_device_ex_input *input, ibv_device_attr_ex *attr,
                      size_t attr_size);
// ibv_query_rt_values_ex(): the device clock, read by the driver's data path (read_clock).
int faceQueryRtValues(ibv_context *context, ibv_values_ex *values);

// ---- the extended verbs (extended.cpp) -----------------------------------------------------------

// The verbs_context entries ibv_create_cq_ex() and ibv_create_qp_ex() reach.
ibv_cq_ex *faceCreateCqEx(ibv_context *context, ibv_cq_init_attr_ex *attr);
ibv_qp *faceCreateQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr);

// ---- queues (queues.cpp) --------------------------------------------------------------------------

// A CQ of the context attached to the data path, asking the driver for the wc_flags of
// ibv_create_cq_ex (0: the standard completion). NULL + errno.
ibv_cq *createCq(ibv_context *context, int cqe, void *cq_context, ibv_comp_channel *channel, int comp_vector,
                 uint64_t wc_flags);

// A QP of the context (pd: NULL for an XRC target, which has xrcd instead) and an SRQ of p (an XRC
// SRQ with xrcd and cq), attached to the data path; attr gets what was granted. NULL + errno.
ibv_qp *createQp(ShadowContext *c, ibv_pd *pd, ibv_qp_init_attr *attr, ShadowXrcd *xrcd);
ibv_srq *createSrq(ShadowPd *p, ibv_srq_init_attr *attr, ShadowXrcd *xrcd, ShadowCq *cq);

// ---- XRC (xrc.cpp) --------------------------------------------------------------------------------

// The verbs_context entries ibv_open_xrcd(), ibv_close_xrcd(), ibv_create_srq_ex() and
// ibv_get_srq_num() reach.
ibv_xrcd *faceOpenXrcd(ibv_context *context, ibv_xrcd_init_attr *attr);
int faceCloseXrcd(ibv_xrcd *xrcd);
ibv_srq *faceCreateSrqEx(ibv_context *context, ibv_srq_init_attr_ex *attr);
int faceGetSrqNum(ibv_srq *srq, uint32_t *srq_num);
// ibv_create_qp_ex() of an XRC QP (attr->qp_type IBV_QPT_XRC_SEND or IBV_QPT_XRC_RECV).
ibv_qp *createXrcQpEx(ibv_context *context, ibv_qp_init_attr_ex *attr);
// The verbs_context entry ibv_open_qp() reaches: a handle on an XRC target any process made in a
// domain this context has open (the broker's OpenQp).
ibv_qp *faceOpenQp(ibv_context *context, ibv_qp_open_attr *attr);

// ---- memory windows (mw.cpp) ----------------------------------------------------------------------

// The context ops ibv_alloc_mw(), ibv_dealloc_mw() and ibv_bind_mw() reach (inline in
// <infiniband/verbs.h>), set on a face context.
void serveMemoryWindows(ShadowContext *c);
// ---- device memory (dm.cpp) ------------------------------------------------------------------------

// The verbs_context entries ibv_alloc_dm(), ibv_free_dm() and ibv_reg_dm_mr() reach.
ibv_dm *faceAllocDm(ibv_context *context, ibv_alloc_dm_attr *attr);
int faceFreeDm(ibv_dm *dm);
ibv_mr *faceRegDmMr(ibv_pd *pd, ibv_dm *dm, uint64_t offset, size_t length, unsigned int access);

// ---- thread and parent domains (domains.cpp) ------------------------------------------------------

// The verbs_context entries ibv_alloc_td(), ibv_dealloc_td() and ibv_alloc_parent_domain() reach.
ibv_td *faceAllocTd(ibv_context *context, ibv_td_init_attr *init_attr);
int faceDeallocTd(ibv_td *td);
ibv_pd *faceAllocParentDomain(ibv_context *context, ibv_parent_domain_init_attr *attr);
// The PD a parent domain stands for; any other pointer as it is. Every verb taking a PD asks.
ibv_pd *underlyingPd(ibv_pd *pd);
// What ibv_dealloc_pd does first: frees pd when it is a parent domain (*was_parent), or answers
// EBUSY for a PD a parent domain still names; 0 otherwise.
int releaseParentDomain(ibv_pd *pd, bool *was_parent);
// Whether pd is a parent domain of the face.
bool isParentDomain(const ibv_pd *pd);
// Forgets the context's parent and thread domains (ibv_close_device).
void dropDomains(const ShadowContext *c);
// An object made under a parent domain keeps it as its pd, as rdma-core's providers answer.
template <typename T>
T *keepPd(T *obj, ibv_pd *given) {
    if (obj != nullptr) {
        obj->pd = given;
    }
    return obj;
}

// ---- the data path (datapath.cpp) ----------------------------------------------------------------

// The data path's entry `member` of context c's driver, or nullptr: entries are appended to the
// table, and one exists only where the library's table reaches it (include/ibv_extend_datapath.h).
#define IBVX_DATAPATH_ENTRY(c, member)                                                        \
    ((c)->datapath != nullptr &&                                                              \
             (c)->datapath_size >= offsetof(ibv_extend_datapath_ops, member) + sizeof(void *) \
         ? (c)->datapath->member                                                              \
         : nullptr)

// Loads the context's driver data path (include/ibv_extend_datapath.h; none when the driver ships
// none) and points the context's ops, which the inline data verbs call, at it.
void serveDatapath(ShadowContext *c);

// ---- importing a context and its objects (imports.cpp) -------------------------------------------

// Gives a face context its cmd_fd (a memfd of its own), by which a dup of it imports the context.
void giveCmdFd(ShadowContext *c);
// ibv_close_device() of an imported reference: closes one import's fd and answers true while
// imports are left; false when the context itself is to close.
bool releaseImport(ShadowContext *c);
// The context closes: its cmd_fd no longer imports it (the caller closes the fd); and the close
// was refused: it does again.
void forgetCmdFd(ShadowContext *c);
void giveBackCmdFd(ShadowContext *c);

// ---- what is not served (refused_ops.cpp) ---------------------------------------------------------

// Sets every verbs_context entry and context op still NULL to an answer that refuses (EOPNOTSUPP),
// so no slot a consumer calls through is NULL. Called last, after every serve*().
void refuseUnserved(ShadowContext *c);

// The data verbs as ctx.ops has them. The shadow is found from the public struct with no registry
// lookup: these are the fast path, and only our context's ops lead here.
int postSend(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr);
int pollCq(ibv_cq *cq, int n, ibv_wc *wc);

// Gives a queue just made through the standard verbs its state in the driver's data path, when
// the driver has one for that kind of queue, and flushes it at once when the session has already
// ended. 0, or the errno to fail the create with (the data path refused; the caller destroys the
// queue).
int attachDatapath(ShadowCq *s);
int attachDatapath(ShadowQp *s, const ibv_qp_init_attr &attr);
int attachDatapath(ShadowSrq *s, ibv_srq_attr *attr);

// ibv_resize_cq through the driver's data path (its cq_resize around the broker's ResizeCq): 0 or
// an errno; EOPNOTSUPP when the data path cannot.
int resizeAttached(ShadowCq *s, uint32_t cqe);

// After the QP moved to RESET: its completions not yet polled leave its CQs (the data path's
// qp_reset; nothing where the driver has none), as a kernel provider cleans them.
void resetAttached(ShadowQp *s);

// Destroys a queue through the extend API while it is out of reach of a session's end (which must
// not flush a queue being freed); a queue the broker refused to destroy, and that lives on, is
// attached again. The extend API's answer (0 or a negative errno); *gone: the shadow is freed.
int destroyAttached(ShadowCq *s, bool *gone);
int destroyAttached(ShadowQp *s);
int destroyAttached(ShadowSrq *s);

// Flushes every attached queue of an ended context: outstanding work requests complete with
// IBV_WC_WR_FLUSH_ERR (QPs first, so an armed CQ's event comes after the flushed completions)
// and later posts are refused. The caller holds c->mu.
void flushAttachedLocked(ShadowContext *c);

// ---- completion channels, events, the end of a session (events.cpp) ----------------------------

// What the data path, the event reads and ibv_req_notify_cq answer once the session ended: the
// errno the kernel gives a program whose RDMA device was disassociated (control verbs keep the
// session's ECONNRESET).
inline constexpr int kEndedErrno = EIO;

inline bool endedLocked(const ShadowContext *c) {
    return c->end != ShadowContext::End::kLive;
}

// A context ibv_open_device() opened is followed until ibv_close_device() lets it go: when its
// session ends it moves to the state a NIC's fatal error leaves (docs/verbs.md, "When the session
// ends"), at once if the session has ended already.
void followSessionEnd(ShadowContext *c);
// Out of reach of a session end handled from now on (one being handled finishes first).
void unfollowSessionEnd(ShadowContext *c);

// A completion channel of the face (an eventfd the broker's device signals).
struct FaceChannel;
// The live channel behind a pointer a program handed in, nullptr for any other.
FaceChannel *faceChannel(ibv_comp_channel *ch);
int channelEventFd(const FaceChannel *f);
// A new CQ on the channel.
void channelAddCq(FaceChannel *f, ShadowCq *s);
// Before a CQ is destroyed: waits until the program acknowledged every event it was given (as
// libibverbs does), then takes the CQ off its channel (f may be nullptr: no channel).
void channelSetAsideCq(FaceChannel *f, ShadowCq *s);
// After: the channel lets the CQ go (gone), or takes it back (the broker refused the destroy).
void channelSettleCq(FaceChannel *f, ShadowCq *s, bool gone);

}  // namespace ibvx::client::verbs
