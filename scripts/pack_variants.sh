#!/usr/bin/env bash
# Builds and packs several variants of the tree for one device call that times and tests them side
# by side (scripts/gpu_variants.sh runs them there). Each argument is `base` (the tree as it is) or
# a patch file (`git apply`, e.g. docs/results/*/ *.diff); each variant is built in build/, packed
# as scripts/pack_device.sh packs, and left in .scratch_device/variants/NN_NAME.tar.xz; the patch
# is then taken back out and the tree rebuilt as it was. Refuses a tree with uncommitted changes
# to the files a patch touches, so a variant never takes work with it.
#
#   scripts/pack_variants.sh base docs/results/fused_bwd_v3_lite/v3_lite.diff
#   (carry .scratch_device; about 10 MB a variant)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -ge 1 ] || { echo "usage: scripts/pack_variants.sh base|PATCH ..." >&2; exit 2; }
for v in "$@"; do
  if [ "$v" != base ]; then
    [ -f "$v" ] || { echo "pack_variants: no patch file '$v'" >&2; exit 2; }
    git apply --check "$v" || { echo "pack_variants: '$v' does not apply to this tree" >&2; exit 2; }
    for f in $(git apply --numstat "$v" | awk '{print $3}'); do
      git diff --quiet HEAD -- "$f" || { echo "pack_variants: '$f' has uncommitted changes; commit or stash them" >&2; exit 2; }
    done
  fi
done
rm -rf .scratch_device/variants && mkdir -p .scratch_device/variants
n=0
for v in "$@"; do
  name=$(basename "$v" .diff)
  applied=""
  if [ "$v" != base ]; then
    git apply "$v" && applied="$v"
  fi
  # Whatever happens below, the patch comes back out.
  trap '[ -n "$applied" ] && git apply -R "$applied"' EXIT
  cmake --build --preset release -j"$(nproc)" > /tmp/pack_variants_build.log 2>&1 \
    || { echo "pack_variants: the build of '$v' failed (/tmp/pack_variants_build.log)" >&2; exit 1; }
  scripts/pack_device.sh > /dev/null
  mv .scratch_device/bin.tar.xz ".scratch_device/variants/$(printf '%02d' "$n")_${name}.tar.xz"
  echo "$(printf '%02d' "$n")_${name}: $v at $(git rev-parse --short HEAD)"
  if [ -n "$applied" ]; then git apply -R "$applied"; fi
  applied=""
  trap - EXIT
  n=$((n + 1))
done
cmake --build --preset release -j"$(nproc)" > /tmp/pack_variants_build.log 2>&1
du -sh .scratch_device/variants
