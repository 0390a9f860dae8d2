#include "providers/loader/datapath_loader.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>

#include "providers/loader/discovery.h"
#include "providers/loader/loader.h"

namespace ibvx::loader {
namespace {

const ibv_extend_datapath_ops *load(const std::string &provider) {
    if (!detail::validDriverName(provider)) {
        warn("no data path for driver '%s': not a valid driver name", provider.c_str());
        return nullptr;
    }
    const std::string file = "lib" + provider + "-verbs.so";
    std::string error;
    void *handle = nullptr;
    for (const std::string &path : {detail::providerDir() + "/" + file, file}) {
        dlerror();
        handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle != nullptr) {
            break;
        }
        const char *e = dlerror();
        error += (error.empty() ? "" : "; ") + std::string(e != nullptr ? e : path);
    }
    if (handle == nullptr) {
        warn("no data path for driver '%s' (%s): the standard data verbs answer EOPNOTSUPP", provider.c_str(),
             error.c_str());
        return nullptr;
    }
    auto *ops = static_cast<const ibv_extend_datapath_ops *>(dlsym(handle, IBV_EXTEND_DATAPATH_SYMBOL));
    if (ops == nullptr || ops->abi < IBV_EXTEND_DATAPATH_ABI_V1 || ops->provider == nullptr ||
        provider != ops->provider || ops->cq_open == nullptr || ops->qp_open == nullptr ||
        ops->poll_cq == nullptr || ops->post_send == nullptr || ops->post_recv == nullptr) {
        warn("%s does not export a usable %s for driver '%s'; ignored", file.c_str(),
             IBV_EXTEND_DATAPATH_SYMBOL, provider.c_str());
        return nullptr;  // the library stays loaded: unloading code a constructor ran is unsafe
    }
    return ops;
}

}  // namespace

const ibv_extend_datapath_ops *datapathFor(const std::string &provider) {
    static auto *mu = new std::mutex;
    static auto *cache = new std::map<std::string, const ibv_extend_datapath_ops *>;
    std::lock_guard lock(*mu);
    auto it = cache->find(provider);
    if (it == cache->end()) {
        it = cache->emplace(provider, load(provider)).first;
    }
    return it->second;
}

}  // namespace ibvx::loader
