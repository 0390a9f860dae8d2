// rdma-core's shared-object API (ibv_import_device, ibv_import_pd/_mr/_dm and their unimports)
// within one process. A face context's cmd_fd is a memfd of its own (the face has no uverbs
// command fd), so a dup of it names the context by its file, which the kernel says (fstat), not
// by anything the program writes. Importing gives back the same context and objects: in the
// kernel an import is a second handle on one object, and here the broker's object is the same
// one, so the import's own struct would carry nothing else. An imported context counts as one
// more ibv_close_device() before it really closes, and takes over the fd it was given, as
// libibverbs' does; unimporting an object leaves it to its creator.
//
// A context of another process (a cmd_fd passed by SCM_RIGHTS) is not imported: that needs the
// broker to join two sessions on one context, which it does not do (EOPNOTSUPP, which rdma-core's
// tests read as "not supported").
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>
#include <utility>

#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

using FileId = std::pair<dev_t, ino_t>;

// The face contexts of this process by their cmd_fd's file.
struct ByFile {
    std::mutex mu;
    std::map<FileId, ShadowContext *> contexts;
};
ByFile &byFile() {
    static auto *b = new ByFile;  // never destroyed: contexts may close from atexit handlers
    return *b;
}

bool fileOf(int fd, FileId *out) {
    struct stat st {};
    if (fd < 0 || fstat(fd, &st) != 0) {
        return false;
    }
    *out = {st.st_dev, st.st_ino};
    return true;
}

// The object of kind with the 32-bit handle the face gave it (its broker handle's low bits) among
// the context's live ones.
template <typename Shadow, typename HandleOf>
Shadow *byHandle(ShadowContext *c, broker::ShadowKind kind, uint32_t handle, HandleOf handleOf) {
    for (void *o : broker::shadowsOf(c, kind)) {
        auto *s = static_cast<Shadow *>(o);
        if (handleOf(*s) == handle) {
            return s;
        }
    }
    return nullptr;
}

}  // namespace

void giveCmdFd(ShadowContext *c) {
    c->ctx.cmd_fd = memfd_create("ibvx-context", MFD_CLOEXEC);
    if (c->ctx.cmd_fd >= 0) {
        giveBackCmdFd(c);
    }  // else no import of this context; everything else works
}

void giveBackCmdFd(ShadowContext *c) {
    FileId id;
    if (fileOf(c->ctx.cmd_fd, &id)) {
        std::lock_guard lock(byFile().mu);
        byFile().contexts[id] = c;
    }
}

bool releaseImport(ShadowContext *c) {
    int fd = -1;
    {
        std::lock_guard lock(c->mu);
        if (c->import_fds.empty()) {
            return false;
        }
        fd = c->import_fds.back();
        c->import_fds.pop_back();
    }
    close(fd);
    return true;
}

void forgetCmdFd(ShadowContext *c) {
    FileId id;
    if (fileOf(c->ctx.cmd_fd, &id)) {
        std::lock_guard lock(byFile().mu);
        byFile().contexts.erase(id);
    }
}

}  // namespace ibvx::client::verbs

using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs
namespace broker = ibvx::client::broker;

extern "C" {

ibv_context *ibvx_verbs_import_device(int cmd_fd) {
    FileId id;
    if (!fileOf(cmd_fd, &id)) {
        return failNull<ibv_context>(EBADF);
    }
    // Held to the end: a context leaves the map (forgetCmdFd) before it is freed, so the one found
    // lives while its import is counted.
    std::lock_guard lock(byFile().mu);
    auto it = byFile().contexts.find(id);
    ShadowContext *c = it != byFile().contexts.end() ? it->second : nullptr;
    if (c == nullptr || c->ctx.cmd_fd == cmd_fd) {
        // Not a dup of a context's fd of this process (the fd itself is the context's own, which
        // would be closed twice).
        return failNull<ibv_context>(c == nullptr ? EOPNOTSUPP : EINVAL);
    }
    std::lock_guard context_lock(c->mu);
    c->import_fds.push_back(cmd_fd);
    return &c->ctx;
}

ibv_pd *ibvx_verbs_import_pd(ibv_context *context, uint32_t pd_handle) {
    ShadowContext *c = faceContext(context);
    ShadowPd *p = c == nullptr ? nullptr
                               : byHandle<ShadowPd>(c, broker::ShadowKind::kPd, pd_handle,
                                                    [](const ShadowPd &s) { return s.pd.handle; });
    return p != nullptr ? &p->pd : failNull<ibv_pd>(c == nullptr ? EINVAL : ENOENT);
}

ibv_mr *ibvx_verbs_import_mr(ibv_pd *pd, uint32_t mr_handle) {
    ShadowPd *p = livePd(pd);
    ShadowMr *m = p == nullptr ? nullptr
                               : byHandle<ShadowMr>(p->owner, broker::ShadowKind::kMr, mr_handle,
                                                    [](const ShadowMr &s) { return s.mr.handle; });
    if (m != nullptr && m->mr.pd != pd) {
        m = nullptr;  // an MR of another PD of the context
    }
    return m != nullptr ? &m->mr : failNull<ibv_mr>(p == nullptr ? EINVAL : ENOENT);
}

ibv_dm *ibvx_verbs_import_dm(ibv_context *context, uint32_t dm_handle) {
    ShadowContext *c = faceContext(context);
    auto *d = c == nullptr
                  ? nullptr
                  : byHandle<broker::ShadowDm>(c, broker::ShadowKind::kDm, dm_handle,
                                               [](const broker::ShadowDm &s) { return s.dm.handle; });
    return d != nullptr ? &d->dm : failNull<ibv_dm>(c == nullptr ? EINVAL : ENOENT);
}

// The object stays its creator's: an unimport frees only what the import made, here nothing.
void ibvx_verbs_unimport_pd(ibv_pd *) {}
void ibvx_verbs_unimport_mr(ibv_mr *) {}
void ibvx_verbs_unimport_dm(ibv_dm *) {}

}  // extern "C"
