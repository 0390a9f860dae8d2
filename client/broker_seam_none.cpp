// "No broker": this build of libibv_extend runs direct mode only. Nothing is ever broker-owned,
// so none of the forwarding functions can be reached; they fail cleanly if they are.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "client/broker_seam.h"
#include "providers/loader/loader.h"

namespace ibvx::client {
namespace {

template <typename T>
T *unavailable() {
    errno = EOPNOTSUPP;
    return nullptr;
}

}  // namespace

bool brokerModeActive() {
    static std::once_flag once;
    std::call_once(once, [] {
        const char *mode = getenv("IBV_EXTEND_MODE");
        if (mode != nullptr && strcmp(mode, "broker") == 0) {
            loader::warn(
                "IBV_EXTEND_MODE=broker but this libibv_extend has no broker support; using direct mode");
        }
    });
    return false;
}

bool brokerOwns(const ibv_context *) {
    return false;
}

ibv_context_extend *brokerOpen(ibv_context *) {
    return unavailable<ibv_context_extend>();
}
int brokerClose(ibv_context_extend *) {
    return -EOPNOTSUPP;
}
int brokerListDevices(ibvx_device_info *, int) {
    return -EOPNOTSUPP;
}
ibv_context_extend *brokerOpenByName(const char *) {
    return unavailable<ibv_context_extend>();
}
int brokerCloseDevice(ibv_context_extend *) {
    return -EOPNOTSUPP;
}
ibv_pd *brokerAllocPd(ibv_context_extend *) {
    return unavailable<ibv_pd>();
}
int brokerDeallocPd(ibv_pd *) {
    return -EOPNOTSUPP;
}
ibv_mr *brokerRegMr(ibv_pd *, void *, size_t, int) {
    return unavailable<ibv_mr>();
}
ibv_mr *brokerRegMrIova(ibv_pd *, void *, size_t, uint64_t, int) {
    return unavailable<ibv_mr>();
}
ibv_mr *brokerRegMrFd(ibv_pd *, int, uint64_t, size_t, int) {
    return unavailable<ibv_mr>();
}
int brokerDeregMr(ibv_mr *) {
    return -EOPNOTSUPP;
}
int brokerModifyQp(ibv_qp *, ibv_qp_attr *, int) {
    return -EOPNOTSUPP;
}
int brokerQueryQp(ibv_qp *, ibv_qp_attr *, int, ibv_qp_init_attr *) {
    return -EOPNOTSUPP;
}

}  // namespace ibvx::client
