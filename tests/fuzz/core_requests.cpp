// Fuzz target: the broker's request handlers, proto -> core, as a hostile tenant reaches them.
// The real BrokerService (daemon/edge) over the real core (daemon/core) and softnda, in this
// process: one gRPC connection over a socketpair, handed to the server exactly as the broker's
// accept loop hands over a tenant's connection, so every request goes through gRPC's own
// deserialisation, the edge's checks and conversions, the idempotency keys and stored replies,
// and the core.
//
// Input: a list of records `u8 op, u16 length (LE), bytes[length]`, op taken % 64.
//   op < 57       the Broker method with that index in broker.proto (as many as it has, up to
//                 57: the harness checks); the bytes are its request, sent as
//                 they are when they do not parse (gRPC must reject them), otherwise re-serialised after
//                 handle substitution: a fixed64 handle field holding 1..255 becomes the handle created (n-1)
//                 % count-th in this input, so requests can name real objects, including other sessions'
//                 ones; 0 and large values stay (absent or forged). Every call carries a new idempotency key,
//                 as the client sends one.
//   op == 57      the next call's "ibvx-retire-keys" value: the previous call's key when the bytes
//                 are empty, else the bytes mapped to hex digits, commas and 'x' (at most 1,200).
//   op == 58      the bytes are the next call's "ibvx-idempotency-key" value, sent verbatim.
//   op == 59      the previous call again, with its key and its request bytes: a retry.
//   op == 60      the next call reuses the previous call's key (another method, or other bytes).
//   op == 61      an fd transfer for RegMr (or ReregMr): u8 xfer id, u32 size (LE, capped at 1 MiB); a memfd
//                 of that size is queued on the current session as the fd channel would.
//   op == 62      the current session's process "goes away": the broker ends the session.
//   op == 63      switch to the session opened (byte 0)-th in this input.
// Each input starts with a Hello; a successful Hello record opens and switches to a new session.
//
// Invariants: no crash, no hang (every call answers within its deadline); no status outside what
// the API documents (UNKNOWN, CANCELLED, ABORTED, DATA_LOSS and DEADLINE_EXCEEDED never occur);
// a request naming a handle of another session never succeeds; a mutating call with a key that
// is not 16 lower-case hex digits of a non-zero value never runs (INVALID_ARGUMENT, nothing
// created); a retry of a mutating call answers exactly what the call answered (code, message,
// bytes) and changes nothing in the broker, unless a later call retired its key (then it runs
// anew); a malformed "ibvx-retire-keys" runs nothing; a key reused by another mutating method is refused
// with INVALID_ARGUMENT; and once every session of the input has ended, the broker holds no
// session, no object, no arena memory and no extra fd.

#include <fcntl.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_posix.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/fd_channel.h"
#include "daemon/core/broker.h"
#include "daemon/core/device.h"
#include "daemon/core/identity.h"
#include "daemon/core/mapping.h"
#include "daemon/edge/connections.h"
#include "daemon/edge/rpc_stats.h"
#include "daemon/edge/services.h"
#include "ibv_extend/v1/broker.pb.h"
#include "softnda_ops.h"
#include "tests/fuzz/broker_baseline.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

namespace gpb = google::protobuf;
using namespace ibvx::daemon;  // NOLINT: the harness touches most of the daemon's names

// Ops below the Broker service's method count call that method (by position); the last six of
// the 64 op values are the harness's own. New methods take the free values in between.
constexpr int kOpCount = 64;
constexpr int kOpRetire = 57;
constexpr int kOpRawKey = 58;
constexpr int kOpRetry = 59;
constexpr int kOpReuseKey = 60;
constexpr int kOpFdTransfer = 61;
constexpr int kOpEndSession = 62;
constexpr int kOpSwitchSession = 63;
constexpr size_t kMaxRecords = 48;
constexpr uint32_t kMaxXferBytes = 1u << 20;
// Fixed64 request fields that carry something other than a handle.
const std::set<std::string> kNotHandles = {"xfer_id", "iova", "tenant_address"};
// Response fields that name a new object.
const std::set<std::string> kCreatedHandles = {"context", "pd", "mr", "cq", "qp", "srq", "ah"};

// Everything a broker has, built once per process: gRPC servers are far too slow to start per
// input, and a real broker serves many sessions in one process anyway.
class Harness : public SessionListener {
  public:
    Harness() {
        // The broker logs every failed call; a fuzzer makes little else.
        spdlog::set_level(spdlog::level::off);
        gpb::SetLogHandler(nullptr);  // invalid UTF-8 in a string field is an expected input
        verbs_register_driver_extend(&softnda_driver_ops);
        verbs_register_vdev_extend(&softnda_vdev_ops);
        devices_.scan();
        Broker::Options opt;
        opt.xfer_wait = std::chrono::milliseconds(1);  // RegMr without a queued fd fails at once
        opt.max_objects_per_session = 64;
        broker_ = std::make_unique<Broker>(opt, &devices_);
        // Region fds are dups the sender owns: dropping them is what a dead channel does.
        broker_->setRegionSender([](Session &, std::vector<RegionToSend> &) { return ibvx::Status::ok(); });
        service_ = std::make_unique<BrokerService>(*broker_, connections_, stats_, this);
        grpc::ServerBuilder builder;
        builder.RegisterService(service_.get());
        server_ = builder.BuildAndStart();
        FUZZ_CHECK(server_ != nullptr, "cannot start the gRPC server");

        int sv[2];
        FUZZ_CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0,
                   "socketpair: %s", std::strerror(errno));
        auto peer = peerIdentity(sv[0]);
        FUZZ_CHECK(peer.isOk(), "peerIdentity: %s", peer.status().toString().c_str());
        connections_.set(sv[0], *peer);
        grpc::AddInsecureChannelFromFd(server_.get(), sv[0]);
        channel_ = grpc::CreateInsecureChannelFromFd("core_requests", sv[1]);
        stub_ = std::make_unique<grpc::GenericStub>(channel_);

        service_desc_ = gpb::DescriptorPool::generated_pool()->FindServiceByName("ibv_extend.v1.Broker");
        FUZZ_CHECK(service_desc_ != nullptr && service_desc_->method_count() <= kOpRetire &&
                       service_desc_->method_count() == static_cast<int>(Method::kCount),
                   "broker.proto has %d methods; the input format assumes at most %d, the edge knows %d",
                   service_desc_ ? service_desc_->method_count() : -1, kOpRawKey,
                   static_cast<int>(Method::kCount));
    }

    // Stops gRPC before static destructors run: its threads must not outlive what they use.
    ~Harness() {
        stub_.reset();
        channel_.reset();
        server_->Shutdown(std::chrono::system_clock::now());
        server_->Wait();
        broker_->endAllSessions();
    }

    Broker &broker() { return *broker_; }
    const gpb::ServiceDescriptor &service() const { return *service_desc_; }

    std::vector<std::shared_ptr<Session>> takeOpened() {
        std::lock_guard lock(mu_);
        return std::exchange(opened_, {});
    }

    // key: the "ibvx-idempotency-key" value, retire the "ibvx-retire-keys" one; none when empty.
    grpc::Status call(const gpb::MethodDescriptor &m, const std::string &token_hex, const std::string &key,
                      const std::string &request, std::string *response, const std::string &retire = {}) {
        grpc::ClientContext ctx;
        // Generous: the point is "answers at all", and sanitizers are slow.
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
        if (!token_hex.empty()) {
            ctx.AddMetadata(kSessionMetadataKey, token_hex);
        }
        if (!key.empty()) {
            ctx.AddMetadata(kIdempotencyMetadataKey, key);
        }
        if (!retire.empty()) {
            ctx.AddMetadata(kRetireMetadataKey, retire);
        }
        grpc::Slice slice(request);
        grpc::ByteBuffer req(&slice, 1);
        grpc::ByteBuffer resp;
        std::promise<grpc::Status> done;
        const std::string path = "/" + service_desc_->full_name() + "/" + m.name();
        stub_->UnaryCall(&ctx, path, grpc::StubOptions(), &req, &resp,
                         [&done](grpc::Status s) { done.set_value(std::move(s)); });
        grpc::Status st = done.get_future().get();
        response->clear();
        if (st.ok()) {
            std::vector<grpc::Slice> slices;
            if (resp.Dump(&slices).ok()) {
                for (const grpc::Slice &s : slices) {
                    response->append(reinterpret_cast<const char *>(s.begin()), s.size());
                }
            }
        }
        return st;
    }

    void sessionOpened(const std::shared_ptr<Session> &s) override {
        std::lock_guard lock(mu_);
        opened_.push_back(s);
    }

  private:
    DeviceRegistry devices_;
    std::unique_ptr<Broker> broker_;
    ConnectionRegistry connections_;
    RpcStats stats_;
    std::unique_ptr<BrokerService> service_;
    std::unique_ptr<grpc::Server> server_;
    std::shared_ptr<grpc::Channel> channel_;
    std::unique_ptr<grpc::GenericStub> stub_;
    const gpb::ServiceDescriptor *service_desc_ = nullptr;
    std::mutex mu_;
    std::vector<std::shared_ptr<Session>> opened_;
};

struct Handle {
    uint64_t value;
    size_t session;  // index into State::sessions
};

// One call as it went out and what it answered, so a retry can be checked against it.
struct SentCall {
    int method = -1;                   // index in broker.proto; -1: none yet
    std::shared_ptr<Session> session;  // the current session when it was sent; may be null
    std::string token;
    std::string key;
    std::string request;
    bool parsed = false;  // false: gRPC refuses the bytes before any handler sees them
    std::string retire;   // its "ibvx-retire-keys" value, none when empty
    grpc::Status status;
    std::string response;
    bool retired = false;  // a later call of its session retired its key: a retry runs anew
};

// What one input built so far.
struct State {
    std::vector<std::shared_ptr<Session>> sessions;
    size_t current = 0;
    std::vector<Handle> handles;
    uint64_t next_key = 1;
    std::optional<std::string> key_for_next;  // set by kOpRawKey / kOpReuseKey
    std::string retire_for_next;              // set by kOpRetire
    SentCall last;
};

std::string keyText(uint64_t key) {
    char text[17];
    std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(key));
    return text;
}

const gpb::Message &prototype(const gpb::Descriptor *d) {
    const gpb::Message *p = gpb::MessageFactory::generated_factory()->GetPrototype(d);
    FUZZ_CHECK(p != nullptr, "no generated type for %s", d->full_name().c_str());
    return *p;
}

// Rewrites small handle values into handles of this input; returns the sessions they belong to.
void substituteHandles(gpb::Message *msg, const State &st, std::set<size_t> *owners) {
    const gpb::Reflection *r = msg->GetReflection();
    std::vector<const gpb::FieldDescriptor *> fields;
    r->ListFields(*msg, &fields);
    for (const gpb::FieldDescriptor *f : fields) {
        if (f->type() == gpb::FieldDescriptor::TYPE_MESSAGE && !f->is_repeated()) {
            substituteHandles(r->MutableMessage(msg, f), st, owners);
            continue;
        }
        if (f->type() != gpb::FieldDescriptor::TYPE_FIXED64 || f->is_repeated() ||
            kNotHandles.count(f->name())) {
            continue;
        }
        uint64_t v = r->GetUInt64(*msg, f);
        if (v == 0 || v > 255 || st.handles.empty()) {
            continue;
        }
        const Handle &h = st.handles[(v - 1) % st.handles.size()];
        r->SetUInt64(msg, f, h.value);
        owners->insert(h.session);
    }
}

void collectHandles(const gpb::Message &msg, size_t session, State *st) {
    const gpb::Reflection *r = msg.GetReflection();
    std::vector<const gpb::FieldDescriptor *> fields;
    r->ListFields(msg, &fields);
    for (const gpb::FieldDescriptor *f : fields) {
        if (f->type() == gpb::FieldDescriptor::TYPE_FIXED64 && !f->is_repeated() &&
            kCreatedHandles.count(f->name())) {
            uint64_t v = r->GetUInt64(msg, f);
            FUZZ_CHECK(v != 0, "a successful call returned handle 0 in %s", f->full_name().c_str());
            st->handles.push_back({v, session});
        }
    }
}

bool documentedCode(grpc::StatusCode c) {
    switch (c) {
        case grpc::StatusCode::UNKNOWN:
        case grpc::StatusCode::CANCELLED:
        case grpc::StatusCode::ABORTED:
        case grpc::StatusCode::DATA_LOSS:
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            return false;
        default:
            return true;
    }
}

void openSession(Harness &h, State *st, const std::string &request) {
    const gpb::MethodDescriptor &hello = *h.service().FindMethodByName("Hello");
    std::string resp;
    grpc::Status s = h.call(hello, "", "", request, &resp);
    FUZZ_CHECK(documentedCode(s.error_code()), "Hello answered %d: %s", s.error_code(),
               s.error_message().c_str());
    for (auto &session : h.takeOpened()) {
        st->sessions.push_back(std::move(session));
    }
    if (s.ok()) {
        st->current = st->sessions.size() - 1;
    }
}

void fdTransfer(State *st, const uint8_t *p, size_t n) {
    if (st->sessions.empty() || n < 5) {
        return;
    }
    uint64_t xfer_id = p[0];
    uint32_t size;
    std::memcpy(&size, p + 1, sizeof(size));
    ibvx::UniqueFd fd(::memfd_create("ibvx-fuzz-mr", MFD_CLOEXEC));
    FUZZ_CHECK(fd.valid(), "memfd_create: %s", std::strerror(errno));
    FUZZ_CHECK(::ftruncate(fd.get(), size % (kMaxXferBytes + 1)) == 0, "ftruncate: %s", std::strerror(errno));
    // A refusal (duplicate id, too many pending) closes the fd; the broker would end the session.
    (void)st->sessions[st->current]->putXfer(xfer_id, std::move(fd));
}

// A key value gRPC lets through: metadata values are printable ASCII, and a client library
// refuses others before they leave, which is not what this target is about.
std::string printableKey(const uint8_t *p, size_t n) {
    std::string key;
    for (size_t i = 0; i < std::min<size_t>(n, 40); ++i) {
        key.push_back(static_cast<char>(0x21 + p[i] % 0x5e));
    }
    return key;
}

// The key the next call carries: the one an op asked for, else a new valid one.
std::string takeKey(State *st) {
    if (st->key_for_next) {
        return *std::exchange(st->key_for_next, std::nullopt);
    }
    return keyText(st->next_key++);
}

// Whether a call sent with this key was stored when it ran: mutating, the key valid, and its
// session live then and now (a session ended since has no stored replies to answer from), and
// not retired since.
bool storable(const SentCall &c) {
    return c.method >= 0 && c.parsed && isMutating(static_cast<Method>(c.method)) &&
           parseIdempotencyKey(c.key).isOk() && c.session != nullptr && !c.session->ended() && !c.retired;
}

// Whether list is a well-formed "ibvx-retire-keys" value that names key.
bool retires(const std::string &list, const std::string &key) {
    auto keys = parseRetireKeys(list);
    auto k = parseIdempotencyKey(key);
    return keys.isOk() && k.isOk() && std::find(keys->begin(), keys->end(), *k) != keys->end();
}

// An op's bytes as an "ibvx-retire-keys" value: mostly what a list is made of, so lists that
// parse (and name keys of this input) are found as well as ones that do not.
std::string retireText(const uint8_t *p, size_t n) {
    static constexpr char kAlphabet[] = "0123456789abcdef,x";
    std::string text;
    for (size_t i = 0; i < std::min<size_t>(n, 1200); ++i) {
        text.push_back(kAlphabet[p[i] % (sizeof(kAlphabet) - 1)]);
    }
    return text;
}

// The checks only the keys make: a malformed key runs nothing; a key reused by another method is
// refused and by the same method is answered from the stored reply of the call that first used it.
void checkKeyUse(Harness &h, const State &st, const SentCall &sent, size_t objects_before) {
    const gpb::MethodDescriptor &m = *h.service().method(sent.method);
    const grpc::Status &s = sent.status;
    const bool live = sent.session != nullptr && !sent.session->ended();
    if (!live || !sent.parsed || !isMutating(static_cast<Method>(sent.method)) || sent.key.empty()) {
        return;
    }
    if (!sent.retire.empty() && !parseRetireKeys(sent.retire).isOk()) {
        FUZZ_CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
                       h.broker().objectCount() == objects_before,
                   "%s with the malformed retire list '%.60s' answered %d (%s)", m.name().c_str(),
                   sent.retire.c_str(), s.error_code(), s.error_message().c_str());
        return;
    }
    if (!parseIdempotencyKey(sent.key).isOk()) {
        FUZZ_CHECK(
            s.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
                h.broker().objectCount() == objects_before,
            "%s with the malformed key '%s' answered %d (%s) and the broker went from %zu to %zu objects",
            m.name().c_str(), sent.key.c_str(), s.error_code(), s.error_message().c_str(), objects_before,
            h.broker().objectCount());
        return;
    }
    const SentCall &prev = st.last;
    if (prev.key != sent.key || prev.session != sent.session || !storable(prev) || !prev.status.ok()) {
        return;
    }
    if (prev.method != sent.method) {
        FUZZ_CHECK(s.error_code() == grpc::StatusCode::INVALID_ARGUMENT,
                   "%s reused the key of a %s call and answered %d: %s", m.name().c_str(),
                   h.service().method(prev.method)->name().c_str(), s.error_code(),
                   s.error_message().c_str());
    } else {
        FUZZ_CHECK(s.ok() && sent.response == prev.response,
                   "%s sent again with its key (other bytes) answered %d, not its stored reply",
                   m.name().c_str(), s.error_code());
    }
    FUZZ_CHECK(h.broker().objectCount() == objects_before,
               "%s with a used key changed the broker's objects from %zu to %zu", m.name().c_str(),
               objects_before, h.broker().objectCount());
}

void callMethod(Harness &h, State *st, int index, const uint8_t *p, size_t n) {
    const gpb::MethodDescriptor &m = *h.service().method(index);
    std::unique_ptr<gpb::Message> req(prototype(m.input_type()).New());
    std::string wire(reinterpret_cast<const char *>(p), n);
    std::set<size_t> owners;
    bool parsed = req->ParseFromString(wire);
    if (parsed) {
        substituteHandles(req.get(), *st, &owners);
        wire = req->SerializeAsString();
    }
    if (m.name() == "Hello") {
        st->key_for_next.reset();
        openSession(h, st, wire);
        return;
    }
    SentCall sent;
    sent.method = index;
    if (!st->sessions.empty()) {
        sent.session = st->sessions[st->current];
        sent.token = sent.session->tokenHex();
    }
    sent.key = takeKey(st);
    sent.retire = std::exchange(st->retire_for_next, {});
    sent.request = wire;
    sent.parsed = parsed;
    const size_t objects_before = h.broker().objectCount();
    sent.status = h.call(m, sent.token, sent.key, wire, &sent.response, sent.retire);
    const grpc::Status &s = sent.status;
    FUZZ_CHECK(documentedCode(s.error_code()), "%s answered %d: %s", m.name().c_str(), s.error_code(),
               s.error_message().c_str());
    // The broker retires before it looks at the call's own key: the previous call's reply is
    // gone when the list names it, whatever this call answered (a reuse of that key runs).
    if (parsed && isMutating(static_cast<Method>(index)) && sent.session == st->last.session &&
        retires(sent.retire, st->last.key)) {
        st->last.retired = true;
    }
    // A list naming the call's own key retires its reply again on each retry: it runs anew.
    sent.retired = retires(sent.retire, sent.key);
    checkKeyUse(h, *st, sent, objects_before);
    const bool replayed = storable(st->last) && st->last.key == sent.key && st->last.session == sent.session;
    st->last = sent;
    if (!s.ok() || replayed) {
        return;  // a replayed reply names objects already collected
    }
    for (size_t owner : owners) {
        FUZZ_CHECK(owner == st->current, "%s succeeded in session %zu with a handle of session %zu",
                   m.name().c_str(), st->current, owner);
    }
    std::unique_ptr<gpb::Message> out(prototype(m.output_type()).New());
    FUZZ_CHECK(out->ParseFromString(sent.response), "%s answered bytes that do not parse", m.name().c_str());
    collectHandles(*out, st->current, st);
}

// The previous call again, exactly as a client's retry sends it (its retire list too). A mutating call the
// broker ran is answered from its stored reply: the same code, message and bytes, and nothing changes.
void retryLast(Harness &h, State *st) {
    const SentCall &first = st->last;
    if (first.method < 0) {
        return;
    }
    const gpb::MethodDescriptor &m = *h.service().method(first.method);
    const size_t objects_before = h.broker().objectCount();
    std::string response;
    grpc::Status s = h.call(m, first.token, first.key, first.request, &response, first.retire);
    FUZZ_CHECK(documentedCode(s.error_code()), "retried %s answered %d: %s", m.name().c_str(), s.error_code(),
               s.error_message().c_str());
    if (!storable(first)) {
        return;
    }
    FUZZ_CHECK(s.error_code() == first.status.error_code() &&
                   s.error_message() == first.status.error_message() && response == first.response,
               "retried %s answered %d '%s' (%zu bytes), the call answered %d '%s' (%zu bytes)",
               m.name().c_str(), s.error_code(), s.error_message().c_str(), response.size(),
               first.status.error_code(), first.status.error_message().c_str(), first.response.size());
    FUZZ_CHECK(h.broker().objectCount() == objects_before,
               "retried %s changed the broker's objects from %zu to %zu", m.name().c_str(), objects_before,
               h.broker().objectCount());
}

// The harness's own session, through a Hello as a client sends it.
void openHarnessSession(Harness &h, State *st) {
    ibv_extend::v1::HelloRequest hello;
    hello.mutable_client_version()->set_major(4);
    hello.mutable_client_version()->set_minor(2);
    hello.set_client_name("fuzz");
    openSession(h, st, hello.SerializeAsString());
    FUZZ_CHECK(!st->sessions.empty(), "the harness's own Hello failed");
}

// gRPC opens some fds of its own lazily (pollers, wakeups) and closes some it opened while
// starting: counted before the first call has gone through, they make the first input's fd count
// differ with nothing leaked. One session opened and ended before that count settles them.
void settleOnce(Harness &h) {
    static bool settled = false;
    if (settled) {
        return;
    }
    settled = true;
    State st;
    openHarnessSession(h, &st);
    h.broker().endSession(st.sessions[0]);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Harness &h = ibvx::fuzz::processFixture<Harness>();
    settleOnce(h);
    const ibvx::fuzz::BrokerBaseline baseline;
    {
        State st;
        openHarnessSession(h, &st);

        size_t off = 0;
        for (size_t records = 0; off + 3 <= size && records < kMaxRecords; ++records) {
            const int op = data[off] % kOpCount;
            size_t len = data[off + 1] | static_cast<size_t>(data[off + 2]) << 8;
            off += 3;
            len = std::min(len, size - off);
            const uint8_t *p = data + off;
            off += len;
            if (op < h.service().method_count()) {
                callMethod(h, &st, op, p, len);
            } else if (op == kOpRetire) {
                st.retire_for_next = len == 0 ? st.last.key : retireText(p, len);
            } else if (op == kOpRawKey) {
                st.key_for_next = printableKey(p, len);
            } else if (op == kOpRetry) {
                retryLast(h, &st);
            } else if (op == kOpReuseKey) {
                st.key_for_next = st.last.key;
            } else if (op == kOpFdTransfer) {
                fdTransfer(&st, p, len);
            } else if (op == kOpEndSession) {
                h.broker().endSession(st.sessions[st.current]);
            } else if (op == kOpSwitchSession && len > 0) {
                st.current = p[0] % st.sessions.size();
            }
        }
        for (const auto &s : st.sessions) {
            h.broker().endSession(s);
        }
        FUZZ_CHECK(h.broker().sessionCount() == 0, "%zu sessions left after all ended",
                   h.broker().sessionCount());
        FUZZ_CHECK(h.broker().objectCount() == 0, "%zu objects left after all sessions ended",
                   h.broker().objectCount());
    }
    baseline.checkRestored();
    return 0;
}
