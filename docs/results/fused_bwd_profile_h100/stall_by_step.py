"""Warp-stall samples of the fused walk's body by step (Nsight Compute source page + nvdisasm -gi).

usage: stall_by_step.py PROGRAM.sass PROFILE_SASS.csv.xz TEMPLATE
PROGRAM.sass: `nvdisasm -gi -c program.cubin` of the profiled program (rebuilt from the profiled
commit: the same NVRTC gives the same cubin); TEMPLATE: that commit's walk_bwd_fused_sm90.cuh.
Each instruction goes to the body step whose line it was inlined at (the "// N." comments of the
body), to the owner or to the producer; mbarrier retry loops count where their lines say.
"""
import collections, csv, io, lzma, re, sys
sass, csvp, tmpl = sys.argv[1:4]
lines = open(tmpl).read().split("\n")
first = next(i for i, l in enumerate(lines, 1) if re.search(r"static void body\(", l))
owner = next(i for i, l in enumerate(lines, 1) if re.search(r"static void owner\(", l))
prod = next(i for i, l in enumerate(lines, 1) if re.search(r"static void producer\(", l))
bounds = [(first, "0 head")]
for i, l in enumerate(lines, 1):
    m = re.match(r"\s*// (\d+)\. (.{0,20})", l)
    if first < i < owner and m: bounds.append((i, f"{m.group(1)} {m.group(2).strip()}"))
    if first < i < owner and re.search(r"static void store_e_half\(", l): bounds.append((i, "store_e"))
bounds.sort()
def step_of(line):
    name = None
    for b, n in bounds:
        if line >= b: name = n
    return name
chain, inblock, step = [], False, {}
for raw in open(sass):
    m = re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?', raw)
    if m:
        if not inblock: chain = []
        inblock = True
        chain.append((m.group(1), int(m.group(2))))
        if m.group(3): chain.append((m.group(3), int(m.group(4))))
        continue
    im = re.match(r"\s*/\*([0-9a-f]+)\*/\s+", raw)
    if not im: continue
    inblock = False
    key = "other"
    for f, l in chain:
        if f.endswith("walk_bwd_fused_sm90.cuh"):
            if first <= l < owner: key = step_of(l); break
            if l >= owner: key = "owner"; break
            if prod <= l < first and l < 250: key = "producer"; break
    step[int(im.group(1), 16)] = key
rows = list(csv.reader(io.StringIO(lzma.open(csvp, "rt").read())))
hdr = None; data = []
for r in rows:
    if r and r[0] == "Address": hdr = r; continue
    if hdr and r and r[0].startswith("0x"): data.append(r)
ix = {h: k for k, h in enumerate(hdr)}
base = int(data[0][0], 16)
cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = collections.Counter(); rs = collections.defaultdict(collections.Counter)
for r in data:
    o = int(r[0], 16) - base
    k = step.get(o, "?")
    s = int(r[ix["Warp Stall Sampling (All Samples)"]] or 0)
    tot[k] += s
    for c in cols:
        v = int(r[ix[c]] or 0)
        if v: rs[k][c[6:]] += v
body = sum(v for k, v in tot.items() if k not in ("owner", "producer", "other", "?"))
print("body samples", body)
order = [n for _, n in bounds] + ["owner", "producer", "other", "?"]
for k in order:
    if k in tot:
        top = ", ".join(f"{a} {100*b/max(1,tot[k]):.0f}%" for a, b in rs[k].most_common(4))
        print(f"{k:26s} {tot[k]:7d} {100*tot[k]/max(1,body):5.1f}% of body  {top}")
