// Output of ibv-extendctl: aligned tables for people, Prometheus text exposition for scrapers.
// Pure functions of the Admin replies, so tests check them without a broker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ibv_extend/v1/admin.pb.h"

namespace ibvx::ctl {

// Columns padded to their widest cell, two spaces apart; numeric-looking columns right-aligned.
class Table {
  public:
    explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
    void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
    std::string render() const;
    size_t rows() const { return rows_.size(); }

  private:
    std::vector<std::string> header_;
    std::vector<std::vector<std::string>> rows_;
};

std::string humanBytes(uint64_t bytes);     // "0 B", "256.0 KiB", "1.5 GiB"
std::string humanDuration(uint64_t ms);     // "850ms", "12s", "3m04s", "2h05m", "3d04h"
std::string hex64(uint64_t v);              // 16 lower-case hex digits
std::string isoUtc(uint64_t unix_ms);       // "2026-12-01T15:20:01.123Z"
std::string extCapNames(uint32_t ext_cap);  // "NDA_DIRECT_WQE|..." or "none"
// The latency (µs) below which q (0..1) of the calls finished, from the histogram's bucket
// bounds (an upper estimate); 0 when there were no calls.
uint64_t latencyQuantileUs(const ::ibv_extend::v1::LatencyHistogram &h, double q);

// Prometheus text exposition format 0.0.4 of a GetStats reply.
std::string prometheusText(const ::ibv_extend::v1::GetStatsResponse &stats);

// How ibv-extendctl shows an Admin enum value: its name without the enum's prefix, lower-case for
// object kinds and quota scopes ("QP_STATE_RESET" -> "RESET", "OBJECT_KIND_QP" -> "qp").
std::string enumLabel(const std::string &proto_name);
std::string label(::ibv_extend::v1::ObjectKind v);
std::string label(::ibv_extend::v1::QpState v);
std::string label(::ibv_extend::v1::QpType v);
std::string label(::ibv_extend::v1::QuotaScope v);
std::string label(::ibv_extend::v1::ErrorCode v);

// The reply as JSON (proto field names, defaults included), enum values as enumLabel() shows
// them, object handles ("handle", "uses") as the 16-digit hex64() strings the tables and the
// broker's log show; a listing's next_page_token is left out (ibv-extendctl fetches every page).
std::string toJson(const google::protobuf::Message &m);
// The same, on one line (watch --json prints one event a line).
std::string toJsonLine(const google::protobuf::Message &m);

}  // namespace ibvx::ctl
