// The discovery tree: the files middleware reads beside libibverbs (/dev/infiniband/uverbsN,
// /sys/class/infiniband/<dev>/..., /sys/class/infiniband_verbs/...), written by the broker for
// its own devices, so ibv-extend-run, the device plugin and the CDI spec can show tenants a
// picture that agrees with what the libibverbs face reports (docs/verbs.md, "The discovery tree").
//
// Layout, under the broker's runtime directory (the socket's directory):
//   discovery -> discovery.<generation>/          a symlink, swapped atomically on every publish
//     dev/infiniband/uverbsN                      a character device no driver serves (major 63):
//                                                 stat() sees one, open() fails at once
//     sys/class/infiniband/<dev>/...              node_guid, ports/N/..., device/numa_node, ...
//     sys/class/infiniband_verbs/{abi_version, uverbsN/{ibdev,abi_version}}
// uverbsN is the device's place in the broker's device list, as the face numbers them.
#pragma once

#include <string>

#include "common/status.h"
#include "daemon/core/device.h"

namespace ibvx::daemon {

// The directory tenants are shown: runtime_dir/discovery (a symlink to the current generation).
std::string discoveryTreePath(const std::string &runtime_dir);

// Writes the tree for every device of the registry into a new generation under runtime_dir, then
// points runtime_dir/discovery at it and removes generations older than the one it replaced
// (a tenant that resolved the previous one a moment ago still finds it). Devices that cannot be
// opened or queried get their entries without the attributes that failed, and a warning.
Status publishDiscoveryTree(const std::string &runtime_dir, DeviceRegistry &devices);

// Rewrites the RoCE ports' files (state, link layer, LID, GIDs and their attributes) of the
// published generation in place, each file replaced whole: a RoCE port's GIDs follow its interface's
// addresses (providers/softnda/SPEC.md §19), and the sandboxes running now bound this generation.
// Publishes a new tree when there is none.
Status refreshDiscoveryPorts(const std::string &runtime_dir, DeviceRegistry &devices);

}  // namespace ibvx::daemon
