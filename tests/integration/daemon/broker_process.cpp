#include "broker_process.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/unix_socket.h"

namespace ibvx::test {
namespace {

bool answers(const std::string &path) {
    return ibvx::connectUnix(path).isOk();
}

}  // namespace

BrokerProcess::BrokerProcess(const std::string &config) {
    BrokerOptions o;
    o.config = config;
    start(o);
}

BrokerProcess::BrokerProcess(const BrokerOptions &options) {
    start(options);
}

void BrokerProcess::start(const BrokerOptions &options) {
    const std::string &config = options.config;
    char tmpl[] = "/tmp/ibvx.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
        return;
    }
    dir_ = tmpl;
    socket_ = dir_ + "/b.sock";
    std::string config_path;
    if (!config.empty()) {
        config_path = dir_ + "/ibv-extendd.toml";
        std::ofstream(config_path) << config;
    }
    const char *build = std::getenv("IBVX_BUILD_DIR");
    std::string binary = std::string(build != nullptr ? build : ".") + "/daemon/ibv-extendd";
    std::string log_path = dir_ + "/log";
    // Everything the child needs is prepared before fork(): the parent may have threads.
    std::vector<std::string> env_store;
    for (char **e = environ; !options.clean_env && *e != nullptr; ++e) {
        env_store.emplace_back(*e);
    }
    for (const std::string &e : options.env) {
        // An entry replaces an inherited variable of the same name.
        std::string name = e.substr(0, e.find('=') + 1);
        std::erase_if(env_store, [&](const std::string &have) { return have.rfind(name, 0) == 0; });
        env_store.push_back(e);
    }
    if (options.activated_fd >= 0) {
        env_store.push_back("LISTEN_FDS=1");
        env_store.push_back("LISTEN_PID=0000000000");  // patched with the child's pid below
    }
    std::vector<char *> envp;
    for (std::string &e : env_store) {
        envp.push_back(e.data());
    }
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
        int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(log, STDOUT_FILENO);
        ::dup2(log, STDERR_FILENO);
        if (options.netns_fd >= 0 && ::setns(options.netns_fd, CLONE_NEWNET) != 0) {
            _exit(126);
        }
        if (options.dies_with_parent && (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent)) {
            _exit(126);
        }
        if (options.activated_fd >= 0) {
            ::dup2(options.activated_fd, 3);
            char *pid_entry = envp[envp.size() - 2];
            std::snprintf(pid_entry, std::strlen(pid_entry) + 1, "LISTEN_PID=%d",
                          static_cast<int>(::getpid()));
        }
        std::vector<const char *> argv = {binary.c_str(), "--socket",    socket_.c_str(),
                                          "--foreground", "--log-level", "debug"};
        if (!config_path.empty()) {
            argv.push_back("--config");
            argv.push_back(config_path.c_str());
        }
        argv.push_back(nullptr);
        ::execve(binary.c_str(), const_cast<char *const *>(argv.data()), envp.data());
        _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
        if (answers(options.activated_path.empty() ? socket_ : options.activated_path)) {
            started_ = true;
            return;
        }
        int st;
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            reaped_ = true;
            return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
}

BrokerProcess::~BrokerProcess() {
    if (pid_ > 0 && !reaped_) {
        terminate();
    }
    if (!dir_.empty()) {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }
}

std::string BrokerProcess::log() const {
    std::ifstream in(dir_ + "/log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

int BrokerProcess::terminate(int timeout_ms) {
    if (pid_ <= 0 || reaped_) {
        return -1;
    }
    ::kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    int st = 0;
    while (std::chrono::steady_clock::now() < deadline) {
        if (::waitpid(pid_, &st, WNOHANG) == pid_) {
            reaped_ = true;
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &st, 0);
    reaped_ = true;
    return -1;
}

int BrokerProcess::fdCount() const {
    std::string path = "/proc/" + std::to_string(pid_) + "/fd";
    DIR *d = ::opendir(path.c_str());
    if (d == nullptr) {
        return -1;
    }
    int n = 0;
    while (dirent *e = ::readdir(d)) {
        if (e->d_name[0] != '.') {
            ++n;
        }
    }
    ::closedir(d);
    return n;
}

std::vector<std::string> BrokerProcess::fdTargets() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/fd", ec)) {
        std::error_code lec;
        std::filesystem::path target = std::filesystem::read_symlink(e.path(), lec);
        out.push_back(e.path().filename().string() + " -> " + (lec ? std::string("?") : target.string()));
    }
    std::sort(out.begin(), out.end());
    return out;
}

long BrokerProcess::rssKiB() const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("VmRSS:", 0) == 0) {
            return std::strtol(line.c_str() + 6, nullptr, 10);
        }
    }
    return -1;
}

int freeLoopbackPort() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    int port = 18515;
    if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0) {
        port = ntohs(a.sin_port);
    }
    if (fd >= 0) {
        close(fd);
    }
    return port;
}

}  // namespace ibvx::test
