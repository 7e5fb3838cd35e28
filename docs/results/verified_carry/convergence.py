# The convergence experiment behind the verified segment carry (docs/algorithm.md 4.7): numpy,
# CPU only. Does an fp32 chunked GDN walk started from zero become bitwise equal to the same walk
# started from the true entry state (forward: the state S; reverse: the gradient Z), and after how
# many chunks? (bf16 operands, fp32 sums.) Run: python3 convergence.py SEED [reverse] [calibrate]
# calibrate: more gate levels, each result with the natural-log decay of the 4 chunks that
# verification re-walks (what the kernels' gate test sums, chain_decays in common/segments.cuh).
import numpy as np, sys
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
K, BV, C = 128, 32, 64
scale = np.float32(K ** -0.5)
def bf16(x):
    x = np.asarray(x, np.float32)
    b = x.view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.astype(np.uint32).view(np.float32)


def forward():
    def chunk_inputs(shift, gzero):
        k = rng.standard_normal((C, K)).astype(np.float32); k /= np.linalg.norm(k, axis=1, keepdims=True)
        k = bf16(k)
        v = bf16(rng.standard_normal((C, BV)))
        x = rng.standard_normal(C) + shift
        g = np.zeros(C, np.float32) if gzero else (-np.log1p(np.exp(-x))).astype(np.float32)
        beta = (1 / (1 + np.exp(-rng.standard_normal(C)))).astype(np.float32)
        gc = (np.cumsum(g.astype(np.float32)) * np.float32(1 / np.log(2))).astype(np.float32)
        dec = np.exp2(np.minimum(gc[:, None] - gc[None, :], 0)).astype(np.float32)
        L = np.tril((beta[:, None] * (k @ k.T)) * dec, -1).astype(np.float32)
        Tm = bf16(np.linalg.inv(np.eye(C) + L.astype(np.float64)).astype(np.float32))
        W = bf16(Tm @ bf16(beta[:, None] * np.exp2(gc)[:, None] * k))
        U = bf16(Tm @ bf16(beta[:, None] * v))
        return k, W, U, gc
    def step(S, ch):
        k, W, U, gc = ch
        Vp = (U - W @ bf16(S)).astype(np.float32)
        Vg = bf16(Vp * np.exp2(gc[-1] - gc)[:, None])
        return (np.float32(np.exp2(gc[-1])) * S + k.T @ Vg).astype(np.float32)
    levels = (("logsigmoid(N(0,1))", 0.0, False), ("logsigmoid(N(2,1))", 2.0, False),
              ("logsigmoid(N(4,1))", 4.0, False), ("logsigmoid(N(6,1))", 6.0, False), ("g = 0", 0.0, True))
    if calibrate:
        levels = tuple((f"logsigmoid(N({s},1))", s, False) for s in (1.0, 2.0, 2.5, 3.0, 3.5))
    for label, shift, gzero in levels:
        chunks = [chunk_inputs(shift, gzero) for _ in range(96)]
        res = []
        for start in (16, 32, 48, 64):
            S = np.zeros((K, BV), np.float32)
            for c in range(start): S = step(S, chunks[c])   # the true entry state
            A, B = S, np.zeros_like(S)
            conv = None
            for c in range(start, min(start + 32, 96)):
                A, B = step(A, chunks[c]), step(B, chunks[c])
                if np.array_equal(A.view(np.uint32), B.view(np.uint32)):
                    conv = c - start + 1; break
            window = float(sum(chunks[c][3][-1] for c in range(start, start + 4)) * np.log(2))
            res.append((conv, round(window, 1)) if calibrate else conv)
        print(f"{label:22s} mean g {np.mean([np.diff(np.concatenate([[0], ch[3]]) ).mean() * np.log(2) for ch in chunks]):8.4f}  chunks to bitwise equality: {res}")


def reverse():
    def chunk_inputs(shift, gzero):
        k = rng.standard_normal((C, K)).astype(np.float32); k /= np.linalg.norm(k, axis=1, keepdims=True); k = bf16(k)
        q = rng.standard_normal((C, K)).astype(np.float32); q /= np.linalg.norm(q, axis=1, keepdims=True); q = bf16(q)
        do = bf16(rng.standard_normal((C, BV)))
        dvl = bf16(rng.standard_normal((C, BV)) * 0.1)   # dv_local, the intra-chunk part of dV'
        x = rng.standard_normal(C) + shift
        g = np.zeros(C, np.float32) if gzero else (-np.log1p(np.exp(-x))).astype(np.float32)
        beta = (1 / (1 + np.exp(-rng.standard_normal(C)))).astype(np.float32)
        gc = (np.cumsum(g) * np.float32(1 / np.log(2))).astype(np.float32)
        dec = np.exp2(np.minimum(gc[:, None] - gc[None, :], 0)).astype(np.float32)
        L = np.tril((beta[:, None] * (k @ k.T)) * dec, -1).astype(np.float32)
        Tm = bf16(np.linalg.inv(np.eye(C) + L.astype(np.float64)).astype(np.float32))
        W = bf16(Tm @ bf16(beta[:, None] * np.exp2(gc)[:, None] * k))
        return k, q, do, dvl, W, gc
    def step(Z, ch):   # the reverse walk's chunk step (state_walk_bwd.cuh's order and roundings, roughly)
        k, q, do, dvl, W, gc = ch
        gL = gc[-1]
        D = k @ bf16(Z)
        dV = bf16(np.exp2(gL - gc)[:, None] * D + dvl)
        dos = (scale * np.exp2(np.minimum(gc, 0)))[:, None] * do
        hi = bf16(dos); lo = bf16(dos - hi)
        return (np.float32(np.exp2(gL)) * Z + q.T @ hi + q.T @ lo - W.T @ dV).astype(np.float32)
    levels = (("logsigmoid(N(0,1))", 0.0, False), ("logsigmoid(N(2,1))", 2.0, False),
              ("logsigmoid(N(4,1))", 4.0, False), ("g = 0", 0.0, True))
    if calibrate:
        levels = tuple((f"logsigmoid(N({s},1))", s, False) for s in (1.0, 2.0, 2.5, 3.0, 3.5))
    for label, shift, gzero in levels:
        chunks = [chunk_inputs(shift, gzero) for _ in range(96)]
        res = []
        for end in (80, 64, 48, 32):   # the true end gradient: walked from the document's end (chunk 95)
            Z = np.zeros((K, BV), np.float32)
            for c in range(95, end, -1): Z = step(Z, chunks[c])
            A, B = Z, np.zeros_like(Z)
            conv = None
            for c in range(end, max(end - 32, -1), -1):
                A, B = step(A, chunks[c]), step(B, chunks[c])
                if np.array_equal(A.view(np.uint32), B.view(np.uint32)):
                    conv = end - c + 1; break
            window = float(sum(chunks[c][5][-1] for c in range(end, end - 4, -1)) * np.log(2))
            res.append((conv, round(window, 1)) if calibrate else conv)
        print(f"{label:22s} reverse walk, chunks to bitwise equality: {res}")


calibrate = "calibrate" in sys.argv[2:]
reverse() if "reverse" in sys.argv[2:] else forward()
