#include "daemon/app/config.h"

#include <grp.h>
#include <pwd.h>
#include <toml++/toml.h>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

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

Status parseKubernetes(const std::string &path, const toml::table &t, DaemonConfig *out) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        std::string full = "kubernetes." + key;
        Status st;
        if (key == "pod_resources_socket") {
            st = getString(path, full, node, &out->kubernetes.pod_resources_socket);
            const std::string &s = out->kubernetes.pod_resources_socket;
            if (st.isOk() && (s.empty() || s[0] != '/' || s.size() >= 108)) {
                st = bad(path, node, full + " must be an absolute path of 1..107 bytes");
            }
        } else if (key == "resource") {
            st = getString(path, full, node, &out->kubernetes.resource);
            if (st.isOk() && out->kubernetes.resource.find('/') == std::string::npos) {
                st = bad(path, node,
                         full + " must be a vendor-qualified resource name such as \"ibv-extend.io/nda\"");
            }
        } else {
            st = bad(path, node, "unknown key '" + full + "' (expected pod_resources_socket, resource)");
        }
        if (!st.isOk()) {
            return st;
        }
    }
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
            out->socket_group_origin = where(path, node) + ": " + full;
        } else if (key == "admin_group") {
            st = getString(path, full, node, &out->admin_group);
            out->admin_group_origin = where(path, node) + ": " + full;
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
            out->driver_where.push_back(where(path, n));
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
        } else if (const toml::array *list = node.as_array()) {
            // A list of names (softnda's netdev = ["veth0", "veth1"]) reaches the provider as the
            // comma-separated string it also takes.
            for (const toml::node &item : *list) {
                auto s = item.value_exact<std::string>();
                if (!s || s->empty() || s->find(',') != std::string::npos) {
                    return bad(path, item,
                               provider + "." + key + " must list non-empty names without commas");
                }
                value += (value.empty() ? "" : ",") + *s;
            }
        } else {
            return bad(
                path, node,
                provider + "." + key + " must be an integer, a string, a boolean or a list of strings");
        }
        out->provider_options.push_back({provider, key, value, where(path, node)});
    }
    return Status::ok();
}

// An array of ids: integers or names (resolved with getpwnam/getgrnam when the file is read).
Status getIds(const std::string &path, const std::string &key, const toml::node &node, bool groups,
              std::vector<uint32_t> *out) {
    const toml::array *arr = node.as_array();
    if (arr == nullptr) {
        return bad(path, node,
                   key + " must be an array of " + (groups ? "gids or group names" : "uids or user names"));
    }
    for (const toml::node &n : *arr) {
        if (auto i = n.value_exact<int64_t>()) {
            if (*i < 0 || *i > 0xfffffffe) {
                return bad(path, n, key + ": id out of range");
            }
            out->push_back(static_cast<uint32_t>(*i));
        } else if (auto name = n.value_exact<std::string>()) {
            if (groups) {
                group *g = name->empty() ? nullptr : ::getgrnam(name->c_str());
                if (g == nullptr) {
                    return bad(path, n, key + ": no group named '" + *name + "'");
                }
                out->push_back(g->gr_gid);
            } else {
                passwd *pw = name->empty() ? nullptr : ::getpwnam(name->c_str());
                if (pw == nullptr) {
                    return bad(path, n, key + ": no user named '" + *name + "'");
                }
                out->push_back(pw->pw_uid);
            }
        } else {
            return bad(path, n, key + " entries must be integers or names");
        }
    }
    return Status::ok();
}

Status getStrings(const std::string &path, const std::string &key, const toml::node &node,
                  std::vector<std::string> *out) {
    const toml::array *arr = node.as_array();
    if (arr == nullptr) {
        return bad(path, node, key + " must be an array of strings");
    }
    for (const toml::node &n : *arr) {
        auto v = n.value_exact<std::string>();
        if (!v || v->empty()) {
            return bad(path, n, key + " entries must be non-empty strings");
        }
        out->push_back(*v);
    }
    return Status::ok();
}

Status parsePolicyClass(const std::string &path, const std::string &name, const toml::table &t,
                        TenantClass *out) {
    out->name = name;
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        std::string full = "policy.class." + name + "." + key;
        Status st;
        if (key == "uids") {
            st = getIds(path, full, node, false, &out->uids);
        } else if (key == "gids") {
            st = getIds(path, full, node, true, &out->gids);
        } else if (key == "devices") {
            st = getStrings(path, full, node, &out->devices);
        } else if (key == "namespaces") {
            st = getStrings(path, full, node, &out->namespaces);
        } else if (key == "namespace") {
            std::string ns;
            st = getString(path, full, node, &ns);
            if (st.isOk() && ns.empty()) {
                st = bad(path, node, full + " must be a non-empty namespace name");
            }
            out->namespaces.push_back(ns);
        } else {
            st = bad(path, node, "unknown key '" + full + "' (expected uids, gids, namespace(s), devices)");
        }
        if (!st.isOk()) {
            return st;
        }
    }
    return Status::ok();
}

Status parsePolicy(const std::string &path, const toml::table &t, DaemonConfig *out) {
    out->policy.enabled = true;
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        std::string full = "policy." + key;
        Status st;
        if (key == "allow_uids") {
            st = getIds(path, full, node, false, &out->policy.allow_uids);
        } else if (key == "allow_gids") {
            st = getIds(path, full, node, true, &out->policy.allow_gids);
        } else if (key == "default_devices") {
            st = getStrings(path, full, node, &out->policy.default_devices);
        } else if (key == "admin_group") {
            std::string g;
            st = getString(path, full, node, &g);
            if (st.isOk() && !out->admin_group.empty() && out->admin_group != g) {
                st = bad(path, node, "policy.admin_group differs from broker.admin_group");
            }
            if (st.isOk()) {
                out->admin_group = g;
                out->admin_group_origin = where(path, node) + ": " + full;
            }
        } else if (key == "class") {
            const toml::table *classes = node.as_table();
            if (classes == nullptr) {
                return bad(path, node, "policy.class must be a table of [policy.class.<name>] tables");
            }
            for (auto &&[ck, cnode] : *classes) {
                const toml::table *ct = cnode.as_table();
                if (ct == nullptr) {
                    return bad(path, cnode, "policy.class." + std::string(ck.str()) + " must be a table");
                }
                TenantClass c;
                if (Status cs = parsePolicyClass(path, std::string(ck.str()), *ct, &c); !cs.isOk()) {
                    return cs;
                }
                out->policy.classes.push_back(std::move(c));
            }
        } else {
            st = bad(path, node,
                     "unknown key '" + full +
                         "' (expected allow_uids, allow_gids, default_devices, admin_group, class)");
        }
        if (!st.isOk()) {
            return st;
        }
    }
    return Status::ok();
}

// quota = integer >= 0 (0: nothing may be created).
Status parseQuotaValues(const std::string &path, const std::string &prefix, const toml::table &t,
                        QuotaValues *defaults, QuotaOverride *over) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        if (defaults != nullptr && (key == "uid" || key == "container" || key == "namespace")) {
            continue;
        }
        auto q = quotaFromName(key);
        if (!q) {
            return bad(path, node,
                       "unknown quota '" + prefix + key +
                           "' (expected contexts, pds, mrs, mr_bytes, cqs, qps, srqs, queue_bytes, sessions, "
                           "ahs, event_fds, replies, state_bytes)");
        }
        auto v = node.value_exact<int64_t>();
        if (!v || *v < 0) {
            return bad(path, node, prefix + key + " must be an integer >= 0");
        }
        if (defaults != nullptr) {
            (*defaults)[static_cast<size_t>(*q)] = static_cast<uint64_t>(*v);
        } else {
            over->max[static_cast<size_t>(*q)] = static_cast<uint64_t>(*v);
        }
    }
    return Status::ok();
}

Status parseQuotas(const std::string &path, const toml::table &t, DaemonConfig *out) {
    for (auto &&[k, node] : t) {
        std::string key(k.str());
        if (key != "uid" && key != "container" && key != "namespace") {
            continue;  // a default, parsed below
        }
        const toml::table *sub = node.as_table();
        if (sub == nullptr) {
            return bad(path, node, "quotas." + key + " must be a table of [quotas." + key + ".<id>] tables");
        }
        for (auto &&[id, inode] : *sub) {
            std::string name(id.str());
            std::string prefix = "quotas." + key + "." + name + ".";
            const toml::table *it = inode.as_table();
            if (it == nullptr || name.empty()) {
                return bad(path, inode, "quotas." + key + "." + name + " must be a table");
            }
            QuotaOverride over;
            if (Status st = parseQuotaValues(path, prefix, *it, nullptr, &over); !st.isOk()) {
                return st;
            }
            if (key == "uid") {
                if (name.size() > 10 || name.find_first_not_of("0123456789") != std::string::npos ||
                    std::stoull(name) > 0xfffffffeULL) {
                    return bad(path, inode, "quotas.uid." + name + ": the key must be a numeric uid");
                }
                out->quotas.uids[static_cast<uid_t>(std::stoul(name))] = over;
            } else if (key == "namespace") {
                out->quotas.namespaces[name] = over;
            } else {
                out->quotas.containers[name] = over;
            }
        }
    }
    return parseQuotaValues(path, "quotas.", t, &out->quotas.defaults, nullptr);
}

std::string trimmed(std::string_view s) {
    size_t b = s.find_first_not_of(" \t\r");
    size_t e = s.find_last_not_of(" \t\r");
    return b == std::string_view::npos ? std::string() : std::string(s.substr(b, e - b + 1));
}

// The key that line `line` (from 1) of text sets, with its table: "broker.socket_mode" for
// `socket_mode = 0660` under [broker]. "" when that line sets none (a table header, a comment,
// the inside of a multi-line array). For toml++'s own errors, which name only a line.
std::string keyOnLine(const std::string &text, size_t line) {
    std::istringstream in(text);
    std::string table;
    std::string l;
    for (size_t n = 1; std::getline(in, l); ++n) {
        std::string t = trimmed(l);
        if (n == line) {
            size_t eq = t.find('=');
            std::string key = eq == std::string::npos ? std::string() : trimmed(t.substr(0, eq));
            if (key.empty() || key.find_first_not_of(
                                   "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.\"' ") !=
                                   std::string::npos) {
                return "";
            }
            return table.empty() ? key : table + "." + key;
        }
        // A header: [name] or [[name]], a comment after it allowed.
        size_t open = t.find_first_not_of('[');
        size_t close = t.find(']');
        if (!t.empty() && t[0] == '[' && open != std::string::npos && close != std::string::npos &&
            open <= close && t.find('=') > close) {
            table = trimmed(std::string_view(t).substr(open, close - open));
        }
    }
    return "";
}

// A toml++ syntax error as "FILE:LINE: KEY: what", with how to write an octal socket_mode
// (TOML forbids 0660, the way chmod spells it).
Status syntaxError(const std::string &text, const std::string &path, const toml::parse_error &e) {
    size_t line = e.source().begin.line;
    std::string key = keyOnLine(text, line);
    std::string msg = path + ":" + std::to_string(line) + ": " + (key.empty() ? "" : key + ": ") +
                      std::string(e.description());
    if (key == "broker.socket_mode") {
        msg += " (write the mode as a string: socket_mode = \"0660\")";
    }
    return invalidArgument(msg);
}

// getgrnam() for the groups of cfg; "FILE:LINE: KEY: ..." when this host has no such group.
Status checkGroupsExist(const DaemonConfig &cfg) {
    struct Named {
        const std::string &group, &origin;
        const char *role;
    };
    for (const Named &n : {Named{cfg.socket_group, cfg.socket_group_origin, "the socket's group"},
                           Named{cfg.admin_group, cfg.admin_group_origin, "the admin group"}}) {
        if (!n.group.empty() && ::getgrnam(n.group.c_str()) == nullptr) {
            return invalidArgument(n.origin + ": " + n.role + " '" + n.group +
                                   "' does not exist on this host: create it (groupadd --system " + n.group +
                                   ", or install the shipped sysusers.d file) or name an existing group");
        }
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
        return syntaxError(text, path, e);
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
        } else if (key == "policy") {
            st = parsePolicy(path, *t, out);
        } else if (key == "quotas") {
            st = parseQuotas(path, *t, out);
        } else if (key == "kubernetes") {
            st = parseKubernetes(path, *t, out);
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
    return loadConfigText(ss.str(), path, out);
}

Status loadConfigText(const std::string &text, const std::string &path, DaemonConfig *out) {
    RETURN_IF_ERROR(parseConfig(text, path, out));
    out->config_text = text;
    return checkGroupsExist(*out);
}

}  // namespace ibvx::daemon
