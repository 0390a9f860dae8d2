#include "daemon/edge/blocking_executor.h"

namespace ibvx::daemon {

BlockingExecutor::BlockingExecutor(size_t threads, size_t max_queued) : max_queued_(max_queued) {
    threads_.reserve(threads);
    for (size_t i = 0; i < threads; ++i) {
        threads_.emplace_back([this] { work(); });
    }
}

BlockingExecutor::~BlockingExecutor() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (std::thread &t : threads_) {
        t.join();
    }
}

bool BlockingExecutor::submit(std::function<void()> task) {
    {
        std::lock_guard lock(mu_);
        if (stop_ || queue_.size() >= max_queued_) {
            return false;
        }
        queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return true;
}

void BlockingExecutor::work() {
    for (;;) {
        std::function<void()> task;
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            if (queue_.empty()) {
                return;  // stopping, and nothing accepted is left
            }
            task = std::move(queue_.front());
            queue_.pop_front();
        }
        task();
    }
}

}  // namespace ibvx::daemon
