#include "tools/ibv-extendctl/ctl.h"

#include <grpcpp/grpcpp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/build_config.h"
#include "common/fd_channel.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"
#include "ibv_extend/v1/admin.grpc.pb.h"
#include "ibv_extend/v1/broker.grpc.pb.h"
#include "tools/ibv-extendctl/format.h"

namespace ibvx::ctl {
namespace {

namespace pb = ::ibv_extend::v1;

constexpr const char *kDefaultSocket = IBVX_DEFAULT_SOCKET;
// The protocol this CLI speaks: the project's version.
constexpr uint32_t kMajor = IBVX_PROJECT_VERSION_MAJOR, kMinor = IBVX_PROJECT_VERSION_MINOR,
                   kPatch = IBVX_PROJECT_VERSION_PATCH;

struct Options {
    std::string socket;
    bool json = false;
    int timeout_s = 10;
};

// Connects once with a raw socket first: gRPC would only say "unavailable", and an operator
// needs to know whether the broker is down or the socket is closed to them.
int probe(const std::string &path) {
    if (auto addr = unixAddress(path); !addr.isOk()) {
        std::fprintf(stderr, "ibv-extendctl: %s\n", addr.status().message().c_str());
        return kExitUsage;
    }
    auto fd = connectUnix(path);
    if (fd.isOk()) {
        return kExitOk;
    }
    int err = fd.status().errnoValue();
    if (err == EACCES || err == EPERM) {
        std::fprintf(stderr,
                     "ibv-extendctl: permission denied on the broker socket %s: it is open to root and the "
                     "socket group (SocketGroup= of ibv-extendd.socket, 'ibv-extend' by default)\n",
                     path.c_str());
        return kExitDenied;
    }
    std::fprintf(stderr,
                 "ibv-extendctl: the broker is not running: cannot connect to %s: %s\n"
                 "  check it with: systemctl status ibv-extendd\n"
                 "  (--socket or IBV_EXTEND_SOCKET select another socket)\n",
                 path.c_str(), std::strerror(err));
    return kExitUnreachable;
}

// Maps a failed call to a message and an exit code.
int failed(const char *what, const grpc::Status &st, const std::string &socket) {
    switch (st.error_code()) {
        case grpc::StatusCode::PERMISSION_DENIED:
            std::fprintf(stderr,
                         "ibv-extendctl: permission denied: %s\n"
                         "  operator commands need root or membership of the broker's admin group "
                         "([broker] admin_group, 'ibv-extend-admin' in the shipped configuration)\n",
                         st.error_message().c_str());
            return kExitDenied;
        case grpc::StatusCode::UNIMPLEMENTED:
            std::fprintf(
                stderr,
                "ibv-extendctl: version mismatch: the broker on %s does not implement %s (it is older "
                "than this ibv-extendctl, protocol %u.%u.%u)\n",
                socket.c_str(), what, kMajor, kMinor, kPatch);
            return kExitVersion;
        case grpc::StatusCode::UNAVAILABLE:
        case grpc::StatusCode::DEADLINE_EXCEEDED:
            std::fprintf(stderr,
                         "ibv-extendctl: the broker on %s did not answer %s: %s\n"
                         "  check it with: systemctl status ibv-extendd\n",
                         socket.c_str(), what, st.error_message().c_str());
            return kExitUnreachable;
        default:
            std::fprintf(stderr, "ibv-extendctl: %s failed: %s\n", what, st.error_message().c_str());
            return kExitFailed;
    }
}

class Client {
  public:
    explicit Client(const Options &o) : opt_(o) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(64 * 1024 * 1024);
        channel_ = grpc::CreateCustomChannel("unix:" + o.socket, grpc::InsecureChannelCredentials(), args);
        admin_ = pb::Admin::NewStub(channel_);
        broker_ = pb::Broker::NewStub(channel_);
    }
    void deadline(grpc::ClientContext &ctx) const {
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(opt_.timeout_s));
    }
    pb::Admin::Stub &admin() { return *admin_; }
    pb::Broker::Stub &broker() { return *broker_; }

  private:
    Options opt_;
    std::shared_ptr<grpc::Channel> channel_;
    std::unique_ptr<pb::Admin::Stub> admin_;
    std::unique_ptr<pb::Broker::Stub> broker_;
};

template <typename Req, typename Resp>
int call(Client &c, const Options &o, const char *name,
         grpc::Status (pb::Admin::Stub::*method)(grpc::ClientContext *, const Req &, Resp *), const Req &req,
         Resp *resp) {
    grpc::ClientContext ctx;
    c.deadline(ctx);
    grpc::Status st = (c.admin().*method)(&ctx, req, resp);
    return st.ok() ? kExitOk : failed(name, st, o.socket);
}

// Every page of a listing, appended into *all (MergeFrom appends repeated fields).
template <typename Req, typename Resp>
int callAllPages(Client &c, const Options &o, const char *name,
                 grpc::Status (pb::Admin::Stub::*method)(grpc::ClientContext *, const Req &, Resp *), Req req,
                 Resp *all) {
    for (;;) {
        Resp page;
        if (int rc = call(c, o, name, method, req, &page)) {
            return rc;
        }
        all->MergeFrom(page);
        if (page.next_page_token().empty()) {
            all->clear_next_page_token();
            return kExitOk;
        }
        req.set_page_token(page.next_page_token());
    }
}

std::string version(const pb::Version &v) {
    return std::to_string(v.major()) + "." + std::to_string(v.minor()) + "." + std::to_string(v.patch());
}

int cmdStatus(Client &c, const Options &o) {
    pb::GetStatusResponse r;
    if (int rc = call(c, o, "Admin.GetStatus", &pb::Admin::Stub::GetStatus, pb::GetStatusRequest{}, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    std::cout << "broker:     ibv-extendd " << version(r.broker_version()) << ", pid " << r.pid() << ", up "
              << humanDuration(r.uptime_ms()) << '\n'
              << "socket:     "
              << (r.socket_activated() ? "passed by systemd (ibv-extendd.socket)" : r.socket_path()) << '\n'
              << "config:     " << (r.config_path().empty() ? "(none: defaults)" : r.config_path()) << '\n'
              << "admin:      root" << (r.admin_group().empty() ? "" : " and group " + r.admin_group())
              << '\n'
              << "sessions:   " << r.sessions() << '\n'
              << "objects:    " << r.objects() << '\n'
              << "memory:     " << humanBytes(r.arena_bytes()) << " in " << r.arena_chunks()
              << " arena chunk(s), " << humanBytes(r.allocated_bytes()) << " allocated, "
              << r.doorbell_pages() << " doorbell page(s)\n"
              << "calls:      " << r.total_calls() << '\n'
              << "restarts: " << r.restarts();
    if (r.last_restart_unix_ms() != 0 && !r.last_restart_crash()) {
        std::cout << " (last " << isoUtc(r.last_restart_unix_ms()) << ", took "
                  << humanDuration(r.last_restart_took_ms()) << ")";
    } else if (r.last_restart_unix_ms() != 0) {
        // After a crash the broker knows only when the old process was last seen alive: an upper
        // bound, so rounded up (humanDuration's whole seconds would understate it).
        uint64_t ms = r.last_restart_took_ms();
        uint64_t tenths = (ms + 99) / 100;
        std::string bound = ms < 1000 ? std::to_string(ms) + "ms"
                                      : std::to_string(tenths / 10) + "." + std::to_string(tenths % 10) + "s";
        std::cout << " (last " << isoUtc(r.last_restart_unix_ms()) << ", after a crash: "
                  << (ms != 0 ? "took ≤" + bound + ", since the old process was last seen alive"
                              : std::string("took an unknown time"))
                  << ")";
    }
    std::cout << '\n' << "devices:    " << r.devices_size() << '\n';
    if (r.devices_size() > 0) {
        Table t({"DEVICE", "DRIVER", "KIND", "OPS", "CAPS", "MAX_QP", "MAX_CQ", "MAX_QP_WR", "MAX_CQE"});
        for (const auto &d : r.devices()) {
            t.add({d.name(), d.provider(), d.virtual_device() ? "virtual" : "rdma-core",
                   std::to_string(d.driver_version()), extCapNames(d.ext_cap()), std::to_string(d.max_qp()),
                   std::to_string(d.max_cq()), std::to_string(d.max_qp_wr()), std::to_string(d.max_cqe())});
        }
        std::cout << '\n' << t.render();
    }
    return kExitOk;
}

int cmdDrivers(Client &c, const Options &o) {
    pb::ListDriversResponse r;
    if (int rc =
            call(c, o, "Admin.ListDrivers", &pb::Admin::Stub::ListDrivers, pb::ListDriversRequest{}, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    Table t({"DRIVER", "KIND", "OPS", "RESTART", "DEVICES", "LIBRARY"});
    for (const auto &d : r.drivers()) {
        std::string devs;
        for (const auto &n : d.devices()) {
            devs += devs.empty() ? n : "," + n;
        }
        t.add({d.name(), d.virtual_provider() ? "vdev" : "rdma-core", std::to_string(d.ops_version()),
               d.restart_keeps() ? "restart: keeps" : "restart: drops", devs.empty() ? "-" : devs,
               d.library().empty() ? "(built in)" : d.library()});
    }
    std::cout << t.render();
    Table errors({"FAILED", "SOURCE", "ERROR"});
    for (const auto &a : r.load_attempts()) {
        if (!a.loaded()) {
            errors.add({a.name(), a.source(), a.error()});
        }
    }
    if (errors.rows() > 0) {
        std::cout << '\n' << errors.render();
    }
    return kExitOk;
}

int cmdSessions(Client &c, const Options &o, uint32_t page_size) {
    pb::ListSessionsRequest req;
    req.set_page_size(page_size);
    pb::ListSessionsResponse r;
    if (int rc = callAllPages(c, o, "Admin.ListSessions", &pb::Admin::Stub::ListSessions, req, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    Table t({"SESSION", "PID", "UID", "GID", "CLIENT", "CONTAINER", "NAMESPACE/POD", "AGE", "OBJECTS",
             "ARENA", "CALLS", "ERRORS"});
    for (const auto &s : r.sessions()) {
        t.add({std::to_string(s.id()), std::to_string(s.pid()), std::to_string(s.uid()),
               std::to_string(s.gid()), s.client_name().empty() ? "-" : s.client_name(),
               s.container_id().empty() ? "-" : s.container_id().substr(0, 12),
               s.pod_name().empty() ? "-" : s.pod_namespace() + "/" + s.pod_name(),
               humanDuration(s.connected_ms()), std::to_string(s.objects()), humanBytes(s.arena_bytes()),
               std::to_string(s.rpc_calls()), std::to_string(s.rpc_errors())});
    }
    std::cout << t.render();
    return kExitOk;
}

std::string objectDetails(const pb::ObjectInfo &o) {
    if (o.has_qp()) {
        const auto &q = o.qp();
        return "qpn=" + std::to_string(q.qp_num()) + " " + label(q.qp_type()) + " " + label(q.state()) +
               " sq=" + std::to_string(q.max_send_wr()) + "x" + std::to_string(q.max_send_sge()) +
               " rq=" + std::to_string(q.max_recv_wr()) + "x" + std::to_string(q.max_recv_sge()) +
               (q.has_srq() ? " srq" : "") +
               (q.target_handles() != 0 ? " handles=" + std::to_string(q.target_handles()) : "") +
               (q.opened() ? " opened" : "") + (q.released() ? " released" : "");
    }
    if (o.has_cq()) {
        // queue_bytes is 0 when the broker does not know the ring's size: say nothing then.
        return "cqe=" + std::to_string(o.cq().cqe()) +
               (o.cq().queue_bytes() != 0 ? " queue=" + humanBytes(o.cq().queue_bytes()) : "");
    }
    if (o.has_srq()) {
        return "wr=" + std::to_string(o.srq().max_wr()) + " entry=" + std::to_string(o.srq().entry_size()) +
               "B" + (o.srq().srq_num() != 0 ? " xrc srqn=" + std::to_string(o.srq().srq_num()) : "");
    }
    if (o.has_mr()) {
        char keys[64];
        std::snprintf(keys, sizeof(keys), " lkey=0x%x rkey=0x%x", o.mr().lkey(), o.mr().rkey());
        return "length=" + humanBytes(o.mr().length()) + keys;
    }
    return "-";
}

int cmdObjects(Client &c, const Options &o, const pb::ListObjectsRequest &req) {
    pb::ListObjectsResponse r;
    if (int rc = callAllPages(c, o, "Admin.ListObjects", &pb::Admin::Stub::ListObjects, req, &r)) {
        return rc;
    }
    if (o.json) {
        // "truncated" stays for scripts written before listings paged: every page is here.
        nlohmann::ordered_json j = nlohmann::ordered_json::parse(toJson(r));
        j["truncated"] = false;
        std::cout << j.dump(1) << '\n';
        return kExitOk;
    }
    Table t({"HANDLE", "KIND", "SESSION", "PID", "UID", "DEVICE", "USERS", "DETAILS"});
    for (const auto &x : r.objects()) {
        t.add({hex64(x.handle()), label(x.kind()), std::to_string(x.session()), std::to_string(x.pid()),
               std::to_string(x.uid()), x.device().empty() ? "-" : x.device(), std::to_string(x.users()),
               objectDetails(x)});
    }
    std::cout << t.render();
    return kExitOk;
}

int cmdStats(Client &c, const Options &o) {
    pb::GetStatsResponse r;
    if (int rc = call(c, o, "Admin.GetStats", &pb::Admin::Stub::GetStats, pb::GetStatsRequest{}, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    std::cout << "uptime " << humanDuration(r.uptime_ms()) << ", " << r.sessions() << " session(s), "
              << r.objects() << " object(s), " << r.total_calls() << " call(s), " << r.total_errors()
              << " error(s), " << r.sessions_opened() << " session(s) opened, " << r.sessions_evicted()
              << " evicted\n\n";
    Table t({"METHOD", "CALLS", "ERRORS", "P50_US", "P99_US", "ERROR_CODES"});
    for (const auto &m : r.rpcs()) {
        std::string codes;
        for (const auto &e : m.errors_by_code()) {
            codes += (codes.empty() ? "" : ",") + label(e.code()) + "=" + std::to_string(e.count());
        }
        t.add({m.method(), std::to_string(m.calls()), std::to_string(m.errors()),
               m.calls() ? std::to_string(latencyQuantileUs(m.latency(), 0.5)) : "-",
               m.calls() ? std::to_string(latencyQuantileUs(m.latency(), 0.99)) : "-",
               codes.empty() ? "-" : codes});
    }
    std::cout << t.render();
    for (const auto &e : r.engines()) {
        std::cout << "\nengine " << e.device() << " (" << e.provider() << ")\n";
        Table et({"COUNTER", "VALUE"});
        for (const auto &ctr : e.counters()) {
            et.add({ctr.name(), std::to_string(ctr.value())});
        }
        std::cout << et.render();
    }
    return kExitOk;
}

int cmdMetrics(Client &c, const Options &o, const std::string &format) {
    pb::GetStatsResponse r;
    if (int rc = call(c, o, "Admin.GetStats", &pb::Admin::Stub::GetStats, pb::GetStatsRequest{}, &r)) {
        return rc;
    }
    if (format == "json" || o.json) {
        std::cout << toJson(r) << '\n';
    } else {
        std::cout << prometheusText(r);
    }
    return kExitOk;
}

int cmdEvict(Client &c, const Options &o, uint64_t session) {
    pb::EvictSessionRequest req;
    req.set_session(session);
    pb::EvictSessionResponse r;
    if (int rc = call(c, o, "Admin.EvictSession", &pb::Admin::Stub::EvictSession, req, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
    } else {
        std::cout << "session " << session << " evicted, " << r.objects_destroyed()
                  << " object(s) destroyed\n";
    }
    return kExitOk;
}

int cmdReload(Client &c, const Options &o) {
    pb::ReloadDriversResponse r;
    if (int rc = call(c, o, "Admin.ReloadDrivers", &pb::Admin::Stub::ReloadDrivers,
                      pb::ReloadDriversRequest{}, &r)) {
        return rc;
    }
    // Errors first, on stderr in either format and flushed before the summary: a terminal or
    // the journal (ExecReload=ibv-extendctl reload) then reads what went wrong before any line
    // that could pass for success, and the exit code makes `systemctl reload` fail.
    for (const auto &e : r.errors()) {
        std::cerr << "ibv-extendctl: reload error: " << e << std::endl;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return r.errors_size() == 0 ? kExitOk : kExitFailed;
    }
    std::cout << (r.errors_size() == 0
                      ? "reloaded: "
                      : "reload incomplete (" + std::to_string(r.errors_size()) + " error(s), above): ")
              << r.new_devices() << " new device(s), " << r.devices() << " total";
    for (const auto &l : r.loaded()) {
        std::cout << "; loaded " << l;
    }
    std::cout << '\n';
    return r.errors_size() == 0 ? kExitOk : kExitFailed;
}

int cmdRestart(Client &c, const Options &o, bool require_keep) {
    pb::RestartRequest req;
    req.set_require_keep(require_keep);
    pb::RestartResponse r;
    grpc::ClientContext ctx;
    c.deadline(ctx);
    grpc::Status st = c.admin().Restart(&ctx, req, &r);
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        // --require-keep and a session that would end: the broker says which and nothing changed.
        std::fprintf(stderr, "ibv-extendctl: restart refused: %s\n", st.error_message().c_str());
        return kExitFailed;
    }
    if (!st.ok()) {
        return failed("Admin.Restart", st, o.socket);
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    std::cout << "restarting: exec " << r.binary() << '\n'
              << "sessions kept:    " << r.sessions_kept() << '\n'
              << "sessions dropped: " << r.sessions_dropped();
    if (r.dropping_drivers_size() > 0) {
        std::string drivers;
        for (const auto &d : r.dropping_drivers()) {
            drivers += drivers.empty() ? d : ", " + d;
        }
        std::cout << " (drivers that cannot hand over: " << drivers << ")";
    }
    std::cout << '\n';
    return kExitOk;
}

const char *eventKind(pb::AdminEvent::Kind k) {
    switch (k) {
        case pb::AdminEvent::SESSION_OPEN:
            return "session-open";
        case pb::AdminEvent::SESSION_CLOSE:
            return "session-close";
        case pb::AdminEvent::OBJECT_CREATE:
            return "object-create";
        case pb::AdminEvent::OBJECT_DESTROY:
            return "object-destroy";
        case pb::AdminEvent::EVICTION:
            return "eviction";
        case pb::AdminEvent::DRIVER_ERROR:
            return "driver-error";
        case pb::AdminEvent::QUOTA_DENIAL:
            return "quota-denial";
        case pb::AdminEvent::RELOAD:
            return "reload";
        case pb::AdminEvent::BROKER_RESTART:
            return "broker-restart";
        default:
            return "unknown";
    }
}

void printEvent(const Options &o, const pb::AdminEvent &e) {
    if (o.json) {
        std::cout << toJsonLine(e) << std::endl;
        return;
    }
    time_t t = static_cast<time_t>(e.time_unix_ms() / 1000);
    char when[32];
    std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&t));
    std::cout << when << '.' << std::to_string(1000 + e.time_unix_ms() % 1000).substr(1) << "  #" << e.seq()
              << "  " << eventKind(e.kind());
    if (e.session() != 0) {
        std::cout << "  session " << e.session() << " pid " << e.pid() << " uid " << e.uid();
    }
    if (e.object_kind() != pb::OBJECT_KIND_UNSPECIFIED) {
        std::cout << "  " << label(e.object_kind()) << ' ' << hex64(e.handle());
    }
    if (!e.message().empty()) {
        std::cout << "  " << e.message();
    }
    std::cout << std::endl;
}

// After a Watch stream ended with the broker (a restart, or a stop): the broker's status once it
// answers again, polled for up to `wait`. False when none answers by then.
bool awaitBroker(Client &c, std::chrono::seconds wait, pb::GetStatusResponse *status) {
    auto until = std::chrono::steady_clock::now() + wait;
    for (;;) {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
        ctx.set_wait_for_ready(true);
        if (c.admin().GetStatus(&ctx, pb::GetStatusRequest{}, status).ok()) {
            return true;
        }
        if (std::chrono::steady_clock::now() >= until) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// A watch outlives broker restarts: when the stream ends, it waits for the broker (up to 60 s)
// and watches again. A restart's own event is published by the new broker before any watcher
// can reconnect, so the watch reports the restart it saw from the broker's status instead.
int cmdWatch(Client &c, const Options &o, int count) {
    constexpr auto kBrokerWait = std::chrono::seconds(60);
    pb::GetStatusResponse status;
    {
        grpc::ClientContext ctx;
        c.deadline(ctx);
        (void)c.admin().GetStatus(&ctx, pb::GetStatusRequest{}, &status);
    }
    uint64_t restarts = status.restarts();
    int32_t pid = status.pid();
    int seen = 0;
    if (!o.json) {
        std::cout << "watching " << o.socket << " (Ctrl-C to stop)" << std::endl;
    }
    for (;;) {
        grpc::ClientContext ctx;  // no deadline: runs until interrupted or the broker stops
        auto reader = c.admin().Watch(&ctx, pb::WatchRequest{});
        pb::AdminEvent e;
        while ((count <= 0 || seen < count) && reader->Read(&e)) {
            ++seen;
            printEvent(o, e);
        }
        if (count > 0 && seen >= count) {
            ctx.TryCancel();
            (void)reader->Finish();
            return kExitOk;
        }
        grpc::Status st = reader->Finish();
        if (!st.ok() && st.error_code() != grpc::StatusCode::CANCELLED &&
            st.error_code() != grpc::StatusCode::UNAVAILABLE) {
            return failed("Admin.Watch", st, o.socket);
        }
        if (!awaitBroker(c, kBrokerWait, &status)) {
            return failed("Admin.Watch", grpc::Status(grpc::StatusCode::UNAVAILABLE, "the broker stopped"),
                          o.socket);
        }
        if (status.restarts() > restarts) {
            pb::AdminEvent r;
            r.set_kind(pb::AdminEvent::BROKER_RESTART);
            r.set_time_unix_ms(status.last_restart_unix_ms());
            r.set_pid(status.pid());
            r.set_message("restart " + std::to_string(status.restarts()) + ", took " +
                          humanDuration(status.last_restart_took_ms()) + " (from the broker's status)");
            printEvent(o, r);
            ++seen;
        } else if (status.pid() != pid) {
            std::cerr << "ibv-extendctl: watch: the broker was stopped and started again (pid "
                      << status.pid() << "); watching it" << std::endl;
        }
        restarts = status.restarts();
        pid = status.pid();
        if (count > 0 && seen >= count) {
            return kExitOk;
        }
    }
}

// A tenant session of devinfo's own: Hello, then the fd channel attached so the session is
// complete (and ends the moment the channel closes).
struct TenantSession {
    pb::HelloResponse hello;
    UniqueFd channel;
    std::string token_hex;
};

int openTenantSession(Client &c, const Options &o, TenantSession *t) {
    pb::HelloRequest hello;
    hello.mutable_client_version()->set_major(kMajor);
    hello.mutable_client_version()->set_minor(kMinor);
    hello.mutable_client_version()->set_patch(kPatch);
    hello.set_client_name("ibv-extendctl devinfo");
    {
        grpc::ClientContext ctx;
        c.deadline(ctx);
        grpc::Status st = c.broker().Hello(&ctx, hello, &t->hello);
        if (!st.ok()) {
            return failed("Broker.Hello", st, o.socket);
        }
    }
    if (t->hello.broker_version().major() != kMajor) {
        std::fprintf(stderr,
                     "ibv-extendctl: version mismatch: the broker speaks protocol %s, this tool %u.%u.%u\n",
                     version(t->hello.broker_version()).c_str(), kMajor, kMinor, kPatch);
        return kExitVersion;
    }
    SessionToken token{};
    if (t->hello.session_token().size() == token.size()) {
        std::memcpy(token.data(), t->hello.session_token().data(), token.size());
    }
    auto channel = connectUnix(o.socket);
    if (!channel.isOk() || attachClient(channel->get(), token, 5000) != 0) {
        std::fprintf(stderr, "ibv-extendctl: cannot attach the session's fd channel on %s\n",
                     o.socket.c_str());
        return kExitFailed;
    }
    t->channel = std::move(*channel);
    static const char kHex[] = "0123456789abcdef";
    for (unsigned char b : t->hello.session_token()) {
        t->token_hex += kHex[b >> 4];
        t->token_hex += kHex[b & 15];
    }
    return kExitOk;
}

// The device's ext_cap as QueryDevice reports it on an opened context; the device list's value
// (queried false) when the device cannot be opened.
uint32_t queryExtCap(Client &c, const TenantSession &t, const pb::DeviceInfo &d, bool *queried) {
    auto session = [&](grpc::ClientContext &ctx) {
        c.deadline(ctx);
        ctx.AddMetadata("ibvx-session", t.token_hex);
    };
    uint32_t ext_cap = d.ext_cap();
    *queried = false;
    pb::OpenContextRequest oreq;
    oreq.set_device_name(d.name());
    pb::OpenContextResponse oresp;
    grpc::ClientContext octx;
    session(octx);
    if (!c.broker().OpenContext(&octx, oreq, &oresp).ok()) {
        return ext_cap;
    }
    pb::QueryDeviceRequest qreq;
    qreq.set_context(oresp.context());
    pb::QueryDeviceResponse qresp;
    grpc::ClientContext qctx;
    session(qctx);
    if (c.broker().QueryDevice(&qctx, qreq, &qresp).ok()) {
        ext_cap = qresp.ext_cap();
        *queried = true;
    }
    pb::CloseContextRequest creq;
    creq.set_context(oresp.context());
    pb::CloseContextResponse cresp;
    grpc::ClientContext cctx;
    session(cctx);
    (void)c.broker().CloseContext(&cctx, creq, &cresp);
    return ext_cap;
}

nlohmann::json deviceJson(const pb::DeviceInfo &d, uint32_t ext_cap, bool queried) {
    return {{"name", d.name()},
            {"driver", d.provider()},
            {"virtual_device", d.virtual_device()},
            {"driver_version", d.driver_version()},
            {"ext_cap", ext_cap},
            {"ext_cap_names", extCapNames(ext_cap)},
            {"queried", queried},
            {"phys_port_cnt", d.phys_port_cnt()},
            {"max_qp", d.max_qp()},
            {"max_cq", d.max_cq()},
            {"max_srq", d.max_srq()},
            {"max_mr", d.max_mr()},
            {"max_qp_wr", d.max_qp_wr()},
            {"max_cqe", d.max_cqe()},
            {"max_srq_wr", d.max_srq_wr()},
            {"max_sge", d.max_sge()},
            {"max_inline_data", d.max_inline_data()},
            {"max_msg_sz", d.max_msg_sz()},
            {"max_mr_size", d.max_mr_size()}};
}

// ibv_devinfo's layout.
void printDevice(const pb::DeviceInfo &d, uint32_t ext_cap, bool queried) {
    char caps[64];
    std::snprintf(caps, sizeof(caps), "0x%08x (%s)", ext_cap, extCapNames(ext_cap).c_str());
    std::cout << "hca_id:\t" << d.name() << '\n'
              << "\tdriver:\t\t\t" << d.provider() << (d.virtual_device() ? " (virtual device)" : "") << '\n'
              << "\tdriver_version:\t\t" << d.driver_version() << '\n'
              << "\text_cap:\t\t" << caps << (queried ? "" : " (from the device list)") << '\n'
              << "\tphys_port_cnt:\t\t" << d.phys_port_cnt() << '\n'
              << "\tmax_qp:\t\t\t" << d.max_qp() << '\n'
              << "\tmax_qp_wr:\t\t" << d.max_qp_wr() << '\n'
              << "\tmax_sge:\t\t" << d.max_sge() << '\n'
              << "\tmax_cq:\t\t\t" << d.max_cq() << '\n'
              << "\tmax_cqe:\t\t" << d.max_cqe() << '\n'
              << "\tmax_srq:\t\t" << d.max_srq() << '\n'
              << "\tmax_srq_wr:\t\t" << d.max_srq_wr() << '\n'
              << "\tmax_mr:\t\t\t" << d.max_mr() << '\n'
              << "\tmax_mr_size:\t\t" << d.max_mr_size() << '\n'
              << "\tmax_inline_data:\t" << d.max_inline_data() << '\n'
              << "\tmax_msg_sz:\t\t" << d.max_msg_sz() << "\n\n";
}

int cmdDevinfo(Client &c, const Options &o) {
    TenantSession t;
    if (int rc = openTenantSession(c, o, &t)) {
        return rc;
    }
    pb::ListDevicesResponse devices;
    {
        grpc::ClientContext ctx;
        c.deadline(ctx);
        ctx.AddMetadata("ibvx-session", t.token_hex);
        grpc::Status st = c.broker().ListDevices(&ctx, pb::ListDevicesRequest{}, &devices);
        if (!st.ok()) {
            return failed("Broker.ListDevices", st, o.socket);
        }
    }
    nlohmann::json out = nlohmann::json::array();
    for (const auto &d : devices.devices()) {
        bool queried = false;
        uint32_t ext_cap = queryExtCap(c, t, d, &queried);
        if (o.json) {
            out.push_back(deviceJson(d, ext_cap, queried));
        } else {
            printDevice(d, ext_cap, queried);
        }
    }
    if (o.json) {
        std::cout << out.dump(2) << '\n';
    } else if (devices.devices_size() == 0) {
        std::cout << "No devices found (broker " << version(t.hello.broker_version()) << " on " << o.socket
                  << ")\n";
    }
    return kExitOk;
}

std::string quotaLimit(const pb::QuotaValue &v) {
    return v.unlimited() ? "-" : std::to_string(v.limit());
}

// "uid 1000", "container 0123456789ab" (container ids cut to id_width), "namespace team-a".
std::string accountLabel(const pb::QuotaAccountInfo &a, size_t id_width = std::string::npos) {
    switch (a.scope()) {
        case pb::QUOTA_SCOPE_UID:
            return "uid " + std::to_string(a.uid());
        case pb::QUOTA_SCOPE_NAMESPACE:
            return "namespace " + a.pod_namespace();
        default:
            return "container " + a.container().substr(0, id_width);
    }
}

int cmdQuotas(Client &c, const Options &o) {
    pb::GetQuotasResponse r;
    if (int rc = call(c, o, "Admin.GetQuotas", &pb::Admin::Stub::GetQuotas, pb::GetQuotasRequest{}, &r)) {
        return rc;
    }
    if (o.json) {
        std::cout << toJson(r) << '\n';
        return kExitOk;
    }
    // One row per account, one column per quota: "used/limit" ("-" is unlimited).
    std::vector<std::string> header = {"ACCOUNT"};
    for (const auto &d : r.defaults()) {
        header.push_back(d.name());
    }
    Table t(header);
    std::vector<std::string> defaults = {"default"};
    for (const auto &d : r.defaults()) {
        defaults.push_back(quotaLimit(d));
    }
    t.add(defaults);
    for (const auto &a : r.accounts()) {
        std::vector<std::string> row = {accountLabel(a, 12)};
        for (const auto &q : a.quotas()) {
            row.push_back(std::to_string(q.used()) + "/" + quotaLimit(q));
        }
        t.add(row);
    }
    std::cout << t.render();
    if (r.overrides_size() > 0) {
        Table ot({"OVERRIDE", "QUOTA", "LIMIT"});
        for (const auto &a : r.overrides()) {
            for (const auto &q : a.quotas()) {
                ot.add({accountLabel(a), q.name(), q.unlimited() ? "unlimited" : std::to_string(q.limit())});
            }
        }
        std::cout << '\n' << ot.render();
    }
    return kExitOk;
}

// The largest quota limit: what a [quotas] entry of the configuration can hold (TOML integers
// are signed 64-bit), and what the broker's Admin.SetQuota accepts.
constexpr uint64_t kMaxQuotaLimit = std::numeric_limits<int64_t>::max();

// Why VALUE of `quotas set` is not one, or "" when it is: checked while the command line is
// parsed, so a bad value is a usage error (exit 2) whether or not a broker runs. std::stoull
// would take "-5" and wrap it to 18446744073709551611.
std::string quotaValueError(const std::string &value) {
    if (value == "unlimited" || value == "clear") {
        return "";
    }
    const std::string what = "a quota VALUE is a whole number from 0 (nothing may be created) to " +
                             std::to_string(kMaxQuotaLimit) + ", 'unlimited' or 'clear'";
    if (!value.empty() && value[0] == '-') {
        return "'" + value + "' is negative: " + what;
    }
    uint64_t limit = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), limit);
    if (ec == std::errc::invalid_argument || end != value.data() + value.size()) {
        return "'" + value + "' is not a number: " + what;
    }
    if (ec == std::errc::result_out_of_range || limit > kMaxQuotaLimit) {
        return "'" + value + "' is too large: " + what;
    }
    return "";
}

int cmdSetQuota(Client &c, const Options &o, pb::SetQuotaRequest req, const std::string &value) {
    if (value == "unlimited") {
        req.set_unlimited(true);
    } else if (value == "clear") {
        req.set_clear(true);
    } else {
        req.set_limit(std::stoull(value));  // quotaValueError() passed it
    }
    pb::SetQuotaResponse r;
    if (int rc = call(c, o, "Admin.SetQuota", &pb::Admin::Stub::SetQuota, req, &r)) {
        return rc;
    }
    if (!o.json) {
        std::cout << "quota " << req.quota() << " of " << label(req.scope())
                  << (req.scope() == pb::QUOTA_SCOPE_UID         ? " " + std::to_string(req.uid())
                      : req.scope() == pb::QUOTA_SCOPE_CONTAINER ? " " + req.container()
                      : req.scope() == pb::QUOTA_SCOPE_NAMESPACE ? " " + req.pod_namespace()
                                                                 : "")
                  << " set to " << value << '\n';
    }
    return kExitOk;
}

// "qp" -> OBJECT_KIND_QP; "" (no filter) -> OBJECT_KIND_UNSPECIFIED.
pb::ObjectKind objectKind(const std::string &name) {
    std::string upper = "OBJECT_KIND_";
    for (char ch : name) {
        upper += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
    pb::ObjectKind kind = pb::OBJECT_KIND_UNSPECIFIED;
    return !name.empty() && pb::ObjectKind_Parse(upper, &kind) ? kind : pb::OBJECT_KIND_UNSPECIFIED;
}

// What the command line asked for: every option's value, and each subcommand (parsed() says
// which one ran). CLI11 binds to these fields, so an Args stays where it was built.
struct Args {
    Options o;
    uint32_t page_size = 0;
    uint64_t f_session = 0;
    int64_t f_uid = -1;
    std::string f_device, f_kind;
    std::string format = "prometheus";
    uint64_t evict_id = 0;
    int count = 0;
    bool require_keep = false;
    int64_t q_uid = -1;
    std::string q_container, q_namespace, q_name, q_value;
    bool q_default = false;
    CLI::App *status, *drivers, *sessions, *objects, *stats, *metrics, *evict, *reload, *restart, *watch,
        *quotas, *quota_set, *devinfo;
};

void addGlobalOptions(CLI::App &app, Options *o) {
    // Global options are accepted after the subcommand too ("status --json"): a subcommand hands
    // what it does not know to its parent. Subcommands inherit this when they are added.
    app.fallthrough();
    const char *env = std::getenv("IBV_EXTEND_SOCKET");
    o->socket = env != nullptr && env[0] != '\0' ? env : kDefaultSocket;
    app.add_option("--socket", o->socket,
                   "Broker socket (default: IBV_EXTEND_SOCKET, else " + std::string(kDefaultSocket) + ")");
    app.add_flag("--json", o->json, "Machine-readable JSON output");
    app.add_option("--timeout", o->timeout_s, "Seconds to wait for each answer")->check(CLI::Range(1, 3600));
    app.footer(
        "Exit codes: 0 ok, 1 the broker refused or failed the operation, 2 usage error, 3 broker not "
        "running or not answering, 4 permission denied, 5 version mismatch.");
}

void addQuotaCommands(CLI::App &app, Args *a) {
    a->quotas =
        app.add_subcommand("quotas", "Quota defaults, usage per uid, container and namespace, overrides");
    a->quota_set = a->quotas->add_subcommand("set", "Set a runtime quota override (or a default)");
    auto *uid = a->quota_set->add_option("--uid", a->q_uid, "Override for this uid")
                    ->check(CLI::Range(int64_t{0}, int64_t{4294967295}));
    auto *container =
        a->quota_set->add_option("--container", a->q_container, "Override for this container id");
    auto *ns =
        a->quota_set->add_option("--namespace", a->q_namespace,
                                 "Limit this Kubernetes namespace's account (its pods' sessions together)");
    auto *all = a->quota_set->add_flag("--default", a->q_default, "Change the default for everyone");
    uid->excludes(container)->excludes(ns)->excludes(all);
    container->excludes(ns)->excludes(all);
    ns->excludes(all);
    a->quota_set
        ->add_option("quota", a->q_name,
                     "contexts, pds, mrs, mr_bytes, cqs, qps, srqs, queue_bytes, sessions, ahs, event_fds, "
                     "replies, state_bytes, xrcds, mws")
        ->required();
    a->quota_set->add_option("value", a->q_value, "A number, 'unlimited', or 'clear' (drop the override)")
        ->required()
        ->check(CLI::Validator([](std::string &v) { return quotaValueError(v); }, "VALUE", "quota value"));
}

void addCommands(CLI::App &app, Args *a) {
    a->status = app.add_subcommand("status", "Broker version, uptime, devices, sessions, memory");
    a->drivers = app.add_subcommand("drivers", "Loaded extension drivers and failed loads");
    a->sessions = app.add_subcommand("sessions", "Tenant sessions (pid, uid, container, objects, calls)");
    const char *page_help = "Entries per Admin call (0: the broker's default); every page is listed";
    a->sessions->add_option("--page-size", a->page_size, page_help);
    a->objects = app.add_subcommand("objects", "Objects of all sessions, with QPN, state, depths, sizes");
    a->objects->add_option("--session", a->f_session, "Only this session");
    a->objects->add_option("--uid", a->f_uid, "Only sessions of this uid")
        ->check(CLI::Range(int64_t{0}, int64_t{4294967295}));
    a->objects->add_option("--device", a->f_device, "Only objects on this device");
    a->objects->add_option("--kind", a->f_kind, "Only this kind")
        ->check(CLI::IsMember({"context", "pd", "mr", "cq", "qp", "srq", "ah", "xrcd", "mw", "dm"}));
    a->objects->add_option("--page-size", a->page_size, page_help);
    a->stats = app.add_subcommand("stats", "Per-method calls, errors and latency; engine counters");
    a->metrics = app.add_subcommand("metrics", "Counters for monitoring (Prometheus text by default)");
    a->metrics->add_option("--format", a->format, "prometheus or json")
        ->check(CLI::IsMember({"prometheus", "json"}));
    a->evict = app.add_subcommand("evict", "End a session and destroy everything it owns");
    a->evict->add_option("session", a->evict_id, "Session id (from 'sessions')")->required();
    a->reload = app.add_subcommand("reload", "Re-read the configuration and load new drivers (as SIGHUP)");
    a->restart = app.add_subcommand(
        "restart", "Hand every session over to a fresh exec of the broker's binary (the upgrade path)");
    a->restart->add_flag("--require-keep", a->require_keep,
                         "Refuse (nothing changes) if any live session would be dropped");
    a->watch = app.add_subcommand("watch", "Stream events: sessions, objects, evictions, driver errors");
    a->watch->add_option("--count", a->count, "Stop after this many events");
    addQuotaCommands(app, a);
    a->devinfo =
        app.add_subcommand("devinfo", "Devices and extended capabilities your session sees (no admin)");
}

int runObjects(Client &c, const Args &a) {
    pb::ListObjectsRequest filter;
    filter.set_session(a.f_session);
    if (a.f_uid >= 0) {
        filter.set_uid(static_cast<uint32_t>(a.f_uid));
        filter.set_has_uid(true);
    }
    filter.set_device(a.f_device);
    filter.set_kind(objectKind(a.f_kind));
    filter.set_page_size(a.page_size);
    return cmdObjects(c, a.o, filter);
}

int runSetQuota(Client &c, const Args &a) {
    if (a.q_uid < 0 && a.q_container.empty() && a.q_namespace.empty() && !a.q_default) {
        std::fprintf(stderr,
                     "ibv-extendctl: quotas set needs --uid, --container, --namespace or --default\n");
        return kExitUsage;
    }
    pb::SetQuotaRequest req;
    req.set_scope(a.q_default              ? pb::QUOTA_SCOPE_DEFAULT
                  : a.q_uid >= 0           ? pb::QUOTA_SCOPE_UID
                  : !a.q_namespace.empty() ? pb::QUOTA_SCOPE_NAMESPACE
                                           : pb::QUOTA_SCOPE_CONTAINER);
    req.set_uid(a.q_uid >= 0 ? static_cast<uint32_t>(a.q_uid) : 0);
    req.set_container(a.q_container);
    req.set_pod_namespace(a.q_namespace);
    req.set_quota(a.q_name);
    return cmdSetQuota(c, a.o, req, a.q_value);
}

int dispatch(Client &c, const Args &a) {
    const Options &o = a.o;
    if (a.status->parsed()) {
        return cmdStatus(c, o);
    }
    if (a.drivers->parsed()) {
        return cmdDrivers(c, o);
    }
    if (a.sessions->parsed()) {
        return cmdSessions(c, o, a.page_size);
    }
    if (a.objects->parsed()) {
        return runObjects(c, a);
    }
    if (a.stats->parsed()) {
        return cmdStats(c, o);
    }
    if (a.metrics->parsed()) {
        return cmdMetrics(c, o, a.format);
    }
    if (a.evict->parsed()) {
        return cmdEvict(c, o, a.evict_id);
    }
    if (a.reload->parsed()) {
        return cmdReload(c, o);
    }
    if (a.restart->parsed()) {
        return cmdRestart(c, o, a.require_keep);
    }
    if (a.watch->parsed()) {
        return cmdWatch(c, o, a.count);
    }
    if (a.quota_set->parsed()) {
        return runSetQuota(c, a);
    }
    if (a.quotas->parsed()) {
        return cmdQuotas(c, o);
    }
    if (a.devinfo->parsed()) {
        return cmdDevinfo(c, o);
    }
    return kExitUsage;
}

// A command line CLI11 refused. Without a command CLI11 would only say "A subcommand is
// required", also for a misspelt one: name what was typed and list the commands instead.
int parseFailure(CLI::App &app, const CLI::ParseError &e) {
    std::vector<std::string> rest = app.remaining();
    bool no_command = app.get_subcommands().empty() && (rest.empty() || rest[0].rfind('-', 0) != 0);
    if (!no_command || e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
        int rc = app.exit(e);
        return rc == 0 ? kExitOk : kExitUsage;
    }
    std::string commands;
    for (const CLI::App *sub : app.get_subcommands([](const CLI::App *) { return true; })) {
        commands += (commands.empty() ? "" : ", ") + sub->get_name();
    }
    if (rest.empty()) {
        std::fprintf(stderr, "ibv-extendctl: a command is required\n");
    } else {
        std::fprintf(stderr, "ibv-extendctl: unknown command '%s'\n", rest[0].c_str());
    }
    std::fprintf(stderr, "  commands: %s\n  (ibv-extendctl --help describes them)\n", commands.c_str());
    return kExitUsage;
}

}  // namespace

int run(int argc, char **argv) {
    CLI::App app{"ibv-extendctl: inspect and steer the ibv-extend broker (ibv-extendd)"};
    app.set_version_flag("--version", "ibv-extendctl " IBVX_PROJECT_VERSION, "Print the version and exit");
    app.require_subcommand(1);
    Args a;
    addGlobalOptions(app, &a.o);
    addCommands(app, &a);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        return parseFailure(app, e);
    }
    if (int rc = probe(a.o.socket); rc != kExitOk) {
        return rc;
    }
    Client c(a.o);
    return dispatch(c, a);
}

}  // namespace ibvx::ctl
