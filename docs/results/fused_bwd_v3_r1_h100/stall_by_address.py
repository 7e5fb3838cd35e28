#!/usr/bin/env python3
"""Warp-stall samples of a warp-specialized kernel by role, from machine-code addresses.

usage: stall_by_address.py PROFILE_SASS.csv LISTING.sass
PROFILE_SASS.csv: scripts/ncu_profile.sh's profile_sass.csv (one kernel); LISTING.sass: nvdisasm -c
of the same cubin (scripts/sass_stats.sh with SASS=1). The roles are the code between the
listing's setmaxnreg instructions, named in the fused walk's code order (owner, values, algebra,
producer after the entry); each role's samples are ~25 % since every role has one warp per
scheduler, and the shares that matter are its stall reasons.
"""
import csv,io,sys,collections,re
rows=list(csv.reader(open(sys.argv[1])))
hdr=rows[1]; idx={h:i for i,h in enumerate(hdr)}
stalls=[h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
# role boundaries by SETMAXREG addresses in the listing
bounds=[]
for l in open(sys.argv[2]):
    m=re.match(r"\s*/\*([0-9a-f]+)\*/\s+USETMAXREG",l)
    if m: bounds.append(int(m.group(1),16))
names=["entry","owner","values","algebra","producer"]
def role(a):
    r=0
    for i,b in enumerate(bounds):
        if a>=b: r=i+1
    return names[r]
base=int(rows[2][idx["Address"]],16)
tot=collections.defaultdict(collections.Counter); n=collections.Counter()
for r in rows[2:]:
    try: a=int(r[idx["Address"]],16)-base
    except: continue
    s=int(r[idx["Warp Stall Sampling (All Samples)"]] or 0)
    ro=role(a); n[ro]+=s
    for st in stalls:
        v=r[idx[st]]
        if v: tot[ro][st[6:]]+=int(float(v))
allS=sum(n.values())
for ro in names:
    c=tot[ro]; t=sum(c.values()) or 1
    print(f"{ro:9s} {n[ro]:7d} samples ({100*n[ro]/allS:4.1f}%): "+", ".join(f"{k} {100*v/t:.0f}%" for k,v in c.most_common(8)))
