// Fuzz target: the restore of a broker's restart state (daemon/restart, docs/restart.md), from
// the state file's records and CRCs through the log replay and the session header to the
// objects' import into softnda. The state comes back from memory a dead process wrote (the fd
// store, or an exec), so a restore must end every session it cannot rebuild cleanly, and keep
// only sessions that are whole.
//
// Setup (once per process): a real Broker over softnda, with its real RestartState as the commit
// sink, serves one session of this process (an attached fd channel; a context, a PD, two CQs,
// an SRQ and two RC QPs, one on the SRQ, brought to RTS), committing along the way so the log
// holds an image, appended records and arena chunk deltas. After a last commit, the
// handover gives every fd a successor needs, named: the harness keeps dups of them, and the
// session's state file's records are the template. The old broker then ends, as a restarted
// process's predecessor does.
//
// Each input is a list of edits, `u8 op, u8 index, u16 arg (LE), u8 length, bytes[length]`,
// applied to a copy of the template's records and fds, then a new Broker and RestartState
// restore from them, exactly as a new process does at start-up:
//   op % 8 == 0  XOR bytes into record index's payload at offset arg
//   op % 8 == 1  record index's type becomes arg (its low 7 bits: a type StateFile writes)
//   op % 8 == 2  record index is dropped
//   op % 8 == 3  record index is repeated
//   op % 8 == 4  a record of type arg (low 7 bits) with payload bytes is inserted before record index
//   op % 8 == 5  byte arg of the written state file is XORed with bytes[0] (CRC and framing)
//   op % 8 == 6  the fd named index-th (of the handed-over names) is left out
//   op % 8 == 7  the fd named index-th is replaced by an empty memfd
//
// Invariants: no crash; the one session is kept or dropped, never both or neither; once every
// restored session ended, the new broker holds no session and no object, the mapping manager
// no extra arena bytes, and the process no extra fd.

#include <fcntl.h>
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "daemon/core/broker.h"
#include "daemon/core/device.h"
#include "daemon/core/identity.h"
#include "daemon/core/mapping.h"
#include "daemon/restart/restart_state.h"
#include "daemon/restart/state_file.h"
#include "daemon/restart/state_records.h"
#include "softnda_ops.h"
#include "tests/fuzz/broker_baseline.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

using namespace ibvx::daemon;  // NOLINT: the harness touches most of the daemon's names
using ibvx::UniqueFd;

constexpr size_t kMaxEdits = 32;
constexpr size_t kMaxRecords = 256;

Broker::Options brokerOptions() {
    Broker::Options opt;
    opt.xfer_wait = std::chrono::milliseconds(1);
    return opt;
}

UniqueFd dupOf(int fd) {
    UniqueFd d(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
    FUZZ_CHECK(d.valid(), "dup: %s", std::strerror(errno));
    return d;
}

template <typename T>
T must(ibvx::StatusOr<T> r, const char *what) {
    FUZZ_CHECK(r.isOk(), "%s: %s", what, r.status().toString().c_str());
    return std::move(r).value();
}

void must(const ibvx::Status &s, const char *what) {
    FUZZ_CHECK(s.isOk(), "%s: %s", what, s.toString().c_str());
}

// What the old broker handed over, kept by the harness for every input.
class Template {
  public:
    Template() {
        spdlog::set_level(spdlog::level::off);     // every dropped session logs; a fuzzer makes many
        google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is an expected input
        verbs_register_driver_extend(&softnda_driver_ops);
        verbs_register_vdev_extend(&softnda_vdev_ops);
        devices_.scan();
        Broker old(brokerOptions(), &devices_);
        old.setRegionSender([](Session &, std::vector<RegionToSend> &) { return ibvx::Status::ok(); });
        RestartState state(old, FdStoreHooks{});
        old.setCommitSink([&state](Session &s) { return state.commit(s); });
        old.setEndSink([&state](Session &s) { state.sessionEnded(s); });
        must(state.start(), "restart state start");

        int sv[2];
        FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
        UniqueFd ours(sv[0]), theirs(sv[1]);
        PeerIdentity peer = must(peerIdentity(ours.get()), "peer identity");
        auto s = must(old.hello(peer, brokerOptions().version, "fuzz"), "hello");
        UniqueFd channel = std::move(theirs);
        std::shared_ptr<Session> attached;
        FUZZ_CHECK(old.attach(s->token(), peer.creds, channel, &attached) == 0, "attach");
        makeObjects(old, *s);
        must(old.commit(*s, StoredReply{}), "commit");

        auto named = must(state.handover(), "handover");
        for (auto &[name, fd] : named) {
            fds_.emplace_back(name, dupOf(fd));
            if (state::isStateName(name)) {
                auto file = must(StateFile::adopt(dupOf(fd)), "adopt the session's state");
                records_ = must(file.records(), "the session's records");
                state_name_ = name;
            }
        }
        FUZZ_CHECK(!state_name_.empty(), "the handover named no session state");
        FUZZ_CHECK(std::any_of(records_.begin(), records_.end(),
                               [](const StateFile::Record &r) { return r.first == state::kChunkBlocks; }),
                   "the template's log holds no chunk delta");
        old.setCommitSink({});
        old.endAllSessions();
    }

    DeviceRegistry &devices() { return devices_; }
    const std::vector<StateFile::Record> &records() const { return records_; }
    const std::vector<std::pair<std::string, UniqueFd>> &fds() const { return fds_; }
    const std::string &stateName() const { return state_name_; }

  private:
    static void makeObjects(Broker &b, Session &s) {
        const uint64_t ctx = must(b.openContext(s, "softnda0"), "open context").context;
        must(b.commit(s, StoredReply{}), "commit");  // the image; what follows is appended
        const uint64_t pd = must(b.allocPd(s, ctx), "alloc pd");
        CreateCqArgs ca;
        ca.context = ctx;
        ca.cqe = 16;
        const uint64_t cq0 = must(b.createCq(s, ca), "create cq").cq;
        must(b.commit(s, StoredReply{}), "commit");  // a chunk record, the second CQ's a delta
        const uint64_t cq1 = must(b.createCq(s, ca), "create cq").cq;
        must(b.commit(s, StoredReply{}), "commit");
        CreateSrqArgs sa;
        sa.context = ctx;
        sa.pd = pd;
        sa.max_wr = 8;
        sa.max_sge = 1;
        const uint64_t srq = must(b.createSrq(s, sa), "create srq").srq;
        CreateQpArgs qa;
        qa.context = ctx;
        qa.pd = pd;
        qa.send_cq = qa.recv_cq = cq0;
        qa.cap = ibv_qp_cap{8, 8, 1, 1, 0};
        const QpResult a = must(b.createQp(s, qa), "create qp");
        must(b.commit(s, StoredReply{}), "commit");
        qa.send_cq = qa.recv_cq = cq1;
        qa.srq = srq;
        qa.cap.max_recv_wr = 0;
        const QpResult d = must(b.createQp(s, qa), "create qp on the srq");
        for (auto [qp, dest] : {std::pair{a.qp, d.qp_num}, std::pair{d.qp, a.qp_num}}) {
            ibv_qp_attr at{};
            at.qp_state = IBV_QPS_INIT;
            at.port_num = 1;
            at.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
            must(b.modifyQp(s, qp, at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS),
                 "to INIT");
            at = {};
            at.qp_state = IBV_QPS_RTR;
            at.path_mtu = IBV_MTU_1024;
            at.dest_qp_num = dest;
            at.max_dest_rd_atomic = 1;
            at.min_rnr_timer = 1;
            at.ah_attr.port_num = 1;
            must(b.modifyQp(s, qp, at,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
                 "to RTR");
            at = {};
            at.qp_state = IBV_QPS_RTS;
            at.timeout = 14;
            at.retry_cnt = 7;
            at.rnr_retry = 7;
            at.max_rd_atomic = 1;
            must(b.modifyQp(s, qp, at,
                            IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC),
                 "to RTS");
        }
    }

    DeviceRegistry devices_;
    std::vector<StateFile::Record> records_;
    std::vector<std::pair<std::string, UniqueFd>> fds_;
    std::string state_name_;
};

struct Edit {
    uint8_t op = 0, index = 0;
    uint16_t arg = 0;
    std::string bytes;
};

std::vector<Edit> parseEdits(const uint8_t *data, size_t size) {
    std::vector<Edit> edits;
    size_t at = 0;
    while (at + 5 <= size && edits.size() < kMaxEdits) {
        Edit e;
        e.op = data[at] % 8;
        e.index = data[at + 1];
        e.arg = static_cast<uint16_t>(data[at + 2] | data[at + 3] << 8);
        const size_t len = std::min<size_t>(data[at + 4], size - at - 5);
        e.bytes.assign(reinterpret_cast<const char *>(data + at + 5), len);
        at += 5 + len;
        edits.push_back(std::move(e));
    }
    return edits;
}

// A record type StateFile writes: below 0x80, whose bit marks an encoded payload (state_file.h;
// edit 5 reaches that bit in the written file).
uint8_t recordType(uint16_t arg) {
    // 0 is no type but StateFile's "copy these stored bytes" marker: 0x7f is the unknown type.
    const auto type = static_cast<uint8_t>(arg & 0x7f);
    return type == StateFile::kStoredRecord ? uint8_t{0x7f} : type;
}

// The template's records with the record edits applied.
std::vector<StateFile::Record> editedRecords(const Template &t, const std::vector<Edit> &edits) {
    std::vector<StateFile::Record> records = t.records();
    for (const Edit &e : edits) {
        if (records.empty() && e.op != 4) {
            continue;
        }
        const size_t i = records.empty() ? 0 : e.index % records.size();
        switch (e.op) {
            case 0:
                for (size_t k = 0; k < e.bytes.size(); ++k) {
                    std::string &p = records[i].second;
                    if (!p.empty()) {
                        p[(e.arg + k) % p.size()] ^= e.bytes[k];
                    }
                }
                break;
            case 1:
                records[i].first = recordType(e.arg);
                break;
            case 2:
                records.erase(records.begin() + static_cast<ptrdiff_t>(i));
                break;
            case 3:
                if (records.size() < kMaxRecords) {
                    records.insert(records.begin() + static_cast<ptrdiff_t>(i), records[i]);
                }
                break;
            case 4:
                if (records.size() < kMaxRecords) {
                    records.insert(records.begin() + static_cast<ptrdiff_t>(i),
                                   StateFile::Record{recordType(e.arg), e.bytes});
                }
                break;
            default:
                break;
        }
    }
    return records;
}

// The fds a new process would receive: the template's (dups), with the fd edits applied, the
// session's state written anew from records (and the file edits applied to it).
std::vector<std::pair<std::string, UniqueFd>> editedFds(const Template &t, const std::vector<Edit> &edits,
                                                        const std::vector<StateFile::Record> &records) {
    std::vector<std::pair<std::string, UniqueFd>> fds;
    for (const auto &[name, fd] : t.fds()) {
        fds.emplace_back(name, name == t.stateName() ? UniqueFd() : dupOf(fd.get()));
    }
    StateFile file = must(StateFile::create("fuzz-state"), "state file");
    if (!records.empty()) {
        must(file.append(records), "append");
    }
    for (const Edit &e : edits) {
        const size_t i = e.index % fds.size();
        if (e.op == 5 && !e.bytes.empty()) {
            uint8_t b = 0;
            if (::pread(file.fd(), &b, 1, e.arg) == 1) {
                b ^= static_cast<uint8_t>(e.bytes[0]);
                FUZZ_CHECK(::pwrite(file.fd(), &b, 1, e.arg) == 1, "pwrite");
            }
        } else if (e.op == 6) {
            fds[i].second.reset();
        } else if (e.op == 7) {
            fds[i].second = UniqueFd(::memfd_create("fuzz-empty", MFD_CLOEXEC));
        }
    }
    for (auto &[name, fd] : fds) {
        if (name == t.stateName() && !fd.valid()) {
            fd = dupOf(file.fd());
        }
    }
    std::erase_if(fds, [](const auto &named) { return !named.second.valid(); });
    return fds;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Template &t = ibvx::fuzz::processFixture<Template>();
    const std::vector<Edit> edits = parseEdits(data, size);

    const ibvx::fuzz::BrokerBaseline baseline;
    {
        auto fds = editedFds(t, edits, editedRecords(t, edits));
        const bool state_sent =
            std::any_of(fds.begin(), fds.end(), [&](const auto &n) { return n.first == t.stateName(); });
        Broker broker(brokerOptions(), &t.devices());
        broker.setRegionSender([](Session &, std::vector<RegionToSend> &) { return ibvx::Status::ok(); });
        RestartState state(broker, FdStoreHooks{});
        broker.setCommitSink([&state](Session &s) { return state.commit(s); });
        broker.setEndSink([&state](Session &s) { state.sessionEnded(s); });
        std::vector<std::shared_ptr<Session>> restored;
        RestoreReport report = state.restore(fds, &restored);
        FUZZ_CHECK(fds.empty(), "restore left %zu fd(s) named ibvx.* to the caller", fds.size());
        if (state_sent) {
            FUZZ_CHECK(report.sessions_kept + report.sessions_dropped == 1,
                       "kept %u, dropped %u of one session", report.sessions_kept, report.sessions_dropped);
        }
        FUZZ_CHECK(restored.size() == report.sessions_kept, "%zu restored, %u reported kept", restored.size(),
                   report.sessions_kept);
        for (auto &s : restored) {
            broker.endSession(s);
        }
        restored.clear();
        FUZZ_CHECK(broker.sessionCount() == 0, "%zu sessions left", broker.sessionCount());
        FUZZ_CHECK(broker.objectCount() == 0, "%zu objects left", broker.objectCount());
        broker.setCommitSink({});
    }
    baseline.checkRestored();
    return 0;
}
