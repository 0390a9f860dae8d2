#!/usr/bin/env bash
# The brokered end-to-end demo against a build tree ($1, default "build"):
# starts ibv-extendd on a temporary socket with softnda from the build tree, waits until it
# answers, runs ibvx-demo (two tenant processes, WRITE / SEND-RECV / READ on the fast path, broker
# RPC count during the data phase must be 0), then Debian's unmodified ibv_rc_pingpong (server and
# client) through ibv-extend-run and the libibverbs face, then stops the broker with SIGTERM.
# Exit 0 only when the demo verified everything and the broker stopped cleanly.
set -euo pipefail

build=${1:-build}
build=$(cd "$build" && pwd)
daemon=$build/daemon/ibv-extendd
demo=$build/tools/ibvx-demo/ibvx-demo
for f in "$daemon" "$demo" "$build/providers-out/libsoftnda.so"; do
  if [ ! -e "$f" ]; then
    echo "demo-broker: $f is missing; build first (make build)" >&2
    exit 1
  fi
done

dir=$(mktemp -d /tmp/ibvx.XXXXXX)
socket=$dir/broker.sock
broker_pid=
cleanup() {
  if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
    kill -KILL "$broker_pid" 2>/dev/null || true
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

# Only the build tree's drivers, never the host's /etc/libibverbs_extend.d.
mkdir "$dir/conf.d"
export IBV_EXTEND_PROVIDER_DIR=$build/providers-out
export IBV_EXTEND_CONFIG_DIR=$dir/conf.d
export IBV_EXTEND_DRIVERS=softnda

echo "== broker: $daemon --socket $socket"
"$daemon" --socket "$socket" --foreground --log-level warn >"$dir/broker.log" 2>&1 &
broker_pid=$!

# ibvx-demo --wait gives the broker up to 10 s to answer on the socket before it starts.
status=0
IBV_EXTEND_MODE=broker IBV_EXTEND_SOCKET=$socket IBV_EXTEND_SHOW_WARNINGS=1 "$demo" --wait 10000 || status=$?

# An unmodified verbs program on the same broker: Debian's ibv_rc_pingpong, both ends on this host,
# through ibv-extend-run (the libibverbs face; no /dev/infiniband needed).
run=$build/tools/ibv-extend-run/ibv-extend-run
if [ "$status" -eq 0 ]; then
  echo "== ibv_rc_pingpong through the broker: $run --socket $socket -- ibv_rc_pingpong -d softnda0 -n 1000"
  port=$((20000 + RANDOM % 20000))
  "$run" --socket "$socket" -- ibv_rc_pingpong -d softnda0 -n 1000 -p "$port" >"$dir/pingpong.server" 2>&1 &
  server=$!
  client_status=1
  for _ in $(seq 50); do
    if "$run" --socket "$socket" -- ibv_rc_pingpong -d softnda0 -n 1000 -p "$port" localhost >"$dir/pingpong.client" 2>&1; then
      client_status=0
      break
    fi
    sleep 0.1
  done
  server_status=0
  wait "$server" || server_status=$?
  if [ "$client_status" -ne 0 ] || [ "$server_status" -ne 0 ]; then
    echo "demo-broker: ibv_rc_pingpong failed; client and server said:" >&2
    cat "$dir/pingpong.client" "$dir/pingpong.server" >&2
    status=1
  else
    sed 's/^/   /' "$dir/pingpong.client"
    echo "== ibv_rc_pingpong passed: 1000 round trips through the broker's queues"
  fi
fi

echo "== stopping the broker (SIGTERM)"
if ! kill -TERM "$broker_pid" 2>/dev/null; then
  echo "demo-broker: ibv-extendd is no longer running; its log:" >&2
  cat "$dir/broker.log" >&2
  exit 1
fi
broker_status=0
wait "$broker_pid" || broker_status=$?
broker_pid=
if [ "$broker_status" -ne 0 ]; then
  echo "demo-broker: ibv-extendd exited with status $broker_status; its log:" >&2
  cat "$dir/broker.log" >&2
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "== demo FAILED" >&2
  exit 1
fi
echo "== demo passed"
