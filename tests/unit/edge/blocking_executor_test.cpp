// BlockingExecutor alone: its bounds and that it runs everything it accepted before it goes.
#include "daemon/edge/blocking_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace ibvx::daemon {
namespace {

TEST(BlockingExecutor, RefusesBeyondItsQueueAndRunsEverythingAccepted) {
    std::mutex mu;
    std::condition_variable cv;
    bool release = false;
    std::atomic<int> ran{0};
    {
        BlockingExecutor ex(1, 2);
        auto task = [&] {
            std::unique_lock lock(mu);
            cv.wait(lock, [&] { return release; });
            ++ran;
        };
        std::atomic<bool> started{false};
        ASSERT_TRUE(ex.submit([&] {
            started = true;
            task();
        }));
        while (!started) {
            std::this_thread::yield();  // the one thread holds the first task now
        }
        int accepted = 1;
        while (ex.submit(task)) {
            ++accepted;
        }
        EXPECT_EQ(accepted, 3);  // one running, two queued
        {
            std::lock_guard lock(mu);
            release = true;
        }
        cv.notify_all();
    }  // the destructor runs what it accepted
    EXPECT_EQ(ran.load(), 3);
}

}  // namespace
}  // namespace ibvx::daemon
