// The reference v4.2.0 layout pinned in C++ (static_assert) and compared, entry by entry, with
// what the C compiler computed in layout_c.c.
#include <cstddef>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>
#include <ibv_extend_vdev.h>

#include "layout_c.h"

namespace {

#define PIN_SIZE(T, n) static_assert(sizeof(struct T) == (n), "sizeof " #T);
#define PIN_OFFSET(T, m, n) static_assert(offsetof(struct T, m) == (n), "offsetof " #T "." #m);
#define PIN_VALUE(e, n) static_assert((e) == (n), #e);
#include "layout_expect.inc"
#undef PIN_SIZE
#undef PIN_OFFSET
#undef PIN_VALUE

struct Expected {
    const char *what;
    size_t cxx_value;
    size_t expected;
};

#define PIN_SIZE(T, n) {"sizeof " #T, sizeof(struct T), (n)},
#define PIN_OFFSET(T, m, n) {"offsetof " #T "." #m, offsetof(struct T, m), (n)},
#define PIN_VALUE(e, n) {#e, static_cast<size_t>(e), (n)},
const Expected kExpected[] = {
#include "layout_expect.inc"
};
#undef PIN_SIZE
#undef PIN_OFFSET
#undef PIN_VALUE

TEST(Layout, CAndCxxAgreeWithTheReference) {
    ASSERT_EQ(ibvx_layout_c_count, std::size(kExpected));
    for (size_t i = 0; i < ibvx_layout_c_count; ++i) {
        EXPECT_EQ(std::string(ibvx_layout_c[i].what), kExpected[i].what);
        EXPECT_EQ(ibvx_layout_c[i].value, kExpected[i].expected) << kExpected[i].what << " (C)";
        EXPECT_EQ(kExpected[i].cxx_value, kExpected[i].expected) << kExpected[i].what << " (C++)";
    }
}

TEST(Layout, DoorbellBitsFillOneWord) {
    doorbell_map_desc d{};
    d.ub_res.bits.resource_id = 0xf;
    d.ub_res.bits.offset = 0xffffffffu;
    d.ub_res.bits.resv = (1u << 28) - 1;
    uint64_t word;
    memcpy(&word, reinterpret_cast<const char *>(&d) + 16, sizeof(word));
    EXPECT_EQ(word, ~0ull) << "4 + 32 + 28 bits, nothing else in the word";
    EXPECT_EQ(d.size, 0u);
}

}  // namespace
