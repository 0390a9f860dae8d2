// What the core tells the rest of the daemon about its tenants: one small interface instead of
// std::function hooks, so the edge (Admin Watch), the app (audit log) and tests implement the
// same seam. Every method may be called from any thread, with the session's mutex held (object
// events, and quota refusals of a call on a session) or no lock of the core's held (quota
// refusals of a new session): an implementation must not call back into the Broker.
#pragma once

#include <cstdint>
#include <string>

#include "daemon/core/identity.h"
#include "daemon/core/objects.h"

namespace ibvx::daemon {

class Session;

class BrokerEvents {
  public:
    virtual ~BrokerEvents() = default;

    // An object was published to the session (its handle is valid from now on).
    virtual void objectCreated(const Session &s, ObjectKind kind, uint64_t handle) = 0;
    // An object left the session (destroy call or session teardown).
    virtual void objectDestroyed(const Session &s, ObjectKind kind, uint64_t handle) = 0;
    // A quota refused the tenant; session is 0 when the refused thing was the session itself.
    // The message names the quota.
    virtual void quotaDenied(const PeerIdentity &peer, uint64_t session, const std::string &message) = 0;
};

}  // namespace ibvx::daemon
