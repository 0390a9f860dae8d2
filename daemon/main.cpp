#include "daemon/app/daemon.h"

int main(int argc, char **argv) {
    return ibvx::daemon::runDaemon(argc, argv);
}
