// A driver's standard-verbs data path for the tenant's process (include/ibv_extend_datapath.h),
// found by the driver's name: lib<provider>-verbs.so in the provider directory (where the
// driver itself is found), else on the normal library search path.
//
// Threading: may be called from any thread; a data path is loaded once and never unloaded, so
// the table returned stays valid for the process lifetime.
#pragma once

#include <string>

#include <ibv_extend_datapath.h>

namespace ibvx::loader {

// The data path of the driver named provider, or nullptr (with a warning the first time) when it
// has none, its library does not load, or its table is not for this ABI and provider. The answer
// is cached per name.
const ibv_extend_datapath_ops *datapathFor(const std::string &provider);

}  // namespace ibvx::loader
