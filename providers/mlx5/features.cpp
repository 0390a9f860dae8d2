#include "providers/mlx5/features.h"

#include <cerrno>
#include <cstring>

namespace ibvx::mlx5 {
namespace {

constexpr uint32_t kAllAttrBits = IBV_QP_ATTR_EXTEND_MAX - 1;

bool maskInRange(int attr_mask) {
    return attr_mask >= 0 && (static_cast<uint32_t>(attr_mask) & ~kAllAttrBits) == 0;
}

}  // namespace

bool dmabufRegistrationSupported(int probe_errno) {
    return probe_errno == EBADF;
}

uint32_t extCapFor(const DeviceProbe &probe) {
    uint32_t cap = 0;
    if (dmabufRegistrationSupported(probe.dmabuf_probe_errno)) {
        cap |= IBV_EXTEND_DEV_NDR;
    }
    if (probe.custom_allocators && probe.mlx5dv_device) {
        cap |= IBV_EXTEND_DEV_NDA;
    }
    return cap;
}

void roceV2Feature(ibv_hyroce_feature *feature) {
    std::memset(feature, 0, sizeof(*feature));
    feature->type = IBV_HYPER_FEAT_RoCEv2;
    feature->version = IBV_HYPER_FEAT_V0;
    feature->sack_enable = 0;
}

bool isRoceV2Feature(const ibv_hyroce_feature &feature) {
    return feature.type == IBV_HYPER_FEAT_RoCEv2 && feature.version == IBV_HYPER_FEAT_V0 &&
           feature.sack_enable == 0;
}

int planModify(const ibv_qp_attr_extend &attr, int attr_mask, ModifyPlan *plan) {
    *plan = ModifyPlan{};
    if (!maskInRange(attr_mask)) {
        return -EINVAL;
    }
    uint32_t mask = static_cast<uint32_t>(attr_mask);
    if (mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) {
        if (attr.udp_src_port > UINT16_MAX) {
            return -EINVAL;
        }
        plan->set_udp_sport = true;
        plan->udp_sport = static_cast<uint16_t>(attr.udp_src_port);
    }
    if ((mask & IBV_QP_ATTR_EXTEND_HYROCE_FEATURE) && !isRoceV2Feature(attr.feature)) {
        plan->unsupported |= IBV_QP_ATTR_EXTEND_HYROCE_FEATURE;
    }
    plan->unsupported |=
        mask & ~uint32_t{IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE};
    if (plan->unsupported != 0) {
        plan->set_udp_sport = false;
        return -EOPNOTSUPP;
    }
    return 0;
}

int planQuery(int attr_mask, bool udp_sport_known, uint32_t *unsupported) {
    *unsupported = 0;
    if (!maskInRange(attr_mask)) {
        return -EINVAL;
    }
    uint32_t mask = static_cast<uint32_t>(attr_mask);
    if ((mask & IBV_QP_ATTR_EXTEND_UDP_SRC_PORT) && !udp_sport_known) {
        *unsupported |= IBV_QP_ATTR_EXTEND_UDP_SRC_PORT;
    }
    *unsupported |= mask & ~uint32_t{IBV_QP_ATTR_EXTEND_UDP_SRC_PORT | IBV_QP_ATTR_EXTEND_HYROCE_FEATURE};
    return *unsupported != 0 ? -EOPNOTSUPP : 0;
}

}  // namespace ibvx::mlx5
