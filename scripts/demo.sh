#!/usr/bin/env bash
# make demo: the end-to-end demo against a build tree ($1, default "build").
#   1. brokered (the main job): ibv-extendd on a temporary socket with the embedded softnda NIC,
#      two tenant processes creating queues through it and moving data on the fast path only;
#   2. direct mode: the same library running the extension driver in-process, as the
#      reference does;
#   3. two hosts (root only, else skipped with a message): two network namespaces, a broker in
#      each with softnda bound to a veth, ibv_rc_pingpong -g 1 between them over RoCEv2.
# Exit 0 only when every step that ran verified everything.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}

echo "==== ibv-extend demo 1/3: brokered (ibv-extendd + softnda0, two tenants)"
bash "$here/demo-broker.sh" "$build"
echo
echo "==== ibv-extend demo 2/3: direct mode (driver in-process)"
bash "$here/demo-direct.sh" "$build"
echo
echo "==== ibv-extend demo 3/3: two hosts (two network namespaces, a broker each, RoCEv2 between them)"
bash "$here/demo-twohost.sh" "$build"
echo
echo "==== demo passed"
