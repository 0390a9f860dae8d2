// ibv-extendd as a function, so main.cpp stays one line and tests can link the rest.
#pragma once

namespace ibvx::daemon {

// Parses the command line, loads drivers, serves until SIGTERM/SIGINT. Exit codes: 0 clean
// stop, 1 runtime failure (socket, drivers, gRPC), 2 usage or configuration error.
int runDaemon(int argc, char **argv);

}  // namespace ibvx::daemon
