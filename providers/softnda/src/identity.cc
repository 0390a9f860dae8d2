// Who a softnda device says it is: the vendor, part and revision numbers and the GUIDs of
// SPEC.md §8. GUIDs carry a hash of the host's identity so that two hosts' devices (which meet
// over RoCEv2) never share one, and stay the same for the same host across broker restarts.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

// FNV-1a, 64 bits: a stable, dependency-free spreading of the host identity over the bits kept.
uint64_t fnv1a(const std::string &s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) {
        h = (h ^ c) * 0x100000001b3ull;
    }
    return h;
}

// The host's identity: its machine ID (systemd's, or D-Bus's older copy), else its host name.
std::string hostIdentity() {
    for (const char *path : {"/etc/machine-id", "/var/lib/dbus/machine-id"}) {
        std::ifstream in(path);
        std::string id;
        if (in && std::getline(in, id) && !id.empty()) {
            return id;
        }
    }
    char name[256] = {};
    (void)gethostname(name, sizeof(name) - 1);
    return name;
}

}  // namespace

uint32_t hostGuidBits() {
    static const uint32_t bits = [] {
        const uint64_t h = fnv1a(hostIdentity());
        return static_cast<uint32_t>((h ^ (h >> 24) ^ (h >> 48)) & 0xffffff);
    }();
    return bits;
}

uint64_t deviceGuid(uint32_t index) {
    return (static_cast<uint64_t>(kVendorId) << 40) | (static_cast<uint64_t>(hostGuidBits()) << 16) |
           (static_cast<uint64_t>(index & 0xff) << 8);
}

}  // namespace softnda
