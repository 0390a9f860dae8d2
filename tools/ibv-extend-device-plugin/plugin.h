// ibv-extend-device-plugin: advertises N slots of the broker to the kubelet (device-plugin API
// v1beta1), follows the broker's health, and answers Allocate with the edits of edits.h.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tools/ibv-extend-device-plugin/edits.h"

namespace ibvx::device_plugin {

struct PluginOptions {
    std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
    std::string socket;  // the broker's socket
    std::string resource = "ibv-extend.io/nda";
    int devices = 64;
    std::string cdi_spec_dir = "/var/run/cdi";
    bool cdi = false;  // Allocate answers the CDI device name instead of mounts and envs
    std::string client_lib_dir;
    // Holds one empty file per device ID; "" = no markers (no pod identity in the broker).
    std::string device_marker_dir = "/run/ibv-extend-devices";
    // How often the broker's health and the host paths are looked at; the kubelet socket and our
    // own socket are looked at on the same tick.
    std::chrono::milliseconds tick{500};
};

// The plugin's own socket file name in the kubelet directory, derived from the resource name
// ("ibv-extend.io/nda" -> "ibv-extend.io-nda.sock").
std::string endpointName(const std::string &resource);

// The state the monitor thread keeps and the gRPC handlers read. mu guards every field below it;
// cv is notified whenever generation changes or stopping is set.
struct PluginState {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t generation = 0;
    bool healthy = false;
    std::optional<ContainerEdits> edits;  // empty while the client libraries cannot be found
    bool stopping = false;
};

class Plugin {
  public:
    explicit Plugin(PluginOptions options);
    ~Plugin();
    Plugin(const Plugin &) = delete;
    Plugin &operator=(const Plugin &) = delete;

    // Serves and registers until stop() (or a signal set up by the caller) ends it. Returns the
    // exit code.
    int run();
    // Thread-safe; run() returns within one tick.
    void stop();

  private:
    struct Serving;
    void monitor();
    void refreshHealth();
    void refreshEdits();
    void ensureServing();
    void ensureRegistered();
    void stopServing();
    bool makeMarkers();

    PluginOptions opt_;
    std::string endpoint_;
    std::string own_socket_;
    std::string kubelet_socket_;
    std::shared_ptr<PluginState> state_;
    std::atomic<bool> stop_{false};

    // Owned by run()'s thread only.
    std::unique_ptr<Serving> serving_;
    bool markers_ok_ = false;
    struct stat own_stat_ {};  // of the socket we serve on
    bool registered_ = false;
    struct stat kubelet_stat_ {};  // of the kubelet.sock we registered on
    std::chrono::steady_clock::time_point next_register_{};
    std::chrono::milliseconds backoff_{0};
    bool said_waiting_ = false;

    // Owned by the monitor thread only.
    std::thread monitor_;
    std::string last_edits_error_;
    std::string last_health_;
    bool cdi_written_ = false;
};

}  // namespace ibvx::device_plugin
