// ibv-extendctl's output helpers on hand-made Admin replies.
#include "tools/ibv-extendctl/format.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace ibvx::ctl {
namespace {

namespace pb = ::ibv_extend::v1;

TEST(Table, PadsColumnsAndRightAlignsNumbers) {
    Table t({"NAME", "COUNT", "NOTE"});
    t.add({"a", "1", "x"});
    t.add({"longer", "12345", "-"});
    EXPECT_EQ(t.render(),
              "NAME    COUNT  NOTE\n"
              "a           1  x\n"
              "longer  12345  -\n");
}

TEST(Table, HeaderOnlyWhenEmpty) {
    EXPECT_EQ(Table({"A", "B"}).render(), "A  B\n");
}

TEST(Human, BytesAndDurations) {
    EXPECT_EQ(humanBytes(0), "0 B");
    EXPECT_EQ(humanBytes(1023), "1023 B");
    EXPECT_EQ(humanBytes(256 * 1024), "256.0 KiB");
    EXPECT_EQ(humanBytes(3ull << 30), "3.0 GiB");
    EXPECT_EQ(humanDuration(850), "850ms");
    EXPECT_EQ(humanDuration(12000), "12s");
    EXPECT_EQ(humanDuration(184000), "3m04s");
    EXPECT_EQ(humanDuration(2 * 3600000 + 5 * 60000), "2h05m");
    EXPECT_EQ(hex64(0xabc), "0000000000000abc");
    EXPECT_EQ(extCapNames(3), "NDR|NDA");
    EXPECT_EQ(extCapNames(0), "none");
    EXPECT_EQ(extCapNames(0x10 | 1), "NDR|0x10");
}

pb::LatencyHistogram histogram(std::vector<uint64_t> bounds, std::vector<uint64_t> counts) {
    pb::LatencyHistogram h;
    uint64_t n = 0;
    for (auto b : bounds) {
        h.add_bucket_upper_us(b);
    }
    for (auto c : counts) {
        h.add_counts(c);
        n += c;
    }
    h.set_count(n);
    return h;
}

TEST(Latency, QuantilesComeFromBucketBounds) {
    auto h = histogram({10, 100, 1000}, {50, 45, 4, 1});
    EXPECT_EQ(latencyQuantileUs(h, 0.5), 10u);
    EXPECT_EQ(latencyQuantileUs(h, 0.9), 100u);
    EXPECT_EQ(latencyQuantileUs(h, 0.99), 1000u);
    EXPECT_EQ(latencyQuantileUs(h, 1.0), 1000u);  // the overflow bucket reports the last bound
    EXPECT_EQ(latencyQuantileUs(histogram({10}, {0, 0}), 0.5), 0u);
}

TEST(Prometheus, HistogramIsCumulativeWithInfEqualToCount) {
    pb::GetStatsResponse s;
    s.set_sessions(2);
    auto *r = s.add_rpcs();
    r->set_method("CreateQp");
    r->set_calls(5);
    r->set_errors(1);
    auto *e = r->add_errors_by_code();
    e->set_code(pb::ERROR_CODE_RESOURCE_EXHAUSTED);
    e->set_count(1);
    *r->mutable_latency() = histogram({10, 100}, {2, 2, 1});
    r->mutable_latency()->set_sum_us(1500);
    auto *eng = s.add_engines();
    eng->set_device("soft\"nda0");
    eng->set_provider("softnda");
    auto *c = eng->add_counters();
    c->set_name("cqes");
    c->set_value(7);
    std::string text = prometheusText(s);
    EXPECT_NE(text.find("# TYPE ibv_extend_rpc_duration_seconds histogram\n"), std::string::npos);
    EXPECT_NE(text.find("ibv_extend_rpc_duration_seconds_bucket{method=\"CreateQp\",le=\"1e-05\"} 2\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("ibv_extend_rpc_duration_seconds_bucket{method=\"CreateQp\",le=\"0.0001\"} 4\n"),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("ibv_extend_rpc_duration_seconds_bucket{method=\"CreateQp\",le=\"+Inf\"} 5\n"),
              std::string::npos);
    EXPECT_NE(text.find("ibv_extend_rpc_duration_seconds_sum{method=\"CreateQp\"} 0.0015\n"),
              std::string::npos);
    EXPECT_NE(text.find("ibv_extend_rpc_errors_total{method=\"CreateQp\",code=\"RESOURCE_EXHAUSTED\"} 1\n"),
              std::string::npos);
    EXPECT_NE(text.find("ibv_extend_sessions 2\n"), std::string::npos);
    // Label values are escaped.
    EXPECT_NE(text.find("device=\"soft\\\"nda0\""), std::string::npos) << text;
    EXPECT_EQ(text.back(), '\n');
}

// Handles in JSON are the hex64() strings of the tables and the broker's log, not proto3's
// decimal strings.
TEST(Json, HandlesAreHexAsInTables) {
    pb::ListObjectsResponse r;
    auto *o = r.add_objects();
    o->set_handle(0xabc);
    o->set_kind(pb::OBJECT_KIND_CQ);
    o->add_uses(0x1f);
    o->add_uses(0xfedcba9876543210);
    auto j = nlohmann::json::parse(toJson(r));
    EXPECT_EQ(j["objects"][0]["handle"], hex64(0xabc));
    EXPECT_EQ(j["objects"][0]["handle"], "0000000000000abc");
    EXPECT_EQ(j["objects"][0]["uses"], (nlohmann::json{"000000000000001f", "fedcba9876543210"}));
    EXPECT_EQ(j["objects"][0]["kind"], "cq");
}

// watch --json: one line an event, every field present (uid 0 of a root tenant too), the object
// kind as the tables show it, the handle in hex.
TEST(Json, WatchEventsAreOneLineWithShortKindsAndEveryField) {
    pb::AdminEvent e;
    e.set_seq(7);
    e.set_kind(pb::AdminEvent::OBJECT_CREATE);
    e.set_session(3);
    e.set_uid(0);
    e.set_object_kind(pb::OBJECT_KIND_CONTEXT);
    e.set_handle(0x10002);
    std::string line = toJsonLine(e);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    EXPECT_EQ(line.find("OBJECT_KIND_"), std::string::npos) << line;
    auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["object_kind"], "context");
    ASSERT_TRUE(j.contains("uid")) << line;
    EXPECT_EQ(j["uid"], 0);
    EXPECT_EQ(j["handle"], "0000000000010002");
    EXPECT_EQ(j["kind"], "OBJECT_CREATE");  // the event kind keeps its name (scripts match on it)
    EXPECT_NE(line.find("\"kind\":\"OBJECT_CREATE\""), std::string::npos) << line;
}

}  // namespace
}  // namespace ibvx::ctl
