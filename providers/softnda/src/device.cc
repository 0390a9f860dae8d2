// Devices, contexts and the doorbell BAR: the part of softnda that exists before any queue.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <system_error>

#include "common/fd_kind.h"
#include "providers/softnda/src/netdev.h"
#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

struct Registry {
    std::mutex mu;  // everything below
    Config cfg;
    bool devices_stale = true;  // cfg changed since the devices were made
    std::vector<std::unique_ptr<Device>> devices;
    uint32_t open_contexts = 0;
};

// Never destroyed: engine threads and other modules may still reach it during exit.
Registry &registry() {
    static Registry *r = [] {
        auto *reg = new Registry;
        configFromEnv(reg->cfg);
        return reg;
    }();
    return *r;
}

// Doorbell pages by engine address, for export_mmio (leaf lock).
struct MmioEntry {
    int fd;
    uint64_t off;
};
std::mutex &mmioMutex() {
    static auto *mu = new std::mutex;
    return *mu;
}
std::map<uintptr_t, MmioEntry> &mmioPages() {
    static auto *m = new std::map<uintptr_t, MmioEntry>;
    return *m;
}

void fillAttr(Device &d) {
    ibv_extend_vdev_attr &a = d.attr;
    std::memset(&a, 0, sizeof(a));
    std::snprintf(a.name, sizeof(a.name), "%s", d.name.c_str());
    a.phys_port_cnt = d.cfg.phys_port_cnt;
    a.max_pd = d.cfg.max_pd;
    a.max_mr = d.cfg.max_mr;
    a.max_qp = d.cfg.max_qp;
    a.max_cq = d.cfg.max_cq;
    a.max_srq = d.cfg.max_srq;
    a.max_qp_wr = d.cfg.max_qp_wr;
    a.max_cqe = d.cfg.max_cqe;
    a.max_srq_wr = d.cfg.max_srq_wr;
    a.max_sge = d.cfg.max_sge;
    a.max_inline_data = d.cfg.max_inline_data;
    a.max_msg_sz = d.cfg.max_msg_sz;
    a.max_mr_size = d.cfg.max_mr_size;
    a.max_dm_size = d.cfg.dm_size;
}

// Caller holds Registry::mu. Applies a changed configuration while no device is open (devices
// own nothing then); devices that stay keep their identity and counters.
void ensureDevices(Registry &r) {
    if (!r.devices_stale || r.open_contexts != 0) {
        return;
    }
    // Bound to interfaces, there is one device per interface, in the order listed (SPEC.md §19).
    const auto count = r.cfg.netdevs.empty() ? r.cfg.devices : static_cast<uint32_t>(r.cfg.netdevs.size());
    if (r.devices.size() > count) {
        r.devices.resize(count);
    }
    for (auto i = static_cast<uint32_t>(r.devices.size()); i < count; ++i) {
        auto d = std::make_unique<Device>();
        d->magic = kMagicDevice;
        d->name = "softnda" + std::to_string(i);
        d->index = i;
        d->guid = deviceGuid(i);
        d->cfg = r.cfg;
        d->ib.node_type = IBV_NODE_CA;
        d->ib.transport_type = IBV_TRANSPORT_IB;
        std::snprintf(d->ib.name, sizeof(d->ib.name), "%s", d->name.c_str());
        std::snprintf(d->ib.dev_name, sizeof(d->ib.dev_name), "%s", d->name.c_str());
        r.devices.push_back(std::move(d));
    }
    for (auto &d : r.devices) {
        d->cfg = r.cfg;
        d->netdev.reset();
        if (!r.cfg.netdevs.empty()) {
            // A RoCE port is one interface: an Ethernet device has one port.
            d->cfg.phys_port_cnt = 1;
            d->netdev = std::make_shared<Netdev>();
            d->netdev->name = r.cfg.netdevs[d->index];
        }
        fillAttr(*d);
    }
    r.devices_stale = false;
}

// The device called name, of the devices as configured now; nullptr when there is none.
// Caller holds Registry::mu.
Device *deviceNamed(Registry &r, const char *name) {
    ensureDevices(r);
    for (auto &d : r.devices) {
        if (d->name == name) {
            return d.get();
        }
    }
    return nullptr;
}

// One page of a BAR file mapped for the engine, at offset off; nullptr (errno) when mmap fails.
std::unique_ptr<DbPage> mapBarPage(int bar_fd, uint64_t off) {
    auto page = std::make_unique<DbPage>();
    void *va = mmap(nullptr, SOFTNDA_DB_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, bar_fd,
                    static_cast<off_t>(off));
    if (va == MAP_FAILED) {
        return nullptr;
    }
    page->mapping = ibvx::UniqueMapping(va, SOFTNDA_DB_PAGE_SIZE);
    page->va = static_cast<uint8_t *>(va);
    page->file_off = off;
    return page;
}

// Makes a mapped page one of ctx's, under the device page number it holds (free in
// Device::pages): export_mmio finds it and the engine scans it. Caller holds dev->ctl.
DbPage *attachPage(Context *ctx, std::unique_ptr<DbPage> owned) {
    Device *dev = ctx->dev;
    DbPage *page = owned.get();
    page->ctx = ctx;
    ctx->pages.push_back(page);
    owned.release();  // ctx->pages owns it now (dropBar)
    {
        std::lock_guard<std::mutex> ml(mmioMutex());
        mmioPages()[reinterpret_cast<uintptr_t>(page->va)] = MmioEntry{ctx->bar_fd, page->file_off};
    }
    dev->gate.lock();
    {
        std::lock_guard<std::mutex> pl(dev->pages_mu);
        dev->pages[page->page_no] = page;
    }
    if (dev->engine) {
        dev->engine->addPage(page);
    }
    dev->gate.unlock();
    return page;
}

// Adds one 4 KiB doorbell page to ctx's BAR. Caller holds dev->ctl.
DbPage *growBar(Context *ctx) {
    Device *dev = ctx->dev;
    if (ctx->bar_fd < 0) {
        // The tenant maps its doorbells from this memfd, so it holds a descriptor to it: sealed
        // against shrinking, or an ftruncate of the tenant's would end the engine's next scan
        // with SIGBUS. It only grows, a page at a time.
        ctx->bar_fd = memfd_create("softnda-bar", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (ctx->bar_fd < 0) {
            return nullptr;
        }
        if (fcntl(ctx->bar_fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
            ::close(ctx->bar_fd);
            ctx->bar_fd = -1;
            return nullptr;
        }
    }
    const uint64_t stride = dbPageStride();
    uint64_t off = static_cast<uint64_t>(ctx->bar_pages) * stride;
    if (ftruncate(ctx->bar_fd, static_cast<off_t>(off + stride)) < 0) {
        return nullptr;
    }
    std::unique_ptr<DbPage> page = mapBarPage(ctx->bar_fd, off);
    if (page == nullptr) {
        return nullptr;
    }
    {
        std::lock_guard<std::mutex> pl(dev->pages_mu);
        if (!dev->free_page_nos.empty()) {
            page->page_no = dev->free_page_nos.back();
            dev->free_page_nos.pop_back();
        } else {
            page->page_no = static_cast<uint32_t>(dev->pages.size());
            dev->pages.push_back(nullptr);
        }
    }
    ctx->bar_pages++;
    return attachPage(ctx, std::move(page));
}

// Unmaps every page of ctx (no queue may use them any more). Caller holds dev->ctl.
void dropBar(Context *ctx) {
    Device *dev = ctx->dev;
    dev->gate.lock();
    for (DbPage *page : ctx->pages) {
        if (dev->engine) {
            dev->engine->removePage(page);
        }
        std::lock_guard<std::mutex> pl(dev->pages_mu);
        dev->pages[page->page_no] = nullptr;
        dev->free_page_nos.push_back(page->page_no);
    }
    dev->gate.unlock();
    for (DbPage *page : ctx->pages) {
        {
            std::lock_guard<std::mutex> ml(mmioMutex());
            mmioPages().erase(reinterpret_cast<uintptr_t>(page->va));
        }
        delete page;
    }
    ctx->pages.clear();
    if (ctx->bar_fd >= 0) {
        close(ctx->bar_fd);
        ctx->bar_fd = -1;
    }
}

// The BAR of a context an earlier process opened (import): its file, its pages mapped again in
// this process under the device page numbers they had, and its async eventfd.
struct RestoredBar {
    int bar_fd = -1;
    int async_fd = -1;
    std::vector<std::unique_ptr<DbPage>> pages;
};

// Takes device page number no for an imported page (Device::pages_mu held): false when it is in use.
bool claimPageNo(Device *dev, uint32_t no) {
    if (no < dev->pages.size()) {
        auto it = std::find(dev->free_page_nos.begin(), dev->free_page_nos.end(), no);
        if (dev->pages[no] != nullptr || it == dev->free_page_nos.end()) {
            return false;
        }
        dev->free_page_nos.erase(it);
        return true;
    }
    while (dev->pages.size() < no) {
        dev->free_page_nos.push_back(static_cast<uint32_t>(dev->pages.size()));
        dev->pages.push_back(nullptr);
    }
    dev->pages.push_back(nullptr);
    return true;
}

// Every context comes to be here, opened new (restored == nullptr: its BAR grows with its
// queues) or imported over the BAR an earlier process left (restored). The first context of a
// device starts its engine. Caller holds Registry::mu and dev->ctl. NULL + errno.
ibv_context *startContext(Registry &r, Device *dev, RestoredBar *restored) {
    auto ctx = std::make_unique<Context>();
    ctx->magic = kMagicContext;
    ctx->dev = dev;
    ctx->ib.device = &dev->ib;
    ctx->ib.cmd_fd = -1;
    ctx->ib.async_fd = -1;
    ctx->ib.num_comp_vectors = 0;
    if (dev->open_contexts == 0) {
        try {
            dev->engine = std::make_unique<Engine>(dev, dev->cfg.engine_threads);
        } catch (const std::system_error &) {
            errno = EAGAIN;  // no thread for the engine
            return nullptr;
        }
    }
    dev->open_contexts++;
    r.open_contexts++;
    if (restored != nullptr) {
        ctx->bar_fd = restored->bar_fd;
        ctx->async_fd = restored->async_fd;
        ctx->bar_pages = static_cast<uint32_t>(restored->pages.size());
        for (auto &page : restored->pages) {
            {
                std::lock_guard<std::mutex> pl(dev->pages_mu);
                claimPageNo(dev, page->page_no);  // free: importContext checked under the same ctl
            }
            attachPage(ctx.get(), std::move(page));
        }
    }
    return &ctx.release()->ib;
}

}  // namespace

uint64_t dbPageStride() {
    static const uint64_t stride =
        std::max<uint64_t>(SOFTNDA_DB_PAGE_SIZE, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
    return stride;
}

// A pointer is trusted only once the ibv_context it names is one of ours (its device is one of
// our devices, checked by address), so a foreign object is never read beyond its public struct.
// Each object struct starts with its ibv_* member, so the public pointer is the object's address.
static bool ownContext(ibv_context *ib) {
    if (ib == nullptr) {
        return false;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (auto &d : r.devices) {
        if (&d->ib == ib->device) {
            return reinterpret_cast<Context *>(ib)->magic == kMagicContext;
        }
    }
    return false;
}

template <typename T, typename Ib>
static T *checked(Ib *ib, uint64_t magic) {
    if (ib == nullptr || !ownContext(ib->context)) {
        return nullptr;
    }
    auto *o = reinterpret_cast<T *>(ib);
    return o->magic == magic ? o : nullptr;
}

Context *asContext(ibv_context *ib) {
    return ownContext(ib) ? reinterpret_cast<Context *>(ib) : nullptr;
}
Pd *asPd(ibv_pd *ib) {
    return checked<Pd>(ib, kMagicPd);
}
Qp *asQp(ibv_qp *ib) {
    return checked<Qp>(ib, kMagicQp);
}
Cq *asCq(ibv_cq *ib) {
    return checked<Cq>(ib, kMagicCq);
}
Srq *asSrq(ibv_srq *ib) {
    return checked<Srq>(ib, kMagicSrq);
}
Mr *asMr(ibv_mr *ib) {
    return checked<Mr>(ib, kMagicMr);
}
// The live domains. Its lock is a leaf, taken under Device::ctl (open and close hold it), so it
// is not the registry's (taken before ctl). Never destroyed, as the registry.
struct LiveXrcds {
    std::mutex mu;
    std::set<const Xrcd *> set;
};
static LiveXrcds &liveXrcds() {
    static auto *live = new LiveXrcds;
    return *live;
}

Xrcd *asXrcd(ibv_xrcd *ib) {
    LiveXrcds &live = liveXrcds();
    std::lock_guard<std::mutex> lk(live.mu);
    auto *x = reinterpret_cast<Xrcd *>(ib);
    return live.set.count(x) != 0 && x->magic == kMagicXrcd ? x : nullptr;
}
void registerXrcd(Xrcd *x) {
    LiveXrcds &live = liveXrcds();
    std::lock_guard<std::mutex> lk(live.mu);
    live.set.insert(x);
}
void unregisterXrcd(Xrcd *x) {
    LiveXrcds &live = liveXrcds();
    std::lock_guard<std::mutex> lk(live.mu);
    live.set.erase(x);
}
Mw *asMw(ibv_mw *ib) {
    return checked<Mw>(ib, kMagicMw);
}
Dm *asDm(ibv_dm *ib) {
    return checked<Dm>(ib, kMagicDm);
}

int reserveDbSlot(Context *ctx, ibv_extend_ops *ops, int dma_type, DbSlot *out) {
    DbPage *page = nullptr;
    for (DbPage *p : ctx->pages) {
        if (p->used != ~0ull) {
            page = p;
            break;
        }
    }
    if (page == nullptr) {
        page = growBar(ctx);
        if (page == nullptr) {
            return -ENOMEM;
        }
    }
    unsigned idx = static_cast<unsigned>(__builtin_ctzll(~page->used));
    static_assert(SOFTNDA_DB_REGS_PER_PAGE <= 256, "DbSlot::index is a byte");
    DbSlot s;
    s.page = page;
    s.index = static_cast<uint8_t>(idx);
    s.ub_res = dma_type == QU_BUF_DMA_MODE_INDEP_UB;
    doorbell_map_desc desc = slotDesc(s);
    // The register starts at the queue's initial PI (0) so a sweep sees no stale ring.
    __atomic_store_n(page->reg(idx), 0u, __ATOMIC_RELAXED);
    s.mapped = ops->db_mmap(&desc);
    if (s.mapped == nullptr) {
        return -(errno != 0 ? errno : ENOMEM);
    }
    page->used |= 1ull << idx;
    *out = s;
    return 0;
}

void publishDbSlot(Device *dev, DbSlot *slot, SlotKind kind, void *owner, Origin origin) {
    DbPage *page = slot->page;
    const unsigned idx = slot->index;
    page->used |= 1ull << idx;  // an imported register is taken only now
    dev->gate.lock();
    page->kind[idx] = kind;
    page->owner[idx] = owner;
    // last_seen is the owning engine thread's otherwise; no pass runs while the gate is held. A
    // new register holds 0; an imported one is taken as it is (the ring itself is read from the
    // record), and its summary bit makes the first pass after the resume look at the queue.
    if (origin == Origin::Imported) {
        page->last_seen[idx] = __atomic_load_n(page->reg(idx), __ATOMIC_ACQUIRE);
        __atomic_fetch_or(page->summary(), 1ull << idx, __ATOMIC_RELAXED);
    } else {
        page->last_seen[idx] = 0;
    }
    dev->gate.unlock();
}

doorbell_map_desc slotDesc(const DbSlot &slot) {
    doorbell_map_desc desc;
    std::memset(&desc, 0, sizeof(desc));
    desc.size = SOFTNDA_DB_REG_STRIDE;
    uintptr_t reg = reinterpret_cast<uintptr_t>(slot.page->reg(slot.index));
    if (slot.ub_res) {
        desc.type = DB_MAP_MODE_UB_RES;
        desc.ub_res.guid_l = slot.page->ctx->dev->guid;
        desc.ub_res.guid_h = kGuidHigh;
        desc.ub_res.bits.resource_id = SOFTNDA_UB_RESOURCE_DOORBELL;
        desc.ub_res.bits.offset = static_cast<uint64_t>(slot.page->page_no) * SOFTNDA_DB_PAGE_SIZE +
                                  (reg & (SOFTNDA_DB_PAGE_SIZE - 1));
    } else {
        desc.type = DB_MAP_MODE_HOST_VA;
        desc.hva = reg;
    }
    return desc;
}

void releaseDbSlot(Context *ctx, ibv_extend_ops *ops, DbSlot *slot) {
    if (slot->page == nullptr) {
        return;
    }
    Device *dev = ctx->dev;
    dev->gate.lock();
    slot->page->kind[slot->index] = SlotKind::Free;
    slot->page->owner[slot->index] = nullptr;
    __atomic_fetch_and(slot->page->summary(), ~(1ull << slot->index), __ATOMIC_RELAXED);
    dev->gate.unlock();
    if (slot->mapped != nullptr) {
        doorbell_map_desc desc = slotDesc(*slot);
        ops->db_unmap(slot->mapped, &desc);
    }
    slot->page->used &= ~(1ull << slot->index);
    slot->page = nullptr;
}

int vdevConfigure(const char *key, const char *value) {
    if (key == nullptr || value == nullptr) {
        return -EINVAL;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    // An unknown key or a bad value is refused (-EINVAL) whether or not devices are open: the
    // broker makes that a configuration error, where -EBUSY only means "valid, but not while a
    // device is open" (a reload under load).
    Config trial = r.cfg;
    if (int rc = configSet(trial, key, value); rc < 0) {
        return rc;
    }
    if (r.open_contexts != 0) {
        return -EBUSY;
    }
    r.cfg = trial;
    r.devices_stale = true;
    return 0;
}

int vdevQueryDevices(ibv_extend_vdev_attr *attrs, int max) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    ensureDevices(r);
    int n = static_cast<int>(r.devices.size());
    for (int i = 0; i < n && i < max && attrs != nullptr; ++i) {
        attrs[i] = r.devices[static_cast<size_t>(i)]->attr;
    }
    return n;
}

ibv_context *vdevOpenDevice(const char *name) {
    if (name == nullptr) {
        errno = EINVAL;
        return nullptr;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    Device *dev = deviceNamed(r, name);
    if (dev == nullptr) {
        errno = ENODEV;
        return nullptr;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    return startContext(r, dev, nullptr);
}

int vdevCloseDevice(ibv_context *context) {
    Context *ctx = asContext(context);
    if (ctx == nullptr) {
        return -EINVAL;
    }
    Device *dev = ctx->dev;
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    {
        std::lock_guard<std::mutex> ctl(dev->ctl);
        if (ctx->objects != 0) {
            return -EBUSY;
        }
        dropBar(ctx);
        if (ctx->async_fd >= 0) {
            ::close(ctx->async_fd);  // no object is left to raise an event on it
            ctx->async_fd = -1;
        }
    }
    if (--dev->open_contexts == 0) {
        std::unique_ptr<Engine> engine;
        {
            std::lock_guard<std::mutex> ctl(dev->ctl);
            engine = std::move(dev->engine);
        }
        softnda_counters c{};
        engine->addCounters(&c);
        engine.reset();  // joins the threads
        bump(dev->retired.wqes, c.wqes_executed);
        bump(dev->retired.bytes, c.bytes);
        bump(dev->retired.doorbells, c.doorbells);
        bump(dev->retired.cqes, c.cqes);
        bump(dev->retired.errors, c.errors);
        bump(dev->retired.flushed, c.flushed);
        bump(dev->retired.rnr_naks, c.rnr_naks);
        bump(dev->retired.cq_overflows, c.cq_overflows);
        bump(dev->retired.dropped_cqes, c.dropped_cqes);
        bump(dev->retired.srq_limit_events, c.srq_limit_events);
        bump(dev->retired.passes, c.passes);
        bump(dev->retired.sleeps, c.sleeps);
        bump(dev->retired.wakeups, c.wakeups_by_hint);
        bump(dev->retired.sweeps, c.sweeps);
        bump(dev->retired.wire_tx, c.wire_tx_packets);
        bump(dev->retired.wire_rx, c.wire_rx_packets);
        bump(dev->retired.wire_retransmits, c.wire_retransmits);
        bump(dev->retired.wire_seq_naks, c.wire_seq_naks);
        bump(dev->retired.wire_bad_icrc, c.wire_bad_icrc);
        bump(dev->retired.wire_malformed, c.wire_malformed);
        bump(dev->retired.wire_fault_drops, c.wire_fault_drops);
    }
    r.open_contexts--;
    ctx->magic = 0;
    delete ctx;
    return 0;
}

int vdevSetPaused(const char *device, int paused) {
    if (device == nullptr) {
        return -ENODEV;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    Device *dev = deviceNamed(r, device);
    if (dev == nullptr) {
        return -ENODEV;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (paused != 0) {
        dev->paused.store(true, std::memory_order_release);
        // A pass in progress holds the gate shared: taking it once waits for the pass to end,
        // and every later pass reads the flag inside the gate.
        dev->gate.lock();
        dev->gate.unlock();
    } else if (dev->paused.exchange(false, std::memory_order_acq_rel) && dev->engine) {
        restoreWindowBindings(dev);  // every MR an import brings back is back
        dev->engine->resume();
    }
    return 0;
}

namespace {

// Whether an import's BAR can be a context's: a regular file holding n pages, an eventfd (or
// none) for the async events, and n distinct page numbers in range.
bool validRestoredBar(int bar_fd, int async_fd, const uint32_t *page_nos, uint32_t n) {
    // Device page numbers are dense in practice; a number far beyond any device's is garbage.
    constexpr uint32_t kMaxPageNo = 1u << 22;
    struct stat st {};
    if ((n > 0 && bar_fd < 0) ||
        (bar_fd >= 0 && (fstat(bar_fd, &st) < 0 || !S_ISREG(st.st_mode) ||
                         static_cast<uint64_t>(st.st_size) < n * dbPageStride())) ||
        (async_fd >= 0 && !ibvx::isEventFd(async_fd))) {
        return false;
    }
    for (uint32_t i = 0; i < n; ++i) {
        if (page_nos[i] >= kMaxPageNo || std::find(page_nos, page_nos + i, page_nos[i]) != page_nos + i) {
            return false;
        }
    }
    return true;
}

// Whether no context of this process has any of the page numbers (caller holds dev->ctl).
bool pageNosFree(Device *dev, const uint32_t *page_nos, uint32_t n) {
    std::lock_guard<std::mutex> pl(dev->pages_mu);
    for (uint32_t i = 0; i < n; ++i) {
        if (page_nos[i] < dev->pages.size() && dev->pages[page_nos[i]] != nullptr) {
            return false;
        }
    }
    return true;
}

// Maps the n pages of bar_fd (page i at i * stride) as device pages page_nos[i]; false (errno)
// when a mapping fails, leaving none.
bool mapRestoredPages(int bar_fd, const uint32_t *page_nos, uint32_t n,
                      std::vector<std::unique_ptr<DbPage>> *out) {
    for (uint32_t i = 0; i < n; ++i) {
        std::unique_ptr<DbPage> page = mapBarPage(bar_fd, i * dbPageStride());
        if (page == nullptr) {
            int err = errno;
            out->clear();
            errno = err;
            return false;
        }
        page->page_no = page_nos[i];
        out->push_back(std::move(page));
    }
    return true;
}

}  // namespace

ibv_context *importContext(const char *name, int bar_fd, int async_fd, const uint32_t *page_nos, uint32_t n) {
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    Device *dev = name != nullptr ? deviceNamed(r, name) : nullptr;
    if (dev == nullptr) {
        errno = ENODEV;
        return nullptr;
    }
    if (!devicePaused(dev)) {
        errno = EBUSY;
        return nullptr;
    }
    if (!validRestoredBar(bar_fd, async_fd, page_nos, n)) {
        errno = EINVAL;
        return nullptr;
    }
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (!pageNosFree(dev, page_nos, n)) {
        errno = EINVAL;  // another context has one of them now
        return nullptr;
    }
    RestoredBar restored{bar_fd, async_fd, {}};
    if (!mapRestoredPages(bar_fd, page_nos, n, &restored.pages)) {
        return nullptr;
    }
    return startContext(r, dev, &restored);
}

int vdevIsOwnDevice(const ibv_device *dev) {
    if (dev == nullptr) {
        return 0;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    for (auto &d : r.devices) {
        if (&d->ib == dev) {
            return 1;
        }
    }
    return 0;
}

int vdevExportMmio(const void *addr, int *fd, uint64_t *offset) {
    if (addr == nullptr || fd == nullptr || offset == nullptr) {
        return -EINVAL;
    }
    uintptr_t page = reinterpret_cast<uintptr_t>(addr) & ~static_cast<uintptr_t>(SOFTNDA_DB_PAGE_SIZE - 1);
    std::lock_guard<std::mutex> ml(mmioMutex());
    auto it = mmioPages().find(page);
    if (it == mmioPages().end()) {
        return -ENOENT;
    }
    int dup_fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) {
        return -errno;
    }
    *fd = dup_fd;
    *offset = it->second.off;
    return 0;
}

}  // namespace softnda

using namespace softnda;

extern "C" __attribute__((visibility("default"))) int softnda_query_counters(const char *dev_name,
                                                                             struct softnda_counters *out) {
    if (dev_name == nullptr || out == nullptr) {
        return -EINVAL;
    }
    Registry &r = registry();
    std::lock_guard<std::mutex> lk(r.mu);
    Device *dev = deviceNamed(r, dev_name);
    if (dev == nullptr) {
        return -ENODEV;
    }
    std::memset(out, 0, sizeof(*out));
    addCounters(dev->retired, out);
    std::lock_guard<std::mutex> ctl(dev->ctl);
    if (dev->engine) {
        dev->engine->addCounters(out);
    }
    return 0;
}

extern "C" __attribute__((visibility("default"))) void *softnda_ub_resolve(uint64_t guid_l, uint64_t guid_h,
                                                                           uint32_t resource_id,
                                                                           uint64_t offset) {
    if (guid_h != kGuidHigh || resource_id != SOFTNDA_UB_RESOURCE_DOORBELL) {
        errno = ENODEV;
        return nullptr;
    }
    // Registry::mu is not taken: this runs inside a db_mmap callback of a create call.
    // Devices are only rebuilt while no context is open, and a caller resolving a doorbell
    // has one open.
    Registry &r = registry();
    for (auto &d : r.devices) {
        if (d->guid != guid_l) {
            continue;
        }
        std::lock_guard<std::mutex> pl(d->pages_mu);
        uint64_t no = offset / SOFTNDA_DB_PAGE_SIZE;
        if (no >= d->pages.size() || d->pages[no] == nullptr) {
            errno = ERANGE;
            return nullptr;
        }
        return d->pages[no]->va + (offset % SOFTNDA_DB_PAGE_SIZE);
    }
    errno = ENODEV;
    return nullptr;
}
