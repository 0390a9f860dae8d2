// Until client/shared_pages.cpp lands: ordinary memory is refused (the interface's -EINVAL path).
#include <cerrno>

#include "client/shared_pages.h"

namespace ibvx::client {

int acquireShared(void *, size_t, SharedWindow *, std::string *why) {
    *why = "registering ordinary memory in broker mode is not built yet";
    return -EINVAL;
}
void releaseShared(void *, size_t) {}
size_t sharedPageCount() {
    return 0;
}

}  // namespace ibvx::client
