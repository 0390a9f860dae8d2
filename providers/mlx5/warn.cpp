#include "providers/mlx5/warn.h"

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace ibvx::mlx5 {

bool warningsEnabled() {
    return secure_getenv("IBV_EXTEND_SHOW_WARNINGS") != nullptr;
}

void warn(const char *fmt, ...) {
    if (!warningsEnabled()) {
        return;
    }
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    // One fprintf so concurrent warnings do not interleave mid-line.
    fprintf(stderr, "ibv_extend: Warning: mlx5: %s\n", line);
}

}  // namespace ibvx::mlx5
