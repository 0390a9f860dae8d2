/*
 * ibv_extend_datapath.h - a driver's standard-verbs data path, run in the tenant's process.
 *
 * In broker mode the queues live in shared memory the broker maps into the tenant; the libibverbs
 * face hands out ibv_qp/ibv_cq/ibv_srq for them. ibv_post_send, ibv_post_recv, ibv_post_srq_recv,
 * ibv_poll_cq and ibv_req_notify_cq are inline in <infiniband/verbs.h> and call the context's ops;
 * the face points those at the data path of the driver that made the queues, as rdma-core lets
 * each provider carry its own. The data path works from the queue_info the broker returned
 * (ibv_extend.h): no broker call and no system call per work request.
 *
 * A driver ships its data path as a shared object named lib<provider>-verbs.so in the provider
 * directory (IBV_EXTEND_PROVIDER_DIR, else the installed one) that exports
 *     const struct ibv_extend_datapath_ops ibv_extend_datapath;
 * with .provider equal to the driver's name. The face loads it the first time a context of a
 * device of that driver is opened; a driver without one gets EOPNOTSUPP from the data verbs.
 *
 * Conventions: each entry follows the libibverbs verb it implements (post_*: 0 or an errno with
 * *bad_wr set to the first work request not posted, ENOMEM for a full queue, EINVAL for a bad
 * one; poll_cq: the number of completions or a negative errno). The *_open entries return a
 * driver-private state (NULL + errno when the queues are not this driver's). Thread-safety: each
 * entry may be called concurrently from any thread; calls on one object are serialised by the
 * data path itself, as providers do. Plain C; compiles on its own in C and C++.
 */
#ifndef IBV_EXTEND_DATAPATH_H
#define IBV_EXTEND_DATAPATH_H

#include <infiniband/verbs.h>
#include <stdint.h>

#include <ibv_extend.h>

#ifdef __cplusplus
extern "C" {
#endif

#define IBV_EXTEND_DATAPATH_ABI_V1 1
#define IBV_EXTEND_DATAPATH_SYMBOL "ibv_extend_datapath"
/* Entries are appended to the table within ABI V1 (the fatal entries, after query_srq), as
 * verbs_context grows by its sz: a library that has them also exports
 *     const uint32_t ibv_extend_datapath_size = sizeof(struct ibv_extend_datapath_ops);
 * from the same object, and an entry exists only when it lies wholly below that size. A library
 * without the symbol has the table up to query_srq, and the face reads nothing beyond it. */
#define IBV_EXTEND_DATAPATH_SIZE_SYMBOL "ibv_extend_datapath_size"

/* An address handle as the face hands it out (ibv_create_ah): the ibv_ah a UD work request
 * names (wr.ud.ah) is the first member, followed by the attributes it was created with, so a data
 * path reads the destination without a call, as rdma-core providers embed ibv_ah in their own. */
struct ibv_extend_datapath_ah {
    struct ibv_ah ah;
    struct ibv_ah_attr attr;
};

/* What a QP's data path is told when it is opened. */
struct ibv_extend_datapath_qp_attr {
    const struct ibv_qp_extend *qp; /* sq_info, rq_info (rq_info empty with an SRQ) */
    enum ibv_qp_type qp_type;
    struct ibv_qp_cap cap; /* what the broker granted */
    int sq_sig_all;
    int has_srq;
    uint64_t resv[4];
};

/* A completion's times (poll_cq_times): the device clock's value when the device wrote the
 * completion, in its ticks (clock_info's frequency), and the wall-clock time of that instant in
 * nanoseconds since the Epoch. */
struct ibv_extend_datapath_wc_times {
    uint64_t completion;
    uint64_t wallclock_ns;
};

struct ibv_extend_datapath_ops {
    uint32_t abi; /* IBV_EXTEND_DATAPATH_ABI_V1 */
    const char *provider;

    void *(*cq_open)(const struct ibv_cq_extend *cq, int cqe);
    void (*cq_close)(void *cq);
    void *(*qp_open)(const struct ibv_extend_datapath_qp_attr *attr);
    void (*qp_close)(void *qp);
    void *(*srq_open)(const struct ibv_srq_extend *srq, const struct ibv_srq_attr *attr);
    void (*srq_close)(void *srq);

    int (*post_send)(void *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
    int (*post_recv)(void *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
    int (*post_srq_recv)(void *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
    int (*poll_cq)(void *cq, int num_entries, struct ibv_wc *wc);
    /* Arms the CQ for one completion event (solicited_only: the next solicited or error
     * completion only): 0 or an errno. May be NULL: events are then not supported. */
    int (*req_notify_cq)(void *cq, int solicited_only);

    /* Event counters the device raises (a driver's spec says where they live): the face compares
     * them with what it last delivered to tell which object an event fd wake-up is for. May be
     * NULL: that kind of event is not raised. */
    uint32_t (*cq_events)(void *cq);
    uint32_t (*qp_fatal_events)(void *qp);
    uint32_t (*srq_limit_events)(void *srq);

    /* ibv_modify_srq / ibv_query_srq where the driver can answer in the tenant (an SRQ limit is a
     * store to the queue's memory on softnda): 0 or an errno (EINVAL for what the driver cannot
     * change, e.g. max_wr). May be NULL: the verbs then answer EOPNOTSUPP. */
    int (*modify_srq)(void *srq, const struct ibv_srq_attr *attr, int attr_mask);
    int (*query_srq)(void *srq, struct ibv_srq_attr *attr);

    /* ---- Appended (see IBV_EXTEND_DATAPATH_SIZE_SYMBOL): the device is gone for good ----
     * In broker mode the queues' device is the broker's: when the broker ends the session
     * (eviction, a restart that cannot restore it, the broker stopping), it has destroyed every
     * queue of the session first and touches their memory no more, but the memory stays mapped
     * in the tenant. The face then calls these so that the tenant sees what a NIC's fatal error
     * shows (docs/verbs.md, "When the session ends"). The caller guarantees that the device no
     * longer reads or writes the queues; each entry takes the data path's own locks, so it may
     * run while other threads post and poll. `err` is the errno every later call answers.
     * Each may be NULL: that object then just stops completing. */

    /* Completes every work request posted and not finished, send and receive, with
     * IBV_WC_WR_FLUSH_ERR into the data path states of the QP's CQs (send_cq, recv_cq; either
     * may be NULL: those requests are dropped without a completion), in posting order with
     * their wr_id, as the device flushes a QP in ERR (unsignaled sends included); the receives
     * of an SRQ are not the QP's and are not flushed. Every later post_send and post_recv on
     * the QP answers err with *bad_wr = the first work request. Returns the number of
     * completions written; a CQ that overflows takes its error state, as on the device. */
    int (*qp_fatal)(void *qp, void *send_cq, void *recv_cq, int err);
    /* Raises the CQ's completion event once if it is armed (req_notify_cq) and disarms it;
     * every later req_notify_cq answers err (so a program never waits for an event that cannot
     * come). poll_cq keeps returning what the CQ holds. Returns 1 when an event was raised
     * (its counter, cq_events, moved), else 0. Call it after qp_fatal of the CQ's QPs. */
    int (*cq_fatal)(void *cq, int err);
    /* Every later post_srq_recv answers err. The receives the SRQ holds are not completed. */
    void (*srq_fatal)(void *srq, int err);

    /* ---- Appended: the CQ's error state ----
     * Non-zero once the device put the CQ in its error state (an overflow): the face then raises
     * IBV_EVENT_CQ_ERR for it once, on the context's async events. May be NULL: never raised. */
    uint32_t (*cq_error)(void *cq);

    /* ---- Appended: resizing a CQ ----
     * ibv_resize_cq: with the CQ's lock held (no poll runs meanwhile), calls resize(arg), which
     * has the device move the CQ and, on success, updates ext's cq_info (ext is the
     * ibv_cq_extend cq_open was given); the state then polls the CQ's new memory, from the
     * consumer index the device kept. Returns resize's result (0 or an errno); on failure the
     * state is unchanged. May be NULL: resizing answers EOPNOTSUPP. */
    int (*cq_resize)(void *cq, const struct ibv_cq_extend *ext, int (*resize)(void *arg), void *arg);

    /* ---- Appended: completion timestamps ----
     * The device clock, which a driver's spec defines: its frequency in kHz
     * (ibv_device_attr_ex.hca_core_clock) and the mask of its valid bits
     * (completion_timestamp_mask), and its value now (ibv_query_rt_values_ex's raw clock). 0 or
     * an errno. poll_cq_times is poll_cq with times[i] filled for wc[i]; on a CQ the driver made
     * without timestamps (it was not asked for them at creation) the times are 0. All three or
     * none; NULL: timestamps are not served (ibv_create_cq_ex with them answers EOPNOTSUPP). */
    int (*clock_info)(uint64_t *khz, uint64_t *mask);
    int (*read_clock)(uint64_t *ticks);
    int (*poll_cq_times)(void *cq, int num_entries, struct ibv_wc *wc,
                         struct ibv_extend_datapath_wc_times *times);

    /* ---- Appended: a QP back in RESET ----
     * After the device moved the QP to RESET (the modify succeeded, so it completes nothing more
     * of what was posted before): removes the QP's completions not yet polled from its CQs
     * (send_cq, recv_cq: either may be NULL, or both the same CQ), as rdma-core's mlx4 and mlx5
     * clean a CQ at RESET, so that a QP brought up again does not meet the flushes of its last
     * connection. With an SRQ, receive completions stay (their receives were the SRQ's and are
     * consumed). Takes the CQs' locks. May be NULL: the completions stay. */
    void (*qp_reset)(void *qp, void *send_cq, void *recv_cq);
};

#ifdef __cplusplus
}
#endif

#endif /* IBV_EXTEND_DATAPATH_H */
