#ifndef IBVX_LAYOUT_C_H
#define IBVX_LAYOUT_C_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ibvx_layout_entry {
    const char *what;
    size_t value;
};

extern const struct ibvx_layout_entry ibvx_layout_c[];
extern const size_t ibvx_layout_c_count;

#ifdef __cplusplus
}
#endif

#endif
