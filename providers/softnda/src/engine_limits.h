// The sizes of the engine's own copies of what tenants write. Private to softnda's sources.
#pragma once

#include <cstdint>

#include "providers/softnda/include/softnda_device.h"

namespace softnda {

// What the engine's copies of a WQE hold (engine_thread.h: WqeCopy, RecvCopy, Segment): a 512 B
// WQE's SGEs, (512 - 48) / 16, and its inline bytes, 512 - 48. Every count and length read from
// queue memory a tenant writes is bounded by these before it is copied, whatever the WQE's
// stride; a device never reports more (config.cc's ranges, recvSgeCap).
inline constexpr uint32_t kEngineMaxSge = SOFTNDA_MAX_SGE;
inline constexpr uint32_t kEngineMaxInline = SOFTNDA_MAX_INLINE;
static_assert(SOFTNDA_WQE_HEADER_SIZE + kEngineMaxSge * SOFTNDA_SGE_SIZE <= 512 &&
              SOFTNDA_WQE_HEADER_SIZE + kEngineMaxInline == 512);

}  // namespace softnda
