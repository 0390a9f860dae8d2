// A Broker over the real softnda driver for the broker core's tests: one per test, with the ids of
// the regions it sends and the kinds it destroys recorded, sessions of this process, and the
// tenant's quota usage.
#pragma once

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
