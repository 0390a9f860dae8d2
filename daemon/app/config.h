// ibv-extendd's configuration: the TOML file (/etc/ibv-extend/ibv-extendd.toml) merged with the
// command line (flags win). Parsing is strict: an unknown key or a bad value is an error that
// names the key and its line, so a typo never silently changes what the broker does.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/build_config.h"
#include "common/status.h"
#include "daemon/core/policy.h"
#include "daemon/core/quota.h"

namespace ibvx::daemon {

// A provider option from a [<provider>] table, passed to its vdev configure(key, value).
struct ProviderOption {
    std::string provider;
    std::string key;
    std::string value;
    std::string where;  // "FILE:LINE"
};

// [kubernetes]: pod identity of sessions (docs/kubernetes.md).
struct KubernetesConfig {
    std::string pod_resources_socket;            // the kubelet's PodResources API; "" = off
    std::string resource = "ibv-extend.io/nda";  // the device plugin's resource
};

struct DaemonConfig {
    std::string config_path;  // empty: none
    std::string socket = IBVX_DEFAULT_SOCKET;
    std::optional<mode_t> socket_mode;  // applied to a socket we create
    std::string socket_group;           // group owning the socket ("" keeps ours)
    std::string admin_group;            // may call the Admin service besides root
    // Where the file set each group, "FILE:LINE: KEY", for loadConfigFile()'s error when this
    // host has no such group ("" when not from a file).
    std::string socket_group_origin, admin_group_origin;
    std::string log_level = "info";
    uint32_t attach_timeout_ms = 5000;
    uint32_t handshake_timeout_ms = 2000;
    std::vector<std::string> drivers;       // extra extension drivers to load ([drivers] names)
    std::vector<std::string> driver_where;  // "FILE:LINE" of each drivers entry, for a load error
    std::vector<ProviderOption> provider_options;
    PolicyConfig policy;  // [policy]; policy.enabled when the section exists (see docs/security.md)
    QuotaConfig quotas;   // [quotas] defaults, [quotas.uid.<uid>], [quotas.container.<id>]
    KubernetesConfig kubernetes;
    // Restart (docs/restart.md). fd_store: keep every fd a restart needs in systemd's fd store
    // (--fd-store; the unit sets FileDescriptorStoreMax=), so SIGTERM leaves the sessions to the
    // next start instead of ending them.
    bool fd_store = false;
    // The text the configuration was parsed from: a restart whose file has become invalid
    // carries on with it (docs/restart.md), so a typo never costs the tenants their queues.
    std::string config_text;
    // The command line, for a restart that execs the binary again.
    std::vector<std::string> argv;
};

// Parses TOML text (path names it in messages). INVALID_ARGUMENT with "path:line: key: ..." on
// error (a line holding no key, such as a broken table header, has no key to name).
Status parseConfig(const std::string &text, const std::string &path, DaemonConfig *out);
// Reads and parses the file, then checks that socket_group and admin_group name groups of this
// host (parseConfig keeps them as text): the broker would otherwise find out only when it
// chowns the socket or resolves the admin group, with no line to point at. INVALID_ARGUMENT
// "FILE:LINE: KEY: ..." when one does not exist.
Status loadConfigFile(const std::string &path, DaemonConfig *out);
// loadConfigFile() of text already read (path names it in messages); keeps the text in
// out->config_text.
Status loadConfigText(const std::string &text, const std::string &path, DaemonConfig *out);

bool validLogLevel(const std::string &level);

}  // namespace ibvx::daemon
