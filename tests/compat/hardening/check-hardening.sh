#!/usr/bin/env bash
# Every ELF file `cmake --install` puts on a machine carries the hardening Debian builds its own
# packages with (cmake/ibvx.cmake): PIE, the stack protector, _FORTIFY_SOURCE, full RELRO and
# BIND_NOW, stack clash protection. Judged by devscripts' hardening-check, a checker we did not
# write, and, for what a finished binary cannot show, by the compile commands of every object.
#
# Not asked of the binaries, each for a reason the checker cannot see:
# - control-flow protection: an ELF carries the IBT/SHSTK note only when every object linked
#   into it does, and Debian 12's own start files (crti.o) do not; every Debian 12 binary shows
#   "Control flow integrity: no" (try /usr/bin/ls). Our objects are compiled with it, which the
#   compile-command check below holds.
# - per file, where hardening-check finds nothing to judge by: the libibverbs face calls no libc
#   function a check could guard and has no function with a local array (nothing for the stack
#   protector to protect); libsoftnda-verbs.so's only libc copy is memcpy of run-time sizes,
#   which _FORTIFY_SOURCE cannot check. Both are compiled with the flags (compile commands).
#
#   check-hardening.sh CMAKE BUILD_DIR      exit 0, 1 naming each failing file, 77 (skip) when
#                                           hardening-check is not installed
set -euo pipefail
cmake_bin=$1
build=$2

if ! command -v hardening-check >/dev/null; then
  echo "SKIP: hardening-check (devscripts) is not installed; scripts/install-deps.sh installs it"
  exit 77
fi

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
DESTDIR="$root" "$cmake_bin" --install "$build" --prefix /usr/local >/dev/null

mapfile -t elves < <(find "$root" -type f -print0 | xargs -0 file -N -F '|' |
  awk -F'|' '/ELF/ {print $1}' | sort)
if [ "${#elves[@]}" -lt 5 ]; then
  echo "FAIL: only ${#elves[@]} ELF files installed under $root; the install is not what it should be"
  exit 1
fi

# Every object of the build compiled with the flags (generated protobuf code included).
python3 - "$build/compile_commands.json" <<'PY'
import json, sys
need = ["-fstack-protector-strong", "-fstack-clash-protection", "-D_FORTIFY_SOURCE=2", "-fcf-protection"]
cmds = json.load(open(sys.argv[1]))
bad = [(c["file"], [f for f in need if f not in c["command"]]) for c in cmds]
bad = [(f, m) for f, m in bad if m]
for f, m in bad:
    print(f"FAIL: {f} compiled without {' '.join(m)}")
print(f"compile commands: {len(cmds)} objects, {len(bad)} without the hardening flags")
sys.exit(1 if bad or not cmds else 0)
PY

failed=0
for f in "${elves[@]}"; do
  # A library or program whose code calls no function _FORTIFY_SOURCE guards says
  # "unknown, no protectable libc functions used", which hardening-check does not count as a
  # failure; everything else must be found.
  opts=(--nocfprotection)
  case "$(basename "$f")" in
    libibverbs.so.*) opts+=(--nostackprotector) ;;
    libsoftnda-verbs.so*) opts+=(--nofortify) ;;
  esac
  if ! out=$(hardening-check "${opts[@]}" "$f" 2>&1); then
    echo "$out"
    failed=$((failed + 1))
  fi
done
echo "hardening-check: ${#elves[@]} installed ELF files, $failed failing"
[ "$failed" -eq 0 ]
