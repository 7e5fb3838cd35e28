#!/usr/bin/env bash
# Checks the formatting, builds everything with the tests and runs them. Without a GPU the tests labelled "gpu" are
# skipped, and the count of skipped GPU tests is printed. Then the readers of untrusted input are
# fuzzed for a fixed seed and run count (scripts/fuzz.sh), and the CPU suites run again under
# ASan + UBSan (scripts/sanitize.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/format.sh --check
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
export GDNC_CACHE_DIR="${GDNC_CACHE_DIR:-$PWD/build/kernel-cache}"
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
  ctest --test-dir build --output-on-failure
else
  ctest --test-dir build --output-on-failure -LE gpu
  n=$(ctest --test-dir build -N -L gpu | sed -n 's/^Total Tests: //p')
  echo "SKIPPED ${n} GPU test suites (label gpu): no GPU on this machine. Run them on the H200 with scripts/gpu_run.sh."
fi
./scripts/fuzz.sh
./scripts/sanitize.sh
