#include "tools/ibv-extend-perf/netns.h"

#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "tools/ibv-extend-perf/programs.h"

namespace ibvx::perf {
namespace {

// `ip ARGS...`; "" on success, else what it said.
std::string ip(const std::vector<std::string> &args) {
    std::vector<std::string> argv = {ipProgram()};
    argv.insert(argv.end(), args.begin(), args.end());
    int status = 0;
    Program p(argv);
    std::string said = p.finish(std::chrono::seconds(20), &status);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        return {};
    }
    return p.name() + ": " + (said.empty() ? "status " + std::to_string(status) : said);
}

}  // namespace

std::string ipProgram() {
    for (const char *p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
        if (::access(p, X_OK) == 0) {
            return p;
        }
    }
    return {};
}

std::unique_ptr<NetnsPair> NetnsPair::make(std::string *why) {
    if (::geteuid() != 0) {
        *why = "needs root (it makes two network namespaces and a veth pair)";
        return nullptr;
    }
    if (ipProgram().empty()) {
        *why = "no `ip` (iproute2) on this host";
        return nullptr;
    }
    std::unique_ptr<NetnsPair> pair(new NetnsPair);
    const std::string base = "ibvx-perf-" + std::to_string(::getpid());
    for (int side = 0; side < 2; ++side) {
        pair->names_[side] = base + (side == 0 ? "-a" : "-b");
        if (std::string err = ip({"netns", "add", pair->names_[side]}); !err.empty()) {
            *why = err;
            return nullptr;
        }
        pair->made_[side] = true;
        std::string path = "/run/netns/" + pair->names_[side];
        pair->fds_[side].reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (!pair->fds_[side]) {
            *why = "open " + path + ": " + std::strerror(errno);
            return nullptr;
        }
    }
    const std::string &a = pair->names_[0], &b = pair->names_[1];
    // The pair is made inside namespace a, its peer moved straight into b: this process's
    // namespace never sees either end.
    const std::vector<std::vector<std::string>> steps = {
        {"-n", a, "link", "add", ifname(0), "mtu", std::to_string(pair->mtu()), "type", "veth", "peer",
         "name", ifname(1), "mtu", std::to_string(pair->mtu()), "netns", b},
        {"-n", a, "addr", "add", std::string(address(0)) + "/24", "dev", ifname(0)},
        {"-n", b, "addr", "add", std::string(address(1)) + "/24", "dev", ifname(1)},
        {"-n", a, "link", "set", "lo", "up"},
        {"-n", b, "link", "set", "lo", "up"},
        {"-n", a, "link", "set", ifname(0), "up"},
        {"-n", b, "link", "set", ifname(1), "up"},
    };
    for (const auto &step : steps) {
        if (std::string err = ip(step); !err.empty()) {
            *why = err;
            return nullptr;
        }
    }
    // The kernel reports a veth end's carrier up a moment after both ends are set up (linkwatch
    // may take up to a second), and until then softnda's port on it is DOWN (SPEC.md §19): a
    // tenant opening the device meanwhile finds a port it cannot use.
    for (int side = 0; side < 2; ++side) {
        if (!pair->waitRunning(side, std::chrono::seconds(10))) {
            *why = std::string(ifname(side)) + " in " + pair->names_[side] + " is not RUNNING after 10 s";
            return nullptr;
        }
    }
    return pair;
}

bool NetnsPair::waitRunning(int side, std::chrono::milliseconds limit) const {
    InNetns in(fd(side));
    UniqueFd sock(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (sock) {
        ifreq ifr{};
        std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname(side));
        if (::ioctl(sock.get(), SIOCGIFFLAGS, &ifr) == 0 && (ifr.ifr_flags & IFF_RUNNING) != 0) {
            return true;
        }
        if (std::chrono::steady_clock::now() > deadline) {
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
}

NetnsPair::~NetnsPair() {
    for (int side = 0; side < 2; ++side) {
        fds_[side].reset();
        if (made_[side]) {
            (void)ip({"netns", "del", names_[side]});
        }
    }
}

InNetns::InNetns(int ns_fd) : home_(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) {
    if (!home_) {
        throw std::runtime_error(std::string("open /proc/thread-self/ns/net: ") + std::strerror(errno));
    }
    if (::setns(ns_fd, CLONE_NEWNET) != 0) {
        throw std::runtime_error(std::string("setns into a network namespace: ") + std::strerror(errno));
    }
}

InNetns::~InNetns() {
    // Back home; failing that the thread would stay in a namespace about to be deleted, which
    // cannot happen for a namespace fd this thread just left.
    (void)::setns(home_.get(), CLONE_NEWNET);
}

}  // namespace ibvx::perf
