// ibv-extend-device-plugin: the kubelet's device plugin for the broker (docs/kubernetes.md).
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "common/build_config.h"
#include "tools/ibv-extend-device-plugin/plugin.h"

namespace {

// As the daemon logs: journald when started by systemd (JOURNAL_STREAM), else stderr lines.
void setupLogging(const std::string &level) {
    std::shared_ptr<spdlog::logger> logger;
    if (std::getenv("JOURNAL_STREAM") != nullptr) {
        logger = std::make_shared<spdlog::logger>("ibv-extend-device-plugin",
                                                  std::make_shared<spdlog::sinks::systemd_sink_mt>());
    } else {
        logger = std::make_shared<spdlog::logger>("ibv-extend-device-plugin",
                                                  std::make_shared<spdlog::sinks::stderr_sink_mt>());
        logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e ibv-extend-device-plugin[%P] %l: %v");
    }
    logger->set_level(spdlog::level::from_str(level));
    spdlog::set_default_logger(logger);
}

// Installed as <prefix>/bin/ibv-extend-device-plugin next to <prefix>/lib/libibv_extend.so.4.
std::string defaultClientLibDir() {
    std::error_code ec;
    std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) {
        return "/usr/lib";
    }
    return (exe.parent_path().parent_path() / "lib").string();
}

}  // namespace

int main(int argc, char **argv) {
    ibvx::device_plugin::PluginOptions opt;
    opt.socket = IBVX_DEFAULT_SOCKET;
    opt.client_lib_dir = defaultClientLibDir();
    std::string log_level = "info";

    CLI::App app{"ibv-extend-device-plugin: offers the ibv-extend broker to Kubernetes pods"};
    app.add_option(
           "--kubelet-dir", opt.kubelet_dir,
           "the kubelet's device-plugin directory: the plugin serves there and registers on its kubelet.sock")
        ->capture_default_str();
    app.add_option("--socket", opt.socket, "the broker's socket")->capture_default_str();
    app.add_option("--resource", opt.resource, "the extended resource name")->capture_default_str();
    app.add_option("--devices", opt.devices, "how many containers on the node may hold the resource at once")
        ->check(CLI::Range(1, 100000))
        ->capture_default_str();
    app.add_option("--cdi-spec-dir", opt.cdi_spec_dir, "where the CDI spec ibv-extend.json is written")
        ->capture_default_str();
    app.add_flag("--cdi", opt.cdi, "Allocate answers the CDI device name instead of mounts and environment");
    app.add_option(
           "--client-lib-dir", opt.client_lib_dir,
           "the host directory holding libibv_extend.so.4 and ibv_extend/verbs/ (the libibverbs face)")
        ->capture_default_str();
    app.add_option(
           "--device-marker-dir", opt.device_marker_dir,
           "a host directory for one empty file per device, mounted into each container so the broker "
           "can name its pod (\"\" = none)")
        ->capture_default_str();
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
        ->capture_default_str();
    CLI11_PARSE(app, argc, argv);
    if (opt.resource.find('/') == std::string::npos) {
        std::fprintf(stderr, "--resource must be a vendor-qualified name (domain/name), not '%s'\n",
                     opt.resource.c_str());
        return 2;
    }
    setupLogging(log_level);

    // Signals are taken by one thread; every other thread (gRPC's included) inherits the mask.
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);

    ibvx::device_plugin::Plugin plugin(opt);
    std::thread signals([&] {
        int sig = 0;
        sigwait(&set, &sig);
        if (sig != 0) {
            spdlog::info("{}: stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
        }
        plugin.stop();
    });
    // run() returns only once stop() was called, which only the signal thread does: it is done
    // (or about to be) when run() returns.
    int rc = plugin.run();
    signals.join();
    return rc;
}
