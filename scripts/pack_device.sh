#!/usr/bin/env bash
# Packs the stripped binaries the device run needs into .scratch_device/bin.tar.xz (git-ignored;
# about 10 MB, 37 MB unpacked: xz leaves room in a call's 64 MiB for the peers' bundles).
# scripts/gpu_run.sh unpacks it into .scratch_device/bin. libgdn.so holds the compiler, the
# runtime and LLVM; the executables are small and find it through LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d /tmp/gdnc-bin.XXXXXX)"
trap 'rm -rf "$work"' EXIT
for b in build/libgdn.so build/libgdn_reference.so build/gdnc build/tests/gdn_gpu_tests build/bench/gdn_bench; do
  strip -o "$work/$(basename "$b")" "$b"
done
mkdir -p .scratch_device
rm -rf .scratch_device/bin
tar -C "$work" -cf - . | xz -6 -T0 > .scratch_device/bin.tar.xz
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!docs' || echo ' (with uncommitted changes)')" > .scratch_device/TREE
du -h .scratch_device/bin.tar.xz
