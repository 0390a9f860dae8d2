#include "daemon/core/tenant_mapping.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/proc_maps.h"

namespace ibvx::daemon {
namespace {

std::string range(uint64_t addr, uint64_t length) {
    char text[64];
    std::snprintf(text, sizeof(text), "[0x%" PRIx64 ", +%" PRIu64 ")", addr, length);
    return text;
}

// open(2) of path as the tenant's fsuid/fsgid would, on a thread of its own: file-system ids are
// per thread, so no other broker thread opens anything as the tenant meanwhile. EPERM without
// opening anything when the ids do not take (no CAP_SETUID/CAP_SETGID): the broker's own
// permissions must never stand in for the tenant's.
UniqueFd openAsTenant(const std::string &path, const Credentials &creds, int *err) {
    UniqueFd fd;
    std::thread([&] {
        // setfsuid/setfsgid answer the previous id, never an error; an invalid id (-1) changes
        // nothing and answers the current one, which says whether the change took.
        (void)::syscall(SYS_setfsgid, creds.gid);
        (void)::syscall(SYS_setfsuid, creds.uid);
        if (static_cast<uid_t>(::syscall(SYS_setfsuid, -1)) != creds.uid ||
            static_cast<gid_t>(::syscall(SYS_setfsgid, -1)) != creds.gid) {
            *err = EPERM;
            return;
        }
        fd.reset(::open(path.c_str(), O_RDWR | O_CLOEXEC));
        *err = errno;
    }).join();
    return fd;
}

// The device of the kernel's internal shmem mount, which holds memfds, SysV segments and shared
// anonymous memory (and nothing a tenant can name by path).
dev_t internalShmemDev() {
    static const dev_t dev = [] {
        UniqueFd probe(::memfd_create("ibvx-shmem-probe", MFD_CLOEXEC));
        struct stat st {};
        return probe && ::fstat(probe.get(), &st) == 0 ? st.st_dev : static_cast<dev_t>(-1);
    }();
    return dev;
}

}  // namespace

Status requireFixedSize(int fd, const std::string &what) {
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals >= 0 && (seals & F_SEAL_SHRINK) != 0) {
        return Status::ok();
    }
    char link[64];
    char target[256];
    std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = ::readlink(link, target, sizeof(target) - 1);
    const std::string path = n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string("?");
    struct stat st {};
    // On the internal mount, only a memfd's owner holds a descriptor that can truncate it.
    if (::fstat(fd, &st) == 0 && st.st_dev == internalShmemDev() && path.rfind("/memfd:", 0) != 0) {
        return Status::ok();
    }
    return Status(Code::kPermissionDenied, EACCES,
                  what + " (" + path +
                      ") can be shrunk by its owner while registered, which would fault the device: "
                      "use a memfd sealed with F_SEAL_SHRINK (memfd_create(MFD_ALLOW_SEALING), then "
                      "fcntl(F_ADD_SEALS)), ibvx_alloc_buf, SysV or shared anonymous memory");
}

StatusOr<TenantMapping> openTenantMapping(const Credentials &creds, int pidfd, uint64_t addr,
                                          uint64_t length) {
    const std::string where = range(addr, length);
    if (length == 0 || addr > UINT64_MAX - length) {
        return invalidArgument(where + " is not a range of the tenant's address space");
    }
    if (pidfd < 0 || creds.pid <= 0) {
        return failedPrecondition("the session has no process to read " + where + " of");
    }
    const std::string proc = "/proc/" + std::to_string(creds.pid);
    std::vector<MapsEntry> maps;
    if (!readMaps(proc + "/maps", &maps)) {
        return Status::fromErrno(errno, "cannot read the tenant's " + proc + "/maps");
    }
    const MapsEntry *v = findMapping(maps, addr);
    if (v == nullptr || addr + length > v->end) {
        return invalidArgument(where + " is not inside one mapping of the tenant's");
    }
    if (!v->shared) {
        return invalidArgument(where + " is private memory, not a shared mapping");
    }
    if ((v->prot & (PROT_READ | PROT_WRITE)) != (PROT_READ | PROT_WRITE)) {
        return Status(Code::kPermissionDenied, EACCES, where + " is not mapped read-write by the tenant");
    }
    char name[64];
    std::snprintf(name, sizeof(name), "/map_files/%" PRIxPTR "-%" PRIxPTR, v->start, v->end);
    int err = 0;
    TenantMapping out;
    out.fd = openAsTenant(proc + name, creds, &err);
    if (!out.fd) {
        const char *hint = err == EPERM
                               ? " (the broker needs CAP_CHECKPOINT_RESTORE, CAP_SETUID and CAP_SETGID "
                                 "for this: docs/verbs.md)"
                               : "";
        return Status::fromErrno(err, "cannot open the object behind the tenant's mapping of " + where +
                                          " (" + v->path + ") as the tenant" + hint);
    }
    struct stat st {};
    struct statfs fs {};
    if (::fstat(out.fd.get(), &st) < 0 || st.st_dev != v->dev || st.st_ino != v->inode) {
        return invalidArgument("the tenant's mapping of " + where + " changed while it was opened");
    }
    if (::fstatfs(out.fd.get(), &fs) < 0 || fs.f_type != TMPFS_MAGIC) {
        return invalidArgument(
            where + " maps " + v->path +
            ", not shared memory (SysV or POSIX shared memory, shared anonymous memory, a memfd)");
    }
    // Alive after the open: the pid named this process, not a later one with its number.
    if (::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) < 0) {
        return failedPrecondition("the tenant's process went away while " + where + " was opened");
    }
    RETURN_IF_ERROR(requireFixedSize(out.fd.get(), "the shared memory at " + where));
    out.offset = v->offset + (addr - v->start);
    if (out.offset + length > static_cast<uint64_t>(st.st_size)) {
        return invalidArgument(where + " runs past the end of " + v->path);
    }
    return out;
}

}  // namespace ibvx::daemon
