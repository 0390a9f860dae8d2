// ibv-extend-perf: runs the scenarios, prints a table, optionally writes the JSON results.
// `--worker ...` (internal) runs one tenant process of the brokered scenarios instead.
#include <sched.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>

#include <exception>
#include <fstream>
#include <iostream>

#include "tools/ibv-extend-perf/scenarios.h"
#include "tools/ibv-extend-perf/workers.h"

int main(int argc, char **argv) {
    if (argc >= 2 && std::strcmp(argv[1], "--worker") == 0) {
        return ibvx::perf::workerMain(std::vector<std::string>(argv + 2, argv + argc));
    }
    CLI::App app{
        "ibv-extend-perf: fast-path, control-path and scale figures of ibv-extend next to their floors"};
    ibvx::perf::Options opt;
    std::string json_path;
    app.add_flag("--quick", opt.quick, "seconds-long smoke run (figures not meaningful)");
    app.add_option("--json", json_path, "write the results as one JSON object to FILE");
    std::string md_path;
    app.add_option("--markdown", md_path, "also write the table as Markdown to FILE");
    app.add_option("--engine-threads", opt.engine_threads, "softnda engine threads (direct and broker)")
        ->check(CLI::Range(1, 64));
    app.add_option("--only", opt.only, "run only these scenarios")
        ->check(CLI::IsMember({"pingpong",   "memcpy",  "uds",     "write8",       "unreliable", "idle10k",
                               "msgrate",    "write1m", "nullrpc", "write8broker", "verbs",      "createqp",
                               "bringup",    "clients", "reclaim", "teardown",     "scale",      "restart",
                               "middleware", "fork",    "udp",     "roce"}));
    app.add_option("--daemon", opt.daemon,
                   "ibv-extendd to start (default: next to this tool, or the build tree's)");
    app.add_option("--socket", opt.socket,
                   "use the broker already serving this socket instead of starting one");
    app.add_option("--clients", opt.clients, "tenant processes of the concurrency scenario")
        ->check(CLI::Range(1, 1024));
    app.add_option("--scale-sessions", opt.scale_sessions, "tenant processes of the scale scenario")
        ->check(CLI::Range(1, 4000));
    app.add_option("--scale-qps", opt.scale_qps, "live QPs of the scale scenario, over all sessions")
        ->check(CLI::Range(1, 1000000));
    int fifo = 0;
    app.add_option(
           "--sched-fifo", fifo,
           "run under SCHED_FIFO at this priority (this tool's threads and the started broker's "
           "softnda engine threads; the broker's other threads and tenant processes run SCHED_OTHER), "
           "so a loaded machine does not deschedule the spinning threads mid-measurement")
        ->check(CLI::Range(1, 99));
    CLI11_PARSE(app, argc, argv);
    if (fifo > 0) {
        sched_param sp{};
        sp.sched_priority = fifo;
        if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0) {
            std::cerr << "ibv-extend-perf: --sched-fifo: " << std::strerror(errno)
                      << " (needs CAP_SYS_NICE)\n";
            return 1;
        }
    }
    ::signal(SIGPIPE, SIG_IGN);

    ibvx::perf::Results results;
    try {
        ibvx::perf::runFloors(opt, results);
        ibvx::perf::runFloorsUds(opt, results);
        ibvx::perf::runSoftndaDirect(opt, results);
        ibvx::perf::runControlDirect(opt, results);
        ibvx::perf::runBrokered(opt, results);
        ibvx::perf::runRoce(opt, results);
    } catch (const std::exception &e) {
        std::cerr << "ibv-extend-perf: " << e.what() << "\n";
        return 1;
    }
    ibvx::perf::collectMachine(results);
    results.printTable(std::cout);
    if (!json_path.empty()) {
        std::ofstream f(json_path);
        f << results.toJson().dump(2) << "\n";
        if (!f) {
            std::cerr << "ibv-extend-perf: cannot write " << json_path << "\n";
            return 1;
        }
    }
    if (!md_path.empty()) {
        std::ofstream f(md_path);
        results.printMarkdown(f);
        if (!f) {
            std::cerr << "ibv-extend-perf: cannot write " << md_path << "\n";
            return 1;
        }
    }
    return 0;
}
