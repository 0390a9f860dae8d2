#!/usr/bin/env bash
# The two-host demo against a build tree ($1, default "build"): two network namespaces joined by a
# veth pair stand for two hosts (addresses 10.201.9.1 and 10.201.9.2, nothing else is addressed),
# one ibv-extendd in each with its softnda device bound to its end of the pair
# (`[softnda] netdev`), so it is a RoCE device that reaches the other host by RoCEv2 on UDP 4791.
# Debian's unmodified ibv_rc_pingpong -g 1 (the IPv4-mapped GID) then runs between an unprivileged
# tenant (user nobody, through ibv-extend-run) of each broker.
# Needs root for the namespaces: skipped, with exit 0, when not root or when `ip netns` cannot
# make them. Everything it made (namespaces, veth pair, brokers, files) goes on exit or failure.
set -euo pipefail

build=${1:-build}
build=$(cd "$build" && pwd)
daemon=$build/daemon/ibv-extendd
run=$build/tools/ibv-extend-run/ibv-extend-run
for f in "$daemon" "$run" "$build/providers-out/libsoftnda.so"; do
  if [ ! -e "$f" ]; then
    echo "demo-twohost: $f is missing; build first (make build)" >&2
    exit 1
  fi
done
if [ "$(id -u)" -ne 0 ]; then
  echo "== skipped: the two-host step needs root (it makes two network namespaces: ip netns)"
  exit 0
fi
if ! command -v ip >/dev/null 2>&1 || ! command -v ss >/dev/null 2>&1 || ! ip netns list >/dev/null 2>&1; then
  echo "== skipped: no usable 'ip netns' (iproute2) on this host"
  exit 0
fi
if ! command -v ibv_rc_pingpong >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
  echo "== skipped: needs ibv_rc_pingpong (ibverbs-utils) and setpriv (util-linux)"
  exit 0
fi

ns=(ibvx-demo-$$-a ibvx-demo-$$-b)
ifs=(ibvxd0 ibvxd1)
addr=(10.201.9.1 10.201.9.2)
dir=$(mktemp -d /tmp/ibvx.XXXXXX)
chmod 755 "$dir" # the tenants run as nobody and reach the sockets through it
made=()
pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  for n in "${made[@]}"; do
    ip netns del "$n" 2>/dev/null || true
  done
  rm -rf "$dir"
}
trap cleanup EXIT

# Only the build tree's drivers, never the host's /etc/libibverbs_extend.d.
mkdir "$dir/conf.d"
export IBV_EXTEND_PROVIDER_DIR=$build/providers-out
export IBV_EXTEND_CONFIG_DIR=$dir/conf.d
export IBV_EXTEND_DRIVERS=softnda

for i in 0 1; do
  ip netns add "${ns[$i]}"
  made+=("${ns[$i]}")
done
# The pair is made inside host a and its peer moved straight into host b: this namespace never
# sees either end.
ip -n "${ns[0]}" link add "${ifs[0]}" type veth peer name "${ifs[1]}" netns "${ns[1]}"
for i in 0 1; do
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "${ifs[$i]}"
  ip -n "${ns[$i]}" link set lo up
  ip -n "${ns[$i]}" link set "${ifs[$i]}" up
done

# The kernel reports a veth end's carrier up a moment after both ends are up; until then
# softnda's port on it is DOWN and a tenant opening the device finds it unusable.
for i in 0 1; do
  for _ in $(seq 100); do
    ip -n "${ns[$i]}" -o link show dev "${ifs[$i]}" | grep -q 'state UP' && break
    sleep 0.1
  done
done

# One broker per host, each in a directory of its own (its socket and discovery tree).
for i in 0 1; do
  mkdir -m 755 "$dir/host$i"
  # A throwaway socket in a private directory: any local user may be its tenant.
  printf '[broker]\nlog_level = "warn"\nsocket_mode = "0666"\n\n[softnda]\nnetdev = "%s"\n' \
    "${ifs[$i]}" >"$dir/host$i/ibv-extendd.toml"
  echo "== host $i (netns ${ns[$i]}, ${ifs[$i]} ${addr[$i]}): ibv-extendd --config $dir/host$i/ibv-extendd.toml"
  ip netns exec "${ns[$i]}" "$daemon" --socket "$dir/host$i/broker.sock" --foreground \
    --config "$dir/host$i/ibv-extendd.toml" >"$dir/host$i/broker.log" 2>&1 &
  pids+=($!)
done
for i in 0 1; do
  for _ in $(seq 100); do
    # Serving once its discovery tree is published too (ibv-extend-run's sandbox binds it).
    [ -S "$dir/host$i/broker.sock" ] && [ -e "$dir/host$i/discovery" ] && break
    sleep 0.1
  done
  if [ ! -S "$dir/host$i/broker.sock" ] || [ ! -e "$dir/host$i/discovery" ]; then
    echo "demo-twohost: the broker of host $i did not start; its log:" >&2
    cat "$dir/host$i/broker.log" >&2
    exit 1
  fi
done

# tenant I CMD...: CMD as user nobody in host I's namespace, a tenant of host I's broker.
tenant() {
  local i=$1
  shift
  ip netns exec "${ns[$i]}" setpriv --reuid=65534 --regid=65534 --clear-groups \
    "$run" --socket "$dir/host$i/broker.sock" -- "$@"
}

port=18515
echo "== ibv_rc_pingpong -g 1 across the hosts: server a tenant of host 1, client of host 0 (user nobody)"
tenant 1 ibv_rc_pingpong -d softnda0 -g 1 -n 1000 -p "$port" >"$dir/pingpong.server" 2>&1 &
server=$!
pids+=("$server")
client_status=1
for _ in $(seq 50); do
  # The server listens once its QP is made; until then the client's connect is refused.
  if ip netns exec "${ns[1]}" ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    client_status=0
    tenant 0 ibv_rc_pingpong -d softnda0 -g 1 -n 1000 -p "$port" "${addr[1]}" >"$dir/pingpong.client" 2>&1 ||
      client_status=$?
    break
  fi
  sleep 0.1
done
server_status=0
if [ "$client_status" -ne 0 ]; then
  kill -KILL "$server" 2>/dev/null || true
fi
# (quietly: a server killed above is reported below, not by the shell)
{ wait "$server"; } 2>/dev/null || server_status=$?
if [ "$client_status" -ne 0 ] || [ "$server_status" -ne 0 ]; then
  echo "demo-twohost: ibv_rc_pingpong across the hosts failed; client (host 0) and server (host 1) said:" >&2
  cat "$dir/pingpong.client" "$dir/pingpong.server" >&2 2>/dev/null || true
  for i in 0 1; do
    echo "-- broker log of host $i:" >&2
    cat "$dir/host$i/broker.log" >&2
  done
  exit 1
fi
sed 's/^/   /' "$dir/pingpong.client"
echo "== stopping both brokers (SIGTERM)"
for i in 0 1; do
  status=0
  kill -TERM "${pids[$i]}" 2>/dev/null || status=$?
  wait "${pids[$i]}" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "demo-twohost: the broker of host $i exited with status $status; its log:" >&2
    cat "$dir/host$i/broker.log" >&2
    exit 1
  fi
done
pids=()
echo "== two-host step passed: 1000 round trips by RoCEv2 over the veth, each side a tenant of its own broker"
