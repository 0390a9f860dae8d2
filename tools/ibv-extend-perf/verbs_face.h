// The libibverbs face loaded into this tool beside the system libibverbs, for the scenarios that
// run the standard verbs on broker objects (the verbs and fork sections).
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <string>

#include <infiniband/verbs.h>

#include "tools/ibv-extend-perf/broker_queues.h"

namespace ibvx::perf {

// The face (lib/ibv_extend/verbs/libibverbs.so.1), loaded beside the system libibverbs this tool
// links: its verbs run on this process's broker session (libibv_extend.so is shared), and
// ibv_post_send/ibv_poll_cq are <infiniband/verbs.h> inlines over the context's ops, so they reach
// the face's data path (libsoftnda-verbs.so) exactly as in an unmodified program.
struct Face {
    void *handle = nullptr;
    ibv_device **(*get_device_list)(int *) = nullptr;
    void (*free_device_list)(ibv_device **) = nullptr;
    ibv_context *(*open_device)(ibv_device *) = nullptr;
    int (*close_device)(ibv_context *) = nullptr;
    ibv_pd *(*alloc_pd)(ibv_context *) = nullptr;
    int (*dealloc_pd)(ibv_pd *) = nullptr;
    ibv_mr *(*reg_mr)(ibv_pd *, void *, size_t, int) = nullptr;
    int (*dereg_mr)(ibv_mr *) = nullptr;
    ibv_cq *(*create_cq)(ibv_context *, int, void *, ibv_comp_channel *, int) = nullptr;
    int (*destroy_cq)(ibv_cq *) = nullptr;
    ibv_qp *(*create_qp)(ibv_pd *, ibv_qp_init_attr *) = nullptr;
    int (*destroy_qp)(ibv_qp *) = nullptr;
    int (*modify_qp)(ibv_qp *, ibv_qp_attr *, int) = nullptr;

    static std::string path() {
        // Installed beside bin/ (lib/ibv_extend/verbs), or the build tree's.
        char exe[4096];
        ssize_t n = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        std::string dir = n > 0 ? std::string(exe, static_cast<size_t>(n)) : "";
        dir = dir.substr(0, dir.rfind('/'));
        std::string installed = dir + "/../lib/ibv_extend/verbs/libibverbs.so.1";
        return ::access(installed.c_str(), R_OK) == 0 ? installed
                                                      : std::string(IBVX_PERF_VERBS_DIR "/libibverbs.so.1");
    }
    Face() {
        handle = ::dlopen(path().c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
            queueError((std::string("dlopen of the libibverbs face: ") + ::dlerror()).c_str());
        }
        bind(get_device_list, "ibv_get_device_list");
        bind(free_device_list, "ibv_free_device_list");
        bind(open_device, "ibv_open_device");
        bind(close_device, "ibv_close_device");
        bind(alloc_pd, "ibv_alloc_pd");
        bind(dealloc_pd, "ibv_dealloc_pd");
        bind(reg_mr, "ibv_reg_mr");
        bind(dereg_mr, "ibv_dereg_mr");
        bind(create_cq, "ibv_create_cq");
        bind(destroy_cq, "ibv_destroy_cq");
        bind(create_qp, "ibv_create_qp");
        bind(destroy_qp, "ibv_destroy_qp");
        bind(modify_qp, "ibv_modify_qp");
    }
    // The named device opened through the face; nullptr when it is not listed or will not open.
    ibv_context *openDevice(const std::string &name) const {
        int n = 0;
        ibv_device **list = get_device_list(&n);
        ibv_context *ctx = nullptr;
        for (int i = 0; list != nullptr && i < n && ctx == nullptr; ++i) {
            if (name == list[i]->name) {
                ctx = open_device(list[i]);
            }
        }
        if (list != nullptr) {
            free_device_list(list);
        }
        return ctx;
    }
    template <typename F>
    void bind(F &fn, const char *name) {
        fn = reinterpret_cast<F>(::dlsym(handle, name));
        if (fn == nullptr) {
            queueError((std::string("the face lacks ") + name).c_str());
        }
    }
};

}  // namespace ibvx::perf
