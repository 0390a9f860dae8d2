// What a container needs to reach the broker: the edits the plugin answers Allocate with and
// writes into its CDI spec. One computation serves both, so the two can never disagree.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ibvx::device_plugin {

// Where the edits put things inside every container (fixed, so images and docs can rely on it).
inline constexpr const char *kContainerSocketDir = "/run/ibv-extend";
inline constexpr const char *kContainerLibDir = "/opt/ibv-extend/lib";
// Where the container finds its device marker: a read-only bind mount of the host file
// <marker dir>/<device ID>. The broker reads the mount from the tenant's /proc/<pid>/mountinfo
// (kernel-provided, not the tenant's word) to learn which device, and through the kubelet's
// PodResources API which pod, a session belongs to.
inline constexpr const char *kContainerDeviceMarker = "/run/ibv-extend-device";
// The CDI kind and device name: `--device ibv-extend.io/nda=broker`.
inline constexpr const char *kCdiKind = "ibv-extend.io/nda";
inline constexpr const char *kCdiDevice = "broker";

struct Mount {
    std::string host_path;
    std::string container_path;
    bool read_only = true;
    bool operator==(const Mount &) const = default;
};

struct ContainerEdits {
    std::vector<Mount> mounts;
    std::map<std::string, std::string> envs;
    bool operator==(const ContainerEdits &) const = default;
};

// The host side the edits point at.
struct HostPaths {
    std::string broker_socket;   // the broker's socket (its directory is mounted)
    std::string client_lib_dir;  // holds libibv_extend.so.4 and ibv_extend/verbs/libibverbs.so.1
};

// The edits for paths, with every host path resolved (symlinks followed) so that a runtime
// mounts exactly what exists now; a changed resolution is a change of the edits. Fails when the
// client libraries are missing (the socket itself may come later: the broker may start after
// the plugin, but its directory must exist).
StatusOr<ContainerEdits> computeEdits(const HostPaths &paths);

// The CDI spec (JSON) of kind kCdiKind with one device kCdiDevice carrying edits.
std::string cdiSpec(const ContainerEdits &edits);

// Writes content to path atomically: a temp file in the same directory, fsync, rename. A reader
// (containerd, CRI-O) sees the old spec or the new one, never a partial one.
Status writeFileAtomically(const std::string &path, const std::string &content);

}  // namespace ibvx::device_plugin
