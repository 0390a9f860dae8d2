// What the verbs integration tests share to run unmodified programs as a container tenant runs
// them (face_test.cpp, roce_hosts_test.cpp): an unprivileged child in its own mount namespace
// (Contained), the environment ibv-extend-run gets, and network namespaces of the test's own
// (Netns) for the RoCE tests, which make "hosts" joined by veth pairs on one machine.
//
// Header-only: each test binary that includes it defines IBVX_RUN_BINARY, IBVX_EXTEND_LIB_DIR and
// IBVX_SANITIZER_PRELOAD (tests/integration/verbs/CMakeLists.txt).
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/integration/private_mounts.h"

namespace ibvx::test {

// A tenant pair's outcome: a program run as server and as its client.
struct PairResult {
    int server_rc = -1, client_rc = -1;
    std::string server_out, client_out, server_err, client_err;
};

// Both sides exited 0 and the client printed needle.
inline void expectPair(const PairResult &r, const std::string &needle) {
    EXPECT_EQ(r.client_rc, 0) << r.client_out << r.client_err;
    EXPECT_EQ(r.server_rc, 0) << r.server_out << r.server_err;
    EXPECT_THAT(r.client_out, ::testing::HasSubstr(needle)) << r.client_err;
}

// A perftest pair that ran: both sides exited 0 and the client printed its results row, the
// message size (a regex), the iteration count, then its figures. Those figures are numbers, or
// "inf" when perftest could not calibrate its cycle counter and says so on stderr: Debian 12's
// perftest (4.5-0.17, get_clock.c) samples cycles against gettimeofday, and when that fit's
// r^2 is under 0.9, as on a loaded CI machine, its get_cpu_mhz gives 0 and every time figure
// is cycles / 0. The run itself was still whole, so "inf" passes only with perftest's own word.
inline void expectPerftestRow(const PairResult &r, const std::string &size, const std::string &iterations) {
    expectPair(r, "#iterations");
    const std::string row = size + " +" + iterations + " +";
    if (::testing::Matches(::testing::ContainsRegex(row + "inf"))(r.client_out)) {
        EXPECT_THAT(r.client_err, ::testing::HasSubstr("Correlation coefficient r^2"))
            << "perftest printed inf figures without saying its clock could not be calibrated";
        std::printf("perftest could not calibrate its clock here, so its figures are inf: %s\n",
                    r.client_err.c_str());
        return;
    }
    EXPECT_THAT(r.client_out, ::testing::ContainsRegex(row + "[0-9.]+")) << r.client_err;
}

constexpr uid_t kNobody = 65534;

// A child in its own mount namespace, as uid/gid 65534 with no groups and no new privileges,
// with a clean environment; stdin and stdout are pipes to the test, stderr a file; it is killed
// if the test process dies. With netns
// (an open network namespace, Netns) it runs in that network namespace: a tenant of that "host".
class Contained {
  public:
    Contained(const std::vector<std::string> &argv, const std::vector<std::string> &env,
              const std::string &err_path, int netns = -1) {
        int in[2], out[2];
        const pid_t parent = getpid();
        if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
            return;
        }
        pid_ = fork();
        if (pid_ == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            dup2(err, 2);
            if (netns >= 0 && setns(netns, CLONE_NEWNET) != 0) {
                _exit(119);
            }
            bool root_is_mount = false;
            if (unshare(CLONE_NEWNS) != 0 || makeMountsPrivate(&root_is_mount) != 0) {
                _exit(120);
            }
            // Hides the host's HCAs; under /dev, which a chroot mounts too, so it stays private
            // there as well.
            struct stat st {};
            if (stat("/dev/infiniband", &st) == 0 &&
                mount("none", "/dev/infiniband", "tmpfs", 0, nullptr) != 0) {
                _exit(121);
            }
            if (setgroups(0, nullptr) != 0 || setresgid(kNobody, kNobody, kNobody) != 0 ||
                setresuid(kNobody, kNobody, kNobody) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
                _exit(122);
            }
            // A test killed by its timeout leaves no tenant behind (set after the uid change,
            // which clears it).
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
                _exit(123);
            }
            std::vector<char *> args, envp;
            for (const auto &a : argv) {
                args.push_back(const_cast<char *>(a.c_str()));
            }
            args.push_back(nullptr);
            for (const auto &e : env) {
                envp.push_back(const_cast<char *>(e.c_str()));
            }
            envp.push_back(nullptr);
            execve(args[0], args.data(), envp.data());
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        to_ = fdopen(in[1], "w");
        from_ = out[0];
    }
    ~Contained() {
        if (to_ != nullptr) {
            fclose(to_);
        }
        if (from_ >= 0) {
            close(from_);
        }
        if (pid_ > 0 && !reaped_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
    }
    Contained(const Contained &) = delete;
    Contained &operator=(const Contained &) = delete;

    pid_t pid() const { return pid_; }
    // The next line of its stdout: "" at end of file, or when timeout_ms (-1: none) passes first.
    std::string readLine(int timeout_ms = -1) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        for (;;) {
            auto nl = out_.find('\n');
            if (nl != std::string::npos) {
                std::string line = out_.substr(0, nl);
                out_.erase(0, nl + 1);
                return line;
            }
            if (eof_ || !fill(timeout_ms < 0 ? -1 : remaining(deadline))) {
                std::string rest;
                rest.swap(out_);
                return rest;
            }
        }
    }
    // Its stdout to end of file, or what came before timeout_ms (-1: none) passed.
    std::string readAll(int timeout_ms = -1) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
        while (!eof_ && fill(timeout_ms < 0 ? -1 : remaining(deadline))) {
        }
        std::string all;
        all.swap(out_);
        return all;
    }
    // One line to its stdin.
    void say(const std::string &line) {
        fputs((line + "\n").c_str(), to_);
        fflush(to_);
    }
    void reply() { say("go"); }
    // Its exit code, or 128 + the signal that ended it.
    int wait() {
        if (!reaped_) {
            waitpid(pid_, &status_, 0);
            reaped_ = true;
        }
        return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
    }
    // Whether it has ended (reaped then; wait() answers how).
    bool exited() {
        if (!reaped_ && waitpid(pid_, &status_, WNOHANG) == pid_) {
            reaped_ = true;
        }
        return reaped_;
    }

  private:
    static int remaining(std::chrono::steady_clock::time_point deadline) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          std::chrono::steady_clock::now());
        return left.count() > 0 ? static_cast<int>(left.count()) : 0;
    }
    // Reads what its stdout has within timeout_ms into out_; false on a timeout.
    bool fill(int timeout_ms) {
        if (from_ < 0) {
            eof_ = true;
            return true;
        }
        pollfd p{from_, POLLIN, 0};
        int r = ::poll(&p, 1, timeout_ms);
        if (r < 0 && errno == EINTR) {
            return true;
        }
        if (r <= 0) {
            return false;
        }
        char buf[4096];
        ssize_t n = ::read(from_, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) {
            return true;
        }
        if (n <= 0) {
            eof_ = true;
        } else {
            out_.append(buf, static_cast<size_t>(n));
        }
        return true;
    }

    pid_t pid_ = -1;
    bool reaped_ = false;
    int status_ = 0;
    FILE *to_ = nullptr;
    int from_ = -1;
    std::string out_;  // read from its stdout, not yet returned
    bool eof_ = false;
};

inline std::string slurp(const std::string &path) {
    FILE *f = fopen(path.c_str(), "r");
    std::string s;
    if (f != nullptr) {
        char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
            s.append(buf, n);
        }
        fclose(f);
    }
    return s;
}

// A tenant's environment: nothing of the test's but where our libraries are.
inline std::vector<std::string> tenantEnv() {
    std::vector<std::string> e = {"PATH=/usr/bin:/bin", "LD_LIBRARY_PATH=" IBVX_EXTEND_LIB_DIR,
                                  "IBV_EXTEND_SHOW_WARNINGS=1"};
    if (std::string(IBVX_SANITIZER_PRELOAD).size() != 0) {
        e.push_back("LD_PRELOAD=" IBVX_SANITIZER_PRELOAD);
        e.push_back("ASAN_OPTIONS=detect_leaks=0");  // the programs' own allocations are not ours
    }
    return e;
}

// `ibv-extend-run --socket SOCKET RUN_OPTIONS... -- PROGRAM ARGS...`
inline std::vector<std::string> viaRun(const std::string &socket, const std::string &program,
                                       const std::vector<std::string> &args,
                                       const std::vector<std::string> &run_options = {}) {
    std::vector<std::string> argv = {IBVX_RUN_BINARY, "--socket", socket};
    argv.insert(argv.end(), run_options.begin(), run_options.end());
    argv.push_back("--");
    argv.push_back(program);
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
}

// A network namespace of the test's own, held by an open descriptor alone: it goes with the last
// descriptor, so nothing stays behind however the test ends (ctest's timeout kills it too). Not
// `ip netns add`: its /run/netns/NAME bind mount is seen by every other test's bwrap, which copies
// each mount of the host into its sandbox and remounts it; a namespace another test deleted in
// between fails that sandbox ("Can't bind mount /oldroot/ on /newroot/: ... remount
// /newroot/run/netns/NAME: No such file or directory").
class Netns {
  public:
    Netns() {
        int ready[2];
        if (pipe2(ready, O_CLOEXEC) < 0) {
            return;
        }
        const pid_t pid = fork();
        if (pid == 0) {
            // Only async-signal-safe calls: the test process has threads.
            const char made = unshare(CLONE_NEWNET) == 0 ? 1 : 0;
            (void)!write(ready[1], &made, 1);
            pause();
            _exit(0);
        }
        close(ready[1]);
        char made = 0;
        if (pid > 0 && read(ready[0], &made, 1) == 1 && made == 1) {
            fd_ = open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC);
        }
        close(ready[0]);
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
        if (fd_ >= 0) {
            path_ = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd_);
        }
    }
    ~Netns() {
        if (fd_ >= 0) {
            close(fd_);
        }
    }
    Netns(const Netns &) = delete;
    Netns &operator=(const Netns &) = delete;

    bool made() const { return fd_ >= 0; }
    // The namespace, for setns(2) (Contained, BrokerOptions::netns_fd).
    int fd() const { return fd_; }
    // A path that opens the namespace while this process lives: for `ip link ... netns PATH`.
    const std::string &path() const { return path_; }
    // The shell command running `ip ARGS` in the namespace (`ip -n` takes /run/netns names only).
    std::string ipCommand(const std::string &args) const { return "nsenter --net=" + path_ + " ip " + args; }
    // `ip ARGS` in the namespace: its exit status.
    int run(const std::string &args) const { return std::system((ipCommand(args) + " >&2").c_str()); }

  private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace ibvx::test
