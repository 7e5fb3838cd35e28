"""Warp-stall samples of the fused walk by warp role and by template line.

usage: stall_by_role.py PROGRAM.sass PROFILE_SASS.csv[.xz] TEMPLATE [N]
PROGRAM.sass: `nvdisasm -gi -c program.cubin` of the profiled program (the same NVRTC rebuilds the
same cubin); TEMPLATE: the walk_bwd_fused_sm90.cuh it was built from. Each instruction goes to the
role function (producer, algebra, values, owner, body, ...) whose line it was inlined at; prints
each role's share of the samples with its top stall reasons, then the N hottest lines.
"""
import lzma
import csv,sys,re,collections
sass,csvp,tmpl=sys.argv[1:4]
L=open(tmpl).read().split("\n")
funcs=[(i,re.search(r"static void (\w+)\(",l).group(1)) for i,l in enumerate(L,1) if re.search(r"static void (\w+)\(",l)]
def func_of(line):
    n=None
    for b,f in funcs:
        if line>=b: n=f
    return n
insts=[];chain=[];inblock=False
for raw in open(sass):
    m=re.match(r'\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?',raw)
    if m:
        if not inblock: chain=[]
        inblock=True
        chain.append((m.group(1),int(m.group(2)),m.group(3),int(m.group(4)) if m.group(4) else None)); continue
    m=re.match(r'\s*/\*([0-9a-f]+)\*/\s+(.*?);',raw)
    if m:
        inblock=False
        # collect walk-template lines in the chain (including inlined-at)
        wl=[]
        for f,l,fa,la in chain:
            if f.endswith("walk_bwd_fused_sm90.cuh"): wl.append(l)
            if fa and fa.endswith("walk_bwd_fused_sm90.cuh"): wl.append(la)
        role=None;line=None
        # outermost role: the walk line whose function is a role; prefer role funcs
        roles={"producer","algebra","values","owner","body","store_e_half"}
        for l in wl:
            f=func_of(l)
            if f in roles: role=f; line=l
        if role is None and wl: role=func_of(wl[-1]); line=wl[-1]
        insts.append((int(m.group(1),16),m.group(2),role,line))
rows=list(csv.reader((lzma.open(csvp, 'rt') if csvp.endswith('.xz') else open(csvp))));hdr=rows[1];data=rows[2:]
assert len(data)==len(insts),(len(data),len(insts))
def num(x):
    try: return float(x.replace(',',''))
    except: return 0.0
iS=hdr.index("Warp Stall Sampling (All Samples)"); iE=hdr.index("Instructions Executed")
sc=[i for i,h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
data.sort(key=lambda r:int(r[0],16))
T=sum(num(r[iS]) for r in data)
byrole=collections.defaultdict(collections.Counter); exe=collections.Counter(); byline=collections.Counter(); linestall=collections.defaultdict(collections.Counter)
for (off,txt,role,line),r in zip(insts,data):
    byrole[role]["_all"]+=num(r[iS]); exe[role]+=num(r[iE])
    for i in sc: byrole[role][hdr[i]]+=num(r[i])
    byline[(role,line)]+=num(r[iS])
    for i in sc: linestall[(role,line)][hdr[i]]+=num(r[i])
print("role: share of samples, executed warp-instr, top stalls")
for role,c in sorted(byrole.items(),key=lambda x:-x[1]["_all"]):
    tops=", ".join(f"{k[6:]} {v/T*100:.1f}" for k,v in c.most_common(6) if k!="_all")
    print(f"{str(role):14s} {c['_all']/T*100:5.1f}%  exe {exe[role]:.3g}  {tops}")
print("hot lines")
for (role,line),v in byline.most_common(int(sys.argv[4]) if len(sys.argv)>4 else 30):
    tops=", ".join(f"{k[6:]} {w/T*100:.1f}" for k,w in linestall[(role,line)].most_common(3))
    src=L[line-1].strip()[:70] if line else ""
    print(f"{v/T*100:5.2f}% {str(role):10s} {line} [{tops}] {src}")
