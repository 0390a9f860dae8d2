// Where the figures were measured: they mean little without it.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <string>

#include "tools/ibv-extend-perf/scenarios.h"

namespace ibvx::perf {

namespace {

std::string cpuModel() {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("model name", 0) == 0) {
            auto pos = line.find(':');
            return pos == std::string::npos ? line : line.substr(pos + 2);
        }
    }
    return "unknown";
}

std::string gitCommit() {
    std::string cmd = "git -C '" IBVX_PERF_SOURCE_DIR "' rev-parse --short HEAD 2>/dev/null";
    FILE *p = popen(cmd.c_str(), "r");
    if (p == nullptr) {
        return "unknown";
    }
    char buf[64] = {};
    std::string out = fgets(buf, sizeof(buf), p) != nullptr ? buf : "";
    pclose(p);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) {
        out.pop_back();
    }
    return out.empty() ? "unknown" : out;
}

}  // namespace

void collectMachine(Results &out) {
    out.setMachine("cores", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
    utsname u{};
    out.setMachine("kernel", uname(&u) == 0 ? u.release : "unknown");
    out.setMachine("cpu", cpuModel());
    char date[32];
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    out.setMachine("date", date);
    out.setMachine("git_commit", gitCommit());
}

}  // namespace ibvx::perf
