#!/usr/bin/env bash
# Installs, from Debian 12's own packages, whatever the build and the test suite need and the machine
# lacks. Idempotent: when every package is present it does nothing and touches no network.
#
#   install-deps.sh           the native (host) build
#   install-deps.sh --arm64   the native build plus the aarch64 cross build and its emulator: the
#                             cross toolchain, the :arm64 development packages of every dependency
#                             (multiarch) and qemu-user; protoc and grpc_cpp_plugin stay the host's
set -euo pipefail

arm64=0
for arg in "$@"; do
  case "$arg" in
    --arm64) arm64=1 ;;
    *)
      echo "install-deps: unknown option '$arg' (usage: install-deps.sh [--arm64])" >&2
      exit 2
      ;;
  esac
done

PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  # the linker of native builds (cmake/ibvx.cmake): a quarter of GNU ld's time
  lld
  libibverbs-dev rdma-core ibverbs-providers
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libsystemd-dev systemd
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  # isa-l: the RoCEv2 ICRC's CRC-32 (softnda SPEC.md §18), carry-less multiply where the CPU has it
  libisal-dev
  iproute2 util-linux procps
  ibverbs-utils perftest python3-pyverbs
  go-md2man systemd-container
  # the nspawn story reads the installed man pages with man -w (tests/integration/systemd/story.sh);
  # a minbase root has no man
  man-db
  # ibv-extend-run's sandbox (docs/verbs.md, "The discovery tree"); UCX over the face, and UCP
  # for the verification program (tests/integration/verbs/ucp_verify.c); Open MPI over UCX
  # (tests/integration/verbs/mpi_verify.c)
  bubblewrap ucx-utils libucx-dev openmpi-bin libopenmpi-dev
  # RoCEv2 on the wire (softnda SPEC.md §18): decoders we did not write check what softnda sends
  # (Wireshark's dissector through tshark, scapy's RoCE layer for the ICRC), tcpdump captures
  tshark tcpdump python3-scapy
  # hardening-check: every installed binary carries Debian's hardening flags (tests/compat/hardening)
  devscripts file
)

# The libraries the build links (and the tests load) for aarch64; header-only Architecture: all
# packages (CLI11, nlohmann-json) are shared with the host and already in PACKAGES.
ARM64_PACKAGES=(
  crossbuild-essential-arm64 qemu-user file
  libibverbs-dev:arm64 ibverbs-providers:arm64
  libgrpc++-dev:arm64 libprotobuf-dev:arm64
  libspdlog-dev:arm64 libfmt-dev:arm64 libsystemd-dev:arm64
  libgtest-dev:arm64 libgmock-dev:arm64 libbenchmark-dev:arm64
  libtomlplusplus-dev:arm64
  # Not libisal-dev:arm64: Debian 12's isa-l packages are not Multi-Arch: same, so installing it
  # removes the host's. The cross build's ICRC uses zlib instead (providers/softnda/CMakeLists.txt).
)

wanted=("${PACKAGES[@]}")
if [ "$arm64" -eq 1 ]; then
  wanted+=("${ARM64_PACKAGES[@]}")
fi

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or install them with apt-get) and retry" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if [ "$arm64" -eq 1 ] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
