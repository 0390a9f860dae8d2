// Bring-up without a round trip for RESET -> INIT (docs/verbs.md, "Bring-up"): on a device whose
// driver guarantees a plain INIT (IBV_EXTEND_GUARANTEE_PLAIN_INIT, ibv_extend_vdev.h; the
// broker's DeviceInfo.plain_init), the face answers a QP's RESET -> INIT itself, with the error
// the driver would give, and holds it back: the QP's next ModifyQp carries it, and a query, or
// an extension modify or query, sends it first. Nothing a peer or the engine sees differs
// between RESET and INIT on such a device, so only the call count changes.
#pragma once

#include "common/plain_init.h"

namespace ibvx::client::broker {

struct ShadowQp;
using ibvx::plainInitRefusal;

// Sends the QP's held-back INIT, if any, on its own (0, or the broker's negative errno; the
// INIT stays held then). The caller must not hold s->modify_mu.
int flushHeldInit(ShadowQp *s);

}  // namespace ibvx::client::broker
