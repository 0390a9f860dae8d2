/* What every source of the libibverbs face shares. */
#pragma once

/* An entry point of the face; which version node it is exported under is libibverbs.map's (or a
 * .symver's) business. */
#define IBVX_FACE_EXPORT __attribute__((visibility("default")))
