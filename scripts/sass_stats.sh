#!/usr/bin/env bash
# Static machine code of one program, without a GPU: compiles SPEC into a scratch cache, then
# disassembles the cubin with nvdisasm (PyPI's nvidia-cuda-nvdisasm, fetched into .scratch_tools/
# on first use: the CUDA toolkit here has no disassembler) and prints the registers and spills,
# the instruction count by opcode, the count between barriers (a kernel's phases, in order) and,
# for a warp-specialized kernel, the code of each role (from one setmaxnreg to the next).
# Comparing two commits' counts is how the backward's address-arithmetic overhead was found
# (docs/PERF.md).
#
#   scripts/sass_stats.sh examples/m.json chunk_bwd [sm_90a]     (SASS=1 also prints the listing)
#   scripts/sass_stats.sh docs/results/fused_bwd_profile_h100/m_fused.json state_walk_bwd
set -euo pipefail
cd "$(dirname "$0")/.."
spec="${1:?usage: scripts/sass_stats.sh SPEC PROGRAM [TARGET]}"
program="${2:?usage: scripts/sass_stats.sh SPEC PROGRAM [TARGET]}"
target="${3:-sm_90a}"
tools=.scratch_tools
nvdisasm="$( (find "$tools" -name nvdisasm -type f 2>/dev/null || true) | head -1)"
if [ -z "$nvdisasm" ]; then
  mkdir -p "$tools"
  python3 -m pip download -q --no-deps -d "$tools" nvidia-cuda-nvdisasm
  python3 -m zipfile -e "$tools"/nvidia_cuda_nvdisasm-*.whl "$tools/nvdisasm-wheel"
  nvdisasm="$(find "$tools" -name nvdisasm -type f | head -1)"
  chmod +x "$nvdisasm"
fi
cache="$(mktemp -d /tmp/gdnc-sass.XXXXXX)"
trap 'rm -rf "$cache"' EXIT
GDNC_CACHE_DIR="$cache" build/gdnc compile "$spec" --target "$target" >/dev/null
entry="$(find "$cache/entries" -maxdepth 1 -name "*.${program}.${target}.*" | head -1)"
[ -n "$entry" ] || { echo "sass_stats: no program '$program' for $target in $spec (see gdnc ir $spec)" >&2; exit 2; }
"$nvdisasm" -c "$entry/program.cubin" > "$cache/listing.sass"
[ "${SASS:-0}" = 1 ] && cat "$cache/listing.sass"
python3 - "$cache/listing.sass" "$entry/manifest.json" <<'EOF'
import collections, json, re, sys
info = json.load(open(sys.argv[2]))["info"]
print(f"registers {info['registers']}, spill stores {info['spill_store_bytes']} bytes, "
      f"dynamic shared memory {info['dynamic_smem_bytes']} bytes, {info['threads']} threads")
ops, segments, current = collections.Counter(), [], collections.Counter()
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
    if not m:
        continue
    op = m.group(2)
    ops[op] += 1
    current[op] += 1
    if op in ("BAR", "EXIT"):
        segments.append(current)
        current = collections.Counter()
print(f"{sum(ops.values())} instructions: " + " ".join(f"{k} {v}" for k, v in ops.most_common(16)))
print("between barriers (in code order):")
for i, c in enumerate(segments):
    mma = c["HGMMA"] + c["HMMA"]
    print(f"  {i + 1:3d} {sum(c.values()):6d}  mma {mma:3d}  " + " ".join(f"{k} {v}" for k, v in c.most_common(7)))
# A warp-specialized kernel's roles start where each branch sets its register count: the code
# from one setmaxnreg to the next is (mostly) one role's, which is what a role runs per chunk.
roles, current, label = [], collections.Counter(), "entry"
for line in open(sys.argv[1]):
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)(\S*)\s*([^;]*)", line)
    if not m:
        continue
    if m.group(2) == "USETMAXREG":
        roles.append((label, current))
        current = collections.Counter()
        label = f"setmaxnreg {int(m.group(4).split(',')[-1].strip(), 16)}"
    current[m.group(2)] += 1
roles.append((label, current))
if len(roles) > 1:
    print("by warp role (code from one setmaxnreg to the next):")
    for label, c in roles:
        print(f"  {label:16s} {sum(c.values()):6d} instructions ({16 * sum(c.values()) / 1024:.1f} KB)  "
              + "  ".join(f"{k} {c[k]}" for k in ("HGMMA", "MUFU", "BAR", "SYNCS", "STL", "LDL")))
EOF
