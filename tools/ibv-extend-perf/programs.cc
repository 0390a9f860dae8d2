#include "tools/ibv-extend-perf/programs.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "tools/ibv-extend-perf/broker_harness.h"
#include "tools/ibv-extend-perf/scenarios.h"

extern char **environ;

namespace ibvx::perf {

Program::Program(const std::vector<std::string> &argv, const std::vector<std::string> &env, int netns) {
    for (const auto &a : argv) {
        name_ += (name_.empty() ? "" : " ") + a;
    }
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
        throw std::runtime_error(name_ + ": pipe2: " + std::strerror(errno));
    }
    UniqueFd r(p[0]), w(p[1]);
    std::vector<char *> args;
    for (const auto &a : argv) {
        args.push_back(const_cast<char *>(a.c_str()));
    }
    args.push_back(nullptr);
    // The environment is built before fork(): this process has threads (gRPC's), so the
    // child may only make async-signal-safe calls until it execs.
    std::vector<char *> envp;
    for (const auto &e : env) {
        envp.push_back(const_cast<char *>(e.c_str()));
    }
    for (char **e = environ; *e != nullptr; ++e) {
        envp.push_back(*e);
    }
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) {
        throw std::runtime_error(name_ + ": fork: " + std::strerror(errno));
    }
    if (pid_ == 0) {
        ::dup2(w.get(), STDOUT_FILENO);
        ::dup2(w.get(), STDERR_FILENO);
        if (netns >= 0 && ::setns(netns, CLONE_NEWNET) != 0) {
            static const char kSetnsFailed[] = "ibv-extend-perf: setns into the network namespace failed\n";
            (void)!::write(STDERR_FILENO, kSetnsFailed, sizeof(kSetnsFailed) - 1);
            ::_exit(127);
        }
        ::execve(args[0], args.data(), envp.data());
        static const char kExecFailed[] = "ibv-extend-perf: exec of a program failed\n";
        (void)!::write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
        ::_exit(127);
    }
    out_ = std::move(r);
}

Program::~Program() {
    if (pid_ > 0) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
    }
}

bool Program::running() const {
    siginfo_t info{};
    return pid_ > 0 && ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == 0;
}

std::string Program::finish(std::chrono::milliseconds limit, int *status) {
    const auto deadline = Clock::now() + limit;
    std::string text;
    char chunk[4096];
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        pollfd pfd{out_.get(), POLLIN, 0};
        if (left.count() <= 0 || ::poll(&pfd, 1, static_cast<int>(left.count())) == 0) {
            ::kill(pid_, SIGKILL);
            text += "\n[killed at the deadline]";
            break;
        }
        ssize_t n = ::read(out_.get(), chunk, sizeof(chunk));
        if (n <= 0) {
            break;
        }
        text.append(chunk, static_cast<size_t>(n));
    }
    *status = 0;
    ::waitpid(pid_, status, 0);
    pid_ = -1;
    return text;
}

std::string Program::finish(std::chrono::milliseconds limit) {
    int status = 0;
    std::string text = finish(limit, &status);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw std::runtime_error(name_ + " failed (status " + std::to_string(status) + "):\n" + text);
    }
    return text;
}

SchedOtherScope::SchedOtherScope() : policy_(::sched_getscheduler(0)) {
    ::sched_getparam(0, &param_);
    sched_param other{};
    ::sched_setscheduler(0, SCHED_OTHER, &other);
}

SchedOtherScope::~SchedOtherScope() {
    ::sched_setscheduler(0, policy_, &param_);
}

std::string ourProgram(const char *name, const char *built) {
    std::filesystem::path beside = std::filesystem::path(selfExe()).parent_path() / name;
    std::error_code ec;
    return std::filesystem::is_regular_file(beside, ec) ? beside.string() : std::string(built);
}

std::vector<std::string> tenant(const std::string &socket, std::vector<std::string> argv) {
    std::vector<std::string> all = {ourProgram("ibv-extend-run", IBVX_PERF_RUN), "--socket", socket,
                                    "--sandbox=on", "--"};
    all.insert(all.end(), argv.begin(), argv.end());
    return all;
}

}  // namespace ibvx::perf
