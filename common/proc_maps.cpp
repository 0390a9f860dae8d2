#include "common/proc_maps.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

namespace ibvx {

bool readMaps(const std::string &path, std::vector<MapsEntry> *out) {
    out->clear();
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return false;
    }
    std::string text;
    char buf[16384];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int err = errno;
            ::close(fd);
            if (n < 0) {
                errno = err;
                return false;
            }
            break;
        }
        text.append(buf, static_cast<size_t>(n));
    }
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) {
            nl = text.size();
        }
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        unsigned long start = 0, end = 0;
        unsigned long long offset = 0, inode = 0;
        unsigned major_no = 0, minor_no = 0;
        char perms[5] = {};
        int path_at = 0;
        if (std::sscanf(line.c_str(), "%lx-%lx %4s %llx %x:%x %llu %n", &start, &end, perms, &offset,
                        &major_no, &minor_no, &inode, &path_at) < 7) {
            continue;
        }
        MapsEntry v;
        v.start = start;
        v.end = end;
        v.prot = (perms[0] == 'r' ? PROT_READ : 0) | (perms[1] == 'w' ? PROT_WRITE : 0) |
                 (perms[2] == 'x' ? PROT_EXEC : 0);
        v.shared = perms[3] == 's';
        v.offset = offset;
        v.dev = makedev(major_no, minor_no);
        v.inode = inode;
        v.path = line.substr(static_cast<size_t>(path_at));
        out->push_back(std::move(v));
    }
    return true;
}

const MapsEntry *findMapping(const std::vector<MapsEntry> &maps, uintptr_t addr) {
    auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                               [](uintptr_t a, const MapsEntry &v) { return a < v.end; });
    return it != maps.end() && it->start <= addr ? &*it : nullptr;
}

}  // namespace ibvx
