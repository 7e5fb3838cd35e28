#!/usr/bin/env python3
"""Where the Python call's host time goes: gdnc alone (no peer), one shape, fwd+bwd and ckpt (the
latter through torch.utils.checkpoint, as compare.py times it).

Per operation: the host time of the forward call and of backward() (median of 7), with the GPU idle
at the start (as the timed samples run) and with the GPU busy ahead (queued behind a sleep);
cProfile over 20 calls (the 25 functions of most own time); and a torch.profiler trace (CPU and
CUDA) of two calls, printed as the GPU's idle gaps over 20 us with the host events that end inside
each, and written xz-packed to --out. A diagnostic for design work, never a published result: the
profiler adds host time of its own.

    PYTHONPATH=python python3 bench/host_profile.py --shape M --out $OUT
"""

import argparse
import cProfile
import io
import json
import lzma
import os
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402


def phase_times(fn, op, x, leaves, flush, queued, calls=7):
    rows = []
    for _ in range(calls):
        compare.drop_grads(leaves)
        torch.cuda.synchronize()
        flush.zero_()
        if queued:
            torch.cuda._sleep(100_000_000)
        t0 = time.perf_counter()
        o = compare.forward(fn, op, x, leaves)
        t1 = time.perf_counter()
        o.backward(x["do"])
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        rows.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
    fwd = sorted(r[0] for r in rows)[calls // 2]
    bwd = sorted(r[1] for r in rows)[calls // 2]
    return fwd, bwd


def gaps(trace_path, threshold_us=20.0):
    events = [e for e in json.load(open(trace_path))["traceEvents"] if "dur" in e and "ts" in e]
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"])
    host = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op")]
    lines = []
    for a, b in zip(gpu, gpu[1:]):
        idle = b["ts"] - (a["ts"] + a["dur"])
        if idle <= threshold_us:
            continue
        lines.append(f"gap {idle:8.1f} us after {a['name'][:50]} before {b['name'][:50]}")
        inside = [e for e in host if a["ts"] + a["dur"] <= e["ts"] + e["dur"] <= b["ts"]]
        for e in sorted(inside, key=lambda e: -e["dur"])[:8]:
            lines.append(f"      {e['cat']:13s} {e['dur']:8.1f} us {e['name'][:90]}")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="M", choices=sorted(compare.SHAPES))
    ap.add_argument("--ops", default="fwd+bwd,ckpt")
    ap.add_argument("--gdnc-spec", default="{}", help="code options of the gdnc call, a JSON object")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the xz-packed traces")
    args = ap.parse_args()
    x = compare.inputs(args.shape, 1)
    fn = compare.our_arm("gdnc", **json.loads(args.gdnc_spec))
    leaves = compare.leaves_of(x)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for op in [o for o in args.ops.split(",") if o]:
        if op not in ("fwd+bwd", "ckpt"):
            sys.exit(f"host_profile: --ops: unknown operation '{op}' (fwd+bwd, ckpt)")
        for _ in range(5):
            compare.drop_grads(leaves)
            compare.call(fn, op, x, leaves)
        torch.cuda.synchronize()
        for queued in (False, True):
            fwd, bwd = phase_times(fn, op, x, leaves, flush, queued)
            where = "GPU busy ahead" if queued else "GPU idle at the start"
            print(f"{args.shape} {op} ({where}): forward call {fwd:.3f} ms of host time, backward() {bwd:.3f} ms")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            compare.drop_grads(leaves)
            compare.call(fn, op, x, leaves)
        profiler.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        print(f"--- {op}: cProfile over 20 calls")
        print(text.getvalue())
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(2):
                compare.drop_grads(leaves)
                torch.cuda.synchronize()
                flush.zero_()
                compare.call(fn, op, x, leaves)
                torch.cuda.synchronize()
        path = Path(args.out) / f"trace_{args.shape}_{op.replace('+', '')}.json"
        prof.export_chrome_trace(str(path))
        print(f"--- {op}: the GPU's idle gaps over 20 us (two calls), and the host events that end inside each")
        print("\n".join(gaps(path)))
        with open(path, "rb") as src, lzma.open(f"{path}.xz", "wb") as dst:
            dst.write(src.read())
        path.unlink()


if __name__ == "__main__":
    main()
