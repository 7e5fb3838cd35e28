# Instructions of the fused walk's body (walk_bwd_fused_sm90.cuh) by step, from `nvdisasm -gi`
# (each instruction attributed to the body line it was inlined at). The steps are found in the
# template itself: the body function's "// N." comments, "store_e_half" and the owner.
# Usage: nvdisasm -gi -c program.cubin > walk.sass
#        python3 body_steps.py walk.sass templates/bwd/walk_bwd_fused_sm90.cuh
import collections, re, sys

sass_path, template = sys.argv[1], sys.argv[2]
lines = open(template).read().split("\n")
first = next(i for i, l in enumerate(lines, 1) if re.search(r"static void body\(", l))
owner = next(i for i, l in enumerate(lines, 1) if re.search(r"static void owner\(", l))
bounds = [(first, "0 loop head")]
for i, l in enumerate(lines, 1):
    m = re.match(r"\s*// (\d+)\. (.{0,28})", l)
    if first < i < owner and m:
        bounds.append((i, f"{m.group(1)} {m.group(2).strip()}"))
    if first < i < owner and re.search(r"static void store_e_half\(", l):
        bounds.append((i, "store_e_half"))
bounds.sort()


def step_of(line):
    name = None
    for b, n in bounds:
        if line >= b:
            name = n
    return name


chain, counts, ops = [], collections.Counter(), collections.defaultdict(collections.Counter)
inblock = False
for raw in open(sass_path):
    m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', raw)
    if m:
        if not inblock:
            chain = []
        inblock = True
        chain.append((m.group(1), int(m.group(2))))
        if m.group(3):
            chain.append((m.group(3), int(m.group(4))))
        continue
    im = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", raw)
    if not im:
        continue
    inblock = False
    key = "other"
    for f, l in chain:
        if f.endswith("walk_bwd_fused_sm90.cuh") and first <= l < owner:
            key = step_of(l)
            break
        if f.endswith("walk_bwd_fused_sm90.cuh") and l >= owner:
            key = "owner+"
            break
    counts[key] += 1
    ops[key][im.group(2)] += 1
total = sum(v for k, v in counts.items() if k not in ("other", "owner+"))
print(f"body total {total}")
for b, n in bounds:
    if n in counts:
        c = ops[n]
        print(f"{n:34s} {counts[n]:5d}  HGMMA {c['HGMMA']:3d} MUFU {c['MUFU']:3d} BAR {c['BAR']:2d} "
              f"STL {c['STL']:2d} LDL {c['LDL']:2d} LDS {c['LDS'] + c['LDSM']:3d} "
              f"FMUL+FFMA+FADD {c['FMUL'] + c['FFMA'] + c['FADD']:4d} SEL/FSEL {c['SEL'] + c['FSEL']:3d} "
              f"ISETP/FSETP {c['ISETP'] + c['FSETP']:3d} F2FP {c['F2FP']:3d}")
print("other", counts["other"], "owner+", counts["owner+"])
