// What a test sees of the broker changes in the broker's own time (a session ends after its
// process, a count drops after a connection closes): tests poll for it with a deadline.
#pragma once

#include <chrono>
#include <thread>

namespace ibvx::test {

// Calls pred() every poll until it holds or timeout has passed; returns pred()'s last answer.
template <typename Pred>
bool waitFor(Pred pred, std::chrono::milliseconds timeout,
             std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
        if (pred()) {
            return true;
        }
        std::this_thread::sleep_for(poll);
    }
    return pred();
}

}  // namespace ibvx::test
