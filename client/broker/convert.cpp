#include "client/broker/convert.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ibvx::client::broker {

void copyBytes(const std::string &src, void *dst, size_t dst_size) {
    memcpy(dst, src.data(), std::min(src.size(), dst_size));
}

void fromProto(const pb::DeviceInfo &d, ibvx_device_info *out) {
    *out = ibvx_device_info{};
    snprintf(out->name, sizeof(out->name), "%s", d.name().c_str());
    snprintf(out->provider, sizeof(out->provider), "%s", d.provider().c_str());
    wire::limitsFromProto(d, out);
}

}  // namespace ibvx::client::broker
