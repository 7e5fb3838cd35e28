#!/usr/bin/env bash
# Builds the libFuzzer targets (preset fuzz: clang 14, ASan + UBSan; fuzz/) and runs each with a
# fixed seed and a fixed run count, so every run tries the same inputs: deterministic, it cannot
# fail a landing at random. Prints executions, time and crashes per target; exits 1 on a crash,
# whose input is left in build-fuzz/crashes/ (turn it into a regression test: fuzz/README.md).
#
# Inputs: examples/, tests/specs/invalid/, fuzz/seeds/<target>/ and fuzz/regressions/<target>/
# (inputs that once crashed: they run first, every time). FUZZ_SEED, FUZZ_RUNS_SPEC and
# FUZZ_RUNS_MANIFEST override the defaults (about 20 s each on CI's 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
seed="${FUZZ_SEED:-1}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"$(nproc)"
mkdir -p build-fuzz/crashes
# What else would make two runs of one seed differ is addresses: libFuzzer learns from the
# operands of comparisons, pointers among them. So ASLR is off (setarch -R, where the kernel lets
# us), the environment is fixed (its size moves the stack), and the manifest target's directory is
# fixed per checkout (on tmpfs where there is one, for speed).
scratch=/dev/shm
[ -d "$scratch" ] || scratch=$PWD/build-fuzz
fixture="$scratch/gdn_fuzz_manifest.$(printf %s "$PWD" | sha1sum | cut -c1-12)"
launch=(env -i PATH=/usr/lib/llvm-14/bin:/usr/bin:/bin GDNC_FUZZ_DIR="$fixture")
if setarch -R true 2>/dev/null; then
  launch+=(setarch -R)
else
  echo "fuzz: setarch -R is not allowed here; runs may differ from one machine to another"
fi
failed=0
run_target() {
  local name=$1 runs=$2
  shift 2
  local corpus=build-fuzz/corpus/$name log=build-fuzz/$name.log
  # A fresh corpus directory each time: new units from an earlier run would change what runs.
  rm -rf "$corpus" build-fuzz/crashes/"$name"-*
  mkdir -p "$corpus"
  local start=$SECONDS rc=0
  # -reload=0: no periodic rereading of the corpus directory (a timer).
  "${launch[@]}" build-fuzz/fuzz/gdn_fuzz_"$name" -seed="$seed" -runs="$runs" -max_len=4096 -reload=0 -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/"$name"- "$corpus" "$@" >"$log" 2>&1 \
    || rc=$?
  local executions crashes
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  crashes=$(find build-fuzz/crashes -name "$name-*" | wc -l)
  coverage=$(sed -n 's/.*DONE *cov: \([0-9]*\) ft: \([0-9]*\).*/\1 edges, \2 features/p' "$log")
  echo "fuzz $name: ${executions:-?} executions in $((SECONDS - start)) s, $crashes crashes" \
       "(seed $seed, -runs=$runs; ${coverage:-coverage ?})"
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    tail -40 "$log"
    failed=1
  fi
}
run_target spec "${FUZZ_RUNS_SPEC:-200000}" fuzz/regressions/spec examples tests/specs/invalid
run_target manifest "${FUZZ_RUNS_MANIFEST:-40000}" fuzz/regressions/manifest fuzz/seeds/manifest examples \
  tests/specs/invalid
exit "$failed"
