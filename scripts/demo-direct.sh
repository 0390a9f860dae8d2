#!/usr/bin/env bash
# The direct-mode example against a build tree ($1, default "build"); part of make demo.
#
# Direct mode: ibvx-direct-example opens a virtual device in-process, creates a CQ and a QP with
# queue memory from ibvx_alloc_buf() and prints the queue_info a device kernel would drive.
# Drivers come from the build tree: softnda when it is built, else the test virtual device.
set -euo pipefail

build=${1:-build}
build=$(cd "$build" && pwd)
example=$build/tools/examples/ibvx-direct-example
test_vdev=$build/tests/drivers-out/libibvxtest_vdev.so

if [ ! -x "$example" ]; then
  echo "demo: $example is missing; build first (make build)" >&2
  exit 1
fi

drivers=()
[ -f "$build/providers-out/libsoftnda.so" ] && drivers+=(softnda)
[ -f "$test_vdev" ] && drivers+=("$test_vdev")
if [ ${#drivers[@]} -eq 0 ]; then
  echo "demo: no virtual-device driver in $build (neither softnda nor the test vdev)" >&2
  exit 1
fi

# Only the build tree's drivers, never the host's /etc/libibverbs_extend.d.
no_config=$(mktemp -d /tmp/ibvx-demo.XXXXXX)
trap 'rm -rf "$no_config"' EXIT

export IBV_EXTEND_MODE=direct
export IBV_EXTEND_PROVIDER_DIR=$build/providers-out
export IBV_EXTEND_CONFIG_DIR=$no_config
export IBV_EXTEND_DRIVERS
IBV_EXTEND_DRIVERS=$(IFS=:; echo "${drivers[*]}")
export IBV_EXTEND_SHOW_WARNINGS=1

echo "== direct mode: IBV_EXTEND_DRIVERS=$IBV_EXTEND_DRIVERS"
"$example"
echo "== demo passed"
