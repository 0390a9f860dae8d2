/*
 * softnda.h - the few C functions libsoftnda.so exports besides its driver registration, for
 * the process that loaded it (the broker, ibv-extend-perf, tests).
 *
 * Everything else (devices, queues, PD/MR, QP state, configuration) goes through the reference
 * driver ops and struct ibv_extend_vdev_ops. Thread-safe: any function, any thread.
 * Plain C; compiles on its own in C and C++.
 */
#ifndef SOFTNDA_H
#define SOFTNDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SOFTNDA_PROVIDER_NAME "softnda"
#define SOFTNDA_UB_RESOURCE_DOORBELL 1u

/* Engine counters of one device since it was created (monotonic; sums over engine threads). */
struct softnda_counters {
    uint64_t wqes_executed; /* send WQEs finished (success or error, not flushes) */
    uint64_t bytes;         /* payload bytes moved (SEND/WRITE/READ/atomic) */
    uint64_t doorbells;     /* new register values the engine took (by summary or sweep) */
    uint64_t cqes;          /* CQEs written */
    uint64_t errors;        /* error completions other than flushes */
    uint64_t flushed;       /* WR_FLUSH_ERR completions */
    uint64_t rnr_naks;      /* sends that found no receive posted */
    uint64_t cq_overflows;  /* CQs that entered the error state */
    uint64_t dropped_cqes;  /* completions dropped because their CQ was in error */
    uint64_t srq_limit_events;
    uint64_t passes;          /* engine scan passes */
    uint64_t sleeps;          /* times an engine thread went to sleep */
    uint64_t wakeups_by_hint; /* sleeps ended by a doorbell's futex wake */
    uint64_t sweeps;          /* full register sweeps (after a sleep timeout) */
    /* RoCEv2 to other hosts (an Ethernet device, SPEC.md §18) */
    uint64_t wire_tx_packets;  /* packets the device's UDP socket sent (repeats and duplicates too) */
    uint64_t wire_rx_packets;  /* packets it received */
    uint64_t wire_retransmits; /* times a requester went back and sent again (NAK, gap, timeout, RNR) */
    uint64_t wire_seq_naks;    /* sequence NAKs the responder sent (a gap: loss or reordering) */
    uint64_t wire_bad_icrc;    /* packets dropped for an ICRC that did not match */
    uint64_t wire_malformed;   /* packets that were not RoCEv2 of RC, UC or UD (dropped) */
    uint64_t wire_fault_drops; /* packets the wire_faults hook dropped (tests) */
    /* The errno the device's RoCEv2 socket could not be opened or bound with (EADDRINUSE: another
     * RoCEv2 stack has the port; EAFNOSUPPORT: a sandbox forbids AF_INET), 0 when it is open. The
     * socket is opened with the device's first context, so 0 too while none is open. */
    uint64_t wire_socket_errno;
    /* UDP source ports the device's packets leave from with a socket of their own (RoCEv2's flow
     * entropy, one per flow; SPEC.md §18): at most 256, after which flows share the wire port. */
    uint64_t wire_source_ports;
    uint64_t resv[9];
};

/* Fills *out for device dev_name ("softnda0"). 0, or -EINVAL (NULL argument) / -ENODEV. */
int softnda_query_counters(const char *dev_name, struct softnda_counters *out);

/* Host address of byte `offset` of resource `resource_id` of the device whose GUID is
 * (guid_l, guid_h), as described in a DB_MAP_MODE_UB_RES doorbell_map_desc; NULL + errno
 * (ENODEV unknown GUID or resource, ERANGE offset not mapped). A UB-mode db_mmap uses this to
 * find the register page, then export_mmio to share it. */
void *softnda_ub_resolve(uint64_t guid_l, uint64_t guid_h, uint32_t resource_id, uint64_t offset);

#ifdef __cplusplus
}
#endif

#endif /* SOFTNDA_H */
