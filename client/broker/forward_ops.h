// The ops table of broker contexts (see forward_ops.cpp).
#pragma once

#include <cstdint>

#include <ibv_extend.h>

namespace ibvx::client::broker {

// Fills ops for a broker context whose driver implements `driver_version` and the ops whose bits
// are set in `present` (OpenContextResponse.driver_ops_present).
void fillForwardOps(int driver_version, uint32_t present, ibv_context_extend_ops *ops);

}  // namespace ibvx::client::broker
