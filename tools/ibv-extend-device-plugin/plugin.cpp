#include "tools/ibv-extend-device-plugin/plugin.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "common/unique_fd.h"
#include "k8s/deviceplugin/v1beta1/api.grpc.pb.h"
#include "tools/ibv-extend-device-plugin/broker_health.h"

namespace ibvx::device_plugin {
namespace {

namespace pb = ::v1beta1;
using namespace std::chrono_literals;

constexpr const char *kApiVersion = "v1beta1";
constexpr const char *kDevicePrefix = "nda-";
constexpr auto kMaxBackoff = 30s;

std::string deviceId(int i) {
    return kDevicePrefix + std::to_string(i);
}

// The index of a device ID this plugin advertises, or -1.
int deviceIndex(const std::string &id, int devices) {
    const std::string prefix = kDevicePrefix;
    if (id.size() <= prefix.size() || id.compare(0, prefix.size(), prefix) != 0) {
        return -1;
    }
    std::string digits = id.substr(prefix.size());
    if (digits.size() > 9 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (digits.size() > 1 && digits[0] == '0')) {
        return -1;
    }
    int i = std::stoi(digits);
    return i < devices ? i : -1;
}

class DevicePluginService final : public pb::DevicePlugin::Service {
  public:
    DevicePluginService(std::shared_ptr<PluginState> state, int devices, bool cdi, std::string marker_dir)
        : state_(std::move(state)), devices_(devices), cdi_(cdi), marker_dir_(std::move(marker_dir)) {}

    grpc::Status GetDevicePluginOptions(grpc::ServerContext *, const pb::Empty *,
                                        pb::DevicePluginOptions *out) override {
        out->set_pre_start_required(false);
        out->set_get_preferred_allocation_available(false);
        return grpc::Status::OK;
    }

    grpc::Status ListAndWatch(grpc::ServerContext *ctx, const pb::Empty *,
                              grpc::ServerWriter<pb::ListAndWatchResponse> *writer) override {
        spdlog::info("the kubelet watches the device list");
        std::optional<uint64_t> sent;
        while (true) {
            bool healthy;
            {
                std::unique_lock lock(state_->mu);
                // Bounded wait: a cancelled call (kubelet gone, server shutting down) is only
                // seen by polling the context.
                state_->cv.wait_for(lock, 250ms,
                                    [&] { return state_->stopping || sent != state_->generation; });
                if (state_->stopping || ctx->IsCancelled()) {
                    return grpc::Status::OK;
                }
                if (sent == state_->generation) {
                    continue;
                }
                sent = state_->generation;
                healthy = state_->healthy;
            }
            pb::ListAndWatchResponse resp;
            for (int i = 0; i < devices_; ++i) {
                pb::Device *d = resp.add_devices();
                d->set_id(deviceId(i));
                d->set_health(healthy ? "Healthy" : "Unhealthy");
            }
            if (!writer->Write(resp)) {
                return grpc::Status::OK;
            }
        }
    }

    grpc::Status GetPreferredAllocation(grpc::ServerContext *, const pb::PreferredAllocationRequest *,
                                        pb::PreferredAllocationResponse *) override {
        // Every slot is the same broker: there is nothing to prefer, and the options say so.
        return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                            "no preferred allocation: all devices are alike");
    }

    grpc::Status Allocate(grpc::ServerContext *, const pb::AllocateRequest *req,
                          pb::AllocateResponse *resp) override {
        std::optional<ContainerEdits> edits;
        {
            std::lock_guard lock(state_->mu);
            edits = state_->edits;
        }
        std::string all_ids;
        for (const pb::ContainerAllocateRequest &c : req->container_requests()) {
            for (const std::string &id : c.devices_ids()) {
                if (deviceIndex(id, devices_) < 0) {
                    spdlog::warn("Allocate refused: unknown device ID '{}'", id);
                    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                        "unknown device ID '" + id + "': this plugin serves " + deviceId(0) +
                                            " to " + deviceId(devices_ - 1));
                }
                all_ids += (all_ids.empty() ? "" : ",") + id;
            }
        }
        if (!edits && !cdi_) {
            return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "the client libraries cannot be found on this node (see the plugin's log)");
        }
        for (const pb::ContainerAllocateRequest &creq : req->container_requests()) {
            pb::ContainerAllocateResponse *c = resp->add_container_responses();
            if (cdi_) {
                c->add_cdi_devices()->set_name(std::string(kCdiKind) + "=" + kCdiDevice);
                continue;
            }
            for (const Mount &m : edits->mounts) {
                pb::Mount *out = c->add_mounts();
                out->set_host_path(m.host_path);
                out->set_container_path(m.container_path);
                out->set_read_only(m.read_only);
            }
            for (const auto &[name, value] : edits->envs) {
                (*c->mutable_envs())[name] = value;
            }
            if (!marker_dir_.empty() && creq.devices_ids_size() > 0) {
                // One marker per container: its first device names it (the kubelet lists all
                // of the container's devices under the same pod and container anyway).
                pb::Mount *marker = c->add_mounts();
                marker->set_host_path(marker_dir_ + "/" + creq.devices_ids(0));
                marker->set_container_path(kContainerDeviceMarker);
                marker->set_read_only(true);
            }
        }
        spdlog::info(
            "Allocate: {} container(s), devices [{}], answered with {}", req->container_requests_size(),
            all_ids,
            cdi_ ? "the CDI device " + std::string(kCdiKind) + "=" + kCdiDevice : "mounts and environment");
        return grpc::Status::OK;
    }

    grpc::Status PreStartContainer(grpc::ServerContext *, const pb::PreStartContainerRequest *,
                                   pb::PreStartContainerResponse *) override {
        return grpc::Status::OK;
    }

  private:
    std::shared_ptr<PluginState> state_;
    int devices_;
    bool cdi_;
    std::string marker_dir_;  // "" when the markers could not be made
};

bool statPath(const std::string &path, struct stat *st) {
    return ::lstat(path.c_str(), st) == 0;
}

// The same socket file, not merely the same name. A file system hands a freed inode number to
// the next file at once, so a kubelet that removed and bound its socket between two looks may
// get the same number back: the change time (set by bind) tells the two apart.
bool sameFile(const struct stat &a, const struct stat &b) {
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_ctim.tv_sec == b.st_ctim.tv_sec &&
           a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

}  // namespace

struct Plugin::Serving {
    std::unique_ptr<DevicePluginService> service;
    std::unique_ptr<grpc::Server> server;
};

std::string endpointName(const std::string &resource) {
    std::string name = resource;
    std::replace(name.begin(), name.end(), '/', '-');
    return name + ".sock";
}

Plugin::Plugin(PluginOptions options)
    : opt_(std::move(options)),
      endpoint_(endpointName(opt_.resource)),
      own_socket_((std::filesystem::path(opt_.kubelet_dir) / endpoint_).string()),
      kubelet_socket_((std::filesystem::path(opt_.kubelet_dir) / "kubelet.sock").string()),
      state_(std::make_shared<PluginState>()) {}

Plugin::~Plugin() {
    stop();
    if (monitor_.joinable()) {
        monitor_.join();
    }
}

void Plugin::stop() {
    std::lock_guard lock(state_->mu);
    state_->stopping = true;
    state_->cv.notify_all();
}

int Plugin::run() {
    spdlog::info("ibv-extend-device-plugin: resource {}, {} devices, broker {}, kubelet dir {}, {} mode",
                 opt_.resource, opt_.devices, opt_.socket, opt_.kubelet_dir, opt_.cdi ? "CDI" : "mounts");
    markers_ok_ = !opt_.cdi && makeMarkers();
    monitor_ = std::thread(&Plugin::monitor, this);
    while (true) {
        ensureServing();
        ensureRegistered();
        std::unique_lock lock(state_->mu);
        if (state_->cv.wait_for(lock, opt_.tick, [&] { return state_->stopping; })) {
            break;
        }
    }
    stopServing();
    monitor_.join();
    spdlog::info("stopped; removed {}", own_socket_);
    return 0;
}

void Plugin::stopServing() {
    if (!serving_) {
        return;
    }
    serving_->server->Shutdown(std::chrono::system_clock::now() + 1s);
    serving_->server->Wait();
    serving_.reset();
    // Only our own socket: a new plugin instance may already have bound the path again.
    struct stat st {};
    if (statPath(own_socket_, &st) && sameFile(st, own_stat_)) {
        ::unlink(own_socket_.c_str());
    }
    own_stat_ = {};
}

bool Plugin::makeMarkers() {
    if (opt_.device_marker_dir.empty()) {
        return false;
    }
    std::error_code ec;
    std::filesystem::create_directories(opt_.device_marker_dir, ec);
    for (int i = 0; i < opt_.devices && !ec; ++i) {
        std::string path = opt_.device_marker_dir + "/" + deviceId(i);
        UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0444));
        if (!fd) {
            ec = std::error_code(errno, std::system_category());
        }
    }
    if (!ec) {
        // A host path, resolved as every path the plugin hands out (edits.h).
        opt_.device_marker_dir = std::filesystem::canonical(opt_.device_marker_dir, ec).string();
    }
    if (ec) {
        spdlog::warn("cannot make the device markers in {}: {}; the broker will not name pods",
                     opt_.device_marker_dir, ec.message());
        return false;
    }
    return true;
}

void Plugin::ensureServing() {
    struct stat st {};
    if (serving_ && statPath(own_socket_, &st) && sameFile(st, own_stat_)) {
        return;
    }
    if (serving_) {
        // The kubelet removes every plugin socket when it starts: it restarted.
        spdlog::info("{} was removed (the kubelet restarted): serving again", own_socket_);
        stopServing();
    }
    registered_ = false;
    std::error_code ec;
    if (!std::filesystem::is_directory(opt_.kubelet_dir, ec)) {
        if (!said_waiting_) {
            spdlog::info("waiting for the kubelet directory {}", opt_.kubelet_dir);
            said_waiting_ = true;
        }
        return;
    }
    ::unlink(own_socket_.c_str());  // a stale socket of an earlier instance
    auto serving = std::make_unique<Serving>();
    serving->service = std::make_unique<DevicePluginService>(state_, opt_.devices, opt_.cdi,
                                                             markers_ok_ ? opt_.device_marker_dir : "");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + own_socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(serving->service.get());
    serving->server = builder.BuildAndStart();
    if (!serving->server || !statPath(own_socket_, &st)) {
        spdlog::error("cannot serve on {}; retrying", own_socket_);
        return;
    }
    own_stat_ = st;
    serving_ = std::move(serving);
    said_waiting_ = false;
    spdlog::info("serving the device-plugin API on {}", own_socket_);
}

void Plugin::ensureRegistered() {
    if (!serving_) {
        return;
    }
    struct stat st {};
    if (!statPath(kubelet_socket_, &st)) {
        if (registered_ || !said_waiting_) {
            spdlog::info("waiting for the kubelet at {}", kubelet_socket_);
            said_waiting_ = true;
        }
        registered_ = false;
        return;
    }
    if (registered_ && sameFile(st, kubelet_stat_)) {
        return;
    }
    if (registered_) {
        spdlog::info("{} was created again (the kubelet restarted): registering again", kubelet_socket_);
        registered_ = false;
        backoff_ = 0ms;
        next_register_ = {};
    }
    auto now = std::chrono::steady_clock::now();
    if (now < next_register_) {
        return;
    }
    auto channel = grpc::CreateChannel("unix:" + kubelet_socket_, grpc::InsecureChannelCredentials());
    auto stub = pb::Registration::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    pb::RegisterRequest req;
    req.set_version(kApiVersion);
    req.set_endpoint(endpoint_);
    req.set_resource_name(opt_.resource);
    req.mutable_options()->set_pre_start_required(false);
    req.mutable_options()->set_get_preferred_allocation_available(false);
    pb::Empty empty;
    grpc::Status s = stub->Register(&ctx, req, &empty);
    if (s.ok()) {
        registered_ = true;
        kubelet_stat_ = st;
        backoff_ = 0ms;
        said_waiting_ = false;
        spdlog::info("registered {} with the kubelet at {} (endpoint {}, API {})", opt_.resource,
                     kubelet_socket_, endpoint_, kApiVersion);
        return;
    }
    backoff_ = backoff_ == 0ms ? std::chrono::milliseconds(1s)
                               : std::min<std::chrono::milliseconds>(backoff_ * 2, kMaxBackoff);
    next_register_ = now + backoff_;
    spdlog::warn("registration of {} with the kubelet at {} failed: {} ({}); retrying in {} ms",
                 opt_.resource, kubelet_socket_, s.error_message(), static_cast<int>(s.error_code()),
                 backoff_.count());
}

void Plugin::monitor() {
    while (true) {
        refreshEdits();
        refreshHealth();
        std::unique_lock lock(state_->mu);
        if (state_->cv.wait_for(lock, opt_.tick, [&] { return state_->stopping; })) {
            return;
        }
    }
}

void Plugin::refreshEdits() {
    StatusOr<ContainerEdits> edits = computeEdits({opt_.socket, opt_.client_lib_dir});
    if (!edits.isOk()) {
        if (edits.status().message() != last_edits_error_) {
            last_edits_error_ = edits.status().message();
            spdlog::error("cannot make the container edits: {}", last_edits_error_);
        }
        std::lock_guard lock(state_->mu);
        if (state_->edits) {
            state_->edits.reset();
            ++state_->generation;
            state_->cv.notify_all();
        }
        return;
    }
    last_edits_error_.clear();
    bool changed;
    {
        std::lock_guard lock(state_->mu);
        changed = !state_->edits || *state_->edits != *edits;
    }
    if (!changed && cdi_written_) {
        return;
    }
    std::error_code ec;
    std::filesystem::create_directories(opt_.cdi_spec_dir, ec);
    std::string spec_path = (std::filesystem::path(opt_.cdi_spec_dir) / "ibv-extend.json").string();
    Status written = writeFileAtomically(spec_path, cdiSpec(*edits));
    if (written.isOk()) {
        spdlog::info("CDI spec {} written (device {}={})", spec_path, kCdiKind, kCdiDevice);
    } else if (changed) {
        // Retried every tick until it works, said once per change of the edits.
        spdlog::warn("cannot write the CDI spec: {}", written.message());
    }
    cdi_written_ = written.isOk();
    if (changed) {
        std::lock_guard lock(state_->mu);
        state_->edits = std::move(*edits);
        ++state_->generation;
        state_->cv.notify_all();
    }
}

void Plugin::refreshHealth() {
    BrokerHealth h = checkBroker(opt_.socket, 1s);
    bool healthy;
    {
        std::lock_guard lock(state_->mu);
        healthy = h == BrokerHealth::kServing && state_->edits.has_value();
        if (healthy != state_->healthy) {
            state_->healthy = healthy;
            ++state_->generation;
            state_->cv.notify_all();
        }
    }
    std::string now = std::string(healthName(h)) + (healthy ? "/Healthy" : "/Unhealthy");
    if (now != last_health_) {
        last_health_ = now;
        spdlog::info("broker at {} is {}: devices {}", opt_.socket, healthName(h),
                     healthy ? "Healthy" : "Unhealthy");
    }
}

}  // namespace ibvx::device_plugin
