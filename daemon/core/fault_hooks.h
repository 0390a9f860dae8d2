// Test-only crash points: IBVX_FAULT_CRASH_ONCE="<point>:<marker file>" makes the broker kill
// itself with SIGKILL the first time it reaches <point>, after creating the marker file, so a
// restart lands in one exact window of a call (docs/restart.md, the restart tests); its
// successor finds the marker and goes on. Unset (every real deployment): nothing happens.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace ibvx::daemon {

inline void crashOnceAt(const char *point) {
    static const std::string spec = [] {
        const char *v = std::getenv("IBVX_FAULT_CRASH_ONCE");
        return std::string(v != nullptr ? v : "");
    }();
    const size_t colon = spec.find(':');
    if (colon == std::string::npos || spec.compare(0, colon, point) != 0) {
        return;
    }
    const std::string marker = spec.substr(colon + 1);
    const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        return;  // reached before, by this process or the one it replaced
    }
    ::close(fd);
    ::kill(::getpid(), SIGKILL);
}

}  // namespace ibvx::daemon
