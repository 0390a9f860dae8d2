// Driver warnings, the reference's way: printed to stderr, prefixed "ibv_extend: Warning: ",
// only when IBV_EXTEND_SHOW_WARNINGS is set (read with secure_getenv: the broker may run with
// different real and effective ids, and then the environment is not trusted).
#pragma once

namespace ibvx::mlx5 {

bool warningsEnabled();
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ibvx::mlx5
