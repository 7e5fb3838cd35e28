#!/usr/bin/env python3
"""Context parallelism under the benchmark's rules: gdnc at CP R (one process per rank) beside gdnc
at CP 1 (the whole batch on one GPU of the same machine) and, with --peer fla, FLA 0.6.0's CP at
CP R, on the same inputs (docs/benchmark.md; the decisions are bench/protocol.py's).

Every sample starts on all ranks together (a barrier), L2 flushed; each rank times its own call
with CUDA events, and a CP arm's sample is the slowest rank's (a step ends when its last rank
does). The CP 1 arm runs on rank 0 while the other ranks wait at the barrier. Arms are visited in
mirrored order (A B C C B A) in --groups groups, --warmup untimed and --samples timed calls a
visit; a cell is published when both compared arms drift by 2 % or less or the paired-ratio test
passes, and classed against the A/A copy (a second gdnc CP R layer). Power: any rank's samples at
the power limit count for the arm (NVML, per rank's own GPU). Before timing, every arm's o and
gradients on this rank's tokens are held to gdnc CP 1's (rel-RMS <= 1e-2): gdnc CP 1 is the
fp64-checked layer, and gdnc CP R is bitwise its single-GPU proxy (python/tests/kcp_ranks.py).

    python3 bench/compare_cp.py --world 2 --transport nccl --shapes A --out cp2.json         # 2 GPUs
    FLA_FLASH_QLA=0 PYTHONPATH=python:/tmp/site python3 bench/compare_cp.py --peer fla ...  # with FLA
    python3 bench/compare_cp.py --world 2 --transport host --shapes N --groups 1 ...         # smoke run

--transport host shares GPU 0 among the ranks and gathers through the host (gdnc.cp.HostGather):
its times measure nothing but the harness; only NCCL runs on a GPU per rank are results.
"""

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

try:
    import torch
    import torch.distributed as dist
    import torch.utils.checkpoint
except ImportError:  # merge() and the argument checks are tested without torch
    torch = dist = None

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))
import compare  # noqa: E402
import protocol  # noqa: E402

OPS = compare.OPS


def rank_slice(x, ctx):
    t0, t1 = ctx.token_begin, ctx.token_begin + ctx.tokens
    out = {n: x[n][:, t0:t1].contiguous() for n in ("q", "k", "v", "g", "beta", "do")}
    return out


def gdnc_cp_arm(ctx, name):
    import gdnc

    def fn(q, k, v, g, beta, x):
        return gdnc.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cp_context=ctx,
                                           spec={"name": name})[0]
    return fn


def fla_cp_arm(group, cu_global):
    """FLA 0.6.0's context-parallel gated delta rule on this rank's tokens (fla.ops.cp; FLA gathers
    its own fp32 [HV, K, V + K] summaries with torch.distributed over `group`, one all-gather per
    direction, and refuses initial and final states under CP)."""
    if os.environ.get("FLA_FLASH_QLA") != "0":
        raise RuntimeError("FLA_FLASH_QLA must be 0 (FLA 0.6.0's single-GPU CP 1 baseline would otherwise be "
                           "FlashQLA's)")
    import fla
    from fla.ops.cp import build_cp_context as fla_build_cp_context
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdr
    compare.lift_fla_hopper_guard()
    fla_ctx = fla_build_cp_context(cu_global, group=group)

    def fn(q, k, v, g, beta, x):
        # By keyword: FLA replaces cu_seqlens with the context's rank-local ones.
        return fla_gdr(q=q, k=k, v=v, g=g, beta=beta, use_qk_l2norm_in_kernel=True, cp_context=fla_ctx)[0]
    return fn, f"fla-core {getattr(fla, '__version__', 'unknown')}"


def rel_rms(a, b):
    a, b = a.double(), b.double()
    return ((a - b).pow(2).mean().sqrt() / (b.pow(2).mean().sqrt() + 1e-30)).item()


def outputs(fn, x):
    leaves = compare.leaves_of(x)
    o = compare.call(fn, "fwd+bwd", x, leaves)
    return [o.detach()] + [leaf.grad for leaf in leaves]


def timed_visit(fn, op, x, warmup, samples, runs, barrier, flush, nvml):
    """`samples` timed calls after `warmup` untimed ones, every call started on all ranks together;
    ranks where the arm does not run (`runs` False) only meet the barriers."""
    leaves = compare.leaves_of(x) if runs else None
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times, limited = [], 0
    for i in range(warmup + samples):
        barrier()
        if not runs:
            continue
        compare.drop_grads(leaves)
        flush.zero_()
        e0.record()
        compare.call(fn, op, x, leaves)
        e1.record()
        e1.synchronize()
        if i >= warmup:
            times.append(e0.elapsed_time(e1))
            limited += nvml.read()["at_limit"] if nvml else 0
    return times, limited


def run_rank(rank, world, group, args):
    from gdnc.cp import build_cp_context
    if args.transport == "nccl":
        barrier = lambda: dist.barrier(device_ids=[rank])  # noqa: E731
    else:
        barrier = dist.barrier
    try:
        nvml = compare.Nvml(compare.torch_pci_bus_id())
    except RuntimeError as e:
        nvml = None
        if rank == 0:
            print(f"compare_cp: no power readings ({e})")
    flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    p = {"groups": args.groups, "samples": args.samples, "warmup": args.warmup}
    cp, aa, one = f"gdnc CP{world}", f"gdnc CP{world} A/A", "gdnc CP1"
    cells = {}
    for shape in args.shapes.split(","):
        x = compare.inputs(shape, seed=args.seed)
        ctx = build_cp_context(x["cu64"], group=group, cu_seqlens_cpu=x["cu64"].cpu())
        mine = rank_slice(x, ctx)
        arms = {cp: (gdnc_cp_arm(ctx, "cp"), mine, True), aa: (gdnc_cp_arm(ctx, "cp_aa"), mine, True),
                one: (compare.our_arm("cp1"), x, rank == 0)}
        peer_version = None
        if args.peer == "fla":
            fn, peer_version = fla_cp_arm(group, x["cu64"])
            arms[f"fla CP{world}"] = (fn, mine, True)
        # The gate: this rank's o and gradients of every arm against gdnc CP 1's rows of them.
        t0, t1 = ctx.token_begin, ctx.token_begin + ctx.tokens
        reference = [r[:, t0:t1] for r in outputs(*arms[one][:2])]
        gate = {}
        for name, (fn, inp, _) in arms.items():
            if name == one:
                continue
            got = outputs(fn, inp)
            errs = [rel_rms(a, b) for a, b in zip(got, reference)]
            gate[name] = {"rel_rms_max": max(errs), "ok": all(e <= 1e-2 for e in errs)}
        for op in args.ops.split(","):
            names = [n for n in arms if n == one or gate[n]["ok"]]
            groups = {n: [[] for _ in range(p["groups"])] for n in names}
            limited = {n: 0 for n in names}
            for grp in range(p["groups"]):
                for n in names + names[::-1]:
                    fn, inp, runs = arms[n]
                    t, lim = timed_visit(fn, op, inp, p["warmup"], p["samples"], runs, barrier, flush, nvml)
                    groups[n][grp] += t
                    limited[n] += lim
            cells[(shape, op)] = {"groups": groups, "limited": limited, "gate": gate, "peer": peer_version}
    everyone = [None] * world
    dist.all_gather_object(everyone, cells)
    return merge(everyone, world, p, args) if rank == 0 else None


def merge(per_rank, world, p, args):
    """Per cell and arm: each sample the slowest rank's time (CP 1: rank 0's); the decisions."""
    cp, aa, one = f"gdnc CP{world}", f"gdnc CP{world} A/A", "gdnc CP1"
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": os.environ.get("GDNC_COMMIT", "unknown"), "world": world, "transport": args.transport,
           "protocol": p, "cells": []}
    for key in per_rank[0]:
        shape, op = key
        first = per_rank[0][key]
        arms = {}
        for n in first["groups"]:
            ranks = [r[key] for r in per_rank] if n != one else [first]
            groups = [[max(samples) for samples in zip(*(r["groups"][n][g] for r in ranks))]
                      for g in range(p["groups"])]
            count = sum(len(g) for g in groups)
            limited = sum(r["limited"][n] for r in ranks)
            arms[n] = {"groups": groups, "ms": protocol.median([t for g in groups for t in g]),
                       "drift_pct": protocol.drift_pct(groups),
                       "power_limited_pct": 100.0 * limited / (count * len(ranks))}
        decisions = {}
        for peer in [n for n in arms if n not in (cp, aa)]:
            if cp in arms and aa in arms:
                decisions[peer] = protocol.decide_normal(arms, cp, peer, aa)
        gates = {n: max(r[key]["gate"][n]["rel_rms_max"] for r in per_rank) for n in first["gate"]}
        out["cells"].append({"shape": shape, "op": op, "arms": arms, "decisions": decisions, "gate_rel_rms": gates,
                             "peer_version": first["peer"]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--transport", choices=("nccl", "host"), default="nccl")
    ap.add_argument("--shapes", default="A")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--peer", choices=("none", "fla"), default="none")
    ap.add_argument("--groups", type=int, default=5)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.groups < 2:
        ap.error(f"--groups: {args.groups}; the drift rule compares the first and the last group (2 or more)")
    for op in args.ops.split(","):
        if op not in OPS:
            ap.error(f"--ops: {op!r} is not one of {', '.join(OPS)}")
    for shape in args.shapes.split(","):
        if shape not in compare.SHAPES:
            ap.error(f"--shapes: {shape!r} is not one of {', '.join(compare.SHAPES)}")
    from gdnc import InputError
    from gdnc.cp import spawn_local_ranks
    if args.peer == "fla" and args.transport != "nccl":
        ap.error("--peer fla needs --transport nccl (FLA gathers over a torch.distributed NCCL group)")
    try:
        result = spawn_local_ranks(run_rank, args.world, args.transport, (args,))[0]
    except InputError as e:
        print(f"compare_cp: {e}")
        return 2
    Path(args.out).write_text(json.dumps(result, indent=1))
    cp = f"gdnc CP{args.world}"
    print(f"{'shape':<6}{'op':<9}{'arm':<16}{'ms':>10}{'drift %':>9}   decision against gdnc CP{args.world}")
    for cell in result["cells"]:
        for name, arm in cell["arms"].items():
            d = cell["decisions"].get(name)
            said = "" if d is None else (f"{name}/{cp} {d['ratio']:.3f} {d['status']}"
                                         + (f" by {d['by']}, {d['cls']}" if d["published"] else ""))
            print(f"{cell['shape']:<6}{cell['op']:<9}{name:<16}{arm['ms']:>10.3f}{arm['drift_pct']:>9.2f}   {said}")
        print(f"{'':<15}gate (max rel-RMS against gdnc CP1 on each rank's rows): {cell['gate_rel_rms']}")
    if args.transport == "host":
        print("compare_cp: host transport: ranks shared one GPU; these times are not results")
    return 0


if __name__ == "__main__":
    sys.exit(main())
