#include "providers/loader/discovery.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#ifndef IBVX_DEFAULT_CONFIG_DIR
#error "IBVX_DEFAULT_CONFIG_DIR must come from the build (CMake cache IBVX_CONFIG_DIR)"
#endif
#ifndef IBVX_DEFAULT_PROVIDER_DIR
#error "IBVX_DEFAULT_PROVIDER_DIR must come from the build (CMake cache IBVX_PROVIDER_DIR)"
#endif
#ifndef IBVX_PREFIX_PROVIDER_DIR
#error "IBVX_PREFIX_PROVIDER_DIR must come from the build (the provider dir relative to the prefix, or empty)"
#endif
#ifndef IBVX_BUILD_DIR
#error "IBVX_BUILD_DIR must come from the build (PROJECT_BINARY_DIR)"
#endif

namespace ibvx::loader::detail {
namespace {

// Config files are a few lines; anything larger is not ours.
constexpr size_t kConfigFileMax = 64 * 1024;

class Fd {
  public:
    explicit Fd(int fd) : fd_(fd) {}
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    ~Fd() {
        if (fd_ >= 0) {
            close(fd_);
        }
    }
    int get() const { return fd_; }

  private:
    int fd_;
};

class Dir {
  public:
    explicit Dir(DIR *d) : d_(d) {}
    Dir(const Dir &) = delete;
    Dir &operator=(const Dir &) = delete;
    ~Dir() {
        if (d_ != nullptr) {
            closedir(d_);
        }
    }
    DIR *get() const { return d_; }

  private:
    DIR *d_;
};

std::string_view trim(std::string_view s) {
    const char *ws = " \t\r\n\v\f";
    size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) {
        return {};
    }
    size_t e = s.find_last_not_of(ws);
    return s.substr(b, e - b + 1);
}

std::string realPath(const std::string &path) {
    char *real = realpath(path.c_str(), nullptr);
    if (real == nullptr) {
        return path;
    }
    std::string out(real);
    free(real);
    return out;
}

// The file this loader's code runs from: the shared object it is linked into (dladdr of itself,
// e.g. libibv_extend.so), or the executable when it is linked into one (the main program's link
// map has an empty name). No environment variable takes part, so it holds for setuid programs.
std::string selfPath() {
    Dl_info info{};
    link_map *map = nullptr;
    if (dladdr1(reinterpret_cast<void *>(&selfPath), &info, reinterpret_cast<void **>(&map),
                RTLD_DL_LINKMAP) != 0 &&
        map != nullptr && map->l_name != nullptr && map->l_name[0] != '\0') {
        return realPath(map->l_name);
    }
    return realPath("/proc/self/exe");
}

bool isDirectory(const std::string &path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string envOr(const char *var, const std::string &fallback) {
    if (environmentTrusted()) {
        const char *v = getenv(var);
        if (v != nullptr && v[0] != '\0') {
            return v;
        }
    }
    return fallback;
}

// Reads a config file we already decided to trust, re-checking through the opened fd that it is
// still the regular file lstat() saw (the name could have been swapped in between).
bool readTrustedFile(const std::string &path, const struct stat &seen, std::string *text) {
    Fd fd(open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (fd.get() < 0) {
        warn("cannot open config file %s: %s", path.c_str(), strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fd.get(), &st) < 0 || st.st_ino != seen.st_ino || st.st_dev != seen.st_dev ||
        !S_ISREG(st.st_mode) || st.st_uid != seen.st_uid) {
        warn("config file %s changed while being read; skipped", path.c_str());
        return false;
    }
    if (static_cast<size_t>(st.st_size) > kConfigFileMax) {
        warn("config file %s is larger than %zu bytes; skipped", path.c_str(), kConfigFileMax);
        return false;
    }
    text->assign(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    while (got < text->size()) {
        ssize_t n = read(fd.get(), text->data() + got, text->size() - got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            warn("cannot read config file %s: %s", path.c_str(), strerror(errno));
            return false;
        }
        if (n == 0) {
            break;
        }
        got += static_cast<size_t>(n);
    }
    text->resize(got);
    return true;
}

}  // namespace

bool environmentTrusted() {
    return getuid() == geteuid();
}

std::string configDir() {
    return envOr("IBV_EXTEND_CONFIG_DIR", IBVX_DEFAULT_CONFIG_DIR);
}

std::string defaultProviderDir(const std::string &self) {
    // Compared as real paths: the build dir may be reached through a symlink.
    static const std::string build = realPath(IBVX_BUILD_DIR);
    if (self.size() > build.size() && self.compare(0, build.size(), build) == 0 &&
        self[build.size()] == '/') {
        return std::string(IBVX_BUILD_DIR) + "/providers-out";
    }
    if (IBVX_PREFIX_PROVIDER_DIR[0] != '\0') {
        if (std::optional<std::string> prefix = installPrefixOf(self)) {
            std::string dir = *prefix + "/" + IBVX_PREFIX_PROVIDER_DIR;
            if (isDirectory(dir)) {
                return dir;
            }
        }
    }
    return IBVX_DEFAULT_PROVIDER_DIR;
}

std::optional<std::string> installPrefixOf(const std::string &self) {
    size_t file = self.rfind('/');
    if (file == std::string::npos || file == 0) {
        return std::nullopt;
    }
    size_t dir = self.rfind('/', file - 1);
    if (dir == std::string::npos) {
        return std::nullopt;
    }
    std::string_view leaf = std::string_view(self).substr(dir + 1, file - dir - 1);
    if (leaf != "bin" && leaf != "sbin" && leaf != "lib") {
        return std::nullopt;
    }
    return self.substr(0, dir);
}

std::string providerDir() {
    // Where the code runs from does not change: decided once.
    static const std::string fallback = defaultProviderDir(selfPath());
    return envOr("IBV_EXTEND_PROVIDER_DIR", fallback);
}

bool validDriverName(std::string_view name) {
    if (name.empty() || name.size() > kDriverNameMax) {
        return false;
    }
    return std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
               c == '-';
    });
}

void parseConfig(std::string_view text, const std::string &source, std::vector<ConfigName> *out) {
    size_t line_no = 0;
    while (!text.empty()) {
        size_t nl = text.find('\n');
        std::string_view line = trim(text.substr(0, nl));
        text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
        ++line_no;
        if (line.empty() || line.front() == '#') {
            continue;
        }
        size_t ws = line.find_first_of(" \t");
        std::string_view keyword = line.substr(0, ws);
        std::string_view value = ws == std::string_view::npos ? std::string_view{} : trim(line.substr(ws));
        std::string where = source + ":" + std::to_string(line_no);
        if (keyword != "driver") {
            warn("%s: unknown directive '%.*s' ignored", where.c_str(), static_cast<int>(keyword.size()),
                 keyword.data());
            continue;
        }
        if (value.empty()) {
            warn("%s: 'driver' needs a name; line ignored", where.c_str());
            continue;
        }
        if (value.size() > kDriverNameMax) {
            warn("%s: driver name longer than %zu characters ignored", where.c_str(), kDriverNameMax);
            continue;
        }
        if (!validDriverName(value)) {
            warn("%s: driver name '%.*s' may only use [A-Za-z0-9_-]; ignored", where.c_str(),
                 static_cast<int>(value.size()), value.data());
            continue;
        }
        out->push_back({std::string(value), where});
    }
}

std::vector<ConfigName> readConfigDir(const std::string &dir) {
    std::vector<ConfigName> names;
    Dir d(opendir(dir.c_str()));
    if (d.get() == nullptr) {
        if (errno != ENOENT) {
            warn("cannot read config dir %s: %s", dir.c_str(), strerror(errno));
        }
        return names;
    }
    std::vector<std::string> entries;
    while (struct dirent *e = readdir(d.get())) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            entries.emplace_back(e->d_name);
        }
    }
    std::sort(entries.begin(), entries.end());
    for (const std::string &entry : entries) {
        std::string path = dir + "/" + entry;
        struct stat st;
        if (lstat(path.c_str(), &st) < 0) {
            warn("cannot stat config file %s: %s", path.c_str(), strerror(errno));
            continue;
        }
        if (S_ISLNK(st.st_mode)) {
            warn("config file %s is a symlink; skipped", path.c_str());
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            continue;
        }
        if (st.st_uid != 0 && st.st_uid != getuid()) {
            warn("config file %s is owned by uid %u, neither root nor the caller; skipped", path.c_str(),
                 static_cast<unsigned>(st.st_uid));
            continue;
        }
        std::string text;
        if (readTrustedFile(path, st, &text)) {
            parseConfig(text, path, &names);
        }
    }
    return names;
}

std::vector<std::string> splitDriverList(std::string_view list) {
    std::vector<std::string> out;
    while (!list.empty()) {
        size_t sep = list.find_first_of(":;");
        std::string_view item = list.substr(0, sep);
        if (!item.empty()) {
            out.emplace_back(item);
        }
        if (sep == std::string_view::npos) {
            break;
        }
        list.remove_prefix(sep + 1);
    }
    return out;
}

LoadRecord loadDriverLibrary(const std::string &name, const std::string &source) {
    LoadRecord rec;
    rec.name = name;
    rec.source = source;
    auto tryOpen = [&rec](const std::string &path) {
        rec.path = path;
        dlerror();
        if (dlopen(path.c_str(), RTLD_NOW) != nullptr) {
            rec.loaded = true;
            rec.error.clear();
            return true;
        }
        const char *err = dlerror();
        if (!rec.error.empty()) {
            rec.error += "; ";
        }
        rec.error += err != nullptr ? err : (path + ": dlopen failed");
        return false;
    };

    if (!name.empty() && name.front() == '/') {
        if (name.find("..") != std::string::npos) {
            rec.error = "path contains '..'";
        } else {
            tryOpen(name);
        }
    } else if (!validDriverName(name)) {
        rec.error = "driver name may only use [A-Za-z0-9_-] (at most 128)";
    } else if (!tryOpen(providerDir() + "/lib" + name + ".so")) {
        tryOpen("lib" + name + ".so");
    }
    if (!rec.loaded) {
        warn("couldn't load driver '%s' (from %s): %s", name.c_str(), source.c_str(), rec.error.c_str());
    }
    return rec;
}

}  // namespace ibvx::loader::detail

namespace ibvx::loader {

LoadRecord loadDriver(const std::string &name, const std::string &origin) {
    return detail::loadDriverLibrary(name, origin);
}

}  // namespace ibvx::loader
