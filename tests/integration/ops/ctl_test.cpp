// ibv-extendctl against the real ibv-extendd (softnda) on a short temp socket: every subcommand's
// table and JSON, the error messages and exit codes, and the Prometheus text format.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "run_process.h"
#include "tests/integration/daemon/broker_process.h"
#include "tests/integration/daemon/test_client.h"

namespace ibvx::test {
namespace {

using nlohmann::json;

// proto3 JSON writes 64-bit integers as strings.
uint64_t u64(const json &j) {
    return j.is_string() ? std::stoull(j.get<std::string>()) : j.get<uint64_t>();
}

// A handle as --json prints it: the 16 hex digits the tables and the broker's log show.
uint64_t handleOf(const json &j) {
    EXPECT_TRUE(j.is_string() && j.get<std::string>().size() == 16) << j.dump();
    return j.is_string() ? std::stoull(j.get<std::string>(), nullptr, 16) : 0;
}

struct Tenant {
    explicit Tenant(const std::string &sock) : client(sock) {}
    TestClient client;
    uint64_t ctx = 0, pd = 0, cq = 0, qp = 0;
    uint32_t qp_num = 0;

    bool open() {
        if (!client.connect()) {
            return false;
        }
        pb::OpenContextRequest oreq;
        oreq.set_device_name("softnda0");
        pb::OpenContextResponse oresp;
        if (!client.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok()) {
            return false;
        }
        ctx = oresp.context();
        pb::AllocPdRequest preq;
        preq.set_context(ctx);
        pb::AllocPdResponse presp;
        if (!client.call(&pb::Broker::Stub::AllocPd, preq, &presp).ok()) {
            return false;
        }
        pd = presp.pd();
        pb::CreateCqRequest creq;
        creq.set_context(ctx);
        creq.set_cqe(64);
        creq.set_dma_mode(pb::DMA_MODE_DEFAULT);
        pb::CreateCqResponse cresp;
        if (!client.call(&pb::Broker::Stub::CreateCq, creq, &cresp).ok()) {
            return false;
        }
        cq = cresp.cq();
        pb::CreateQpRequest qreq;
        qreq.set_context(ctx);
        qreq.set_pd(pd);
        qreq.set_send_cq(cq);
        qreq.set_recv_cq(cq);
        qreq.set_qp_type(pb::QP_TYPE_RC);
        qreq.mutable_cap()->set_max_send_wr(16);
        qreq.mutable_cap()->set_max_recv_wr(8);
        qreq.mutable_cap()->set_max_send_sge(1);
        qreq.mutable_cap()->set_max_recv_sge(1);
        qreq.set_dma_mode(pb::DMA_MODE_DEFAULT);
        pb::CreateQpResponse qresp;
        if (!client.call(&pb::Broker::Stub::CreateQp, qreq, &qresp).ok()) {
            return false;
        }
        qp = qresp.qp();
        qp_num = qresp.qp_num();
        return client.drainRegions() >= 0;
    }
};

class CtlTest : public ::testing::Test {
  protected:
    void SetUp() override { ASSERT_TRUE(broker_.started()) << broker_.log(); }

    ProcessResult ctl(std::vector<std::string> args, RunOptions o = {}) {
        std::vector<std::string> argv = {ctlBinary(), "--socket", broker_.socket()};
        argv.insert(argv.end(), args.begin(), args.end());
        return runProcess(argv, o);
    }
    json ctlJson(std::vector<std::string> args) {
        args.insert(args.begin(), "--json");
        ProcessResult r = ctl(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json::parse(r.out, nullptr, false);
    }

    BrokerProcess broker_;
};

TEST_F(CtlTest, StatusShowsVersionDevicesAndCounts) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    ProcessResult r = ctl({"status"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("ibv-extendd 4.2.0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("sessions:   1\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("objects:    4\n"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("softnda0  softnda  virtual"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(broker_.socket()), std::string::npos) << r.out;

    json j = ctlJson({"status"});
    ASSERT_FALSE(j.is_discarded());
    EXPECT_EQ(j["sessions"].get<uint32_t>(), 1u);
    EXPECT_EQ(u64(j["objects"]), 4u);
    EXPECT_EQ(j["pid"].get<int>(), broker_.pid());
    ASSERT_EQ(j["devices"].size(), 1u);
    EXPECT_EQ(j["devices"][0]["name"], "softnda0");
    EXPECT_GT(u64(j["arena_bytes"]), 0u);
    // The tenant's CQ and QP rang through softnda's per-context doorbell page.
    EXPECT_GT(u64(j["doorbell_pages"]), 0u) << j.dump();
}

TEST_F(CtlTest, SessionsListTheTenantWithItsObjectsAndCalls) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    json j = ctlJson({"sessions"});
    ASSERT_EQ(j["sessions"].size(), 1u) << j.dump();
    const json &s = j["sessions"][0];
    EXPECT_EQ(s["pid"].get<int>(), ::getpid());
    EXPECT_EQ(s["uid"].get<uint32_t>(), ::getuid());
    EXPECT_EQ(u64(s["objects"]), 4u);
    EXPECT_TRUE(s["attached"].get<bool>());
    EXPECT_EQ(u64(s["rpc_calls"]), 5u);  // Hello, OpenContext, AllocPd, CreateCq, CreateQp
    EXPECT_GT(u64(s["arena_bytes"]), 0u);

    ProcessResult r = ctl({"sessions"});
    ASSERT_EQ(r.exit_code, 0);
    std::istringstream lines(r.out);
    std::string header, row;
    std::getline(lines, header);
    std::getline(lines, row);
    EXPECT_EQ(header.rfind("SESSION", 0), 0u) << r.out;
    EXPECT_NE(row.find(" " + std::to_string(::getpid()) + " "), std::string::npos) << r.out;
    // Aligned: the OBJECTS column ends where its header ends.
    size_t end = header.find("OBJECTS") + std::string("OBJECTS").size();
    EXPECT_EQ(row.substr(end - 1, 1), "4") << r.out;
}

TEST_F(CtlTest, ObjectsShowQpDetailsAndFilter) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    json j = ctlJson({"objects", "--kind", "qp"});
    ASSERT_EQ(j["objects"].size(), 1u) << j.dump();
    const json &q = j["objects"][0];
    EXPECT_EQ(handleOf(q["handle"]), t.qp);
    EXPECT_EQ(q["device"], "softnda0");
    EXPECT_EQ(q["qp"]["qp_num"].get<uint32_t>(), t.qp_num);
    EXPECT_EQ(q["qp"]["state"], "RESET");
    EXPECT_EQ(q["qp"]["max_send_wr"].get<uint32_t>(), 16u);

    json all = ctlJson({"objects"});
    std::set<std::string> kinds;
    for (const auto &o : all["objects"]) {
        kinds.insert(o["kind"].get<std::string>());
    }
    EXPECT_EQ(kinds, (std::set<std::string>{"context", "pd", "cq", "qp"}));
    json cq = ctlJson({"objects", "--kind", "cq"});
    ASSERT_EQ(cq["objects"].size(), 1u);
    EXPECT_GE(cq["objects"][0]["cq"]["cqe"].get<uint32_t>(), 64u);
    // The ring the driver made: at least cqe entries of a non-zero size.
    EXPECT_GE(u64(cq["objects"][0]["cq"]["queue_bytes"]), 64u * 8u) << cq.dump();
    EXPECT_EQ(cq["objects"][0]["users"].get<uint32_t>(), 2u);  // the QP, as send and as recv CQ

    EXPECT_EQ(ctlJson({"objects", "--uid", "4242"})["objects"].size(), 0u);
    EXPECT_EQ(ctlJson({"objects", "--device", "nope0"})["objects"].size(), 0u);
    EXPECT_EQ(ctlJson({"objects", "--session", "999999"})["objects"].size(), 0u);

    ProcessResult r = ctl({"objects", "--kind", "qp"});
    ASSERT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("qpn=" + std::to_string(t.qp_num) + " RC RESET sq=16x1 rq=8x1"), std::string::npos)
        << r.out;
}

TEST_F(CtlTest, DriversListSoftnda) {
    json j = ctlJson({"drivers"});
    bool found = false, keeps = false;
    for (const auto &d : j["drivers"]) {
        if (d["name"] == "softnda") {
            found = true;
            ASSERT_TRUE(d.contains("restart_keeps")) << d.dump();
            keeps = d["restart_keeps"].get<bool>();
            EXPECT_TRUE(d["virtual_provider"].get<bool>());
            EXPECT_EQ(d["devices"][0], "softnda0");
            EXPECT_NE(d["library"].get<std::string>().find("libsoftnda.so"), std::string::npos);
        }
    }
    EXPECT_TRUE(found) << j.dump();
    ProcessResult r = ctl({"drivers"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("softnda  vdev"), std::string::npos) << r.out;
    // The table says what the JSON says (whether softnda hands over depends on its ABI V4 entries).
    std::istringstream lines(r.out);
    bool row = false;
    for (std::string line; std::getline(lines, line);) {
        row = row || (line.rfind("softnda ", 0) == 0 &&
                      line.find(keeps ? "restart: keeps" : "restart: drops") != std::string::npos);
    }
    EXPECT_TRUE(row) << r.out;
}

// The mlx5 extension driver is loaded and listed although this machine has no mlx5 device, and
// softnda still comes up as the default.
TEST(CtlDrivers, BrokerLoadsTheMlx5DriverWithoutAMatchingDevice) {
    const char *dir = std::getenv("IBV_EXTEND_PROVIDER_DIR");
    ASSERT_NE(dir, nullptr);
    struct stat st;
    if (::stat((std::string(dir) + "/libibvx_mlx5.so").c_str(), &st) != 0) {
        GTEST_SKIP() << "libibvx_mlx5.so not built (IBVX_WITH_MLX5=OFF or no mlx5dv)";
    }
    BrokerProcess broker("[drivers]\nnames = [\"ibvx_mlx5\"]\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    ProcessResult r = runProcess({ctlBinary(), "--socket", broker.socket(), "--json", "drivers"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    json j = json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    bool mlx5 = false, softnda = false;
    for (const auto &d : j["drivers"]) {
        if (d["name"] == "mlx5") {
            mlx5 = true;
            EXPECT_EQ(d.value("devices", json::array()).size(), 0u) << d.dump();
            EXPECT_NE(d["library"].get<std::string>().find("libibvx_mlx5.so"), std::string::npos) << d.dump();
            // rdma-core objects live in the kernel, tied to the broker's fds: mlx5 cannot hand over.
            EXPECT_FALSE(d.value("restart_keeps", true)) << d.dump();
        }
        softnda = softnda || d["name"] == "softnda";
    }
    EXPECT_TRUE(mlx5) << j.dump();
    EXPECT_TRUE(softnda) << j.dump();
}

TEST_F(CtlTest, StatsCountErrorsByCodeLatencyAndEngineCounters) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    pb::DestroyQpRequest bad;
    bad.set_qp(0x1234);
    pb::DestroyQpResponse resp;
    EXPECT_EQ(t.client.call(&pb::Broker::Stub::DestroyQp, bad, &resp).error_code(),
              grpc::StatusCode::NOT_FOUND);
    json j = ctlJson({"stats"});
    bool seen = false;
    for (const auto &m : j["rpcs"]) {
        EXPECT_EQ(u64(m["latency"]["count"]), u64(m["calls"])) << m.dump();
        if (m["method"] == "DestroyQp") {
            seen = true;
            EXPECT_EQ(u64(m["errors"]), 1u);
            ASSERT_EQ(m["errors_by_code"].size(), 1u);
            EXPECT_EQ(m["errors_by_code"][0]["code"], "NOT_FOUND");
        }
    }
    EXPECT_TRUE(seen);
    ASSERT_GE(j["engines"].size(), 1u);
    EXPECT_EQ(j["engines"][0]["device"], "softnda0");
    EXPECT_GE(j["engines"][0]["counters"].size(), 10u);
    ProcessResult r = ctl({"stats"});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_NE(r.out.find("NOT_FOUND=1"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("engine softnda0 (softnda)"), std::string::npos) << r.out;
}

// Every line is a comment (# HELP/# TYPE) or a sample of a family whose TYPE came first;
// histogram buckets are cumulative and end with le="+Inf" equal to _count.
TEST_F(CtlTest, MetricsAreValidPrometheusText) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    ProcessResult r = ctl({"metrics", "--format", "prometheus"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::regex help(R"(^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$)");
    const std::regex type(R"(^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram)$)");
    const std::regex sample(
        R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*")*\})? ([0-9.eE+-]+|\+Inf)$)");
    std::map<std::string, std::string> types;
    std::map<std::string, double> last_bucket;  // series without le -> last cumulative value
    std::istringstream in(r.out);
    std::string line;
    int samples = 0;
    bool saw_inf_equal_count = false;
    std::map<std::string, double> inf_of;
    while (std::getline(in, line)) {
        std::smatch m;
        if (std::regex_match(line, m, help)) {
            continue;
        }
        if (std::regex_match(line, m, type)) {
            EXPECT_EQ(types.count(m[1]), 0u) << "TYPE twice: " << line;
            types[m[1]] = m[2];
            continue;
        }
        ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a valid sample line: '" << line << "'";
        ++samples;
        std::string name = m[1];
        std::string base = name;
        for (const char *suffix : {"_bucket", "_sum", "_count"}) {
            std::string s(suffix);
            if (base.size() > s.size() && base.compare(base.size() - s.size(), s.size(), s) == 0 &&
                types.count(base.substr(0, base.size() - s.size())) != 0) {
                base = base.substr(0, base.size() - s.size());
            }
        }
        ASSERT_EQ(types.count(base), 1u) << "sample before its TYPE: " << line;
        double v = std::stod(m[m.size() - 1]);
        if (name.size() > 7 && name.compare(name.size() - 7, 7, "_bucket") == 0) {
            std::string labels = m[2];
            std::string series = labels.substr(0, labels.find(",le="));
            EXPECT_GE(v, last_bucket[series]) << "buckets not cumulative: " << line;
            last_bucket[series] = v;
            if (labels.find("le=\"+Inf\"") != std::string::npos) {
                inf_of[series.substr(1)] = v;
            }
        }
        if (name == "ibv_extend_rpc_duration_seconds_count") {
            std::string labels = m[2];
            std::string key = labels.substr(1, labels.size() - 2);
            ASSERT_EQ(inf_of.count(key), 1u) << line;
            EXPECT_EQ(inf_of[key], v) << line;
            saw_inf_equal_count = true;
        }
    }
    EXPECT_GT(samples, 50);
    EXPECT_TRUE(saw_inf_equal_count);
    EXPECT_EQ(types["ibv_extend_rpc_duration_seconds"], "histogram");
    EXPECT_NE(r.out.find("ibv_extend_sessions 1\n"), std::string::npos);
    EXPECT_NE(r.out.find("ibv_extend_rpc_calls_total{method=\"CreateQp\"} 1\n"), std::string::npos);
    EXPECT_NE(r.out.find("ibv_extend_engine_events_total{device=\"softnda0\""), std::string::npos);
}

TEST_F(CtlTest, EvictEndsTheSessionAndTheTenantGetsErrors) {
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());
    json s = ctlJson({"sessions"});
    ASSERT_EQ(s["sessions"].size(), 1u);
    std::string id = std::to_string(u64(s["sessions"][0]["id"]));
    ProcessResult r = ctl({"evict", id});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("session " + id + " evicted, 4 object(s) destroyed"), std::string::npos) << r.out;
    EXPECT_EQ(ctlJson({"sessions"})["sessions"].size(), 0u);
    EXPECT_EQ(u64(ctlJson({"status"})["objects"]), 0u);
    pb::AllocPdRequest preq;
    preq.set_context(t.ctx);
    pb::AllocPdResponse presp;
    EXPECT_EQ(t.client.call(&pb::Broker::Stub::AllocPd, preq, &presp).error_code(),
              grpc::StatusCode::UNAVAILABLE);
    ProcessResult again = ctl({"evict", id});
    EXPECT_EQ(again.exit_code, 1);
    EXPECT_NE(again.err.find("no live session"), std::string::npos) << again.err;
    EXPECT_EQ(u64(ctlJson({"stats"})["sessions_evicted"]), 1u);
}

TEST_F(CtlTest, WatchStreamsSessionAndObjectEvents) {
    Background bg =
        startBackground({ctlBinary(), "--socket", broker_.socket(), "--json", "watch", "--count", "4"},
                        broker_.dir() + "/watch.out");
    // The watcher subscribes asynchronously: make events until it has seen four.
    int rc = -2;
    for (int i = 0; i < 100 && rc == -2; ++i) {
        {
            TestClient c(broker_.socket());
            ASSERT_TRUE(c.connect());
            pb::OpenContextRequest oreq;
            oreq.set_device_name("softnda0");
            pb::OpenContextResponse oresp;
            ASSERT_TRUE(c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (int st; ::waitpid(bg.pid, &st, WNOHANG) == bg.pid) {
            bg.pid = -1;
            rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
    }
    if (bg.pid > 0) {
        rc = waitBackground(bg, 1000);
    }
    ASSERT_EQ(rc, 0) << readFile(broker_.dir() + "/watch.out");
    std::istringstream in(readFile(broker_.dir() + "/watch.out"));
    std::string line;
    std::set<std::string> kinds;
    uint64_t last_seq = 0;
    int n = 0;
    while (std::getline(in, line)) {
        json e = json::parse(line, nullptr, false);
        ASSERT_FALSE(e.is_discarded()) << line;
        uint64_t seq = u64(e["seq"]);
        EXPECT_GT(seq, last_seq);
        last_seq = seq;
        kinds.insert(e["kind"].get<std::string>());
        // As docs/ibv-extendctl.md says: every field present, object kinds as the tables
        // show them, handles in hex.
        EXPECT_TRUE(e.contains("uid") && e.contains("pid")) << line;
        if (e["kind"] == "OBJECT_CREATE" || e["kind"] == "OBJECT_DESTROY") {
            EXPECT_EQ(e["object_kind"], "context") << line;
            EXPECT_NE(handleOf(e["handle"]), 0u) << line;
        }
        EXPECT_EQ(line.find("OBJECT_KIND_"), std::string::npos) << line;
        ++n;
    }
    EXPECT_EQ(n, 4);
    // A session's life is open, context create, (context destroy,) close: four events include
    // at least two kinds.
    EXPECT_GE(kinds.size(), 2u);
    for (const auto &k : kinds) {
        EXPECT_TRUE(k == "SESSION_OPEN" || k == "SESSION_CLOSE" || k == "OBJECT_CREATE" ||
                    k == "OBJECT_DESTROY")
            << k;
    }
}

TEST_F(CtlTest, QuotaOverrideLimitsTheTenantAndShowsUsage) {
    std::string uid = std::to_string(::getuid());
    ProcessResult set = ctl({"quotas", "set", "--uid", uid, "qps", "1"});
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_NE(set.out.find("quota qps of uid " + uid + " set to 1"), std::string::npos) << set.out;
    Tenant t(broker_.socket());
    ASSERT_TRUE(t.open());  // its one QP
    pb::CreateQpRequest qreq;
    qreq.set_context(t.ctx);
    qreq.set_pd(t.pd);
    qreq.set_send_cq(t.cq);
    qreq.set_recv_cq(t.cq);
    qreq.set_qp_type(pb::QP_TYPE_RC);
    qreq.mutable_cap()->set_max_send_wr(4);
    qreq.mutable_cap()->set_max_recv_wr(4);
    qreq.mutable_cap()->set_max_send_sge(1);
    qreq.mutable_cap()->set_max_recv_sge(1);
    qreq.set_dma_mode(pb::DMA_MODE_DEFAULT);
    pb::CreateQpResponse qresp;
    EXPECT_EQ(t.client.call(&pb::Broker::Stub::CreateQp, qreq, &qresp).error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);

    json q = ctlJson({"quotas"});
    bool account = false;
    for (const auto &a : q["accounts"]) {
        if (a["scope"] == "uid" && a["uid"].get<uint32_t>() == ::getuid()) {
            for (const auto &v : a["quotas"]) {
                if (v["name"] == "qps") {
                    account = true;
                    EXPECT_EQ(u64(v["used"]), 1u);
                    EXPECT_EQ(u64(v["limit"]), 1u);
                }
            }
        }
    }
    EXPECT_TRUE(account) << q.dump();
    ASSERT_EQ(q["overrides"].size(), 1u);
    ProcessResult table = ctl({"quotas"});
    EXPECT_EQ(table.exit_code, 0);
    EXPECT_NE(table.out.find("uid " + uid), std::string::npos) << table.out;
    EXPECT_EQ(ctl({"quotas", "set", "--uid", uid, "qps", "clear"}).exit_code, 0);
    EXPECT_EQ(ctlJson({"quotas"})["overrides"].size(), 0u);
    EXPECT_EQ(ctl({"quotas", "set", "--uid", uid, "no_such_quota", "1"}).exit_code, 1);
    EXPECT_EQ(ctl({"quotas", "set", "qps", "1"}).exit_code, 2);
}

// A Kubernetes namespace's account is set and shown like a uid's; --namespace excludes the other
// account options.
TEST_F(CtlTest, NamespaceQuotaIsSetAndShown) {
    ProcessResult set = ctl({"quotas", "set", "--namespace", "team-a", "qps", "3"});
    ASSERT_EQ(set.exit_code, 0) << set.err;
    EXPECT_NE(set.out.find("quota qps of namespace team-a set to 3"), std::string::npos) << set.out;
    json q = ctlJson({"quotas"});
    ASSERT_EQ(q["overrides"].size(), 1u) << q.dump();
    EXPECT_EQ(q["overrides"][0]["scope"], "namespace") << q.dump();
    EXPECT_EQ(q["overrides"][0]["pod_namespace"], "team-a") << q.dump();
    ProcessResult table = ctl({"quotas"});
    EXPECT_NE(table.out.find("namespace team-a"), std::string::npos) << table.out;
    EXPECT_EQ(ctl({"quotas", "set", "--namespace", "team-a", "--uid", "5", "qps", "1"}).exit_code, 2);
    EXPECT_EQ(ctl({"quotas", "set", "--namespace", "team-a", "qps", "clear"}).exit_code, 0);
    EXPECT_EQ(ctlJson({"quotas"})["overrides"].size(), 0u);
}

// A quota VALUE that is no limit is a usage error before any broker is asked: "-5" was stored
// as 18446744073709551611.
TEST_F(CtlTest, QuotaValuesMustBeLimits) {
    struct Case {
        const char *value, *says;
    } cases[] = {{"-5", "'-5' is negative"},
                 {"-0", "'-0' is negative"},
                 {"5x", "'5x' is not a number"},
                 {"lots", "'lots' is not a number"},
                 {"+5", "'+5' is not a number"},
                 {"9223372036854775808", "is too large"},
                 {"18446744073709551616", "is too large"}};
    for (const Case &c : cases) {
        ProcessResult r = ctl({"quotas", "set", "--uid", "1000", "qps", c.value});
        EXPECT_EQ(r.exit_code, 2) << c.value << ": " << r.out << r.err;
        EXPECT_NE(r.err.find(c.says), std::string::npos) << r.err;
        EXPECT_NE(
            r.err.find("from 0 (nothing may be created) to 9223372036854775807, 'unlimited' or 'clear'"),
            std::string::npos)
            << r.err;
    }
    EXPECT_EQ(ctlJson({"quotas"})["overrides"].size(), 0u);
    // Checked with the command line: no broker needed to say so.
    ProcessResult offline = runProcess({ctlBinary(), "--socket", broker_.dir() + "/none.sock", "quotas",
                                        "set", "--uid", "1000", "qps", "-5"});
    EXPECT_EQ(offline.exit_code, 2) << offline.err;
    // The largest limit is one.
    ASSERT_EQ(ctl({"quotas", "set", "--uid", "1000", "qps", "9223372036854775807"}).exit_code, 0);
    json q = ctlJson({"quotas"});
    ASSERT_EQ(q["overrides"].size(), 1u) << q.dump();
    EXPECT_EQ(u64(q["overrides"][0]["quotas"][0]["limit"]), 9223372036854775807u) << q.dump();
}

// The broker itself refuses a limit no configuration could hold (what an older ibv-extendctl
// sent for "-5"), and keeps taking unlimited.
TEST_F(CtlTest, BrokerRefusesAbsurdQuotaLimits) {
    auto admin = pb::Admin::NewStub(
        grpc::CreateChannel("unix:" + broker_.socket(), grpc::InsecureChannelCredentials()));
    for (uint64_t absurd : {uint64_t{18446744073709551611u}, uint64_t{1} << 63, ~uint64_t{0}}) {
        pb::SetQuotaRequest req;
        req.set_scope(pb::QUOTA_SCOPE_UID);
        req.set_uid(1000);
        req.set_quota("qps");
        req.set_limit(absurd);
        pb::SetQuotaResponse resp;
        grpc::ClientContext ctx;
        grpc::Status st = admin->SetQuota(&ctx, req, &resp);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << absurd;
        EXPECT_NE(st.error_message().find("out of range: a limit is 0..9223372036854775807"),
                  std::string::npos)
            << st.error_message();
        EXPECT_NE(st.error_message().find("unlimited"), std::string::npos) << st.error_message();
    }
    pb::SetQuotaRequest unlimited;
    unlimited.set_scope(pb::QUOTA_SCOPE_DEFAULT);
    unlimited.set_quota("qps");
    unlimited.set_unlimited(true);
    unlimited.set_limit(~uint64_t{0});  // ignored when unlimited
    pb::SetQuotaResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin->SetQuota(&ctx, unlimited, &resp).ok());
    EXPECT_EQ(ctlJson({"quotas"})["overrides"].size(), 0u);
}

TEST_F(CtlTest, WatchReportsQuotaDenialsNamingTheQuota) {
    std::string uid = std::to_string(::getuid());
    ASSERT_EQ(ctl({"quotas", "set", "--uid", uid, "pds", "0"}).exit_code, 0);
    Background bg = startBackground({ctlBinary(), "--socket", broker_.socket(), "--json", "watch"},
                                    broker_.dir() + "/watch-quota.out");
    // The watcher subscribes asynchronously: keep being refused until it has seen a denial.
    bool seen = false;
    for (int i = 0; i < 50 && !seen; ++i) {
        TestClient c(broker_.socket());
        ASSERT_TRUE(c.connect());
        pb::OpenContextRequest oreq;
        oreq.set_device_name("softnda0");
        pb::OpenContextResponse oresp;
        ASSERT_TRUE(c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok());
        pb::AllocPdRequest preq;
        preq.set_context(oresp.context());
        pb::AllocPdResponse presp;
        ASSERT_EQ(c.call(&pb::Broker::Stub::AllocPd, preq, &presp).error_code(),
                  grpc::StatusCode::RESOURCE_EXHAUSTED);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::istringstream in(readFile(broker_.dir() + "/watch-quota.out"));
        for (std::string line; std::getline(in, line);) {
            json e = json::parse(line, nullptr, false);
            if (!e.is_discarded() && e["kind"] == "QUOTA_DENIAL") {
                seen = true;
                EXPECT_NE(e["message"].get<std::string>().find("pds"), std::string::npos) << line;
                // proto3 JSON leaves out zero values (uid 0 when the tests run as root).
                EXPECT_EQ(e.value("uid", 0u), ::getuid()) << line;
                EXPECT_EQ(e.value("pid", 0), ::getpid()) << line;
                EXPECT_NE(u64(e["session"]), 0u) << line;
            }
        }
    }
    (void)waitBackground(bg, 0);
    EXPECT_TRUE(seen) << readFile(broker_.dir() + "/watch-quota.out");
    EXPECT_EQ(ctl({"quotas", "set", "--uid", uid, "pds", "clear"}).exit_code, 0);
}

TEST_F(CtlTest, ReloadReportsDevices) {
    ProcessResult r = ctl({"reload"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("reloaded: 0 new device(s), 1 total"), std::string::npos) << r.out;
}

// A reload that reports an error says so first, on stderr, and exits 1, so that
// ExecReload=ibv-extendctl reload makes `systemctl reload` fail.
TEST(CtlReload, ErrorsComeFirstAndTheExitCodeIsOne) {
    BrokerProcess broker("[broker]\nlog_level = \"debug\"\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    std::ofstream(broker.dir() + "/ibv-extendd.toml") << "[broker]\nbogus = 1\n";
    ProcessResult r = runProcess({ctlBinary(), "--socket", broker.socket(), "reload"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("ibv-extendctl: reload error: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("ibv-extendd.toml:2: unknown key 'broker.bogus'"), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("reloaded:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("reload incomplete (1 error(s), above)"), std::string::npos) << r.out;
    // On one stream (a terminal, the journal) the error comes before the summary.
    ProcessResult merged =
        runProcess({"/bin/sh", "-c", "\"$0\" --socket \"$1\" reload 2>&1", ctlBinary(), broker.socket()});
    EXPECT_EQ(merged.exit_code, 1);
    size_t error = merged.out.find("reload error"), summary = merged.out.find("reload incomplete");
    ASSERT_NE(error, std::string::npos) << merged.out;
    ASSERT_NE(summary, std::string::npos) << merged.out;
    EXPECT_LT(error, summary) << merged.out;
    ProcessResult j = runProcess({ctlBinary(), "--socket", broker.socket(), "--json", "reload"});
    EXPECT_EQ(j.exit_code, 1);
    EXPECT_NE(j.err.find("reload error"), std::string::npos) << j.err;
    EXPECT_EQ(json::parse(j.out, nullptr, false)["errors"].size(), 1u) << j.out;
    // Fixed again, the reload succeeds.
    std::ofstream(broker.dir() + "/ibv-extendd.toml") << "[broker]\n";
    ProcessResult ok = runProcess({ctlBinary(), "--socket", broker.socket(), "reload"});
    EXPECT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_EQ(ok.err, "");
    EXPECT_NE(ok.out.find("reloaded: "), std::string::npos) << ok.out;
}

// A provider option softnda does not know is an error on a reload too, while a tenant has a
// device open (when softnda can apply no option at all): not a "not applied" warning.
TEST(CtlReload, AnUnknownProviderOptionIsAnErrorWhileDevicesAreOpen) {
    BrokerProcess broker("[softnda]\nmax_qp = 1024\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    Tenant t(broker.socket());
    ASSERT_TRUE(t.open());
    std::ofstream(broker.dir() + "/ibv-extendd.toml") << "[softnda]\nnames = \"nosuch\"\n";
    ProcessResult r = runProcess({ctlBinary(), "--socket", broker.socket(), "reload"});
    EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
    EXPECT_NE(r.err.find("ibv-extendd.toml:2: softnda.names = 'nosuch' rejected by the provider"),
              std::string::npos)
        << r.err;
}

TEST_F(CtlTest, DevinfoNeedsNoAdminAndShowsCapabilities) {
    ProcessResult r = ctl({"devinfo"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("hca_id:\tsoftnda0"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(NDR|NDA)"), std::string::npos) << r.out;
    json j = ctlJson({"devinfo"});
    ASSERT_EQ(j.size(), 1u);
    EXPECT_TRUE(j[0]["queried"].get<bool>());
    EXPECT_EQ(j[0]["ext_cap_names"], "NDR|NDA");
}

TEST_F(CtlTest, EnvironmentSelectsTheSocket) {
    RunOptions o;
    o.env = {"IBV_EXTEND_SOCKET=" + broker_.socket()};
    ProcessResult r = runProcess({ctlBinary(), "status"}, o);
    EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(CtlTest, GlobalOptionsWorkOnEitherSideOfTheSubcommand) {
    for (const std::vector<std::string> &argv :
         {std::vector<std::string>{ctlBinary(), "--json", "--timeout", "5", "--socket", broker_.socket(),
                                   "status"},
          std::vector<std::string>{ctlBinary(), "status", "--json", "--timeout", "5", "--socket",
                                   broker_.socket()},
          std::vector<std::string>{ctlBinary(), "objects", "--kind", "qp", "--json", "--socket",
                                   broker_.socket()},
          std::vector<std::string>{ctlBinary(), "quotas", "--socket", broker_.socket(), "--json"}}) {
        ProcessResult r = runProcess(argv);
        EXPECT_EQ(r.exit_code, 0) << argv[1] << ": " << r.err;
        EXPECT_FALSE(json::parse(r.out, nullptr, false).is_discarded()) << argv[1] << ": " << r.out;
    }
    EXPECT_EQ(runProcess({ctlBinary(), "status", "--timeout", "0", "--socket", broker_.socket()}).exit_code,
              2);
}

// Listings page; ibv-extendctl fetches every page, so a page of one lists everything.
TEST_F(CtlTest, SessionsAndObjectsListEveryPage) {
    std::vector<std::unique_ptr<Tenant>> tenants;
    for (int i = 0; i < 3; ++i) {
        tenants.push_back(std::make_unique<Tenant>(broker_.socket()));
        ASSERT_TRUE(tenants.back()->open());
    }
    json paged = ctlJson({"sessions", "--page-size", "1"});
    ASSERT_EQ(paged["sessions"].size(), 3u) << paged.dump();
    std::set<uint64_t> ids;
    for (const auto &s : paged["sessions"]) {
        ids.insert(u64(s["id"]));
        EXPECT_EQ(u64(s["objects"]), 4u);
    }
    EXPECT_EQ(ids.size(), 3u);
    EXPECT_FALSE(paged.contains("next_page_token"));

    json objects = ctlJson({"objects"});
    ASSERT_EQ(objects["objects"].size(), 12u) << objects.dump();  // 4 of each tenant
    json objects_paged = ctlJson({"objects", "--page-size", "5"});
    EXPECT_EQ(objects_paged["objects"], objects["objects"]);  // nothing in them moves with time
    json qps = ctlJson({"objects", "--kind", "qp", "--page-size", "1"});
    ASSERT_EQ(qps["objects"].size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(handleOf(qps["objects"][i]["handle"]), tenants[i]->qp);
    }
}

TEST_F(CtlTest, PagesAreContiguousAndABadTokenIsRefused) {
    Tenant a(broker_.socket()), b(broker_.socket());
    ASSERT_TRUE(a.open());
    ASSERT_TRUE(b.open());
    auto admin = pb::Admin::NewStub(
        grpc::CreateChannel("unix:" + broker_.socket(), grpc::InsecureChannelCredentials()));
    pb::ListObjectsRequest req;
    req.set_page_size(3);
    std::vector<uint64_t> handles;
    int pages = 0;
    do {
        grpc::ClientContext ctx;
        pb::ListObjectsResponse resp;
        ASSERT_TRUE(admin->ListObjects(&ctx, req, &resp).ok());
        ASSERT_LE(resp.objects_size(), 3);
        for (const auto &o : resp.objects()) {
            handles.push_back(o.handle());
        }
        req.set_page_token(resp.next_page_token());
        ++pages;
    } while (!req.page_token().empty());
    EXPECT_EQ(handles.size(), 8u);
    EXPECT_EQ(pages, 3);
    EXPECT_EQ(std::set<uint64_t>(handles.begin(), handles.end()).size(), handles.size());

    for (const char *bad : {"garbage", "o1.2", "o1.2.3.4", "s1", "o1.x.3"}) {
        grpc::ClientContext ctx;
        pb::ListObjectsRequest r;
        r.set_page_token(bad);
        pb::ListObjectsResponse resp;
        grpc::Status st = admin->ListObjects(&ctx, r, &resp);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
        EXPECT_NE(st.error_message().find("page_token"), std::string::npos) << st.error_message();
    }
    grpc::ClientContext ctx;
    pb::ListSessionsRequest sr;
    sr.set_page_token("o1.2.3");
    pb::ListSessionsResponse sresp;
    EXPECT_EQ(admin->ListSessions(&ctx, sr, &sresp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Admin calls go through the same wrapper as Broker calls: counted (apart from total_calls)
// and their failures by code.
TEST_F(CtlTest, AdminCallsAreCountedApartFromBrokerCalls) {
    ASSERT_EQ(ctl({"status"}).exit_code, 0);
    ASSERT_EQ(ctl({"evict", "999999"}).exit_code, 1);  // NOT_FOUND
    json j = ctlJson({"stats"});
    std::map<std::string, json> admin;
    for (const auto &m : j["admin_rpcs"]) {
        admin[m["method"].get<std::string>()] = m;
    }
    ASSERT_TRUE(admin.count("GetStatus")) << j.dump();
    EXPECT_EQ(u64(admin["GetStatus"]["calls"]), 1u);
    EXPECT_EQ(u64(admin["EvictSession"]["errors"]), 1u);
    EXPECT_EQ(admin["EvictSession"]["errors_by_code"][0]["code"], "NOT_FOUND");
    EXPECT_EQ(u64(admin["GetStats"]["calls"]), 0u);  // this call is recorded as it replies
    EXPECT_EQ(u64(j["total_calls"]), 0u);            // no Broker call was made
}

TEST(CtlErrors, BrokerNotRunningNamesTheSocketAndSystemctl) {
    char tmpl[] = "/tmp/ibvx.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    std::string sock = std::string(tmpl) + "/none.sock";
    ProcessResult r = runProcess({ctlBinary(), "--socket", sock, "status"});
    ::rmdir(tmpl);
    EXPECT_EQ(r.exit_code, 3);
    EXPECT_NE(r.err.find("the broker is not running"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(sock), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("systemctl status ibv-extendd"), std::string::npos) << r.err;
}

TEST(CtlErrors, AnUnknownCommandIsNamedAndTheCommandsListed) {
    for (const std::vector<std::string> &argv :
         {std::vector<std::string>{ctlBinary(), "frobnicate"},
          std::vector<std::string>{ctlBinary(), "--json", "frobnicate", "--count", "3"}}) {
        ProcessResult r = runProcess(argv);
        EXPECT_EQ(r.exit_code, 2) << r.err;
        EXPECT_NE(r.err.find("ibv-extendctl: unknown command 'frobnicate'"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find("commands: status, drivers, sessions, objects, stats, metrics, evict, reload, "
                             "restart, watch, quotas, devinfo"),
                  std::string::npos)
            << r.err;
        EXPECT_EQ(r.err.find("A subcommand is required"), std::string::npos) << r.err;
    }
    ProcessResult none = runProcess({ctlBinary()});
    EXPECT_EQ(none.exit_code, 2);
    EXPECT_NE(none.err.find("a command is required"), std::string::npos) << none.err;
    EXPECT_NE(none.err.find("commands: status,"), std::string::npos) << none.err;
    // An unknown option is CLI11's to describe.
    ProcessResult option = runProcess({ctlBinary(), "--frobnicate", "status"});
    EXPECT_EQ(option.exit_code, 2);
    EXPECT_NE(option.err.find("--frobnicate"), std::string::npos) << option.err;
}

TEST(CtlErrors, UsageErrorsExitTwo) {
    EXPECT_EQ(runProcess({ctlBinary()}).exit_code, 2);
    EXPECT_EQ(runProcess({ctlBinary(), "no-such-command"}).exit_code, 2);
    EXPECT_EQ(runProcess({ctlBinary(), "objects", "--kind", "banana"}).exit_code, 2);
    ProcessResult help = runProcess({ctlBinary(), "--help"});
    EXPECT_EQ(help.exit_code, 0);
    EXPECT_NE(help.out.find("Exit codes"), std::string::npos);
}

TEST(CtlPermissions, NonAdminIsDeniedAndToldAboutTheAdminGroup) {
    if (::geteuid() != 0) {
        GTEST_SKIP() << "needs root to run a child as uid 65534";
    }
    BrokerProcess broker("[broker]\nsocket_mode = \"0666\"\n");
    ASSERT_TRUE(broker.started()) << broker.log();
    ASSERT_EQ(::chmod(broker.dir().c_str(), 0755), 0);
    RunOptions nobody;
    nobody.uid = 65534;
    ProcessResult r = runProcess({ctlBinary(), "--socket", broker.socket(), "sessions"}, nobody);
    EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
    EXPECT_NE(r.err.find("permission denied"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("admin group"), std::string::npos) << r.err;
    ProcessResult w = runProcess({ctlBinary(), "--socket", broker.socket(), "watch", "--count", "1"}, nobody);
    EXPECT_EQ(w.exit_code, 4) << w.err;
    // devinfo is a tenant command: no admin needed.
    ProcessResult d = runProcess({ctlBinary(), "--socket", broker.socket(), "devinfo"}, nobody);
    EXPECT_EQ(d.exit_code, 0) << d.err;
    EXPECT_NE(d.out.find("softnda0"), std::string::npos);
}

}  // namespace
}  // namespace ibvx::test
