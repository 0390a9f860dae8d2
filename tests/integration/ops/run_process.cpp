#include "run_process.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

extern char **environ;

namespace ibvx::test {
namespace {

std::vector<std::string> mergedEnv(const std::vector<std::string> &extra) {
    std::vector<std::string> env;
    for (char **e = environ; *e != nullptr; ++e) {
        env.emplace_back(*e);
    }
    for (const std::string &x : extra) {
        std::string name = x.substr(0, x.find('=') + 1);
        std::erase_if(env, [&](const std::string &have) { return have.rfind(name, 0) == 0; });
        env.push_back(x);
    }
    return env;
}

std::vector<char *> pointers(std::vector<std::string> &v) {
    std::vector<char *> p;
    for (auto &s : v) {
        p.push_back(s.data());
    }
    p.push_back(nullptr);
    return p;
}

int decode(int st) {
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

std::string ctlBinary() {
    const char *b = std::getenv("IBVX_BUILD_DIR");
    return std::string(b != nullptr ? b : ".") + "/tools/ibv-extendctl/ibv-extendctl";
}

std::string readFile(const std::string &path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

ProcessResult runProcess(const std::vector<std::string> &argv_in, const RunOptions &options) {
    ProcessResult r;
    std::vector<std::string> argv = argv_in;
    std::vector<std::string> env = mergedEnv(options.env);
    auto argp = pointers(argv);
    auto envp = pointers(env);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) < 0 || ::pipe2(err, O_CLOEXEC) < 0) {
        return r;
    }
    pid_t pid = ::fork();
    if (pid == 0) {
        ::dup2(out[1], STDOUT_FILENO);
        ::dup2(err[1], STDERR_FILENO);
        if (options.uid >= 0) {
            gid_t g = static_cast<gid_t>(options.uid);
            if (::setgroups(0, nullptr) < 0 || ::setgid(g) < 0 ||
                ::setuid(static_cast<uid_t>(options.uid)) < 0) {
                _exit(126);
            }
        }
        ::execve(argp[0], argp.data(), envp.data());
        _exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
    pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
    int open = 2;
    while (open > 0 && std::chrono::steady_clock::now() < deadline) {
        if (::poll(fds, 2, 100) < 0) {
            break;
        }
        for (int i = 0; i < 2; ++i) {
            if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP)) != 0) {
                char buf[4096];
                ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
                if (n <= 0) {
                    ::close(fds[i].fd);
                    fds[i].fd = -1;
                    --open;
                } else {
                    (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
                }
            }
        }
    }
    for (auto &f : fds) {
        if (f.fd >= 0) {
            ::close(f.fd);
            ::kill(pid, SIGKILL);
        }
    }
    int st = 0;
    ::waitpid(pid, &st, 0);
    r.exit_code = decode(st);
    return r;
}

Background startBackground(const std::vector<std::string> &argv_in, const std::string &out_path,
                           const std::vector<std::string> &extra) {
    Background bg;
    bg.out_path = out_path;
    std::vector<std::string> argv = argv_in;
    std::vector<std::string> env = mergedEnv(extra);
    auto argp = pointers(argv);
    auto envp = pointers(env);
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bg.pid = ::fork();
    if (bg.pid == 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        ::execve(argp[0], argp.data(), envp.data());
        _exit(127);
    }
    ::close(fd);
    return bg;
}

int waitBackground(Background &bg, int timeout_ms) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int st = 0;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(bg.pid, &st, WNOHANG) == bg.pid) {
            bg.pid = -1;
            return decode(st);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(bg.pid, SIGKILL);
    ::waitpid(bg.pid, &st, 0);
    bg.pid = -1;
    return -1;
}

}  // namespace ibvx::test
