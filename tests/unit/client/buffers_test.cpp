// The buffer registry broker mode relies on: from an address to the memfd behind it.
#include "client/buffers.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <ibv_extend_broker.h>

namespace ibvx::client {
namespace {

TEST(BufferRegistry, FindsTheBufferContainingARange) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    char *p = static_cast<char *>(ibvx_alloc_buf(page + 1));
    ASSERT_NE(p, nullptr);
    BufferInfo info;
    ASSERT_TRUE(findBuffer(p + 10, 100, &info));
    EXPECT_EQ(info.base, p);
    EXPECT_EQ(info.size, 2 * page);
    ASSERT_GE(info.fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(info.fd, &st), 0);
    EXPECT_EQ(static_cast<size_t>(st.st_size), 2 * page);
    EXPECT_TRUE(findBuffer(p, 2 * page, nullptr));
    EXPECT_FALSE(findBuffer(p + 1, 2 * page, nullptr)) << "runs past the end";
    EXPECT_FALSE(findBuffer(p + 2 * page, 1, nullptr));
    EXPECT_FALSE(findBuffer(p - 1, 1, nullptr));
    ibvx_free_buf(p);
    EXPECT_FALSE(findBuffer(p, 1, nullptr));
}

TEST(BufferRegistry, NeighbouringBuffersStayApart) {
    void *a = ibvx_alloc_buf(4096);
    void *b = ibvx_alloc_buf(4096);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    BufferInfo ia, ib;
    ASSERT_TRUE(findBuffer(a, 1, &ia));
    ASSERT_TRUE(findBuffer(b, 1, &ib));
    EXPECT_NE(ia.fd, ib.fd);
    EXPECT_EQ(ia.base, a);
    EXPECT_EQ(ib.base, b);
    ibvx_free_buf(a);
    ibvx_free_buf(b);
}

}  // namespace
}  // namespace ibvx::client
