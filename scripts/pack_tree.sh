#!/usr/bin/env bash
# Packs this tree's built binaries (stripped) with its templates, examples, scripts, python/ and
# bench/ into .scratch_device/NAME.tar.xz (about 10 MB), so one device call can run a second
# commit beside the carried one (e.g. a branch's GPU gate and main's tests):
#
#   here:    git checkout BRANCH && cmake --build build && scripts/pack_tree.sh branch && git checkout main
#   device:  mkdir -p /tmp/branch && tar xJf .scratch_device/branch.tar.xz -C /tmp/branch \
#              && (cd /tmp/branch && OUT=$OUT/branch GDNC_CACHE_DIR=/tmp/cache-branch ./scripts/gpu_run.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
name="${1:?usage: scripts/pack_tree.sh NAME}"
work="$(mktemp -d /tmp/gdnc-pack.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/.scratch_device/bin" .scratch_device
for b in build/libgdn.so build/libgdn_reference.so build/gdnc build/tests/gdn_gpu_tests build/bench/gdn_bench; do
  strip -o "$work/.scratch_device/bin/$(basename "$b")" "$b"
done
tar c templates examples scripts python bench | tar x -C "$work"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')" > "$work/TREE"
tar cJf ".scratch_device/$name.tar.xz" -C "$work" .
du -h ".scratch_device/$name.tar.xz"
