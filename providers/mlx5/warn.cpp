#include "providers/mlx5/warn.h"

#include "common/warn.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace ibvx::mlx5 {

bool warningsEnabled() {
    return ibvx::warningsEnabled();
}

void warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vwarn("mlx5: ", fmt, ap);
    va_end(ap);
}

}  // namespace ibvx::mlx5
