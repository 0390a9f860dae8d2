// The broker program's entry point, apart from daemon.h: main.cpp needs only this, and daemon.h
// brings in the whole gRPC edge (seconds of every build's compile, half a minute under ASan).
#pragma once

namespace ibvx::daemon {

// Parses the command line, loads the configuration, sets up logging, detaches unless told not
// to, then Daemon::create() and run(). Exit codes: 0 clean stop, 1 runtime failure (socket,
// drivers, gRPC), 2 usage or configuration error.
int runDaemon(int argc, char **argv);

}  // namespace ibvx::daemon
