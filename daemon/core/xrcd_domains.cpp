#include "daemon/core/xrcd_domains.h"

#include <cerrno>

namespace ibvx::daemon {

StatusOr<std::shared_ptr<XrcdDomain>> XrcdDomains::joinLocked(const XrcdOpen &how) {
    auto it = by_file_.find(*how.file);
    if (it == by_file_.end()) {
        return std::shared_ptr<XrcdDomain>();
    }
    if (how.exclusive) {
        return Status(Code::kInvalidArgument, EINVAL,
                      "the file already has an XRC domain and O_EXCL was given");
    }
    ++it->second->holders;
    return it->second;
}

StatusOr<std::shared_ptr<XrcdDomain>> XrcdDomains::open(const XrcdOpen &how, const Make &make,
                                                        const Close &close) {
    if (how.file) {
        std::lock_guard lock(mu_);
        ASSIGN_OR_RETURN(std::shared_ptr<XrcdDomain> joined, joinLocked(how));
        if (joined != nullptr) {
            return joined;
        }
        if (!how.create) {
            return Status(Code::kFailedPrecondition, EAGAIN,
                          "the file has no XRC domain yet; O_CREAT makes one");
        }
    }
    ASSIGN_OR_RETURN(ibv_xrcd * made, make());  // without the lock: a driver call
    auto domain = std::make_shared<XrcdDomain>();
    domain->xrcd = made;
    domain->file = how.file;
    domain->holders = 1;
    if (!how.file) {
        return domain;
    }
    StatusOr<std::shared_ptr<XrcdDomain>> raced = std::shared_ptr<XrcdDomain>();
    {
        std::lock_guard lock(mu_);
        raced = joinLocked(how);
        if (raced.isOk() && *raced == nullptr) {
            by_file_.emplace(*how.file, domain);
            return domain;
        }
    }
    (void)close(made);  // another opener made the file's domain meanwhile: theirs is the one
    return raced;
}

int XrcdDomains::leave(const std::shared_ptr<XrcdDomain> &domain, const Close &close) {
    {
        std::lock_guard lock(mu_);
        if (domain->holders > 1) {
            --domain->holders;
            return 0;
        }
        // The last holder: no one may join it from here on.
        domain->holders = 0;
        if (domain->file) {
            by_file_.erase(*domain->file);
        }
    }
    const int rc = close(domain->xrcd);  // without the lock: a driver call
    std::lock_guard lock(mu_);
    if (rc != 0) {
        domain->holders = 1;
        if (domain->file) {
            by_file_.emplace(*domain->file, domain);  // unless it was made again meanwhile
        }
        return rc;
    }
    domain->xrcd = nullptr;
    return 0;
}

size_t XrcdDomains::sharedCount() {
    std::lock_guard lock(mu_);
    return by_file_.size();
}

}  // namespace ibvx::daemon
