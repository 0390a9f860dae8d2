#include "tools/ibv-extend-run/launch.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace ibvx::run {
namespace {

// What a supervisor or a user sends to stop or poke the program: passed on to it.
constexpr int kForwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

// bwrap's stderr kept from an attempt that failed, at most this much.
constexpr size_t kSaidLimit = 4096;

struct Attempt {
    bool ran = false;     // the program started: its shell said so on the pipe
    int status = 0;       // bwrap's, from waitpid
    int signalled = 0;    // a signal that came before the program ran (bwrap was killed)
    std::string said;     // bwrap's stderr before the program ran
    std::string failure;  // this process could not start bwrap at all
};

Attempt attemptOnce(const std::vector<std::string> &args, char *const *command, int sigfd,
                    const sigset_t &unblocked) {
    Attempt a;
    int ready[2], err[2];
    if (::pipe2(ready, O_CLOEXEC) < 0) {
        a.failure = std::string("cannot make a pipe: ") + std::strerror(errno);
        return a;
    }
    if (::pipe2(err, O_CLOEXEC) < 0) {
        a.failure = std::string("cannot make a pipe: ") + std::strerror(errno);
        ::close(ready[0]);
        ::close(ready[1]);
        return a;
    }
    // The two descriptors the sandbox's shell gets, numbered from 100 up: the ones below may be
    // the caller's for the program (socket activation's 3 and on, a shell's 3<file).
    const int ready_fd = ::fcntl(ready[1], F_DUPFD_CLOEXEC, 100);
    int stderr_fd = ::fcntl(2, F_DUPFD_CLOEXEC, 100);
    if (stderr_fd < 0) {
        stderr_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);  // no stderr: the program gets none either
    }
    ::close(ready[1]);
    if (ready_fd < 0 || stderr_fd < 0) {
        a.failure = std::string("cannot duplicate a descriptor: ") + std::strerror(errno);
        ::close(ready[0]);
        ::close(err[0]);
        ::close(err[1]);
        if (ready_fd >= 0) {
            ::close(ready_fd);
        }
        return a;
    }
    // Inside the sandbox: say the program's pid (the shell's, which exec keeps), give it the real
    // stderr, close both descriptors, and become the program. bash: dash takes one digit in a
    // redirection.
    const std::string r = std::to_string(ready_fd), e = std::to_string(stderr_fd);
    const std::string script =
        "printf '%s\\n' \"$$\" >&" + r + " || exit 125; exec 2>&" + e + " " + r + ">&- " + e + ">&- \"$@\"";
    std::vector<std::string> full = args;
    full.insert(full.end(), {"--", "/bin/bash", "-c", script, "ibv-extend-run"});
    std::vector<char *> argv;
    for (std::string &arg : full) {
        argv.push_back(arg.data());
    }
    for (char *const *c = command; *c != nullptr; ++c) {
        argv.push_back(*c);
    }
    argv.push_back(nullptr);

    const pid_t pid = ::fork();
    if (pid == 0) {
        // Async-signal-safe calls only, as after any fork.
        ::sigprocmask(SIG_SETMASK, &unblocked, nullptr);
        if (::fcntl(ready_fd, F_SETFD, 0) < 0 || ::fcntl(stderr_fd, F_SETFD, 0) < 0 ||
            ::dup2(err[1], 2) < 0) {
            ::_exit(126);
        }
        ::execv(argv[0], argv.data());
        static const char msg[] = "cannot run bwrap\n";
        (void)!::write(2, msg, sizeof(msg) - 1);
        ::_exit(127);
    }
    ::close(ready_fd);
    ::close(stderr_fd);
    ::close(err[1]);
    if (pid < 0) {
        a.failure = std::string("cannot fork: ") + std::strerror(errno);
        ::close(ready[0]);
        ::close(err[0]);
        return a;
    }
    bool ready_open = true, err_open = true;
    std::string line;
    pid_t program = -1;
    char buf[4096];
    while (ready_open || err_open) {
        pollfd p[3] = {
            {ready_open ? ready[0] : -1, POLLIN, 0}, {err_open ? err[0] : -1, POLLIN, 0}, {sigfd, POLLIN, 0}};
        if (::poll(p, 3, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            break;
        }
        if (p[0].revents != 0) {
            const ssize_t n = ::read(ready[0], buf, sizeof(buf));
            if (n > 0) {
                line.append(buf, static_cast<size_t>(n));
            }
            if (line.find('\n') != std::string::npos) {
                a.ran = true;
                program = static_cast<pid_t>(std::atol(line.c_str()));
            }
            if (n <= 0 || a.ran) {
                ::close(ready[0]);
                ready_open = false;
            }
        }
        if (p[1].revents != 0) {
            const ssize_t n = ::read(err[0], buf, sizeof(buf));
            if (n <= 0) {
                ::close(err[0]);
                err_open = false;
            } else if (a.ran) {
                (void)!::write(2, buf, static_cast<size_t>(n));  // bwrap's own, after the start
            } else if (a.said.size() < kSaidLimit) {
                a.said.append(buf, static_cast<size_t>(n));
            }
        }
        if ((p[2].revents & POLLIN) != 0) {
            signalfd_siginfo si{};
            if (::read(sigfd, &si, sizeof(si)) != static_cast<ssize_t>(sizeof(si))) {
                continue;
            }
            const int code = si.ssi_code;
            if (a.ran && program > 0) {
                // A terminal's signal (SI_KERNEL) reached the program's process group already.
                if (code == SI_USER || code == SI_QUEUE || code == SI_TKILL) {
                    ::kill(program, static_cast<int>(si.ssi_signo));
                }
            } else if (a.signalled == 0) {
                a.signalled = static_cast<int>(si.ssi_signo);
                ::kill(pid, SIGKILL);  // --die-with-parent takes the sandbox's child with it
            }
        }
    }
    if (ready_open) {
        ::close(ready[0]);  // poll itself failed
    }
    if (err_open) {
        ::close(err[0]);
    }
    while (::waitpid(pid, &a.status, 0) < 0 && errno == EINTR) {
    }
    return a;
}

std::string firstLine(const std::string &text) {
    return text.substr(0, text.find('\n'));
}

}  // namespace

bool transientSandboxFailure(const std::string &said) {
    // bwrap 0.8's bind_mount(): "Can't bind mount A on B: Unable to apply mount flags: remount
    // \"P\": No such file or directory", or "Unable to find \"P\" in mount table".
    if (said.find("Can't bind mount") == std::string::npos) {
        return false;
    }
    return said.find("in mount table") != std::string::npos ||
           (said.find("Unable to apply mount flags") != std::string::npos &&
            said.find("No such file or directory") != std::string::npos);
}

int runSandboxed(const std::vector<std::string> &args, char *const *command, int attempts, std::string *why) {
    sigset_t forwarded, unblocked;
    ::sigemptyset(&forwarded);
    for (int s : kForwarded) {
        ::sigaddset(&forwarded, s);
    }
    if (::sigprocmask(SIG_BLOCK, &forwarded, &unblocked) < 0) {
        *why = std::string("cannot block signals: ") + std::strerror(errno);
        return -1;
    }
    const int sigfd = ::signalfd(-1, &forwarded, SFD_CLOEXEC);
    if (sigfd < 0) {
        *why = std::string("cannot make a signalfd: ") + std::strerror(errno);
        ::sigprocmask(SIG_SETMASK, &unblocked, nullptr);
        return -1;
    }
    int rc = -1;
    for (int attempt = 1;; ++attempt) {
        Attempt a = attemptOnce(args, command, sigfd, unblocked);
        if (!a.failure.empty()) {
            *why = a.failure;
            break;
        }
        if (a.ran) {
            rc = WIFEXITED(a.status) ? WEXITSTATUS(a.status) : 128 + WTERMSIG(a.status);
            break;
        }
        if (a.signalled != 0) {
            rc = 128 + a.signalled;
            break;
        }
        const std::string said = firstLine(a.said);
        if (!transientSandboxFailure(a.said) || attempt >= attempts) {
            *why = !said.empty()         ? said
                   : WIFEXITED(a.status) ? "bwrap exited with " + std::to_string(WEXITSTATUS(a.status))
                                         : "bwrap was killed by signal " + std::to_string(WTERMSIG(a.status));
            if (attempt > 1) {
                *why += " (" + std::to_string(attempt) + " tries)";
            }
            break;
        }
        std::fprintf(stderr,
                     "ibv-extend-run: %s: a mount changed while bwrap copied the host's; trying again (%d of "
                     "%d)\n",
                     said.c_str(), attempt + 1, attempts);
        std::this_thread::sleep_for(std::chrono::milliseconds(10 * attempt));
    }
    ::close(sigfd);
    ::sigprocmask(SIG_SETMASK, &unblocked, nullptr);
    return rc;
}

}  // namespace ibvx::run
