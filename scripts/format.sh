#!/usr/bin/env bash
# Formats every C++ and CUDA source git tracks with clang-format 14 and .clang-format; --check
# changes nothing and fails, listing the files, when one is not formatted (CI runs it).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.cuh' '*.h')
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do clang-format-14 --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f"); done
  if ((${#bad[@]})); then
    echo "format: ${#bad[@]} file(s) not formatted with .clang-format: ${bad[*]} (run scripts/format.sh)" >&2
    exit 1
  fi
  echo "format: ${#files[@]} files formatted with .clang-format"
else
  clang-format-14 -i "${files[@]}"
fi
