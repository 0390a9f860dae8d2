// What a face context answers about its device: attributes, ports and GIDs from the broker's
// device (QueryDeviceAttr, QueryPort), and the default P_Key table.
#include <algorithm>
#include <cerrno>
#include <cstring>

#include "client/broker/convert.h"
#include "client/broker/session.h"
#include "client/verbs/face.h"
#include "client/verbs/verbs_private.h"

namespace ibvx::client::verbs {
namespace {

int queryPortInfo(ShadowContext *c, uint8_t port, pb::QueryPortResponse *resp) {
    pb::QueryPortRequest req;
    req.set_context(c->handle);
    req.set_port_num(port);
    return c->session->call("QueryPort", &pb::Broker::Stub::QueryPort, req, resp);
}

}  // namespace

int queryDeviceAttr(ShadowContext *c, ibv_device_attr *attr, uint64_t *max_dm_size) {
    pb::QueryDeviceAttrRequest req;
    req.set_context(c->handle);
    pb::QueryDeviceAttrResponse resp;
    int rc = c->session->call("QueryDeviceAttr", &pb::Broker::Stub::QueryDeviceAttr, req, &resp);
    if (rc == 0) {
        wire::fromProto(resp.attr(), attr);
        if (max_dm_size != nullptr) {
            *max_dm_size = resp.max_dm_size();
        }
    }
    return rc;
}

int faceQueryPort(ibv_context *context, uint8_t port, ibv_port_attr *attr, size_t attr_len) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    pb::QueryPortResponse resp;
    if (int rc = queryPortInfo(c, port, &resp); rc != 0) {
        return -rc;
    }
    ibv_port_attr full{};
    wire::fromProto(resp.attr(), &full);
    memcpy(attr, &full, std::min(attr_len, sizeof(full)));
    return 0;
}

// The standard attributes, the device memory (SPEC.md §17 for softnda), and the device clock where
// the driver's data path has one (SPEC.md §15); no other extended capability is announced.
int faceQueryDeviceEx(ibv_context *context, const ibv_query_device_ex_input *, ibv_device_attr_ex *attr,
                      size_t attr_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    ibv_device_attr_ex ex{};
    if (int rc = queryDeviceAttr(c, &ex.orig_attr, &ex.max_dm_size); rc != 0) {
        return -rc;
    }
    ex.phys_port_cnt_ex = ex.orig_attr.phys_port_cnt;
    // The extended flags start with the standard ones (rdma-core copies them the same way), e.g.
    // MEM_WINDOW_TYPE_2B where the device has type 2 windows.
    ex.device_cap_flags_ex = ex.orig_attr.device_cap_flags;
    if (auto clock_info = IBVX_DATAPATH_ENTRY(c, clock_info); clock_info != nullptr) {
        if (int rc = clock_info(&ex.hca_core_clock, &ex.completion_timestamp_mask); rc != 0) {
            return rc;
        }
    }
    memcpy(attr, &ex, std::min(attr_size, sizeof(ex)));
    return 0;
}

// As rdma-core's providers answer: the raw clock's ticks in tv_nsec, tv_sec 0; only the values
// asked for and known are set in comp_mask.
int faceQueryRtValues(ibv_context *context, ibv_values_ex *values) {
    const ShadowContext *c = faceContext(context);
    if (c == nullptr || values == nullptr) {
        return EINVAL;
    }
    auto read_clock = IBVX_DATAPATH_ENTRY(c, read_clock);
    if ((values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) == 0 || read_clock == nullptr) {
        values->comp_mask = 0;
        return read_clock == nullptr ? EOPNOTSUPP : 0;
    }
    uint64_t ticks = 0;
    if (int rc = read_clock(&ticks); rc != 0) {
        return rc;
    }
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(ticks);
    values->comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
    return 0;
}

}  // namespace ibvx::client::verbs

using namespace ibvx::client::verbs;  // NOLINT: this file serves the face's verbs

extern "C" {

int ibvx_verbs_query_device(ibv_context *context, ibv_device_attr *attr) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || attr == nullptr) {
        return EINVAL;
    }
    return -queryDeviceAttr(c, attr);
}

int ibvx_verbs_query_port(ibv_context *context, uint8_t port_num, ibv_port_attr *attr) {
    return faceQueryPort(context, port_num, attr, sizeof(*attr));
}

int ibvx_verbs_query_gid_ex(ibv_context *context, uint32_t port_num, uint32_t gid_index, ibv_gid_entry *entry,
                            uint32_t flags, size_t entry_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || entry == nullptr || flags != 0 || entry_size < sizeof(ibv_gid_entry) ||
        port_num == 0 || port_num > 255) {
        return EINVAL;
    }
    pb::QueryPortResponse resp;
    if (int rc = queryPortInfo(c, static_cast<uint8_t>(port_num), &resp); rc != 0) {
        return -rc;
    }
    for (const pb::GidEntry &g : resp.gids()) {
        if (g.index() == gid_index) {
            (void)ibvx::wire::fromProto(g, entry);
            entry->port_num = port_num;
            return 0;
        }
    }
    return ENODATA;  // as libibverbs answers an empty GID slot
}

int ibvx_verbs_query_gid(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid) {
    ibv_gid_entry e{};
    if (gid == nullptr || index < 0) {
        errno = EINVAL;
        return -1;
    }
    int rc = ibvx_verbs_query_gid_ex(context, port_num, static_cast<uint32_t>(index), &e, 0, sizeof(e));
    if (rc == ENODATA) {
        *gid = ibv_gid{};  // libibverbs reads an empty slot as the zero GID
        return 0;
    }
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    *gid = e.gid;
    return 0;
}

ssize_t ibvx_verbs_query_gid_table(ibv_context *context, ibv_gid_entry *entries, size_t max_entries,
                                   uint32_t flags, size_t entry_size) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || (entries == nullptr && max_entries != 0) || flags != 0 ||
        entry_size < sizeof(ibv_gid_entry)) {
        return -EINVAL;
    }
    size_t n = 0;
    for (uint32_t port = 1; port <= c->info.phys_port_cnt && port <= 255; ++port) {
        pb::QueryPortResponse resp;
        if (int rc = queryPortInfo(c, static_cast<uint8_t>(port), &resp); rc != 0) {
            return rc;
        }
        for (const pb::GidEntry &g : resp.gids()) {
            if (n == max_entries) {
                return -EINVAL;  // the table does not fit, as libibverbs answers
            }
            auto *e = reinterpret_cast<ibv_gid_entry *>(reinterpret_cast<char *>(entries) + n * entry_size);
            (void)ibvx::wire::fromProto(g, e);
            e->port_num = port;
            ++n;
        }
    }
    return static_cast<ssize_t>(n);
}

int ibvx_verbs_query_gid_type(ibv_context *context, uint8_t port_num, unsigned int index, int *type) {
    ibv_gid_entry e{};
    if (type == nullptr) {
        errno = EINVAL;
        return -1;
    }
    int rc = ibvx_verbs_query_gid_ex(context, port_num, index, &e, 0, sizeof(e));
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    *type = e.gid_type == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;  // rdma-core's IBV_GID_TYPE_SYSFS_*
    return 0;
}

// The P_Key table is not carried by the broker: every device answers the default table, one
// full-membership 0xffff entry (what softnda has and what an unpartitioned fabric uses).
int ibvx_verbs_query_pkey(ibv_context *context, uint8_t port_num, int index, __be16 *pkey) {
    ShadowContext *c = faceContext(context);
    if (c == nullptr || pkey == nullptr || index != 0 || port_num == 0 || port_num > c->info.phys_port_cnt) {
        errno = EINVAL;
        return -1;
    }
    *pkey = htobe16(0xffff);
    return 0;
}

int ibvx_verbs_get_pkey_index(ibv_context *context, uint8_t port_num, __be16 pkey) {
    __be16 p0 = 0;
    if (ibvx_verbs_query_pkey(context, port_num, 0, &p0) != 0) {
        return -1;
    }
    if (p0 != pkey) {
        errno = ENOENT;
        return -1;
    }
    return 0;
}

}  // extern "C"
