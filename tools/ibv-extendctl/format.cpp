#include "tools/ibv-extendctl/format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

namespace ibvx::ctl {
namespace pb = ::ibv_extend::v1;

namespace {

bool numeric(const std::string &s) {
    if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) {
        return false;
    }
    // "12", "4.0 KiB", "850ms": starts with a digit and has no letters before a unit suffix.
    return s.find_first_not_of("0123456789. KMGTiBmshd%/") == std::string::npos;
}

std::string escapeLabel(const std::string &v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') {
            out += '\\';
            out += c;
        } else if (c == '\n') {
            out += "\\n";
        } else {
            out += c;
        }
    }
    return out;
}

void family(std::ostringstream &o, const char *name, const char *type, const char *help) {
    o << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
}

std::string seconds(uint64_t us) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(us) / 1e6);
    return buf;
}

}  // namespace

std::string Table::render() const {
    std::vector<size_t> width(header_.size(), 0);
    std::vector<bool> right(header_.size(), true);
    for (size_t c = 0; c < header_.size(); ++c) {
        width[c] = header_[c].size();
    }
    for (const auto &r : rows_) {
        for (size_t c = 0; c < r.size() && c < width.size(); ++c) {
            width[c] = std::max(width[c], r[c].size());
            if (!r[c].empty() && r[c] != "-" && !numeric(r[c])) {
                right[c] = false;
            }
        }
    }
    if (rows_.empty()) {
        std::fill(right.begin(), right.end(), false);
    }
    std::ostringstream o;
    auto line = [&](const std::vector<std::string> &cells) {
        std::string l;
        for (size_t c = 0; c < width.size(); ++c) {
            std::string cell = c < cells.size() ? cells[c] : "";
            std::string pad(width[c] - std::min(width[c], cell.size()), ' ');
            bool last = c + 1 == width.size();
            l += right[c] ? pad + cell : (last ? cell : cell + pad);
            if (!last) {
                l += "  ";
            }
        }
        while (!l.empty() && l.back() == ' ') {
            l.pop_back();
        }
        o << l << '\n';
    };
    line(header_);
    for (const auto &r : rows_) {
        line(r);
    }
    return o.str();
}

std::string humanBytes(uint64_t bytes) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    if (bytes < 1024) {
        return std::to_string(bytes) + " B";
    }
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
    return buf;
}

std::string humanDuration(uint64_t ms) {
    char buf[32];
    uint64_t s = ms / 1000;
    if (ms < 1000) {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 "ms", ms);
    } else if (s < 60) {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 "s", s);
    } else if (s < 3600) {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
    } else if (s < 86400) {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 "h%02" PRIu64 "m", s / 3600, (s % 3600) / 60);
    } else {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 "d%02" PRIu64 "h", s / 86400, (s % 86400) / 3600);
    }
    return buf;
}

std::string hex64(uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
    return buf;
}

std::string isoUtc(uint64_t unix_ms) {
    time_t t = static_cast<time_t>(unix_ms / 1000);
    struct tm tm {};
    char day[32];
    if (::gmtime_r(&t, &tm) == nullptr || std::strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm) == 0) {
        return "?";
    }
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%s.%03" PRIu64 "Z", day, unix_ms % 1000);
    return buf;
}

std::string extCapNames(uint32_t ext_cap) {
    std::string out;
    auto add = [&](uint32_t bit, const char *name) {
        if (ext_cap & bit) {
            out += out.empty() ? name : std::string("|") + name;
            ext_cap &= ~bit;
        }
    };
    add(1u << 0, "NDR");
    add(1u << 1, "NDA");
    if (ext_cap != 0) {
        char buf[16];
        std::snprintf(buf, sizeof(buf), "0x%x", ext_cap);
        out += out.empty() ? buf : std::string("|") + buf;
    }
    return out.empty() ? "none" : out;
}

uint64_t latencyQuantileUs(const pb::LatencyHistogram &h, double q) {
    uint64_t total = 0;
    for (uint64_t c : h.counts()) {
        total += c;
    }
    if (total == 0) {
        return 0;
    }
    auto rank = static_cast<uint64_t>(q * static_cast<double>(total));
    rank = std::max<uint64_t>(rank, 1);
    uint64_t seen = 0;
    for (int i = 0; i < h.counts_size(); ++i) {
        seen += h.counts(i);
        if (seen >= rank) {
            // The overflow bucket has no bound: report the last one.
            int b = std::min(i, h.bucket_upper_us_size() - 1);
            return b < 0 ? 0 : h.bucket_upper_us(b);
        }
    }
    return h.bucket_upper_us_size() > 0 ? h.bucket_upper_us(h.bucket_upper_us_size() - 1) : 0;
}

std::string prometheusText(const pb::GetStatsResponse &s) {
    std::ostringstream o;
    family(o, "ibv_extend_up", "gauge", "1 when the broker answered the scrape.");
    o << "ibv_extend_up 1\n";
    family(o, "ibv_extend_uptime_seconds", "gauge", "Seconds since the broker started.");
    o << "ibv_extend_uptime_seconds " << seconds(s.uptime_ms() * 1000) << '\n';
    family(o, "ibv_extend_sessions", "gauge", "Live tenant sessions.");
    o << "ibv_extend_sessions " << s.sessions() << '\n';
    family(o, "ibv_extend_objects", "gauge",
           "Live objects (contexts, PDs, MRs, CQs, QPs, SRQs) of all sessions.");
    o << "ibv_extend_objects " << s.objects() << '\n';
    family(o, "ibv_extend_arena_bytes", "gauge", "Queue memory mapped in session arenas.");
    o << "ibv_extend_arena_bytes " << s.arena_bytes() << '\n';
    family(o, "ibv_extend_sessions_opened_total", "counter", "Sessions opened since the broker started.");
    o << "ibv_extend_sessions_opened_total " << s.sessions_opened() << '\n';
    family(o, "ibv_extend_sessions_evicted_total", "counter", "Sessions evicted by an administrator.");
    o << "ibv_extend_sessions_evicted_total " << s.sessions_evicted() << '\n';
    family(o, "ibv_extend_audit_events_total", "counter",
           "Audited object events (each also an Admin Watch event), by action.");
    o << "ibv_extend_audit_events_total{action=\"create\"} " << s.audit_creates() << '\n';
    o << "ibv_extend_audit_events_total{action=\"destroy\"} " << s.audit_destroys() << '\n';
    family(o, "ibv_extend_audit_lines_total", "counter", "\"audit:\" lines written to the broker's log.");
    o << "ibv_extend_audit_lines_total " << s.audit_lines() << '\n';
    family(o, "ibv_extend_audit_lines_suppressed_total", "counter",
           "Audited events not written as log lines: their session was over its per-second line budget.");
    o << "ibv_extend_audit_lines_suppressed_total " << s.audit_lines_suppressed() << '\n';

    family(o, "ibv_extend_rpc_calls_total", "counter", "Broker calls received, by method.");
    for (const auto &r : s.rpcs()) {
        o << "ibv_extend_rpc_calls_total{method=\"" << escapeLabel(r.method()) << "\"} " << r.calls() << '\n';
    }
    family(o, "ibv_extend_rpc_errors_total", "counter",
           "Broker calls answered with an error, by method and gRPC code.");
    for (const auto &r : s.rpcs()) {
        for (const auto &e : r.errors_by_code()) {
            o << "ibv_extend_rpc_errors_total{method=\"" << escapeLabel(r.method()) << "\",code=\""
              << escapeLabel(label(e.code())) << "\"} " << e.count() << '\n';
        }
    }
    family(o, "ibv_extend_rpc_duration_seconds", "histogram",
           "Time from a Broker call's start to its reply.");
    for (const auto &r : s.rpcs()) {
        const auto &h = r.latency();
        std::string m = escapeLabel(r.method());
        uint64_t cumulative = 0;
        for (int i = 0; i < h.bucket_upper_us_size() && i < h.counts_size(); ++i) {
            cumulative += h.counts(i);
            o << "ibv_extend_rpc_duration_seconds_bucket{method=\"" << m << "\",le=\""
              << seconds(h.bucket_upper_us(i)) << "\"} " << cumulative << '\n';
        }
        o << "ibv_extend_rpc_duration_seconds_bucket{method=\"" << m << "\",le=\"+Inf\"} " << h.count()
          << '\n';
        o << "ibv_extend_rpc_duration_seconds_sum{method=\"" << m << "\"} " << seconds(h.sum_us()) << '\n';
        o << "ibv_extend_rpc_duration_seconds_count{method=\"" << m << "\"} " << h.count() << '\n';
    }
    if (s.engines_size() > 0) {
        family(o, "ibv_extend_engine_events_total", "counter",
               "Counters of a device's engine (softnda: WQEs, bytes, doorbells, CQEs, ...).");
        for (const auto &e : s.engines()) {
            for (const auto &c : e.counters()) {
                o << "ibv_extend_engine_events_total{device=\"" << escapeLabel(e.device()) << "\",provider=\""
                  << escapeLabel(e.provider()) << "\",counter=\"" << escapeLabel(c.name()) << "\"} "
                  << c.value() << '\n';
            }
        }
    }
    return o.str();
}

namespace {

// Every Admin enum's value prefix, and whether its label is lower-case.
constexpr std::pair<const char *, bool> kEnumPrefixes[] = {{"OBJECT_KIND_", true},
                                                           {"QUOTA_SCOPE_", true},
                                                           {"QP_STATE_", false},
                                                           {"QP_TYPE_", false},
                                                           {"ERROR_CODE_", false}};
// The JSON keys whose string values are such enums.
const char *const kEnumKeys[] = {"kind", "object_kind", "state", "qp_type", "scope", "code"};
// The JSON keys whose values are object handles (ObjectInfo.handle and .uses, AdminEvent.handle).
const char *const kHandleKeys[] = {"handle", "uses"};

bool oneOf(const std::string &key, const auto &keys) {
    return std::find_if(std::begin(keys), std::end(keys), [&](const char *k) { return key == k; }) !=
           std::end(keys);
}

// proto3 JSON writes a uint64 as a decimal string; a handle is read by people next to a table
// or a log line, which show it as hex64().
void handleToHex(nlohmann::ordered_json &v) {
    if (v.is_array()) {
        for (auto &e : v) {
            handleToHex(e);
        }
    } else if (const std::string *s = v.get_ptr<const std::string *>(); s != nullptr) {
        uint64_t handle = 0;
        auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), handle);
        if (ec == std::errc() && end == s->data() + s->size()) {
            v = hex64(handle);
        }
    } else if (v.is_number_unsigned()) {
        v = hex64(v.get<uint64_t>());
    }
}

void relabel(nlohmann::ordered_json &j) {
    if (j.is_array()) {
        for (auto &e : j) {
            relabel(e);
        }
        return;
    }
    if (!j.is_object()) {
        return;
    }
    j.erase("next_page_token");
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (oneOf(it.key(), kEnumKeys) && it.value().is_string()) {
            it.value() = enumLabel(it.value().get<std::string>());
        } else if (oneOf(it.key(), kHandleKeys)) {
            handleToHex(it.value());
        } else {
            relabel(it.value());
        }
    }
}

// Every field present (a root tenant's uid 0 too), then relabel()led; nullopt when the message
// does not convert (cannot happen for a message protobuf built).
std::optional<nlohmann::ordered_json> jsonOf(const google::protobuf::Message &m) {
    google::protobuf::util::JsonPrintOptions opt;
    opt.preserve_proto_field_names = true;
    opt.always_print_primitive_fields = true;
    std::string out;
    (void)google::protobuf::util::MessageToJsonString(m, &out, opt);
    auto j = nlohmann::ordered_json::parse(out, nullptr, false);
    if (j.is_discarded()) {
        return std::nullopt;
    }
    relabel(j);
    return j;
}

}  // namespace

std::string enumLabel(const std::string &proto_name) {
    for (const auto &[prefix, lower] : kEnumPrefixes) {
        std::string_view p(prefix);
        if (proto_name.size() > p.size() && proto_name.compare(0, p.size(), p) == 0) {
            std::string out = proto_name.substr(p.size());
            if (lower) {
                std::transform(out.begin(), out.end(), out.begin(),
                               [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            }
            return out;
        }
    }
    return proto_name;
}

std::string label(::ibv_extend::v1::ObjectKind v) {
    return enumLabel(::ibv_extend::v1::ObjectKind_Name(v));
}
std::string label(::ibv_extend::v1::QpState v) {
    return enumLabel(::ibv_extend::v1::QpState_Name(v));
}
std::string label(::ibv_extend::v1::QpType v) {
    return enumLabel(::ibv_extend::v1::QpType_Name(v));
}
std::string label(::ibv_extend::v1::QuotaScope v) {
    return enumLabel(::ibv_extend::v1::QuotaScope_Name(v));
}
std::string label(::ibv_extend::v1::ErrorCode v) {
    return enumLabel(::ibv_extend::v1::ErrorCode_Name(v));
}

std::string toJson(const google::protobuf::Message &m) {
    auto j = jsonOf(m);
    return j ? j->dump(1) : "{}";
}

std::string toJsonLine(const google::protobuf::Message &m) {
    auto j = jsonOf(m);
    return j ? j->dump() : "{}";
}

}  // namespace ibvx::ctl
