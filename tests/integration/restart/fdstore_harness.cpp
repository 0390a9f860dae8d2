// fdstore_harness: a test double of systemd's service manager for ONE service, written from
// systemd's published protocol only: sd_notify(3) (NOTIFY_SOCKET, READY=1, STOPPING=1, STATUS=,
// WATCHDOG=1, FDSTORE=1, FDSTOREREMOVE=1, FDNAME=), sd_listen_fds(3) (LISTEN_FDS, LISTEN_FDNAMES,
// LISTEN_PID, fds from 3) and systemd's docs/FILE_DESCRIPTOR_STORE.md, with the behaviour of
// systemd 252 (Debian 12): the store survives a restart and an automatic restart after a failure,
// and is dropped when the unit stops. It shares no code with the broker's side (common/fd_store),
// so that a misreading of the protocol there is not repeated here.
//
// Usage:
//   fdstore_harness [--listen PATH] [--listen-name NAME] [--fdstore-max N] [--restart no|on-failure]
//                   [--stop-timeout SECONDS] -- COMMAND [ARG...]
//   --listen PATH       a listening AF_UNIX stream socket at PATH, as a .socket unit's ListenStream=,
//                       passed first on every start (created once, kept across restarts)
//   --listen-name NAME  its FileDescriptorName= (default "ibv-extendd.socket", systemd's default:
//                       the socket unit's name)
//   --fdstore-max N     FileDescriptorStoreMax= (default 0: FDSTORE messages are ignored and their
//                       fds closed, as systemd does)
//   --restart POLICY    Restart= (default no); on-failure restarts after a non-zero exit or a
//                       death by signal, keeping the store
//   --stop-timeout S    TimeoutStopSec= (default 10): SIGKILL after SIGTERM and this long
//   --restart-sec MS    RestartSec= in milliseconds (default 0) before an automatic restart
// The service starts at once. Control: one command a line on stdin:
//   restart   SIGTERM, wait, start again with the store        (systemctl restart)
//   stop      SIGTERM, wait, drop the store (close every fd)   (systemctl stop)
//   start     start the service if it is not running           (systemctl start)
//   kill9     SIGKILL the service (then Restart= decides)      (kill -9 MAINPID)
//   status    prints a "status ..." line
// and, for fault-injection tests only (no systemd counterpart), on the store while the service
// is down (a RestartSec= window):
//   corrupt-fd NAME   overwrites bytes 4096.. of every stored fd named NAME with 'x'
//   drop-fd NAME      closes and forgets every stored fd named NAME (an fd that did not come back)
//   plant-fd NAME     stores a new empty memfd as NAME (what a service stored and then died
//                     before recording: a crash between its FDSTORE=1 and its own state)
//   quit      (or end of stdin, SIGTERM, SIGINT) stop as above and exit 0
// Events, one a line on stdout, flushed at once:
//   started pid=N fds=K                 K fds passed (the socket first, then the store, in order)
//   ready pid=N | stopping pid=N | status-text pid=N text=...
//   fdstore-add name=X fds=K store=S    | fdstore-refused name=X fds=K reason=...
//   fdstore-remove name=X removed=K store=S
//   exited pid=N status=exited:C|killed:SIG
//   fdstore-dropped fds=K               the store emptied because the unit stopped
//   corrupted|dropped name=X fds=K      | planted name=X store=S: the fault commands above
//   stopped
//   status pid=N restarts=R store=S ready=0|1 state=running|stopped names=A,B,..
//   error message=...                   a control line not understood, a failed start
//   ignored pid=N                       a message from another process than the main one
// Messages are accepted from the main process only (NotifyAccess=main, by SO_PASSCRED
// credentials). As in systemd, one FDNAME= names every fd of its message (no FDNAME: "stored"),
// an fd already in the store (same inode and flags) is not stored twice, fds beyond
// --fdstore-max and fds of a message without FDSTORE=1 are closed.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr size_t kMaxFdsPerMessage = 253;  // systemd's limit a datagram (SCM_MAX_FD - 2)

void event(const std::string &line) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
}

[[noreturn]] void die(const std::string &why) {
    std::fprintf(stderr, "fdstore_harness: %s\n", why.c_str());
    std::exit(2);
}

struct Stored {
    std::string name;
    int fd;
};

// systemd's fdname_is_valid(): printable ASCII without ':', at most 255 characters.
bool validName(const std::string &n) {
    return n.size() <= 255 && std::all_of(n.begin(), n.end(), [](char c) {
               auto u = static_cast<unsigned char>(c);
               return u >= ' ' && u < 127 && c != ':';
           });
}

// The same open file, as systemd's same_fd() decides it: kcmp(KCMP_FILE) when the kernel has it (one open
// file description), else the same inode and flags.
bool sameFile(int a, int b) {
    const pid_t self = ::getpid();
    long k = ::syscall(SYS_kcmp, self, self, 0 /* KCMP_FILE */, a, b);
    if (k >= 0) {
        return k == 0;
    }
    struct stat sa {
    }, sb{};
    return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino &&
           ::fcntl(a, F_GETFL) == ::fcntl(b, F_GETFL);
}

class Manager {
  public:
    std::string listen_path, listen_name = "ibv-extendd.socket";
    size_t fdstore_max = 0;
    bool restart_on_failure = false;
    int stop_timeout_s = 10;
    int restart_sec_ms = 0;
    std::vector<std::string> command;

    void run() {
        setUp();
        start();
        bool quitting = false;
        for (;;) {
            if (quitting && pid_ < 0) {
                return;
            }
            pollfd p[3] = {{notify_, POLLIN, 0}, {signals_, POLLIN, 0}, {stdin_open_ ? 0 : -1, POLLIN, 0}};
            int timeout = -1;
            if (restart_at_) {
                auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    *restart_at_ - std::chrono::steady_clock::now());
                timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
            }
            if (pid_ > 0 && kill_at_) {
                auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    *kill_at_ - std::chrono::steady_clock::now());
                timeout = static_cast<int>(std::max<int64_t>(0, left.count()));
            }
            if (::poll(p, 3, timeout) < 0) {
                if (errno == EINTR) {
                    continue;
                }
                die("poll: " + std::string(std::strerror(errno)));
            }
            if (restart_at_ && std::chrono::steady_clock::now() >= *restart_at_) {
                restart_at_.reset();
                start();
            }
            if (pid_ > 0 && kill_at_ && std::chrono::steady_clock::now() >= *kill_at_) {
                ::kill(pid_, SIGKILL);  // TimeoutStopSec= passed
                kill_at_.reset();
            }
            if ((p[0].revents & POLLIN) != 0) {
                receiveNotify();
            }
            if ((p[1].revents & POLLIN) != 0) {
                quitting = readSignals() || quitting;
            }
            if ((p[2].revents & (POLLIN | POLLHUP)) != 0) {
                quitting = readControl() || quitting;
            }
            if (quitting && pid_ > 0 && pending_ != Pending::kStop) {
                requestStop(Pending::kStop);
            }
        }
    }

  private:
    enum class Pending { kNone, kRestart, kStop };

    void setUp() {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGCHLD);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        sigprocmask(SIG_BLOCK, &set, nullptr);
        ::signal(SIGPIPE, SIG_IGN);
        signals_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
        if (signals_ < 0) {
            die("signalfd: " + std::string(std::strerror(errno)));
        }
        // An abstract datagram socket: nothing to clean up, unique per harness.
        notify_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        notify_name_ = "@fdstore-harness-" + std::to_string(::getpid());
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::memcpy(addr.sun_path + 1, notify_name_.data() + 1, notify_name_.size() - 1);
        auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + notify_name_.size());
        int one = 1;
        if (notify_ < 0 || ::bind(notify_, reinterpret_cast<sockaddr *>(&addr), len) < 0 ||
            ::setsockopt(notify_, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0) {
            die("notify socket: " + std::string(std::strerror(errno)));
        }
        if (!listen_path.empty()) {
            sockaddr_un la{};
            la.sun_family = AF_UNIX;
            if (listen_path.size() >= sizeof(la.sun_path)) {
                die("--listen path is longer than " + std::to_string(sizeof(la.sun_path) - 1) + " bytes");
            }
            std::memcpy(la.sun_path, listen_path.c_str(), listen_path.size());
            ::unlink(listen_path.c_str());
            listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (listen_ < 0 || ::bind(listen_, reinterpret_cast<sockaddr *>(&la), sizeof(la)) < 0 ||
                ::listen(listen_, SOMAXCONN) < 0) {
                die("--listen " + listen_path + ": " + std::strerror(errno));
            }
        }
    }

    void start() {
        if (pid_ > 0) {
            return;
        }
        std::vector<std::pair<std::string, int>> fds;
        if (listen_ >= 0) {
            fds.emplace_back(listen_name, listen_);
        }
        for (const Stored &s : store_) {
            fds.emplace_back(s.name, s.fd);
        }
        std::fflush(stdout);
        pid_t pid = ::fork();
        if (pid < 0) {
            event("error message=fork failed: " + std::string(std::strerror(errno)));
            return;
        }
        if (pid == 0) {
            execService(fds);
        }
        pid_ = pid;
        ready_ = false;
        pending_ = Pending::kNone;
        kill_at_.reset();
        event("started pid=" + std::to_string(pid) + " fds=" + std::to_string(fds.size()));
    }

    // In the child: fds to 3.. (copied above every source and target first, so that no move
    // overwrites a source still to be moved), the environment, exec.
    [[noreturn]] void execService(const std::vector<std::pair<std::string, int>> &fds) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        ::signal(SIGPIPE, SIG_DFL);
        int above = 3 + static_cast<int>(fds.size());
        for (const auto &f : fds) {
            above = std::max(above, f.second + 1);
        }
        std::vector<int> copies;
        for (const auto &f : fds) {
            int c = ::fcntl(f.second, F_DUPFD_CLOEXEC, above);
            if (c < 0) {
                ::_exit(126);
            }
            copies.push_back(c);
        }
        std::string names;
        for (size_t i = 0; i < copies.size(); ++i) {
            if (::dup2(copies[i], 3 + static_cast<int>(i)) < 0) {  // without FD_CLOEXEC
                ::_exit(126);
            }
            names += (i == 0 ? "" : ":") + fds[i].first;
        }
        // Nothing else of the manager's reaches the service (systemd closes every other fd).
        ::close_range(3 + static_cast<unsigned>(fds.size()), ~0U, 0);
        ::setenv("NOTIFY_SOCKET", notify_name_.c_str(), 1);
        if (fds.empty()) {
            ::unsetenv("LISTEN_FDS");
            ::unsetenv("LISTEN_FDNAMES");
            ::unsetenv("LISTEN_PID");
        } else {
            ::setenv("LISTEN_FDS", std::to_string(fds.size()).c_str(), 1);
            ::setenv("LISTEN_FDNAMES", names.c_str(), 1);
            ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
        }
        std::vector<char *> argv;
        for (const std::string &a : command) {
            argv.push_back(const_cast<char *>(a.c_str()));
        }
        argv.push_back(nullptr);
        ::execvp(argv[0], argv.data());
        std::fprintf(stderr, "fdstore_harness: exec %s: %s\n", argv[0], std::strerror(errno));
        ::_exit(127);
    }

    void requestStop(Pending why) {
        pending_ = why;
        ::kill(pid_, SIGTERM);
        kill_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(stop_timeout_s);
    }

    void dropStore() {
        for (const Stored &s : store_) {
            ::close(s.fd);
        }
        event("fdstore-dropped fds=" + std::to_string(store_.size()));
        store_.clear();
    }

    void receiveNotify() {
        for (;;) {
            char buf[4096];
            alignas(cmsghdr) char
                control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
            iovec iov{buf, sizeof(buf) - 1};
            msghdr msg{};
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control;
            msg.msg_controllen = sizeof(control);
            ssize_t len = ::recvmsg(notify_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
            if (len < 0) {
                return;
            }
            std::vector<int> fds;
            std::optional<pid_t> sender;
            for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                    const auto *p = reinterpret_cast<const int *>(CMSG_DATA(c));
                    fds.insert(fds.end(), p, p + n);
                } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
                    ucred cred{};
                    std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
                    sender = cred.pid;
                }
            }
            if (!sender || *sender != pid_ || pid_ <= 0 || (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
                for (int fd : fds) {
                    ::close(fd);
                }
                event("ignored pid=" + std::to_string(sender.value_or(0)));
                continue;
            }
            handle(std::string(buf, static_cast<size_t>(len)), fds);
        }
    }

    void handle(const std::string &text, std::vector<int> &fds) {
        std::optional<std::string> fdname;
        bool store = false, remove = false;
        std::string pid = std::to_string(pid_);
        size_t at = 0;
        while (at < text.size()) {
            size_t end = text.find('\n', at);
            std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
            at = end == std::string::npos ? text.size() : end + 1;
            if (line == "READY=1") {
                ready_ = true;
                event("ready pid=" + pid);
            } else if (line == "STOPPING=1") {
                event("stopping pid=" + pid);
            } else if (line.rfind("STATUS=", 0) == 0) {
                event("status-text pid=" + pid + " text=" + line.substr(7));
            } else if (line == "FDSTORE=1") {
                store = true;
            } else if (line == "FDSTOREREMOVE=1") {
                remove = true;
            } else if (line.rfind("FDNAME=", 0) == 0) {
                fdname = line.substr(7);
            }
            // WATCHDOG=1 and anything else: nothing to do for this double.
        }
        std::string name = fdname.value_or("stored");  // systemd's name for an unnamed fd
        if (remove) {
            size_t before = store_.size();
            auto gone = std::remove_if(store_.begin(), store_.end(), [&](const Stored &s) {
                if (s.name == name) {
                    ::close(s.fd);
                    return true;
                }
                return false;
            });
            store_.erase(gone, store_.end());
            event("fdstore-remove name=" + name + " removed=" + std::to_string(before - store_.size()) +
                  " store=" + std::to_string(store_.size()));
        }
        if (fds.empty()) {
            return;
        }
        const char *refused = !store             ? "no FDSTORE=1"
                              : fdstore_max == 0 ? "FileDescriptorStoreMax=0"
                              : !validName(name) ? "invalid FDNAME"
                                                 : nullptr;
        size_t added = 0, full = 0;
        for (int fd : fds) {
            bool duplicate = false;
            for (const Stored &s : store_) {
                duplicate = duplicate || sameFile(s.fd, fd);
            }
            if (refused != nullptr || duplicate) {
                ::close(fd);  // a duplicate is already stored: systemd keeps one copy
            } else if (store_.size() >= fdstore_max) {
                ::close(fd);
                ++full;
            } else {
                store_.push_back({name, fd});
                ++added;
            }
        }
        if (refused != nullptr) {
            event("fdstore-refused name=" + name + " fds=" + std::to_string(fds.size()) +
                  " reason=" + refused);
            return;
        }
        if (full > 0) {
            event("fdstore-refused name=" + name + " fds=" + std::to_string(full) +
                  " reason=FileDescriptorStoreMax=" + std::to_string(fdstore_max));
        }
        event("fdstore-add name=" + name + " fds=" + std::to_string(added) +
              " store=" + std::to_string(store_.size()));
    }

    // True when the harness should quit.
    bool readSignals() {
        bool quit = false;
        signalfd_siginfo si{};
        while (::read(signals_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
            if (si.ssi_signo == SIGCHLD) {
                reap();
            } else {
                quit = true;
            }
        }
        return quit;
    }

    void reap() {
        int status = 0;
        while (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
            bool failed = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0);
            event("exited pid=" + std::to_string(pid_) + " status=" +
                  (WIFSIGNALED(status) ? "killed:" + std::to_string(WTERMSIG(status))
                                       : "exited:" + std::to_string(WEXITSTATUS(status))));
            pid_ = -1;
            ready_ = false;
            kill_at_.reset();
            Pending why = std::exchange(pending_, Pending::kNone);
            if (why == Pending::kRestart) {
                ++restarts_;
                start();
            } else if (why == Pending::kNone && failed && restart_on_failure) {
                ++restarts_;
                if (restart_sec_ms > 0) {
                    restart_at_ =
                        std::chrono::steady_clock::now() + std::chrono::milliseconds(restart_sec_ms);
                } else {
                    start();
                }
            } else {
                dropStore();
                event("stopped");
            }
        }
        while (::waitpid(-1, &status, WNOHANG) > 0) {
            // the service's own children re-parented to us: nothing to report
        }
    }

    // True when the harness should quit.
    bool readControl() {
        char buf[512];
        ssize_t n = ::read(0, buf, sizeof(buf));
        if (n <= 0) {
            stdin_open_ = false;
            return true;
        }
        control_.append(buf, static_cast<size_t>(n));
        bool quit = false;
        for (size_t nl; (nl = control_.find('\n')) != std::string::npos;) {
            std::string cmd = control_.substr(0, nl);
            control_.erase(0, nl + 1);
            quit = obey(cmd) || quit;
        }
        return quit;
    }

    bool obey(const std::string &cmd) {
        if (cmd == "restart") {
            if (pid_ > 0) {
                requestStop(Pending::kRestart);
            } else {
                start();
            }
        } else if (cmd == "stop") {
            if (pid_ > 0) {
                requestStop(Pending::kStop);
            } else {
                event("stopped");
            }
        } else if (cmd == "start") {
            start();
        } else if (cmd == "kill9") {
            if (pid_ > 0) {
                ::kill(pid_, SIGKILL);
            }
        } else if (cmd == "status") {
            event("status pid=" + std::to_string(std::max(pid_, 0)) +
                  " restarts=" + std::to_string(restarts_) + " store=" + std::to_string(store_.size()) +
                  " ready=" + (ready_ ? "1" : "0") + " state=" + (pid_ > 0 ? "running" : "stopped") +
                  " names=" + storedNames());
        } else if (cmd.rfind("corrupt-fd ", 0) == 0 || cmd.rfind("drop-fd ", 0) == 0) {
            bool drop = cmd[0] == 'd';
            std::string name = cmd.substr(cmd.find(' ') + 1);
            size_t n = 0;
            for (auto it = store_.begin(); it != store_.end();) {
                if (it->name != name) {
                    ++it;
                    continue;
                }
                ++n;
                if (drop) {
                    ::close(it->fd);
                    it = store_.erase(it);
                    continue;
                }
                struct stat st {};
                if (::fstat(it->fd, &st) == 0 && st.st_size > 4096) {
                    std::string junk(static_cast<size_t>(st.st_size - 4096), 'x');
                    (void)!::pwrite(it->fd, junk.data(), junk.size(), 4096);
                }
                ++it;
            }
            event(std::string(drop ? "dropped" : "corrupted") + " name=" + name +
                  " fds=" + std::to_string(n));
        } else if (cmd.rfind("plant-fd ", 0) == 0) {
            const std::string name = cmd.substr(9);
            const int fd = ::memfd_create("planted", MFD_CLOEXEC);
            if (fd >= 0 && validName(name)) {
                store_.push_back({name, fd});
                event("planted name=" + name + " store=" + std::to_string(store_.size()));
            } else {
                if (fd >= 0) {
                    ::close(fd);
                }
                event("error message=cannot plant '" + name + "'");
            }
        } else if (cmd == "quit") {
            return true;
        } else if (!cmd.empty()) {
            event("error message=unknown command '" + cmd + "' (restart, stop, start, kill9, status, quit)");
        }
        return false;
    }

    // The stored fds' names, comma-separated, for a status line (what a leak left behind).
    std::string storedNames() const {
        std::string out;
        for (const Stored &st : store_) {
            out += (out.empty() ? "" : ",") + st.name;
        }
        return out;
    }

    int notify_ = -1, signals_ = -1, listen_ = -1;
    std::string notify_name_;
    pid_t pid_ = -1;
    bool ready_ = false, stdin_open_ = true;
    Pending pending_ = Pending::kNone;
    std::optional<std::chrono::steady_clock::time_point> restart_at_;
    std::optional<std::chrono::steady_clock::time_point> kill_at_;
    uint64_t restarts_ = 0;
    std::vector<Stored> store_;
    std::string control_;
};

}  // namespace

int main(int argc, char **argv) {
    Manager m;
    int i = 1;
    auto value = [&](const char *opt) -> std::string {
        if (i + 1 >= argc) {
            die(std::string(opt) + " needs a value");
        }
        return argv[++i];
    };
    for (; i < argc; ++i) {
        std::string a = argv[i];
        try {
            if (a == "--") {
                ++i;
                break;
            } else if (a == "--listen") {
                m.listen_path = value("--listen");
            } else if (a == "--listen-name") {
                m.listen_name = value("--listen-name");
                if (!validName(m.listen_name)) {
                    die("--listen-name must be printable ASCII without ':', at most 255 characters");
                }
            } else if (a == "--fdstore-max") {
                m.fdstore_max = std::stoul(value("--fdstore-max"));
            } else if (a == "--restart") {
                std::string p = value("--restart");
                if (p != "no" && p != "on-failure") {
                    die("--restart is no or on-failure, not '" + p + "'");
                }
                m.restart_on_failure = p == "on-failure";
            } else if (a == "--stop-timeout") {
                m.stop_timeout_s = std::stoi(value("--stop-timeout"));
            } else if (a == "--restart-sec") {
                m.restart_sec_ms = std::stoi(value("--restart-sec"));
            } else {
                die("unknown option '" + a + "' (the service's command goes after --)");
            }
        } catch (const std::exception &) {
            die("bad value for " + a);
        }
    }
    for (; i < argc; ++i) {
        m.command.emplace_back(argv[i]);
    }
    if (m.command.empty()) {
        die("usage: fdstore_harness [--listen PATH] [--listen-name NAME] [--fdstore-max N] "
            "[--restart no|on-failure] [--stop-timeout S] [--restart-sec MS] -- COMMAND [ARG...]");
    }
    m.run();
    return 0;
}
