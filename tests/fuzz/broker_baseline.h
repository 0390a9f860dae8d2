// What a broker-level fuzz input must leave as it found it (core_requests, restart_state): the
// process's open fds and the mapping manager's arena bytes. Taken before the input, checked after
// everything the input made has ended.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "daemon/core/mapping.h"
#include "tests/fuzz/fuzz_support.h"

namespace ibvx::fuzz {

// The process's open fds, each with what it refers to (/proc/self/fd's link: "memfd:...",
// "socket:[inode]", "anon_inode:[eventfd]"...).
inline std::map<int, std::string> openFds() {
    std::map<int, std::string> out;
    DIR *d = opendir("/proc/self/fd");
    FUZZ_CHECK(d != nullptr, "cannot list /proc/self/fd");
    const int own = dirfd(d);
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) {
            continue;
        }
        char target[256] = {};
        const std::string link = std::string("/proc/self/fd/") + e->d_name;
        const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
        out[std::atoi(e->d_name)] = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
    }
    closedir(d);
    return out;
}

// The fds in now that before did not have (same number, same file).
inline std::map<int, std::string> newFds(const std::map<int, std::string> &before,
                                         const std::map<int, std::string> &now) {
    std::map<int, std::string> added;
    for (const auto &[fd, target] : now) {
        auto it = before.find(fd);
        if (it == before.end() || it->second != target) {
            added.emplace(fd, target);
        }
    }
    return added;
}

class BrokerBaseline {
  public:
    BrokerBaseline() : fds_(openFds()), arena_(daemon::MappingManager::instance().totals().arena_bytes) {}

    // An fd the input left open stays open; gRPC's own threads open and close pollers and
    // wakeups at moments of their choosing (under load, one was seen open at the baseline and
    // closed after, or the other way round). So the check is on identity, not on a count: every
    // fd open now that was not open before must close within two seconds.
    void checkRestored() const {
        const uint64_t arena = daemon::MappingManager::instance().totals().arena_bytes;
        FUZZ_CHECK(arena == arena_, "arena bytes %llu before, %llu after",
                   static_cast<unsigned long long>(arena_), static_cast<unsigned long long>(arena));
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        std::map<int, std::string> added = newFds(fds_, openFds());
        while (!added.empty() && std::chrono::steady_clock::now() < deadline) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
            added = newFds(fds_, openFds());
        }
        std::string list;
        for (const auto &[fd, target] : added) {
            list += " " + std::to_string(fd) + " -> " + target;
        }
        FUZZ_CHECK(added.empty(), "fd leak: open after the input and not before:%s", list.c_str());
    }

  private:
    std::map<int, std::string> fds_;
    uint64_t arena_;
};

}  // namespace ibvx::fuzz
