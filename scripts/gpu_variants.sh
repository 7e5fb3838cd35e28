#!/usr/bin/env bash
# On the GPU machine: runs scripts/gpu_run.sh's VARIANT_STEPS (default "tests sanitize bench"; also
# `profile`, scripts/ncu_profile.sh) once for each variant scripts/pack_variants.sh left in
# .scratch_device/variants/, in order, each with its own kernel cache, with every other gpu_run.sh variable as given (GPU_TEST_CASES,
# SANITIZE_ONLY, BENCH_RUNS, ...). Prints each variant's step results; $OUT gets one archive of
# every variant's logs (variants.tar.xz) and a summary (variants.txt). A failing step fails the run;
# a step past VARIANT_STEP_TIMEOUT seconds (300) is stopped and reported as exit 124.
# VARIANT_STEPS_<name> gives one variant its own steps (name as pack_variants.sh printed it,
# without the NN_ prefix), VARIANT_ENV_<name> its own gpu_run.sh variables (e.g.
# VARIANT_ENV_segments="SANITIZE_ONLY=n_walkfused_seg"), VARIANT_BENCH_RUNS_<name> its own BENCH_RUNS.
#
#   VARIANT_STEPS="tests sanitize bench" GPU_TEST_CASES='walk_bwd_layout fused*' \
#   SANITIZE_ONLY=n_walkfused BENCH_RUNS="--programs --shapes M --arms spec,walk-fused" \
#   bash scripts/gpu_variants.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
logs="$(mktemp -d /tmp/gdnc-variants.XXXXXX)"
shopt -s nullglob
variants=(.scratch_device/variants/*.tar.xz)
[ "${#variants[@]}" -gt 0 ] || { echo "gpu_variants: no .scratch_device/variants/*.tar.xz (scripts/pack_variants.sh)"; exit 2; }
rc=0
for archive in "${variants[@]}"; do
  name=$(basename "$archive" .tar.xz)
  cp "$archive" .scratch_device/bin.tar.xz
  # VARIANT_STEPS_<name> (the archive's name without its NN_ prefix, e.g. VARIANT_STEPS_v3_dyn_trace)
  # overrides the steps for one variant: a trace or bound build needs only `bench`.
  steps_var="VARIANT_STEPS_${name#[0-9][0-9]_}"
  for step in ${!steps_var:-${VARIANT_STEPS:-tests sanitize bench}}; do
    mkdir -p "$logs/$name/$step"
    # A hung kernel must not take the call with it: each step stops after VARIANT_STEP_TIMEOUT s.
    # `profile` is scripts/ncu_profile.sh (KERNELS, SHAPE, NCU_BENCH_ARGS as there); the other
    # steps are gpu_run.sh's.
    script=scripts/gpu_run.sh
    [ "$step" = profile ] && script=scripts/ncu_profile.sh
    env_var="VARIANT_ENV_${name#[0-9][0-9]_}"
    # BENCH_RUNS holds spaces, which VARIANT_ENV_<name> cannot: VARIANT_BENCH_RUNS_<name> gives one
    # variant its own.
    bench_var="VARIANT_BENCH_RUNS_${name#[0-9][0-9]_}"
    # shellcheck disable=SC2086  # the assignments are meant to split
    env ${!env_var:-} BENCH_RUNS="${!bench_var:-${BENCH_RUNS:-}}" OUT="$logs/$name/$step" GDNC_CACHE_DIR="/tmp/gdnc-cache-$name" STEPS="$step" GDNC_COMMIT="$name" \
      timeout -k 10 "${VARIANT_STEP_TIMEOUT:-300}" bash "$script" > "$logs/$name/$step/stdout.txt" 2>&1
    status=$?
    [ "$status" -eq 0 ] || rc=1
    {
      echo "=== $name $step: exit $status"
      case "$step" in
        tests) grep -a "test cases\|assertions\|TIMED OUT\|ERROR" "$logs/$name/$step/stdout.txt" | head -20 ;;
        sanitize) grep -a "SUMMARY\|TIMED\|rror" "$logs/$name/$step/stdout.txt" | head -20 ;;
        bench) grep -av "^$\|^TR " "$logs/$name/$step/bench.log" 2>/dev/null | head -40 ;;
        profile) grep -a "Duration\|Issue Slots Busy\|Registers Per" "$logs/$name/$step/profile_details.txt" 2>/dev/null | head ;;
        *) tail -20 "$logs/$name/$step/stdout.txt" ;;
      esac
    } | tee -a "$OUT/variants.txt"
  done
done
tar -C "$logs" --exclude='*.ncu-rep' -cJf "$OUT/variants.tar.xz" .  # the reports' text pages stay
echo "=== variants done, rc=$rc" | tee -a "$OUT/variants.txt"
exit $rc
