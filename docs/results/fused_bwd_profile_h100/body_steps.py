# Instructions of the fused walk's second-version body (walk_bwd_fused_sm90.cuh as of the
# thirty-eighth session) by step, from `nvdisasm -gi` (each instruction attributed to the body
# line it was inlined at). Usage: nvdisasm -gi -c program.cubin > v2.sass; python3 body_steps.py v2.sass.
# The step bounds below are that file's line numbers: update them with the file.
import re, sys, collections
# step boundaries (line of each step's comment) in walk_bwd_fused_sm90.cuh
bounds = [(309, "0 loop head"), (345, "1 QK^T, P~"), (379, "2 chain D^T, dv_local, dV'"), (420, "3 -W"),
          (427, "4 dS~, M sums"), (479, "5 dQ"), (512, "6 dvb, dv"), (533, "7 dK state + dS~^T Q"),
          (562, "8 dq store, dW, dV'V^T"), (588, "9 dTm hi+lo"), (640, "10 Y, E, K K^T"), (687, "11 Tm^T dW, R1"),
          (706, "12 (Eb+Eb^T) K, dk store"), (731, "13 row terms, dg, dbeta"), (801, "store_e_half"), (842, "owner+")]
def step_of(line):
    name = None
    for b, n in bounds:
        if line >= b: name = n
    return name
chain, counts, ops = [], collections.Counter(), collections.defaultdict(collections.Counter)
inblock = False
for raw in open(sys.argv[1]):
    m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', raw)
    if m:
        if not inblock: chain = []
        inblock = True
        chain.append((m.group(1), int(m.group(2))))
        if m.group(3): chain.append((m.group(3), int(m.group(4))))
        continue
    im = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", raw)
    if not im: continue
    inblock = False
    key = "other"
    for f, l in chain:
        if f.endswith("walk_bwd_fused_sm90.cuh") and 309 <= l < 842:
            key = step_of(l); break
        if f.endswith("walk_bwd_fused_sm90.cuh") and l >= 842:
            key = "owner+"; break
    counts[key] += 1
    ops[key][im.group(2)] += 1
tot = sum(v for k, v in counts.items() if k not in ("other", "owner+"))
print(f"body total {tot}")
for b, n in bounds:
    if n in counts:
        c = ops[n]
        print(f"{n:30s} {counts[n]:5d}  HGMMA {c['HGMMA']:3d} MUFU {c['MUFU']:3d} BAR {c['BAR']:2d} SYNCS {c['SYNCS']:2d} STS {c['STS']+c['STSM']:3d} LDS {c['LDS']+c['LDSM']:3d} FMUL+FFMA+FADD {c['FMUL']+c['FFMA']+c['FADD']:4d} SEL/FSEL {c['SEL']+c['FSEL']:3d} ISETP/FSETP {c['ISETP']+c['FSETP']:3d} F2FP {c['F2FP']:3d}")
print("other", counts["other"], "owner+", counts["owner+"])
