#!/usr/bin/env bash
# Runs systemd-analyze verify on the units and fails on any diagnostic about them (verify exits 0
# on some warnings, so its output is checked too).
set -uo pipefail
analyze=$1
dir=$2
out=$(cd "$dir" && SYSTEMD_LOG_LEVEL=warning "$analyze" verify --man=no ./ibv-extendd.socket ./ibv-extendd.service 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  exit $rc
fi
if echo "$out" | grep -E "ibv-extendd\.(service|socket)" >/dev/null; then
  echo "verify-units: diagnostics above concern our units" >&2
  exit 1
fi
echo "verify-units: ibv-extendd.service and ibv-extendd.socket verified"
