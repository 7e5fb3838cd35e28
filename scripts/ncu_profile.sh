#!/usr/bin/env bash
# Profiles chosen programs of one eager fwd+bwd call with Nsight Compute on the device machine
# (binaries carried in .scratch_device/bin, as for scripts/gpu_run.sh). Writes the report and its
# text pages (details, and stall samples per SASS instruction and per template line) to $OUT.
#
#   KERNELS='chunk_bwd|state_walk_bwd' SHAPE=M ./scripts/ncu_profile.sh
#   KERNELS=fused_walk NCU_BENCH_ARGS='--forward fused' ./scripts/ncu_profile.sh   (more gdn_bench options)
#
# --clock-control none leaves the clocks as the benchmarks see them; the numbers ncu reports are
# for reading where a kernel stalls, not for performance claims (those come from gdn_bench).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
. scripts/device_env.sh
ncu_bin="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1 || true)"
[ -n "$ncu_bin" ] || { echo "ncu_profile: no ncu on this machine" >&2; exit 2; }
kernels="${KERNELS:-chunk_bwd}"
count="${COUNT:-$(($(tr -cd '|' <<<"$kernels" | wc -c) + 1))}"
# Compile ahead so the profiled call does not include JIT work.
"$bin/gdnc" compile examples/*.json --target sm_90a >/dev/null
"$ncu_bin" --clock-control none --set full --import-source yes -k "regex:$kernels" -c "$count" \
  -f -o "$OUT/profile" "$bin/gdn_bench" --programs --shapes "${SHAPE:-M}" --warmup 0 --samples 1 \
  ${NCU_BENCH_ARGS:-} > "$OUT/ncu_run.log" 2>&1 || { tail -30 "$OUT/ncu_run.log"; exit 1; }
"$ncu_bin" --import "$OUT/profile.ncu-rep" --page details > "$OUT/profile_details.txt"
"$ncu_bin" --import "$OUT/profile.ncu-rep" --page source --csv --print-source sass > "$OUT/profile_sass.csv" 2>&1 || true
# The same samples per line of the templates (line info is compiled in).
"$ncu_bin" --import "$OUT/profile.ncu-rep" --page source --csv --print-source cuda > "$OUT/profile_cuda.csv" 2>&1 || true
ls -la "$OUT"
