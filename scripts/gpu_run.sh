#!/usr/bin/env bash
# Runs the GPU test set and the benchmarks on a machine with a GPU, from binaries built elsewhere
# and carried in .scratch_device/bin (see scripts/pack_device.sh). Logs go to $OUT.
#
# STEPS picks what runs, in this order (default: all but compare):
#   tests     the GPU doctest suites (GPU_SUITES), GDNC_DETERMINISM_REPEATS applies; each suite is
#             stopped after SUITE_TIMEOUT seconds (400) and prints its test cases' durations.
#             GPU_TEST_CASES='a*,b*' runs only those test cases (doctest's --test-case) and prints
#             their failing assertions; a comma inside a name is written '\,'.
#             TESTS_PARALLEL=1 runs them as six processes at once on the one GPU (the two slowest
#             suites split by test case; the timed suites are not benchmarks, and the sanitizers
#             stay serial)
#   python    the binding's unittest files (torch of the machine; FLA if .whl is carried;
#             PYTHON_PATTERN picks files, default test_*.py)
#   programs  gdn_bench --programs (per-program GPU time, PROGRAM_SHAPES, default N,M), once per
#             cp.carry of PROGRAM_CARRIES (default auto; "merge auto" for both)
#   host      gdn_bench --host-time
#   hostprof  bench/host_profile.py at HOSTPROF_SHAPE (M): where the Python call's host time goes
#             (fwd+bwd and ckpt), $OUT/host_profile.log and the xz-packed profiler traces
#   sweep     gdn_bench --sweep (the sm_90a hand-off threshold)
#   bench     gdn_bench timing table (BENCH_ARGS); BENCH_RUNS='ARGS;ARGS;...' runs one table per
#             entry instead, each headed by its arguments, all in $OUT/bench.log (e.g. the carries
#             with and without --max-doc-tokens longest in one device call)
#   compare   bench/compare.py: gdnc beside each peer of COMPARE_PEERS (flashqla fla) in its own
#             process, once per arm order of COMPARE_ORDERS (forward reversed), COMPARE_ARGS passed
#             to each (and COMPARE_ARGS_flashqla / COMPARE_ARGS_fla to one), COMPARE_BUDGET_S seconds per process (--budget-s); run files carried in
#             .scratch_device/compare/ are resumed; COMPARE_DEADLINE_S (seconds after this script's
#             start) stops a process that would run past it, so the results are still packed
#             within a device call's limit; bench/table.py builds the table. FlashQLA needs
#             .peers/flashqla.tar.xz carried (scripts/flashqla_bundle.sh; a carried
#             .scratch_device/tilelang-cache.tar.xz is used only with COMPARE_TILELANG_CACHE=1, and bench/table.py
#             never publishes such a run), FLA needs .whl
#             (fla-core 0.6.0, einops). Out: compare.md, compare.png, compare.tar.xz (run files,
#             logs, table JSON)
#   sanitize  compute-sanitizer's memcheck, racecheck, synccheck and initcheck over a small layer
#             (gdnc check: fwd+bwd, ckpt, graph replay, the fused forward, the backward walk's sm_90a body,
#             cp.ranks 2 as the proxy and as the ranks' phases, the verified carry); per run the ERROR
#             SUMMARY, logs packed in $OUT/sanitize.tar.xz; any error or a run past SANITIZE_TIMEOUT
#             (300 s) fails the step; SANITIZE_ONLY=text keeps the runs whose arguments contain it
#   in_walk   backward_norm "in_walk" beside the default: its GPU test case (backward_norm*), gdnc check
#             on in_walk layers of M and N (tails, ckpt, g = -20 with beta 1, g = 0), racecheck,
#             synccheck and memcheck on N, gdn_bench M, G, A (arms spec, norm-in-walk, spec-aa) and
#             --programs M; log in $OUT/in_walk.log; a failing check or sanitizer fails the step
#   digests   gdnc check --digests on fixed seeds (varlen tails, h0, ckpt, HV/H = 3), on one
#             32768-token document, and M's ckpt with and without the recompute's output (each held
#             to M's fwd+bwd bits): SHA-256 of every result; diff two runs' $OUT/digests.txt to show
#             a change kept every bit (DIGESTS_BASELINE=an earlier digests.txt prints the comparison)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-$PWD/out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
. scripts/device_env.sh || exit 2
export GDNC_COMMIT="${GDNC_COMMIT:-${GDN_COMMIT:-$(cat .scratch_device/TREE TREE 2>/dev/null | head -1)}}"
# FLA 0.6.0 hands its calls to FlashQLA when that is importable; "FLA" must time FLA.
export FLA_FLASH_QLA=0
export GDNC_LIBRARY="$PWD/$bin/libgdn.so" GDNC_REFERENCE_LIBRARY="$PWD/$bin/libgdn_reference.so"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
steps=" ${STEPS:-tests python programs host sweep bench} "
has() { [[ "$steps" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv | tee "$OUT/device.txt"
echo "tree: ${GDNC_COMMIT:-unknown commit} (the device copy has no .git)" | tee -a "$OUT/device.txt"
t0=$SECONDS
# Compile-ahead: `gdnc digest` compiles what the cache lacks, then hashes what decides the GPU work
# (the example layers' IR, call plans and machine code): compare runs of one digest resume each
# other across commits (bench/compare.py --code-digest).
digest_out=$("$bin/gdnc" digest examples/*.json --target sm_90a 2>&1)
tail -3 <<<"$digest_out"
echo "compile-ahead: $((SECONDS - t0)) s"
export GDNC_CODE_DIGEST="${GDNC_CODE_DIGEST:-$(awk '$2 == "all" {print $1}' <<<"$digest_out")}"
echo "code digest: ${GDNC_CODE_DIGEST:-none}" | tee -a "$OUT/device.txt"
rc=0
if has tests; then
  # Every TEST_SUITE of tests/test_gpu.cpp, in source order, unless GPU_SUITES names some.
  all_suites=$(sed -n 's/^TEST_SUITE("\([A-Za-z0-9_]*\)").*/\1/p' tests/test_gpu.cpp | awk '!seen[$0]++' | tr '\n' ' ')
  # A suite's exit status: a time-out is said as such, anything but 0 fails the step.
  suite_status() {
    [ "$2" -eq 124 ] || [ "$2" -eq 137 ] && echo "=== $1 TIMED OUT after ${SUITE_TIMEOUT:-400} s" | tee -a "$OUT/gpu_tests.log"
    [ "$2" -eq 0 ] || rc=1
  }
  if [ -n "${GPU_TEST_CASES:-}" ]; then
    # Only the named test cases (doctest's --test-case filter, comma-separated, wildcards): one
    # process; the failing assertions and the summary are printed, the whole log kept.
    timeout -k 30 "${SUITE_TIMEOUT:-400}" "$bin/gdn_gpu_tests" --test-case="$GPU_TEST_CASES" --duration=true \
      > "$OUT/gpu_tests.log" 2>&1
    suite_status "test cases $GPU_TEST_CASES" "$?"
    grep -E "ERROR|test cases:|assertions:|^[0-9.]+ s: " "$OUT/gpu_tests.log" | head -60
  elif [ "${TESTS_PARALLEL:-0}" = 1 ] && [ -z "${GPU_SUITES:-}" ]; then
    # Six processes at once, each group's output reported when all are done. The groups split the
    # two slowest suites by test case, so that no group holds much more than a sixth of the set's
    # time (about 200 s each on a warm H100; the 8191-document case alone is 196 s).
    big_det='cp.segments auto on the fused path: more than 8191*'
    big_fused='cp.segments auto on the fused forward*,fused forward against the fp64 reference*'
    rest=$(echo "$all_suites" | tr ' ' '\n' | grep -v -x -e gpu_determinism -e gpu_fused -e gpu_layer -e '' | paste -sd, -)
    # suite filter | test-case filter | test-case exclusion
    groups=("gpu_determinism|$big_det|" "gpu_determinism||$big_det" "gpu_fused|$big_fused|"
            "gpu_fused||$big_fused" "gpu_layer||" "$rest||")
    for i in "${!groups[@]}"; do
      IFS='|' read -r suites cases excluded <<<"${groups[$i]}"
      filters=(--test-suite="$suites")
      [ -n "$cases" ] && filters+=(--test-case="$cases")
      [ -n "$excluded" ] && filters+=(--test-case-exclude="$excluded")
      ( timeout -k 30 "${SUITE_TIMEOUT:-400}" "$bin/gdn_gpu_tests" "${filters[@]}" --duration=true \
          > "/tmp/gpu_tests_$i.log" 2>&1
        echo "$?" > "/tmp/gpu_tests_$i.rc" ) &
    done
    wait
    for i in "${!groups[@]}"; do
      echo "=== ${groups[$i]}" | tee -a "$OUT/gpu_tests.log"
      tee -a "$OUT/gpu_tests.log" < "/tmp/gpu_tests_$i.log" | tail -8
      suite_status "${groups[$i]}" "$(cat "/tmp/gpu_tests_$i.rc")"
    done
  else
    for suite in ${GPU_SUITES:-$all_suites}; do
      echo "=== $suite ($((SECONDS - t0)) s)"
      # A hung kernel would eat the whole device call: each suite gets SUITE_TIMEOUT seconds (the
      # slowest, gpu_determinism with its 20 repeats at M, took about 120 s on the H200).
      timeout -k 30 "${SUITE_TIMEOUT:-400}" "$bin/gdn_gpu_tests" --test-suite="$suite" --duration=true 2>&1 \
        | tee -a "$OUT/gpu_tests.log" | tail -25
      suite_status "$suite" "${PIPESTATUS[0]}"
    done
  fi
fi
if has python || has compare; then
  # FLA's Triton kernels compile (and autotune) for about 140 s per head layout on a fresh
  # machine: a cache brought back from an earlier run ($OUT/triton-cache.tar.xz, carried as
  # .scratch_device/triton-cache.tar.xz) saves that, for the binding's tests and compare_fla alike.
  # xz, not gzip: three head layouts' kernels came to 16 MB gzipped, the limit on a file brought
  # back, and to a third of that in xz.
  export TRITON_CACHE_DIR=/tmp/triton-cache
  mkdir -p "$TRITON_CACHE_DIR"
  [ -f .scratch_device/triton-cache.tar.xz ] && tar xJf .scratch_device/triton-cache.tar.xz -C "$TRITON_CACHE_DIR"
  touch /tmp/triton-cache.stamp  # brought back only if something new lands (8 files come back at most)
fi
if has python; then
  echo "=== python binding ($((SECONDS - t0)) s)"
  python3 -m unittest discover -s python/tests -p "${PYTHON_PATTERN:-test_*.py}" -v 2>&1 | tee -a "$OUT/python.log" | tail -25
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
bench() { "$bin/gdn_bench" "$@" 2>&1; }
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
# sanitized_check TOOL LOG SUMMARY ARGS...: compute-sanitizer's TOOL over `gdnc check ARGS` into
# LOG; appends "TOOL | gdnc check ARGS | exit N | summary" to SUMMARY and prints it (racecheck ends
# with a RACECHECK SUMMARY, the other tools with an ERROR SUMMARY); on failure also prints the
# first report: a call whose $OUT holds too many files loses the logs, and a hazard's two accesses
# are what the next fix needs. Returns the run's exit status.
sanitized_check() {
  local tool=$1 log=$2 summary_file=$3 st summary
  shift 3
  timeout -k 10 "${SANITIZE_TIMEOUT:-300}" "$sanitizer" --tool "$tool" --error-exitcode 99 \
    "$bin/gdnc" check "$@" > "$log" 2>&1
  st=$?
  summary=$(grep -hE "(ERROR|RACECHECK) SUMMARY" "$log" | tail -1)
  echo "$tool | gdnc check $* | exit $st | ${summary:-no summary}" | tee -a "$summary_file"
  [ "$st" -eq 0 ] || grep -m 1 -A 24 -E "^========= (Error|Warning|Race|Invalid|Uninitialized|Barrier)" "$log" | head -25
  return "$st"
}
if has programs; then
  echo "=== programs ($((SECONDS - t0)) s)"
  for carry in ${PROGRAM_CARRIES:-auto}; do
    bench --programs --shapes "${PROGRAM_SHAPES:-N,M}" --carry "$carry" --warmup 3 --samples 9
  done | tee "$OUT/programs.log"
fi
has host && { echo "=== host time ($((SECONDS - t0)) s)"; bench --host-time | tee "$OUT/host.log"; }
if has hostprof; then
  echo "=== host profile ($((SECONDS - t0)) s)"
  PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" python3 bench/host_profile.py --shape "${HOSTPROF_SHAPE:-M}" \
    --out "$OUT" > "$OUT/host_profile.log" 2>&1 || rc=1
  grep -E "host, |ms of host time|^gap" "$OUT/host_profile.log"
fi
has sweep && { echo "=== sweep ($((SECONDS - t0)) s)"; bench --sweep --groups 3 --samples 6 --warmup 4 | tee "$OUT/sweep.log"; }
if has bench; then
  echo "=== bench ($((SECONDS - t0)) s)"
  # A shortened protocol by default so tests and benchmark fit one 10-minute call.
  if [[ -n "${BENCH_RUNS:-}" ]]; then
    IFS=';' read -r -a bench_runs <<<"$BENCH_RUNS"
    for args in "${bench_runs[@]}"; do
      echo "--- gdn_bench $args"
      # shellcheck disable=SC2086  # each entry is a list of options
      bench $args
    done | tee "$OUT/bench.log"
  else
    bench ${BENCH_ARGS:---shapes N,M,G,A --groups 3 --samples 6 --warmup 4} | tee "$OUT/bench.log"
  fi
fi
if has sanitize; then
  echo "=== compute-sanitizer ($((SECONDS - t0)) s)"
  sdir=/tmp/sanitize && rm -rf "$sdir" && mkdir -p "$sdir"
  sed 's/"graph": "off"/"graph": "replay"/; s/"name": "shape_n"/"name": "shape_n_replay"/' examples/n.json > "$sdir/n_replay.json"
  # The fused forward (its sm_90a body is warp-specialized: mbarrier ring, wgmma) with a one-token tail.
  sed 's/"name": "shape_n"/"name": "shape_n_fused", "forward": "fused"/' examples/n.json > "$sdir/n_fused.json"
  # The reverse walk's sm_90a body (mbarrier ring, wgmma, dv_local inside) at N's heads.
  sed 's/"name": "shape_n"/"name": "shape_n_walkbwd128", "walk_bwd_slab": 128/' examples/n.json > "$sdir/n_walkbwd128.json"
  # The proxy of context parallelism: 766 tokens over 2 ranks, the boundary inside a chunk of the second document;
  # then each rank's KCP phases in turn on 768 tokens (384 a rank keeps every rank's slice 16-byte aligned).
  sed 's/"name": "shape_n"/"name": "shape_n_ranks2"/; s/"ranks": 1/"ranks": 2/' examples/n.json > "$sdir/n_ranks2.json"
  # cp.carry "verified": the walks from zero, the re-walks and, both ways, the merge path for the
  # chains marked (a 65-token document in 3 pinned segments has an empty segment: the gate test
  # marks it before the walks; 700 and 300 tokens verify); with g = 0 the gate test marks every chain.
  sed 's/"name": "shape_n"/"name": "shape_n_verified"/; s/"segments": "auto"/"segments": 3, "carry": "verified"/' \
    examples/n.json > "$sdir/n_verified.json"
  # The verified carry on the fused forward: its speculate and verify walks (mbarrier ring, a vote
  # on a named barrier) and the merge path of the chains they mark (the 65-token document's).
  sed 's/"name": "shape_n"/"name": "shape_n_fused_verified", "forward": "fused", "walk_bwd_slab": 64/; s/"segments": "auto"/"segments": 3, "carry": "verified"/' \
    examples/n.json > "$sdir/n_fused_verified.json"
  # The same on the reverse walk's sm_90a body: its own verified walks, the marked-only dv_local and W
  # (walk_bwd_layout "auto" takes the fused layout there; n_split_verified128 pins the split one).
  sed 's/"name": "shape_n"/"name": "shape_n_fused_verified128", "forward": "fused", "walk_bwd_slab": 128/; s/"segments": "auto"/"segments": 3, "carry": "verified"/' \
    examples/n.json > "$sdir/n_fused_verified128.json"
  sed 's/"name": "shape_n"/"name": "shape_n_split_verified128", "forward": "fused", "walk_bwd_slab": 128, "walk_bwd_layout": "split"/; s/"segments": "auto"/"segments": 3, "carry": "verified"/' \
    examples/n.json > "$sdir/n_split_verified128.json"
  # The reverse walk with chunk_bwd's body (walk_bwd_layout "fused"; chunk_bwd idles on sm_90a).
  sed 's/"name": "shape_n"/"name": "shape_n_walkfused", "forward": "fused", "walk_bwd_slab": 128, "backward_w": "walk", "walk_bwd_layout": "fused"/; s/"segments": "auto"/"segments": 1/' \
    examples/n.json > "$sdir/n_walkfused.json"
  # The same with segments (the verified carry): its speculate, verify and marked-chain walks are
  # the fused body (the 65-token document's empty segment is marked before the walks).
  sed 's/"name": "shape_n"/"name": "shape_n_walkfused_seg", "forward": "fused", "walk_bwd_slab": 128, "backward_w": "walk", "walk_bwd_layout": "fused"/; s/"segments": "auto"/"segments": 3, "carry": "verified"/' \
    examples/n.json > "$sdir/n_walkfused_seg.json"
  # The merge carry with its saved maps (the default "auto" takes the verified carry on n.json).
  sed 's/"name": "shape_n"/"name": "shape_n_merge"/; s/"segments": "auto"/"segments": "auto", "carry": "merge"/' \
    examples/n.json > "$sdir/n_merge.json"
  # A 4200-token document is split in two by cp.segments "auto" (slots, the saved segment maps).
  # 765 tokens run the plans without segment programs (one segment row); with the bound 3000 the
  # forward and the recompute do, and the hand-off's backward too.
  runs=("examples/n.json --docs 65,700 --seed 3" "examples/n.json --docs 65,700 --seed 3 --ckpt"
        "examples/n.json --docs 4200,65,300 --seed 3"
        "examples/n.json --docs 3000,2500,129 --seed 3 --max-doc-tokens 3000 --ckpt"
        "$sdir/n_replay.json --docs 65,700 --seed 3" "$sdir/n_fused.json --docs 65,700,1 --seed 3"
        "$sdir/n_walkbwd128.json --docs 65,700,1 --seed 3" "$sdir/n_ranks2.json --docs 65,700,1 --seed 3"
        "$sdir/n_ranks2.json --docs 65,700,3 --seed 3 --phases" "$sdir/n_verified.json --docs 65,700,300 --seed 3"
        "$sdir/n_verified.json --docs 700,300 --seed 3 --gate 0" "$sdir/n_merge.json --docs 4200,65,300 --seed 3"
        "$sdir/n_fused_verified.json --docs 65,700,300 --seed 3" "$sdir/n_fused_verified.json --docs 700,300 --seed 3 --ckpt"
        "$sdir/n_fused_verified128.json --docs 65,700,300 --seed 3"
        "$sdir/n_fused_verified128.json --docs 700,300 --seed 3 --gate 0 --ckpt"
        "$sdir/n_split_verified128.json --docs 65,700,300 --seed 3"
        "$sdir/n_walkfused.json --docs 65,700,1 --seed 3"
        "$sdir/n_walkfused.json --docs 700,64,1 --seed 3 --ckpt"
        "$sdir/n_walkfused_seg.json --docs 65,700,300 --seed 3"
        "$sdir/n_walkfused_seg.json --docs 700,300 --seed 3 --gate 0 --ckpt")
  if [ -n "${SANITIZE_ONLY:-}" ]; then  # only the runs whose arguments contain it
    only=()
    for r in "${runs[@]}"; do [[ "$r" == *"$SANITIZE_ONLY"* ]] && only+=("$r"); done
    runs=("${only[@]}")
  fi
  for tool in memcheck racecheck synccheck initcheck; do
    for i in "${!runs[@]}"; do
      # shellcheck disable=SC2086  # the arguments are meant to split
      sanitized_check "$tool" "$sdir/${tool}_$i.log" "$sdir/summary.txt" ${runs[$i]} || rc=1
    done
  done
  tar -C "$sdir" -cJf "$OUT/sanitize.tar.xz" .
fi
if has in_walk; then
  echo "=== backward_norm in_walk ($((SECONDS - t0)) s)"
  idir=/tmp/in_walk && rm -rf "$idir" && mkdir -p "$idir"
  sed 's/"name": "shape_m"/"name": "shape_m_in_walk", "backward_norm": "in_walk"/' examples/m.json > "$idir/m.json"
  # N's heads take 32-wide backward slabs and segments by default; in_walk needs the fused layout.
  sed 's/"name": "shape_n"/"name": "shape_n_in_walk", "backward_norm": "in_walk", "forward": "fused", "backward_w": "walk", "walk_bwd_slab": 128, "walk_bwd_layout": "fused"/; s/"segments": "auto"/"segments": 1/' \
    examples/n.json > "$idir/n.json"
  {
    timeout -k 10 "${SUITE_TIMEOUT:-400}" "$bin/gdn_gpu_tests" --test-case="backward_norm*" --duration=true 2>&1 \
      | grep -E "ERROR|MESSAGE|test cases:|assertions:|^[0-9.]+ s: "
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    for args in "$idir/m.json --docs 1097,64,33 --seed 4" "$idir/m.json --docs 1097,64,33 --seed 4 --ckpt" \
                "$idir/m.json --docs 700,300 --seed 5 --gate -20 --beta 1" "$idir/n.json --docs 65,700,1 --seed 3" \
                "$idir/n.json --docs 4200,65,300 --seed 3 --ckpt" "$idir/n.json --docs 700,300 --seed 3 --gate 0"; do
      echo "--- gdnc check $args"
      # shellcheck disable=SC2086  # the arguments are meant to split
      timeout -k 10 120 "$bin/gdnc" check $args 2>&1 | tail -8
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
    done
    for tool in racecheck synccheck memcheck; do
      sanitized_check "$tool" "$idir/$tool.log" "$idir/summary.txt" "$idir/n.json" --docs 65,700,1 --seed 3 || rc=1
    done
    bench --shapes M,G,A --arms spec,norm-in-walk,spec-aa --groups 3 --samples 6 --warmup 3
    bench --programs --shapes M --arms spec,norm-in-walk --warmup 3 --samples 9
  } > >(tee "$OUT/in_walk.log") 2>&1  # not a pipe: the group's rc=1 must reach this shell
fi
if has digests; then
  echo "=== digests ($((SECONDS - t0)) s)"
  : > "$OUT/digests.txt"
  for args in "examples/n.json --docs 2049,3001,3142 --seed 1" "examples/n.json --docs 1,15,63,64,65,700,2000 --seed 2" \
              "examples/n.json --docs 1500,2700 --seed 3 --ckpt" "examples/m.json --docs 1097,64,33 --seed 4" \
              "examples/n.json --docs 32768 --seed 11" "examples/m.json --docs 1097,64,33 --seed 4 --ckpt" \
              "examples/m.json --docs 1097,64,33 --seed 4 --ckpt-output"; do
    echo "--- gdnc check $args --digests" | tee -a "$OUT/digests.txt"
    # shellcheck disable=SC2086  # the arguments are meant to split
    "$bin/gdnc" check $args --digests 2>&1 | tee -a "$OUT/digests.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  done
  # The checkpointed step, with and without the recompute's output, has fwd+bwd's bits.
  m_run() { awk -v want="--- gdnc check examples/m.json --docs 1097,64,33 --seed 4$1 --digests" \
    '/^---/ { on = ($0 == want) } on && /sha256/' "$OUT/digests.txt"; }
  for step in " --ckpt" " --ckpt-output"; do
    if [ -n "$(m_run "")" ] && [ "$(m_run "$step")" = "$(m_run "")" ]; then
      echo "digests: m$step has fwd+bwd's bits" | tee -a "$OUT/digests.txt"
    else
      echo "digests: m$step DIFFERS from fwd+bwd" | tee -a "$OUT/digests.txt"
      rc=1
    fi
  done
  if [ -n "${DIGESTS_BASELINE:-}" ]; then
    # Only the runs both files have: a baseline without the long document compares the rest.
    if diff <(grep -E '^---|sha256' "$DIGESTS_BASELINE") <(grep -E '^---|sha256' "$OUT/digests.txt" | head -n "$(grep -cE '^---|sha256' "$DIGESTS_BASELINE")") > /dev/null; then
      echo "digests: every bit as in $DIGESTS_BASELINE" | tee -a "$OUT/digests.txt"
    else
      echo "digests: DIFFERENT from $DIGESTS_BASELINE" | tee -a "$OUT/digests.txt"
    fi
  fi
fi
if has compare; then
  cdir=/tmp/compare && rm -rf "$cdir" && mkdir -p "$cdir"  # a warm machine keeps /tmp: only carried runs resume
  [ -d .scratch_device/compare ] && cp .scratch_device/compare/*.json "$cdir"/ 2>/dev/null
  if [[ " ${COMPARE_PEERS:-flashqla fla} " == *" flashqla "* ]]; then
    mkdir -p /tmp/flashqla && tar xJf .peers/flashqla.tar.xz -C /tmp/flashqla \
      || { echo "compare: .peers/flashqla.tar.xz missing or broken (scripts/flashqla_bundle.sh; carry it)"; rc=1; }
    # TileLang compiles FlashQLA's kernels on the first call per head layout (about 40 s forward,
    # 60 s backward): a cache brought back from an earlier run saves that.
    # FlashQLA ran 1.55-1.69 ms at M fwd in every process that loaded its kernels from a carried
    # cache and 1.23 ms in those that compiled them (docs/PERF.md): a carried cache stays packed
    # unless COMPARE_TILELANG_CACHE=1 (a quick look, never published), and the run file records
    # which state the peer ran in.
    export TILELANG_CACHE_DIR=/tmp/tilelang-cache
    touch /tmp/tilelang-cache.stamp
  fi
  # Each FlashQLA process starts from the cache state it records: an empty cache ("fresh": it
  # compiles its kernels) or the carried one ("carried"). A second process must not find the
  # first one's kernels on disk: that made the reversed order's FlashQLA a cache-loaded one
  # (1.665 against 1.296 ms at M fwd, docs/PERF.md 2026-12-03) while its run file said "fresh".
  tilelang_cache_for_process() {
    rm -rf "$TILELANG_CACHE_DIR" && mkdir -p "$TILELANG_CACHE_DIR"
    export GDNC_PEER_KERNEL_CACHE=fresh
    if [ "${COMPARE_TILELANG_CACHE:-0}" = 1 ] && [ -f .scratch_device/tilelang-cache.tar.xz ]; then
      tar xJf .scratch_device/tilelang-cache.tar.xz -C "$TILELANG_CACHE_DIR" && GDNC_PEER_KERNEL_CACHE=carried
    fi
  }
  for order in ${COMPARE_ORDERS:-forward reversed}; do
    for peer in ${COMPARE_PEERS:-flashqla fla}; do
      echo "=== compare: gdnc beside $peer, $order order ($((SECONDS - t0)) s)" | tee -a "$cdir/compare.log"
      run="$cdir/run_${peer}_${order}.json" resume=()
      [ -f "$run" ] && resume=(--resume "$run")
      left=$(( ${COMPARE_DEADLINE_S:-100000} - (SECONDS - t0) ))
      # torch.compile's kernels (FlashQLA's L2 norm) keep the launch config Inductor benchmarked at
      # their first call in this cache: a process must tune its own, not inherit an earlier one's.
      export TORCHINDUCTOR_CACHE_DIR="/tmp/inductor-cache-$peer-$order"
      rm -rf "$TORCHINDUCTOR_CACHE_DIR" && mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
      if [ "$left" -lt 90 ]; then
        echo "compare: $peer $order not started: ${left} s left before COMPARE_DEADLINE_S" | tee -a "$cdir/compare.log"
        continue
      fi
      if [ "$peer" = flashqla ]; then
        tilelang_cache_for_process
        timeout -k 10 "$left" env PYTHONPATH="$PWD/python:/tmp/flashqla" CUDA_HOME=/usr/local/cuda \
          python3 bench/compare.py --peer flashqla --order "$order" ${COMPARE_ARGS:-} ${COMPARE_ARGS_flashqla:-} \
          --budget-s "${COMPARE_BUDGET_S:-inf}" "${resume[@]}" --out "$run.new" 2>&1 | tee -a "$cdir/compare.log"
      else
        timeout -k 10 "$left" python3 bench/compare.py --peer "$peer" --order "$order" ${COMPARE_ARGS:-} ${COMPARE_ARGS_fla:-} \
          --budget-s "${COMPARE_BUDGET_S:-inf}" "${resume[@]}" --out "$run.new" 2>&1 | tee -a "$cdir/compare.log"
      fi
      [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
      [ -f "$run.new" ] && mv "$run.new" "$run"
    done
  done
  python3 bench/table.py "$cdir"/run_*.json --out "$cdir/compare" 2>&1 | tee -a "$cdir/compare.log"
  cp "$cdir/compare.md" "$OUT/" 2>/dev/null; cp "$cdir/compare.png" "$OUT/" 2>/dev/null
  tar -C "$cdir" -cJf "$OUT/compare.tar.xz" .
  if [ -n "$(find "${TILELANG_CACHE_DIR:-/nonexistent}" -newer /tmp/tilelang-cache.stamp -type f 2>/dev/null | head -1)" ]; then
    tar -I "xz -T0" -cf "$OUT/tilelang-cache.tar.xz" -C "$TILELANG_CACHE_DIR" .
  fi
fi
if { has python || has compare; } && [ -n "$(find "$TRITON_CACHE_DIR" -newer /tmp/triton-cache.stamp -type f | head -1)" ]; then
  tar -I "xz -T0" -cf "$OUT/triton-cache.tar.xz" -C "$TRITON_CACHE_DIR" .
fi
# rc counts the failures of tests, python, sanitize, digests and compare among the steps asked for.
echo "=== done ($((SECONDS - t0)) s), rc=$rc, steps asked:$(for s in $steps; do printf ' %s' "$s"; done)"
exit $rc
