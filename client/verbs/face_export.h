/* What every C entry point of the libibverbs face shares. */
#pragma once

#include <errno.h>
#include <stddef.h>

/* An entry point of the face; which version node it is exported under is libibverbs.map's (or a
 * .symver's) business. */
#define IBVX_FACE_EXPORT __attribute__((visibility("default")))

/* How an entry point the broker cannot serve fails, as libibverbs fails a verb the device lacks:
 * a pointer return is NULL with errno = EOPNOTSUPP, an int return is EOPNOTSUPP (errno set too). */
static inline void *ibvx_unsupported_ptr(void) {
    errno = EOPNOTSUPP;
    return NULL;
}
static inline int ibvx_unsupported_int(void) {
    errno = EOPNOTSUPP;
    return EOPNOTSUPP;
}
