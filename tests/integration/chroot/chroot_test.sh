#!/usr/bin/env bash
# The tests that build containers (ibvx-k8s-runtime, the face tests' Contained), run in a chroot
# whose "/" is not a mount point, as sbuild- and pbuilder-style package builds run `make test`.
# There mount(MS_PRIVATE) on "/" fails with EINVAL, and the launchers must still keep their mounts
# private (tests/integration/private_mounts.h). Nothing is mounted on the host: the chroot is put
# together in a private mount namespace of its own (util-linux unshare), and goes with it.
#
#   chroot_test.sh BUILD_DIR SOURCE_DIR
# Needs root (chroot, mounts); exits 77 (ctest: skipped) without it.
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")

if [ "$(id -u)" -ne 0 ]; then
  echo "chroot_test: SKIP: needs root to chroot and mount"
  exit 77
fi
if ! unshare --mount --propagation private true 2>/dev/null; then
  echo "chroot_test: SKIP: this host refuses a private mount namespace (unshare --mount)"
  exit 77
fi

root=$(mktemp -d /tmp/ibvx-chroot.XXXXXX)
# A chroot's "/" is world-readable: the tests drop to uid 65534 inside.
chmod 0755 "$root"
# Only links and empty directories are left on this side (the mounts went with the namespace):
# removed without following anything, so a mount that somehow stayed is never emptied.
trap 'find "$root" -depth \( -type l -delete \) -o \( -type d -empty -delete \) 2>/dev/null || true' EXIT
export root build src

# Inside the private namespace: bind the host's system and the project's trees in, then run the
# test programs under chroot with the environment ctest's launcher gives them (cmake/ibvx.cmake).
unshare --mount --propagation private -- bash -euo pipefail -c '
  for d in usr etc proc sys dev; do
    mkdir -p "$root/$d"
    mount --rbind "/$d" "$root/$d"
  done
  # Debian 12 is merged-/usr: /bin, /lib, /lib64 and /sbin are links into /usr.
  for d in bin lib lib64 sbin; do
    if [ -L "/$d" ]; then ln -s "$(readlink "/$d")" "$root/$d"; fi
  done
  mkdir -p "$root/tmp" && chmod 1777 "$root/tmp"
  for t in "$src" "$build"; do
    # A build directory inside the source tree came in with it.
    if [ ! -e "$root$t" ]; then
      mkdir -p "$root$t"
      mount --rbind "$t" "$root$t"
    fi
  done

  # What makes this test mean something: inside, "/" must not be a mount point.
  if chroot "$root" mountpoint -q /; then
    echo "chroot_test: FAIL: / is a mount point inside the chroot; the test would prove nothing"
    exit 1
  fi
  echo "chroot_test: / is not a mount point inside $root"

  failed=0
  run() {
    echo "chroot_test: $*"
    chroot "$root" /usr/bin/env IBV_EXTEND_PROVIDER_DIR="$build/providers-out" IBVX_BUILD_DIR="$build" \
      IBVX_SOURCE_DIR="$src" "$@" || failed=$((failed + 1))
  }
  run "$build/tests/integration/k8s/k8s_device_plugin_test" --gtest_filter="ContainerTest.*"
  run "$build/tests/integration/k8s/k8s_pod_identity_test" --gtest_filter="PodIdentityTest.SessionsShowTheirPod"
  run "$build/tests/integration/verbs/verbs_face_test" \
    --gtest_filter="FaceTest.IbvDevinfoListsTheBrokersDeviceWithAnActivePort:FaceTest.HccpConsumerRunsUnmodifiedAsAContainerTenant"
  if [ "$failed" -ne 0 ]; then
    echo "chroot_test: FAIL: $failed program(s) failed in the chroot"
    exit 1
  fi
'
echo "chroot_test: passed"
