#!/usr/bin/env bash
# The tenants' wait across broker restarts, read from the broker's own log: one
# `ibv-extend-perf --only restart` run against DAEMON (an ibv-extendd of any version: its
# `restart requested` and `serving on` lines are timed, whatever its own figures measure),
# then the mean of the small restarts (2 tenants, 109 objects) and the 10,003-object one.
# docs/BENCHMARKS.md ("Restart") alternates it between two brokers for a before and after.
#   bench/restart_wait.sh BUILD_DIR [DAEMON]   (DAEMON defaults to BUILD_DIR's ibv-extendd)
set -euo pipefail
build=${1:?usage: restart_wait.sh BUILD_DIR [DAEMON]}
build=$(cd "$build" && pwd)
daemon=${2:-$build/daemon/ibv-extendd}
[[ -x $daemon ]] || { echo "restart_wait: $daemon is not an executable" >&2; exit 1; }
tmp=$(mktemp -d /tmp/ibvx-restart-wait.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# The broker logs at info level into a file of ours; each restart execs the same wrapper's target.
cat >"$tmp/daemon" <<EOF
#!/bin/sh
exec "$daemon" --log-level info "\$@" 2>>"$tmp/broker.log"
EOF
chmod +x "$tmp/daemon"
IBV_EXTEND_PROVIDER_DIR=${IBV_EXTEND_PROVIDER_DIR:-$build/providers-out} \
  "$build/tools/ibv-extend-perf/ibv-extend-perf" --only restart --daemon "$tmp/daemon" >"$tmp/perf.txt"
python3 - "$tmp/broker.log" "$daemon" <<'EOF'
import datetime, re, sys
def at(line):
    return datetime.datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f")
waits, asked, summary = [], None, None
for line in open(sys.argv[1], errors="replace"):
    if "info: restart requested" in line:
        asked = at(line)
    m = re.search(r"restart (\d+): .* kept with (\d+) object.*restore (\d+) ms", line)
    if m:
        summary = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if "serving on" in line and asked is not None and summary is not None:
        waits.append((summary[1], (at(line) - asked).total_seconds() * 1000, summary[2]))
        asked, summary = None, None
if not waits:
    sys.exit("restart_wait: no restart in the broker's log")
big = max(w[0] for w in waits)
small = [w[1] for w in waits if w[0] < big]
print(f"{sys.argv[2]}:")
if small:
    print(f"  {len(small)} restarts of {min(w[0] for w in waits)} objects: wait mean {sum(small) / len(small):.0f} ms"
          f" (min {min(small):.0f}, max {max(small):.0f})")
for objects, wait, restore in (w for w in waits if w[0] == big):
    print(f"  restart of {objects} objects: wait {wait:.0f} ms, of which the new process's restore {restore} ms")
EOF
grep -E "restart_restore_ms" "$tmp/perf.txt" | awk '{print "  ibv-extend-perf printed restart_restore_ms " $2}'
