// The end of a session as the libibverbs face follows it (docs/verbs.md, "When the session
// ends"): whether the session is alive, and the handler its watcher runs when the broker ended
// it. Apart from session.h, which brings gRPC, so the face's files that only follow the end do
// not compile the RPCs.
#pragma once

namespace ibvx::client::broker {

class Session;

// Runs once per session the broker ended, on that session's watcher thread, after alive() turned
// false. The handler must not make a call on the session (it is gone) nor hold a lock a caller
// of Session may hold.
using SessionEndHandler = void (*)(Session *session);
void setSessionEndHandler(SessionEndHandler handler);

// Session::alive(): false once the broker closed the session's fd channel.
bool sessionAlive(const Session *session);

}  // namespace ibvx::client::broker
