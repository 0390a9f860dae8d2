#!/usr/bin/env bash
# RoCEv2's wire format judged by decoders we did not write (softnda SPEC.md §18): Wireshark's
# dissector (tshark) must decode every frame as InfiniBand over UDP 4791, over IPv4 or IPv6, with no
# malformed or error-level expert item, and scapy's RoCE layer must compute the ICRC each frame
# carries (over IPv6 only a scapy of 2.6.0 or later can: roce_wire_check.py says when it could not).
#
#   roce_wire_check.sh ROCE_PCAP
#       roce_pcap writes one frame per opcode of RC, UC, UD and XRC over IPv4 and again over IPv6; each
#       must also carry the BTH fields (opcode, PSN, destination QP) and IP version roce_pcap says it
#       sent, and its IPv4 header checksum and UDP checksum must be right.
#   roce_wire_check.sh --capture FILE.pcap [OPCODES]
#       a capture of real traffic (tcpdump on a veth: roce_hosts_test.cpp), over IPv4, IPv6 or
#       both; OPCODES, a comma-separated list (0x0c,0x11,...), must each appear in it at least once.
# Exit 0 when both agree, 1 when one does not, 77 (skip) without tshark or scapy.
set -uo pipefail
capture="" need=""
if [ "$1" = --capture ]; then
  capture=$2
  need=${3:-}
else
  gen=$1
fi
command -v tshark >/dev/null || { echo "roce_wire_check: SKIP: no tshark (Debian package tshark)"; exit 77; }
/usr/bin/python3 -c "import scapy.contrib.roce" 2>/dev/null ||
  { echo "roce_wire_check: SKIP: no scapy for /usr/bin/python3 (Debian package python3-scapy)"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
if [ -n "$capture" ]; then
  cp "$capture" "$dir/roce.pcap" || exit 1
  expect=/dev/null # real traffic: no list of what was sent, field by field
  frames=$(command tshark -r "$dir/roce.pcap" -T fields -e frame.number 2>/dev/null | wc -l)
  if [ "$frames" = 0 ]; then
    echo "roce_wire_check: $capture holds no frame"
    exit 1
  fi
else
  "$gen" "$dir/roce.pcap" "$dir/expect.txt" || exit 1
  expect=$dir/expect.txt
  frames=$(wc -l <"$dir/expect.txt")
fi
fail=0

# Wireshark: the protocol stack, the BTH fields, and nothing malformed or in error. The payloads
# are arbitrary bytes, not an upper-layer protocol: Wireshark's heuristic dissectors of InfiniBand
# payloads (RPC-over-RDMA, SMB Direct, NVMe-oF, ...) are turned off, or they guess at a SEND's few
# bytes and report their own protocol malformed.
mapfile -t no_guess < <(tshark -G heuristic-decodes 2>/dev/null |
  awk '$1 == "infiniband.payload" { print "--disable-protocol"; print $2 }')
# Wireshark judges checksums when asked (a bad one is an error-level expert item): roce_pcap's
# IPv4 header checksums and IPv6 UDP checksums are ours to get right. Not a capture's: a sender's
# frames there carry what checksum offload left (veth offloads), not what went out.
checksums=()
if [ -z "$capture" ]; then
  checksums=(-o ip.check_checksum:TRUE -o udp.check_checksum:TRUE)
fi
tshark() { command tshark "${no_guess[@]}" "${checksums[@]}" "$@"; }
tshark -r "$dir/roce.pcap" -T fields -E separator=' ' -e frame.protocols -e infiniband.bth.opcode \
  -e infiniband.bth.psn -e infiniband.bth.destqp >"$dir/tshark.txt" 2>"$dir/tshark.err"
decoded=$(grep -c ":udp:infiniband" "$dir/tshark.txt")
over_ipv4=$(grep -c ":ip:udp:infiniband" "$dir/tshark.txt")
over_ipv6=$(grep -c ":ipv6:udp:infiniband" "$dir/tshark.txt")
if [ "$decoded" != "$frames" ]; then
  echo "tshark: $decoded of $frames frames decode as InfiniBand over UDP"
  head -5 "$dir/tshark.txt" "$dir/tshark.err"
  fail=1
fi
# tshark prints some fields in hex (0x...): bash's arithmetic reads both.
n=0
while read -r protocols op psn qp && read -r e_op e_psn e_qp _ e_ip <&3; do
  n=$((n + 1))
  case $protocols in
    *:ipv6:udp:infiniband*) ip=6 ;;
    *:ip:udp:infiniband*) ip=4 ;;
    *) ip="?" ;;
  esac
  if [ $((op)) != "$e_op" ] || [ $((psn)) != "$e_psn" ] || [ $((qp)) != "$e_qp" ] || [ "$ip" != "$e_ip" ]; then
    echo "tshark: frame $n: opcode/psn/destqp $op/$psn/$qp over IPv$ip, sent $e_op/$e_psn/$e_qp over IPv$e_ip"
    fail=1
  fi
done <"$dir/tshark.txt" 3<"$expect"
flagged=$(tshark -r "$dir/roce.pcap" -Y '_ws.malformed || _ws.expert.severity >= 8388608' -T fields \
  -e frame.number 2>/dev/null | wc -l)
if [ "$flagged" != 0 ]; then
  echo "tshark: $flagged frames malformed or with an error-level expert item:"
  tshark -r "$dir/roce.pcap" -Y '_ws.malformed || _ws.expert.severity >= 8388608' -V 2>/dev/null | head -60
  fail=1
fi
echo "tshark: $frames frames, $decoded decoded as InfiniBand over UDP 4791 ($over_ipv4 over IPv4," \
  "$over_ipv6 over IPv6), $flagged flagged${checksums[*]:+, checksums judged}"

if [ -n "$capture" ]; then
  /usr/bin/python3 "$(dirname "$0")/roce_wire_check.py" --capture "$dir/roce.pcap" "$need" || fail=1
else
  /usr/bin/python3 "$(dirname "$0")/roce_wire_check.py" "$dir/roce.pcap" "$dir/expect.txt" || fail=1
fi
exit $fail
