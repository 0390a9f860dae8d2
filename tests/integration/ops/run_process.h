// Runs a program (ibv-extendctl, systemd-socket-activate, ...) as a child and collects its output.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace ibvx::test {

struct ProcessResult {
    int exit_code = -1;  // 128+signal when killed
    std::string out, err;
};

struct RunOptions {
    std::vector<std::string> env;  // extra NAME=value
    long uid = -1;                 // >= 0: setgid/setuid to it (and gid) before exec
    int timeout_ms = 20000;
};

ProcessResult runProcess(const std::vector<std::string> &argv, const RunOptions &options = {});

// A child left running (watch); stdout goes to a file under dir.
struct Background {
    pid_t pid = -1;
    std::string out_path;
};
Background startBackground(const std::vector<std::string> &argv, const std::string &out_path,
                           const std::vector<std::string> &env = {});
// Waits up to timeout_ms; exit code, or -1 (then the child is killed).
int waitBackground(Background &bg, int timeout_ms);

std::string readFile(const std::string &path);
std::string ctlBinary();

}  // namespace ibvx::test
