// A queue's doorbell mapping and domains, with fake ops and a context that is not a
// libibverbs one (rdma-core's inline verbs then answer EOPNOTSUPP without calling anything).
#include "providers/mlx5/queue_resources.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <vector>

namespace ibvx::mlx5 {
namespace {

struct MapLog {
    std::vector<doorbell_map_desc> maps;
    std::vector<std::pair<void *, doorbell_map_desc>> unmaps;
    void *answer = nullptr;
    int fail_errno = 0;
};
MapLog g_log;

ibv_extend_ops mappingOps() {
    ibv_extend_ops o{};
    o.alloc = [](size_t) -> void * { return nullptr; };
    o.free = [](void *) {};
    o.db_mmap = [](doorbell_map_desc *d) -> void * {
        g_log.maps.push_back(*d);
        if (g_log.answer == nullptr) {
            errno = g_log.fail_errno;
        }
        return g_log.answer;
    };
    o.db_unmap = [](void *p, doorbell_map_desc *d) {
        g_log.unmaps.emplace_back(p, *d);
        return 0;
    };
    return o;
}

class Mlx5QueueResources : public ::testing::Test {
  protected:
    void SetUp() override { g_log = MapLog{}; }
    alignas(4096) char page_[2 * 4096] = {};
};

TEST_F(Mlx5QueueResources, DoorbellIsMappedOnceAndUnmappedWithTheSameDescOnDestruction) {
    ibv_extend_ops ops = mappingOps();
    g_log.answer = page_;
    DoorbellWindow w = doorbellWindow(reinterpret_cast<void *>(0x7f0000001800), 8);
    iov_addr_desc db{};
    {
        QueueResources res(&ops);
        ASSERT_EQ(res.mapDoorbell(w, &db), 0);
        ASSERT_EQ(g_log.maps.size(), 1u);
        EXPECT_EQ(g_log.maps[0].hva, 0x7f0000001000u);
        EXPECT_EQ(g_log.maps[0].size, 4096u);
        EXPECT_EQ(g_log.maps[0].type, uint32_t{DB_MAP_MODE_HOST_VA});
        EXPECT_EQ(db.iov_base, page_ + 0x800);
        EXPECT_EQ(db.iov_len, 8u);
        EXPECT_EQ(res.mapDoorbell(w, &db), -EBUSY);  // one mapping per queue
        EXPECT_TRUE(g_log.unmaps.empty());
    }
    ASSERT_EQ(g_log.unmaps.size(), 1u);
    EXPECT_EQ(g_log.unmaps[0].first, static_cast<void *>(page_));
    EXPECT_EQ(g_log.unmaps[0].second.hva, 0x7f0000001000u);
    EXPECT_EQ(g_log.unmaps[0].second.size, 4096u);
}

TEST_F(Mlx5QueueResources, FailedMappingReportsErrnoAndIsNotUnmapped) {
    ibv_extend_ops ops = mappingOps();
    DoorbellWindow w = doorbellWindow(reinterpret_cast<void *>(0x7f0000001800), 8);
    iov_addr_desc db{};
    {
        QueueResources res(&ops);
        g_log.fail_errno = EPERM;
        EXPECT_EQ(res.mapDoorbell(w, &db), -EPERM);
        g_log.fail_errno = 0;  // NULL without a reason
        EXPECT_EQ(res.mapDoorbell(w, &db), -ENOMEM);
        EXPECT_EQ(db.iov_base, nullptr);
    }
    EXPECT_TRUE(g_log.unmaps.empty());
}

TEST_F(Mlx5QueueResources, DomainCreationFailureIsReportedAndCleanedUp) {
    ibv_extend_ops ops = mappingOps();
    ibv_context not_verbs{};  // abi_compat is not the extended marker: no parent domains
    ibv_pd pd{};
    pd.context = &not_verbs;
    QueueResources plain(&ops);
    EXPECT_EQ(plain.makeDomain(&not_verbs, &pd, false), -EOPNOTSUPP);
    EXPECT_EQ(plain.domain(), nullptr);
    QueueResources direct(&ops);  // the thread domain fails first (warned), then the domain
    EXPECT_EQ(direct.makeDomain(&not_verbs, &pd, true), -EOPNOTSUPP);
    EXPECT_EQ(direct.domain(), nullptr);
}

}  // namespace
}  // namespace ibvx::mlx5
