// Fuzz target: the daemon's TOML configuration parser (daemon/app/config.h parseConfig), the
// first thing ibv-extendd reads, as root, before it serves anyone.
//
// The whole input is the text of /etc/ibv-extend/ibv-extendd.toml.
//
// Invariants: nothing is thrown out of parseConfig (errors are a Status); text with a byte
// outside ASCII or a NUL is refused; an error is INVALID_ARGUMENT with a message that starts
// "fuzz.toml:<line>: "; an accepted file yields a configuration inside every documented bound
// (socket path 1..107 bytes, mode <= 07777, a known log level, timeouts 10..600000 ms, non-empty
// driver names, provider options located in the file and never under the [broker] or [drivers]
// tables).

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>

#include "daemon/app/config.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using ibvx::Code;
using ibvx::Status;
using ibvx::daemon::DaemonConfig;

constexpr char kPath[] = "fuzz.toml";

// "fuzz.toml:<digits>: <something>"
bool locatedMessage(const std::string &m) {
    const std::string prefix = std::string(kPath) + ":";
    if (m.rfind(prefix, 0) != 0) {
        return false;
    }
    size_t digits_end = m.find_first_not_of("0123456789", prefix.size());
    return digits_end != std::string::npos && digits_end > prefix.size() &&
           m.compare(digits_end, 2, ": ") == 0 && m.size() > digits_end + 2;
}

bool knownLogLevel(const std::string &l) {
    for (const char *k : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
        if (l == k) {
            return true;
        }
    }
    return false;
}

void checkAccepted(const DaemonConfig &c) {
    FUZZ_CHECK(c.config_path == kPath, "config_path '%s'", c.config_path.c_str());
    FUZZ_CHECK(!c.socket.empty() && c.socket.size() <= 107, "socket path of %zu bytes accepted",
               c.socket.size());
    FUZZ_CHECK(!c.socket_mode || *c.socket_mode <= 07777, "socket mode %o accepted",
               static_cast<unsigned>(*c.socket_mode));
    FUZZ_CHECK(knownLogLevel(c.log_level), "log level '%s' accepted", c.log_level.c_str());
    FUZZ_CHECK(c.attach_timeout_ms >= 10 && c.attach_timeout_ms <= 600000, "attach timeout %u accepted",
               c.attach_timeout_ms);
    FUZZ_CHECK(c.handshake_timeout_ms >= 10 && c.handshake_timeout_ms <= 600000,
               "handshake timeout %u accepted", c.handshake_timeout_ms);
    for (const std::string &d : c.drivers) {
        FUZZ_CHECK(!d.empty(), "an empty driver name accepted");
    }
    for (const auto &o : c.provider_options) {
        FUZZ_CHECK(o.provider != "broker" && o.provider != "drivers",
                   "option %s.%s taken as a provider option", o.provider.c_str(), o.key.c_str());
        FUZZ_CHECK(o.where.rfind(std::string(kPath) + ":", 0) == 0, "option %s.%s located at '%s'",
                   o.provider.c_str(), o.key.c_str(), o.where.c_str());
    }
}

// config.cpp refuses any byte outside ASCII (and NUL) before toml++ sees the text: Debian 12's
// toml++ 3.3.0 reaches __builtin_unreachable on some code points (corpus
// toml_unreachable_u032a; upstream marzer/tomlplusplus #190, #295).
bool asciiText(const uint8_t *data, size_t size) {
    return std::none_of(data, data + size, [](uint8_t c) { return c >= 0x80 || c == 0; });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string text(reinterpret_cast<const char *>(data), size);
    DaemonConfig config;
    Status st;
    try {
        st = ibvx::daemon::parseConfig(text, kPath, &config);
    } catch (const std::exception &e) {
        FUZZ_CHECK(false, "parseConfig threw: %s", e.what());
    } catch (...) {
        FUZZ_CHECK(false, "parseConfig threw a non-std exception");
    }
    if (st.isOk()) {
        FUZZ_CHECK(asciiText(data, size), "a file with a non-ASCII or NUL byte was accepted");
        checkAccepted(config);
    } else {
        FUZZ_CHECK(st.code() == Code::kInvalidArgument, "error with code %d: %s", static_cast<int>(st.code()),
                   st.message().c_str());
        FUZZ_CHECK(locatedMessage(st.message()), "error message does not locate the problem: '%s'",
                   st.message().c_str());
    }
    return 0;
}
