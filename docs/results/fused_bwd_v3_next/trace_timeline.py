"""Per-chunk timeline of the fused walk's roles from v3_dyn_trace.diff's printout.

usage: trace_timeline.py LOG [a6]   (gdn_bench's stdout with the "TR ..." lines of the traced build;
       "a6" for v3_a6_trace.diff's stamps, v3_dyn_trace.diff's otherwise)
The traced build stamps clock64() at each role's hand-offs for chunks 40..47 of block (0, 0, 0)
and prints them when the block ends; the last launch's 32 lines are read. Prints every event of
each chunk in time order (cycles from the owner's chunk 40 start) and each role's chunk period.
"""
import re,sys,collections
lines=[l for l in open(sys.argv[1],errors="replace") if l.startswith("TR ")]
# keep the last launch: 32 lines
last=lines[-32:]
names={0:["top","Q","S","V","Vn","O","KT"],
1:["top","KTQ","Pair","OVn","PRead","S","preWf","Wf","ZDone","E","Rows"],
2:["top","ZFull","Pair","DvEmpty","DvFull","WFull","S","WfArr","ZEmpty","DS","E","KTfree"],
3:["top","ZEmpty","ZFull","ORead","ERead","Q","preDv","DvW","ZDone"]}
if len(sys.argv)>2 and sys.argv[2]=="a6":
    names={0:["top","Q","S","V","Vn","O","K","T"],
    1:["top","scores","rows(u-1)","OVn","PRead","S","Wf","T","E","ZDone","Rows"],
    2:["top","KZ","Pair","DvEmpty","DvFull","T","WFull","WfArr","DS","Rows","E","Kfree"],
    3:["top","ZEmpty","ZFull","ORead","Q","DvW","ZDone"]}
rn={0:"prod",1:"alg",2:"val",3:"own"}
T={}
for l in last:
    m=re.match(r"TR nc (\d+) role (\d+) u (\d+): (.*)",l)
    nc,r,u=int(m.group(1)),int(m.group(2)),int(m.group(3)); vals=[int(x) for x in m.group(4).split()]
    T[(r,u)]=vals
print("nc",nc)
base=T[(3,40)][0]
def rel(x): return (x-base)&0xffffffff if x else None
for u in range(40,48):
    print(f"--- chunk u={u}")
    evs=[]
    for r in range(4):
        if (r,u) not in T: continue
        for e,nm in enumerate(names[r]):
            v=T[(r,u)][e]
            if v: evs.append((rel(v),f"{rn[r]}.{nm}"))
    evs.sort()
    print("  "+"  ".join(f"{t}:{n}" for t,n in evs))
# period
for r in range(4):
    tops=[T[(r,u)][0] for u in range(40,48) if (r,u) in T]
    d=[(tops[i+1]-tops[i])&0xffffffff for i in range(len(tops)-1)]
    print(rn[r],"period",d)
