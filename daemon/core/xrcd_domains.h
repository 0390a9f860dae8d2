// XRC domains shared by file (ibv_open_xrcd with an fd, softnda SPEC.md §14): every process that
// opens a domain with the same file gets the same domain, as the kernel's ib_uverbs_open_xrcd
// keys its domains by the file's inode. A device keeps one table; each session's XrcdObject is a
// handle holding one domain, and the driver's domain is closed when its last handle goes.
//
// Threading: mu_ guards the table and every domain's holders. It is a leaf: never held across a
// driver call (make and close run without it), so it nests inside Session::mu_ and the device's
// driver lock either way.
#pragma once

#include <infiniband/verbs.h>

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "common/status.h"

namespace ibvx::daemon {

// The file a shared domain is keyed by: its inode, as fstat names it.
struct XrcdFile {
    uint64_t dev = 0, ino = 0;
    auto operator<=>(const XrcdFile &) const = default;
};

// One driver domain and how many handles (XrcdObjects, in any session) hold it.
struct XrcdDomain {
    ibv_xrcd *xrcd = nullptr;
    std::optional<XrcdFile> file;  // none: a private domain (fd -1)
    uint32_t holders = 0;
};

// How an open asks for the domain of a file (ibv_open_xrcd's oflags).
struct XrcdOpen {
    std::optional<XrcdFile> file;  // none: a new private domain
    bool create = false;           // O_CREAT: make one when the file has none
    bool exclusive = false;        // O_EXCL: refuse when the file has one
};

class XrcdDomains {
  public:
    // Makes the driver's domain (open_xrcd, or import_object in a restore).
    using Make = std::function<StatusOr<ibv_xrcd *>()>;
    // Closes a driver domain: 0 or a negative errno.
    using Close = std::function<int(ibv_xrcd *)>;

    // A new holder of the file's domain, made with make() when there is none. As the kernel
    // answers: EAGAIN when the file has no domain and create is not set, EINVAL when it has one
    // and exclusive is set. When another session made the file's domain while make() ran, this
    // one joins it and closes what make() made.
    StatusOr<std::shared_ptr<XrcdDomain>> open(const XrcdOpen &how, const Make &make, const Close &close);
    // A holder lets go; the last one closes the driver's domain with close (the driver's answer:
    // on a refusal the holder keeps it, as a refused destroy keeps any object).
    int leave(const std::shared_ptr<XrcdDomain> &domain, const Close &close);
    // Domains shared by a file (for tests and inspection).
    size_t sharedCount();

  private:
    // The file's domain, joined (mu_ held); nullptr when it has none.
    StatusOr<std::shared_ptr<XrcdDomain>> joinLocked(const XrcdOpen &how);

    std::mutex mu_;
    std::map<XrcdFile, std::shared_ptr<XrcdDomain>> by_file_;
};

}  // namespace ibvx::daemon
