// Helpers shared by the client integration tests: temp dirs, starting and stopping a broker
// process on a short socket path, waiting until it answers, counting mapped regions.
#pragma once

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ibvx::test {

inline std::string makeTempDir() {
    char tmpl[] = "/tmp/ibvx.XXXXXX";
    const char *d = mkdtemp(tmpl);
    return d != nullptr ? d : "";
}

// This process's libibv_extend.so in broker mode on socket, every call bounded by timeout_ms;
// the library reads them at its first call.
inline void useBrokerAt(const std::string &socket, int timeout_ms) {
    setenv("IBV_EXTEND_MODE", "broker", 1);
    setenv("IBV_EXTEND_SOCKET", socket.c_str(), 1);
    setenv("IBV_EXTEND_TIMEOUT_MS", std::to_string(timeout_ms).c_str(), 1);
}

inline bool socketAnswers(const std::string &path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    bool ok = connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
}

// A broker-like process (the fake or ibv-extendd) on its own socket.
class BrokerProcess {
  public:
    // argv[0] is the program path; "{socket}" in any argument is replaced by the socket path.
    bool start(const std::vector<std::string> &argv_template, const std::string &socket_path,
               std::chrono::milliseconds wait = std::chrono::seconds(10)) {
        socket_ = socket_path;
        std::vector<std::string> args;
        for (std::string a : argv_template) {
            size_t p = a.find("{socket}");
            if (p != std::string::npos) {
                a.replace(p, 8, socket_path);
            }
            args.push_back(a);
        }
        pid_ = fork();
        if (pid_ == 0) {
            std::vector<char *> cargv;
            for (auto &a : args) {
                cargv.push_back(a.data());
            }
            cargv.push_back(nullptr);
            execv(cargv[0], cargv.data());
            _exit(127);
        }
        auto deadline = std::chrono::steady_clock::now() + wait;
        while (std::chrono::steady_clock::now() < deadline) {
            if (socketAnswers(socket_path)) {
                return true;
            }
            int status;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return false;
    }
    pid_t pid() const { return pid_; }
    // Sends sig and waits for the exit; returns the wait status (or -1).
    int stop(int sig = SIGTERM) {
        if (pid_ <= 0) {
            return -1;
        }
        kill(pid_, sig);
        int status = -1;
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return status;
    }
    ~BrokerProcess() { stop(SIGKILL); }

  private:
    pid_t pid_ = -1;
    std::string socket_;
};

// Mappings in this process whose name contains `what` (memfd names show in /proc/self/maps).
inline int countMappings(const std::string &what) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int n = 0;
    while (std::getline(maps, line)) {
        if (line.find(what) != std::string::npos) {
            ++n;
        }
    }
    return n;
}

// The directory of the running test binary (helper programs are built next to it).
inline std::string selfDir() {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    if (n <= 0) {
        return ".";
    }
    buf[n] = '\0';
    std::string s(buf);
    return s.substr(0, s.rfind('/'));
}

// Runs a program with extra environment entries and returns its stdout (and exit status).
inline std::string runCapture(const std::vector<std::string> &argv, const std::vector<std::string> &env,
                              int *status) {
    int pipefd[2];
    if (pipe(pipefd) < 0) {
        return "";
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 1);
        close(pipefd[0]);
        close(pipefd[1]);
        for (const auto &e : env) {
            putenv(strdup(e.c_str()));
        }
        std::vector<char *> cargv;
        for (const auto &a : argv) {
            cargv.push_back(const_cast<char *>(a.c_str()));
        }
        cargv.push_back(nullptr);
        execv(cargv[0], cargv.data());
        _exit(127);
    }
    close(pipefd[1]);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) {
        out.append(buf, static_cast<size_t>(n));
    }
    close(pipefd[0]);
    waitpid(pid, status, 0);
    return out;
}

}  // namespace ibvx::test
