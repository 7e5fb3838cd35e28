#!/usr/bin/env bash
# Which programs' cubins differ between a commit and the working tree, for every example spec and
# target (no GPU needed). A kernel change whose cubins are byte-identical to a GPU-tested commit's
# carries that commit's GPU results; the programs listed as DIFF need a GPU run.
#
#   scripts/compare_cubins.sh 7ec4ba3      # builds gdnc at 7ec4ba3 in a temporary worktree
set -euo pipefail
cd "$(dirname "$0")/.."
rev="${1:?usage: scripts/compare_cubins.sh <commit>}"
work="$(mktemp -d /tmp/gdnc-cubins.XXXXXX)"
trap 'git worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/tree" "$rev" >/dev/null
(cd "$work/tree" && cmake --preset release >/dev/null && cmake --build build -j"$(nproc)" --target gdnc >/dev/null)
cmake --build build -j"$(nproc)" --target gdnc >/dev/null
GDNC_CACHE_DIR="$work/new" build/gdnc compile examples/*.json >/dev/null
GDNC_CACHE_DIR="$work/old" "$work/tree/build/gdnc" compile examples/*.json >/dev/null
python3 - "$work/old" "$work/new" "$rev" <<'EOF'
import json, sys, pathlib
def index(root):
    out = {}
    for entry in pathlib.Path(root, "entries").iterdir():
        info = json.loads((entry / "manifest.json").read_text())["info"]
        program, target = entry.name.split(".")[1:3]
        out[(info["layer"], program, target)] = (entry / "program.cubin").read_bytes()
    return out
old, new, rev = index(sys.argv[1]), index(sys.argv[2]), sys.argv[3]
differ = 0
for key in sorted(set(old) | set(new)):
    state = "same" if old.get(key) == new.get(key) else "DIFF" if key in old and key in new else "only in one"
    differ += state != "same"
    print(f"{state:<11} {key[0]:<10} {key[1]:<15} {key[2]}")
print(f"{differ} of {len(set(old) | set(new))} cubins differ from {rev}")
EOF
