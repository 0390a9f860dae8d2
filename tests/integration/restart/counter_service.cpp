// A tiny service for fdstore_harness_test, a client of systemd's protocol through libsystemd
// only: it keeps a counter in a memfd it stores as FDNAME=counter. On every start it looks for
// that fd among LISTEN_FDS (creating and storing it the first time), increments it and reports
// "STATUS=count=N names=<LISTEN_FDNAMES in order>" then READY=1, and serves until SIGTERM (exit 0).
// Arguments: [--extra N] also stores N more memfds as FDNAME=extra on the first start.
#include <signal.h>
#include <sys/mman.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char **argv) {
    // Blocked from the start: a SIGTERM right after READY=1 must still be a clean stop.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    int extra = argc == 3 && std::strcmp(argv[1], "--extra") == 0 ? std::atoi(argv[2]) : 0;
    char **names = nullptr;
    int n = sd_listen_fds_with_names(1, &names);
    int counter = -1;
    std::string listed;
    for (int i = 0; i < n; ++i) {
        listed += (i == 0 ? "" : ",") + std::string(names[i]);
        if (std::strcmp(names[i], "counter") == 0) {
            counter = SD_LISTEN_FDS_START + i;
        }
        std::free(names[i]);
    }
    std::free(names);
    if (counter < 0) {
        counter = memfd_create("counter", MFD_CLOEXEC);
        uint64_t zero = 0;
        if (counter < 0 || pwrite(counter, &zero, sizeof(zero), 0) != sizeof(zero) ||
            sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=counter", &counter, 1) <= 0) {
            return 3;
        }
        for (int i = 0; i < extra; ++i) {
            int fd = memfd_create("extra", MFD_CLOEXEC);
            if (fd < 0 || sd_pid_notify_with_fds(0, 0, "FDSTORE=1\nFDNAME=extra", &fd, 1) <= 0) {
                return 3;
            }
            close(fd);
        }
    }
    uint64_t count = 0;
    if (pread(counter, &count, sizeof(count), 0) != sizeof(count)) {
        return 4;
    }
    ++count;
    if (pwrite(counter, &count, sizeof(count), 0) != sizeof(count)) {
        return 4;
    }
    sd_notifyf(0, "STATUS=count=%llu names=%s", static_cast<unsigned long long>(count),
               listed.empty() ? "-" : listed.c_str());
    sd_notify(0, "READY=1");
    int sig = 0;
    sigwait(&set, &sig);
    sd_notify(0, "STOPPING=1");
    return 0;
}
