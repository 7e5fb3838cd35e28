"""How much of an arm's timed call is the host's: the same call timed three ways on one shape.

  events     the harness's way (bench/compare.py): L2 flush, event, call, event
  gpu-ahead  the same, but the stream is first held by a ~2 ms spin kernel so the host has queued the
             whole call before the GPU reaches it: the GPU's own time, without host gaps
  host       wall seconds of the call on the host (no synchronization inside)

and, for fwd+bwd, with the leaves' .grad left from the previous call (autograd then adds into it:
one elementwise kernel per input) and set to None before each call (what FLA's benchmarks do).
A diagnostic for the benchmark's readers, not a result: compare.py's rules publish results.

  python3 bench/host_gap.py --peer none --shapes M --ops fwd,fwd+bwd
"""

import argparse
import cProfile
import io
import pstats
import time

import torch

import compare


def timed(fn, op, x, leaves, flush, samples, hold_cycles, grads_to_none):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, host = [], []
    for _ in range(samples):
        if grads_to_none:
            compare.drop_grads(leaves)
        torch.cuda.synchronize()
        if hold_cycles:
            torch.cuda._sleep(hold_cycles)
        flush.zero_()
        e0.record()
        h0 = time.perf_counter()
        compare.call(fn, op, x, leaves)
        host.append((time.perf_counter() - h0) * 1e3)
        e1.record()
        e1.synchronize()
        gpu.append(e0.elapsed_time(e1))
    return compare.protocol.median(gpu), compare.protocol.median(host)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", default="none", choices=compare.PEERS + ("none",))
    ap.add_argument("--shapes", default="M")
    ap.add_argument("--ops", default="fwd,fwd+bwd")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="also run CALLS calls of each arm under cProfile and print where the host time goes")
    args = ap.parse_args()
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    arms = {"gdnc": compare.our_arm("host_gap_gdnc", deterministic=True)}
    if args.peer != "none":
        arms[args.peer] = (compare.fla_arm if args.peer == "fla" else compare.flashqla_arm)()[0]
    # ~2 ms at the H200's clocks: longer than any host call timed here.
    hold = int(2e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    for shape in args.shapes.split(","):
        x = compare.inputs(shape, seed=11)
        for op in args.ops.split(","):
            for name, fn in arms.items():
                leaves = compare.leaves_of(x)
                for _ in range(args.warmup):
                    compare.call(fn, op, x, leaves)
                rows = [("events", 0, False), ("gpu-ahead", hold, False)]
                if op != "fwd":
                    rows += [("events, grads None", 0, True), ("gpu-ahead, grads None", hold, True)]
                for label, cycles, none in rows:
                    g, h = timed(fn, op, x, leaves, flush, args.samples, cycles, none)
                    print(f"{shape:<2} {op:<8} {name:<9} {label:<22} gpu {g:8.3f} ms  host {h:7.3f} ms", flush=True)
                if args.profile:
                    prof = cProfile.Profile()
                    for _ in range(args.profile):
                        compare.drop_grads(leaves)
                        torch.cuda.synchronize()
                        torch.cuda._sleep(hold)
                        prof.enable()
                        compare.call(fn, op, x, leaves)
                        prof.disable()
                    text = io.StringIO()
                    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
                    print(f"--- {shape} {op} {name}: cProfile of {args.profile} calls, by own time", flush=True)
                    print(text.getvalue(), flush=True)


if __name__ == "__main__":
    main()
