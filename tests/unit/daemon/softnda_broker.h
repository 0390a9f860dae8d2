// A Broker over the real softnda driver for the broker core's tests: one per test, with the ids of
// the regions it sends and the kinds it destroys recorded, sessions of this process, and the
// tenant's quota usage.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "daemon/core/broker.h"
#include "tests/unit/daemon/softnda_devices.h"

namespace ibvx::daemon {

// The kinds of the objects the broker destroys, in order.
class DestroyLog : public BrokerEvents {
  public:
    void objectCreated(const Session &, ObjectKind, uint64_t) override {}
    void objectDestroyed(const Session &, ObjectKind kind, uint64_t) override {
        log.push_back(kindName(kind));
    }
    void quotaDenied(const PeerIdentity &, uint64_t, const std::string &) override {}
    std::vector<std::string> log;
};

// What a commit exports of an object and a restore gives Broker::adopt(): the object as the
// driver exported it, with its handle, the handles it uses, duplicates of its driver fds and of a
// shared XRC domain's file. *export_status receives the export's status when given; otherwise an
// export that fails is a test failure.
inline ObjectImport exportedForRestore(Broker &broker, Session &s, uint64_t handle,
                                       Status *export_status = nullptr) {
    auto held = s.hold();
    ObjectImport in;
    Status st = broker.exportObject(s, handle);
    if (export_status != nullptr) {
        *export_status = st;
    } else {
        EXPECT_TRUE(st.isOk()) << st.toString();
    }
    const Object *o = s.object(handle);
    if (o == nullptr) {
        ADD_FAILURE() << "no object " << handle;
        return in;
    }
    in.handle = handle;
    in.kind = o->kind;
    for (const Object *u : o->uses) {
        in.uses.push_back(u->handle);
    }
    in.device = o->device()->info.name;
    in.driver_state = o->driver_state;
    for (const UniqueFd &fd : o->driver_fds) {
        in.driver_fds.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    }
    if (o->kind == ObjectKind::kXrcd) {
        if (const UniqueFd &file = static_cast<const XrcdObject *>(o)->file; file) {
            in.xrcd_file.reset(::fcntl(file.get(), F_DUPFD_CLOEXEC, 0));
        }
    }
    return in;
}

class SoftndaBrokerTest : public SoftndaDevicesTest {
  protected:
    void SetUp() override {
        broker_ = std::make_unique<Broker>(Broker::Options{}, devices_);
        broker_->setRegionSender([this](Session &, std::vector<RegionToSend> &regions) {
            for (const RegionToSend &r : regions) {
                sent_.push_back(r.id);
            }
            return Status::ok();
        });
        broker_->setEvents(&events_);
        session_ = newSession();
    }
    void TearDown() override { broker_.reset(); }

    // A session of this process (EXPECTs it opened).
    std::shared_ptr<Session> newSession() {
        PeerIdentity peer;
        peer.creds = {getpid(), getuid(), getgid()};
        auto s = broker_->hello(peer, {4, 2, 0}, "unit");
        EXPECT_TRUE(s.isOk()) << s.status().toString();
        return s.isOk() ? *s : nullptr;
    }

    // What this uid holds of q.
    uint64_t held(Quota q) {
        return broker_->quotas().usage(QuotaScope::kUid, getuid())[static_cast<size_t>(q)];
    }

    std::unique_ptr<Broker> broker_;
    DestroyLog events_;
    std::vector<RegionId> sent_;  // every region the broker sent, in order
    std::shared_ptr<Session> session_;
};

}  // namespace ibvx::daemon
