// ibv-extend-run [--socket PATH] [--] COMMAND [ARGS...]: runs COMMAND with the libibverbs face
// first on LD_LIBRARY_PATH and broker mode selected, as torsocks does for its library. Checks
// first that a broker answers, so a missing daemon is one clear line here rather than a failing
// ibv_get_device_list() deep inside the program.
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "common/build_config.h"
#include "common/unix_socket.h"

namespace {

constexpr const char *kUsage =
    "usage: ibv-extend-run [--socket PATH] [--] COMMAND [ARGS...]\n"
    "Runs COMMAND against the ibv-extend broker: the libibverbs face first on LD_LIBRARY_PATH,\n"
    "IBV_EXTEND_MODE=broker, IBV_EXTEND_SOCKET set to the broker's socket.\n"
    "  --socket PATH  the broker's socket (default: $IBV_EXTEND_SOCKET, else " IBVX_DEFAULT_SOCKET
    ")\n"
    "  --help         this text\n"
    "  --version      the version\n";

bool hasFace(const std::string &dir) {
    return ::access((dir + "/libibverbs.so.1").c_str(), R_OK) == 0;
}

// Installed: <prefix>/bin/ibv-extend-run beside <prefix>/lib/ibv_extend/verbs. From the build
// tree: the directory the build put the face in. Empty when neither holds it.
std::string faceDir() {
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        std::string exe(self, static_cast<size_t>(n));
        std::string installed = exe.substr(0, exe.rfind('/')) + "/../lib/ibv_extend/verbs";
        char real[PATH_MAX];
        if (hasFace(installed) && ::realpath(installed.c_str(), real) != nullptr)
            return real;
    }
    if (hasFace(IBVX_BUILD_VERBS_DIR))
        return IBVX_BUILD_VERBS_DIR;
    return {};
}

int usageError(const char *what, const char *arg) {
    std::fprintf(stderr, "ibv-extend-run: %s%s\n%s", what, arg, kUsage);
    return 2;
}

}  // namespace

int main(int argc, char **argv) {
    const char *env_socket = std::getenv("IBV_EXTEND_SOCKET");
    std::string socket = env_socket != nullptr && *env_socket != '\0' ? env_socket : IBVX_DEFAULT_SOCKET;
    int i = 1;
    for (; i < argc; ++i) {
        std::string_view arg = argv[i];
        if (arg == "--") {
            ++i;
            break;
        }
        if (arg == "--help") {
            std::fputs(kUsage, stdout);
            return 0;
        }
        if (arg == "--version") {
            std::printf("ibv-extend-run %s\n", IBVX_PROJECT_VERSION);
            return 0;
        }
        if (arg == "--socket") {
            if (i + 1 >= argc)
                return usageError("--socket needs a PATH", "");
            socket = argv[++i];
        } else if (arg.starts_with("--socket=")) {
            socket = std::string(arg.substr(std::strlen("--socket=")));
        } else if (arg.size() > 1 && arg[0] == '-') {
            return usageError("unknown option ", argv[i]);
        } else {
            break;
        }
    }
    if (i >= argc)
        return usageError("no COMMAND given", "");

    std::string dir = faceDir();
    if (dir.empty()) {
        std::fprintf(stderr,
                     "ibv-extend-run: the libibverbs face (libibverbs.so.1) is neither in "
                     "../lib/ibv_extend/verbs beside this program nor in %s\n",
                     IBVX_BUILD_VERBS_DIR);
        return 1;
    }
    // A connection is what the program's first verb would make; refusing here names the socket.
    auto connected = ibvx::connectUnix(socket);
    if (!connected.isOk()) {
        std::fprintf(stderr, "ibv-extend-run: no broker answers on %s: %s\n", socket.c_str(),
                     std::strerror(connected.status().errnoValue()));
        return 1;
    }
    connected.value().reset();

    const char *old_path = std::getenv("LD_LIBRARY_PATH");
    std::string path = old_path != nullptr && *old_path != '\0' ? dir + ":" + old_path : dir;
    if (::setenv("LD_LIBRARY_PATH", path.c_str(), 1) < 0 || ::setenv("IBV_EXTEND_MODE", "broker", 1) < 0 ||
        ::setenv("IBV_EXTEND_SOCKET", socket.c_str(), 1) < 0) {
        std::fprintf(stderr, "ibv-extend-run: cannot set the environment: %s\n", std::strerror(errno));
        return 1;
    }
    ::execvp(argv[i], argv + i);
    int err = errno;
    std::fprintf(stderr, "ibv-extend-run: %s: %s\n", argv[i], std::strerror(err));
    // As env(1): 127 when the command is not there, 126 when it is but cannot run.
    return err == ENOENT || err == ENOTDIR ? 127 : 126;
}
