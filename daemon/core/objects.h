// The objects a session owns. Each holds the driver's object and pointers to the objects it
// uses; `users` counts the objects using it, so a destroy of something still in use fails
// with EBUSY, as libibverbs does. Guarded by the owning Session's mutex.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include <ibv_extend.h>
#include <ibv_extend_vdev.h>

#include "common/unique_fd.h"
#include "daemon/core/mapping.h"
#include "daemon/core/quota.h"

namespace ibvx::daemon {

struct Device;

enum class ObjectKind { kContext, kPd, kMr, kCq, kQp, kSrq };

const char *kindName(ObjectKind kind);

struct Object {
    explicit Object(ObjectKind k) : kind(k) {}
    virtual ~Object() = default;
    const ObjectKind kind;
    uint64_t handle = 0;
    uint32_t users = 0;
    std::vector<Object *> uses;  // every object here has users incremented for us
    QuotaCharge quota;           // what the object holds against its tenant's quotas
};

struct ContextObject : Object {
    ContextObject() : Object(ObjectKind::kContext) {}
    Device *device = nullptr;
    ibv_context *verbs = nullptr;  // the device context (vdev or libibverbs)
    ibv_context_extend *ext = nullptr;
};

struct PdObject : Object {
    PdObject() : Object(ObjectKind::kPd) {}
    ContextObject *context = nullptr;
    ibv_pd *pd = nullptr;
};

struct MrObject : Object {
    MrObject() : Object(ObjectKind::kMr) {}
    PdObject *pd = nullptr;
    ibv_mr *mr = nullptr;
    UniqueMapping mapping;  // the tenant's memory mapped in the broker
    uint64_t length = 0;
};

struct CqObject : Object {
    CqObject() : Object(ObjectKind::kCq) {}
    ContextObject *context = nullptr;
    ibv_cq_extend *cq = nullptr;
    uint64_t queue_bytes = 0;
};

struct SrqObject : Object {
    SrqObject() : Object(ObjectKind::kSrq) {}
    ContextObject *context = nullptr;
    ibv_srq_extend *srq = nullptr;
};

struct QpObject : Object {
    QpObject() : Object(ObjectKind::kQp) {}
    ContextObject *context = nullptr;
    ibv_qp_extend *qp = nullptr;
    ibv_qp_init_attr init{};
};

}  // namespace ibvx::daemon
