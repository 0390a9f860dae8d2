#!/usr/bin/env bash
# make bench: the full ibv-extend-perf run (minutes). Writes bench/results.json (the tool's JSON,
# stable keys) and regenerates docs/BENCHMARKS.md from bench/BENCHMARKS.md.in with the figures,
# the targets and the exact command that produced them.
#   bench/run.sh [BUILD_DIR] [extra ibv-extend-perf flags...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_arg=${1:-build}
build=$build_arg
shift || true
[[ $build = /* ]] || build="$root/$build"
perf="$build/tools/ibv-extend-perf/ibv-extend-perf"
[[ -x $perf ]] || { echo "bench: $perf not built (make build)" >&2; exit 1; }

args=(--json "$root/bench/results.json")
# On a shared machine the spinning threads are descheduled mid-measurement unless they run
# SCHED_FIFO (root only); without it the in-process figures are noise.
if [[ $(id -u) = 0 ]]; then args+=(--sched-fifo 10); fi
args+=("$@")
tmp=$(mktemp -d /tmp/ibvx-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "bench: ibv-extend-perf ${args[*]}" >&2
"$perf" "${args[@]}" --markdown "$tmp/table.md" | tee "$tmp/table.txt"

# Debian's perftest through the broker, next to our figures: ib_write_lat and ib_write_bw as
# server and client on this host, each through ibv-extend-run (the libibverbs face).
run_perftest() {
  local daemon="$build/daemon/ibv-extendd" run="$build/tools/ibv-extend-run/ibv-extend-run"
  local sock="$tmp/broker.sock" port=18515
  "$daemon" --socket "$sock" --foreground --log-level warn >"$tmp/broker.log" 2>&1 &
  local broker=$!
  for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
  for t in ib_write_lat ib_write_bw; do
    port=$((port + 1))
    "$run" --socket "$sock" -- "$t" -d softnda0 -p "$port" >"$tmp/$t.server" 2>&1 &
    local server=$!
    for _ in $(seq 50); do
      if "$run" --socket "$sock" -- "$t" -d softnda0 -p "$port" localhost >"$tmp/$t.client" 2>&1; then break; fi
      sleep 0.1
    done
    wait "$server" || true
    echo "$t -d softnda0 (server) + $t -d softnda0 localhost (client), each via ibv-extend-run:" >>"$tmp/perftest.txt"
    grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$tmp/$t.client" >>"$tmp/perftest.txt" || echo "  (failed: see its output)" >>"$tmp/perftest.txt"
    echo >>"$tmp/perftest.txt"
  done
  kill "$broker" 2>/dev/null; wait "$broker" 2>/dev/null || true
}
: >"$tmp/perftest.txt"
if command -v ib_write_lat >/dev/null; then run_perftest; fi
cat "$tmp/perftest.txt"

python3 - "$root" "$tmp/table.md" "ibv-extend-perf ${args[*]/#$root\//}" "$build_arg" "$tmp/perftest.txt" <<'PY'
import json, sys
root, table, cmd, build_arg, perftest = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
r = json.load(open(f"{root}/bench/results.json"))
def get(k):
    s, key = k.split(".", 1)
    return r.get(s, {}).get(key)
targets = [
    ("fastpath.fastpath_ratio_broker_over_direct", "within 1.00 +- 0.05", lambda v: abs(v - 1) <= 0.05),
    ("fastpath.broker_rpcs_during_fastpath", "= 0", lambda v: v == 0),
    ("fastpath.client_syscalls_per_wr", "= 0", lambda v: v == 0),
    ("fastpath.write8_over_shm_floor", "<= 10", lambda v: v <= 10),
    ("fastpath.msg_rate_mwrs", ">= 5", lambda v: v >= 5),
    ("fastpath.write1m_over_memcpy", ">= 0.8", lambda v: v >= 0.8),
    ("verbs.verbs_over_helpers_ratio", "<= 1.10", lambda v: v <= 1.10),
    ("verbs.verbs_over_helpers_rate", ">= 0.8", lambda v: v >= 0.8),
    ("middleware.ucx_put_lat_over_helpers", "<= 1.3", lambda v: v <= 1.3),
    ("fastpath.roce_write64k_over_udp_blast", ">= 0.7", lambda v: v >= 0.7),
    ("fastpath.roce_write8_lat_over_udp_pingpong", "<= 1.5", lambda v: v <= 1.5),
    ("fastpath.roce_send8_lat_over_udp_pingpong", "<= 1.5", lambda v: v <= 1.5),
    ("middleware.ucx_put_bw_over_helpers", ">= 0.8", lambda v: v >= 0.8),
    ("verbs.verbs_syscalls_per_wr", "= 0", lambda v: v == 0),
    ("verbs.verbs_broker_rpcs_during_data", "= 0", lambda v: v == 0),
    ("control.create_qp_over_null_rpc", "<= 1.1", lambda v: v <= 1.1),
    ("control.ops_over_null_rpc_32clients", ">= 0.95", lambda v: v >= 0.95),
    ("control.broker_cpu_op_over_null_rpc_32clients", "<= 1.5", lambda v: v <= 1.5),
    ("control.bringup_over_null_rpc", "<= 4", lambda v: v <= 4),
    ("control.ops_per_s_32clients", ">= 20000", lambda v: v >= 20000),
    ("control.p99_us_32clients", "<= 2000", lambda v: v <= 2000),
    ("scale.live_qps", ">= 100000", lambda v: v >= 100000),
    ("scale.sessions", ">= 1000", lambda v: v >= 1000),
    ("scale.broker_bytes_per_qp", "<= 2048", lambda v: v <= 2048),
    ("scale.teardown_10k_ms", "<= 100", lambda v: v <= 100),
    ("scale.reclaim_after_kill_ms", "<= 50", lambda v: v <= 50),
    ("restart.restart_stall_ms_max", "<= 100", lambda v: v <= 100),
    ("restart.restart_restore_ms", "<= 50", lambda v: v <= 50),
]
lines = ["| target | goal | measured | holds |", "|---|---|---:|---|"]
for k, goal, ok in targets:
    v = get(k)
    lines.append(f"| `{k}` | {goal} | {'-' if v is None else f'{v:.3f}'} | "
                 f"{'not measured' if v is None else ('yes' if ok(v) else '**no**')} |")
m = r.get("machine", {})
figures = (f"Measured {m.get('date', '?')} at commit `{m.get('git_commit', '?')}` on "
           f"{m.get('cores', '?')} cores ({m.get('cpu', '?')}, kernel {m.get('kernel', '?')}), with:\n\n"
           f"```sh\nbash bench/run.sh {build_arg}   # what `make bench` runs (BUILD=build); it runs:\n{cmd}\n```\n\n"
           "### Targets\n\n" + "\n".join(lines) + "\n\n### Every figure\n\n" + open(table).read() +
           "\n### Debian's perftest through the broker\n\n```\n" + (open(perftest).read().strip() or "not run: perftest missing") +
           "\n```\n")
doc = open(f"{root}/bench/BENCHMARKS.md.in").read().replace("@FIGURES@", figures)
open(f"{root}/docs/BENCHMARKS.md", "w").write(doc)
PY
echo "bench: wrote bench/results.json and docs/BENCHMARKS.md" >&2
