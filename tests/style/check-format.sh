#!/usr/bin/env bash
# Lists every C, C++ and proto source of the project and fails on the first one clang-format
# would change. Uses git's file list when available so build trees are never scanned.
set -euo pipefail
clang_format=${1:-clang-format}
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files --cached --others --exclude-standard \
    '*.c' '*.h' '*.cc' '*.cpp' '*.hpp' '*.proto' | while read -r f; do [ -f "$f" ] && echo "$f"; done)
else
  mapfile -t files < <(find include proto common providers daemon client tools tests examples \
    -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cpp' -o -name '*.hpp' -o -name '*.proto' \) 2>/dev/null)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "check-format: no source files found" >&2
  exit 1
fi
"$clang_format" --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files formatted"
