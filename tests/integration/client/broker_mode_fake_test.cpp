// libibv_extend.so in broker mode against ibvx-fake-broker: a real process speaking the real wire
// contract (gRPC on injected fds, fd channel with SCM_RIGHTS) without drivers. Checks what the
// client itself is responsible for: mode selection, session setup, region mapping into local
// queue addresses, shadow objects, MR memory passing, error mapping, deadlines, a vanished
// broker and fork.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <ibv_extend.h>
#include <ibv_extend_broker.h>

#include "common/qp_init_attr.h"
#include "tests/integration/client/broker_support.h"

namespace {

using ibvx::test::BrokerProcess;
using ibvx::test::countMappings;

constexpr const char *kRegionName = "fake-region";

class FakeBrokerTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        dir_ = ibvx::test::makeTempDir();
        socket_ = dir_ + "/b.sock";
        // Decided before the library's first call: broker mode on our socket, and a deadline
        // short enough for the hung-broker test yet long enough that a loaded CI machine (ctest
        // -j2 beside sanitizer builds) never makes an ordinary call miss it.
        ibvx::test::useBrokerAt(socket_, 6000);
        startBroker();
    }
    static void TearDownTestSuite() {
        broker_.stop(SIGKILL);
        unlink(socket_.c_str());
        rmdir(dir_.c_str());
    }
    static void startBroker() {
        ASSERT_TRUE(broker_.start({ibvx::test::selfDir() + "/ibvx-fake-broker", "{socket}"}, socket_));
    }

    void SetUp() override {
        ctx_ = ibvx_open_device("fake0");
        ASSERT_NE(ctx_, nullptr) << strerror(errno);
        pd_ = ibvx_alloc_pd(ctx_);
        ASSERT_NE(pd_, nullptr) << strerror(errno);
    }
    void TearDown() override {
        if (pd_ != nullptr) {
            EXPECT_EQ(ibvx_dealloc_pd(pd_), 0);
        }
        if (ctx_ != nullptr) {
            EXPECT_EQ(ibvx_close_device(ctx_), 0);
        }
    }

    ibv_cq_extend *createCq() {
        ibv_cq_init_attr_extend a{};
        a.attr.cqe = 64;
        a.type = QU_BUF_DMA_MODE_DEFAULT;
        return ibv_create_cq_extend(ctx_, &a);
    }
    ibv_qp_extend *createQp(ibv_cq_extend *cq, ibv_qp_type type = IBV_QPT_RC) {
        ibv_qp_init_attr_extend a = ibvx::qpInitAttr({.pd = pd_, .send_cq = cq->cq, .qp_type = type});
        return ibv_create_qp_extend(ctx_, &a);
    }

    static inline std::string dir_;
    static inline std::string socket_;
    static inline BrokerProcess broker_;
    ibv_context_extend *ctx_ = nullptr;
    ibv_pd *pd_ = nullptr;
};

bool allBytes(const void *p, size_t n, uint8_t v) {
    const auto *b = static_cast<const uint8_t *>(p);
    for (size_t i = 0; i < n; ++i) {
        if (b[i] != v) {
            return false;
        }
    }
    return true;
}

TEST_F(FakeBrokerTest, ModeIsBrokerAndDevicesComeFromTheBroker) {
    EXPECT_STREQ(ibvx_mode(), "broker");
    ibvx_device_info devs[4];
    ASSERT_EQ(ibvx_list_devices(devs, 4), 1);
    EXPECT_STREQ(devs[0].name, "fake0");
    EXPECT_STREQ(devs[0].provider, "fake");
    EXPECT_EQ(devs[0].max_qp, 64U);
    EXPECT_EQ(devs[0].max_mr_size, 1U << 20);
    EXPECT_EQ(ibvx_list_devices(nullptr, 0), 1);
    EXPECT_STREQ(ctx_->context->device->name, "fake0");
    EXPECT_EQ(ctx_->ops->version, IBV_EXTEND_DRIVER_VERSION_V3);
}

TEST_F(FakeBrokerTest, OpenUnknownDeviceAnswersTheBrokersErrno) {
    errno = 0;
    EXPECT_EQ(ibvx_open_device("nosuch0"), nullptr);
    EXPECT_EQ(errno, ENODEV);
}

TEST_F(FakeBrokerTest, QueryDeviceCopiesCapsAndReservedWords) {
    ibv_device_attr_extend attr{};
    ASSERT_EQ(ibv_query_device_extend(ctx_, &attr), 0);
    EXPECT_EQ(attr.ext_cap, 3U);
    EXPECT_TRUE(allBytes(attr.resv, sizeof(attr.resv), 0x5a));
}

TEST_F(FakeBrokerTest, QueueAddressesAreLocalMappingsOfTheBrokersRegions) {
    int before = countMappings(kRegionName);
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr) << strerror(errno);
    EXPECT_EQ(countMappings(kRegionName), before + 1);
    // The fake writes the queue's letter at entry 0: the client reads the broker's bytes.
    ASSERT_NE(cq->cq_info.qbuf.base, 0U);
    EXPECT_EQ(*reinterpret_cast<const char *>(cq->cq_info.qbuf.base), 'C');
    EXPECT_EQ(cq->cq_info.qbuf.entry_cnt, 64U);
    EXPECT_EQ(cq->cq_info.qbuf.entry_size, 32U);
    EXPECT_TRUE(allBytes(cq->cq_info.qbuf.resv, sizeof(cq->cq_info.qbuf.resv), 0x33));
    EXPECT_TRUE(allBytes(cq->cq_info.resv, sizeof(cq->cq_info.resv), 0x44));
    EXPECT_TRUE(allBytes(cq->resv, sizeof(cq->resv), 0x11));
    EXPECT_EQ(
        static_cast<char *>(cq->cq_info.dbr_pi_va.iov_base) - reinterpret_cast<char *>(cq->cq_info.qbuf.base),
        6144);
    EXPECT_EQ(cq->cq_info.dbr_pi_va.iov_len, 4U);
    EXPECT_NE(cq->cq_info.db_hw_va.iov_base, nullptr);
    EXPECT_EQ(cq->cq->context, ctx_->context);
    EXPECT_EQ(cq->cq->cqe, 64);

    ibv_qp_extend *qp = createQp(cq);
    ASSERT_NE(qp, nullptr) << strerror(errno);
    EXPECT_EQ(countMappings(kRegionName), before + 2);
    EXPECT_EQ(*reinterpret_cast<const char *>(qp->sq_info.qbuf.base), 'Q');
    // SQ and RQ share one region: the second reference needed no second frame.
    EXPECT_EQ(qp->rq_info.qbuf.base - qp->sq_info.qbuf.base, 4096U);
    EXPECT_EQ(*reinterpret_cast<const char *>(qp->rq_info.qbuf.base), 'Q');
    EXPECT_EQ(qp->rq_info.db_hw_va.iov_base, nullptr);  // absent ref -> NULL, as the driver said
    EXPECT_GE(qp->qp->qp_num, 0x100U);
    EXPECT_EQ(qp->qp->qp_type, IBV_QPT_RC);
    EXPECT_EQ(qp->qp->state, IBV_QPS_RESET);
    EXPECT_EQ(qp->qp->context, ctx_->context);
    EXPECT_EQ(qp->qp->pd, pd_);
    EXPECT_EQ(qp->qp->send_cq, cq->cq);
    EXPECT_EQ(qp->vendor_priv_info.value, 0x42U);
    EXPECT_TRUE(allBytes(qp->resv, sizeof(qp->resv), 0x22));
    // A store through the local address lands in the shared ring.
    reinterpret_cast<volatile char *>(qp->sq_info.qbuf.base)[1] = 'x';

    ASSERT_EQ(ibv_destroy_qp_extend(ctx_, qp), 0);
    EXPECT_EQ(countMappings(kRegionName), before + 1);  // released_regions were unmapped
    ASSERT_EQ(ibv_destroy_cq_extend(ctx_, cq), 0);
    EXPECT_EQ(countMappings(kRegionName), before);
}

TEST_F(FakeBrokerTest, SrqIsForwardedAndMapped) {
    ibv_srq_init_attr_extend a{};
    a.pd = pd_;
    a.attr.attr.max_wr = 32;
    a.attr.attr.max_sge = 2;
    a.type = QU_BUF_DMA_MODE_INDEP_UB;
    ibv_srq_extend *srq = ibv_create_srq_extend(ctx_, &a);
    ASSERT_NE(srq, nullptr) << strerror(errno);
    EXPECT_EQ(*reinterpret_cast<const char *>(srq->srq_info.qbuf.base), 'S');
    EXPECT_EQ(srq->srq->pd, pd_);
    EXPECT_EQ(ibv_destroy_srq_extend(ctx_, srq), 0);
}

TEST_F(FakeBrokerTest, RegMrHandsTheClientsMemoryToTheBroker) {
    auto *buf = static_cast<uint8_t *>(ibvx_alloc_buf(8192));
    ASSERT_NE(buf, nullptr);
    const uint32_t marker = 0x12345678;
    memcpy(buf + 100, &marker, sizeof(marker));
    ibv_mr *mr = ibvx_reg_mr(pd_, buf + 100, 64, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr) << strerror(errno);
    EXPECT_EQ(mr->lkey, marker);  // the fake answers lkey = the bytes it sees at the offset
    EXPECT_EQ(mr->rkey, static_cast<uint32_t>(reinterpret_cast<uintptr_t>(buf + 100)));  // iova = addr
    EXPECT_EQ(mr->addr, buf + 100);
    EXPECT_EQ(mr->length, 64U);
    EXPECT_EQ(mr->pd, pd_);
    EXPECT_EQ(ibvx_dereg_mr(mr), 0);

    // Memory not from ibvx_alloc_buf() reaches the broker on shared pages moved under it
    // (client/broker/shared_pages.h): the broker sees the bytes at the offset it is given.
    std::vector<uint8_t> heap(64);
    memcpy(heap.data(), &marker, sizeof(marker));
    ibv_mr *hmr = ibvx_reg_mr(pd_, heap.data(), heap.size(), 0);
    ASSERT_NE(hmr, nullptr) << strerror(errno);
    EXPECT_EQ(hmr->lkey, marker);
    EXPECT_EQ(hmr->addr, heap.data());
    EXPECT_EQ(ibvx_dereg_mr(hmr), 0);
    EXPECT_EQ(memcmp(heap.data(), &marker, sizeof(marker)), 0);  // contents kept through both moves
    // A range running past the buffer's end is in no one buffer, and its first pages are a shared
    // mapping (the buffer's memfd), which cannot be moved.
    errno = 0;
    EXPECT_EQ(ibvx_reg_mr(pd_, buf + 8000, 4096, 0), nullptr);
    EXPECT_EQ(errno, EINVAL);
    // A shared mapping of a file cannot be moved: the client asks the broker to register it in
    // place (RegMr with tenant_address, no fd), which this double refuses with EOPNOTSUPP.
    FILE *file = tmpfile();
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(ftruncate(fileno(file), 4096), 0);
    void *fmap = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fileno(file), 0);
    ASSERT_NE(fmap, MAP_FAILED);
    errno = 0;
    EXPECT_EQ(ibvx_reg_mr(pd_, fmap, 4096, 0), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP);
    munmap(fmap, 4096);
    fclose(file);
    ibvx_free_buf(buf);

    int fd = memfd_create("mrfd", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 4096), 0);
    const uint32_t fd_marker = 0xabcdef01;
    ASSERT_EQ(pwrite(fd, &fd_marker, sizeof(fd_marker), 512), 4);
    ibv_mr *fmr = ibvx_reg_mr_fd(pd_, fd, 512, 128, 0);
    close(fd);  // the broker holds its own reference
    ASSERT_NE(fmr, nullptr) << strerror(errno);
    EXPECT_EQ(fmr->lkey, fd_marker);
    EXPECT_EQ(fmr->addr, nullptr);
    EXPECT_EQ(ibvx_dereg_mr(fmr), 0);
}

TEST_F(FakeBrokerTest, ModifyAndQueryQpTrackState) {
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr);
    ibv_qp_extend *qp = createQp(cq);
    ASSERT_NE(qp, nullptr);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    ASSERT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE), 0);
    EXPECT_EQ(qp->qp->state, IBV_QPS_INIT);
    attr.qp_state = IBV_QPS_RTR;
    attr.dest_qp_num = 0x777;
    ASSERT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE | IBV_QP_DEST_QPN), 0);
    attr.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE), 0);
    EXPECT_EQ(qp->qp->state, IBV_QPS_RTS);

    ibv_qp_attr q{};
    ibv_qp_init_attr init{};
    ASSERT_EQ(ibvx_query_qp(qp->qp, &q, IBV_QP_STATE | IBV_QP_DEST_QPN, &init), 0);
    EXPECT_EQ(q.qp_state, IBV_QPS_RTS);
    EXPECT_EQ(q.dest_qp_num, 0x777U);
    EXPECT_EQ(init.qp_type, IBV_QPT_RC);
    EXPECT_EQ(init.cap.max_send_wr, 16U);
    EXPECT_EQ(init.send_cq, cq->cq);

    // A state the wire cannot carry is refused by the broker with EINVAL; state is unchanged.
    attr.qp_state = IBV_QPS_UNKNOWN;
    EXPECT_EQ(ibvx_modify_qp(qp->qp, &attr, IBV_QP_STATE), -EINVAL);
    EXPECT_EQ(qp->qp->state, IBV_QPS_RTS);

    EXPECT_EQ(ibv_destroy_qp_extend(ctx_, qp), 0);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), 0);
}

TEST_F(FakeBrokerTest, ExtendedAndHyroceCallsAreForwarded) {
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr);
    ibv_qp_extend *qp = createQp(cq);
    ASSERT_NE(qp, nullptr);
    ibv_qp_attr_extend ea{};
    ea.qp = qp->qp;
    ea.udp_src_port = 0x1234;
    ASSERT_EQ(ibv_modify_qp_extend(ctx_, &ea, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), 0);
    EXPECT_EQ(qp->vendor_priv_info.value, 0x34U);  // refreshed from the reply
    ibv_qp_attr_extend qa{};
    qa.qp = qp->qp;
    ASSERT_EQ(ibv_query_qp_extend(ctx_, &qa, IBV_QP_ATTR_EXTEND_UDP_SRC_PORT), 0);
    EXPECT_EQ(qa.udp_src_port, 0x1234U);
    // Mask bits beyond MAX are refused before any call, exactly as in direct mode.
    EXPECT_EQ(ibv_modify_qp_extend(ctx_, &ea, IBV_QP_ATTR_EXTEND_MAX), -EOPNOTSUPP);

    ibv_hyroce_feature f{};
    ASSERT_EQ(ibv_query_qp_supported_hyroce_feature(ctx_, qp->qp, 2, 0, &f), 0);
    EXPECT_EQ(f.type, 2);
    EXPECT_EQ(f.version, 2);
    ibv_hyroce_feature in{}, out{};
    in.version = 3;
    uint32_t more = 0;
    ASSERT_EQ(ibv_nego_qp_hyroce_feature(ctx_, qp->qp, &in, &out, &more), 0);
    EXPECT_EQ(out.version, 2);
    EXPECT_EQ(more, 1U);

    // A QP of another context is refused client-side.
    ibv_context_extend *other = ibvx_open_device("fake0");
    ASSERT_NE(other, nullptr);
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(other, qp->qp, 0, 0, &f), -EINVAL);
    EXPECT_EQ(ibvx_close_device(other), 0);

    EXPECT_EQ(ibv_destroy_qp_extend(ctx_, qp), 0);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), 0);
}

TEST_F(FakeBrokerTest, OpsTheDriverLacksAnswerEopnotsupp) {
    ibv_context_extend *v1 = ibvx_open_device("fake-v1");
    ASSERT_NE(v1, nullptr);
    EXPECT_EQ(v1->ops->version, IBV_EXTEND_DRIVER_VERSION_V1);
    ibv_device_attr_extend attr{};
    EXPECT_EQ(ibv_query_device_extend(v1, &attr), -EOPNOTSUPP);  // bit 6 absent
    ibv_qp_attr_extend ea{};
    EXPECT_EQ(ibv_modify_qp_extend(v1, &ea, 0), -EOPNOTSUPP);  // V2 op on a V1 driver
    ibv_hyroce_feature f{};
    ibv_qp dummy{};
    EXPECT_EQ(ibv_query_qp_supported_hyroce_feature(v1, &dummy, 0, 0, &f), -EOPNOTSUPP);
    EXPECT_EQ(ibvx_close_device(v1), 0);
}

TEST_F(FakeBrokerTest, BadArgumentsAnswerEinvalLikeDirectMode) {
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr);
    errno = 0;
    EXPECT_EQ(createQp(cq, IBV_QPT_RAW_PACKET), nullptr);  // not expressible on the wire
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(ibv_create_qp_extend(ctx_, nullptr), nullptr);
    EXPECT_EQ(errno, EINVAL);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, nullptr), -EINVAL);
    EXPECT_EQ(ibvx_modify_qp(nullptr, nullptr, 0), -EINVAL);
    // A CQ pointer the library never handed out.
    ibv_cq_extend bogus{};
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, &bogus), -EINVAL);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), 0);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), -EINVAL);  // already gone
}

TEST_F(FakeBrokerTest, OpenExtendOnABrokerContextAliasesIt) {
    ibv_context_extend *alias = ibv_open_extend(ctx_->context);
    ASSERT_NE(alias, nullptr);
    EXPECT_NE(alias, ctx_);
    EXPECT_EQ(alias->context, ctx_->context);
    ibv_cq_init_attr_extend a{};
    a.attr.cqe = 8;
    a.type = QU_BUF_DMA_MODE_DEFAULT;
    ibv_cq_extend *cq = ibv_create_cq_extend(alias, &a);
    ASSERT_NE(cq, nullptr);
    EXPECT_EQ(ibv_destroy_cq_extend(alias, cq), 0);
    EXPECT_EQ(ibv_close_extend(alias), 0);
    // The primary context is untouched by closing its alias.
    ibv_device_attr_extend attr{};
    EXPECT_EQ(ibv_query_device_extend(ctx_, &attr), 0);
}

TEST_F(FakeBrokerTest, ConcurrentCallsShareOneSession) {
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
            for (int i = 0; i < 25; ++i) {
                ibv_cq_extend *cq = createCq();
                if (cq == nullptr || *reinterpret_cast<const char *>(cq->cq_info.qbuf.base) != 'C' ||
                    ibv_destroy_cq_extend(ctx_, cq) != 0) {
                    failures++;
                }
            }
        });
    }
    for (auto &t : threads) {
        t.join();
    }
    EXPECT_EQ(failures.load(), 0);
}

TEST_F(FakeBrokerTest, WarningsNameTheProblemOnStderr) {
    setenv("IBV_EXTEND_SHOW_WARNINGS", "1", 1);
    testing::internal::CaptureStderr();
    EXPECT_EQ(ibvx_open_device("nosuch1"), nullptr);
    std::string err = testing::internal::GetCapturedStderr();
    unsetenv("IBV_EXTEND_SHOW_WARNINGS");
    EXPECT_NE(err.find("ibv_extend: Warning:"), std::string::npos) << err;
    EXPECT_NE(err.find("no device nosuch1"), std::string::npos) << err;
}

TEST_F(FakeBrokerTest, ForkedChildNeverUsesTheParentsSession) {
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr);
    pid_t pid = fork();
    if (pid == 0) {
        int code = 0;
        // The parent's regions are not inherited (MADV_DONTFORK)...
        if (countMappings(kRegionName) != 0) {
            code |= 1;
        }
        // ...its objects answer ENOTCONN instead of reaching the parent's session...
        ibv_cq_init_attr_extend a{};
        a.attr.cqe = 8;
        a.type = QU_BUF_DMA_MODE_DEFAULT;
        errno = 0;
        if (ibv_create_cq_extend(ctx_, &a) != nullptr || errno != ENOTCONN) {
            code |= 2;
        }
        // ...and the child's own calls get a fresh session that works.
        ibv_context_extend *mine = ibvx_open_device("fake0");
        ibv_cq_extend *ccq = mine != nullptr ? ibv_create_cq_extend(mine, &a) : nullptr;
        if (ccq == nullptr || *reinterpret_cast<const char *>(ccq->cq_info.qbuf.base) != 'C') {
            code |= 4;
        }
        _exit(code);
    }
    int status = -1;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    // The parent's session is untouched by the child.
    EXPECT_EQ(*reinterpret_cast<const char *>(cq->cq_info.qbuf.base), 'C');
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), 0);
}

TEST_F(FakeBrokerTest, HungBrokerHitsTheDeadline) {
    ASSERT_EQ(kill(broker_.pid(), SIGSTOP), 0);
    // kill() returns before the group stop completes: a broker thread already running could
    // still answer. The parent hears of the stop once every thread has stopped.
    int st = 0;
    ASSERT_EQ(waitpid(broker_.pid(), &st, WUNTRACED), broker_.pid());
    ASSERT_TRUE(WIFSTOPPED(st));
    errno = 0;
    ibv_cq_extend *cq = createCq();  // IBV_EXTEND_TIMEOUT_MS=6000
    int err = errno;
    kill(broker_.pid(), SIGCONT);
    EXPECT_EQ(cq, nullptr);
    EXPECT_EQ(err, ETIMEDOUT);
}

// Runs last in a full-binary run: it kills the shared broker and starts a new one.
TEST_F(FakeBrokerTest, VanishedBrokerFailsCallsAndANewSessionFollows) {
    ibv_cq_extend *cq = createCq();
    ASSERT_NE(cq, nullptr);
    broker_.stop(SIGKILL);
    errno = 0;
    EXPECT_EQ(createCq(), nullptr);
    EXPECT_TRUE(errno == ECONNRESET || errno == ENOTCONN) << strerror(errno);
    EXPECT_EQ(ibv_destroy_cq_extend(ctx_, cq), -ECONNRESET);  // freed locally all the same
    EXPECT_EQ(ibvx_dealloc_pd(pd_), -ECONNRESET);
    pd_ = nullptr;
    EXPECT_EQ(ibvx_close_device(ctx_), -ECONNRESET);
    ctx_ = nullptr;

    startBroker();
    ibv_context_extend *again = ibvx_open_device("fake0");
    ASSERT_NE(again, nullptr) << strerror(errno);
    EXPECT_EQ(ibvx_close_device(again), 0);
}

TEST(BrokerModeSelection, AutoPicksTheBrokerOnlyWhenItsSocketAnswers) {
    std::string dir = ibvx::test::makeTempDir();
    std::string sock = dir + "/m.sock";
    std::string probe = ibvx::test::selfDir() + "/ibvx-mode-probe";
    int status = -1;
    EXPECT_EQ(ibvx::test::runCapture({probe}, {"IBV_EXTEND_MODE=auto", "IBV_EXTEND_SOCKET=" + sock}, &status),
              "direct\n");
    {
        BrokerProcess b;
        ASSERT_TRUE(b.start({ibvx::test::selfDir() + "/ibvx-fake-broker", "{socket}"}, sock));
        EXPECT_EQ(ibvx::test::runCapture({probe, "fake0"}, {"IBV_EXTEND_SOCKET=" + sock}, &status),
                  "broker\nopen=ok\n");
        EXPECT_EQ(
            ibvx::test::runCapture({probe}, {"IBV_EXTEND_MODE=direct", "IBV_EXTEND_SOCKET=" + sock}, &status),
            "direct\n");
    }
    // Broker mode forced with nothing listening: calls fail with ENOTCONN instead of hanging.
    EXPECT_EQ(ibvx::test::runCapture({probe, "fake0"},
                                     {"IBV_EXTEND_MODE=broker", "IBV_EXTEND_SOCKET=" + sock}, &status),
              "broker\nopen=" + std::to_string(ENOTCONN) + "\n");
    unlink(sock.c_str());
    rmdir(dir.c_str());
}

}  // namespace
