#!/usr/bin/env bash
# The GPU gate of a branch packed with scripts/pack_tree.sh, on the device machine, beside the
# carried main build (.scratch_device/bin): the branch's GPU suites and digests, the digests
# compared with main's (same bits or not, per result), then `gdn_bench --programs` alternated
# main, branch, main, branch in separate processes (the per-program drift shows in the repeats).
# The branch's test log and digests go to $OUT/NAME.
#
#   here:    git checkout BRANCH && cmake --build build && scripts/pack_tree.sh BRANCH && git checkout main
#            && cmake --build build && scripts/pack_device.sh
#   device:  scripts/gate_tree.sh BRANCH            (SKIP_TESTS=1: digests and programs only)
#   carry:   .scratch_device/bin and .scratch_device/BRANCH.tar.xz (not all of .scratch_device: each
#            packed tree is ~10 MB and a call carries 64 MiB at most)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
name="${1:?usage: scripts/gate_tree.sh NAME (a .scratch_device/NAME.tar.xz from scripts/pack_tree.sh)}"
[ -f ".scratch_device/$name.tar.xz" ] || { echo "gate_tree: no .scratch_device/$name.tar.xz (scripts/pack_tree.sh $name)" >&2; exit 2; }
OUT="${OUT:-$PWD/out}"
main_dir="$PWD" tree="/tmp/gate-$name"
rm -rf "$tree" && mkdir -p "$tree" && tar xJf ".scratch_device/$name.tar.xz" -C "$tree"
shapes="${PROGRAM_SHAPES:-M}"
steps="tests digests"
[ "${SKIP_TESTS:-0}" = 1 ] && steps="digests"
(cd "$tree" && OUT="$OUT/$name" GDNC_CACHE_DIR="/tmp/gate-cache-$name" STEPS="$steps" ./scripts/gpu_run.sh) \
  | grep -E "^===|assertions|Status|FAIL|ERROR|error" ; rc=${PIPESTATUS[0]}
# Only the branch's logs go to $OUT (a device call brings back at most 8 files); the rest to /tmp.
OUT=/tmp/gate-main STEPS=digests ./scripts/gpu_run.sh > /tmp/gate-main.log 2>&1 || main_rc=$?
if [ -n "${main_rc:-}" ] || [ ! -s /tmp/gate-main/digests.txt ]; then
  echo "digests: main's run failed (rc ${main_rc:-0}); its log:" && tail -20 /tmp/gate-main.log
  rc=1
elif cmp -s /tmp/gate-main/digests.txt "$OUT/$name/digests.txt"; then
  echo "digests: $name has the same bits as main in every result"
else
  echo "digests: $name differs from main in:"
  diff /tmp/gate-main/digests.txt "$OUT/$name/digests.txt" | sed -n 's/^> *\([a-z0-9]*\) *sha256.*/  \1/p' | sort | uniq -c
fi
for round in 1 2; do
  echo "--- programs $shapes, main (round $round)"
  OUT="/tmp/gate-main-programs-$round" STEPS=programs PROGRAM_SHAPES="$shapes" ./scripts/gpu_run.sh 2>&1 \
    | grep -E "^  [0-9]+ |total"
  echo "--- programs $shapes, $name (round $round)"
  (cd "$tree" && OUT="/tmp/gate-$name-programs-$round" GDNC_CACHE_DIR="/tmp/gate-cache-$name" STEPS=programs \
    PROGRAM_SHAPES="$shapes" ./scripts/gpu_run.sh 2>&1 | grep -E "^  [0-9]+ |total")
done
cd "$main_dir" || exit 2
echo "gate_tree $name: tests rc=$rc"
exit "$rc"
