#!/usr/bin/env python3
"""A numpy model of the forward's roundings: gdnc's chunked forward for one document (GVA value
heads) in fp64 arithmetic with explicit bf16 / fp32 roundings at the points where the kernels
store or feed the tensor cores (templates/prep/l2norm.cuh, fwd/chunk_prep.cuh, fwd/state_walk.cuh,
fwd/output.cuh), beside the fp64 per-token recurrence (docs/algorithm.md 1.1). Switching roundings off
one at a time says which ones the output error comes from (docs/accuracy.md).

    python3 runtime/check/rounding_model.py --check                   # the model without roundings
                                                                        # equals the recurrence (1e-12)
    python3 runtime/check/rounding_model.py --tokens 1000,3000 --gate 0   # the ablation table
    python3 runtime/check/rounding_model.py --fixes --tokens 3000,6000     # candidate fixes
    python3 runtime/check/rounding_model.py --windows --tokens 6000        # error per 500 tokens

Rounding names: qk_norm (normalized q, k stored in bf16), L32 (fp32 L, Tm, products), kb_op (the
row-scaled operands bf16(beta exp2(gc) k), bf16(beta v)), Tm, WU (W and U in bf16), S_op (bf16(S)
into W S), vnew, vg (the gated V' into K^T Vg), S32 (fp32 state), htape (bf16 h read by the
output), P (the gated, masked Q K^T in bf16), o (the output in bf16). Inputs are rounded as the
GPU tests round them (bf16 q, k, v; fp32 g, beta, h0) before both sides see them.
"""
import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np

K = V = 128
C = 64
RCP_LN2 = float(np.float32(1.4426950408889634))


def f32(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float64)


def bf16(x):
    """fp64 -> fp32 (RNE) -> bf16 (RNE on the fp32 bit pattern) -> fp64."""
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    b = a.view(np.uint32)
    r = (b + np.uint32(0x7FFF) + ((b >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return r.view(np.float32).astype(np.float64)


def ident(x):
    return x


ALL = ["in_qkv", "in_f32", "qk_norm", "L32", "kb_op", "Tm", "WU", "S_op", "vnew", "vg", "S32", "htape",
       "P", "o"]


def fp16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def tf32(x):
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float64).astype(np.float32))
    b = a.view(np.uint32)
    r = (b + np.uint32(0x1000)) & np.uint32(0xFFFFE000)   # cvt.rna.tf32.f32
    return r.view(np.float32).astype(np.float64)


def block_inv(L, m, rnd):
    """(I+L)^-1 by FLA's 16x16 block method: fp32 diagonal inverses, merge with rnd() operands."""
    n = 64
    Lp = np.zeros((n, n)); Lp[:m, :m] = L
    T = np.zeros((n, n))
    for a in range(4):
        sl = slice(16 * a, 16 * a + 16)
        T[sl, sl] = f32(np.linalg.solve(np.eye(16) + Lp[sl, sl], np.eye(16)))
    for d in range(1, 4):
        for b in range(0, 4 - d):
            a = b + d
            P = np.zeros((16, 16))
            for mm in range(b, a):
                P += rnd(Lp[16 * a:16 * a + 16, 16 * mm:16 * mm + 16]) @ rnd(T[16 * mm:16 * mm + 16, 16 * b:16 * b + 16])
            P = f32(P)
            T[16 * a:16 * a + 16, 16 * b:16 * b + 16] = f32(-(rnd(T[16 * a:16 * a + 16, 16 * a:16 * a + 16]) @ rnd(P)))
    return T[:m, :m]


def emulate(qr, kr, vr, g, beta, h0, G, on, hfix=None, lp=None, merge=None):
    """qr, kr: [T, H, K] raw; vr: [T, HV, V]; g, beta: [T, HV]; h0: [HV, K, V].
    on: set of rounding names switched on. hfix: None | 'hilo' | 'f32' (the output's h operand)."""
    lp = lp or bf16
    R = {n: (lp if n not in ("L32", "S32", "in_f32") else f32) if n in on else ident for n in ALL}
    T, H, _ = qr.shape
    HV = vr.shape[1]
    q = R["in_qkv"](qr); k = R["in_qkv"](kr); v = R["in_qkv"](vr)
    g = R["in_f32"](g); beta = R["in_f32"](beta); h0 = R["in_f32"](h0)
    # in-kernel L2 norm: fp32 sum and rstd, y = bf16(x * rstd)
    def norm(x, flag):
        ss = (x * x).sum(-1, keepdims=True)
        if "qk_norm" in on or flag in on:
            ss = f32(ss); rstd = f32(1.0 / f32(np.sqrt(f32(ss + f32(1e-6)))))
            return lp(f32(x * rstd))
        return x / np.sqrt(ss + 1e-6)
    qn = norm(q, "q_norm"); kn = norm(k, "k_norm")
    scale = K ** -0.5
    o = np.zeros((T, HV, V))
    hts = np.zeros((HV, K, V))
    for j in range(HV):
        hq = j // G
        S = h0[j].copy()
        for s in range(0, T, C):
            e = min(s + C, T); m = e - s
            Kc = kn[s:e, hq]; Qc = qn[s:e, hq]; Vc = v[s:e, j]; b = beta[s:e, j]
            gg = g[s:e, j]
            if "in_f32" in on:   # fp32 cumsum in log2 units (serial order; the kernel's scan differs in ulps)
                gc = f32(np.cumsum(gg)); gc = f32(gc * RCP_LN2)
            else:
                gc = np.cumsum(gg) * (1.0 / np.log(2.0))
            gl = gc[-1]
            D = np.exp2(np.tril(np.minimum(gc[:, None] - gc[None, :], 0.0)))
            D = np.tril(D)
            L = np.tril(R["L32"](R["L32"](Kc @ Kc.T) * R["L32"](D)) * b[:, None], -1)
            L = R["L32"](L)
            if merge is None:
                Tm = np.linalg.solve(np.eye(m) + L, np.eye(m))   # (I + L)^-1, fp32 solve ~ fp64 here
            else:
                Tm = block_inv(L, m, merge)
            Tm = R["L32"](Tm)
            Tm = np.tril(R["Tm"](Tm))
            kb = R["kb_op"](Kc * (b * np.exp2(gc))[:, None])
            vb = R["kb_op"](Vc * b[:, None])
            W = R["WU"](Tm @ kb)
            U = R["WU"](Tm @ vb)
            Sb = R["S_op"](S)
            Vp = R["L32"](U - R["L32"](W @ Sb))
            vnew = R["vnew"](Vp)
            gate = np.exp2(np.minimum(gl - gc, 0.0))
            Vg = R["vg"](Vp * gate[:, None])
            # output for this chunk
            h = R["htape"](S)
            if hfix == "hilo":
                hb = lp(S); h = hb + lp(S - hb)
            elif hfix == "f32":
                h = f32(S)
            P = R["L32"](Qc @ Kc.T)
            P = R["P"](np.tril(P * D))
            Oi = R["L32"](Qc @ h) * np.exp2(gc)[:, None]
            O = R["L32"](Oi + P @ vnew)
            o[s:e, j] = R["o"](O * scale)
            S = R["S32"](R["S32"](np.exp2(gl) * S) + R["S32"](Kc.T @ Vg))
        hts[j] = S
    return o, hts


def reference(qr, kr, vr, g, beta, h0, G):
    """fp64 per-token recurrence (docs/algorithm.md 1.1) with fp64 L2 norm (eps 1e-6 inside the sqrt)."""
    T, H, _ = qr.shape
    HV = vr.shape[1]
    qn = qr / np.sqrt((qr * qr).sum(-1, keepdims=True) + 1e-6)
    kn = kr / np.sqrt((kr * kr).sum(-1, keepdims=True) + 1e-6)
    scale = K ** -0.5
    o = np.zeros((T, HV, V)); hts = np.zeros((HV, K, V))
    for j in range(HV):
        hq = j // G
        S = h0[j].copy()
        a = np.exp(g[:, j])
        for t in range(T):
            kt = kn[t, hq]
            if a[t] != 1.0:
                S *= a[t]
            r = vr[t, j] - kt @ S
            S += np.outer(kt, beta[t, j] * r)
            o[t, j] = scale * (qn[t, hq] @ S)
        hts[j] = S
    return o, hts


def rel(ref, got):
    return float(np.sqrt(((ref - got) ** 2).mean()) / (np.sqrt((ref ** 2).mean()) + 1e-8))


def inputs(T, H, HV, seed, gate=None, shift=0.0, h0=True):
    rng = np.random.default_rng(seed)
    qr = rng.standard_normal((T, H, K)); kr = rng.standard_normal((T, H, K))
    vr = rng.standard_normal((T, HV, V))
    gx = rng.standard_normal((T, HV))
    g = -np.logaddexp(0.0, -gx) - shift if gate is None else np.full((T, HV), float(gate))
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((T, HV))))
    hh = rng.standard_normal((HV, K, V)) if h0 else np.zeros((HV, K, V))
    return qr, kr, vr, g, beta, hh


STORED = ["qk_norm", "L32", "kb_op", "Tm", "WU", "S_op", "vnew", "vg", "S32", "htape", "P", "o"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="1000,3000", help="comma-separated document lengths")
    ap.add_argument("--gate", default="0", help="a constant g, or 'logsigmoid' (g = logsigmoid(N(0,1)))")
    ap.add_argument("--heads", default="1,3", help="qk heads, value heads")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--check", action="store_true", help="only check the model without roundings against the recurrence")
    ap.add_argument("--fixes", action="store_true",
                    help="o with candidate fixes: the norm folded (q_norm / k_norm off), the h tape as bf16 hi + lo")
    ap.add_argument("--windows", action="store_true", help="o error per 500-token window of the first --tokens length")
    args = ap.parse_args()
    H, HV = (int(x) for x in args.heads.split(","))
    G = HV // H
    gate = None if args.gate == "logsigmoid" else float(args.gate)
    if args.check:
        x = inputs(130, H, HV, args.seed, gate=gate)
        ro, rh = reference(*x, G=G)
        eo, eh = emulate(*x, G=G, on=set())
        err = max(rel(ro, eo), rel(rh, eh))
        print(f"model without roundings vs the fp64 recurrence, 130 tokens (3 chunks, a partial one): {err:.2e}")
        return 0 if err < 1e-12 else 1
    Ts = [int(t) for t in args.tokens.split(",")]
    if args.windows:
        T = Ts[0]
        x = inputs(T, H, HV, args.seed, gate=gate)
        x = (bf16(x[0]), bf16(x[1]), bf16(x[2]), f32(x[3]), f32(x[4]), f32(x[5]))
        ro, _ = reference(*x, G=G)
        eo = emulate(*x, G=G, on=set(STORED))[0]
        for w in range(0, T, 500):
            print(f"tokens {w:>6} .. {min(w + 500, T):>6}: o rel-RMS {rel(ro[w:w + 500], eo[w:w + 500]):.2e}")
        return 0
    if args.fixes:
        split = (set(STORED) - {"qk_norm"}) | {"q_norm", "k_norm"}  # the norm's rounding per tensor
        fixes = [("none (today)", set(STORED), None), ("fold q and k", split - {"q_norm", "k_norm"}, None),
                 ("fold k only", split - {"k_norm"}, None), ("fold q only", split - {"q_norm"}, None),
                 ("h tape bf16 hi + lo", set(STORED) - {"htape"}, "hilo"),
                 ("fold q, k + h hi + lo", split - {"q_norm", "k_norm", "htape"}, "hilo")]
        print(f"{'o rel-RMS, gate ' + args.gate:<26}" + "".join(f"{'T=' + str(T):>11}" for T in Ts))
        errs = {name: [] for name, _, _ in fixes}
        for T in Ts:
            x = inputs(T, H, HV, args.seed, gate=gate)
            x = (bf16(x[0]), bf16(x[1]), bf16(x[2]), f32(x[3]), f32(x[4]), f32(x[5]))
            ro, _ = reference(*x, G=G)
            for name, on, hfix in fixes:
                errs[name].append(rel(ro, emulate(*x, G=G, on=on, hfix=hfix)[0]))
        for name, e in errs.items():
            print(f"{name:<26}" + "".join(f"{v:>11.2e}" for v in e))
        return 0
    rows = {}
    for T in Ts:
        x = inputs(T, H, HV, args.seed, gate=gate)
        x = (bf16(x[0]), bf16(x[1]), bf16(x[2]), f32(x[3]), f32(x[4]), f32(x[5]))
        ro, _ = reference(*x, G=G)
        rows.setdefault("all roundings", []).append(rel(ro, emulate(*x, G=G, on=set(STORED))[0]))
        for name in STORED:
            rows.setdefault(f"all but {name}", []).append(rel(ro, emulate(*x, G=G, on=set(STORED) - {name})[0]))
            rows.setdefault(f"only {name}", []).append(rel(ro, emulate(*x, G=G, on={name})[0]))
        print(f"T={T} done", file=sys.stderr, flush=True)
    print("o rel-RMS against the fp64 recurrence, heads", args.heads, "gate", args.gate)
    print(f"{'roundings':<22}" + "".join(f"{'T=' + str(T):>11}" for T in Ts))
    for name, errs in rows.items():
        print(f"{name:<22}" + "".join(f"{e:>11.2e}" for e in errs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
