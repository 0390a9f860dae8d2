// A broker with its restart state as the commit sink, as the daemon wires them, and an fd store
// that keeps what it is given as systemd's does (a crash's successor gets exactly that): the
// old and the new process of a restart, in one test process over the real softnda driver.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/core/broker.h"
#include "daemon/restart/restart_state.h"
#include "daemon/restart/state_file.h"

namespace ibvx::daemon {

using NamedFds = std::vector<std::pair<std::string, UniqueFd>>;

inline Broker::Options rigOptions() {
    Broker::Options opt;
    opt.xfer_wait = std::chrono::milliseconds(1);
    return opt;
}

struct Rig {
    explicit Rig(DeviceRegistry *devices) : broker(rigOptions(), devices), state(broker, hooks()) {
        broker.setRegionSender([](Session &, std::vector<RegionToSend> &) { return Status::ok(); });
        broker.setCommitSink([this](Session &s) { return state.commit(s); });
        broker.setEndSink([this](Session &s) { state.sessionEnded(s); });
    }
    ~Rig() {
        broker.setCommitSink({});
        broker.endAllSessions();
    }
    FdStoreHooks hooks() {
        FdStoreHooks h;
        h.add = [this](const std::vector<std::pair<std::string, int>> &fds) {
            for (const auto &[name, fd] : fds) {
                store[name].reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
            }
            return Status::ok();
        };
        h.remove = [this](const std::string &name) {
            store.erase(name);
            return Status::ok();
        };
        return h;
    }
    // What a crash's successor gets: dups of every fd the store holds.
    NamedFds crashFds() {
        NamedFds fds;
        for (auto &[name, fd] : store) {
            fds.emplace_back(name, UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0)));
        }
        return fds;
    }
    std::map<std::string, UniqueFd> store;
    Broker broker;
    RestartState state;
};

inline std::vector<StateFile::Record> recordsOf(int fd) {
    auto file = StateFile::adopt(UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)));
    EXPECT_TRUE(file.isOk());
    auto records = file.isOk() ? file->records() : StatusOr<std::vector<StateFile::Record>>(file.status());
    EXPECT_TRUE(records.isOk());
    return records.isOk() ? *records : std::vector<StateFile::Record>{};
}

}  // namespace ibvx::daemon
