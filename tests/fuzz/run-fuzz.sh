#!/usr/bin/env bash
# `make fuzz`: configures a clang build with libFuzzer (IBVX_FUZZ, ASan+UBSan), builds every fuzz
# target and runs each for FUZZ_SECONDS over its checked-in corpus, then prints the executions
# per target. Inputs libFuzzer finds interesting go to <build>/fuzz-corpus/<name> (kept between
# runs), never into the checked-in corpus; crashes go to <build>/fuzz-artifacts/<name>/.
#
# Per target, tests/fuzz/<name>.dict is passed as a dictionary and tests/fuzz/<name>.options
# holds extra libFuzzer flags ('#' comments).
#
# Environment: FUZZ_SECONDS (default 60), FUZZ_BUILD (default build-fuzz),
# FUZZ_TARGETS (space-separated subset, default all), JOBS (build parallelism, default nproc).
set -euo pipefail

src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${FUZZ_BUILD:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-$(nproc)}
case $build in /*) ;; *) build=$src/$build ;; esac

# The tree builds warning-free with clang too, so warnings are errors here as in every build.
# Said explicitly: a build-fuzz configured by an older script has IBVX_WERROR=OFF in its cache.
CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++} cmake -S "$src" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIBVX_FUZZ=ON -DIBVX_ASAN=ON -DIBVX_WERROR=ON >/dev/null
cmake --build "$build" --target fuzzers -j "$jobs"

mapfile -t all < <(grep -v '^$' "$build/tests/fuzz/fuzz-targets.txt")
if [ -n "${FUZZ_TARGETS:-}" ]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  targets=("${all[@]}")
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

declare -A execs result
failed=0
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_${t}_libfuzzer
  if [ ! -x "$bin" ]; then
    echo "run-fuzz: no fuzz target '$t' (have: ${all[*]})" >&2
    exit 2
  fi
  work=$build/fuzz-corpus/$t
  artifacts=$build/fuzz-artifacts/$t
  log=$build/fuzz-logs/$t.log
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  args=(-max_total_time="$seconds" -print_final_stats=1 -timeout=10 -artifact_prefix="$artifacts/")
  if [ -f "$src/tests/fuzz/$t.dict" ]; then
    args+=(-dict="$src/tests/fuzz/$t.dict")
  fi
  if [ -f "$src/tests/fuzz/$t.options" ]; then
    read -r -a extra <<<"$(sed 's/#.*//' "$src/tests/fuzz/$t.options" | tr '\n' ' ')"
    args+=("${extra[@]}")
  fi
  echo "== fuzzing $t for ${seconds}s (log: $log)"
  set +e
  # The first directory receives new inputs; the checked-in corpus is only read.
  "$bin" "${args[@]}" "$work" "$src/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs[$t]=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ "$rc" -eq 0 ]; then
    result[$t]=ok
  else
    result[$t]="FAILED (exit $rc): $(ls -t "$artifacts" 2>/dev/null | head -n 1 | sed "s|^|$artifacts/|")"
    failed=1
    tail -n 40 "$log" >&2
  fi
done

echo
printf '%-24s %14s  %s\n' target executions result
for t in "${targets[@]}"; do
  printf '%-24s %14s  %s\n' "$t" "${execs[$t]:-?}" "${result[$t]}"
done
exit $failed
