#!/bin/bash
# The operator's story, run inside the container nspawn_story.sh boots (as root, by a oneshot
# unit, with systemd 252 as PID 1). Each step is a check; the last line says how many passed and
# failed. What it shows: the installed units work for non-root tenants, every restart keeps every
# queue while a verified WRITE loop runs, and configuration mistakes are caught without losing a
# session. Last, where nspawn_story.sh made a second host (/story/wire), softnda bound to this
# host's interface reaches it by RoCEv2 under the shipped unit's hardening.
set -u
exec >/story/story.log 2>&1
TENANT=$(cat /story/tenant)
CHAOS=$(cat /story/chaos_tenant)
CONFIG=/etc/ibv-extend/ibv-extendd.toml
pass=0
fail=0
# The journal is what a failure is read from: written however the story ends.
trap 'journalctl -u ibv-extendd.service -u ibv-extendd.socket --no-pager -o short-monotonic >/story/journal.log 2>&1' EXIT
# systemctl waits for its job; a unit that hangs must fail its check, not the story.
systemctl() { timeout 60 /usr/bin/systemctl "$@"; }

ok() {
  echo "PASS: $*"
  pass=$((pass + 1))
}
bad() {
  echo "FAIL: $*"
  fail=$((fail + 1))
}
check() {
  local what=$1
  shift
  if "$@"; then ok "$what"; else bad "$what"; fi
}
ctl() { /usr/local/bin/ibv-extendctl "$@"; }
as() {
  local user=$1
  shift
  setpriv --reuid="$user" --regid="$user" --init-groups -- "$@"
}
run_as() {
  local user=$1
  shift
  as "$user" /usr/local/bin/ibv-extend-run -- "$@"
}
# Sessions the broker serves (the table's rows).
sessions() { ctl sessions 2>/dev/null | tail -n +2 | grep -c . || true; }
state() { systemctl show -p ActiveState,SubState --value ibv-extendd.service | paste -sd/; }
main_pid() { systemctl show -p MainPID --value ibv-extendd.service; }
# Waits (up to $2 s) until the service runs again and serves $1 sessions.
wait_serving() {
  local want=$1 limit=${2:-20} i
  for ((i = 0; i < limit * 10; i++)); do
    if [ "$(state)" = "active/running" ] && [ "$(sessions)" = "$want" ]; then
      return 0
    fi
    sleep 0.1
  done
  echo "   (state $(state), $(sessions) session(s), wanted $want)"
  return 1
}
tenant_alive() { kill -0 "$tenant_pid" 2>/dev/null; }
# Runs a tenant program as alice, its stdin a FIFO the story holds open (closing it tells the
# tenant to finish), its stdout and stderr in /story/NAME.out and .err, and waits up to 10 s for
# its "ready" line. Leaves its pid in started_pid and the FIFO's fd in started_in.
start_tenant() {
  local name=$1
  shift
  rm -f "/run/$name.in"
  mkfifo "/run/$name.in"
  chmod 0666 "/run/$name.in"
  run_as alice "$@" <"/run/$name.in" >"/story/$name.out" 2>"/story/$name.err" &
  started_pid=$!
  exec {started_in}>"/run/$name.in"
  for _ in $(seq 100); do
    grep -q ready "/story/$name.out" && break
    sleep 0.1
  done
}
# One short-lived tenant: a session that opens and ends, as the scenario of issue 20 had.
short_tenant() { run_as alice ibv_devinfo -d softnda0 >/dev/null 2>&1; }

echo "== $(systemctl --version | head -1), $(uname -m)"

echo "== the README's operator steps"
if bash -e -x /story/readme-steps.sh >/story/readme.out 2>&1; then
  ok "README steps ran"
else
  bad "README steps ran"
  cat /story/readme.out
fi
usermod -aG ibv-extend alice  # README: tenants are the members of ibv-extend
check "the socket unit listens" test "$(systemctl is-active ibv-extendd.socket)" = active
check "the service runs (Type=notify: READY=1)" wait_serving 0

echo "== tenants: alice (in group ibv-extend) and bob (not)"
run_as alice ibv_devinfo >/story/devinfo.alice 2>&1
check "alice: ibv_devinfo lists softnda0 through ibv-extend-run" grep -q "hca_id:.*softnda0" /story/devinfo.alice
cat /story/devinfo.alice | head -5
as alice /usr/local/bin/ibv-extendctl devinfo >/story/ctl.alice 2>&1
check "alice: ibv-extendctl devinfo answers" grep -q softnda0 /story/ctl.alice
run_as bob ibv_devinfo >/story/devinfo.bob 2>&1
echo "   bob: $(head -2 /story/devinfo.bob | paste -sd' ')"
check "bob: refused, and told about the socket's group" grep -q "ibv-extend" /story/devinfo.bob

echo "== ibv_rc_pingpong pair as alice"
run_as alice ibv_rc_pingpong -d softnda0 -n 500 -p 18515 >/story/pp.server 2>&1 &
server=$!
client_ok=1
for _ in $(seq 50); do
  if run_as alice ibv_rc_pingpong -d softnda0 -n 500 -p 18515 localhost >/story/pp.client 2>&1; then
    client_ok=0
    break
  fi
  sleep 0.1
done
wait "$server"
server_rc=$?
check "ibv_rc_pingpong: 500 round trips, both ends exit 0" test "$client_ok$server_rc" = 00
tail -1 /story/pp.client

echo "== a verified WRITE loop (restart-tenant) as alice, and an Admin watch"
start_tenant tenant "$TENANT" softnda0
tenant_pid=$started_pid
tenant_in=$started_in
check "the tenant's RC pair is up" grep -q ready /story/tenant.out
# The program itself, not the ctl function: $! of a function run in the background is a subshell,
# and killing that left the watch running, holding the story's unit up to systemd's 90 s stop
# timeout at the end. (Not holding the tenant's stdin open.)
/usr/local/bin/ibv-extendctl watch >/story/watch.log 2>&1 {tenant_in}>&- &
watch_pid=$!
base=$(sessions)
echo "   sessions: $base"

for i in 1 2 3; do
  short_tenant
  check "restart $i: a short-lived tenant's session ended first" wait_serving "$base" 5
  systemctl restart ibv-extendd.service
  check "systemctl restart $i: serving again with every session ($base)" wait_serving "$base"
  check "systemctl restart $i: the tenant runs on" tenant_alive
  if [ "$(cat /story/until)" = "$i" ]; then
    echo "story: $pass passed, $fail failed (stopped after restart $i: IBVX_STORY_UNTIL)"
    exit 0
  fi
done

pid=$(main_pid)
kill -9 "$pid"
sleep 0.5
check "kill -9: restarted by Restart=on-failure with every session" wait_serving "$base" 30
check "kill -9: a new main pid" test "$(main_pid)" != "$pid"
check "kill -9: the tenant runs on" tenant_alive

pid=$(main_pid)
restarts=$(systemctl show -p NRestarts --value ibv-extendd.service)
ctl restart --require-keep >/story/ctl-restart.out 2>&1
rc=$?
cat /story/ctl-restart.out
check "ibv-extendctl restart --require-keep: exit 0" test "$rc" = 0
sleep 3
check "ctl restart: the unit stays active/running (no STOPPING=1 for a re-exec)" test "$(state)" = active/running
check "ctl restart: the same main pid (an exec), systemd counted no restart" \
  test "$(main_pid)/$(systemctl show -p NRestarts --value ibv-extendd.service)" = "$pid/$restarts"
check "ctl restart: serving every session" wait_serving "$base"
ctl status | grep -E "^restarts:" || true
check "ctl restart: the tenant runs on" tenant_alive

echo "== a configuration typo, then systemctl restart"
cp "$CONFIG" /story/config.good
typo() { sed -i 's/^socket_mode = "0660"/socket_mode = 0660/' "$CONFIG"; }
typo
check "ibv-extendd --check-config finds the typo (exit 2)" \
  bash -c "/usr/local/sbin/ibv-extendd --check-config $CONFIG >/story/check.out 2>&1; test \$? = 2"
cat /story/check.out
systemctl reload ibv-extendd.service
check "systemctl reload with the typo fails" test $? -ne 0
systemctl restart ibv-extendd.service
check "restart with the typo: still serving every session (the previous configuration)" wait_serving "$base"
systemctl status ibv-extendd.service --no-pager | grep -i "status:" || true
check "restart with the typo: the status line names the error" \
  bash -c "systemctl show -p StatusText --value ibv-extendd.service | grep -q 'configuration'"
check "restart with the typo: the socket unit is active" test "$(systemctl is-active ibv-extendd.socket)" = active
cp /story/config.good "$CONFIG"
systemctl reload ibv-extendd.service
check "systemctl reload after the fix: exit 0" test $? = 0
systemctl restart ibv-extendd.service
check "restart after the fix: serving every session" wait_serving "$base"
check "after the fix: the status line is clean" \
  bash -c "! systemctl show -p StatusText --value ibv-extendd.service | grep -q 'configuration'"
check "the tenant ran through it all" tenant_alive

echo "== the tenant's verdict"
exec {tenant_in}>&-
wait "$tenant_pid"
trc=$?
cat /story/tenant.out
grep gap /story/tenant.err | tail -3
check "the tenant exits 0" test "$trc" = 0
check "no failed WR, no failed control call" grep -qE "failed=0 .*control_failed=0" /story/tenant.out
kill "$watch_pid" 2>/dev/null
wait "$watch_pid" 2>/dev/null
check "the watch saw the restarts" grep -q broker-restart /story/watch.log

echo "== chaos under systemd: a forking chaos-tenant as alice, kill -9s and restarts at seeded moments"
# The chaos soak's tenant (tests/integration/restart/chaos_tenant.c): verified WRITE, READ,
# SEND/RECV and atomics, churn, and forked children that open the device and register memory,
# as a non-root member of the socket's group under the shipped unit. Six events, each a kill -9
# (Restart=on-failure brings the broker back), a systemctl restart or an ibv-extendctl restart,
# 0.5 to 2 s apart, chosen by a fixed seed.
start_tenant chaos "$CHAOS" softnda0 26 fork
chaos_pid=$started_pid
chaos_in=$started_in
check "the chaos-tenant's pair is up" grep -q ready /story/chaos.out
base=$(sessions)
RANDOM=26
for i in 1 2 3 4 5 6; do
  sleep "$((RANDOM % 4 / 2)).$((5 + RANDOM % 5))"
  case $((RANDOM % 3)) in
    0)
      what="kill -9"
      kill -9 "$(main_pid)"
      sleep 0.2
      ;;
    1)
      what="systemctl restart"
      systemctl restart ibv-extendd.service
      ;;
    *)
      what="ibv-extendctl restart"
      ctl restart --require-keep >/dev/null 2>&1
      ;;
  esac
  # A forked child's session comes and goes: the count settles back to the tenant's own.
  check "chaos $i ($what): serving every session again" wait_serving "$base" 30
done
check "chaos: the chaos-tenant runs on" kill -0 "$chaos_pid"
exec {chaos_in}>&-
wait "$chaos_pid"
crc=$?
cat /story/chaos.out
tail -5 /story/chaos.err
check "the chaos-tenant exits 0" test "$crc" = 0
check "the chaos-tenant: nothing lost or repeated outside SPEC.md §10's counted windows" \
  grep -qE " failed=0( |$)" /story/chaos.out

echo "== a fresh start with a broken configuration"
restarts=$(systemctl show -p NRestarts --value ibv-extendd.service)
systemctl stop ibv-extendd.service
typo
as alice /usr/local/bin/ibv-extendctl devinfo >/story/ctl.broken 2>&1
echo "   alice: $(head -1 /story/ctl.broken)"
# Each of the client's connection attempts starts the service through the socket (that is socket
# activation, not Restart=, and NRestarts does not count it); the last one can still sit in the
# socket's backlog when the client gives up and start the service seconds later on a loaded
# machine. So the verdict is a snapshot taken in one systemctl call (three calls can straddle a
# start: "failed" from one attempt, "success" from the next) that stays the same, no start under
# way, over two looks 2 s apart (InvocationID changes with every start).
snapshot() {
  systemctl show -p ActiveState -p Result -p NRestarts -p InvocationID ibv-extendd.service | {
    local active="" result="" restarts_now="" invocation=""
    while IFS='=' read -r key value; do
      case $key in
        ActiveState) active=$value ;;
        Result) result=$value ;;
        NRestarts) restarts_now=$value ;;
        InvocationID) invocation=$value ;;
      esac
    done
    echo "$active/$result/$restarts_now/$invocation"
  }
}
previous=""
for _ in $(seq 1 30); do
  now=$(snapshot)
  case "$now" in
    activating/* | deactivating/*) previous="" ;;
    "$previous") break ;;
    *) previous=$now ;;
  esac
  sleep 2
done
verdict=$(echo "$previous" | cut -d/ -f1-3)
echo "   the service: $verdict (ActiveState/Result/NRestarts; NRestarts before the stop: $restarts)"
# systemd flushes NRestarts at the first start after the unit went down without restarting
# (service_enter_dead: "flush out the restart counter ... on the next start"), so the socket's
# start after the stop counts from 0 whatever the chaos left; 0 again now means no restart loop.
# (Comparing with the count before the stop, as this did, failed once in CI with the verdict
# .../0: that count is what the chaos's timing left, e.g. a systemctl restart that met the unit
# still waiting out a kill -9's auto-restart, which stops it without the flush.)
check "the service failed with the config error and was not restarted in a loop" \
  test "$verdict" = "failed/exit-code/0"
check "the socket unit survives the failed service" test "$(systemctl is-active ibv-extendd.socket)" = active
cp /story/config.good "$CONFIG"
systemctl start ibv-extendd.service
check "after the fix, systemctl start serves again (no reset-failed needed)" wait_serving 0
check "a tenant connects again" short_tenant

echo "== across hosts: softnda bound to an interface, RoCEv2 to another host's broker"
wire_if="" wire_peer="" wire_port="" wire_iters=""
read -r wire_if wire_peer wire_port wire_iters </story/wire || true
if [ -z "$wire_if" ]; then
  echo "   skipped: nspawn_story.sh made no second host (it says why)"
else
  # The operator's step: the example configuration's commented netdev line, set.
  sed -i "s/^# netdev = .*/netdev = \"$wire_if\"/" "$CONFIG"
  grep -E "^netdev" "$CONFIG"
  systemctl restart ibv-extendd.service
  check "across hosts: the restart with [softnda] netdev serves" wait_serving 0
  run_as alice ibv_devinfo -d softnda0 >/story/devinfo.wire 2>&1
  check "across hosts: softnda0 is a RoCE device (link_layer Ethernet)" \
    grep -q "link_layer:.*Ethernet" /story/devinfo.wire
  # Host b's server has waited since before the boot; its broker answers over the veth. A
  # systemctl restart in the middle of the traffic: the QP crosses it (the fd store), the new
  # process binds the RoCEv2 socket again, and the peer sees only retransmissions. One: each
  # restart under systemd darkens the wire for ~0.3-0.5 s of the peer's ~0.54 s retry budget
  # (ibv_rc_pingpong's timeout 14, retry_cnt 7), and a second one failed one CI run in five
  # without covering more (repeated restarts are the chaos part's and the two-host ctest's).
  run_as alice timeout 120 ibv_rc_pingpong -d softnda0 -g 1 -c -n "$wire_iters" -p "$wire_port" \
    "$wire_peer" >/story/pp.wire 2>&1 &
  wire_pid=$!
  for _ in $(seq 50); do
    [ "$(sessions)" = 1 ] && break
    sleep 0.1
  done
  sleep 0.5
  systemctl restart ibv-extendd.service
  check "across hosts: systemctl restart during the pingpong keeps its session" wait_serving 1
  sleep 0.3
  mid_traffic=0
  kill -0 "$wire_pid" 2>/dev/null && mid_traffic=1
  wait "$wire_pid"
  wire_rc=$?
  tail -2 /story/pp.wire
  check "across hosts: the pingpong still ran after the restart (else raise its -n)" test "$mid_traffic" = 1
  check "across hosts: ibv_rc_pingpong -g 1 -c to $wire_peer as alice, $wire_iters round trips, exit 0" \
    test "$wire_rc" = 0
  tx=$(ctl stats 2>/dev/null | sed -n 's/^wire_tx_packets *//p')  # (no awk: /etc has no alternatives)
  echo "   wire_tx_packets $tx"
  check "across hosts: the broker's RoCEv2 socket sent the packets (ibv-extendctl stats)" test "${tx:-0}" -gt 0
  cp /story/config.good "$CONFIG"
fi

echo "== man pages"
for page in ibv-extendd.8 ibv-extendctl.8 ibv-extend-run.1 ibv_extend.3; do
  check "man -w ${page%.*}(${page##*.})" man -w "${page##*.}" "${page%.*}"
done

journalctl -u ibv-extendd.service -u ibv-extendd.socket --no-pager -o short-monotonic >/story/journal.log 2>&1
echo "== the broker's journal, restarts and session ends"
grep -E "restart [0-9]+:|session [0-9]+ ended|restore:|EPOLLHUP|config|Failed|failed" /story/journal.log | tail -40
echo "story: $pass passed, $fail failed"
