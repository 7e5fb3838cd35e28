#!/usr/bin/env python3
"""gdnc side by side with FLA in one process, on the same inputs, with the seed's protocol.

First run on the H200 in session 3 (docs/results/compare_f2d39ce.*). FLA 0.6.0's kernels are the
pure-Python fla-core==0.6.0 wheel, which needs einops (the meta package flash-linear-attention
also pulls transformers, not needed here). Here:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps -d .whl fla-core==0.6.0 einops
and on the device, carrying .whl and .scratch_device:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
Usage there:

    PYTHONPATH=python GDNC_LIBRARY=... GDNC_REFERENCE_LIBRARY=... \\
        python3 bench/compare_fla.py --shapes N,M,G,A --ops fwd,fwd+bwd,ckpt --out $OUT/compare.json

Protocol (the seed's): per (shape, operation), every arm is visited twice per group in mirrored
order (A B C D D C B A), 5 groups; a visit is 10 untimed calls then 12 timed samples, each
preceded by an L2 flush and timed with CUDA events; a cell is the median of its 120 samples;
drift is the spread between the first and last group medians; an A/A arm (a second copy of our
arm) gives the noise envelope; a cell is published when both compared arms drift <= 2 %. Power,
the enforced limit, the SM clock and the clock-event reasons are read through NVML (ctypes over
libnvidia-ml) after every sample, outside the timed region; a sample is at the power limit when
NVML reports a software power cap or hardware power brake, or draws >= 98 % of the limit; a cell
with >= 5 % of its samples there is flagged. Without NVML the script says so and reads
nvidia-smi once per visit instead. Before timing, every arm's o, dq, dk, dv, dg, dbeta are
checked against the fp64 reference (rel-RMS <= 1e-2, max-abs <= 2e-2 max|ref|) on a pack of the
shape's first --gate-tokens tokens; an arm that fails is reported and not timed.
"""

import argparse
import ctypes
import itertools
import json
import statistics
import os
import subprocess
import sys
import time
from pathlib import Path

try:
    import torch
except ImportError:  # the report and merge helpers below work without torch (CPU tests)
    torch = None

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
import gdnc  # noqa: E402
from gdnc import reference  # noqa: E402

SHAPES = {
    "N": ((2, 6), [2049, 3001, 3142]),
    "M": ((16, 48), [12000, 9000, 6000, 3768, 2000]),
    "G": ((16, 48), [3598, 18252, 9000, 14000, 12000, 6000, 16000, 10000, 11000, 8000, 13222, 10000]),
    "A": ((16, 48), [98304, 65536, 57344, 40960]),
}
# DEVICE.md: ms on this H200; the ckpt floor is a forward plus a forward+backward.
# --arms names -> the arms' labels in the tables and the JSON.
ARM_NAMES = {"gdnc": "gdnc", "aa": "gdnc A/A", "graph": "gdnc graph", "nondet": "gdnc nondet", "fla": "fla"}
FLOOR = {"N": (0.011, 0.043, 0.054), "M": (0.352, 1.36, 1.712), "G": (1.406, 5.45, 6.856), "A": (2.812, 10.90, 13.712)}
OPS = ("fwd", "fwd+bwd", "ckpt")


def inputs(shape, seed, tokens=None):
    (H, HV), docs = SHAPES[shape]
    if tokens is not None:  # a pack of the first documents, cut at `tokens`
        cut, total = [], 0
        for d in docs:
            take = min(d, tokens - total)
            if take <= 0:
                break
            cut.append(take)
            total += take
        docs = cut
    T = sum(docs)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    cu = torch.tensor([0] + list(itertools.accumulate(docs)), dtype=torch.int64, device="cuda")
    return {
        "q": rnd(1, T, H, 128).bfloat16(), "k": rnd(1, T, H, 128).bfloat16(), "v": rnd(1, T, HV, 128).bfloat16(),
        "g": torch.nn.functional.logsigmoid(rnd(1, T, HV)), "beta": torch.sigmoid(rnd(1, T, HV)),
        "cu64": cu, "cu32": cu.int(), "do": rnd(1, T, HV, 128).bfloat16(),
    }


def our_arm(name, **spec):
    spec = dict(spec, name=name)

    def fn(q, k, v, g, beta, x):
        return gdnc.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu32"],
                                           spec=spec)[0]
    return fn


def lift_fla_hopper_guard():
    """FLA 0.6.0 refuses its gated backward on Hopper with Triton 3.4 to 3.7.0 (its issue #640);
    the H200's image has Triton 3.6.0. DEVICE.md's FLA baselines were measured with the guard
    lifted, and so are ours: the accuracy gate below checks FLA's gradients against the fp64
    reference on the same inputs, so a wrong result is reported instead of timed."""
    import fla.ops.common.chunk_o as chunk_o
    if not getattr(chunk_o, "TRITON_ABOVE_3_7_1", True):
        chunk_o.TRITON_ABOVE_3_7_1 = True
        print("FLA: lifted the Hopper/Triton < 3.7.1 guard of chunk_bwd_dqkwg (FLA issue #640); "
              "the accuracy gate decides whether FLA is timed")


def fla_arm():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
    lift_fla_hopper_guard()

    def fn(q, k, v, g, beta, x):
        return fla(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=x["cu64"])[0]
    return fn


def call(fn, op, x, leaves):
    q, k, v, g, beta = leaves
    if op == "fwd":
        return fn(q, k, v, g, beta, x)
    if op == "fwd+bwd":
        o = fn(q, k, v, g, beta, x)
    else:
        o = torch.utils.checkpoint.checkpoint(lambda *a: fn(*a, x), q, k, v, g, beta, use_reentrant=False)
    o.backward(x["do"])
    return o


def leaves_of(x):
    return [x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]


def gate(fn, x, ref):
    leaves = leaves_of(x)
    o = call(fn, "fwd+bwd", x, leaves)
    got = {"o": o, "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad, "dg": leaves[3].grad,
           "dbeta": leaves[4].grad}
    report = {}
    for name, t in got.items():
        r = ref[name].reshape(-1)
        d = t.detach().double().cpu().reshape(-1)
        rel = ((r - d).pow(2).mean().sqrt() / (r.pow(2).mean().sqrt() + 1e-8)).item()
        mx = (r - d).abs().max().item() / max(r.abs().max().item(), 1e-30)
        ok = bool(torch.isfinite(d).all()) and rel <= 1e-2 and mx <= 2e-2
        report[name] = {"rel_rms": rel, "max_abs_rel": mx, "ok": ok}
    return report


class Nvml:
    """Power draw, enforced limit, SM clock and clock-event reasons of one GPU through NVML
    (libnvidia-ml via ctypes, no extra package): microseconds per read, so every sample gets one."""
    SW_POWER_CAP, HW_POWER_BRAKE = 0x4, 0x80  # nvmlClocksEventReason* bits
    NVML_CLOCK_SM = 1

    def __init__(self, pci_bus_id=None, index=0, lib_name="libnvidia-ml.so.1"):
        try:
            self.lib = ctypes.CDLL(lib_name)
        except OSError as e:
            raise RuntimeError(f"NVML: cannot load {lib_name}: {e}") from None
        self._check("nvmlInit_v2", self.lib.nvmlInit_v2())
        self.handle = ctypes.c_void_p()
        if pci_bus_id:
            self._check("nvmlDeviceGetHandleByPciBusId_v2",
                        self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(self.handle)))
        else:
            self._check("nvmlDeviceGetHandleByIndex_v2",
                        self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)))
        # Newer drivers name it ClocksEventReasons; the older name is the same call.
        self._reasons = getattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self.lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def _check(self, what, rc):
        if rc != 0:
            raise RuntimeError(f"NVML: {what} returned {rc}")

    def read(self):
        mw, limit_mw, mhz, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        self._check("nvmlDeviceGetPowerUsage", self.lib.nvmlDeviceGetPowerUsage(self.handle, ctypes.byref(mw)))
        self._check("nvmlDeviceGetEnforcedPowerLimit",
                    self.lib.nvmlDeviceGetEnforcedPowerLimit(self.handle, ctypes.byref(limit_mw)))
        self._check("nvmlDeviceGetClockInfo",
                    self.lib.nvmlDeviceGetClockInfo(self.handle, self.NVML_CLOCK_SM, ctypes.byref(mhz)))
        self._check("clock-event reasons", self._reasons(self.handle, ctypes.byref(reasons)))
        draw, limit = mw.value / 1000.0, limit_mw.value / 1000.0
        capped = bool(reasons.value & (self.SW_POWER_CAP | self.HW_POWER_BRAKE))
        return {"draw_w": draw, "limit_w": limit, "sm_mhz": mhz.value, "reasons": reasons.value,
                "at_limit": capped or draw >= 0.98 * limit}


def torch_pci_bus_id():
    """The NVML bus id of torch's current device (NVML numbers GPUs without CUDA_VISIBLE_DEVICES)."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    if all(hasattr(p, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        return f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    if torch.cuda.device_count() == 1 and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        return None  # NVML index 0 is then the one GPU
    raise RuntimeError("NVML: this torch does not expose the PCI bus id, and with several GPUs the NVML "
                       "index of the current one is unknown")


def smi_power_state():
    """The nvidia-smi reading (also NVML underneath, but a process per call: once per visit)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=power.draw,enforced.power.limit,clocks.sm",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
        draw, limit, clock = (float(x) for x in out.split(",")[:3])
        return {"draw_w": draw, "limit_w": limit, "sm_mhz": clock, "at_limit": draw >= 0.98 * limit}
    except Exception as e:  # reported, never silently dropped
        return {"error": str(e), "at_limit": False}


def measure(arms, op, x, groups, samples, warmup, flush, nvml):
    names = list(arms)
    times = {n: [[] for _ in range(groups)] for n in names}
    limited = {n: 0 for n in names}
    clocks = {n: [] for n in names}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for grp in range(groups):
        for n in names + names[::-1]:
            leaves = leaves_of(x)
            for _ in range(warmup):
                call(arms[n], op, x, leaves)
            visit_state = None if nvml else smi_power_state()
            for _ in range(samples):
                flush.zero_()
                e0.record()
                call(arms[n], op, x, leaves)
                e1.record()
                e1.synchronize()
                times[n][grp].append(e0.elapsed_time(e1))
                state = nvml.read() if nvml else visit_state
                limited[n] += 1 if state["at_limit"] else 0
                if "sm_mhz" in state:
                    clocks[n].append(state["sm_mhz"])
    cells = {}
    for n in names:
        flat = [t for g in times[n] for t in g]
        med = statistics.median(flat)
        drift = abs(statistics.median(times[n][0]) - statistics.median(times[n][-1])) / med * 100
        cells[n] = {"ms": med, "drift_pct": drift, "power_limited_pct": 100.0 * limited[n] / len(flat),
                    "sm_mhz_median": statistics.median(clocks[n]) if clocks[n] else None}
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="N,M,G,A")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--groups", type=int, default=5)
    ap.add_argument("--samples", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--gate-tokens", type=int, default=8192)
    ap.add_argument("--arms", default=",".join(ARM_NAMES),
                    help="comma-separated arms to gate and time, of " + ",".join(ARM_NAMES) + " (gdnc, aa and "
                         "fla are what a published cell needs; fewer arms fit more shapes in one device call)")
    ap.add_argument("--out", default="compare.json")
    ap.add_argument("--commit", default=os.environ.get("GDN_COMMIT", "unknown"),
                    help="the commit measured, recorded per shape (default: $GDN_COMMIT)")
    ap.add_argument("--merge", help="an earlier output JSON: its shapes are kept (with their commits) unless "
                                    "measured again, so a table can be completed across device runs")
    args = ap.parse_args()
    wanted = set()
    for a in (a.strip() for a in args.arms.split(",") if a.strip()):
        if a not in ARM_NAMES:
            sys.exit(f"compare_fla: --arms: unknown arm '{a}'; known: {','.join(ARM_NAMES)}")
        wanted.add(ARM_NAMES[a])
    from gdnc._autograd import stats as binding_stats  # imports torch, as the arms do
    started = time.monotonic()
    stream = torch.cuda.Stream()  # graph mode cannot capture the legacy default stream
    torch.cuda.set_stream(stream)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    try:
        nvml = Nvml(torch_pci_bus_id())
        print(f"NVML: {nvml.read()}")
    except RuntimeError as e:
        nvml = None
        print(f"{e}; power read with nvidia-smi once per visit instead")
    arms = {"gdnc": our_arm("bench_gdnc", deterministic=True),
            "gdnc A/A": our_arm("bench_gdnc_aa", deterministic=True),
            "gdnc graph": our_arm("bench_gdnc_graph", deterministic=True, graph="replay"),
            # deterministic: false runs the same fixed-order kernels today (atomics measured slower,
            # docs/PERF.md); the arm is here so a future atomic variant is timed side by side.
            "gdnc nondet": our_arm("bench_gdnc_nondet", deterministic=False)}
    try:
        arms["fla"] = fla_arm()
    except Exception as e:
        print(f"FLA not available, not timed: {e}")
    arms = {n: fn for n, fn in arms.items() if n in wanted}
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    if args.merge:
        merge_earlier(results, json.loads(Path(args.merge).read_text()))
    for shape in args.shapes.split(","):
        small = inputs(shape, seed=7, tokens=args.gate_tokens)
        ref = reference.run_tensors(small["q"], small["k"], small["v"], small["g"], small["beta"], small["cu64"],
                                    l2norm=True, d_o=small["do"])
        ref = {"o": ref["o"], "dq": ref["dq"], "dk": ref["dk"], "dv": ref["dv"], "dg": ref["dg"],
               "dbeta": ref["dbeta"]}
        print(f"{shape}: reference done at {time.monotonic() - started:.0f} s")
        timed, entry = {}, {"gate": {}, "ops": {}, "commit": args.commit}
        for name, fn in arms.items():
            try:
                rep = gate(fn, small, ref)
            except Exception as e:
                rep = {"error": {"message": str(e), "ok": False}}
            entry["gate"][name] = rep
            status = "ok" if all(r["ok"] for r in rep.values()) else "FAILED (not timed)"
            print(f"{shape} gate {name}: {status} " + " ".join(
                f"{k}={v.get('rel_rms', float('nan')):.2e}" for k, v in rep.items() if "rel_rms" in v))
            if status == "ok":
                timed[name] = fn
        print(f"{shape}: gates done at {time.monotonic() - started:.0f} s")
        x = inputs(shape, seed=11)
        for op in args.ops.split(","):
            i = OPS.index(op)
            before = dict(binding_stats)
            cells = measure(timed, op, x, args.groups, args.samples, args.warmup, flush, nvml)
            entry["ops"][op] = cells
            if op == "ckpt":  # every gdnc arm's recompute should hand its tapes to the backward
                seen = {k: binding_stats[k] - before[k] for k in before}
                entry["ckpt_binding_stats"] = seen
                print(f"{shape:<2} ckpt     the binding saw {seen['recomputes']} recomputes and took "
                      f"{seen['handoffs']} hand-offs")
            aa = abs(cells["gdnc"]["ms"] - cells["gdnc A/A"]["ms"]) / cells["gdnc"]["ms"] * 100 \
                if "gdnc" in cells and "gdnc A/A" in cells else float("nan")
            for name, c in cells.items():
                fla = cells.get("fla", {}).get("ms")
                publish = c["drift_pct"] <= 2 and (fla is None or cells["fla"]["drift_pct"] <= 2)
                clock = f"  sm {c['sm_mhz_median']:.0f} MHz" if c.get("sm_mhz_median") else ""
                print(f"{shape:<2} {op:<8} {name:<11} {c['ms']:9.3f} ms  drift {c['drift_pct']:5.2f} %  "
                      f"FLA/this {fla / c['ms'] if fla else float('nan'):5.2f}  floor x {c['ms'] / FLOOR[shape][i]:6.1f}"
                      f"{clock}{'' if publish else '  (drift > 2 %: not published)'}"
                      f"{'  POWER-LIMITED' if c['power_limited_pct'] >= 5 else ''}")
            print(f"{shape:<2} {op:<8} A/A difference {aa:.2f} %")
        results["shapes"][shape] = entry
        print(f"{shape}: timed at {time.monotonic() - started:.0f} s")
        Path(args.out).write_text(json.dumps(results, indent=2))
    report(results, Path(args.out))

def merge_earlier(results, earlier):
    """Copies the shapes of an earlier run into `results`, each tagged with its commit (the
    entry's own, else the earlier file's top-level one); shapes measured now replace them."""
    for name, entry in earlier["shapes"].items():
        entry = dict(entry)
        entry.setdefault("commit", earlier.get("commit", "unknown"))
        results["shapes"][name] = entry
    return results


def report(results, out):
    """Prints the table of every shape in `results` and plots it next to `out` (PNG)."""
    print("\nsummary (ms; FLA / ours; ours / floor), per shape with the commit it was measured at")
    for shape in (s for s in SHAPES if s in results["shapes"]):
        entry = results["shapes"][shape]
        for op, cells in entry["ops"].items():
            fla = cells.get("fla", {}).get("ms")
            row = "  ".join(f"{arm} {c['ms']:.3f}" + (f" ({fla / c['ms']:.2f}x)" if fla and arm != "fla" else "")
                            for arm, c in cells.items())
            print(f"{shape:<2} {op:<8} {row}  [{entry.get('commit', 'unknown')}]")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, len(OPS), figsize=(15, 4))
        for ax, op in zip(axes, OPS):
            shapes = [s for s in SHAPES if s in results["shapes"] and op in results["shapes"][s]["ops"]]
            for arm in ("gdnc", "gdnc graph", "fla"):
                ys = [results["shapes"][s]["ops"][op].get(arm, {}).get("ms", float("nan")) for s in shapes]
                ax.plot(shapes, ys, marker="o", label=arm)
            ax.plot(shapes, [FLOOR[s][OPS.index(op)] for s in shapes], "k--", label="floor")
            ax.set_yscale("log")
            ax.set_title(op)
            ax.set_ylabel("ms")
            ax.legend()
        fig.tight_layout()
        fig.savefig(str(out.with_suffix(".png")))
    except ImportError as e:
        print(f"no plot: {e}")



if __name__ == "__main__":
    main()
