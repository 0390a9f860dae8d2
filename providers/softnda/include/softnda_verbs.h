/*
 * softnda_verbs.h - what libsoftnda-verbs.so exports besides its ibv_extend_datapath table
 * (include/ibv_extend_datapath.h): the SRQ limit, which the contract has no entry for yet and
 * which software sets by a store to the SRQ's doorbell record (SPEC.md §5.3), so that
 * ibv_modify_srq(IBV_SRQ_LIMIT) and ibv_query_srq need no broker call either.
 * Plain C; compiles on its own in C and C++.
 */
#ifndef SOFTNDA_VERBS_H
#define SOFTNDA_VERBS_H

#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ibv_modify_srq on a state from ibv_extend_datapath.srq_open: attr_mask may hold IBV_SRQ_LIMIT
 * only (softnda does not resize SRQs); a limit above the SRQ's max_wr is EINVAL. 0 or an errno. */
__attribute__((visibility("default"))) int softnda_verbs_modify_srq(void *srq,
                                                                    const struct ibv_srq_attr *attr,
                                                                    int attr_mask);

/* ibv_query_srq: max_wr and max_sge the data path enforces, srq_limit as the device holds it now
 * (0 once a limit event fired). 0 or an errno. */
__attribute__((visibility("default"))) int softnda_verbs_query_srq(void *srq, struct ibv_srq_attr *attr);

#ifdef __cplusplus
}
#endif

#endif /* SOFTNDA_VERBS_H */
