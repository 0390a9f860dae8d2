// What the mlx5 driver answers about itself, as pure decisions the driver feeds with probe
// results: device capability bits (query_device), extended QP attributes (modify/query) and
// Hyper RoCE (query/negotiation). Kept apart from libmlx5 calls so the rules are unit-tested.
#pragma once

#include <ibv_extend.h>

#include <cstdint>

namespace ibvx::mlx5 {

// What alloc_context found out about the device.
struct DeviceProbe {
    // errno of ibv_reg_dmabuf_mr(pd, 0, 4096, 0, fd = -1, LOCAL_WRITE). EBADF means the verb
    // reached the kernel's dma-buf fd lookup, i.e. the provider, the kernel and the device
    // support dma-buf (peer) memory registration; EOPNOTSUPP / EPROTONOSUPPORT / ENOSYS mean
    // some layer does not.
    int dmabuf_probe_errno;
    // A parent domain with custom allocators could be created (mlx5 routes queue memory
    // through them; rdma-core >= 22 with a kernel that supports parent domains).
    bool custom_allocators;
    // mlx5dv_query_device() answered: the device is driven by mlx5 and its UAR doorbell pages
    // are mapped into this process, which is what db_mmap maps onward.
    bool mlx5dv_device;
};

bool dmabufRegistrationSupported(int probe_errno);

// IBV_EXTEND_DEV_NDR when dma-buf registration works; IBV_EXTEND_DEV_NDA when queue memory
// can be routed to the caller and the doorbell is a mappable UAR register.
uint32_t extCapFor(const DeviceProbe &probe);

// The only Hyper RoCE feature mlx5 has: plain RoCEv2 (V0), no selective ack.
void roceV2Feature(ibv_hyroce_feature *feature);
bool isRoceV2Feature(const ibv_hyroce_feature &feature);

// Attribute bits modify_qp applies: the UDP source port (mlx5dv_modify_qp_udp_sport) and a
// Hyper RoCE feature equal to plain RoCEv2 (what negotiation settles on; nothing to apply).
struct ModifyPlan {
    bool set_udp_sport;
    uint16_t udp_sport;
    uint32_t unsupported;  // mask bits refused with -EOPNOTSUPP (nothing is applied then)
};

// 0, -EINVAL (mask bits out of range, port > 65535) or -EOPNOTSUPP (plan->unsupported set).
int planModify(const ibv_qp_attr_extend &attr, int attr_mask, ModifyPlan *plan);

// query_qp answers UDP_SRC_PORT only for a port set through modify_qp (mlx5 cannot report the
// port the device picked itself) and HYROCE_FEATURE as RoCEv2. 0, -EINVAL or -EOPNOTSUPP with
// *unsupported set.
int planQuery(int attr_mask, bool udp_sport_known, uint32_t *unsupported);

}  // namespace ibvx::mlx5
