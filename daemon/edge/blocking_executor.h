// A few threads for the calls that may wait (RegMr for its fd on the fd channel, EvictSession
// for the event loop to tear a session down), so those waits never hold one of gRPC's callback
// threads: the handler hands the work here and returns, and the task finishes the reactor.
//
// Bounded twice: `threads` tasks run at once, at most `max_queued` wait; submit() refuses more
// (the caller answers UNAVAILABLE), so slow tenants cannot pile up unbounded work.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ibvx::daemon {

class BlockingExecutor {
  public:
    BlockingExecutor(size_t threads, size_t max_queued);
    // Runs every task already accepted, then joins the threads.
    ~BlockingExecutor();
    BlockingExecutor(const BlockingExecutor &) = delete;
    BlockingExecutor &operator=(const BlockingExecutor &) = delete;

    // false when max_queued tasks are waiting already (task is not run).
    bool submit(std::function<void()> task);

  private:
    void work();

    const size_t max_queued_;
    std::mutex mu_;  // guards queue_ and stop_
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

}  // namespace ibvx::daemon
