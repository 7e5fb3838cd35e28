#!/usr/bin/env bash
# Runs the whole GPU test set and the benchmark on a machine with a GPU, from binaries built
# elsewhere and carried in .scratch_device/bin (see scripts/pack_device.sh). Logs go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export GDN_SOURCE_DIR="$PWD" GDNC_CACHE_DIR="${GDNC_CACHE_DIR:-/tmp/gdnc-cache}"
bin=.scratch_device/bin
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee "$OUT/device.txt"
git log -1 --format='commit %H' 2>/dev/null | tee -a "$OUT/device.txt"
"$bin/gdnc" compile examples/*.json --target sm_90a 2>&1 | tail -3
rc=0
for suite in ${GPU_SUITES:-gpu_errors gpu_prep gpu_layer gpu_determinism gpu_ckpt gpu_graph}; do
  echo "=== $suite"
  "$bin/gdn_gpu_tests" --test-suite="$suite" 2>&1 | tee -a "$OUT/gpu_tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
done
if [ "${RUN_PYTHON:-1}" = 1 ]; then
  echo "=== python binding (torch of the device)"
  GDNC_LIBRARY="$PWD/$bin/libgdn.so" GDNC_REFERENCE_LIBRARY="$PWD/$bin/libgdn_reference.so" python3 -m unittest discover -s python/tests -p "test_*.py" -v 2>&1 \
    | tee -a "$OUT/python.log" | tail -20
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  echo "=== bench"
  # A shortened protocol by default so tests and benchmark fit one 10-minute call.
  "$bin/gdn_bench" ${BENCH_ARGS:---shapes N,M,G,A --groups 3 --samples 6 --warmup 4} 2>&1 | tee "$OUT/bench.log"
fi
exit $rc
