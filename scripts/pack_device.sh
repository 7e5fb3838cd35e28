#!/usr/bin/env bash
# Copies the stripped binaries the device run needs into .scratch_device/bin (git-ignored),
# small enough to carry to the H200 (64 MiB per call): libgdn.so holds the compiler, the runtime
# and LLVM; the executables are small and find it through LD_LIBRARY_PATH (scripts/gpu_run.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .scratch_device/bin
for b in build/libgdn.so build/libgdn_reference.so build/gdnc build/tests/gdn_gpu_tests build/bench/gdn_bench; do
  strip -o ".scratch_device/bin/$(basename "$b")" "$b"
done
du -sh .scratch_device/bin
