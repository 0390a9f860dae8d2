#include "daemon/edge/rpc_stats.h"

#include <iterator>

namespace ibvx::daemon {
namespace {

const char *const kMethodNames[] = {"Hello",
                                    "ListDevices",
                                    "OpenContext",
                                    "CloseContext",
                                    "QueryDevice",
                                    "AllocPd",
                                    "DeallocPd",
                                    "RegMr",
                                    "DeregMr",
                                    "CreateCq",
                                    "DestroyCq",
                                    "CreateQp",
                                    "DestroyQp",
                                    "CreateSrq",
                                    "DestroySrq",
                                    "ModifyQp",
                                    "QueryQp",
                                    "ModifyQpExtend",
                                    "QueryQpExtend",
                                    "QueryQpSupportedHyroceFeature",
                                    "NegoQpHyroceFeature",
                                    "QueryDeviceAttr",
                                    "QueryPort",
                                    "SetAsyncEventFd",
                                    "CreateAh",
                                    "DestroyAh",
                                    "ResizeCq",
                                    "OpenXrcd",
                                    "CloseXrcd",
                                    "ReregMr",
                                    "AttachMcast",
                                    "DetachMcast",
                                    "AllocMw",
                                    "DeallocMw",
                                    "AllocDm",
                                    "FreeDm",
                                    "RegDmMr",
                                    "OpenQp"};
static_assert(std::size(kMethodNames) == static_cast<size_t>(Method::kCount));

const char *const kAdminMethodNames[] = {"GetStats",    "GetStatus",    "ListDrivers",   "ListSessions",
                                         "ListObjects", "EvictSession", "ReloadDrivers", "Watch",
                                         "GetQuotas",   "SetQuota",     "Restart"};
static_assert(std::size(kAdminMethodNames) == static_cast<size_t>(AdminMethod::kCount));

template <typename M, size_t N>
const char *nameIn(const char *const (&names)[N], M m) {
    auto i = static_cast<size_t>(m);
    return i < N ? names[i] : "?";
}

}  // namespace

const char *methodName(Method m) {
    return nameIn(kMethodNames, m);
}

const char *methodName(AdminMethod m) {
    return nameIn(kAdminMethodNames, m);
}

}  // namespace ibvx::daemon
