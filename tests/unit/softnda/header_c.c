/* softnda's headers compile as C11 on their own (the device side of an NPU is often C). */
#include "providers/softnda/include/softnda.h"
#include "providers/softnda/include/softnda_device.h"
#include "providers/softnda/include/softnda_ops.h"

_Static_assert(sizeof(struct softnda_wqe) == SOFTNDA_WQE_HEADER_SIZE, "WQE header is 48 bytes (SPEC.md 2.1)");
_Static_assert(sizeof(struct softnda_cqe) == SOFTNDA_CQE_SIZE, "CQE is 32 bytes (SPEC.md 3)");

/* Referenced from the format test so the C translation unit is really linked. */
int softnda_test_c_cqe_owner_offset(void) {
    return (int)offsetof(struct softnda_cqe, owner);
}
