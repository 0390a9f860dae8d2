#!/bin/bash
# A manual check of broker restart under a real systemd 252 (Debian 12) as PID 1, where the
# machine's own init is not systemd: boots a Debian 12 root in systemd-nspawn (the host's /usr and
# the build tree bound in read-only), runs ibv-extendd under a unit with the fd store and a socket
# unit, a tenant's verified WRITE loop (restart-tenant through ibv-extend-run), then
# `systemctl restart`, `kill -9` under Restart=on-failure and `systemctl restart` again, and prints
# what the tenant saw and what the broker logged. Needs root, network for debootstrap (first run)
# and a built tree (make build).
#
#   scripts/nspawn-restart-check.sh [BUILD_DIR] [ROOT_DIR]
set -euo pipefail
B=$(realpath "${1:-build}")
R=${2:-/var/tmp/ibvx-nspawn-root}
SRC=$(cd "$(dirname "$0")/.." && pwd)
command -v systemd-nspawn >/dev/null && command -v debootstrap >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd-container debootstrap
[ -x "$R/lib/systemd/systemd" ] ||
    debootstrap --variant=minbase --include=systemd,dbus,systemd-sysv bookworm "$R" http://deb.debian.org/debian
mkdir -p "$R/opt" "$R/etc/systemd/system/multi-user.target.wants"
cat > "$R/opt/broker-check.sh" <<EOT
#!/bin/sh
B=$B
out=/broker-check.out
printf '[Socket]\nListenStream=/run/ibv-extend/broker.sock\nSocketMode=0666\n' > /etc/systemd/system/ibv-extendd.socket
printf '[Service]\nType=notify\nNotifyAccess=main\nEnvironment=IBV_EXTEND_PROVIDER_DIR=$B/providers-out\nExecStart=$B/daemon/ibv-extendd --foreground --fd-store\nFileDescriptorStoreMax=65536\nRestart=on-failure\nRestartSec=1s\n' > /etc/systemd/system/ibv-extendd.service
{
  echo "systemd: \$(systemctl --version | head -1)"
  systemctl daemon-reload
  systemctl start ibv-extendd.socket ibv-extendd.service; sleep 2
  rm -f /t.in; mkfifo /t.in
  \$B/tools/ibv-extend-run/ibv-extend-run --socket /run/ibv-extend/broker.sock -- \\
      \$B/tests/integration/restart/restart-tenant softnda0 < /t.in > /tenant.out 2> /tenant.err &
  exec 3> /t.in
  sleep 2
  systemctl restart ibv-extendd.service; sleep 2
  kill -9 "\$(systemctl show -p MainPID --value ibv-extendd.service)"; sleep 4
  systemctl restart ibv-extendd.service; sleep 2
  exec 3>&-
  wait; echo "tenant exit: \$?"; cat /tenant.out; tail -5 /tenant.err
  journalctl -u ibv-extendd.service --no-pager | grep -E "restore|restart [0-9]|handing|session [0-9]+ ended"
} > \$out 2>&1
systemctl poweroff
EOT
chmod +x "$R/opt/broker-check.sh"
printf '[Unit]\nAfter=multi-user.target\n[Service]\nType=oneshot\nTimeoutStartSec=150\nExecStart=/opt/broker-check.sh\n[Install]\nWantedBy=multi-user.target\n' \
    > "$R/etc/systemd/system/broker-check.service"
ln -sf /etc/systemd/system/broker-check.service "$R/etc/systemd/system/multi-user.target.wants/broker-check.service"
rm -f "$R/broker-check.out"
timeout 240 systemd-nspawn -D "$R" --register=no --keep-unit --bind-ro=/usr --bind-ro="$SRC" --bind-ro="$B" -b \
    > "$R.boot.log" 2>&1 || true
cat "$R/broker-check.out"
grep -q "failed=0 .*control_failed=0" "$R/broker-check.out"
