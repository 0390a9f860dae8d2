// The chaos soak (issue 26, docs/restart.md "The chaos soak"): tenants run verified RC traffic
// (chaos-tenant: WRITE, READ, SEND/RECV, atomics, CQ/MR/QP churn, forked children registering
// memory; restart-tenant: a WRITE loop with an AH and a completion channel) over the libibverbs
// face, and through the extend API (chaos-extend-tenant: WRITE, READ, SEND/RECV posted on the
// mapped queues as a device kernel would, objects churned through ibvx_*), against the real broker under
// fdstore_harness (systemd's fd store), while the soak, at seeded random moments, kill -9s the broker, runs
// `ibv-extendctl restart`, kills a tenant in the middle of its calls, corrupts the fd-channel frames of a
// session and sends garbage from a client that is no session (run as root, half of those from uid
// 65534, a foreign user: the socket is opened to everyone for it, as a .socket unit with
// SocketMode=0666 would).
//
// It checks that no surviving tenant loses or repeats an operation except in the windows softnda
// SPEC.md §10 documents (each counted and reported), that every killed tenant's session and
// objects are reclaimed, that no session other than the targeted ones ends, and that the broker's
// fds, fd store, arena and allocated bytes return to their baseline.
//
//   IBVX_SOAK_SECONDS   how long the chaos runs (default 20: the short form in make test)
//   IBVX_SOAK_SEED      the seed of every random choice, the tenants' included (default 26)
//   IBVX_SOAK_TENANTS   how many chaos-tenants survive the run (default 2)
//   IBVX_SOAK_EXTEND_TENANTS  how many chaos-extend-tenants survive the run (default 1)
//   IBVX_SOAK_EXTEND_CHURN=1  they also open and close whole contexts (off by default until it
//                       is shown to hit only counted windows, docs/restart.md "The chaos soak")
//   IBVX_SOAK_FORK=0    the chaos-tenants fork no children (by default they fork, now and then,
//                       a child that opens the device and registers memory)
// The long form runs the program itself (ctest stops it at the test's TIMEOUT, 300 s, which
// `ctest --timeout` does not override): docs/restart.md "The chaos soak" gives the command.
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <random>
#include <sstream>

#include "common/unique_fd.h"
#include "tests/integration/restart/restart_support.h"

namespace ibvx::test {
namespace {

uint64_t envOr(const char *name, uint64_t fallback) {
    const char *v = std::getenv(name);
    return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

// What the chaos did and what the tenants verified, printed at the end.
struct Figures {
    uint64_t kill9 = 0, ctl_restarts = 0, tenant_kills = 0, corrupted = 0, garbage = 0, foreign_garbage = 0;
    uint64_t ops = 0, extend_ops = 0, churn = 0, forks = 0, control = 0, write_loop = 0;
    uint64_t win_atomic = 0, win_recv = 0, win_cqe = 0;
    uint64_t fork_no_session = 0;  // a child's session not opened: the broker was restarting
};

// The broker's state of interest for the baseline: what it holds for sessions.
struct Holdings {
    int fds = -1;
    uint64_t objects = 0, arena = 0, allocated = 0, doorbells = 0, store = 0;
    long rss_kib = 0;
    std::string store_names;  // what the fd store holds
    std::string str() const {
        return "fds " + std::to_string(fds) + ", objects " + std::to_string(objects) + ", arena " +
               std::to_string(arena) + " B, allocated " + std::to_string(allocated) + " B, doorbell pages " +
               std::to_string(doorbells) + ", fd store " + std::to_string(store) + " (" + store_names +
               "), rss " + std::to_string(rss_kib) + " KiB";
    }
};

int fdCountOf(pid_t pid) {
    int n = 0;
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d)) {
            n += e->d_name[0] != '.';
        }
        closedir(d);
    }
    return n;
}

long rssKiBOf(pid_t pid) {
    std::string status = slurp("/proc/" + std::to_string(pid) + "/status");
    size_t at = status.find("VmRSS:");
    return at == std::string::npos ? -1 : std::strtol(status.c_str() + at + 6, nullptr, 10);
}

class Soak {
  public:
    Soak()
        : seed_(envOr("IBVX_SOAK_SEED", 26)),
          seconds_(envOr("IBVX_SOAK_SECONDS", 20)),
          tenants_(envOr("IBVX_SOAK_TENANTS", 2)),
          extend_tenants_(envOr("IBVX_SOAK_EXTEND_TENANTS", 1)),
          fork_(envOr("IBVX_SOAK_FORK", 1) != 0),
          extend_churn_(envOr("IBVX_SOAK_EXTEND_CHURN", 0) != 0),
          rng_(seed_),
          admin_(broker_.socket()) {}

    void run() {
        ASSERT_FALSE(broker_.waitFor("ready ").empty()) << broker_.log();
        foreign_ = ::geteuid() == 0 && ::chmod(broker_.dir().c_str(), 0711) == 0 &&
                   ::chmod(broker_.socket().c_str(), 0666) == 0;
        // The baseline is a restarted broker's (the first process also holds what its start-up
        // left, close-on-exec fds no restart carries over), with no session.
        ctlRestart();
        ASSERT_TRUE(admin_.waitRestarts(1)) << broker_.log();
        const Holdings baseline = holdings();
        printf("soak: seed %llu, %llu s, %llu chaos tenants%s, %llu through ibvx_*; baseline: %s\n",
               (unsigned long long)seed_, (unsigned long long)seconds_, (unsigned long long)tenants_,
               fork_ ? " (forking)" : "", (unsigned long long)extend_tenants_, baseline.str().c_str());

        startSurvivors();
        ASSERT_FALSE(HasFatalFailure());
        const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds_);
        while (std::chrono::steady_clock::now() < end && !HasFatalFailure()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng_() % 1300));
            act();
            checkSurvivorsLive();
        }
        ASSERT_FALSE(HasFatalFailure());
        finishSurvivors();

        // Everything given back: no session, the restart state and the store emptied, no fd kept.
        ASSERT_TRUE(eventually([&] { return admin_.sessions().empty(); }, 30s))
            << "sessions left after every tenant ended\n"
            << broker_.log();
        ctlRestart();
        Holdings after;
        EXPECT_TRUE(eventually(
            [&] {
                after = holdings();
                return after.fds <= baseline.fds && after.objects == baseline.objects &&
                       after.arena == baseline.arena && after.allocated == baseline.allocated &&
                       after.doorbells == baseline.doorbells && after.store <= baseline.store;
            },
            20s))
            << "baseline: " << baseline.str() << "\nafter:    " << after.str() << "\n"
            << fdTargets(broker_.servicePid());
        printf("soak: after: %s\n", after.str().c_str());
        const Figures &f = figures_;
        printf(
            "soak: %llu kill -9, %llu ibv-extendctl restart, %llu tenants killed, %llu sessions' frames "
            "corrupted, %llu garbage connections (%llu from a foreign uid)\n",
            (unsigned long long)f.kill9, (unsigned long long)f.ctl_restarts,
            (unsigned long long)f.tenant_kills, (unsigned long long)f.corrupted,
            (unsigned long long)f.garbage, (unsigned long long)f.foreign_garbage);
        printf(
            "soak: verified %llu operations (WRITE/READ/SEND/atomic) + %llu through ibvx_* (WRITE/READ/SEND) "
            "+ "
            "%llu WRITE-loop WRs, %llu churn calls, %llu control calls, %llu forked children (%llu found no "
            "session: opened during a restart)\n",
            (unsigned long long)f.ops, (unsigned long long)f.extend_ops, (unsigned long long)f.write_loop,
            (unsigned long long)f.churn, (unsigned long long)f.control, (unsigned long long)f.forks,
            (unsigned long long)f.fork_no_session);
        printf(
            "soak: SPEC §10 windows: %llu atomic applied twice, %llu receive skipped, %llu completion lost\n",
            (unsigned long long)f.win_atomic, (unsigned long long)f.win_recv, (unsigned long long)f.win_cqe);
        RecordProperty("ops", std::to_string(f.ops + f.extend_ops));
        RecordProperty("restarts", std::to_string(f.kill9 + f.ctl_restarts));
    }

  private:
    std::string err(const std::string &name) const { return broker_.dir() + "/" + name + ".err"; }

    std::unique_ptr<Tenant> chaosTenant(const std::string &name, uint64_t seed) {
        std::vector<std::string> argv{IBVX_CHAOS_TENANT, "softnda0", std::to_string(seed)};
        if (fork_) {
            argv.push_back("fork");
        }
        return std::make_unique<Tenant>(broker_.socket(), err(name), argv);
    }

    void startSurvivors() {
        for (uint64_t i = 0; i < tenants_; ++i) {
            names_.push_back("chaos" + std::to_string(i));
            survivors_.push_back(chaosTenant(names_.back(), seed_ * 100 + i));
        }
        for (uint64_t i = 0; i < extend_tenants_; ++i) {
            names_.push_back("extend" + std::to_string(i));
            std::vector<std::string> argv{IBVX_CHAOS_EXTEND_TENANT, "softnda0",
                                          std::to_string(seed_ * 100 + 50 + i)};
            if (extend_churn_) {
                argv.push_back("churn");
            }
            survivors_.push_back(std::make_unique<Tenant>(broker_.socket(), err(names_.back()), argv));
        }
        names_.push_back("writeloop");  // the last survivor
        // "windows": a lost CQE of SPEC.md §10 is counted (its WRITE's value at the target), not fatal.
        survivors_.push_back(
            std::make_unique<Tenant>(broker_.socket(), err("writeloop"),
                                     std::vector<std::string>{IBVX_RESTART_TENANT, "softnda0", "windows"}));
        for (size_t i = 0; i < survivors_.size(); ++i) {
            ASSERT_FALSE(survivors_[i]->lineStarting("ready").empty())
                << names_[i] << ": " << survivors_[i]->lines() << slurp(err(names_[i])) << broker_.log();
        }
        std::map<int, uint64_t> session_of;
        for (auto &[id, pid] : admin_.sessions()) {
            session_of[pid] = id;
        }
        for (auto &t : survivors_) {
            ASSERT_EQ(session_of.count(t->pid()), 1u) << broker_.log();
            survivor_sessions_.insert(session_of[t->pid()]);
        }
    }

    // No session of a survivor ended (their ids are kept across restarts).
    void checkSurvivorsLive() {
        std::set<uint64_t> live;
        std::string listed;
        for (auto &[id, pid] : admin_.sessions()) {
            live.insert(id);
            listed += " " + std::to_string(id) + "(pid " + std::to_string(pid) + ")";
        }
        for (uint64_t id : survivor_sessions_) {
            ASSERT_EQ(live.count(id), 1u) << "survivor session " << id << " ended; listed:" << listed << "\n"
                                          << survivorErrors() << broker_.log();
        }
        broker_.send("status");  // read the harness's events, so its stdout never fills
        ASSERT_FALSE(broker_.waitFor("status ").empty());
        broker_.forgetSeen();
    }

    // What the survivors wrote on stderr, for a failure's message.
    std::string survivorErrors() {
        std::string out;
        for (size_t i = 0; i < survivors_.size(); ++i) {
            const std::string &name = names_[i];
            int rc = -1;
            const bool exited = survivors_[i]->exited(&rc);
            out += name + " (pid " + std::to_string(survivors_[i]->pid()) + ", " +
                   (exited ? "exited " + std::to_string(rc) : std::string("running")) +
                   "): " + slurp(err(name)) + "\n";
        }
        return out;
    }

    void act() {
        switch (rng_() % 5) {
            case 0:
                kill9();
                break;
            case 1:
                ctlRestart();
                ++figures_.ctl_restarts;
                break;
            case 2:
                killTenantMidCall();
                break;
            case 3:
                corruptFrames();
                break;
            default:
                garbage();
        }
    }

    void kill9() {
        broker_.send("kill9");
        ASSERT_FALSE(broker_.waitFor("exited ").empty());
        ASSERT_FALSE(broker_.waitFor("ready ").empty()) << broker_.log();
        admin_.reconnect();
        ASSERT_TRUE(admin_.waitRestarts(0)) << broker_.log();
        ++figures_.kill9;
    }

    void ctlRestart() {
        pb::GetStatusResponse before;
        ASSERT_TRUE(admin_.status(&before).ok()) << broker_.log();
        const std::string cmd = std::string(std::getenv("IBVX_BUILD_DIR")) +
                                "/tools/ibv-extendctl/ibv-extendctl --timeout 30 --socket " +
                                broker_.socket() + " restart >" + broker_.dir() + "/ctl.out 2>&1";
        ASSERT_EQ(system(cmd.c_str()), 0) << slurp(broker_.dir() + "/ctl.out") << broker_.log();
        admin_.reconnect();
        ASSERT_TRUE(admin_.waitRestarts(before.restarts() + 1)) << broker_.log();
    }

    // A chaos-tenant killed (SIGKILL) at a random moment of its calls: its session and every
    // object it held must be reclaimed.
    void killTenantMidCall() {
        auto victim = chaosTenant("victim", seed_ * 100 + 99 + figures_.tenant_kills);
        ASSERT_FALSE(victim->lineStarting("ready").empty()) << slurp(err("victim")) << broker_.log();
        std::this_thread::sleep_for(std::chrono::milliseconds(rng_() % 300));
        const pid_t pid = victim->pid();
        victim->kill9();
        EXPECT_TRUE(eventually(
            [&] {
                for (auto &[id, p] : admin_.sessions()) {
                    if (p == pid) {
                        return false;
                    }
                }
                return admin_.objects().count(pid) == 0;
            },
            20s))
            << "killed tenant " << pid << " not reclaimed\n"
            << broker_.log();
        ++figures_.tenant_kills;
    }

    // A session of the soak's own, holding a context and a PD, whose fd channel then carries a
    // frame no client may send: that session (only) ends and its objects are reclaimed.
    void corruptFrames() {
        TestClient c(broker_.socket());
        ASSERT_TRUE(eventually([&] { return c.connect(); })) << broker_.log();
        pb::OpenContextRequest oreq;
        oreq.set_device_name("softnda0");
        pb::OpenContextResponse oresp;
        ASSERT_TRUE(c.call(&pb::Broker::Stub::OpenContext, oreq, &oresp).ok());
        pb::AllocPdRequest preq;
        preq.set_context(oresp.context());
        pb::AllocPdResponse presp;
        ASSERT_TRUE(c.call(&pb::Broker::Stub::AllocPd, preq, &presp).ok());
        const size_t objects_before = admin_.objects()[getpid()].size();
        ASSERT_GE(objects_before, 2u);
        const std::string junk(64, '\xff');  // a header announcing more than a frame may carry
        ASSERT_EQ(::send(c.channelFd(), junk.data(), junk.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(junk.size()));
        pb::ListDevicesResponse ld;
        EXPECT_TRUE(eventually([&] {
            return c.call(&pb::Broker::Stub::ListDevices, pb::ListDevicesRequest(), &ld).error_code() ==
                   grpc::StatusCode::UNAVAILABLE;
        })) << "the session with corrupt frames did not end\n"
            << broker_.log();
        EXPECT_TRUE(eventually([&] { return admin_.objects().count(getpid()) == 0; }))
            << "its objects were not reclaimed\n"
            << broker_.log();
        ++figures_.corrupted;
    }

    // Random bytes from a connection that is no session (after the IBVX magic or the HTTP/2
    // preface): the broker closes it. Half of them come from a foreign uid when the soak can
    // make one (as root).
    void garbage() {
        std::string bytes = rng_() % 2 != 0 ? "IBVX" : "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
        for (int i = 0; i < 1024; ++i) {
            bytes += static_cast<char>(rng_());
        }
        if (foreign_ && rng_() % 2 != 0) {
            ASSERT_NO_FATAL_FAILURE(garbageAsForeignUid(bytes));
            ++figures_.foreign_garbage;
        } else {
            UniqueFd fd = connectUnix(broker_.socket());
            ASSERT_TRUE(fd) << broker_.log();
            EXPECT_TRUE(sendAndSeeClosed(fd.get(), bytes)) << "a garbage connection was left open";
        }
        ++figures_.garbage;
    }

    // Sends bytes on fd and waits (10 s at most) for the broker to close the connection.
    static bool sendAndSeeClosed(int fd, const std::string &bytes) {
        (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        return eventually(
            [&] {
                char buf[4096];
                pollfd p{fd, POLLIN, 0};
                return ::poll(&p, 1, 0) == 1 && ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0;
            },
            10s);
    }

    // The same from a child that became uid/gid 65534 before connecting (the broker reads the
    // peer's credentials at connect): exit 0 once closed, 2 when it cannot connect, 1 when the
    // connection stays open. The child of this multithreaded process makes system calls only.
    void garbageAsForeignUid(const std::string &bytes) {
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        ASSERT_LT(broker_.socket().size(), sizeof(addr.sun_path));
        std::memcpy(addr.sun_path, broker_.socket().c_str(), broker_.socket().size() + 1);
        pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            constexpr uid_t kNobody = 65534;
            if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
                ::setresuid(kNobody, kNobody, kNobody) != 0) {
                _exit(3);
            }
            int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
                _exit(2);
            }
            (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
            char buf[4096];
            for (int waited_ms = 0; waited_ms < 10000; waited_ms += 100) {
                pollfd p{fd, POLLIN, 0};
                if (::poll(&p, 1, 100) == 1 && ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT) <= 0) {
                    _exit(0);
                }
            }
            _exit(1);
        }
        int status = 0;
        const bool ended = eventually([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, 30s);
        if (!ended) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
        }
        ASSERT_TRUE(ended) << "the foreign client did not finish";
        ASSERT_TRUE(WIFEXITED(status)) << "foreign client status " << status;
        EXPECT_EQ(WEXITSTATUS(status), 0) << "foreign client: 1 = connection left open, 2 = cannot connect, "
                                             "3 = cannot become uid 65534\n"
                                          << broker_.log();
    }

    // The broker's lines on sessions that ended or were not restored (the last 40): what a
    // tenant's "the broker ended this process's session" is read against.
    std::string sessionEnds() const {
        std::istringstream in(broker_.log());
        std::deque<std::string> lines;
        for (std::string line; std::getline(in, line);) {
            if (line.find("restore:") != std::string::npos || line.find("ended") != std::string::npos ||
                line.find("ending it") != std::string::npos || line.find("evict") != std::string::npos) {
                lines.push_back(line);
                if (lines.size() > 40) {
                    lines.pop_front();
                }
            }
        }
        std::string out = "\nthe broker on sessions ended or not restored (last 40 lines):\n";
        for (const std::string &l : lines) {
            out += l + "\n";
        }
        return out;
    }

    void finishSurvivors() {
        for (size_t i = 0; i < survivors_.size(); ++i) {
            Tenant &t = *survivors_[i];
            const bool writeloop = i + 1 == survivors_.size();
            const std::string &name = names_[i];
            std::string done = t.finish();
            ASSERT_FALSE(done.empty()) << name << ": " << t.lines() << slurp(err(name)) << sessionEnds();
            EXPECT_EQ(t.wait(), 0) << name << ": " << done << slurp(err(name)) << sessionEnds();
            EXPECT_EQ(field(done, "failed"), 0u) << name << ": " << done << slurp(err(name)) << sessionEnds();
            printf("soak: %s: %s", name.c_str(), done.c_str());
            if (writeloop) {
                EXPECT_EQ(field(done, "control_failed"), 0u) << done << slurp(err(name));
                figures_.write_loop += field(done, "wrs");
                figures_.win_cqe += field(done, "win_cqe");
                figures_.control += field(done, "control");
                continue;
            }
            if (name.rfind("extend", 0) == 0) {
                figures_.extend_ops += field(done, "ops");
                figures_.churn += field(done, "churn");
                figures_.win_recv += field(done, "win_recv");
                figures_.win_cqe += field(done, "win_cqe");
                continue;
            }
            figures_.ops += field(done, "ops");
            figures_.churn += field(done, "churn");
            figures_.forks += field(done, "forks");
            figures_.win_atomic += field(done, "win_atomic");
            figures_.win_recv += field(done, "win_recv");
            figures_.win_cqe += field(done, "win_cqe");
            figures_.fork_no_session += field(done, "fork_no_session");
        }
    }

    Holdings holdings() {
        Holdings h;
        h.fds = fdCountOf(broker_.servicePid());
        h.rss_kib = rssKiBOf(broker_.servicePid());
        pb::GetStatusResponse st;
        if (admin_.status(&st).ok()) {
            h.objects = st.objects();
            h.arena = st.arena_bytes();
            h.allocated = st.allocated_bytes();
            h.doorbells = st.doorbell_pages();
        }
        broker_.send("status");
        std::string line = broker_.waitFor("status ");
        size_t at = line.find(" store=");
        h.store = at == std::string::npos ? UINT64_MAX : std::strtoull(line.c_str() + at + 7, nullptr, 10);
        if (size_t names = line.find(" names="); names != std::string::npos) {
            h.store_names = line.substr(names + 7);
            while (!h.store_names.empty() && h.store_names.back() == '\n') {
                h.store_names.pop_back();
            }
        }
        return h;
    }

    static bool HasFatalFailure() { return ::testing::Test::HasFatalFailure(); }
    static void RecordProperty(const std::string &k, const std::string &v) {
        ::testing::Test::RecordProperty(k, v);
    }

    const uint64_t seed_, seconds_, tenants_, extend_tenants_;
    const bool fork_, extend_churn_;
    bool foreign_ = false;  // garbage may come from uid 65534 (run as root)
    std::mt19937_64 rng_;
    StoreBroker broker_;
    AdminClient admin_;
    std::vector<std::unique_ptr<Tenant>> survivors_;
    std::vector<std::string> names_;  // each survivor's, its stderr file's too
    std::set<uint64_t> survivor_sessions_;
    Figures figures_;
};

TEST(ChaosSoak, NothingLostThroughKillsRestartsCorruptFramesAndGarbage) {
    // Each "soak:" line as it happens: what ctest shows of a run it had to kill.
    setvbuf(stdout, nullptr, _IOLBF, 0);
    Soak soak;
    soak.run();
}

}  // namespace
}  // namespace ibvx::test
