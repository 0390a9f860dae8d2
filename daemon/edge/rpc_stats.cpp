#include "daemon/edge/rpc_stats.h"

#include <iterator>

namespace ibvx::daemon {
namespace {

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
    auto i = static_cast<size_t>(m);
    return i < std::size(kBrokerMethods) ? kBrokerMethods[i].name.data() : "?";  // literals: terminated
}

const char *methodName(AdminMethod m) {
    return nameIn(kAdminMethodNames, m);
}

}  // namespace ibvx::daemon
