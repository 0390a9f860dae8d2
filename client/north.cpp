// The north-bound functions of ibv_extend.h with the reference's argument checks and return
// codes. After open, every call dispatches through context->ops, so a broker context (whose ops
// forward to the broker) and a direct one behave identically here.
#include <cerrno>

#include "client/broker_seam.h"
#include "common/c_abi.h"
#include "common/driver_ops.h"
#include "providers/loader/create_rules.h"
#include "providers/loader/extend_open.h"
#include "providers/loader/loader.h"

using ibvx::DriverOp;
using ibvx::driverOpAvailable;
using ibvx::failNull;
using ibvx::knownExtendMask;

namespace {

using ibvx::client::brokerClose;
using ibvx::client::brokerModeActive;
using ibvx::client::brokerOpen;
using ibvx::client::brokerOwns;

// The broker's create rules (providers/loader/create_rules.h) where direct mode knows the
// device's limits: a virtual device's contexts. The reference hands any values to the driver;
// a refusal here is the reference's answer for a bad argument, NULL + EINVAL. Broker contexts are
// checked by the broker itself. The QP type is the driver's to judge: a type it does not serve
// answers EOPNOTSUPP from the driver, as the broker's client answers it.
const ibvx::loader::QueueLimits *directLimits(const ibv_context_extend *context) {
    ibv_context *ctx = context->context;
    if (ctx == nullptr || ctx->device == nullptr || brokerOwns(ctx)) {
        return nullptr;
    }
    return ibvx::loader::knownQueueLimits(ctx->device);
}

bool refuse(const ibvx::loader::RuleError &error) {
    if (!error) {
        return false;
    }
    ibvx::loader::warn("%s", error->c_str());
    return true;
}

bool badQpRequest(const ibv_context_extend *context, const ibv_qp_init_attr_extend &a) {
    using namespace ibvx::loader;
    const QueueLimits *limits = directLimits(context);
    if (limits == nullptr) {
        return false;
    }
    ibv_context *ctx = context->context;
    bool members = a.pd != nullptr && a.pd->context == ctx && a.attr.send_cq != nullptr &&
                   a.attr.send_cq->context == ctx && a.attr.recv_cq != nullptr &&
                   a.attr.recv_cq->context == ctx && (a.attr.srq == nullptr || a.attr.srq->context == ctx);
    return refuse(checkDmaMode(rawEnumValue(a.type))) ||
           refuse(members ? RuleError() : RuleError(kQpMembership)) ||
           refuse(checkQpLimits(a.attr.cap, *limits));
}

bool badCqRequest(const ibv_context_extend *context, const ibv_cq_init_attr_extend &a) {
    using namespace ibvx::loader;
    const QueueLimits *limits = directLimits(context);
    return limits != nullptr &&
           (refuse(checkDmaMode(rawEnumValue(a.type))) || refuse(checkCqRequest(a.attr.cqe)) ||
            refuse(checkCqLimits(a.attr.cqe, *limits)));
}

bool badSrqRequest(const ibv_context_extend *context, const ibv_srq_init_attr_extend &a) {
    using namespace ibvx::loader;
    const QueueLimits *limits = directLimits(context);
    if (limits == nullptr) {
        return false;
    }
    bool members = a.pd != nullptr && a.pd->context == context->context;
    const ibv_srq_attr &sa = a.attr.attr;
    return refuse(checkDmaMode(rawEnumValue(a.type))) || refuse(checkSrqRequest(sa.max_wr)) ||
           refuse(members ? RuleError() : RuleError(kSrqMembership)) ||
           refuse(checkSrqLimits(sa.max_wr, sa.max_sge, *limits));
}

// A queue's create through the context's ops, with the reference's checks in its order: NULL
// arguments (EINVAL), an ops table without the entry (EOPNOTSUPP), then direct mode's create rules.
template <typename Queue, typename Attr>
Queue *createThroughOps(ibv_context_extend *context, Attr *attr,
                        Queue *(*ibv_context_extend_ops::*entry)(ibv_context *, Attr *),
                        bool (*bad)(const ibv_context_extend *, const Attr &)) {
    if (context == nullptr || attr == nullptr) {
        return failNull<Queue>(EINVAL);
    }
    if (context->ops == nullptr || context->ops->*entry == nullptr) {
        return failNull<Queue>(EOPNOTSUPP);
    }
    if (bad(context, *attr)) {
        return failNull<Queue>(EINVAL);
    }
    return (context->ops->*entry)(context->context, attr);
}

// A queue's destroy through the context's ops: -EINVAL for NULL arguments, -EOPNOTSUPP for an
// ops table without the entry.
template <typename Queue>
int destroyThroughOps(ibv_context_extend *context, Queue *queue,
                      int (*ibv_context_extend_ops::*entry)(Queue *)) {
    if (context == nullptr || queue == nullptr) {
        return -EINVAL;
    }
    if (context->ops == nullptr || context->ops->*entry == nullptr) {
        return -EOPNOTSUPP;
    }
    return (context->ops->*entry)(queue);
}

}  // namespace

extern "C" {

const char *ibv_extend_get_version(uint32_t *major, uint32_t *minor, uint32_t *patch) {
    if (major != nullptr) {
        *major = IBV_EXTEND_VERSION_MAJOR;
    }
    if (minor != nullptr) {
        *minor = IBV_EXTEND_VERSION_MINOR;
    }
    if (patch != nullptr) {
        *patch = IBV_EXTEND_VERSION_PATCH;
    }
    return IBV_EXTEND_VERSION_STRING;
}

int ibv_extend_check_version(uint32_t driver_major, uint32_t driver_minor, uint32_t driver_patch) {
    if (driver_major != IBV_EXTEND_VERSION_MAJOR || driver_minor > IBV_EXTEND_VERSION_MINOR) {
        return -1;
    }
    if (driver_minor == IBV_EXTEND_VERSION_MINOR && driver_patch > IBV_EXTEND_VERSION_PATCH) {
        return -1;
    }
    return 0;
}

struct ibv_context_extend *ibv_open_extend(struct ibv_context *context) {
    if (context == nullptr) {
        return failNull<ibv_context_extend>(EINVAL);
    }
    // A broker context (the libibverbs face's ibv_open_device) is the broker's in any mode.
    if (brokerOwns(context) || brokerModeActive()) {
        return brokerOpen(context);
    }
    const verbs_device_extend_ops *drv = ibvx::loader::findDriver(context->device);
    ibvx::loader::ExtendOpen open = ibvx::loader::openExtendContext(drv, context);
    switch (open.refusal) {
        case ibvx::loader::ExtendRefusal::kNone:
            return open.ext;
        case ibvx::loader::ExtendRefusal::kNoDriver:
            ibvx::loader::warn("no available ops for open extend context");
            return failNull<ibv_context_extend>(EOPNOTSUPP);
        case ibvx::loader::ExtendRefusal::kDriverFailed:
            errno = open.err;
            return nullptr;
        case ibvx::loader::ExtendRefusal::kBadVersion:
            ibvx::loader::warn("driver '%s' returned ops version %d, supported 1..%d; context refused",
                               drv->name, open.version, IBV_EXTEND_DRIVER_VERSION_MAX);
            return failNull<ibv_context_extend>(EOPNOTSUPP);
    }
    return failNull<ibv_context_extend>(EOPNOTSUPP);
}

int ibv_close_extend(struct ibv_context_extend *context) {
    if (context == nullptr || context->context == nullptr) {
        return -EINVAL;
    }
    if (brokerOwns(context->context)) {
        return brokerClose(context);
    }
    const verbs_device_extend_ops *drv = ibvx::loader::findDriver(context->context->device);
    if (drv == nullptr) {
        return -ENOENT;
    }
    if (drv->free_context != nullptr) {
        drv->free_context(context);
    }
    return 0;
}

int ibv_query_device_extend(struct ibv_context_extend *context, struct ibv_device_attr_extend *ext_dev_attr) {
    if (context == nullptr || ext_dev_attr == nullptr) {
        return -EINVAL;
    }
    if (context->ops == nullptr || context->ops->query_device == nullptr) {
        return -EOPNOTSUPP;
    }
    ext_dev_attr->ext_cap = 0;
    return context->ops->query_device(context->context, ext_dev_attr);
}

struct ibv_qp_extend *ibv_create_qp_extend(struct ibv_context_extend *context,
                                           struct ibv_qp_init_attr_extend *qp_init_attr) {
    return createThroughOps(context, qp_init_attr, &ibv_context_extend_ops::create_qp, badQpRequest);
}

struct ibv_cq_extend *ibv_create_cq_extend(struct ibv_context_extend *context,
                                           struct ibv_cq_init_attr_extend *cq_init_attr) {
    return createThroughOps(context, cq_init_attr, &ibv_context_extend_ops::create_cq, badCqRequest);
}

struct ibv_srq_extend *ibv_create_srq_extend(struct ibv_context_extend *context,
                                             struct ibv_srq_init_attr_extend *srq_init_attr) {
    return createThroughOps(context, srq_init_attr, &ibv_context_extend_ops::create_srq, badSrqRequest);
}

int ibv_destroy_qp_extend(struct ibv_context_extend *context, struct ibv_qp_extend *qp_extend) {
    return destroyThroughOps(context, qp_extend, &ibv_context_extend_ops::destroy_qp);
}

int ibv_destroy_cq_extend(struct ibv_context_extend *context, struct ibv_cq_extend *cq_extend) {
    return destroyThroughOps(context, cq_extend, &ibv_context_extend_ops::destroy_cq);
}

int ibv_destroy_srq_extend(struct ibv_context_extend *context, struct ibv_srq_extend *srq_extend) {
    return destroyThroughOps(context, srq_extend, &ibv_context_extend_ops::destroy_srq);
}

int ibv_modify_qp_extend(struct ibv_context_extend *context, struct ibv_qp_attr_extend *attr, int attr_mask) {
    if (context == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    if (!driverOpAvailable(context->ops, DriverOp::kModifyQp) || !knownExtendMask(attr_mask)) {
        return -EOPNOTSUPP;
    }
    return context->ops->modify_qp(context->context, attr, attr_mask);
}

int ibv_query_qp_extend(struct ibv_context_extend *context, struct ibv_qp_attr_extend *attr, int attr_mask) {
    if (context == nullptr || attr == nullptr) {
        return -EINVAL;
    }
    if (!driverOpAvailable(context->ops, DriverOp::kQueryQp) || !knownExtendMask(attr_mask)) {
        return -EOPNOTSUPP;
    }
    return context->ops->query_qp(context->context, attr, attr_mask);
}

int ibv_query_qp_supported_hyroce_feature(struct ibv_context_extend *context, struct ibv_qp *qp, uint32_t sl,
                                          uint32_t tc, struct ibv_hyroce_feature *feature) {
    if (context == nullptr || qp == nullptr || feature == nullptr) {
        return -EINVAL;
    }
    if (!driverOpAvailable(context->ops, DriverOp::kQueryHyroceFeature)) {
        return -EOPNOTSUPP;
    }
    return context->ops->query_qp_supported_hyroce_feature(context->context, qp, sl, tc, feature);
}

int ibv_nego_qp_hyroce_feature(struct ibv_context_extend *context, struct ibv_qp *qp,
                               const struct ibv_hyroce_feature *input, struct ibv_hyroce_feature *output,
                               uint32_t *need_more_nego) {
    if (context == nullptr || qp == nullptr || input == nullptr || output == nullptr ||
        need_more_nego == nullptr) {
        return -EINVAL;
    }
    if (!driverOpAvailable(context->ops, DriverOp::kNegoHyroceFeature)) {
        return -EOPNOTSUPP;
    }
    return context->ops->nego_qp_hyroce_feature(context->context, qp, input, output, need_more_nego);
}

}  // extern "C"
