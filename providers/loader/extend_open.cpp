#include "providers/loader/extend_open.h"

#include <cerrno>

namespace ibvx::loader {

bool supportedOpsVersion(const ibv_context_extend_ops *ops) {
    return ops != nullptr && ops->version > IBV_EXTEND_DRIVER_VERSION_UNUSED &&
           ops->version <= IBV_EXTEND_DRIVER_VERSION_MAX;
}

ExtendOpen openExtendContext(const verbs_device_extend_ops *driver, ibv_context *context) {
    ExtendOpen r;
    if (driver == nullptr || driver->alloc_context == nullptr) {
        r.refusal = ExtendRefusal::kNoDriver;
        return r;
    }
    errno = 0;
    ibv_context_extend *ext = driver->alloc_context(context);
    if (ext == nullptr) {
        r.refusal = ExtendRefusal::kDriverFailed;
        r.err = errno;
        return r;
    }
    // A context without ops could never do anything; refuse it with the versions we do not know.
    if (!supportedOpsVersion(ext->ops)) {
        r.refusal = ExtendRefusal::kBadVersion;
        r.version = ext->ops == nullptr ? 0 : ext->ops->version;
        if (driver->free_context != nullptr) {
            driver->free_context(ext);
        }
        return r;
    }
    r.ext = ext;
    return r;
}

}  // namespace ibvx::loader
