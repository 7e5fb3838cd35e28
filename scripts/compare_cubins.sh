#!/usr/bin/env bash
# Which programs' machine code differs between a commit and the working tree, for every example
# spec and target (no GPU needed). Per program: "same" (code, kernel attributes and constants
# byte-identical; line tables are ignored, they move with any header edit), "same code, other
# sections differ" (the .text is identical, attribute or constant sections are not), "DIFF code".
# A program whose code is identical to a GPU-tested commit's carries that commit's GPU results.
#
#   scripts/compare_cubins.sh REV      # builds gdnc at commit REV in a temporary worktree
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
import json, struct, sys, pathlib

def code_sections(elf):
    """The machine code and kernel attributes of a cubin (ELF64): sections .text.*, .nv.info*,
    .nv.constant*, .nv.shared*; the line tables (--generate-line-info) shift with any header
    edit and are left out. `gdnc digest` (cli/main.cpp) hashes the same sections: keep them alike."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
    names = header(shstrndx)
    out = []
    for i in range(shnum):
        name_off, kind, _, _, off, size = header(i)[:6]
        start = names[4] + name_off
        name = elf[start:elf.index(b"\0", start)].decode()
        if name.startswith((".text.", ".nv.info", ".nv.constant", ".nv.shared")):
            # SHT_NOBITS (8) sections occupy no file bytes: only their size is theirs.
            out.append((name, str(size).encode() if kind == 8 else elf[off:off + size]))
    return sorted(out)

def index(root):
    out = {}
    for entry in pathlib.Path(root, "entries").iterdir():
        info = json.loads((entry / "manifest.json").read_text())["info"]
        program, target = entry.name.split(".")[1:3]
        out[(info["layer"], program, target)] = code_sections((entry / "program.cubin").read_bytes())
    return out
old, new, rev = index(sys.argv[1]), index(sys.argv[2]), sys.argv[3]
code_differ = 0
for key in sorted(set(old) | set(new)):
    if key not in old or key not in new:
        state = "only in " + ("new" if key in new else rev)
    else:
        a, b = dict(old[key]), dict(new[key])
        changed = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        text = [n for n in changed if n.startswith(".text.")]
        state = ("DIFF code" if text else "same code, other sections differ" if changed else "same") + \
                (f" ({', '.join(changed)})" if changed else "")
    code_differ += not state.startswith("same")
    print(f"{key[0]:<10} {key[1]:<15} {key[2]:<8} {state}")
print(f"{code_differ} of {len(set(old) | set(new))} programs differ in machine code (or exist on one side only) from {rev}")
EOF
