import sys, statistics as st, collections
names = {
 'P': ['top','Q lg','S lg','V lg','Vn lg','O lg','KT lg','Q arr','S arr','V arr','Vn arr','O arr','KT arr(sc)','','','end'],
 'A': ['top','wait KT,Q','QK','wait PEmpty','P~ stored','wait WEmpty','-W formed','wait O,Vn','dS~ product+pack','wait PRead','dS~ stored+M sums','wait S','dQ products','wait ZDone','dq store','wait DvFull','dW,dV'"'"'V^T,T1','Y stored','E,KK products','E stored','E sums, bulk read','wait XTerms','dg/dbeta'],
 'X': ['top','wait KT','wait ZFull,O,PFull','(h0) wait DvEmpty','dV'"'"' formed','dvb product','wait V, dv pack','wait Vn','dKst product','dKst rowdot','wait DsFull','dv store','wait Q','dS~^T Q','wait DwFull','dkbg','bulk read','wait EFull','E K','dk store','end'],
 'Z': ['top','wait ZEmpty','bf16(Z) stored','wait S','<S,Zb>','wait KT','wait ORead','wait O','wait ERead','dOs split','wait Q','issue dOs^T Q','wait DvFull','wait WFull','update done','end'],
}
ORDER_P = [1,7,2,8,3,9,4,10,5,11,6,12,15]
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) < 8 or f[0] != 'TL': continue
    blk, role, u, nc = int(f[1]), f[2], int(f[3]), int(f[4])
    t = [int(x) for x in f[5:]]
    rows[(blk, role)].append((u, t))
for role in 'PAXZ':
    n = len(names[role])
    deltas = collections.defaultdict(list); periods = []
    for (blk, r), lst in rows.items():
        if r != role: continue
        lst.sort()
        for i, (u, t) in enumerate(lst):
            prev = t[0]
            for k in (ORDER_P if role == 'P' else range(1, n)):
                if names[role][k] == '' : continue
                if t[k] == 0 or t[k] < t[0] or t[k] - t[0] > 10**7: continue
                deltas[k].append(t[k] - prev); prev = t[k]
            if i + 1 < len(lst) and lst[i+1][0] == u + 1: periods.append(lst[i+1][1][0] - t[0])
    if not periods: continue
    print(f'== {role}: chunk period median {st.median(periods):.0f} cycles (n={len(periods)})')
    for k in (ORDER_P if role == 'P' else range(1, n)):
        if deltas[k]: print(f'   {names[role][k]:28s} {st.median(deltas[k]):8.0f}')
