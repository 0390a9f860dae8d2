// ibv-extendctl: subcommands over ibv_extend.v1.Admin (status, drivers, sessions, objects,
// stats, metrics, evict, reload, restart, watch) and devinfo over ibv_extend.v1.Broker for tenants.
#pragma once

namespace ibvx::ctl {

// Exit codes (documented in docs/ibv-extendctl.md and the man page).
enum Exit : int {
    kExitOk = 0,
    kExitFailed = 1,       // the broker refused or failed the operation
    kExitUsage = 2,        // bad command line
    kExitUnreachable = 3,  // no broker answers on the socket
    kExitDenied = 4,       // not root / not in the admin group, or no access to the socket
    kExitVersion = 5,      // the broker speaks another protocol version
};

int run(int argc, char **argv);

}  // namespace ibvx::ctl
