#!/usr/bin/env bash
# make demo: runs the end-to-end demo against a build tree.
set -euo pipefail
build=${1:-build}
echo "demo: nothing to run yet" >&2
exit 1
