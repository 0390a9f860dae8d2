#!/usr/bin/env bash
# The operator's story under a real systemd 252 as PID 1 (Debian 12's), booted in systemd-nspawn.
#
# The root needs no network and no debootstrap: the host's /usr bound read-only, a minimal /etc
# written here, and the project installed with `DESTDIR=... cmake --install` and bound over
# /usr/local. Inside, story.sh (beside this file) runs, as a oneshot unit, the README's operator
# steps literally (extracted from README.md, less its `cmake --install` line), then tenants as
# non-root users in and out of the socket's group, a verified traffic loop through every kind of
# restart (systemctl restart with a watch open and earlier sessions ended, kill -9,
# `ibv-extendctl restart --require-keep`), a forking chaos-tenant through seeded kill -9s and
# restarts of both kinds, a config typo, a bad reload, and `man -w`. Last, across hosts: the
# container boots in a network namespace made here, joined by a veth pair to a second one that
# stands for another host, where a broker of the build tree serves an ibv_rc_pingpong server; the
# story binds its softnda device to its end (`[softnda] netdev`) and runs the client as alice, so
# the shipped unit's hardening must let the broker's RoCEv2 socket work. Without unshare and
# nsenter that part is skipped, saying so.
#
#   nspawn_story.sh BUILD_DIR SOURCE_DIR RESTART_TENANT CHAOS_TENANT
#
# Exit 0 when every check passed, 1 when one failed, 77 (skip) where nspawn cannot run.
set -uo pipefail
B=$(realpath "$1")
SRC=$(realpath "$2")
TENANT=$(realpath "$3")
CHAOS=$(realpath "$4")
HERE=$(cd "$(dirname "$0")" && pwd)

skip() {
  echo "nspawn_story: SKIP: $*"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "needs root (systemd-nspawn boots a container)"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn is missing (Debian package systemd-container)"
[ -x /usr/lib/systemd/systemd ] || skip "no systemd in /usr to boot"

W=$(mktemp -d /var/tmp/ibvx-nspawn.XXXXXX)
P=""
netns=()
netns_holders=()
peer_pids=()
cleanup() {
  # TERM first: the server's `timeout` passes it on to ibv_rc_pingpong, which KILL would orphan.
  for p in "${peer_pids[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  [ ${#peer_pids[@]} -eq 0 ] || sleep 0.2
  for p in "${peer_pids[@]}"; do
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  # The hosts' namespaces go with their holders (and the peers above, which ran in them).
  for p in "${netns_holders[@]}"; do
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  # IBVX_STORY_KEEP=1 keeps the root, the story's files and the journal for a look afterwards.
  [ -n "${IBVX_STORY_KEEP:-}" ] || rm -rf "$W" ${P:+"$P"}
}
trap cleanup EXIT
R=$W/root
STAGE=$W/stage
OUT=$W/story

echo "== install: DESTDIR=$STAGE cmake --install $B --prefix /usr/local"
if ! DESTDIR=$STAGE cmake --install "$B" --prefix /usr/local >"$W/install.log" 2>&1; then
  cat "$W/install.log"
  echo "nspawn_story: cmake --install failed"
  exit 1
fi

# A root of mount points and a generated /etc; merged /usr, as Debian 12.
mkdir -p "$R"/{etc,var/tmp,var/log,tmp,run,root,home/alice,home/bob,proc,sys,dev,usr} "$OUT"
for l in bin sbin lib lib64; do
  ln -s "usr/$l" "$R/$l"
done
E=$R/etc
cp /usr/lib/os-release "$E/os-release"  # nspawn checks for it before /usr is bound
tr -d - </proc/sys/kernel/random/uuid >"$E/machine-id"  # not a first boot: no firstboot wizard
printf 'ibvx-story\n' >"$E/hostname"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$E/hosts"
cat >"$E/passwd" <<'EOT'
root:x:0:0:root:/root:/bin/bash
alice:x:1000:1000:tenant in the ibv-extend group:/home/alice:/bin/bash
bob:x:1001:1001:tenant outside it:/home/bob:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
EOT
printf 'root:x:0:\nalice:x:1000:\nbob:x:1001:\nnogroup:x:65534:\n' >"$E/group"
printf 'root:*:19000:0:99999:7:::\nalice:*:19000:0:99999:7:::\nbob:*:19000:0:99999:7:::\nnobody:*:19000:0:99999:7:::\n' >"$E/shadow"
printf 'root:*::\nalice:!::\nbob:!::\nnogroup:*::\n' >"$E/gshadow"
chmod 0640 "$E/shadow" "$E/gshadow"
chown 1000:1000 "$R/home/alice"
chown 1001:1001 "$R/home/bob"
chmod 1777 "$R/tmp" "$R/var/tmp"
for f in nsswitch.conf ld.so.conf manpath.config login.defs; do
  [ -e "/etc/$f" ] && cp "/etc/$f" "$E/$f"
done
[ -d /etc/ld.so.conf.d ] && cp -r /etc/ld.so.conf.d "$E/"
mkdir -p "$E/systemd/system/multi-user.target.wants"

# The README's operator steps, literally, but for the install (done above with DESTDIR: /usr is
# the host's, read-only) and the runtime packages' apt-get line (the host's /usr has them: checked
# here against the host's dpkg, so the README names packages that exist and suffice).
# The section's shell blocks, continuation lines joined.
awk '/^## Operator.s first five minutes/ {on = 1} on && /^Look at it/ {exit}
     on && /^```sh$/ {code = 1; next} on && /^```$/ {code = 0; next}
     on && code' "$SRC/README.md" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' >"$W/readme-blocks.sh"
grep -v -e 'cmake --install' -e 'apt-get install' "$W/readme-blocks.sh" >"$OUT/readme-steps.sh"
runtime=$(sed -n 's/^apt-get install\( -y\)\{0,1\}//p' "$W/readme-blocks.sh" | sed 's/#.*//')
for pkg in $runtime; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    echo "nspawn_story: README's runtime package '$pkg' is not installed on this host"
    exit 1
  fi
done
echo "== the README's runtime packages, present on the host: $runtime"
if ! grep -q "systemctl enable" "$OUT/readme-steps.sh"; then
  echo "nspawn_story: found no operator steps in README.md (section \"Operator's first five minutes\")"
  exit 1
fi
echo "$TENANT" >"$OUT/tenant"
echo "$CHAOS" >"$OUT/chaos_tenant"
# IBVX_STORY_UNTIL=N ends the story after its N-th systemctl restart (for a quick look).
echo "${IBVX_STORY_UNTIL:-}" >"$OUT/until"

cat >"$E/systemd/system/ibvx-story.service" <<EOT
[Unit]
Description=the operator's story (tests/integration/systemd)
After=multi-user.target
[Service]
Type=oneshot
TimeoutStartSec=330
ExecStart=/bin/bash $HERE/story.sh
ExecStopPost=/usr/bin/systemctl --no-block poweroff
EOT
ln -s ../ibvx-story.service "$E/systemd/system/multi-user.target.wants/ibvx-story.service"

binds=(--bind-ro=/usr --bind="$STAGE/usr/local:/usr/local" --bind-ro="$SRC" --bind="$OUT:/story")
case "$B/" in
  "$SRC"/*) ;;
  *) binds+=(--bind-ro="$B") ;;
esac
for prog in "$TENANT" "$CHAOS"; do
  case "$prog" in
    "$SRC"/* | "$B"/*) ;;
    *) binds+=(--bind-ro="$(dirname "$prog")") ;;
  esac
done

# The other host: network namespace b, joined to the container's (a) by a veth pair, addresses
# 10.201.14.1 (the container) and .2 (b), nothing else addressed. Host b's broker runs from the
# build tree, its softnda device bound to its end; a tenant of it (user nobody) waits as the
# ibv_rc_pingpong server (-c: every byte checked) the story's client connects to. /story/wire
# tells the story the interface, the peer's address, the port and the iterations; empty, the
# story skips the part.
network=(--private-network)
: >"$OUT/wire"
server=""
if command -v unshare >/dev/null && command -v nsenter >/dev/null && command -v ibv_rc_pingpong >/dev/null &&
  command -v setpriv >/dev/null; then
  # Each host's network namespace is held by a process of the story's (`unshare --net`), never
  # `ip netns add`: a /run/netns mount coming and going is seen by every bwrap another test starts
  # meanwhile, which fails when a mount it copies vanishes before it remounts it.
  in_host() {  # in_host N COMMAND...: COMMAND in host N's network namespace
    local n=$1
    shift
    nsenter --net="${netns[$n]}" "$@"
  }
  make_hosts() {
    for n in 0 1; do
      unshare --net sleep infinity &
      netns_holders+=($!)
    done
    for n in 0 1; do  # the holder's namespace is its own once unshare(2) has run
      for _ in $(seq 100); do
        [ "$(readlink "/proc/${netns_holders[$n]}/ns/net")" != "$(readlink /proc/$$/ns/net)" ] && break
        sleep 0.05
      done
      netns+=("/proc/${netns_holders[$n]}/ns/net")
    done
    in_host 0 ip link add ibvx-sw0 type veth peer name ibvx-sw1 netns "${netns[1]}" &&
      in_host 0 ip addr add 10.201.14.1/24 dev ibvx-sw0 &&
      in_host 1 ip addr add 10.201.14.2/24 dev ibvx-sw1 || return 1
    for n in 0 1; do
      in_host $n ip link set lo up && in_host $n ip link set "ibvx-sw$n" up || return 1
    done
  }
  if ! make_hosts; then
    echo "nspawn_story: could not make the two hosts' network namespaces"
    exit 1
  fi
  for n in 0 1; do  # the carrier comes up a moment after both ends are up
    for _ in $(seq 100); do
      in_host $n ip -o link show dev "ibvx-sw$n" | grep -q 'state UP' && break
      sleep 0.1
    done
  done
  # Host b's tenant is user nobody: its broker's directory is one it can reach ($W is 0700).
  P=$(mktemp -d /tmp/ibvx-story-peer.XXXXXX)
  chmod 755 "$P"
  mkdir "$P/conf.d"
  printf '[broker]\nlog_level = "warn"\nsocket_mode = "0666"\n\n[softnda]\nnetdev = "ibvx-sw1"\n' >"$P/ibv-extendd.toml"
  # Only the build tree's drivers, never the host's /etc/libibverbs_extend.d. nsenter itself, not
  # in_host: a function run in the background is a subshell, and $! would be its pid, not the
  # broker's (nsenter execs what it runs), so cleanup's kill would leave the broker running.
  IBV_EXTEND_PROVIDER_DIR=$B/providers-out IBV_EXTEND_CONFIG_DIR=$P/conf.d IBV_EXTEND_DRIVERS=softnda \
    nsenter --net="${netns[1]}" "$B/daemon/ibv-extendd" --socket "$P/broker.sock" --foreground \
    --config "$P/ibv-extendd.toml" >"$P/broker.log" 2>&1 &
  peer_pids+=($!)
  for _ in $(seq 100); do
    [ -S "$P/broker.sock" ] && [ -e "$P/discovery" ] && break
    sleep 0.1
  done
  if [ ! -S "$P/broker.sock" ]; then
    echo "nspawn_story: host b's broker did not start; its log:"
    cat "$P/broker.log"
    exit 1
  fi
  nsenter --net="${netns[1]}" setpriv --reuid=65534 --regid=65534 --clear-groups \
    "$B/tools/ibv-extend-run/ibv-extend-run" --socket "$P/broker.sock" -- \
    timeout 390 ibv_rc_pingpong -d softnda0 -g 1 -c -n 6000 -p 18516 >"$P/pingpong.server" 2>&1 &
  server=$!
  peer_pids+=("$server")
  network=(--network-namespace-path="${netns[0]}")
  echo "ibvx-sw0 10.201.14.2 18516 6000" >"$OUT/wire"
  echo "== host b: netns ${netns[1]}, a broker on ibvx-sw1 10.201.14.2 and an ibv_rc_pingpong server; the container in ${netns[0]} (ibvx-sw0 10.201.14.1)"
else
  echo "== across hosts: skipped (needs unshare, nsenter, ibv_rc_pingpong and setpriv)"
fi

echo "== boot: systemd-nspawn -D $R -b (the host's /usr, the install over /usr/local)"
start=$(date +%s)
timeout 390 systemd-nspawn -q -D "$R" --register=no --keep-unit "${network[@]}" "${binds[@]}" \
  -b systemd.firstboot=off ${IBVX_STORY_BOOT_ARGS:-} >"$W/boot.log" 2>&1
rc=$?
echo "== the container stopped after $(($(date +%s) - start)) s (nspawn exit $rc)"
if [ -n "$server" ]; then
  # The client's side is the story's check; the server's is this one: every round trip served,
  # every byte checked (-c).
  kill -TERM "$server" 2>/dev/null
  wait "$server"
  server_rc=$?
  echo "== host b's ibv_rc_pingpong server: exit $server_rc; $(tail -1 "$P/pingpong.server")"
  if grep -q "^PASS: across hosts: ibv_rc_pingpong" "$OUT/story.log" 2>/dev/null && [ "$server_rc" -ne 0 ]; then
    echo "nspawn_story: the client passed but host b's server did not; its output and broker log:"
    cat "$P/pingpong.server" "$P/broker.log"
    exit 1
  fi
fi
if [ ! -s "$OUT/story.log" ]; then
  echo "nspawn_story: the story never ran; the boot said:"
  sed 's/\x1b\[[0-9;]*m//g' "$W/boot.log" | tail -40
  exit 1
fi
cat "$OUT/story.log"
if ! grep -qE '^story: [0-9]+ passed, 0 failed$' "$OUT/story.log"; then
  echo "== the broker's journal"
  cat "$OUT/journal.log" 2>/dev/null | tail -150
  exit 1
fi
exit 0
