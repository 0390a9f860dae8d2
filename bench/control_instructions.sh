#!/usr/bin/env bash
# Broker instructions per control call, counted by callgrind (docs/BENCHMARKS.md, "Where a
# mutating call's broker CPU goes"). Instruction counts do not move with the load of a shared
# machine, unlike the CPU times ibv-extend-perf reports, so this is how the broker's cost per
# call is broken down and each cut is measured.
#
#   bench/control_instructions.sh [BUILD_DIR] [MS] [LOG_LEVEL] [HELD]
#
# Starts ibv-extendd under `valgrind --tool=callgrind` (softnda, the benchmark's config), runs one
# ibv-extend-perf churn worker for MS ms (default 4000) doing null RPCs (grpc Health/Check), then
# one doing CreateQp/DestroyQp, zeroes the counters before and dumps them after each loop, and
# prints instructions per call of both, their ratio, and the inclusive top of the mutating run
# (per call). LOG_LEVEL is the broker's (default warn, as the benchmark runs it; info adds the
# audit lines). HELD (default 0): the mutating loop's session holds that many other QPs, made
# before the loop, so the figure is what a call costs in a session of that size. IBVX_DAEMON
# names another ibv-extendd to measure (another build's, for a before/after) with this build's
# tool and providers. Files stay in the printed directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-build}
[[ $build = /* ]] || build="$root/$build"
ms=${2:-4000}
level=${3:-warn}
held=${4:-0}
daemon=${IBVX_DAEMON:-$build/daemon/ibv-extendd}
perf="$build/tools/ibv-extend-perf/ibv-extend-perf"
for b in "$daemon" "$perf"; do [[ -x $b ]] || { echo "$b not built" >&2; exit 1; }; done
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ibvx-instr.XXXXXX)
sock="$tmp/b.sock"
printf '[broker]\nlog_level = "%s"\nattach_timeout_ms = 60000\n\n[softnda]\nengine_threads = 1\n' "$level" \
  >"$tmp/ibv-extendd.toml"
export IBV_EXTEND_PROVIDER_DIR=${IBV_EXTEND_PROVIDER_DIR:-$build/providers-out}
valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.%p" --dump-instr=no \
  "$daemon" --socket "$sock" --foreground --config "$tmp/ibv-extendd.toml" >"$tmp/broker.log" 2>&1 &
vg=$!
trap 'kill $vg 2>/dev/null || true; wait $vg 2>/dev/null || true' EXIT
for _ in $(seq 600); do [[ -S $sock ]] && break; sleep 0.1; done
[[ -S $sock ]] || { echo "the broker did not start (see $tmp/broker.log)" >&2; exit 1; }

# One loop: zero, run, dump; prints "<instructions> <calls>".
measure() {
  local name=$1 extra=${2:-}
  local samples="$tmp/$name.samples"
  coproc W { IBV_EXTEND_SOCKET=$sock exec "$perf" --worker churn "$ms" "$samples" $extra; }
  local c pid=$W_PID
  IFS= read -r -n1 c <&"${W[0]}"
  [[ $c = R ]] || { echo "$name worker did not start" >&2; exit 1; }
  callgrind_control -z $vg >/dev/null 2>&1
  printf G >&"${W[1]}"
  IFS= read -r -n1 c <&"${W[0]}"
  [[ $c = D ]] || { echo "$name worker failed" >&2; exit 1; }
  callgrind_control -d "$name" $vg >/dev/null 2>&1
  wait "$pid" || true
  local dump
  dump=$(ls -t "$tmp"/cg.*."$name"* 2>/dev/null | head -1 || true)
  [[ -n $dump ]] || dump=$(ls -t "$tmp"/cg.* | head -1)
  cp "$dump" "$tmp/$name.cg"
  local ir calls
  ir=$(awk '/^summary:|^totals:/ {print $2; exit}' "$tmp/$name.cg")
  # The samples file holds one u64 per call plus the loop's CPU time.
  calls=$(($(stat -c %s "$samples") / 8 - 1))
  echo "$ir $calls"
}

read -r null_ir null_calls < <(measure null null)
ops_extra=
[[ $held = 0 ]] || ops_extra="held $held"
read -r op_ir op_calls < <(measure ops "$ops_extra")
awk -v a="$null_ir" -v b="$null_calls" -v c="$op_ir" -v d="$op_calls" -v lvl="$level" -v held="$held" 'BEGIN {
  printf "broker log level %s, %s other QPs held by the mutating session\n", lvl, held
  printf "null RPC:            %10.0f instructions/call (%d calls)\n", a / b, b
  printf "CreateQp/DestroyQp:  %10.0f instructions/call (%d calls)\n", c / d, d
  printf "ratio:               %10.2f\n", (c / d) / (a / b)
}'
echo "inclusive, per mutating call (callgrind_annotate $tmp/ops.cg):"
callgrind_annotate --inclusive=yes "$tmp/ops.cg" 2>/dev/null |
  awk -v n="$op_calls" '/^[ ]*[0-9,]+ / && NR > 20 { v = $1; gsub(",", "", v); $1 = ""; printf "%10.0f %s\n", v / n, substr($0, 1, 160) }' |
  head -${TOP:-60}
echo "files: $tmp"
