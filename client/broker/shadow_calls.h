// The shadows' own broker calls: the destroy every shadowed object shares, and the context built
// from OpenContext's answer. Apart from shadow.h because they need the session's RPCs (gRPC):
// only the forwarding ops (forward_ops.cpp, seam.cpp) include this.
#pragma once

#include <cerrno>

#include "client/broker/session.h"
#include "client/broker/shadow.h"

namespace ibvx::client::broker {

// Destroys a broker object behind a shadow: claims the shadow first so a racing destroy of the
// same object cannot free it twice, and gives it back when the broker refuses.
template <typename Shadow, typename Req, typename Resp>
int destroyTracked(Shadow *s, const char *what,
                   grpc::Status (pb::Broker::Stub::*method)(grpc::ClientContext *, const Req &, Resp *),
                   void (Req::*set_handle)(uint64_t)) {
    ShadowContext *c = ownerOf(s);
    if (c == nullptr || !untrack(s)) {
        return -EINVAL;
    }
    Req req;
    (req.*set_handle)(s->handle);
    Resp resp;
    int rc = c->session->call(what, method, req, &resp);
    if (rc != 0 && !c->session->gone()) {
        track(s, c);
        return rc;
    }
    if constexpr (requires { resp.released_regions(); }) {
        if (rc == 0) {
            c->session->releaseRegions(resp.released_regions());
        }
    }
    delete s;
    return rc;
}

// Builds the shadow context (device, ops table per driver version and driver_ops_present).
ShadowContext *makeContext(Session *session, const pb::OpenContextResponse &resp);

}  // namespace ibvx::client::broker
