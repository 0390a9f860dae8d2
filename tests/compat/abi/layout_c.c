/* The layout pins, checked by a C compiler, and the values C sees exported for the C++ test to
 * compare with its own: C and C++ must agree on every byte. */
#include <stddef.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>
#include <ibv_extend_vdev.h>

#include "layout_c.h"

#define PIN_SIZE(T, n) _Static_assert(sizeof(struct T) == (n), "sizeof " #T);
#define PIN_OFFSET(T, m, n) _Static_assert(offsetof(struct T, m) == (n), "offsetof " #T "." #m);
#define PIN_VALUE(e, n) _Static_assert((e) == (n), #e);
#include "layout_expect.inc"
#undef PIN_SIZE
#undef PIN_OFFSET
#undef PIN_VALUE

#define PIN_SIZE(T, n) {"sizeof " #T, sizeof(struct T)},
#define PIN_OFFSET(T, m, n) {"offsetof " #T "." #m, offsetof(struct T, m)},
#define PIN_VALUE(e, n) {#e, (size_t)(e)},
const struct ibvx_layout_entry ibvx_layout_c[] = {
#include "layout_expect.inc"
};
const size_t ibvx_layout_c_count = sizeof(ibvx_layout_c) / sizeof(ibvx_layout_c[0]);
