// Registering a tenant's own shared memory in place: SysV or POSIX shared memory, shared anonymous
// memory, a memfd it mapped. Such pages are shared with others, so the client cannot move them
// onto its session's memfd (docs/verbs.md, "Memory registration"), and an unmodified program has
// no fd to hand over (a SysV segment has none at all). The broker opens the object behind the
// tenant's mapping itself, through /proc/<pid>/map_files/<start>-<end>, which needs
// CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN), ptrace read access to the tenant, and CAP_SETUID and
// CAP_SETGID to take the tenant's file-system ids for the open.
//
// What keeps it to what the tenant may do itself:
// - the open runs with the tenant's fsuid and fsgid (a thread of its own), so the object's own
//   permissions decide, not the broker's (file-system capabilities drop with the fsuid);
// - the mapping must be MAP_SHARED and read-write in the tenant: it could write those pages anyway;
// - the object opened must be the one the maps line names (device and inode), on shmem (tmpfs:
//   the same kind of memory as the memfds tenants send; a file on disk is refused);
// - the tenant's process must still be alive after the open (its pidfd), so a recycled pid
//   never lends another process's memory;
// - the object must keep its size while the broker maps it (requireFixedSize): a tenant that
//   shrank it would end the engine's next access with SIGBUS.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"
#include "daemon/core/identity.h"

namespace ibvx::daemon {

struct TenantMapping {
    UniqueFd fd;          // the shared object, opened read-write
    uint64_t offset = 0;  // of the first registered byte in it
};

// [addr, addr + length) of the tenant's (creds.pid, known by pidfd) address space, opened as
// above. INVALID_ARGUMENT when it is not inside one read-write shared mapping of shmem,
// PERMISSION_DENIED (EACCES/EPERM) when the tenant or the broker may not open it.
StatusOr<TenantMapping> openTenantMapping(const Credentials &creds, int pidfd, uint64_t addr,
                                          uint64_t length);

// OK when the tenant cannot shrink the shared memory behind fd while the broker maps it: a
// memfd or other file sealed with F_SEAL_SHRINK, or memory only the kernel sizes (a SysV
// segment, shared anonymous memory: no tenant holds a descriptor that could truncate them).
// PERMISSION_DENIED (EACCES) otherwise, saying how to seal it; what names the memory.
Status requireFixedSize(int fd, const std::string &what);

}  // namespace ibvx::daemon
