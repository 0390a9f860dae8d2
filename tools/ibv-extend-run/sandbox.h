// The tenant's picture of the host: a bubblewrap (bwrap) mount namespace in which /dev/infiniband
// and /sys/class/infiniband{,_verbs} are the broker's discovery tree and nothing else, the rest of
// the host as it is. The program keeps its uid (bwrap maps it to itself) and needs no privilege;
// the host's /dev and /sys are never changed (the new entries live on tmpfs mounts that exist only
// in the sandbox). See docs/verbs.md, "The discovery tree".
#pragma once

#include <string>
#include <vector>

namespace ibvx::run {

enum class SandboxMode {
    kAuto,  // use it when it can be set up; otherwise say why on stderr and run without it
    kOn,    // use it or fail
    kOff,   // never (the default: exec in place, so the program keeps the caller's pid)
};

// "auto", "on", "off"; false for anything else.
bool parseSandboxMode(const std::string &text, SandboxMode *mode);

// The bwrap command line (without the program) that shows the discovery tree at tree (a
// directory, symlinks resolved) to the program. Reads the host's /dev and /sys/class to bind
// their other entries back. userns_fd >= 0: the sandbox joins that user namespace (an inherited
// descriptor, shared_userns.h) instead of making one of its own.
std::vector<std::string> sandboxArgs(const std::string &bwrap, const std::string &tree, int userns_fd = -1);

// The bwrap program on PATH; "" when there is none.
std::string findBwrap();

}  // namespace ibvx::run
