// What a broker-level fuzz input must leave as it found it (core_requests, restart_state): the
// process's open fds and the mapping manager's arena bytes. Taken before the input, checked after
// everything the input made has ended.
#pragma once

#include <cstdint>

#include "daemon/core/mapping.h"
#include "tests/fuzz/fuzz_support.h"

namespace ibvx::fuzz {

class BrokerBaseline {
  public:
    BrokerBaseline()
        : fds_(countOpenFds()), arena_(daemon::MappingManager::instance().totals().arena_bytes) {}

    void checkRestored() const {
        const uint64_t arena = daemon::MappingManager::instance().totals().arena_bytes;
        FUZZ_CHECK(arena == arena_, "arena bytes %llu before, %llu after",
                   static_cast<unsigned long long>(arena_), static_cast<unsigned long long>(arena));
        const int fds = countOpenFds();
        FUZZ_CHECK(fds == fds_, "fd leak: %d open before, %d after", fds_, fds);
    }

  private:
    int fds_;
    uint64_t arena_;
};

}  // namespace ibvx::fuzz
