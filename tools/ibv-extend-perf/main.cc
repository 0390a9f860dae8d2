// ibv-extend-perf: runs the scenarios, prints a table, optionally writes the JSON results.
#include <sched.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>

#include <exception>
#include <fstream>
#include <iostream>

#include "tools/ibv-extend-perf/scenarios.h"

int main(int argc, char **argv) {
    CLI::App app{"ibv-extend-perf: fast-path figures of ibv-extend next to their floors"};
    ibvx::perf::Options opt;
    std::string json_path;
    app.add_flag("--quick", opt.quick, "seconds-long smoke run (figures not meaningful)");
    app.add_option("--json", json_path, "write the results as one JSON object to FILE");
    app.add_option("--engine-threads", opt.engine_threads, "softnda engine threads")
        ->check(CLI::Range(1, 64));
    app.add_option("--only", opt.only,
                   "run only these scenarios (pingpong, memcpy, write8, idle10k, msgrate, write1m)")
        ->check(CLI::IsMember({"pingpong", "memcpy", "write8", "idle10k", "msgrate", "write1m"}));
    int fifo = 0;
    app.add_option("--sched-fifo", fifo,
                   "run under SCHED_FIFO at this priority (threads inherit it), so a loaded machine "
                   "does not deschedule the spinning threads mid-measurement")
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

    ibvx::perf::Results results;
    try {
        ibvx::perf::runFloors(opt, results);
        ibvx::perf::runSoftndaDirect(opt, results);
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
    return 0;
}
