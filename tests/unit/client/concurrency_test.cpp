// The buffer registry under concurrent alloc/find/free from several threads (label tsan).
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ibv_extend_broker.h>

#include "client/buffers.h"

namespace ibvx::client {
namespace {

TEST(ClientConcurrency, BuffersFromManyThreads) {
    constexpr int kThreads = 4;
    constexpr int kRounds = 200;
    std::vector<std::thread> threads;
    std::vector<int> failures(kThreads, 0);
    for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([t, &failures] {
            for (int i = 0; i < kRounds; ++i) {
                auto *p = static_cast<unsigned char *>(ibvx_alloc_buf(4096 * (1 + i % 3)));
                BufferInfo info;
                if (p == nullptr || !findBuffer(p + 100, 10, &info) || info.base != p) {
                    failures[t]++;
                    continue;
                }
                p[0] = static_cast<unsigned char>(t);
                ibvx_free_buf(p);
            }
        });
    }
    for (std::thread &th : threads) {
        th.join();
    }
    for (int t = 0; t < kThreads; ++t) {
        EXPECT_EQ(failures[t], 0) << "thread " << t;
    }
}

}  // namespace
}  // namespace ibvx::client
