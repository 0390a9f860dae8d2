// Opening an extension context on a device context: the driver's alloc_context, then the
// reference's acceptance rule (an ops table with a version in UNUSED < version <= MAX), a refused
// context going back through the driver's free_context. ibv_open_extend() (direct mode) and
// Broker::openContext() both open through here, so they accept the same drivers.
#pragma once

#include <ibv_extend.h>

namespace ibvx::loader {

enum class ExtendRefusal {
    kNone,          // accepted
    kNoDriver,      // no driver, or one without alloc_context
    kDriverFailed,  // alloc_context answered NULL
    kBadVersion,    // no ops table, or a version this library does not know (freed already)
};

struct ExtendOpen {
    ibv_context_extend *ext = nullptr;  // set when accepted
    ExtendRefusal refusal = ExtendRefusal::kNone;
    int err = 0;      // kDriverFailed: the errno alloc_context left (0 when it said nothing)
    int version = 0;  // kBadVersion: what the driver announced (0 without an ops table)
};

// True for an ops table this library can use.
bool supportedOpsVersion(const ibv_context_extend_ops *ops);

ExtendOpen openExtendContext(const verbs_device_extend_ops *driver, ibv_context *context);

}  // namespace ibvx::loader
