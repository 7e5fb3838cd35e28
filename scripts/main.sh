#!/usr/bin/env bash
# Builds everything, compiles every example spec ahead of time for sm_90a, sm_100a and sm_103a
# into the kernel cache, lists the cache, and, where a GPU is present, checks a layer on it
# against the fp64 reference.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cmake --preset release >/dev/null
cmake --build --preset release -j"$(nproc)"
./build/gdnc compile examples/*.json --target sm_90a --target sm_100a --target sm_103a
./build/gdnc cache ls
if [ -e /dev/nvidia0 ] || [ -e /dev/nvidiactl ]; then
  ./build/gdnc check examples/n.json --docs 2049,3001,3142
else
  echo "no GPU here: skipped the GPU check (gdnc check examples/n.json)"
fi
