// The seam between the public functions and broker mode.
//
// Broker mode plugs in as a forwarding pseudo-driver: the ibv_context_extend it returns carries
// an ops table whose entries forward to the broker, so every ibv_extend.h call after open (create,
// destroy, query, modify, hyroce) dispatches through context->ops exactly as in direct mode and
// needs nothing here. What cannot go through an ops table is listed below: choosing the mode,
// opening and closing contexts, listing devices, and the ibv_extend_broker.h objects (PD, MR, QP
// state) that libibverbs would otherwise handle.
//
// broker_seam_none.cpp implements "no broker" (direct mode only). A real implementation replaces
// that one file in client/CMakeLists.txt (IBVX_CLIENT_SEAM_SOURCES). Contract for any
// implementation:
//  - brokerModeActive() resolves IBV_EXTEND_MODE (direct | broker | auto, default auto) once and
//    is cheap afterwards; with IBV_EXTEND_MODE=direct it must not touch the socket.
//  - brokerOwns(ctx) is true exactly for contexts the broker implementation handed out (and
//    whose PDs, MRs and QPs carry them in their ->context); it must be cheap and false for any
//    pointer it did not create.
//  - All functions follow ibv_extend.h conventions: int -> 0 / negative errno; pointer -> NULL
//    with errno set. Arguments were already checked for NULL by the caller.
// Thread-safety: every function may be called concurrently from any thread.
#pragma once

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

namespace ibvx::client {

// True when this process talks to a broker (decided on the first call).
bool brokerModeActive();

// A context (or any object's ->context) that belongs to the broker implementation.
bool brokerOwns(const ibv_context *context);

// ibv_open_extend() in broker mode: the broker-side extension context for the device behind
// an ibv_context the application opened (or a broker shadow context).
ibv_context_extend *brokerOpen(ibv_context *context);
// ibv_close_extend() of a context for which brokerOwns(context->context).
int brokerClose(ibv_context_extend *context);

// ibvx_list_devices / ibvx_open_device / ibvx_close_device in broker mode.
int brokerListDevices(ibvx_device_info *devices, int max);
ibv_context_extend *brokerOpenByName(const char *name);
int brokerCloseDevice(ibv_context_extend *context);

// The ibv_extend_broker.h objects on broker-owned contexts.
ibv_pd *brokerAllocPd(ibv_context_extend *context);
int brokerDeallocPd(ibv_pd *pd);
// Any memory of the process: inside an ibvx_alloc_buf() buffer, or ordinary memory moved onto
// shared pages (client/broker/shared_pages.h). Work requests address it as [iova, iova + length).
ibv_mr *brokerRegMr(ibv_pd *pd, void *addr, size_t length, int access);
ibv_mr *brokerRegMrIova(ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access);
ibv_mr *brokerRegMrFd(ibv_pd *pd, int fd, uint64_t offset, size_t length, int access);
// ibv_rereg_mr (softnda SPEC.md §13) through the broker's ReregMr: flags say what changes (the PD,
// the access, the memory [addr, addr + length), moved onto shared pages as at registration and
// the old range's given back). On success mr has the keys the driver gives (softnda keeps them), its new PD
// and range. 0 or a negative errno; the MR is then unchanged.
int brokerReregMr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, int access);
int brokerDeregMr(ibv_mr *mr);
// An address handle the broker keeps (CreateAh): the returned ibv_ah is the first member of an
// ibv_extend_datapath_ah holding attr, which the data path reads without a call.
ibv_ah *brokerCreateAh(ibv_pd *pd, const ibv_ah_attr *attr);
int brokerDestroyAh(ibv_ah *ah);
int brokerModifyQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
int brokerQueryQp(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr);

}  // namespace ibvx::client
