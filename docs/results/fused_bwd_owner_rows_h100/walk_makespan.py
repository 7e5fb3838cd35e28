"""The fused reverse walk's makespan in chunk steps: one block per (document, value head), one block
per SM (132 on an H100), blocks started longest document first (chunk_table's doc_order), each
taking the SM that frees first. Divides the measured fused-walk times by it."""
import heapq, math
shapes = {"M":[12000,9000,6000,3768,2000], "G":[3598,18252,9000,14000,12000,6000,16000,10000,11000,8000,13222,10000], "A":[98304,65536,57344,40960]}
meas = {"M":2.509,"G":9.794,"A":21.918}
for n, docs in shapes.items():
    ch = sorted([math.ceil(d/64) for d in docs], reverse=True)
    jobs = [c for c in ch for _ in range(48)]  # doc-major, longest first
    sms = [0]*132; heapq.heapify(sms)
    for j in jobs:
        t = heapq.heappop(sms); heapq.heappush(sms, t+j)
    mk = max(sms); ideal = sum(jobs)/132
    print(n, "makespan", mk, "ideal %.0f"%ideal, "longest", ch[0], "imbalance %.2f"%(mk/max(ideal,ch[0])), "us/chunk-step %.2f"%(meas[n]*1000/mk))
