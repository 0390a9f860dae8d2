// Provider options: one table of keys with their bounds, used by configure() and the
// SOFTNDA_<KEY> environment variables alike.
#include <cerrno>
#include <cstdlib>
#include <string>

#include "providers/softnda/src/netdev.h"
#include "providers/softnda/src/softnda_internal.h"

namespace softnda {
namespace {

struct Option {
    const char *key;
    uint64_t min;
    uint64_t max;
    uint32_t Config::*u32;
    uint64_t Config::*u64;
};

// Upper bounds keep every derived size inside 32-bit ring arithmetic and a 512 B WQE.
const Option kOptions[] = {
    {"devices", 1, 64, &Config::devices, nullptr},
    {"max_pd", 1, 1u << 24, &Config::max_pd, nullptr},
    {"max_mr", 1, 1u << 24, &Config::max_mr, nullptr},
    {"max_qp", 1, 1u << 23, &Config::max_qp, nullptr},
    {"max_cq", 1, 1u << 24, &Config::max_cq, nullptr},
    {"max_srq", 1, 1u << 24, &Config::max_srq, nullptr},
    {"max_qp_wr", 1, 1u << 24, &Config::max_qp_wr, nullptr},
    {"max_cqe", 1, 1u << 26, &Config::max_cqe, nullptr},
    {"max_srq_wr", 1, 1u << 24, &Config::max_srq_wr, nullptr},
    {"max_sge", 1, kEngineMaxSge, &Config::max_sge, nullptr},
    {"max_inline_data", 0, kEngineMaxInline, &Config::max_inline_data, nullptr},
    {"max_msg_sz", 1, 1u << 31, &Config::max_msg_sz, nullptr},
    {"max_mr_size", 1, 1ull << 48, nullptr, &Config::max_mr_size},
    {"phys_port_cnt", 1, 2, &Config::phys_port_cnt, nullptr},
    {"engine_threads", 1, 64, &Config::engine_threads, nullptr},
    {"spin_us", 0, 10'000'000, &Config::spin_us, nullptr},
    {"sleep_us", 10, 10'000'000, &Config::sleep_us, nullptr},
    {"futex_waitv", 0, 1, &Config::futex_waitv, nullptr},
    {"dm_size", 4096, 1ull << 30, nullptr, &Config::dm_size},
    {"wire_port", 1, 65535, &Config::wire_port, nullptr},
};

// The one option that is not a number: the interfaces of the Ethernet personality, checked
// against the host now so a misspelt name is an error at configure time (-ENODEV).
constexpr const char *kNetdevKey = "netdev";
// The wire's fault hook (SPEC.md §18): "drop=0.01,dup=0.01,reorder=0.01,seed=7".
constexpr const char *kWireFaultsKey = "wire_faults";

}  // namespace

int configSet(Config &cfg, const std::string &key, const std::string &value) {
    if (key == kNetdevKey) {
        std::vector<std::string> names;
        if (!value.empty()) {
            if (int rc = parseNetdevList(value, &names); rc < 0) {
                return rc;
            }
        }
        cfg.netdevs = std::move(names);
        return 0;
    }
    if (key == kWireFaultsKey) {
        return parseWireFaults(value, &cfg.wire_faults);
    }
    for (const Option &o : kOptions) {
        if (key != o.key) {
            continue;
        }
        if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos ||
            value.size() > 19) {
            return -EINVAL;
        }
        uint64_t v = std::strtoull(value.c_str(), nullptr, 10);
        if (v < o.min || v > o.max) {
            return -EINVAL;
        }
        if (o.u32 != nullptr) {
            cfg.*o.u32 = static_cast<uint32_t>(v);
        } else {
            cfg.*o.u64 = v;
        }
        return 0;
    }
    return -EINVAL;
}

void configFromEnv(Config &cfg) {
    auto apply = [&cfg](const char *key) {
        std::string var = "SOFTNDA_";
        for (const char *p = key; *p != '\0'; ++p) {
            var += static_cast<char>(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
        }
        // secure_getenv: a set-uid user of the library must not be steered by the environment.
        if (const char *v = secure_getenv(var.c_str()); v != nullptr) {
            Config trial = cfg;
            if (configSet(trial, key, v) == 0) {
                cfg = trial;
            }
        }
    };
    for (const Option &o : kOptions) {
        apply(o.key);
    }
    apply(kNetdevKey);
    apply(kWireFaultsKey);
}

}  // namespace softnda
