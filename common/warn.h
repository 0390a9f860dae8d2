// Warnings the reference's way, for every part that prints them (the loader, libibv_extend.so's
// broker mode, drivers): one line on stderr, "ibv_extend: Warning: " then the part's prefix,
// and only when IBV_EXTEND_SHOW_WARNINGS is set. The variable is read with secure_getenv: a
// broker may run with different real and effective ids, and then the environment is not trusted.
// Header-only, because drivers are separate shared objects that link nothing of ours.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace ibvx {

inline bool warningsEnabled() {
    return secure_getenv("IBV_EXTEND_SHOW_WARNINGS") != nullptr;
}

// prefix may be "" (the loader's lines) or "mlx5: " and the like.
inline void vwarn(const char *prefix, const char *fmt, va_list ap) {
    if (!warningsEnabled()) {
        return;
    }
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    // One fprintf, so concurrent warnings do not interleave mid-line.
    fprintf(stderr, "ibv_extend: Warning: %s%s\n", prefix, line);
}

}  // namespace ibvx
