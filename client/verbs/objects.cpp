// The face's PDs and MRs (broker objects; an MR of ordinary memory moves its pages onto shared
// memory, client/broker/shared_pages.h), its address handles (kept in this process) and its
// fork status.
#include <cerrno>

#include "client/broker_seam.h"
#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

// Access flags libibverbs treats as hints (IBV_ACCESS_OPTIONAL_RANGE) are dropped, as a provider
// that lacks them does; relaxed ordering is the one softnda knows.
int mrAccess(unsigned int access) {
    unsigned int optional = access & IBV_ACCESS_OPTIONAL_RANGE;
    return static_cast<int>((access & ~optional) | (optional & IBV_ACCESS_RELAXED_ORDERING));
}

}  // namespace
}  // namespace ibvx::client::verbs

using namespace ibvx::client;         // NOLINT: the broker seam's functions
using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

extern "C" {

ibv_pd *ibvx_verbs_alloc_pd(ibv_context *context) {
    ShadowContext *c = faceContext(context);
    return c != nullptr ? brokerAllocPd(&c->ext) : failNull<ibv_pd>(EINVAL);
}

int ibvx_verbs_dealloc_pd(ibv_pd *pd) {
    bool parent = false;
    if (int rc = releaseParentDomain(pd, &parent); rc != 0 || parent) {
        return rc;
    }
    return livePd(pd) != nullptr ? -brokerDeallocPd(pd) : EINVAL;
}

ibv_mr *ibvx_verbs_reg_mr_iova2(ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
    ibv_pd *base = underlyingPd(pd);
    if (livePd(base) == nullptr) {
        return failNull<ibv_mr>(EINVAL);
    }
    return keepPd(brokerRegMrIova(base, addr, length, iova, mrAccess(access)), pd);
}

// rdma-core 44's ibv_rereg_mr, answer for answer: its own checks of the arguments answer
// IBV_REREG_MR_ERR_INPUT, the provider's (here the broker's) refusal IBV_REREG_MR_ERR_CMD, both
// with errno set. The fork-range steps cannot fail: registered memory needs no
// madvise(MADV_DONTFORK) here (ibvx_verbs_fork_init). On softnda a refused MR is unchanged and
// stays usable (SPEC.md §13), though rdma-core's documentation says not to use it.
int ibvx_verbs_rereg_mr(ibv_mr *mr, int flags, ibv_pd *pd, void *addr, size_t length, int access) {
    const bool translate = (flags & IBV_REREG_MR_CHANGE_TRANSLATION) != 0;
    if (broker::liveMr(mr) == nullptr || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) != 0 ||
        (translate && (addr == nullptr || length == 0)) || (!translate && (addr != nullptr || length != 0))) {
        errno = EINVAL;
        return IBV_REREG_MR_ERR_INPUT;
    }
    if (int rc = brokerReregMr(mr, flags, underlyingPd(pd), addr, length,
                               mrAccess(static_cast<unsigned int>(access)));
        rc != 0) {
        errno = -rc;
        return IBV_REREG_MR_ERR_CMD;
    }
    if ((flags & IBV_REREG_MR_CHANGE_PD) != 0) {
        mr->pd = pd;  // a parent domain stays what the MR names, as rdma-core's wrapper sets it
    }
    return 0;
}

int ibvx_verbs_dereg_mr(ibv_mr *mr) {
    return -brokerDeregMr(mr);  // EINVAL for a pointer the seam does not know
}

// An address handle is the broker's (it checks the attributes, charges the tenant's "ahs"
// quota and reclaims it with the session); this process keeps a copy of the attributes in the
// layout the data path reads a UD work request's destination from (ibv_extend_datapath_ah), so
// posting never calls the broker (docs/verbs.md).
ibv_ah *ibvx_verbs_create_ah(ibv_pd *pd, ibv_ah_attr *attr) {
    ibv_pd *base = underlyingPd(pd);
    return livePd(base) != nullptr ? keepPd(brokerCreateAh(base, attr), pd) : failNull<ibv_ah>(EINVAL);
}

int ibvx_verbs_destroy_ah(ibv_ah *ah) {
    return -brokerDestroyAh(ah);  // EINVAL for a pointer the seam does not know
}

// Registered memory needs no madvise(MADV_DONTFORK): a child gets private copies of shared pages
// (client/broker/shared_pages.h), as the kernel gives it of pinned pages when fork is "unneeded".
int ibvx_verbs_fork_init(void) {
    return 0;
}

ibv_fork_status ibvx_verbs_is_fork_initialized(void) {
    return IBV_FORK_UNNEEDED;
}

}  // extern "C"
