// Memory windows across a broker restart (SPEC.md §16 "Restart", §10): each window's binding is
// written, as the engine changes it, into a record of its context's window file, a memfd the
// context exports with its other fds. A successor maps the file again and takes the bindings
// up once every MR is back; a WQE that bound or invalidated a window and died before its CI is
// recognised by the record it wrote. The same file holds each wire responder's saved atomic
// results (SPEC.md §18 "Restart"), two records per QP.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

size_t windowPageSize() {
    static const size_t size = std::max<size_t>(4096, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    return size;
}

// Maps page i of the file (it must exist); false (errno) when mmap fails.
bool mapWindowPage(WindowFile &f, size_t i) {
    void *va = mmap(nullptr, windowPageSize(), PROT_READ | PROT_WRITE, MAP_SHARED, f.fd.get(),
                    static_cast<off_t>(i * windowPageSize()));
    if (va == MAP_FAILED) {
        return false;
    }
    f.pages.emplace_back(va, windowPageSize());
    f.owners.resize(f.pages.size() * mwRecordsPerPage(), nullptr);
    return true;
}

// One more page of records; false (errno) when the file cannot grow.
bool growWindowFile(WindowFile &f) {
    if (!f.fd.valid()) {
        f.fd.reset(memfd_create("softnda-mw", MFD_CLOEXEC));
        if (!f.fd.valid()) {
            return false;
        }
    }
    const size_t n = f.pages.size();
    if (ftruncate(f.fd.get(), static_cast<off_t>((n + 1) * windowPageSize())) < 0) {
        return false;
    }
    return mapWindowPage(f, n);
}

// The binding mw has now, as its record holds it.
MwBinding bindingOf(const Mw *mw, uint32_t by_qpn, uint32_t by_exec) {
    MwBinding b{};
    b.key = mw->key;
    if (mw->mr != nullptr) {
        b.lkey = mw->mr->key;
        b.access = static_cast<uint32_t>(mw->access);
        b.qpn = mw->qpn;
        b.addr = mw->addr;
        b.len = mw->len;
    }
    b.by_qpn = by_qpn;
    b.by_exec = by_exec;
    return b;
}

// Whether a restored binding passes the checks a bind WQE makes (mw.cc `bindable`), the binding
// QP aside: a record is memory a consumer could have written into, and must not widen access.
bool restorable(const Mw *mw, const Mr *mr, const MwBinding &b) {
    if (mr == nullptr || mr->pd != mw->pd || (mr->access & IBV_ACCESS_MW_BIND) == 0 ||
        (b.access & ~static_cast<uint32_t>(kMwAccess)) != 0 || (b.key & ~0xffu) != (mw->ib.rkey & ~0xffu)) {
        return false;
    }
    if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 &&
        (mr->access & IBV_ACCESS_LOCAL_WRITE) == 0) {
        return false;
    }
    if (mw->type == IBV_MW_TYPE_2 && (b.len == 0 || b.qpn == 0)) {
        return false;
    }
    return b.addr >= mr->iova && b.len <= mr->len && b.addr - mr->iova <= mr->len - b.len;
}

}  // namespace

uint32_t mwRecordsPerPage() {
    return static_cast<uint32_t>(windowPageSize() / sizeof(MwRecord));
}

namespace {

// A free record of f for owner, zeroed, the file grown when full; false (errno) when it cannot grow.
bool takeRecord(WindowFile &f, const void *owner, uint32_t *index) {
    auto it = std::find(f.owners.begin(), f.owners.end(), nullptr);
    if (it == f.owners.end()) {
        if (!growWindowFile(f)) {
            return false;
        }
        it = std::find(f.owners.begin(), f.owners.end(), nullptr);
    }
    *it = owner;
    *index = static_cast<uint32_t>(it - f.owners.begin());
    std::memset(f.slot(*index), 0, sizeof(MwRecord));
    return true;
}

void releaseRecord(WindowFile &f, uint32_t index) {
    std::memset(f.slot(index), 0, sizeof(MwRecord));
    f.owners[index] = nullptr;
}

}  // namespace

bool takeWindowRecord(Context *ctx, Mw *mw) {
    if (!takeRecord(ctx->windows, mw, &mw->rec_index)) {
        return false;
    }
    mw->rec = ctx->windows.record(mw->rec_index);
    return true;
}

void releaseWindowRecord(Context *ctx, Mw *mw) {
    if (mw->rec == nullptr) {
        return;
    }
    releaseRecord(ctx->windows, mw->rec_index);
    mw->rec = nullptr;
}

void takeAtomicRecords(Qp *qp) {
    for (int i = 0; i < 2; ++i) {
        __atomic_store_n(qp->recWord(kSqAtomicRecWord + i), 0u, __ATOMIC_RELAXED);  // none yet
    }
    const ibv_qp_type type = qp->init.qp_type;
    if (!qp->ctx->dev->netdev || (type != IBV_QPT_RC && type != IBV_QPT_XRC_RECV)) {
        return;  // no wire, or no atomics to answer
    }
    WindowFile &f = qp->ctx->windows;
    uint32_t index[2];
    for (int i = 0; i < 2; ++i) {
        if (!takeRecord(f, qp, &index[i])) {
            if (i == 1) {
                releaseRecord(f, index[0]);
            }
            return;  // its results stay in memory only: a restart forgets them, as before
        }
    }
    for (int i = 0; i < 2; ++i) {
        auto *rec = static_cast<AtomicRecord *>(f.slot(index[i]));
        rec->magic = kAtomicRecordMagic;
        rec->qpn = qp->qpn;
        qp->atomic_recs[i] = rec;
        qp->atomic_rec_index[i] = index[i];
        __atomic_store_n(qp->recWord(kSqAtomicRecWord + i), index[i] + 1, __ATOMIC_RELEASE);
    }
}

void adoptAtomicRecords(Qp *qp) {
    WindowFile &f = qp->ctx->windows;
    uint32_t index[2];
    for (int i = 0; i < 2; ++i) {
        // Memory the tenant can write: taken only when it names a free record that says it is
        // this QP's (the file itself is the broker's alone).
        const uint32_t named = __atomic_load_n(qp->recWord(kSqAtomicRecWord + i), __ATOMIC_ACQUIRE);
        index[i] = named - 1;
        if (named == 0 || index[i] >= f.owners.size() || f.owners[index[i]] != nullptr ||
            (i == 1 && index[1] == index[0])) {
            return;
        }
        const auto *rec = static_cast<const AtomicRecord *>(f.slot(index[i]));
        if (rec->magic != kAtomicRecordMagic || rec->qpn != qp->qpn) {
            return;
        }
    }
    for (int i = 0; i < 2; ++i) {
        f.owners[index[i]] = qp;
        qp->atomic_recs[i] = static_cast<AtomicRecord *>(f.slot(index[i]));
        qp->atomic_rec_index[i] = index[i];
    }
}

void releaseAtomicRecords(Qp *qp) {
    WindowFile &f = qp->ctx->windows;
    for (int i = 0; i < 2; ++i) {
        if (qp->atomic_recs[i] != nullptr) {
            releaseRecord(f, qp->atomic_rec_index[i]);
            qp->atomic_recs[i] = nullptr;
        }
    }
}

void persistAtomic(Qp *qp, uint32_t slot, uint32_t psn, uint64_t orig, uint32_t next) {
    AtomicRecord *rec = qp->atomic_recs[slot / 8];
    if (rec == nullptr) {
        return;
    }
    const uint32_t i = slot % 8;
    __atomic_store_n(&rec->psn1[i], 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&rec->orig[i], orig, __ATOMIC_RELEASE);  // after the slot is emptied
    __atomic_store_n(&rec->psn1[i], psn + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&qp->atomic_recs[0]->next, next, __ATOMIC_RELEASE);
}

bool savedAtomics(const Qp *qp, SavedAtomic (&out)[kSavedAtomics], uint32_t *next) {
    if (qp->atomic_recs[0] == nullptr) {
        return false;
    }
    for (uint32_t slot = 0; slot < kSavedAtomics; ++slot) {
        const AtomicRecord *rec = qp->atomic_recs[slot / 8];
        out[slot].psn1 = __atomic_load_n(&rec->psn1[slot % 8], __ATOMIC_ACQUIRE);
        out[slot].orig = __atomic_load_n(&rec->orig[slot % 8], __ATOMIC_RELAXED);
    }
    *next = __atomic_load_n(&qp->atomic_recs[0]->next, __ATOMIC_ACQUIRE) % kSavedAtomics;
    return true;
}

void clearAtomicRecords(Qp *qp) {
    for (AtomicRecord *rec : qp->atomic_recs) {
        if (rec != nullptr) {
            std::memset(rec->psn1, 0, sizeof(rec->psn1));
            rec->next = 0;
        }
    }
}

void persistBinding(Mw *mw, uint32_t by_qpn, uint32_t by_exec) {
    if (mw->rec == nullptr) {
        return;
    }
    const uint32_t next = __atomic_load_n(&mw->rec->current, __ATOMIC_RELAXED) == 0 ? 1 : 0;
    mw->rec->copy[next] = bindingOf(mw, by_qpn, by_exec);
    // The copy is whole before it becomes the current one: a kill between leaves the old one.
    __atomic_store_n(&mw->rec->current, next, __ATOMIC_RELEASE);
}

MwBinding currentBinding(const MwRecord *rec) {
    return rec->copy[__atomic_load_n(&rec->current, __ATOMIC_ACQUIRE) == 1 ? 1 : 0];
}

bool openWindowFile(int fd, WindowFile *out) {
    // No device has more windows than slots (mw.cc); a longer file is not a window file.
    constexpr uint64_t kMaxRecords = uint64_t{1} << 23;
    struct stat st {};
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        static_cast<uint64_t>(st.st_size) % windowPageSize() != 0 ||
        static_cast<uint64_t>(st.st_size) / sizeof(MwRecord) > kMaxRecords) {
        errno = EINVAL;
        return false;
    }
    WindowFile f;
    f.fd.reset(fd);
    for (size_t i = 0; i < static_cast<size_t>(st.st_size) / windowPageSize(); ++i) {
        if (!mapWindowPage(f, i)) {
            int err = errno;
            (void)f.fd.release();  // still the caller's: the import fails
            errno = err;
            return false;
        }
    }
    *out = std::move(f);
    return true;
}

void restoreWindowBindings(Device *dev) {
    for (Mw *mw : dev->mws) {
        if (mw == nullptr || !mw->restored) {
            continue;
        }
        mw->restored = false;
        const MwBinding b = currentBinding(mw->rec);
        Mr *mr = b.lkey != 0 ? dev->lookupMr(b.lkey) : nullptr;
        if (b.lkey != 0 && restorable(mw, mr, b)) {
            __atomic_fetch_add(&mr->windows, 1u, __ATOMIC_RELAXED);
            mw->mr = mr;
            mw->addr = b.addr;
            mw->len = b.len;
            mw->access = static_cast<int>(b.access);
            mw->qpn = mw->type == IBV_MW_TYPE_2 ? b.qpn : 0;
        }
        // The key byte of the last bind stands, bound or not (an invalidated window keeps it).
        if ((b.key & ~0xffu) == (mw->ib.rkey & ~0xffu)) {
            mw->key = b.key;
        }
        if (mw->mr == nullptr && b.lkey != 0) {
            persistBinding(mw, 0, 0);  // what the successor serves: unbound
        }
    }
}

}  // namespace softnda
