#include "daemon/app/config.h"

#include <toml++/toml.h>
#include <fstream>
#include <set>
#include <sstream>

namespace ibvx::daemon {
namespace {

std::string where(const std::string &path, const toml::node &n) {
    return path + ":" + std::to_string(n.source().begin.line);
}

Status bad(const std::string &path, const toml::node &n, const std::string &msg) {
    return invalidArgument(where(path, n) + ": " + msg);
}

Status getString(const std::string &path, const std::string &key, const toml::node &n, std::string *out) {
    auto v = n.value_exact<std::string>();
    if (!v) {
        return bad(path, n, key + " must be a string");
    }
    *out = *v;
    return Status::ok();
}

Status getU32(const std::string &path, const std::string &key, const toml::node &n, uint32_t min,
              uint32_t max, uint32_t *out) {
    auto v = n.value_exact<int64_t>();
    if (!v || *v < min || *v > max) {
        return bad(path, n,
                   key + " must be an integer in " + std::to_string(min) + ".." + std::to_string(max));
    }
    *out = static_cast<uint32_t>(*v);
    return Status::ok();
}

Status parseBroker(const std::string &path, const toml::table &t, DaemonConfig *out) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        std::string full = "broker." + key;
        Status st;
        if (key == "socket") {
            st = getString(path, full, node, &out->socket);
            if (st.isOk() && (out->socket.empty() || out->socket.size() >= 108)) {
                st = bad(path, node, full + " must be a path of 1..107 bytes");
            }
        } else if (key == "socket_mode") {
            // "0660" (string, octal) or 432 (integer).
            std::string s;
            if (auto i = node.value_exact<int64_t>()) {
                s = std::to_string(*i);
                if (*i < 0 || *i > 07777) {
                    return bad(path, node, full + " must be an octal mode such as \"0660\"");
                }
                out->socket_mode = static_cast<mode_t>(*i);
                continue;
            }
            st = getString(path, full, node, &s);
            if (st.isOk()) {
                if (s.empty() || s.size() > 4 || s.find_first_not_of("01234567") != std::string::npos) {
                    return bad(path, node, full + " must be an octal mode such as \"0660\"");
                }
                out->socket_mode = static_cast<mode_t>(std::stoul(s, nullptr, 8));
            }
        } else if (key == "socket_group") {
            st = getString(path, full, node, &out->socket_group);
        } else if (key == "admin_group") {
            st = getString(path, full, node, &out->admin_group);
        } else if (key == "log_level") {
            st = getString(path, full, node, &out->log_level);
            if (st.isOk() && !validLogLevel(out->log_level)) {
                st = bad(path, node, full + " must be one of trace, debug, info, warn, error, critical, off");
            }
        } else if (key == "attach_timeout_ms") {
            st = getU32(path, full, node, 10, 600000, &out->attach_timeout_ms);
        } else if (key == "handshake_timeout_ms") {
            st = getU32(path, full, node, 10, 600000, &out->handshake_timeout_ms);
        } else {
            st = bad(path, node, "unknown key '" + full + "'");
        }
        if (!st.isOk()) {
            return st;
        }
    }
    return Status::ok();
}

Status parseDrivers(const std::string &path, const toml::table &t, DaemonConfig *out) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        if (key != "names") {
            return bad(path, node, "unknown key 'drivers." + key + "'");
        }
        const toml::array *arr = node.as_array();
        if (arr == nullptr) {
            return bad(path, node, "drivers.names must be an array of strings");
        }
        for (const toml::node &n : *arr) {
            auto v = n.value_exact<std::string>();
            if (!v || v->empty()) {
                return bad(path, n, "drivers.names entries must be non-empty strings");
            }
            out->drivers.push_back(*v);
        }
    }
    return Status::ok();
}

Status parseProvider(const std::string &path, const std::string &provider, const toml::table &t,
                     DaemonConfig *out) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        std::string value;
        if (auto i = node.value_exact<int64_t>()) {
            value = std::to_string(*i);
        } else if (auto s = node.value_exact<std::string>()) {
            value = *s;
        } else if (auto b = node.value_exact<bool>()) {
            value = *b ? "1" : "0";
        } else {
            return bad(path, node, provider + "." + key + " must be an integer, a string or a boolean");
        }
        out->provider_options.push_back({provider, key, value, where(path, node)});
    }
    return Status::ok();
}

}  // namespace

bool validLogLevel(const std::string &level) {
    static const std::set<std::string> kLevels = {"trace", "debug",    "info", "warn",
                                                  "error", "critical", "off"};
    return kLevels.count(level) != 0;
}

Status parseConfig(const std::string &text, const std::string &path, DaemonConfig *out) {
    // The file is ASCII (keys, paths, group names). Refusing anything else up front also keeps
    // toml++ 3.3.0 away from code points where it reaches __builtin_unreachable.
    size_t line = 1;
    for (char c : text) {
        if (c == '\n') {
            ++line;
        } else if (static_cast<unsigned char>(c) >= 0x80 || c == '\0') {
            return invalidArgument(path + ":" + std::to_string(line) +
                                   ": the configuration must be ASCII text (found a byte outside it)");
        }
    }
    toml::table root;
    try {
        root = toml::parse(text, path);
    } catch (const toml::parse_error &e) {
        return invalidArgument(path + ":" + std::to_string(e.source().begin.line) + ": " +
                               std::string(e.description()));
    }
    out->config_path = path;
    for (auto &&[k, node] : root) {
        std::string key(k.str());
        const toml::table *t = node.as_table();
        if (t == nullptr) {
            return bad(
                path, node,
                "unknown top-level key '" + key + "' (expected tables [broker], [drivers], [<provider>])");
        }
        Status st;
        if (key == "broker") {
            st = parseBroker(path, *t, out);
        } else if (key == "drivers") {
            st = parseDrivers(path, *t, out);
        } else {
            st = parseProvider(path, key, *t, out);
        }
        if (!st.isOk()) {
            return st;
        }
    }
    return Status::ok();
}

Status loadConfigFile(const std::string &path, DaemonConfig *out) {
    std::ifstream in(path);
    if (!in) {
        return Status(Code::kNotFound, ENOENT, "cannot read config file " + path);
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return parseConfig(ss.str(), path, out);
}

}  // namespace ibvx::daemon
