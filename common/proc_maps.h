// /proc/<pid>/maps read into entries: the client's shared pages (what may move) and the broker's
// registration of a tenant's shared mapping (what it may open) read the same lines.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ibvx {

struct MapsEntry {
    uintptr_t start = 0;
    uintptr_t end = 0;
    int prot = 0;         // PROT_READ | PROT_WRITE | PROT_EXEC as the line says
    bool shared = false;  // 's' (MAP_SHARED), else 'p'
    uint64_t offset = 0;  // into the mapped file
    dev_t dev = 0;
    uint64_t inode = 0;
    std::string path;  // may be empty, "[heap]", "/memfd:name (deleted)", ...
};

// Every line of the maps file at path ("/proc/self/maps", "/proc/<pid>/maps"), in address order.
// false with errno set when it cannot be read.
bool readMaps(const std::string &path, std::vector<MapsEntry> *out);

// The entry holding addr, or nullptr.
const MapsEntry *findMapping(const std::vector<MapsEntry> &maps, uintptr_t addr);

}  // namespace ibvx
