// Fuzz target: softnda's import_object (vdev ABI V4, SPEC.md §10), the parser of the per-object
// state blobs a restarting broker hands back to the driver. A blob comes from the broker's own
// restart state, but that state lives in memory another process wrote (a crashed broker, an older
// driver version), so the parser must refuse anything a create could not have made, and
// everything it accepts must be an object the ordinary destroy call takes apart again.
//
// Setup (once per process): softnda0 opened, with one object of every kind made the ordinary
// way (a PD, an MR, a CQ with an event fd, an SRQ, an RC QP and a memory window, which gives the
// context its window file) over memfd-backed queue memory
// (tests/unit/softnda/memfd_ops.h), each exported once: those blobs are the templates. The
// device stays paused, as a restoring broker keeps it while it imports.
//
// Input: `u8 kind, u8 flags, u16 offset (LE), bytes...`
//   kind % 7             the object kind imported (CONTEXT, PD, MR, CQ, SRQ, QP, MW)
//   flags & 1            the bytes are the whole blob; otherwise they are XORed onto the kind's
//                        template starting at offset (so most inputs stay close to a real blob)
//   flags & 2            the blob keeps its length but claims fd_cnt = (flags >> 4) & 7
//   flags & 4            the QP/SRQ import is offered the SRQ as its parent
//   flags & 8            an unknown device name for a CONTEXT
// The fds a blob claims are dups of the template's (or fresh eventfds past them). Relocation
// knows the templates' memory only, as the broker knows only its own arena and doorbell pages: a
// queue's old address gets a fresh copy of that memory, a doorbell a fresh mapping of its page,
// anything else nullptr.
//
// Invariants: no crash; an accepted object is destroyed by its ordinary destroy call with 0; and
// after each input the process holds no extra fd, no extra queue allocation and no extra
// doorbell mapping (what relocation handed out and the driver did not take is given back here).

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "common/qp_init_attr.h"
#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_ops.h"
#include "tests/fuzz/fuzz_support.h"
#include "tests/unit/softnda/memfd_ops.h"

namespace {

using softnda_test::MemfdArena;

constexpr ibv_extend_vdev_obj kKinds[] = {
    IBV_EXTEND_VDEV_OBJ_CONTEXT, IBV_EXTEND_VDEV_OBJ_PD, IBV_EXTEND_VDEV_OBJ_MR, IBV_EXTEND_VDEV_OBJ_CQ,
    IBV_EXTEND_VDEV_OBJ_SRQ,     IBV_EXTEND_VDEV_OBJ_QP, IBV_EXTEND_VDEV_OBJ_MW};
constexpr size_t kPage = 4096;

// Doorbell pages relocation mapped for the current input: the driver unmaps those it took
// through db_unmap; the rest the harness unmaps. Page address -> still mapped.
std::map<uintptr_t, bool> g_reloc_pages;

// The queue-memory callbacks: the memfd arena's, except that db_unmap also takes back the pages
// relocation mapped (the broker's own callbacks likewise know the mappings its relocation made).
int dbUnmap(void *ptr, doorbell_map_desc *desc) {
    auto page = reinterpret_cast<uintptr_t>(ptr) & ~uintptr_t{kPage - 1};
    if (auto it = g_reloc_pages.find(page); it != g_reloc_pages.end() && it->second) {
        munmap(reinterpret_cast<void *>(page), kPage);
        it->second = false;
        return 0;
    }
    return MemfdArena::dbUnmap(ptr, desc);
}

ibv_extend_ops g_ops = {MemfdArena::alloc,   MemfdArena::free,   MemfdArena::memsetS,
                        MemfdArena::memcpyS, MemfdArena::dbMmap, dbUnmap};

class Templates {
  public:
    Templates() {
        ctx_ = softnda_vdev_ops.open_device("softnda0");
        FUZZ_CHECK(ctx_ != nullptr, "open_device: %s", std::strerror(errno));
        ext_ = softnda_driver_ops.alloc_context(ctx_);
        FUZZ_CHECK(ext_ != nullptr, "alloc_context: %s", std::strerror(errno));
        pd_ = softnda_vdev_ops.alloc_pd(ctx_);
        FUZZ_CHECK(pd_ != nullptr, "alloc_pd: %s", std::strerror(errno));
        mr_buf_ = MemfdArena::alloc(2 * kPage);
        mr_ = softnda_vdev_ops.reg_mr(pd_, mr_buf_, 2 * kPage, reinterpret_cast<uintptr_t>(mr_buf_),
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        FUZZ_CHECK(mr_ != nullptr, "reg_mr: %s", std::strerror(errno));
        ibv_cq_init_attr_extend ca{};
        ca.attr.cqe = 16;
        ca.ops = &g_ops;
        cq_ = ext_->ops->create_cq(ctx_, &ca);
        FUZZ_CHECK(cq_ != nullptr, "create_cq: %s", std::strerror(errno));
        event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        FUZZ_CHECK(softnda_vdev_ops.set_cq_event_fd(cq_->cq, event_fd_) == 0, "set_cq_event_fd");
        ibv_srq_init_attr_extend sa{};
        sa.pd = pd_;
        sa.attr.attr.max_wr = 8;
        sa.attr.attr.max_sge = 1;
        sa.ops = &g_ops;
        srq_ = ext_->ops->create_srq(ctx_, &sa);
        FUZZ_CHECK(srq_ != nullptr, "create_srq: %s", std::strerror(errno));
        auto qa = ibvx::qpInitAttr({.pd = pd_,
                                    .send_cq = cq_->cq,
                                    .recv_cq = cq_->cq,
                                    .srq = nullptr,
                                    .send_wr = 8,
                                    .recv_wr = 8,
                                    .send_sge = 1,
                                    .recv_sge = 1,
                                    .inline_data = 0,
                                    .sq_sig_all = 0,
                                    .ops = &g_ops});
        qp_ = ext_->ops->create_qp(ctx_, &qa);
        FUZZ_CHECK(qp_ != nullptr, "create_qp: %s", std::strerror(errno));
        mw_ = softnda_vdev_ops.alloc_mw(pd_, IBV_MW_TYPE_2);
        FUZZ_CHECK(mw_ != nullptr, "alloc_mw: %s", std::strerror(errno));

        const void *objects[] = {ctx_, pd_, mr_, cq_, srq_, qp_, mw_};
        for (size_t i = 0; i < std::size(kKinds); ++i) {
            FUZZ_CHECK(softnda_vdev_ops.export_object(kKinds[i], objects[i], &blobs_[i]) == 0,
                       "export_object kind %d", kKinds[i]);
        }
        FUZZ_CHECK(softnda_vdev_ops.set_paused("softnda0", 1) == 0, "set_paused");
    }

    ~Templates() {
        (void)softnda_vdev_ops.set_paused("softnda0", 0);
        for (auto &b : blobs_) {
            for (uint32_t i = 0; i < b.fd_cnt; ++i) {
                close(b.fds[i]);
            }
        }
        softnda_vdev_ops.dealloc_mw(mw_);
        ext_->ops->destroy_qp(qp_);
        ext_->ops->destroy_srq(srq_);
        ext_->ops->destroy_cq(cq_);
        close(event_fd_);
        softnda_vdev_ops.dereg_mr(mr_);
        MemfdArena::free(mr_buf_);
        softnda_vdev_ops.dealloc_pd(pd_);
        softnda_driver_ops.free_context(ext_);
        softnda_vdev_ops.close_device(ctx_);
    }

    const ibv_extend_vdev_state &blob(size_t kind_index) const { return blobs_[kind_index]; }

    ibv_extend_vdev_import env(bool with_srq, bool bad_device) const {
        ibv_extend_vdev_import env{};
        env.device = bad_device ? "softnda-nosuch" : "softnda0";
        env.context = ctx_;
        env.pd = pd_;
        env.send_cq = env.recv_cq = cq_->cq;
        env.srq = with_srq ? srq_->srq : nullptr;
        env.ops = &g_ops;
        return env;
    }

    // Takes an accepted object apart with the call that destroys one of its kind.
    int destroy(ibv_extend_vdev_obj kind, void *object) const {
        switch (kind) {
            case IBV_EXTEND_VDEV_OBJ_CONTEXT:
                return softnda_vdev_ops.close_device(static_cast<ibv_context *>(object));
            case IBV_EXTEND_VDEV_OBJ_PD:
                return softnda_vdev_ops.dealloc_pd(static_cast<ibv_pd *>(object));
            case IBV_EXTEND_VDEV_OBJ_MR:
                return softnda_vdev_ops.dereg_mr(static_cast<ibv_mr *>(object));
            case IBV_EXTEND_VDEV_OBJ_CQ:
                return ext_->ops->destroy_cq(static_cast<ibv_cq_extend *>(object));
            case IBV_EXTEND_VDEV_OBJ_SRQ:
                return ext_->ops->destroy_srq(static_cast<ibv_srq_extend *>(object));
            case IBV_EXTEND_VDEV_OBJ_QP:
                return ext_->ops->destroy_qp(static_cast<ibv_qp_extend *>(object));
            case IBV_EXTEND_VDEV_OBJ_XRCD:  // no template of this kind yet (kKinds)
                return softnda_vdev_ops.close_xrcd(static_cast<ibv_xrcd *>(object));
            case IBV_EXTEND_VDEV_OBJ_MW:
                return softnda_vdev_ops.dealloc_mw(static_cast<ibv_mw *>(object));
            case IBV_EXTEND_VDEV_OBJ_DM:  // no template of this kind yet (kKinds)
                return softnda_vdev_ops.free_dm(static_cast<ibv_dm *>(object));
        }
        return -EINVAL;
    }

  private:
    ibv_context *ctx_ = nullptr;
    ibv_context_extend *ext_ = nullptr;
    ibv_pd *pd_ = nullptr;
    void *mr_buf_ = nullptr;
    ibv_mr *mr_ = nullptr;
    ibv_cq_extend *cq_ = nullptr;
    int event_fd_ = -1;
    ibv_srq_extend *srq_ = nullptr;
    ibv_qp_extend *qp_ = nullptr;
    ibv_mw *mw_ = nullptr;
    ibv_extend_vdev_state blobs_[std::size(kKinds)] = {};
};

// What relocation handed out for one input.
struct Relocated {
    std::vector<void *> memory;  // fresh arena copies of the templates' memory
};

// The templates' memory at a new address: a fresh copy of a queue allocation (or the MR's
// buffer), a fresh mapping of a doorbell page; nullptr for an address the harness never had.
void *relocate(void *arg, uint64_t old, uint64_t len) {
    auto *out = static_cast<Relocated *>(arg);
    int fd = -1;
    uint64_t off = 0;
    size_t region_len = 0;
    const void *base = nullptr;
    if (len == 0 || len > (1u << 24)) {
        return nullptr;
    }
    if (MemfdArena::instance().lookup(reinterpret_cast<void *>(old), &fd, &off, &region_len, &base)) {
        if (off + len > region_len) {
            return nullptr;
        }
        auto *copy = static_cast<uint8_t *>(MemfdArena::alloc(region_len));
        if (copy == nullptr) {
            return nullptr;
        }
        std::memcpy(copy, base, region_len);
        out->memory.push_back(copy);
        return copy + off;
    }
    if (MemfdArena::instance().lookupDb(reinterpret_cast<void *>(old), &fd, &off)) {
        if ((old & (kPage - 1)) + len > kPage) {
            return nullptr;
        }
        void *page = softnda_test::mapDoorbellPage(fd, off);
        if (page == nullptr) {
            return nullptr;
        }
        g_reloc_pages[reinterpret_cast<uintptr_t>(page)] = true;
        return static_cast<uint8_t *>(page) + (old & (kPage - 1));
    }
    return nullptr;
}

// Gives back what relocation handed out and no object kept: memory the arena still holds (the
// driver frees the queue memory of an object it destroys, never an MR's buffer) and doorbell
// pages the driver did not unmap.
void giveBack(Relocated &r) {
    for (void *p : r.memory) {
        int fd;
        uint64_t off;
        size_t len;
        const void *base;
        if (MemfdArena::instance().lookup(p, &fd, &off, &len, &base) && base == p) {
            MemfdArena::free(p);
        }
    }
    for (auto &[page, mapped] : g_reloc_pages) {
        if (mapped) {
            munmap(reinterpret_cast<void *>(page), kPage);
        }
    }
    g_reloc_pages.clear();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) {
        return 0;
    }
    const Templates &t = ibvx::fuzz::processFixture<Templates>();
    const size_t kind_index = data[0] % std::size(kKinds);
    const ibv_extend_vdev_obj kind = kKinds[kind_index];
    const uint8_t flags = data[1];
    const size_t offset = static_cast<size_t>(data[2]) | static_cast<size_t>(data[3]) << 8;
    const uint8_t *bytes = data + 4;
    const size_t n = std::min<size_t>(size - 4, IBV_EXTEND_VDEV_STATE_MAX);

    const int fds_before = ibvx::fuzz::countOpenFds();
    const size_t allocs_before = MemfdArena::instance().liveAllocs();

    const ibv_extend_vdev_state &tmpl = t.blob(kind_index);
    ibv_extend_vdev_state st{};
    if (flags & 1) {
        st.len = static_cast<uint32_t>(n);
        std::memcpy(st.data, bytes, n);
    } else {
        st = tmpl;
        for (size_t i = 0; i < n && offset + i < IBV_EXTEND_VDEV_STATE_MAX; ++i) {
            st.data[offset + i] ^= bytes[i];
        }
    }
    st.fd_cnt = (flags & 2) ? (flags >> 4) & 7u : tmpl.fd_cnt;
    const uint32_t fd_slots = std::min<uint32_t>(st.fd_cnt, IBV_EXTEND_VDEV_STATE_FDS);
    for (uint32_t i = 0; i < fd_slots; ++i) {
        st.fds[i] = i < tmpl.fd_cnt ? fcntl(tmpl.fds[i], F_DUPFD_CLOEXEC, 0) : eventfd(0, EFD_CLOEXEC);
        FUZZ_CHECK(st.fds[i] >= 0, "cannot make fd %u: %s", i, std::strerror(errno));
    }

    Relocated relocated;
    ibv_extend_vdev_import env = t.env((flags & 4) != 0, (flags & 8) != 0);
    env.relocate = relocate;
    env.arg = &relocated;
    void *object = softnda_vdev_ops.import_object(kind, &st, &env);
    if (object == nullptr) {
        for (uint32_t i = 0; i < fd_slots; ++i) {
            close(st.fds[i]);  // a refused import leaves them the caller's
        }
    } else {
        // As a restored broker does: the engine runs again, then the tenant's destroy comes.
        FUZZ_CHECK(softnda_vdev_ops.set_paused("softnda0", 0) == 0, "resume");
        const int rc = t.destroy(kind, object);
        FUZZ_CHECK(rc == 0, "an imported object of kind %d cannot be destroyed: %d", kind, rc);
        FUZZ_CHECK(softnda_vdev_ops.set_paused("softnda0", 1) == 0, "pause");
    }
    giveBack(relocated);

    FUZZ_CHECK(ibvx::fuzz::countOpenFds() == fds_before, "fds %d -> %d (kind %d, imported: %s)", fds_before,
               ibvx::fuzz::countOpenFds(), kind, object != nullptr ? "yes" : "no");
    FUZZ_CHECK(MemfdArena::instance().liveAllocs() == allocs_before, "queue allocations %zu -> %zu (kind %d)",
               allocs_before, MemfdArena::instance().liveAllocs(), kind);
    return 0;
}
