// The reference's driver discovery rules as pure-ish steps, so tests can drive each one:
// which directories and variables count, how a config file is parsed, how a name becomes a
// dlopen() path. registry.cpp strings them together under its locks.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "providers/loader/loader.h"

namespace ibvx::loader::detail {

inline constexpr size_t kDriverNameMax = 128;

// A driver name found in a config file.
struct ConfigName {
    std::string name;
    std::string source;  // "<file>:<line>"
};

// Environment overrides are honoured only when the process runs with its own privileges, as
// libibverbs does: a setuid program must not load libraries a caller names.
bool environmentTrusted();

// IBV_EXTEND_CONFIG_DIR (trusted environment only) or the build-time IBVX_CONFIG_DIR.
std::string configDir();
// IBV_EXTEND_PROVIDER_DIR (trusted environment only), else defaultProviderDir() of the file this
// loader runs from (the executable, or libibv_extend.so).
std::string providerDir();
// The build tree's provider dir (<build>/providers-out) when self, a real path, lies inside the
// build tree this loader was compiled in, as rdma-core's in-place build does. Otherwise the
// provider dir of the prefix self is installed in (<prefix>/lib/ibv_extend for
// <prefix>/sbin/ibv-extendd or <prefix>/lib/libibv_extend.so) when that directory exists, so an
// install made with `cmake --install --prefix`, or moved, finds its own drivers; else the
// configured IBVX_PROVIDER_DIR.
std::string defaultProviderDir(const std::string &self);
// The prefix of a file installed in <prefix>/bin, <prefix>/sbin or <prefix>/lib (where the install
// rules put programs and libibv_extend.so); nullopt for any other place.
std::optional<std::string> installPrefixOf(const std::string &self);

// [A-Za-z0-9_-]{1,128}
bool validDriverName(std::string_view name);

// Parses one config file: "driver NAME" lines, '#' comments and blank lines; warns about and
// skips anything else. `source` names the file in warnings.
void parseConfig(std::string_view text, const std::string &source, std::vector<ConfigName> *out);

// Reads every regular file of dir (sorted by name). Symlinks, other file types and files owned
// by neither root nor the caller are skipped with a warning. A missing dir is not an error.
std::vector<ConfigName> readConfigDir(const std::string &dir);

// Splits IBV_EXTEND_DRIVERS on ':' and ';', dropping empty entries.
std::vector<std::string> splitDriverList(std::string_view list);

// dlopen()s one driver: an absolute path as is (refused when it contains ".."), otherwise
// <provider dir>/lib<name>.so and then lib<name>.so through the normal search path.
LoadRecord loadDriverLibrary(const std::string &name, const std::string &source);

}  // namespace ibvx::loader::detail
